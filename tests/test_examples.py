"""Every script in examples/ runs as its docstring says: installed with the
install line written there, into a fresh virtual environment that has only
what that line brings (not the test dependencies), then started with the
command written there, against the fake platform on loopback (the RL loop
brings its own fake OpenAI-compatible server).

The environment is made once per test session: ``uv pip install`` from the
local package with uv's cache takes seconds.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prime_runs_otel.testing import FakePlatform

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
#: The line every example's docstring starts its commands with.
INSTALL = "pip install -e '.[examples]'"
TIMEOUT = 120
TEAM = "team-examples"

#: What each example leaves on the platform: its run's kind and episodes.
EXPECTED = {
    "eval_in_process.py": ("eval", 40),
    "own_tracer_provider.py": ("eval", 20),
    "zero_code.py": ("eval", 15),
    "rl_loop.py": ("train", 3 * 4 * 2),
}

pytestmark = pytest.mark.xdist_group("examples-venv")


def documented_commands(script: Path) -> tuple[str, str]:
    """The install line and the command that follows it, as the docstring
    shows them (the indented block after "Install and run")."""
    docstring = ast.get_docstring(ast.parse(script.read_text())) or ""
    lines = docstring.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Install and run"))
    block: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("    "):
            block.append(line[4:])
        elif block:
            break
    assert block, f"{script.name}: no indented commands after 'Install and run'"
    return block[0], "\n".join(block[1:])


@pytest.fixture(scope="session")
def examples_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with what the documented install line
    installs, run as written (through uv's pip, from the clone's root)."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    venv = tmp_path_factory.mktemp("examples") / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    pip, install, *packages = shlex.split(INSTALL)
    assert (pip, install) == ("pip", "install")
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *packages],
        cwd=ROOT,
        check=True,
        timeout=600,
    )
    return venv


def _run_documented(script: str, venv: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The example's documented command, in a shell with the environment
    activated (its bin/ first on PATH), from the clone's root."""
    install, command = documented_commands(EXAMPLES / script)
    assert install == INSTALL, f"{script}: its install line is {install!r}"
    activated = {
        **os.environ,
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        **env,
    }
    activated.pop("PYTHONPATH", None)  # only what the install line brought
    return subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=activated,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def test_every_example_is_covered() -> None:
    assert {path.name for path in EXAMPLES.glob("*.py")} == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_from_its_documented_lines(
    script: str, examples_venv: Path, platform: FakePlatform
) -> None:
    done = _run_documented(script, examples_venv, **platform.client_env(), PRIME_TEAM_ID=TEAM)
    assert done.returncode == 0, done.stdout + done.stderr
    kind, episodes = EXPECTED[script]
    [platform_run] = platform.runs()
    assert platform_run.kind == kind
    assert platform_run.status == "COMPLETED", platform_run.error_message
    assert len(platform.episodes(platform_run.id)) == episodes


@pytest.mark.parametrize("script", ["eval_in_process.py", "own_tracer_provider.py"])
def test_example_without_a_key_runs_into_the_local_store(script: str, examples_venv: Path) -> None:
    done = _run_documented(script, examples_venv)
    assert done.returncode == 0, done.stdout + done.stderr
    listing = subprocess.run(
        [str(examples_venv / "bin" / "prime-runs-otel"), "runs", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [run] = json.loads(listing.stdout)
    assert run["mode"] == "local"
    assert run["status"] == "completed" and run["closed"]
    assert run["episodes"] == EXPECTED[script][1]
