"""What a command imports before it starts: ``--version`` and ``--help``
only the command line, and the store's reading commands only the spool;
never the OpenTelemetry SDK, the platform clients or a web server, which
took ``--version`` 0.7 s on an idle machine. What is imported is asserted,
never how long it takes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import prime_runs_otel as pro
from prime_runs_otel.cli.main import COMMANDS, build_parser
from prime_runs_otel.produce.synthetic import synthetic_episodes

#: What none of the light commands may import.
HEAVY = ("opentelemetry.sdk", "httpx", "prime_traces", "uvicorn", "grpc", "google.protobuf")


def _imported_by(*args: str) -> tuple[int, set[str]]:
    """Run the command as the installed script does, in a fresh interpreter;
    its exit code and every module imported by then."""
    code = (
        "import json, sys\n"
        f"sys.argv = ['prime-runs-otel', *{list(args)!r}]\n"
        "from prime_runs_otel.cli import main\n"
        "code = main()\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    modules = json.loads(done.stderr.rsplit("MODULES ", 1)[1])
    return done.returncode, set(modules)


def _heavy(modules: set[str]) -> list[str]:
    return sorted(
        name for name in modules if any(name == h or name.startswith(h + ".") for h in HEAVY)
    )


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["runs", "--help"]])
def test_version_and_help_import_only_the_command_line(args: list[str]) -> None:
    code, modules = _imported_by(*args)
    assert code == 0
    assert not _heavy(modules), _heavy(modules)
    assert "sqlite3" not in modules or args[0] == "runs"


def test_the_store_s_reading_commands_import_only_the_spool() -> None:
    run = pro.start_run(name="light", model="m", environments=["env-a"])
    for record in synthetic_episodes(3, seed=1):
        run.record_episode(record)
    local_id = run.finish(timeout=60).local_id
    for args in (["runs"], ["runs", "--json"], ["show", local_id], ["show", local_id, "--json"]):
        code, modules = _imported_by(*args)
        assert code == 0, args
        assert not _heavy(modules), (args, _heavy(modules))


def test_the_help_lines_listed_without_importing_are_the_commands_own() -> None:
    """``--help`` lists every command from a table, without importing their
    modules: the lines must be the ones the modules give, in the same order."""
    full = build_parser()
    listed = build_parser("")
    assert _help_lines(listed) == _help_lines(full)
    assert [name for name, _ in _help_lines(full)] == [name for name, *_ in COMMANDS]


def _help_lines(parser: object) -> list[tuple[str, str | None]]:
    actions = parser._subparsers._group_actions[0]  # type: ignore[attr-defined]
    return [(choice.dest, choice.help) for choice in actions._choices_actions]
