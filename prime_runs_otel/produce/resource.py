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
    if isinstance(environments, str) or isinstance(tags, str):
        raise ConfigError("environments and tags take a list of strings, not a single string")
    attributes: Attributes = dict(extra or {})
    attributes.update(
        _training_attributes(
            kind,
            {
                sc.RUN_MAX_STEPS: max_steps,
                sc.RUN_BATCH_SIZE: batch_size,
                sc.RUN_ROLLOUTS_PER_EXAMPLE: rollouts_per_example,
                sc.RUN_SEQ_LEN: seq_len,
            },
            {
                sc.RUN_WANDB_PROJECT: wandb_project,
                sc.RUN_WANDB_ENTITY: wandb_entity,
                sc.RUN_WANDB_RUN_NAME: wandb_run_name,
            },
        )
    )
    attributes[sc.RUN_ID] = run_id or uuid.uuid4().hex
    attributes[sc.RUN_KIND] = kind
    optional = {
        sc.RUN_NAME: name,
        sc.RUN_MODEL: model,
        sc.RUN_FRAMEWORK: framework,
        sc.RUN_DESCRIPTION: description,
        sc.RUN_ATTACH: attach,
        sc.RUN_TEAM_ID: team_id,
        sc.SERVICE_NAME: service_name,
    }
    attributes.update((key, value) for key, value in optional.items() if value)
    if environments:
        attributes[sc.RUN_ENVIRONMENTS] = [str(env) for env in environments]
    if tags:
        attributes[sc.RUN_TAGS] = [str(tag) for tag in tags]
    resource = Resource.create(attributes)
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
    kind: str, counts: Mapping[str, int | None], texts: Mapping[str, str | None]
) -> Attributes:
    given = {key: value for key, value in {**counts, **texts}.items() if value is not None}
    if given and kind != "train":
        raise ConfigError(
            f"{', '.join(key.rsplit('.', 1)[-1] for key in given)} only apply to a "
            "training run; pass kind='train'"
        )
    attributes: Attributes = {}
    for key, count in counts.items():
        if count is None:
            continue
        if not is_int(count) or count < 0:
            name = key.rsplit(".", 1)[-1]
            raise ConfigError(f"{name} must be a whole number of 0 or more, got {count!r}")
        attributes[key] = int(count)
    attributes.update((key, str(text)) for key, text in texts.items() if text)
    return attributes
