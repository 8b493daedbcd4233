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
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

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
    for item in range(puts):
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00001, 0.0003))
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
    assert len(interrupted) >= 100, len(interrupted)
    assert handled == sorted(set(handled)), "handled out of order, or twice"
    assert set(returned) <= set(handled), "a put that returned was never handled"
    assert set(handled) <= set(returned) | interrupted
