"""What `make test` runs: every check, each phase timed, and at the end where
the time went (wall and CPU seconds of each phase, and pytest's slowest tests).

The collector build (Go: minutes of CPU on a fresh machine) needs nothing from
the virtualenv, so it starts first, in the background, and overlaps the
install, lint, typecheck and the tests that do not run the collector. The
tests run in parallel workers, the collector tests last: they call the build
script, which waits for the build under way (collector-config/build-otelcol.sh).
With OTELCOL_BIN set nothing is built and that binary is used.
Java, Maven and Apache Kafka's broker jars (`make kafka-tools`: apt-get
where missing, then Maven Central once per version) are fetched in the
background the same way; the tests wait for them, and the Kafka fleet's
tests start the broker from them.

Run by the machine's Python before the virtualenv exists: the standard library
only. Arguments are passed on to pytest; TEST_WORKERS sets how many workers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: More workers than the two cores CI has: many tests wait on subprocesses
#: and sockets rather than compute.
WORKERS = os.environ.get("TEST_WORKERS", "4")
MAKE = os.environ.get("MAKE", "make")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
#: pydantic's plugins off from the first process on (tests/conftest.py says why).
TEST_ENV = {"PYDANTIC_DISABLE_PLUGINS": "__all__"}
#: Plugins the test extra's packages bring and no test uses (logfire's two,
#: anyio's): each pytest process, every worker among them, would import them.
UNUSED_PLUGINS = ("logfire", "pytest_logfire", "anyio")
PYTEST = [
    *(PYTHON, "-m", "pytest", "-q", "--durations=15"),
    *("-n", WORKERS, "--dist", "loadgroup"),
    *(arg for plugin in UNUSED_PLUGINS for arg in ("-p", f"no:{plugin}")),
]


@dataclass
class Phase:
    """One command, its wall time from start to exit and the CPU time it and
    every process it waited for used."""

    name: str
    command: list[str]
    background: bool = False
    started: float = field(default_factory=time.monotonic)
    wall: float = 0.0
    cpu: float = 0.0
    returncode: int | None = None
    process: subprocess.Popen[bytes] | None = None
    _reaper: threading.Thread = field(init=False, repr=False)

    def start(self, env: dict[str, str], output: int | None = None) -> Phase:
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            start_new_session=self.background,
        )
        # Reaped as soon as it ends, so a background phase's wall time is its own.
        self._reaper = threading.Thread(target=self._reap, args=(self.process,), daemon=True)
        self._reaper.start()
        return self

    def _reap(self, process: subprocess.Popen[bytes]) -> None:
        _, status, usage = os.wait4(process.pid, 0)
        self.wall = time.monotonic() - self.started
        self.cpu = usage.ru_utime + usage.ru_stime
        self.returncode = process.returncode = os.waitstatus_to_exitcode(status)

    def wait(self) -> int:
        self._reaper.join()
        assert self.returncode is not None
        return self.returncode

    def stop(self) -> None:
        """End a background phase that is no longer wanted, and what it started."""
        if self.process is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it had ended already
                os.killpg(self.process.pid, signal.SIGTERM)
            self.wait()


#: The bytecode every test worker would otherwise make for itself, made once
#: before the tests. The clone's modules: the tests start hundreds of Python
#: processes, and where PYTHONDONTWRITEBYTECODE is set none of them would keep
#: its bytecode (0.2 s of CPU a start). The test modules and the plugins'
#: packages as pytest rewrites their asserts: each worker collects every
#: module, and without a cached rewrite each one rewrites them all again
#: (5 s of CPU a worker). A collection that writes its cache makes them.
WARM_UP = f"""
import compileall, subprocess, sys
ok = compileall.compile_dir("prime_runs_otel", quiet=1) & compileall.compile_dir("tests", quiet=1)
collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
collect += [arg for plugin in {UNUSED_PLUGINS!r} for arg in ("-p", "no:" + plugin)]
found = subprocess.run(collect, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
sys.stderr.write(found.stderr if found.returncode else "")
sys.exit(0 if ok else 1)
"""


def _writing(env: dict[str, str]) -> dict[str, str]:
    """``env`` with Python writing its bytecode, for the warm-up only."""
    return {name: value for name, value in env.items() if name != "PYTHONDONTWRITEBYTECODE"}


def run(phase: Phase, env: dict[str, str], done: list[Phase]) -> bool:
    print(f"== {phase.name}: {' '.join(phase.command)}", flush=True)
    phase.start(env).wait()
    done.append(phase)
    return phase.returncode == 0


def report(phases: list[Phase], began: float) -> None:
    print("\n== where the time went (wall and CPU seconds; the collector builds beside the rest)")
    for phase in phases:
        how = "background" if phase.background else "          "
        state = "ok" if phase.returncode == 0 else f"FAILED ({phase.returncode})"
        print(
            f"   {phase.name:<16} {phase.wall:7.1f} s wall {phase.cpu:7.1f} s CPU"
            f"   {how} from {phase.started - began:5.1f} s   {state}"
        )
    cpu = sum(phase.cpu for phase in phases)
    print(f"   {'make test':<16} {time.monotonic() - began:7.1f} s wall {cpu:7.1f} s CPU")


def main(pytest_args: list[str]) -> int:
    began = time.monotonic()
    # A shell that starts a command in the background (`&`, nohup) has it
    # ignore Ctrl-C, and its children inherit that: the tests that press
    # Ctrl-C on a process would fail. Handled here, it is default again in them.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Tests build the quick flavour too, so they wait for this build rather than start another.
    env = {**os.environ, "OTELCOL_QUICK_BUILD": "1", **TEST_ENV}
    log = Path(tempfile.mkdtemp(prefix="make-test-")) / "otelcol-build.log"
    collector = Phase("collector build", ["sh", "collector-config/build-otelcol.sh"], True)
    print(f"== {collector.name}: in the background, its log in {log}", flush=True)
    with log.open("wb") as output:
        collector.start(env, output=output.fileno())
    # Debian's Chromium for the browser tests: apt-get waits on the network
    # and dpkg more than on the CPU, so it goes beside the install, lint and
    # typecheck, and the tests wait for it.
    chromium = Phase("chromium", [MAKE, "-s", "chromium"], True)
    chromium.start(env)
    # Java, Maven and Apache Kafka's broker jars (Maven Central, cached by
    # version) for the Kafka fleet's tests: they wait on the network, so
    # beside the rest too (the machine's Python fetches: no virtualenv needed).
    kafka = Phase("kafka broker", [MAKE, "-s", "kafka-tools"], True)
    kafka.start(env)
    install = Phase("install", [MAKE, "-s", ".venv/.installed-test"])
    checks = [Phase("lint", [MAKE, "-s", "lint"]), Phase("typecheck", [MAKE, "-s", "typecheck"])]
    done: list[Phase] = [chromium, kafka]
    passed = False
    warm: Phase | None = None
    try:
        passed = run(install, env, done)
        if passed:  # beside the lint and the type check, which use one core of two
            warm = Phase("bytecode", [PYTHON, "-c", WARM_UP], True).start(_writing(env))
            done.append(warm)
        passed = passed and all(run(step, env, done) for step in checks)
        passed = passed and warm is not None and warm.wait() == 0
        passed = passed and chromium.wait() == 0
        passed = passed and kafka.wait() == 0
        passed = passed and run(Phase("tests", [*PYTEST, *pytest_args]), env, done)
    finally:
        if not passed:  # a failed phase, or Ctrl-C: the build is not wanted any more
            for phase in (collector, chromium, kafka, warm):
                if phase is not None:
                    phase.stop()
    collector.wait()
    if collector.returncode == 0:
        shutil.rmtree(log.parent)
    elif passed:
        print(f"\n== the collector build failed; its log ({log}):")
        print(log.read_text()[-4000:])
    report([collector, *done], began)
    return 0 if passed and collector.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
