"""What decides whether a run's spans are recorded at all: the sampler and
``OTEL_SDK_DISABLED``.

An episode span a sampler drops is an episode the platform never gets, and
nothing downstream can tell it existed. So the run's own spans (made by the
run's tracer, ``prime_runs_otel``) are always sampled, whatever
``OTEL_TRACES_SAMPLER`` says; every other tracer of the run's provider keeps
the sampler the environment chose. Where this package does not own the
provider (code with a TracerProvider of its own, a zero-code process whose
provider the SDK's configurator built), an episode span that comes out
unsampled is counted and said, never dropped in silence.

``OTEL_SDK_DISABLED=true`` turns the SDK off (its providers hand out no-op
tracers), so it means what ``PRIME_RUNS_MODE=disabled`` means: nothing is
recorded, and nothing waits for a delivery that cannot come.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from opentelemetry.trace import SpanContext

from .config import Settings

__all__ = [
    "DroppedEpisodes",
    "dropped_episodes",
    "sampler_that_may_drop",
    "sdk_disabled",
    "without_sdk",
]

logger = logging.getLogger(__name__)

SDK_DISABLED_ENV = "OTEL_SDK_DISABLED"
SAMPLER_ENV = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG_ENV = "OTEL_TRACES_SAMPLER_ARG"

#: Samplers that record every root span (and, parent-based, every child of a
#: sampled parent): an episode span is never lost to them.
_KEEPING = frozenset({"", "always_on", "parentbased_always_on"})
_RATIO = frozenset({"traceidratio", "parentbased_traceidratio"})


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED``, read as the SDK reads it (``true``, any case)."""
    return os.environ.get(SDK_DISABLED_ENV, "").strip().lower() == "true"


_said_disabled = threading.Event()


def without_sdk(settings: Settings) -> Settings:
    """``settings`` in ``disabled`` mode when ``OTEL_SDK_DISABLED=true``, said
    once per process; otherwise ``settings`` as they are."""
    if not sdk_disabled() or settings.mode == "disabled":
        return settings
    if not _said_disabled.is_set():
        _said_disabled.set()
        logger.warning(
            "%s=true: the OpenTelemetry SDK is off, so prime-runs-otel records nothing, as "
            "with PRIME_RUNS_MODE=disabled. Unset it to report runs.",
            SDK_DISABLED_ENV,
        )
    return dataclasses.replace(settings, mode="disabled")


def sampler_that_may_drop() -> str | None:
    """``OTEL_TRACES_SAMPLER`` (with its argument) when it may leave a root
    span unsampled; ``None`` when every episode span gets through it."""
    name = os.environ.get(SAMPLER_ENV, "").strip().lower()
    argument = os.environ.get(SAMPLER_ARG_ENV, "").strip()
    if name in _KEEPING:
        return None
    if name in _RATIO:
        try:
            if float(argument or "1.0") >= 1.0:
                return None
        except ValueError:
            pass  # the SDK falls back to a ratio of 1.0 here, but say so anyway
        return f"{name} {argument}".strip()
    return name


class DroppedEpisodes:
    """Episode spans that came out unsampled in this process, counted and said.

    Said on the first, and then on the 10th, 100th, ... so a run that loses
    every episode says so a handful of times, not once per episode.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def note(self, context: SpanContext, episode_id: object) -> None:
        """An episode span that is not recording. Only a valid span context
        means a sampler said no; an invalid one is a no-op tracer (no SDK, or
        ``OTEL_SDK_DISABLED``), where nothing is recorded by design."""
        if not context.is_valid:
            return
        with self._lock:
            self.count += 1
            count = self.count
        if not _power_of_ten(count):
            return
        logger.warning(
            "Episode %s was not recorded: the tracer's sampler dropped its span (%s=%s), so "
            "the run will not have it (%d episode(s) dropped so far). A run opened with "
            "start_run() keeps its episodes whatever the sampler; with a TracerProvider of "
            "your own, give it a sampler that keeps them (parentbased_always_on).",
            episode_id,
            SAMPLER_ENV,
            os.environ.get(SAMPLER_ENV, "") or "a sampler set in code",
            count,
        )

    def report(self) -> None:
        """Said once more at the end: the episodes this process lost to the sampler."""
        if self.count:
            logger.warning(
                "%d episode span(s) were dropped by the tracer's sampler in this process and "
                "never reached prime-runs-otel: those episodes are not in their runs.",
                self.count,
            )


def _power_of_ten(count: int) -> bool:
    while count % 10 == 0:
        count //= 10
    return count == 1


#: The process's count; ``PrimeRunsSpanExporter`` reports it at shutdown.
dropped_episodes = DroppedEpisodes()
