"""The run as an OpenTelemetry Resource: its identity, on every span its
provider makes.

A Resource because the run is who produced the spans, not something that
happened in it: every batch carries it, so a consumer knows the run of any
span it receives, in any order, from any of the run's processes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource

from .. import semconv as sc
from ..errors import ConfigError
from ._fields import Attributes, is_int

__all__ = ["run_resource"]


def run_resource(
    *,
    run_id: str | None = None,
    kind: str = "eval",
    name: str | None = None,
    model: str | None = None,
    environments: Sequence[str] = (),
    framework: str | None = None,
    tags: Sequence[str] = (),
    description: str | None = None,
    attach: str | None = None,
    team_id: str | None = None,
    service_name: str | None = None,
    extra: Mapping[str, Any] | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    rollouts_per_example: int | None = None,
    seq_len: int | None = None,
    wandb_project: str | None = None,
    wandb_entity: str | None = None,
    wandb_run_name: str | None = None,
) -> Resource:
    """The Resource naming one run; give it to that run's own ``TracerProvider``.

    A fresh ``run_id`` is generated when none is given. Pass the same id again
    (for example after a restart) to keep reporting into the same run. The
    standard ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` still
    apply, but never override the run identity given here.

    ``service.instance.id`` names the producer process (a uuid4 per process
    unless ``extra`` or ``OTEL_RESOURCE_ATTRIBUTES`` sets one): behind a
    collector, ``serve`` takes the run's end only from the producer that
    started it. A run resumed by a new process ends through ``serve`` only
    if that process keeps the first one's ``service.instance.id``.

    The training fields (``max_steps`` to ``wandb_run_name``) are what a
    ``kind="train"`` run is registered with. Every process feeding one
    training run (orchestrator, inference workers, trainer) builds the same
    Resource: the run is created once, by whichever is seen first.
    """
    if kind not in sc.RUN_KINDS:
        raise ConfigError(f"kind={kind!r} is not one of 'eval' or 'train'")
    lists = _lists(environments, tags)
    counts = (max_steps, batch_size, rollouts_per_example, seq_len)
    texts = (wandb_project, wandb_entity, wandb_run_name)
    attributes: Attributes = {**(extra or {}), **_training_attributes(kind, counts, texts)}
    attributes[sc.RUN_ID] = run_id or uuid.uuid4().hex
    attributes[sc.RUN_KIND] = kind
    labels = (name, model, framework, description, attach, team_id, service_name)
    attributes.update((key, value) for key, value in zip(_LABEL_KEYS, labels, strict=True) if value)
    attributes.update(lists)
    return _with_producer(Resource.create(attributes), service_name)


#: The run's labels, each set only when given (a falsy one is left out).
_LABEL_KEYS = (
    sc.RUN_NAME,
    sc.RUN_MODEL,
    sc.RUN_FRAMEWORK,
    sc.RUN_DESCRIPTION,
    sc.RUN_ATTACH,
    sc.RUN_TEAM_ID,
    sc.SERVICE_NAME,
)
#: A training run's counts, then its texts, in ``run_resource``'s order.
_COUNT_KEYS = (sc.RUN_MAX_STEPS, sc.RUN_BATCH_SIZE, sc.RUN_ROLLOUTS_PER_EXAMPLE, sc.RUN_SEQ_LEN)
_TEXT_KEYS = (sc.RUN_WANDB_PROJECT, sc.RUN_WANDB_ENTITY, sc.RUN_WANDB_RUN_NAME)


def _lists(environments: Sequence[str], tags: Sequence[str]) -> Attributes:
    """The run's environments and tags, each a list of strings when given; a
    bare string is refused, since it would be read as a list of characters."""
    if isinstance(environments, str) or isinstance(tags, str):
        raise ConfigError("environments and tags take a list of strings, not a single string")
    attributes: Attributes = {}
    if environments:
        attributes[sc.RUN_ENVIRONMENTS] = [str(env) for env in environments]
    if tags:
        attributes[sc.RUN_TAGS] = [str(tag) for tag in tags]
    return attributes


def _with_producer(resource: Resource, service_name: str | None) -> Resource:
    """The Resource with this package's service name where the SDK found
    none, and this process as its producer where nothing named one."""
    current = str(resource.attributes.get(sc.SERVICE_NAME, ""))
    if not service_name and current.startswith("unknown_service"):
        resource = resource.merge(Resource({sc.SERVICE_NAME: sc.DEFAULT_SERVICE_NAME}))
    if not resource.attributes.get(sc.SERVICE_INSTANCE_ID):
        # Who sent a span: behind a collector, a run's end is taken only
        # from the producer that owns the run.
        resource = resource.merge(Resource({sc.SERVICE_INSTANCE_ID: _PROCESS_INSTANCE}))
    return resource


#: This process as a producer (``service.instance.id``), the same for every
#: run it makes: a run it starts and ends from two providers is still its own.
_PROCESS_INSTANCE = uuid.uuid4().hex


def _training_attributes(
    kind: str, counts: Sequence[int | None], texts: Sequence[str | None]
) -> Attributes:
    """A training run's fields (``_COUNT_KEYS``, then ``_TEXT_KEYS``), refused
    on an eval run and where a count is not a whole number of 0 or more."""
    given = [
        key
        for key, value in zip((*_COUNT_KEYS, *_TEXT_KEYS), (*counts, *texts), strict=True)
        if value is not None
    ]
    if given and kind != "train":
        raise ConfigError(
            f"{', '.join(key.rsplit('.', 1)[-1] for key in given)} only apply to a "
            "training run; pass kind='train'"
        )
    attributes: Attributes = {}
    for key, count in zip(_COUNT_KEYS, counts, strict=True):
        if count is None:
            continue
        if not is_int(count) or count < 0:
            name = key.rsplit(".", 1)[-1]
            raise ConfigError(f"{name} must be a whole number of 0 or more, got {count!r}")
        attributes[key] = int(count)
    attributes.update((key, str(text)) for key, text in zip(_TEXT_KEYS, texts, strict=True) if text)
    return attributes
