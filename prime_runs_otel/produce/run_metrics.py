"""The run's metrics: what a Prometheus or Grafana user charts.

* ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``,
  the GenAI conventions' client histograms, one measurement per model call
  of every episode;
* ``prime.run.episodes`` (counter), ``prime.run.episode.reward`` and
  ``prime.run.episode.score`` (histograms): episodes and their rewards;
* ``prime.run.metric`` (gauge): each numeric value of a training step's
  metrics row, by name.

Every measurement is made in the context of the span it belongs to (the
episode span, or the step's ``prime.run.metrics`` span), so an SDK that
keeps exemplars (its default filter keeps those of sampled spans) links a
bucket or a value to the episode or step behind it.

The instruments exist only when the run has a MeterProvider
(``OTEL_METRICS_EXPORTER``, or ``start_run(meter_provider=...)``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider

from .. import __version__
from .. import semconv as sc
from ._fields import Attributes, as_mapping, as_number, is_int, put_str
from .genai_attributes import call_provider, operation_of

__all__ = ["RunMetrics"]

#: The conventions' advice for the GenAI client histograms.
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
#: Rewards and scores are mostly within [0, 1]; tenths there, coarser beyond.
_REWARD_BUCKETS = (-1.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0, 10.0)


class RunMetrics:
    """The instruments of one run's meter."""

    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter(sc.INSTRUMENTATION_SCOPE, __version__, schema_url=sc.SCHEMA_URL)
        self._tokens = meter.create_histogram(
            sc.GEN_AI_CLIENT_TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            sc.GEN_AI_CLIENT_OPERATION_DURATION,
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self._episodes = meter.create_counter(
            sc.METRIC_EPISODES, unit="{episode}", description="Episodes recorded."
        )
        self._reward = meter.create_histogram(
            sc.METRIC_EPISODE_REWARD,
            unit="1",
            description="Each scored episode's reward.",
            explicit_bucket_boundaries_advisory=_REWARD_BUCKETS,
        )
        self._score = meter.create_histogram(
            sc.METRIC_EPISODE_SCORE,
            unit="1",
            description="Each reward's unweighted score, by reward name.",
            explicit_bucket_boundaries_advisory=_REWARD_BUCKETS,
        )
        self._step = meter.create_gauge(
            sc.METRIC_STEP,
            unit="{value}",
            description="Numeric metrics of a training step, by name.",
        )

    # -- episodes ------------------------------------------------------------------------

    def episode(
        self,
        record: Mapping[str, Any],
        traces: Sequence[Any],
        reward: float | None,
        env: str | None,
        context: Context,
    ) -> None:
        """One episode: counted, its reward and scores, and its model calls."""
        where: Attributes = {}
        put_str(where, sc.EPISODE_ENV, env)
        counted = dict(where)
        ok = record.get("ok")
        if isinstance(ok, bool):
            counted[sc.EPISODE_OK] = ok
        self._episodes.add(1, counted, context=context)
        if reward is not None:
            self._reward.record(reward, where, context=context)
        for item in traces:
            trace = as_mapping(item)
            for name, value in as_mapping(trace.get("rewards")).items():
                score = as_number(as_mapping(value).get("score"))
                if score is not None:
                    self._score.record(score, {**where, sc.REWARD_NAME: str(name)}, context=context)
            self._calls(trace, context)

    def _calls(self, trace: Mapping[str, Any], context: Context) -> None:
        agent = as_mapping(trace.get("agent"))
        calls = trace.get("calls")
        for item in calls if isinstance(calls, list) else ():
            call = as_mapping(item)
            attributes: Attributes = {sc.GEN_AI_OPERATION_NAME: operation_of(call)}
            put_str(attributes, sc.GEN_AI_PROVIDER_NAME, call_provider(agent, call))
            put_str(attributes, sc.GEN_AI_REQUEST_MODEL, call.get("model"))
            self._usage(as_mapping(call.get("usage")), attributes, context)
            self._call_duration(call, attributes, context)

    def _usage(self, usage: Mapping[str, Any], attributes: Attributes, context: Context) -> None:
        prompt, cached, produced = (
            usage.get("prompt_tokens"),
            usage.get("cached_input_tokens"),
            usage.get("completion_tokens"),
        )
        if is_int(prompt):
            fed = int(prompt) + (int(cached) if is_int(cached) else 0)
            self._tokens.record(fed, {**attributes, sc.GEN_AI_TOKEN_TYPE: "input"}, context=context)
        if is_int(produced):
            self._tokens.record(
                int(produced), {**attributes, sc.GEN_AI_TOKEN_TYPE: "output"}, context=context
            )

    def _call_duration(
        self, call: Mapping[str, Any], attributes: Attributes, context: Context
    ) -> None:
        timing = as_mapping(call.get("time"))
        start, end = as_number(timing.get("start")), as_number(timing.get("end"))
        if not start or not end or end < start:
            return  # not recorded: no duration rather than a made-up one
        error = as_mapping(call.get("error"))
        if error:
            attributes = dict(attributes)
            put_str(attributes, sc.ERROR_TYPE, error.get("type"))
        self._duration.record(end - start, attributes, context=context)

    # -- training steps ---------------------------------------------------------------------

    def step(self, values: Mapping[str, Any], context: Context) -> None:
        """Each numeric value of a step's metrics row, by name (nested
        objects by their path: ``{"reward": {"mean": 1}}`` is ``reward/mean``)."""
        for name, value in _numbers(values, ""):
            self._step.set(value, {sc.METRIC_NAME: name}, context=context)


def _numbers(values: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, float]]:
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _numbers(value, name + "/")
            continue
        number = as_number(value)
        if number is not None and math.isfinite(number):
            yield name, number
