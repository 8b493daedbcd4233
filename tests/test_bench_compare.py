"""`bench/compare.py`: the report of what moved between two `make bench` results
(no benchmark is run here; speed is never asserted in the tests)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _results(path: Path, commit: str, figures: dict[str, float]) -> Path:
    document: dict[str, Any] = {
        "commit": commit,
        "date": "2026-01-01 00:00 UTC",
        "command": "bench/run_all.py",
        "machine": "2 cores",
        "load": [0.5],
        "figures": {name: {"value": value, "unit": "ms"} for name, value in figures.items()},
    }
    path.write_text(json.dumps(document))
    return path


def test_every_figure_that_moved_more_than_five_percent_is_printed_and_no_other(
    tmp_path: Path,
) -> None:
    old = _results(
        tmp_path / "old.json",
        "aaaaaaa",
        {
            "in_process/in_process.otel.cpu_ms_per_episode": 0.40,
            "in_process/in_process.otel.episodes_per_s": 1000.0,
            "in_process/in_process.otel.caller_cpu_ms_per_episode": 0.0050,
            "in_process/in_process.otel.peak_rss_mb": 300.0,
            "in_process/gone": 1.0,
        },
    )
    new = _results(
        tmp_path / "new.json",
        "bbbbbbb",
        {
            "in_process/in_process.otel.cpu_ms_per_episode": 0.30,  # -25 %
            "in_process/in_process.otel.episodes_per_s": 900.0,  # -10 %, worse
            "in_process/in_process.otel.caller_cpu_ms_per_episode": 0.0052,  # +4 %
            "in_process/in_process.otel.peak_rss_mb": 315.1,  # +5.03 %
            "in_process/added": 2.0,
        },
    )

    done = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), str(old), str(new)],
        capture_output=True,
        text=True,
        check=True,
    )

    moved = [
        line.split()[0] for line in done.stdout.splitlines() if line.endswith(("better", "worse"))
    ]
    assert sorted(moved) == [
        "in_process/in_process.otel.cpu_ms_per_episode",
        "in_process/in_process.otel.episodes_per_s",
        "in_process/in_process.otel.peak_rss_mb",
    ]
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert lines["in_process/in_process.otel.cpu_ms_per_episode"].endswith("better")
    assert lines["in_process/in_process.otel.episodes_per_s"].endswith("worse")
    assert "3 figure(s) moved by more than 5 %" in done.stdout
    assert "old only: in_process/gone" in done.stdout
    assert "new only: in_process/added" in done.stdout
    assert "aaaaaaa" in done.stdout and "load 0.5" in done.stdout


def test_a_commit_without_results_is_refused_with_what_to_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), "0000000nonexistent"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "make bench" in done.stderr


def test_figure_lines_are_read_from_a_benchmark_output_and_tables_are_not() -> None:
    output = "\n".join(
        [
            "machine: 2 cores, Python 3.11.7",
            "figure                      otel          sdk  otel/sdk",
            "cpu_ms_per_episode         0.330        0.260      1.27",
            "in_process.otel.cpu_ms_per_episode 0.3300 ms",
            "in_process.ratio.cpu_ms_per_episode 1.270 x",
            "in_process.otel.dropped 0.0000 episodes",
            "in_process.otel.export_p50_ms nan ms",
            "offered.rate_500.achieved 500.0",
        ]
    )
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import results; "
        "print(json.dumps(results.figures_in(sys.stdin.read())))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(BENCH)],
        input=output,
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads(done.stdout)
    not_measured, unit = figures.pop("in_process.otel.export_p50_ms")
    assert math.isnan(not_measured) and unit == "ms"
    assert figures == {
        "in_process.otel.cpu_ms_per_episode": [0.33, "ms"],
        "in_process.ratio.cpu_ms_per_episode": [1.27, "x"],
        "in_process.otel.dropped": [0.0, "episodes"],
        "offered.rate_500.achieved": [500.0, ""],
    }
