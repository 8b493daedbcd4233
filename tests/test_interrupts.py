"""Ctrl-C wherever it lands: in the hand-off from the caller's thread to a
run's producer thread, and while ``finish()`` ends the run.

Each scenario runs in a subprocess of its own (a signal handler is the
process's, and a hang must end in a failed assertion, not a stuck suite),
with SIGALRM timers (``signal.setitimer``) or SIGINT raising
``KeyboardInterrupt`` on the main thread at random moments, into a real
spool read back afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.run import INTERRUPTED, INTERRUPTED_DRAIN_WAIT

#: Generous: what a scenario takes on a loaded two-core machine, many times over.
SUBPROCESS_TIMEOUT = 180
ROOT = Path(__file__).resolve().parent.parent


def _python(script: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``script`` and return the JSON it prints last; a hang is a failure."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"hung for {SUBPROCESS_TIMEOUT}s; stderr: {exc.stderr!r}"[-3000:]
        ) from None
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the hand-off --------------------------------------------------------------------

#: Thousands of puts from the main thread into a small hand-off whose thread
#: takes a random while over each item, with a timer firing at random short
#: intervals whose handler raises KeyboardInterrupt while a put or a drain
#: runs: the interrupts land in every line of them, waits for room included.
#: The caller catches each and goes on. Then the drain must return, and
#: every item be handled once, in order: each put that returned, and perhaps
#: the interrupted ones.
HANDOFF_UNDER_SIGNALS = textwrap.dedent(
    """
    import json, random, signal, sys, time
    from prime_runs_otel.produce.handoff import Handoff

    seed, puts = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    handled = []

    def handle(item):
        if rng.random() < 0.3:
            time.sleep(rng.choice((0, 0.00005, 0.0002)))
        handled.append(item)

    handoff = Handoff(handle, lambda item, exc: None, capacity=4)
    armed = False

    def on_alarm(signum, frame):
        if armed:
            raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, on_alarm)
    returned, interrupted = [], []
    # At least `puts` puts, and on until 500 were interrupted (however fast
    # this machine is): at most 20 times as many.
    for item in range(puts * 20):
        if item >= puts and len(interrupted) >= 500:
            break
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.000005, 0.0003))
        try:
            armed = True
            if item % 97 == 0:
                handoff.drain()
            handoff.put(item)
            armed = False
            returned.append(item)
        except KeyboardInterrupt:
            armed = False
            interrupted.append(item)
    signal.setitimer(signal.ITIMER_REAL, 0)
    handoff.close()
    print(json.dumps({"returned": returned, "interrupted": interrupted, "handled": handled}))
    """
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ctrl_c_anywhere_in_put_or_drain_never_hangs_the_drain_nor_loses_an_item(
    seed: int,
) -> None:
    report = _python(HANDOFF_UNDER_SIGNALS, str(seed), "4000")
    returned, interrupted = report["returned"], set(report["interrupted"])
    handled = report["handled"]
    # The timer really landed inside the puts and drains, many times.
    assert len(interrupted) >= 500, len(interrupted)
    assert handled == sorted(set(handled)), "handled out of order, or twice"
    assert set(returned) <= set(handled), "a put that returned was never handled"
    assert set(handled) <= set(returned) | interrupted


# -- record_episode ------------------------------------------------------------------


def _spool() -> Spool:
    settings = resolve_settings()
    return Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)


def _stored_ids(run_id: str) -> list[str]:
    """The run's episode ids as the spool holds them, in its order."""
    spool = _spool()
    try:
        return [row.episode_id for row in spool.reading.iter_episodes(run_id)]
    finally:
        spool.close()


def _run_row(run_id: str) -> Any:
    spool = _spool()
    try:
        return spool.reading.run(run_id)
    finally:
        spool.close()


#: An eval on the public API, with a timer raising KeyboardInterrupt at
#: random moments inside record_episode; the loop catches each and goes on.
RECORD_UNDER_SIGNALS = textwrap.dedent(
    """
    import json, random, signal, sys
    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    seed, count = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    run = pro.start_run(name="under-signals", environments=["env-a"], child_spans=False)
    armed = False

    def on_alarm(signum, frame):
        if armed:
            raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, on_alarm)
    accepted, interrupted = [], []
    # At least `count` episodes, and on until 200 calls were interrupted
    # (however fast this machine is): at most 20 times as many.
    episodes = synthetic_episodes(count * 20, seed=seed, target_bytes=600)
    for number, episode in enumerate(episodes):
        if number >= count and len(interrupted) >= 200:
            break
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.000005, 0.0002))
        try:
            armed = True
            run.record_episode(episode)
            armed = False
            accepted.append(episode["id"])
        except KeyboardInterrupt:
            armed = False
            interrupted.append(episode["id"])
    signal.setitimer(signal.ITIMER_REAL, 0)
    result = run.finish(timeout=60)
    print(json.dumps({"run": run.id, "accepted": accepted, "interrupted": interrupted,
                      "status": result.status, "closed": result.closed}))
    """
)


def test_ctrl_c_inside_record_episode_loses_nothing_accepted_and_the_end_counts_what_arrived() -> (
    None
):
    report = _python(RECORD_UNDER_SIGNALS, "7", "1500")
    accepted, interrupted = report["accepted"], set(report["interrupted"])
    assert len(interrupted) >= 200, len(interrupted)
    stored = _stored_ids(report["run"])
    assert set(accepted) <= set(stored)
    assert set(stored) <= set(accepted) | interrupted
    assert [episode for episode in stored if episode in set(accepted)] == accepted
    run = _run_row(report["run"])
    # The end counts what became spans: an interrupted call that had queued
    # its episode is in it, one that had not is not.
    assert (run.end_status, run.end_expected, run.closed) == ("completed", len(stored), True)
    assert (report["status"], report["closed"]) == ("completed", True)


# -- finish() ------------------------------------------------------------------------

#: A run whose producer thread a span processor holds from its first
#: episode on (``on_start`` never returns until the gate opens): the first
#: Ctrl-C ends the ``with`` block, the second lands while ``finish()``
#: waits for the hand-off, which can never drain. DRAIN_WAIT is cut for a
#: finish that no Ctrl-C hurries.
HELD_HANDOFF = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from opentelemetry.sdk.trace import SpanProcessor
    import prime_runs_otel as pro
    import prime_runs_otel.run.ending as run_module
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    second, drain_wait = sys.argv[1] == "second", float(sys.argv[2])
    run_module.DRAIN_WAIT = drain_wait

    class Held(SpanProcessor):
        def __init__(self):
            self.gate, self.held = threading.Event(), threading.Event()
        def on_start(self, span, parent_context=None):
            if span.name.startswith("episode ") and not self.gate.is_set():
                self.held.set()
                self.gate.wait()

    held = Held()
    run = pro.start_run(name="held", environments=["env-a"])
    run.tracer_provider.add_span_processor(held)
    accepted = []
    interrupts = threading.Thread(target=lambda: (
        held.held.wait(60), time.sleep(0.2), os.kill(os.getpid(), signal.SIGINT),
        second and (time.sleep(0.5), os.kill(os.getpid(), signal.SIGINT)),
    ))
    started = time.monotonic()
    outcome = "returned"
    try:
        with run:
            for episode in synthetic_episodes(100, seed=3, target_bytes=600):
                accepted.append(run.record_episode(episode))
            interrupts.start()
            while True:
                time.sleep(0.01)
    except KeyboardInterrupt:
        outcome = "interrupted"
    elapsed = time.monotonic() - started
    held.gate.set()
    print(json.dumps({"run": run.id, "accepted": accepted, "outcome": outcome,
                      "elapsed": elapsed, "result": run.result and run.result.__dict__}))
    """
)


@pytest.mark.parametrize("second", [True, False])
def test_finish_ends_in_bounded_time_whatever_the_producer_thread_does(second: bool) -> None:
    """With a second Ctrl-C the hand-off gets INTERRUPTED_DRAIN_WAIT, without
    one DRAIN_WAIT (cut to 3 s here); either way the run ends cancelled and
    closed, and what never became a span is counted, not dropped."""
    report = _python(HELD_HANDOFF, "second" if second else "first", "3")
    assert report["outcome"] == "interrupted"
    run = _run_row(report["run"])
    stored = _stored_ids(report["run"])
    accepted = report["accepted"]
    assert len(accepted) == 100 and not stored  # the first episode was held before its span
    assert (run.end_status, run.closed) == ("cancelled", True)
    assert (run.end_expected, run.rejected) == (0, 100)
    assert report["result"]["failed"] == 100
    # 0.2 s before the first Ctrl-C; then the wait for the hand-off, and the
    # commit of the end, with a load's slack.
    drain = INTERRUPTED_DRAIN_WAIT if second else 3.0
    assert report["elapsed"] < 0.2 + drain + 10, report["elapsed"]


#: A second Ctrl-C right after the first can land in a ``with`` block's
#: exit before ``finish()`` began: here the KeyboardInterrupt leaves the
#: program with the run never finished.
UNFINISHED_AT_CTRL_C = textwrap.dedent(
    """
    import sys
    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    run = pro.start_run(name="escaped", environments=["env-a"])
    for episode in synthetic_episodes(200, seed=4, target_bytes=600):
        run.record_episode(episode)
    print(run.id, flush=True)
    raise KeyboardInterrupt
    """
)


def test_a_program_taken_down_by_ctrl_c_before_finish_ends_its_run_cancelled_at_exit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNFINISHED_AT_CTRL_C],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=ROOT,
    )
    assert done.returncode == -signal.SIGINT, done.stderr[-2000:]
    run = _run_row(done.stdout.split()[0])
    assert (run.end_status, run.end_error, run.closed) == ("cancelled", INTERRUPTED, True)
    assert run.episodes == run.end_expected == 200
    assert "crashed" not in done.stderr
