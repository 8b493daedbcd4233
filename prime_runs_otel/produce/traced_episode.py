"""An episode span around code another instrumentation traces
(OpenTelemetry GenAI, OpenInference, OpenLLMetry).

Code that is not built on verifiers has no episode record to hand over, but
its model calls are already spans. :func:`episode_span` opens the span they
nest under and :func:`score_episode` puts the outcome on it; the consumer
builds the episode's record from that span tree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry.trace import Span, Tracer

from .. import semconv as sc
from ..errors import ConfigError
from ..sampling import dropped_episodes
from ._fields import Attributes, is_int

__all__ = ["episode_span", "score_episode"]


@contextlib.contextmanager
def episode_span(
    tracer: Tracer,
    *,
    example_id: int | str,
    episode_id: str | None = None,
    env: str | None = None,
    step: int | None = None,
    group: str | None = None,
    task_type: str | None = None,
    answer: str | None = None,
) -> Iterator[Span]:
    """A current span for one rollout whose model calls another instrumentation
    traces (OpenTelemetry GenAI, OpenInference, OpenLLMetry).

    The exporter synthesises the episode record from the spans under it, so
    code that is not built on verifiers still reports whole episodes. Set the
    outcome with :func:`score_episode` before the block ends; an exception
    escaping the block marks the episode failed. A span the tracer's sampler
    drops is an episode lost: it is counted and said (see
    :mod:`prime_runs_otel.sampling`).
    """
    if isinstance(example_id, bool) or not isinstance(example_id, (int, str)):
        raise ConfigError(f"example_id must be an int or a str, got {example_id!r}")
    attributes: Attributes = {sc.EPISODE_EXAMPLE_ID: example_id}
    optional = {
        sc.EPISODE_ID: episode_id,
        sc.EPISODE_ENV: env,
        sc.EPISODE_GROUP: group,
        sc.EPISODE_TASK_TYPE: task_type,
        sc.EPISODE_ANSWER: answer,
    }
    attributes.update((key, value) for key, value in optional.items() if value)
    if step is not None:
        if not is_int(step) or step < 0:
            raise ConfigError(f"step must be a whole number of 0 or more, got {step!r}")
        attributes[sc.RUN_STEP] = step
    with tracer.start_as_current_span(
        sc.episode_span_name(env), attributes=attributes, record_exception=True
    ) as span:
        if not span.is_recording():
            dropped_episodes.note(span.get_span_context(), episode_id or example_id)
        yield span


def score_episode(
    span: Span,
    reward: float | None = None,
    *,
    scores: Mapping[str, float] | None = None,
    metrics: Mapping[str, float] | None = None,
) -> None:
    """The outcome of an :func:`episode_span`.

    ``reward`` is the episode's reward as the trainer uses it; ``scores`` are
    named reward components (without ``reward`` their sum is the reward);
    ``metrics`` are anything else measured.
    """
    if reward is not None:
        span.set_attribute(sc.EPISODE_REWARD, float(reward))
    for name, score in (scores or {}).items():
        span.set_attribute(sc.AGENT_REWARD_PREFIX + str(name), float(score))
    for name, value in (metrics or {}).items():
        span.set_attribute(sc.AGENT_METRIC_PREFIX + str(name), float(value))
