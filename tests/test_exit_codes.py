"""A store that cannot be read or written ends every command with the same
exit code, the one docs/cli.md gives for it (1, as ``doctor`` exits for the
same spool), and a message; a usage error stays 2.

The store problems are real: a spool file whose bytes are not SQLite, and a
spool folder that is a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prime_runs_otel.cli.exits import EXIT_INCOMPLETE, EXIT_USAGE
from prime_runs_otel.cli.main import main

STORE_COMMANDS = [
    ["runs"],
    ["show", "abc"],
    ["export", "abc"],
    ["push", "--all"],
    ["prune", "--older-than", "1d"],
    ["rm", "abc"],
    ["compact"],
    ["doctor"],
]


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("argv", STORE_COMMANDS, ids=" ".join)
def test_a_damaged_spool_exits_1_from_every_store_command(
    argv: list[str], isolated_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = isolated_environment / "spool"
    folder.mkdir(mode=0o700)
    (folder / "spool.sqlite3").write_bytes(os.urandom(64 * 1024))
    code, err = _run(capsys, argv)
    assert code == EXIT_INCOMPLETE, err
    assert "Traceback" not in err


def test_a_spool_folder_that_cannot_be_made_exits_1(
    isolated_environment: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = isolated_environment / "a-file"
    blocker.write_text("where the spool folder should be")
    monkeypatch.setenv("PRIME_RUNS_OTEL_DIR", str(blocker / "spool"))
    code, err = _run(capsys, ["demo", "--episodes", "1"])
    assert code == EXIT_INCOMPLETE and "PRIME_RUNS_OTEL_DIR" in err, err


def test_a_usage_error_still_exits_2(
    isolated_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, ["show", "abc"])  # no spool here: nothing to show
    assert code == EXIT_USAGE and "no spool" in err, err
