"""Ctrl-C soak: SIGINT at random moments, once or twice, into real processes.

Each case starts a real subprocess, waits until it records, then sends
SIGINT after a random delay (landing while it records, while it finishes the
run, or after it is done) and, in more than half of the cases, a second one a
random 0-500 ms later. Three kinds of process: a small eval on the public API
(``start_run`` and ``record_episode`` in a loop, in a ``with`` block), and
``prime-runs-otel demo`` with and without ``--fake-platform``. Half of the
cases run with two busy-loop processes beside them.

Every process must exit within 20 s of the first signal, with 130 (or 0 when
it completed before the signal landed: then its run is completed), and its
run must be ended in the store, never left recording, with every episode
``record_episode`` accepted stored or counted lost (``rejected``). The store
is read with the package's own spool API, as the process left it (no store
command runs first, which would end the runs of dead processes itself).

The suite runs twelve cases: four of each kind, two of those four beside the
busy loops, and six of the twelve interrupted twice (18 signals), which
still puts every kind through a Ctrl-C while it records, while it finishes
and after it is done, alone and loaded, since each delay is drawn anew
from the seed every run. ``SOAK=long`` (``make soak-serve``) runs 135: the
more cases, the more of the random moments one run tries.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.view.runs import run_view

#: Four of each kind (half of them loaded), six interrupted twice: 18 signals.
#: Each case costs a process start and two busy loops beside half of them,
#: minutes of CPU on the two cores the whole suite shares; the long soak has
#: the numbers.
CASES = 135 if os.environ.get("SOAK") == "long" else 12
DOUBLES = CASES * 15 // 27
#: Cases running at once: the machine has two cores.
AT_ONCE = 3
#: From the first SIGINT to the process's exit, at most.
EXIT_WITHIN = 20.0
#: How long a process may take to start recording (imports on a loaded machine).
START_WITHIN = 120.0
KINDS = ("eval", "demo", "demo-fake-platform")
EPISODES = {"eval": 1500, "demo": 1500, "demo-fake-platform": 1000}

#: The eval, as a command-line program would write it: Ctrl-C exits 130, and
#: once the program knows its exit code a Ctrl-C is ignored (as the demo
#: does): Python restores the default action while it tears down, and a
#: signal then would kill the process half way out (-2) whatever its code.
EVAL = textwrap.dedent(
    """
    import signal, sys

    def main():
        import prime_runs_otel as pro
        from prime_runs_otel.produce.synthetic import synthetic_episodes

        accepted = open(sys.argv[1], "w", buffering=1)
        run = pro.start_run(name="soak-eval", environments=["soak"])
        print("recording", run.id, flush=True)
        with run:
            for episode in synthetic_episodes(int(sys.argv[2]), seed=0, ending_at="now"):
                run.record_episode(episode)
                accepted.write(episode["id"] + "\\n")
        print("completed", flush=True)

    try:
        main()
        code = 0
    except KeyboardInterrupt:
        code = 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)
    """
)


@dataclass(frozen=True)
class Case:
    number: int
    kind: str
    loaded: bool
    delay: float  # after it starts recording, to the first SIGINT
    gap: float | None  # to the second SIGINT; None: only one


@dataclass
class Outcome:
    case: Case
    returncode: int | None
    exit_after: float  # seconds from the first SIGINT
    stderr: str
    folder: Path


def _cases(seed: int) -> list[Case]:
    rng = random.Random(seed)
    doubles = set(rng.sample(range(CASES), DOUBLES))
    cases = []
    for number in range(CASES):
        double = number in doubles
        cases.append(
            Case(
                number=number,
                kind=KINDS[number % len(KINDS)],
                loaded=number >= CASES // 2,
                delay=rng.uniform(0.0, 1.5),
                gap=rng.uniform(0.0, 0.5) if double else None,
            )
        )
    return cases


def _command(case: Case, folder: Path) -> list[str]:
    episodes = str(EPISODES[case.kind])
    if case.kind == "eval":
        script = folder / "eval.py"
        script.write_text(EVAL)
        return [sys.executable, str(script), str(folder / "accepted.txt"), episodes]
    command = [sys.executable, "-m", "prime_runs_otel.cli", "demo", "--episodes", episodes]
    return command + (["--fake-platform"] if case.kind == "demo-fake-platform" else [])


def _run_case(case: Case, root: Path) -> Outcome:
    folder = root / f"case-{case.number}"
    folder.mkdir()
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PRIME_", "OTEL_"))
    }
    env.update(HOME=str(folder), PRIME_RUNS_OTEL_DIR=str(folder / "spool"))
    env["PRIME_RUNS_OTEL_RETRY_MAX_DELAY"] = "0.3"
    process = subprocess.Popen(
        _command(case, folder),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=folder,
    )
    try:
        _wait_until_recording(process, case)
        time.sleep(case.delay)
        first = time.monotonic()
        process.send_signal(signal.SIGINT)
        if case.gap is not None:
            time.sleep(case.gap)
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
            return Outcome(case, None, time.monotonic() - first, err, folder)
        return Outcome(case, process.returncode, time.monotonic() - first, err, folder)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _wait_until_recording(process: subprocess.Popen[str], case: Case) -> None:
    """Until the process says it records (the eval's first line, the
    demo's first progress line), within START_WITHIN."""
    stream = process.stdout if case.kind == "eval" else process.stderr
    marker = "recording" if case.kind == "eval" else "recording episodes"
    assert stream is not None
    deadline = time.monotonic() + START_WITHIN
    for line in stream:
        if line.startswith(marker):
            return
        assert time.monotonic() < deadline, f"{case}: no sign of recording"
    raise AssertionError(f"{case}: exited before recording ({process.wait()})")


@contextmanager
def _busy_loops(count: int) -> Iterator[None]:
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def _progress_seen(stderr: str) -> int:
    """The most episodes a demo said it had recorded (``recording episodes: k/N``)."""
    seen = 0
    for line in stderr.splitlines():
        if line.startswith("recording episodes: "):
            seen = max(seen, int(line.split(": ", 1)[1].split("/", 1)[0]))
    return seen


@functools.cache
def _episode_ids(count: int) -> list[str]:
    """The ids of the episodes every process records, in order."""
    return [episode["id"] for episode in synthetic_episodes(count, seed=0)]


def _check(outcome: Outcome) -> list[str]:
    """What is wrong with the case's exit and its store, if anything."""
    case = outcome.case
    if outcome.returncode is None:
        return [f"did not exit within {EXIT_WITHIN:.0f}s of the first SIGINT"]
    if outcome.returncode not in (0, 130):
        return [f"exit {outcome.returncode}: {outcome.stderr[-1500:]}"]
    settings = resolve_settings(spool_dir=outcome.folder / "spool")
    spool = Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)
    try:
        runs = spool.reading.runs()
        if len(runs) != 1:
            return [f"{len(runs)} runs in the store"]
        [run] = runs
        view = run_view(spool, run)
        stored = [row.episode_id for row in spool.reading.iter_episodes(run.local_id)]
    finally:
        spool.close()
    problems = []
    if run.end_status is None or view["state"] == "recording":
        problems.append(f"left {view['status']}, {view['state']}")
    if run.mode == "local" and not run.closed:
        problems.append("a local run not closed")
    if outcome.returncode == 0 and run.end_status != "completed":
        problems.append(f"exit 0 but the run ended {run.end_status}")
    everything = _episode_ids(EPISODES[case.kind])
    if stored != everything[: len(stored)]:
        problems.append("the stored episodes are not the recorded ones, in order")
    if run.end_expected is not None and len(stored) + run.rejected < run.end_expected:
        problems.append(f"{run.end_expected} handed over, {len(stored)} stored")
    if case.kind == "eval":
        accepted = (outcome.folder / "accepted.txt").read_text().split()
        missing = len(set(accepted) - set(stored))
    else:
        missing = _progress_seen(outcome.stderr) - len(stored)
    if missing > run.rejected:
        problems.append(f"{missing} accepted episode(s) missing, {run.rejected} counted lost")
    return problems


@pytest.mark.timeout(1800)  # a loaded machine starts each process slowly; SOAK=long
def test_ctrl_c_at_random_moments_leaves_every_run_ended_and_every_episode_counted(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("SOAK_SEED", time.time_ns() % 10_000))
    cases = _cases(seed)
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(AT_ONCE) as pool:
        outcomes += pool.map(lambda case: _run_case(case, tmp_path), cases[: CASES // 2])
        with _busy_loops(2):
            outcomes += pool.map(lambda case: _run_case(case, tmp_path), cases[CASES // 2 :])
    assert sum(1 if case.gap is None else 2 for case in cases) == CASES + DOUBLES
    # Every kind of process, alone and beside the busy loops.
    assert {(case.kind, case.loaded) for case in cases} == {
        (kind, loaded) for kind in KINDS for loaded in (False, True)
    }
    failures = [
        f"{outcome.case} (exit after {outcome.exit_after:.1f}s): {problem}"
        for outcome in outcomes
        for problem in _check(outcome)
    ]
    assert not failures, f"SOAK_SEED={seed}:\n" + "\n".join(failures)
