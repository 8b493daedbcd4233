"""What a newcomer reads when something is off: each message said once, at
once, with what happened to the data and the next step. Every command runs
as a real subprocess against a real spool, the fake platform, a real
``serve`` or a closed port on loopback."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_cli_newcomer import _cli, _json, _local_run, _ok, _write_traces
from test_receiver import ServeProcess, free_port, serve_env

from prime_runs_otel.testing import FakePlatform

TIMEOUT = 120
ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "prime_runs_otel.cli"]


def _closed_platform() -> dict[str, str]:
    """A key, and a platform address where nothing listens."""
    url = f"http://127.0.0.1:{free_port()}"
    return {"PRIME_API_KEY": "a-key", "PRIME_API_BASE_URL": url, "PRIME_TRACES_URL": url}


# -- demo -------------------------------------------------------------------------------


def test_a_wrong_key_is_said_once_in_one_sentence(platform: FakePlatform) -> None:
    wrong = {**platform.client_env(), "PRIME_API_KEY": "wrong"}
    done = _cli("demo", "--episodes", "3", **wrong)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    # The status as a word of its own: a run id is hex, and may hold "401".
    assert len(re.findall(r"(?<![0-9a-f])401(?![0-9a-f])", said)) == 1, said
    assert ".." not in said.replace("...", ""), said
    assert "push" in said  # the next step is still there, once


def test_waiting_on_an_unreachable_platform_says_ctrl_c_is_safe() -> None:
    process = subprocess.Popen(
        [*CLI, "demo", "--episodes", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **_closed_platform()},
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("finishing the run"):
            break
    assert "Ctrl-C is safe" in line and "spool" in line and "push" in line, line
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 130, err
    assert "stopped waiting" in err and "prime-runs-otel push" in err, err
    assert "Traceback" not in err
    [run] = _json("runs")
    assert run["episodes"] == 3 and run["pending"] == 3  # kept, to push later


def test_local_mode_says_where_the_run_is_kept(isolated_environment: Path) -> None:
    out = _ok("demo", "--episodes", "2")
    assert "delivering" not in out
    assert "kept locally (no API key)" in out and str(isolated_environment / "spool") in out


@pytest.mark.parametrize("count", ["0", "-5"])
def test_demo_needs_an_episode(count: str) -> None:
    done = _cli("demo", "--episodes", count)
    assert done.returncode == 2 and "must be 1 or more" in done.stderr, done.stderr
    assert not (Path(os.environ["PRIME_RUNS_OTEL_DIR"]) / "spool.sqlite3").exists()


def test_two_demos_started_together_get_two_names() -> None:
    demos = [
        subprocess.Popen(
            [*CLI, "demo", "--episodes", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(os.environ),
        )
        for _ in range(2)
    ]
    for demo in demos:
        assert demo.wait(timeout=TIMEOUT) == 0
    names = {run["name"] for run in _json("runs")}
    assert len(names) == 2, names


# -- replay over OTLP -------------------------------------------------------------------


def test_otlp_replay_to_a_closed_port_is_not_reachable_at_once(tmp_path: Path) -> None:
    path = _write_traces(tmp_path / "run", 6)
    url = f"http://127.0.0.1:{free_port()}"
    done = _cli("replay", str(path), "--otlp-endpoint", url)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()  # no SDK retry warnings before it
    assert f"not reachable: {url}/v1/traces" in line and "serve" in line, done.stderr


# -- serve ------------------------------------------------------------------------------


def _serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "serve", "--http-port", "0", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_beyond_loopback_without_a_token_is_refused_before_starting() -> None:
    done = _serve("--host", "0.0.0.0", "--grpc-port", "0")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "needs a bearer token" in line and "serve stopped" not in done.stderr


def test_serve_on_a_taken_grpc_port_is_one_clean_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve("--grpc-port", str(port))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("error: cannot listen for OTLP/gRPC") and "--grpc-port" in line
    assert "add_port" not in done.stderr and ".." not in line


def test_serve_with_a_refused_key_stops_at_start(platform: FakePlatform) -> None:
    done = _serve("--grpc-port", "0", **{**platform.client_env(), "PRIME_API_KEY": "wrong"})
    assert done.returncode == 2
    assert "refused the API key (401)" in done.stderr and "doctor" in done.stderr
    assert "serve stopped" not in done.stderr


def test_serve_with_the_platform_away_warns_and_serves(tmp_path: Path) -> None:
    away = {**_closed_platform(), "PRIME_RUNS_MODE": "online"}
    serve = ServeProcess(tmp_path, serve_env(tmp_path, None, **away)).start()
    try:
        log = serve.log()
    finally:
        serve.stop()
    assert "serving anyway" in log and "OTLP/HTTP on" in log


# -- the local store ----------------------------------------------------------------------


def test_runs_on_a_fresh_machine_is_an_empty_list_and_a_hint() -> None:
    done = _cli("runs")
    assert done.returncode == 0, done.stderr
    assert "no runs yet" in done.stdout and "prime-runs-otel demo" in done.stdout
    assert _json("runs") == []
    assert not Path(os.environ["PRIME_RUNS_OTEL_DIR"]).exists(), "looking creates no spool"


def test_an_ambiguous_prefix_lists_the_runs_it_could_mean() -> None:
    first = _local_run("first", run_id="8a1-first")
    second = _local_run("second", run_id="8a2-second")
    done = _cli("show", "8")
    assert done.returncode == 2
    assert first[:12] in done.stderr and second[:12] in done.stderr, done.stderr
    assert "first" in done.stderr and "second" in done.stderr


def test_metrics_of_an_eval_run_are_refused_with_the_reason() -> None:
    run_id = _local_run("an-eval")
    done = _cli("export", run_id, "--what", "metrics")
    assert done.returncode == 2 and done.stdout == ""
    assert "only training runs have step metrics" in done.stderr, done.stderr


# -- hints ------------------------------------------------------------------------------


def _doctor_fix(path: str) -> str:
    done = _cli("doctor", "--json", PATH=path)
    [configuration] = [c for c in json.loads(done.stdout) if c["name"] == "configuration"]
    return str(configuration["fix"])


def test_prime_login_is_suggested_only_where_prime_is_installed(tmp_path: Path) -> None:
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    assert "prime login" not in _doctor_fix(str(bare))
    assert "PRIME_API_KEY" in _doctor_fix(str(bare))
    with_prime = tmp_path / "prime-bin"
    with_prime.mkdir()
    prime = with_prime / "prime"
    prime.write_text("#!/bin/sh\nexit 0\n")
    prime.chmod(0o755)
    assert "prime login" in _doctor_fix(str(with_prime))


# -- run -- -----------------------------------------------------------------------------


def test_run_of_a_file_that_is_not_executable_says_so(tmp_path: Path) -> None:
    script = tmp_path / "afile"
    script.write_text("#!/bin/sh\necho hello\n")
    done = subprocess.run(
        [*CLI, "run", "--", "./afile"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=dict(os.environ),
    )
    assert done.returncode == 2
    assert "not executable" in done.stderr and "chmod +x ./afile" in done.stderr, done.stderr
    assert "not found on PATH" not in done.stderr


def test_run_without_a_key_says_where_runs_are_kept(isolated_environment: Path) -> None:
    done = _run_python("print('ran')")
    assert done.returncode == 0 and done.stdout == "ran\n", done.stderr
    [line] = done.stderr.splitlines()
    assert "kept locally" in line and str(isolated_environment / "spool") in line
    assert "prime-runs-otel ui" in line and "show" in line
    keyed = _run_python("print('ran')", PRIME_API_KEY="a-key")
    assert keyed.stderr == ""  # online: nothing to say
    collector = _run_python("print('ran')", OTEL_TRACES_EXPORTER="otlp")
    assert collector.stderr == ""  # over OTLP, the receiving serve keeps the runs


def _run_python(code: str, **env: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, **env},
    )


# -- install lines ------------------------------------------------------------------------


def test_no_document_installs_the_package_from_a_registry() -> None:
    """It is not on PyPI: every pip line that names it installs it from a clone."""
    from_registry = re.compile(r"pip install[^\n`]*?\s['\"]?prime-runs-otel(?![\w/.-])")
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in document.read_text().splitlines():
            assert not from_registry.search(line), f"{document.name}: {line}"
