"""The shell commands the README and the quickstarts show, run as written
(with the placeholders a reader fills in filled in) against a temporary spool
and the fake platform: documentation that does not work is a defect."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
#: Commands that start a long-running server on fixed ports shared with the
#: machine; `serve` is exercised on free ports in test_receiver.py.
#: serve listens on fixed ports; `run -- vf-eval my-taskset` names a taskset
#: the reader brings (tests/test_vf_eval.py runs it on one of its own); `ui`
#: serves until Ctrl-C (tests/test_viewer*.py drive it in a browser).
NOT_RUN_HERE = ("prime-runs-otel serve", "prime-runs-otel run --", "prime-runs-otel ui")


def shell_lines(document: Path) -> list[str]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", document.read_text(), re.S):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **extra}


def _stored_run(name: str) -> str:
    run = pro.start_run(name=name, environments=["gsm8k"], model="demo/m")
    for record in synthetic_episodes(8, seed=len(name)):
        run.record_episode(record)
    return run.finish(timeout=60).local_id


def test_the_readme_store_commands_run_as_written(tmp_path: Path, platform: FakePlatform) -> None:
    commands = [
        line
        for line in shell_lines(ROOT / "README.md")
        if line.startswith("prime-runs-otel") and not line.startswith(NOT_RUN_HERE)
    ]
    assert any(" push RUN" in line for line in commands)  # the extraction found the store block
    run_id = _stored_run("readme-run")
    outputs = tmp_path / "outputs" / "my-run"
    outputs.mkdir(parents=True)
    with (outputs / "traces.jsonl").open("w") as handle:
        for record in synthetic_episodes(5, seed=3):
            handle.write(json.dumps(record) + "\n")
    for line in commands:
        command = shlex.split(line.replace("RUN", run_id[:12]))
        extra = platform.client_env() if command[1] == "push" else {}
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=_env(**extra),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, line


def test_the_zero_code_quickstart_runs_as_written(platform: FakePlatform) -> None:
    lines = shell_lines(ROOT / "docs" / "quickstart-zero-code.md")
    env = _env(**platform.client_env())
    command = None
    for line in lines:
        if line.startswith("export "):
            for assignment in shlex.split(line[len("export ") :]):
                name, value = assignment.split("=", 1)
                if value != "...":
                    env[name] = value
        elif line.startswith("opentelemetry-instrument"):
            command = shlex.split(line)
    assert command is not None
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "has no '='" not in done.stderr
    [platform_run] = platform.runs()
    assert platform_run.name == "my-eval" and platform_run.status == "COMPLETED"
    assert len(platform_run.environments) == 2  # gsm8k%2Cmath: both kept


@pytest.mark.parametrize("document", ["quickstart-eval.md", "quickstart-zero-code.md"])
def test_quickstarts_install_from_a_clone(document: str) -> None:
    text = (ROOT / "docs" / document).read_text()
    assert "pip install prime-runs-otel" not in text  # not a published package
    assert "pip install -e ." in text


def _exported(lines: list[str]) -> dict[str, str]:
    """The variables a document's ``export NAME=...`` lines set, as bash sets them."""
    values = {}
    for line in lines:
        if line.startswith("export "):
            name = line[len("export ") :].split("=", 1)[0]
            values[name] = subprocess.run(
                ["bash", "-c", f"{line}; printf '%s' \"${name}\""],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
    return values


def test_the_viewer_commands_run_as_written(tmp_path: Path) -> None:
    """docs/viewer.md: `ui` on a free port (with and without a token) serves
    the runs page at the address it prints; `export --otlp` sends the run to
    an OTLP endpoint (a real one on loopback in the place of Phoenix's)."""
    from test_viewer_store import _Collector

    lines = shell_lines(ROOT / "docs" / "viewer.md")
    served = [
        line for line in lines if line.startswith("prime-runs-otel ui") and "--port 0" in line
    ]
    assert len(served) == 2
    run_id = _stored_run("viewer-doc-run")
    # The token comes from the environment, as the document sets it (a
    # --token would be visible to every user in the process list).
    exported = _exported(lines)
    assert "PRIME_RUNS_OTEL_UI_TOKEN" in exported
    for line in served:
        command = subprocess.run(
            ["bash", "-c", f"printf '%s\\n' {line[len('prime-runs-otel ui') :]}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")[:-1]
        process = subprocess.Popen(
            ["prime-runs-otel", "ui", *command],
            env={**_env(), **exported},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            address = process.stdout.readline().rsplit(" ", 1)[-1].strip()
            assert address.startswith("http://"), address
            page = httpx.get(address, follow_redirects=True, timeout=30)
            assert page.status_code == 200 and "viewer-doc-run" in page.text
        finally:
            process.terminate()
            process.wait(timeout=30)
    received: list[object] = []
    handler = type("Handler", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (export,) = [line for line in lines if "--otlp" in line]
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        command = shlex.split(
            export.replace("RUN", run_id[:12]).replace("http://127.0.0.1:6006/v1/traces", endpoint)
        )
        done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert received
    finally:
        server.shutdown()
        server.server_close()


#: What docs/quickstart-prime-rl.md's lines name that the tests cannot have,
#: and what stands in for each: the reader's prime-rl clone and environment
#: (this package is installed in the tests' own), and prime-rl's `rl` (the
#: stand-in's, which starts its trainer and orchestrator as `rl` does).
PRIME_RL_NOT_HERE = {
    "cd prime-rl": "the tests run in a folder of their own",
    "uv pip install -e /path/to/prime-runs-otel": "installed in the tests' environment",
    ". .venv/bin/activate": "prime-runs-otel is on the tests' PATH",
}


def test_the_prime_rl_quickstart_runs_as_written(tmp_path: Path, platform: FakePlatform) -> None:
    """Every command of the recipe, in order: `rl` behind the launcher without
    a key keeps the run locally, the store commands show it, and `push` with
    a key leaves on the platform exactly what prime-rl's own monitor leaves
    for the same run (tests/test_prime_rl.py's comparison)."""
    import tomllib
    from test_prime_rl import STANDIN, assert_same_records
    from test_prime_rl import _env as prime_rl_env

    from prime_runs_otel.config import resolve_settings
    from prime_runs_otel.deliver.spool import Spool

    text = (ROOT / "docs" / "quickstart-prime-rl.md").read_text()
    [config] = re.findall(r"```toml\n(.*?)```", text, re.S)
    name = tomllib.loads(re.sub(r"(?m)^ +", "", config))["monitors"]["prime"]["name"]
    rl = [sys.executable, str(STANDIN / "rl.py"), str(tmp_path / "outputs")]
    rl += ["--max-steps", "12", "--name", name, "--quiet-steps"]

    own = subprocess.run(rl, env=prime_rl_env(platform), capture_output=True, text=True)
    assert own.returncode == 0, own.stderr
    [own_run] = platform.runs()

    keyless = {k: v for k, v in prime_rl_env(platform).items() if k != "PRIME_API_KEY"}
    env = {**keyless, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    lines = shell_lines(ROOT / "docs" / "quickstart-prime-rl.md")
    assert [line for line in lines if line in PRIME_RL_NOT_HERE] == list(PRIME_RL_NOT_HERE)
    run_id = None
    for line in lines:
        if line in PRIME_RL_NOT_HERE:
            continue
        if line.startswith("export "):
            assert line == "export PRIME_API_KEY=..."
            env["PRIME_API_KEY"] = platform.api_key
            continue
        command = shlex.split(line)
        if command[:3] == ["prime-runs-otel", "run", "--"]:
            assert command[3:] == ["rl", "@", "rl.toml"], line
            command = [*command[:3], *rl]
        if run_id is not None:
            command = [run_id if word == "RUN" else word for word in command]
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, line
        if command[1] == "run":
            assert len(platform.runs()) == 1  # kept locally: no key
            [stored] = Spool(resolve_settings().spool_path, max_bytes=10**9).reading.runs()
            run_id = stored.local_id
        if command[1:3] == ["export", run_id]:
            rows = [json.loads(row) for row in done.stdout.splitlines()]
            assert rows == platform.metrics_posts(own_run.id)  # as prime-rl posts them
    ours = next(run for run in platform.runs() if run.id != own_run.id)
    assert ours.name == name and ours.status == "COMPLETED"
    assert_same_records(platform, own_run, ours, "samples[*].rows[*].created_at")
