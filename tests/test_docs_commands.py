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
from pathlib import Path

import pytest

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
#: Commands that start a long-running server on fixed ports shared with the
#: machine; `serve` is exercised on free ports in test_receiver.py.
#: serve listens on fixed ports; `run -- vf-eval my-taskset` names a taskset
#: the reader brings (tests/test_vf_eval.py runs it on one of its own).
NOT_RUN_HERE = ("prime-runs-otel serve", "prime-runs-otel run --")


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
