"""The monitor this package registers in prime-rl's ``MONITORS`` in place of
its ``PrimeMonitor``, and the patched ``setup`` that registers it.

What prime-rl's fan-out hands it becomes a run of this package, through the
spool like any other (``..delivery``): the run registered with the fields
``PrimeMonitor`` sends (``run_fields.py``), every metrics dict the row
``PrimeMonitor`` posts, a post of its own (``rows.metrics_row``; the span says so
with ``prime.run.metrics.verbatim``, so no ``_timestamp`` is added and an
eval row's float step is never merged into its step's train row), every
rollout (the ``all`` cohort, which every rollout of either kind passes
through as it arrives) an episode span, and the ``effective`` train cohort
of every 10th step the Parquet sample table prime-rl writes, at the same
step with the same rows (``read.projection.step_table_parquet``; its run id
filled in when it is sent). ``finalize`` completes the run; ``exit.py`` ends
it otherwise.

Nothing here may stop training: prime-rl's fan-out already turns an
exception into a warning, and a value, an episode or a table this package
cannot take is that item's counted rejection, with one clear warning per
kind of item.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import types
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from ...config import env_flag, resolve_settings
from ...errors import ConfigError
from ...read.projection import STEP_TABLE_INTERVAL, step_table_parquet
from ...semconv import FRAMEWORK_PRIME_RL
from ..delivery import IN_PROCESS, Delivery, Exported, InProcess, exporter_names, load_exporter
from .exit import ExitWatch
from .rows import metrics_row, step_of
from .run_fields import ATTACH_ENV, api_base_url, run_config, run_fields, shared_run_id
from .table_records import TableRecords
from .workers import Committer, Recorder, Rollouts

__all__ = [
    "TRAINER_ENV",
    "PlatformReporting",
    "metrics_row",
    "patched_setup",
    "platform_monitor",
]

logger = logging.getLogger(__name__)

#: Opt-in for the trainer: its rank 0 calls ``setup`` without a prime config,
#: and with this set its own metrics (perf, optimizer) join the run of the same
#: ``rl`` launch (``$PRL_RUN_ID``, or ``$RUN_ID`` when attached), which the
#: orchestrator owns and ends.
TRAINER_ENV = "PRIME_RUNS_OTEL_PRIME_RL_TRAINER"
#: How long the trainer's process waits at exit for its rows to be delivered.
WORKER_EXIT_TIMEOUT = 30.0
#: How long ``setup`` waits for the platform to register the run, as
#: ``PrimeMonitor`` does before training starts (past it, training starts
#: and the run is registered when the platform answers).
INIT_TIMEOUT_ENV = "PRIME_RUNS_OTEL_INIT_TIMEOUT"
DEFAULT_INIT_TIMEOUT = 30.0

Setup = Callable[..., Coroutine[Any, Any, None]]


async def patched_setup(
    module: types.ModuleType, original: Setup, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    """prime-rl's ``setup`` with this package's monitor first in ``MONITORS``
    and prime-rl's own ``PrimeMonitor`` left out.

    Where prime-rl registers nothing (a rank other than 0, no prime config
    and no trainer opt-in, ``OTEL_TRACES_EXPORTER=none``), its ``setup``
    runs as it is. The owner's monitor is set up before prime-rl's others,
    as ``PrimeMonitor`` is, and a run that cannot be opened at all (a
    malformed setting) stops ``setup`` as ``PrimeMonitor``'s would.
    """
    try:
        bound = inspect.signature(original).bind(*args, **kwargs)
        base = module.Monitor
    except (TypeError, ValueError, AttributeError) as exc:
        # Another prime-rl's setup: it reports the run itself, as it would.
        logger.warning(
            "prime-rl's monitors.setup is not the one this instrumentation knows (%s); "
            "prime-rl reports its run itself",
            exc,
        )
        await original(*args, **kwargs)
        return
    prime = bound.arguments.get("prime")
    owner = prime is not None
    if _rank() != 0 or not (owner or _trainer_opted_in()) or not exporter_names():
        await original(*args, **kwargs)
        return
    reporter: PlatformReporting | None = platform_monitor(base)(prime, owner=owner)
    config = bound.arguments.get("run_config")
    assert reporter is not None
    if owner:
        await reporter.init(config=config)
        bound.arguments["prime"] = None
    else:
        try:
            await reporter.init(config=config)
        except Exception as exc:
            logger.warning(
                "prime-rl trainer: its metrics do not join the run (%s); training goes on", exc
            )
            reporter = None
    await original(*bound.args, **bound.kwargs)
    if reporter is not None:
        module.MONITORS.insert(0, reporter)


def _rank() -> int:
    """prime-rl's own rule: only rank 0 registers monitors."""
    try:
        return int(os.environ.get("RANK", os.environ.get("DP_RANK", "0")))
    except ValueError:
        return 0


def _trainer_opted_in() -> bool:
    try:
        return env_flag(TRAINER_ENV) is True
    except ConfigError as exc:
        logger.warning("%s; the trainer's metrics are not reported", exc)
        return False


_CLASSES: dict[type, type[PlatformReporting]] = {}


def platform_monitor(base: type) -> type[PlatformReporting]:
    """``PlatformMonitor``: :class:`PlatformReporting` as a subclass of
    prime-rl's ``Monitor`` (``base``, known once prime-rl is imported), so
    ``monitors.get(Monitor)`` and prime-rl's ``log`` dispatch see a monitor."""
    made = _CLASSES.get(base)
    if made is None:
        made = types.new_class(
            "PlatformMonitor",
            (PlatformReporting, base),
            exec_body=lambda namespace: namespace.update(
                __module__=__name__, __doc__=PlatformReporting.__doc__
            ),
        )
        _CLASSES[base] = made
    return made


class PlatformReporting:
    """prime-rl's monitor interface, reported through this package.

    ``owner`` is the orchestrator's monitor (built from the prime config):
    it opens the run and ends it. The trainer's (opt-in) adds its metrics
    rows to that run and never ends it.
    """

    def __init__(self, config: Any, *, owner: bool) -> None:
        self.config = config
        self.logger = logger
        self.owner = owner
        self.delivery: Delivery | None = None
        #: Items left out, by kind (``metrics value``, ``episode``, ...).
        self.rejected: dict[str, int] = {}
        self._exit: ExitWatch | None = None
        self._committer: Committer | None = None
        self._recorder: Recorder | None = None
        self._rollouts: Rollouts | None = None
        #: On the recorder's thread: the records of table steps' rollouts.
        self._table_records = TableRecords()

    # -- prime-rl's Monitor ---------------------------------------------------------

    async def init(self, config: Any = None, **_: Any) -> None:
        if self.owner:
            name = getattr(self.config, "name", None)
            fields = run_fields(name, config)
            metadata = run_config(config)
        else:
            fields = _trainer_fields(config)
            metadata = {}
        self.delivery = _open(fields, metadata, owner=self.owner)
        self._recorder = Recorder()
        self._rollouts = Rollouts(self._recorder, self._record)
        self._committer = Committer(self._recorder, _commit_of(self.delivery))
        self._exit = ExitWatch(self._end_at_exit)
        where = self.delivery.platform_id or self.delivery.local_id
        logger.info("Logging metrics and episodes to platform run %s (prime-runs-otel)", where)

    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        delivery = self._live()
        row, dropped, refused = metrics_row(metrics, step)
        if dropped:
            self._reject(
                "non-finite metrics value",
                f"dropping {len(dropped)} non-finite metric value(s) as prime-rl drops them "
                f"({', '.join(dropped[:5])})",
                len(dropped),
            )
        if refused:
            self._reject(
                "metrics value",
                f"metric value(s) that are not numbers or JSON are left out of the step "
                f"{step} row ({', '.join(refused[:5])})",
                len(refused),
            )
        try:
            # prime-rl's row, posted as PrimeMonitor posts it: a post of its own.
            delivery.metrics(row, step_of(step, row), verbatim=True)
        except Exception as exc:
            self._reject("metrics row", f"the step {step} metrics row was refused: {exc}")
        self._hand_over()
        if self._committer is not None:
            self._committer.request()

    async def log_episodes(self, episodes: list[Any], step: int, kind: str, subset: str) -> None:
        rollouts = self._rollouts
        if subset == "all" and self.owner and rollouts is not None:
            # Every rollout passes here, on prime-rl's loop: the shortest way in.
            rollouts.add(episodes, step, kind)
            return
        self._live()
        if not self.owner or rollouts is None or subset == "all":
            return
        self._hand_over()
        if kind == "train" and episodes and step % STEP_TABLE_INTERVAL == 0:
            self._send_table(list(episodes), step)

    def _record(self, episode: Any, step: int, kind: str) -> None:
        """On the recorder's thread: one rollout to the run."""
        assert self.delivery is not None
        try:
            self.delivery.record(self._table_records.for_run(episode, step, kind))
        except Exception as exc:
            self._reject("episode", f"an episode of step {step} was refused: {exc}")

    async def finalize(self) -> None:
        """A clean exit: what is still being written lands first, then the run
        completes (the trainer's flushes what it gave and leaves the run)."""
        delivery = self._live()
        self._hand_over()
        if self._recorder is not None:
            await asyncio.to_thread(self._recorder.drain)
        if self._exit is not None:
            self._exit.disarm()
        if self.rejected:
            logger.warning(
                "prime-rl run %s: left out and counted: %s",
                delivery.platform_id or delivery.local_id,
                ", ".join(f"{count} {what}(s)" for what, count in sorted(self.rejected.items())),
            )
        await asyncio.to_thread(delivery.end, "completed", None, None, {})

    # -- the sample table ---------------------------------------------------------------

    def _send_table(self, episodes: list[Any], step: int) -> None:
        """prime-rl's sample table of ``step``, written off the event loop (as
        prime-rl writes it in a worker thread), on the recorder's thread, so
        that ``finalize`` and the exit path wait for it before the run ends.
        Its ``run_id`` column is left empty and filled in with the
        platform's id when it is sent, so the table needs no answer from the
        platform first: behind a collector (``serve`` registers the run) and
        in a run kept locally until ``push`` as well."""
        delivery = self.delivery
        if delivery is None or self._recorder is None:
            return

        def write_and_keep() -> None:
            try:
                self._write_table(delivery, episodes, step)
            except Exception as exc:
                self._reject("sample table", f"the step {step} sample table was refused: {exc}")

        self._recorder.put(write_and_keep)

    def _write_table(self, delivery: Delivery, episodes: list[Any], step: int) -> None:
        records = []
        for record in self._table_records.table_records(episodes, step):
            if isinstance(record, Exception):
                self._reject("episode", f"an episode of step {step} has no record: {record}")
            else:
                records.append(record)
        body = step_table_parquet(records, "", step) if records else None
        if body is not None:
            delivery.step_table(step, body)

    # -- ending ---------------------------------------------------------------------------

    def _end_at_exit(self, status: str, error: str) -> None:
        delivery = self.delivery
        if delivery is None:
            return
        self._hand_over()
        if self._recorder is not None:
            self._recorder.drain()
        if not self.owner:
            self._deliver_before_leaving(delivery)
        try:
            delivery.end(status, error, None, {})
        except Exception as exc:
            logger.warning("prime-rl run: ending it as %s failed: %s", status, exc)

    @staticmethod
    def _deliver_before_leaving(delivery: Delivery) -> None:
        """The trainer's rows reach the platform before its process exits
        (up to ``WORKER_EXIT_TIMEOUT``): the orchestrator may have closed the
        run already, and nobody else would deliver them before the next
        ``prime-runs-otel push``. A run the platform has not registered yet
        keeps them for its owner to deliver, once it registers it."""
        try:
            if isinstance(delivery, InProcess) and delivery.run.platform_id is None:
                return
            if not delivery.flush(WORKER_EXIT_TIMEOUT):
                logger.warning(
                    "prime-rl trainer: its metrics are not all delivered yet; they stay in the "
                    "spool for the orchestrator (or `prime-runs-otel push`) to deliver"
                )
        except Exception as exc:
            logger.warning("prime-rl trainer: delivering its metrics failed: %s", exc)

    def _hand_over(self) -> None:
        """The rollouts gathered so far go to the recorder, ahead of what follows."""
        if self._rollouts is not None:
            self._rollouts.hand_over()

    def _live(self) -> Delivery:
        if self.delivery is None:
            raise RuntimeError("the prime-rl monitor was not initialized (setup() opens it)")
        return self.delivery

    def _reject(self, what: str, detail: str, count: int = 1) -> None:
        """Count ``count`` items of kind ``what`` left out; the first says why."""
        first = what not in self.rejected
        self.rejected[what] = self.rejected.get(what, 0) + count
        if first:
            logger.warning(
                "prime-rl run: %s; such items are left out and counted (training goes on, "
                "finalize reports the counts)",
                detail,
            )


def _commit_of(delivery: Delivery) -> Callable[[], object]:
    if isinstance(delivery, InProcess):
        return delivery.run.commit
    if isinstance(delivery, Exported):
        return delivery.provider.force_flush
    return lambda: None


def _open(fields: dict[str, Any], metadata: dict[str, Any], *, owner: bool) -> Delivery:
    """The run's pipeline, as ``OTEL_TRACES_EXPORTER`` says (``..delivery``)."""
    exporters = exporter_names()
    others = [load_exporter(name) for name in exporters if name != IN_PROCESS]
    if IN_PROCESS not in exporters:
        if not owner:
            raise ConfigError(
                "behind a collector (OTEL_TRACES_EXPORTER without prime_runs) the trainer's "
                "metrics cannot join the orchestrator's run"
            )
        return Exported.open(fields, metadata, others)
    settings = resolve_settings(base_url=api_base_url())
    delivery = InProcess.open({**fields, "owns_run": owner}, metadata, settings, others)
    if owner and delivery.mode == "online":
        _wait_for_the_platform(delivery)
    return delivery


def _wait_for_the_platform(delivery: InProcess) -> None:
    """prime-rl registers its run before training starts; so does this, within
    ``PRIME_RUNS_OTEL_INIT_TIMEOUT``. A refusal or a platform that has not
    answered is a warning: the run and everything logged to it stay in the
    spool, and ``prime-runs-otel push`` delivers them."""
    state = delivery.run.wait_registered(_init_timeout())
    if state.platform_id is not None:
        delivery.platform_id = state.platform_id
        return
    logger.warning(
        "prime-rl run %s: the platform has not registered it (%s); training goes on and "
        "the run is kept in the spool",
        delivery.local_id,
        state.error or "no answer yet",
    )


def _init_timeout() -> float:
    raw = os.environ.get(INIT_TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_INIT_TIMEOUT
    except ValueError:
        raise ConfigError(f"{INIT_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{INIT_TIMEOUT_ENV} must be 0 or more seconds, got {raw!r}")
    return value


def _trainer_fields(config: Any) -> dict[str, Any]:
    """The trainer joins the launch's run by its key; it registers nothing."""
    attach = os.environ.get(ATTACH_ENV) or None
    run_id = shared_run_id()
    if run_id is None and attach is None:
        raise ConfigError(
            "the trainer knows its run by $PRL_RUN_ID (set by `rl`) or $RUN_ID, and neither is set"
        )
    try:
        model = str(config.model.name)
    except Exception:
        model = "unknown"
    return {
        "kind": "train",
        "framework": FRAMEWORK_PRIME_RL,
        "run_id": run_id,
        "attach": attach,
        "model": model,
    }
