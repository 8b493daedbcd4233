"""What ``pip install`` of the package gives and what its extras add: a run in
process and the store commands import no server (uvicorn, grpcio, h11,
google.rpc, prometheus_client are the [serve] extra's, uvicorn the [ui]
extra's), and ``serve`` or ``ui`` without their extra says exactly what to
install instead of failing on an import.

An installation without an extra is a real interpreter in which those
modules cannot be imported (``sys.modules[name] = None``, Python's own way of
refusing an import), running the real command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SERVE_ONLY = ("uvicorn", "h11", "grpc", "google.rpc", "prometheus_client")


def _python(code: str, *, without: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in without)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_in_process_and_the_store_commands_import_no_server(
    isolated_environment: Path,
) -> None:
    done = _python(
        """
        import json, sys
        import prime_runs_otel as pro
        from prime_runs_otel.cli.main import main
        from prime_runs_otel.produce.synthetic import synthetic_episode

        run = pro.start_run(name="no-server", environments=["env-a"])
        run.record_episode(synthetic_episode(0))
        result = run.finish(timeout=60)
        code = main(["runs", "--json"])
        servers = ("uvicorn", "h11", "grpc", "google.rpc", "prometheus_client")
        loaded = [name for name in servers if name in sys.modules]
        print(json.dumps({"episodes": result.episodes, "code": code, "loaded": loaded}))
        """
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"episodes": 1, "code": 0, "loaded": []}


@pytest.mark.parametrize(("command", "extra"), [("serve", "serve"), ("ui", "ui")])
def test_a_server_command_without_its_extra_says_what_to_install(
    isolated_environment: Path, command: str, extra: str
) -> None:
    done = _python(
        f"""
        from prime_runs_otel.cli.main import main
        sys.exit(main([{command!r}, "--no-browser"] if {command!r} == "ui" else [{command!r}]))
        """,
        without=("uvicorn",),
    )
    clone = Path(__file__).resolve().parent.parent
    assert done.returncode == 2, done.stderr
    assert f"pip install -e '{clone}[{extra}]'" in done.stderr
    assert "uvicorn" in done.stderr and "Traceback" not in done.stderr


def test_serve_names_every_module_of_its_extra_that_is_missing(
    isolated_environment: Path,
) -> None:
    done = _python(
        """
        from prime_runs_otel.cli.main import main
        sys.exit(main(["serve"]))
        """,
        without=SERVE_ONLY,
    )
    assert done.returncode == 2, done.stderr
    assert all(name in done.stderr for name in SERVE_ONLY), done.stderr
