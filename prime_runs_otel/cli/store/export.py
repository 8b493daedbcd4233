"""``prime-runs-otel export``: what the platform would receive for a run
(legacy sample rows, Prime Traces episode lines, the summary, training
metrics), computed from the spool with the same projections delivery uses;
or, with ``--otlp URL``, the run's spans sent to a tracing backend
(:mod:`.export_otlp`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..._json import loads as fast_loads
from ..._text import one_line
from ...deliver.spool import EpisodeRow, RunRow, Spool
from ...deliver.summary import run_summary
from ...read.projection import episode_sample_rows, traces_line
from ..arguments import add_options, option, spool_option
from ..exits import EXIT_INCOMPLETE, EXIT_OK, UsageError
from ..output import Progress, stdout_gone
from .export_otlp import export_otlp
from .lookup import find, open_store
from .output_file import private_output


def cmd_export(args: argparse.Namespace) -> int:
    """What the platform would receive, computed from the spool."""
    spool = open_store(args.spool_dir)
    run = find(spool, args.run)
    if args.otlp:
        return export_otlp(spool, run, args.otlp)
    if args.what == "metrics" and run.kind != "train":
        raise UsageError(
            f"run {run.local_id[:12]} is an {run.kind} run: only training runs have step "
            "metrics. Its averages are in `--what summary`, its episodes in `--what episodes`"
        )
    if args.output:
        with private_output(args.output, force=args.force) as out:
            code = _export(spool, run, args.what, out)
        print(f"wrote {args.what} of run {run.local_id} to {args.output}", file=sys.stderr)
        return code
    return _export(spool, run, args.what, sys.stdout)


def _export(spool: Spool, run: RunRow, what: str, out: Any) -> int:
    if what == "summary":
        out.write(json.dumps(run_summary(run), indent=2, sort_keys=True) + "\n")
        return EXIT_OK
    if what == "metrics":
        for metrics in spool.reading.metrics_rows(run.local_id):
            out.write(metrics.row.strip() + "\n")
            if stdout_gone():
                break
        return EXIT_OK
    progress = Progress(f"exporting {what}", run.episodes, sys.stderr)
    platform_id = run.platform_id or run.local_id
    damaged: list[str] = []
    for episode in spool.reading.iter_episodes(run.local_id):
        try:
            text = _projected(episode, platform_id, run.kind, what)
        except Exception as exc:  # a stored record is outside input: it costs only itself
            damaged.append(f"{episode.episode_id} ({type(exc).__name__}: {exc})")
            progress.advance()
            continue
        out.write(text)
        if stdout_gone():
            break
        progress.advance()
    if sys.stderr.isatty():
        progress.close()
    if damaged:
        print(
            one_line(
                f"error: {len(damaged)} episode(s) were left out: their stored records are "
                f"damaged and cannot be read ({'; '.join(damaged[:3])}"
                + (", ..." if len(damaged) > 3 else "")
                + "). Everything else was exported; `prime-runs-otel doctor` checks the spool"
            ),
            file=sys.stderr,
        )
    missing = run.episodes - progress.done
    if missing > 0 and not stdout_gone():
        print(
            f"note: {missing} episode(s) were delivered already and their bodies are no longer "
            "kept in the spool (pushed with --drop-local, delivered with "
            "PRIME_RUNS_OTEL_KEEP_DELIVERED off, dropped by `prune --bodies` or at the size cap)",
            file=sys.stderr,
        )
    return EXIT_INCOMPLETE if damaged else EXIT_OK


def _projected(episode: EpisodeRow, platform_id: str, kind: str, what: str) -> str:
    """One stored episode as the platform would receive it: its episode line,
    or its sample rows."""
    record = fast_loads(episode.record)
    if what == "episodes":
        return traces_line(record, platform_id, kind).decode()
    rows = episode_sample_rows(record, episode.rollout_number or 1)
    return "".join(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n" for row in rows)


#: ``export``'s arguments, in the order its help lists them.
EXPORT_OPTIONS = (
    option("run", help="run id, platform id, a unique prefix, or the run's name"),
    option(
        "--what",
        choices=["samples", "episodes", "summary", "metrics"],
        default="samples",
        help="legacy sample rows, Prime Traces episode lines, the run summary, or training "
        "step metrics (default: samples)",
    ),
    option(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE instead of stdout, readable by you only (mode 600, as the store)",
    ),
    option(
        "--force",
        action="store_true",
        help="with -o: write through a symbolic link at FILE (refused otherwise)",
    ),
    option(
        "--otlp",
        metavar="URL",
        help="instead, send the run's spans (episodes with their agent and model-call spans, "
        "without the record blobs) to a tracing backend's OTLP/HTTP traces endpoint, e.g. "
        "http://127.0.0.1:6006/v1/traces",
    ),
    option("--json", action="store_true", help="accepted for symmetry: the output is JSON already"),
)


def add_export_command(commands: Any, common: argparse.ArgumentParser) -> None:
    export = commands.add_parser(
        "export", parents=[common], help="what the platform would receive, as JSONL/JSON"
    )
    add_options(export, EXPORT_OPTIONS)
    spool_option(export)
    export.set_defaults(func=cmd_export)
