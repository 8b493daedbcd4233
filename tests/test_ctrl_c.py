"""Ctrl-C at any moment of a command's life: every ``prime-runs-otel``
command exits 130 with one line, ``interrupted``, or 0 when it finished
first; never a traceback, never killed by the signal, never a hang.

Each trial starts the real command in a process of its own and sends it
SIGINT at one of three moments: right after it is started, at a random
moment of its life, or once it has printed what it prints (so during its
exit). Half of the trials run beside busy loops on both cores. The commands
are ``--version``, ``runs``, ``show RUN``, ``export RUN`` and ``demo``.

One moment is outside any Python program's reach: before the interpreter has
loaded the command's own first module (the interpreter's start, the
environment's ``.pth`` hooks, the script's own ``import``), an interrupt
ends the process as it ends any program (killed by the signal, or Python's
own start-up traceback). Such a trial is recognised by its stderr naming no
file of the package, counted, and allowed only for the earliest moments.

``SOAK=long`` runs five times as many trials.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes

#: Trials per test (two tests: idle and loaded), spread over the commands.
TRIALS = 20 * (5 if os.environ.get("SOAK") == "long" else 1)
#: Every interrupted process must be gone within this.
EXIT_BOUND = 20.0
SCRIPT = Path(sys.executable).with_name("prime-runs-otel")


@dataclass(frozen=True)
class Trial:
    command: list[str]
    moment: str  # "spawn", "random" or "exit" (once it printed its first line)
    delay: float = 0.0


@dataclass
class Outcome:
    trial: Trial
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return f"{self.trial}: exit {self.returncode}\nstderr: {self.stderr[-2000:]}"


def _cli() -> list[str]:
    """The installed command, as a user runs it (``python -m`` without one)."""
    if SCRIPT.exists():
        return [str(SCRIPT)]
    return [sys.executable, "-m", "prime_runs_otel.cli"]


def _store_with_a_run() -> str:
    run = pro.start_run(name="ctrl-c", model="demo/m", environments=["env-a"])
    for record in synthetic_episodes(30, seed=3):
        run.record_episode(record)
    result = run.finish(timeout=60)
    assert result.closed
    return result.local_id


def _commands(run_id: str) -> list[list[str]]:
    return [
        ["--version"],
        ["runs"],
        ["show", run_id],
        ["export", run_id, "--what", "samples"],
        ["demo", "--episodes", "20"],
    ]


def _start_up() -> float:
    """How long the interpreter takes to start and print the version here
    now: random moments are drawn after most of it, so that most of them
    meet the command rather than the interpreter's own start."""
    began = time.monotonic()
    subprocess.run([*_cli(), "--version"], capture_output=True, timeout=120, check=True)
    return time.monotonic() - began


def _trials(run_id: str, rng: random.Random) -> list[Trial]:
    commands = _commands(run_id)
    start_up = _start_up()
    trials = []
    for index in range(TRIALS):
        command = commands[index % len(commands)]
        moment = ("spawn", "random", "random", "exit")[(index // len(commands)) % 4]
        # The imports, the store's opening, the command's own work.
        delay = start_up * 0.7 + rng.uniform(0.0, 1.0) if moment == "random" else 0.0
        trials.append(Trial(command, moment, delay))
    return trials


def _interrupt(trial: Trial) -> Outcome:
    process = subprocess.Popen(
        [*_cli(), *trial.command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = threading.Event()
    out: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            out.append(line)
            seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if trial.moment == "random":
        time.sleep(trial.delay)
    elif trial.moment == "exit":
        # What it prints comes at the end of its work: once the first line
        # is out (and a moment for the rest), the process is on its way out.
        seen.wait(timeout=120)
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"{trial} still running {EXIT_BOUND:.0f}s after its Ctrl-C")
    reader.join(timeout=10)
    return Outcome(trial, process.returncode, "".join(out), stderr)


def _before_the_package(outcome: Outcome) -> bool:
    """The interrupt ended the process before the package's first module
    ran: killed by the signal with nothing said, or a traceback of the
    interpreter's own start-up that passes through no file of the package."""
    if outcome.returncode not in (-signal.SIGINT, 1):
        return False
    return f"prime_runs_otel{os.sep}" not in outcome.stderr


def _check(outcome: Outcome) -> str:
    """The kind of ending, after asserting it is an allowed one."""
    if outcome.returncode == 130:
        assert "Traceback" not in outcome.stderr, outcome.describe()
        # One line (demo says what it does with the run it stops on it).
        last = outcome.stderr.strip().splitlines()[-1]
        assert last.startswith("interrupted"), outcome.describe()
        return "interrupted"
    if outcome.returncode == 0:
        assert "Traceback" not in outcome.stderr, outcome.describe()
        return "finished first"
    assert outcome.trial.moment != "exit", outcome.describe()
    assert _before_the_package(outcome), outcome.describe()
    return "before the package ran"


@pytest.fixture
def busy_loops() -> Iterator[None]:
    """Both cores kept busy beside the command, as on a shared machine."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def _soak(seed: int) -> Counter[str]:
    run_id = _store_with_a_run()
    endings: Counter[str] = Counter()
    later: Counter[str] = Counter()
    for trial in _trials(run_id, random.Random(seed)):
        ending = _check(_interrupt(trial))
        endings[ending] += 1
        if trial.moment != "spawn":
            later[ending] += 1
    # The later moments must mostly have met the command, not the interpreter's start.
    assert later["before the package ran"] <= sum(later.values()) // 2, endings
    assert endings["interrupted"] > 0, endings
    return endings


def test_ctrl_c_at_any_moment_exits_130_with_one_line() -> None:
    print(_soak(seed=1))


@pytest.mark.usefixtures("busy_loops")
def test_ctrl_c_at_any_moment_exits_130_with_one_line_under_load() -> None:
    print(_soak(seed=2))


def test_a_ctrl_c_during_the_exit_is_no_traceback() -> None:
    """Interrupts aimed at the way out only, where a process used to be
    killed by the signal (exit -2) or print a traceback from an exit handler."""
    _store_with_a_run()
    endings: Counter[str] = Counter()
    for _ in range(TRIALS // 2):
        endings[_check(_interrupt(Trial(["runs"], "exit")))] += 1
    assert set(endings) <= {"interrupted", "finished first"}, endings
