"""CPU per episode of the two halves of the in-process path that do not touch
the spool: building an episode's span (the run's producer thread) and reading
it back in ``export()`` before the commit (its record, digest, facts and
Prime Traces line), side by side for two checkouts of this package.

Each side runs in a fresh subprocess with ``PYTHONPATH`` set to its checkout,
interleaved over several rounds; each round prints the CPU time
(``time.thread_time``, one thread) per episode of both halves, and the end
the minimum and median over the rounds of each.

    python bench/produce_read.py [--base DIR] [--episodes 2000] [--rounds 5] [--size 8000]

``--base`` is the root of another checkout (``git worktree add`` or
``git archive``); without it only this checkout is measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHILD_FLAG = "--child"
HERE = Path(__file__).resolve().parent.parent


def child(count: int, size: int, seed: int) -> dict[str, float]:
    """One measured pass: every episode built into a span, then every span read."""
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

    import prime_runs_otel as pro
    from prime_runs_otel.deliver.delivery import read_ahead
    from prime_runs_otel.produce.episode import record_episode
    from prime_runs_otel.produce.synthetic import synthetic_episodes
    from prime_runs_otel.read.spans import from_readable_span

    ended: list[ReadableSpan] = []

    class Keep(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            ended.append(span)

    try:  # as the exporter does when it is built in the process (checkouts that have it)
        from prime_runs_otel._encoded_here import encoded_here

        encoded_here.enable()
    except ImportError:
        pass
    provider = TracerProvider(resource=pro.run_resource(run_id="bench-produce-read"))
    provider.add_span_processor(Keep())
    tracer = provider.get_tracer("bench")
    episodes = list(synthetic_episodes(count, seed=seed, target_bytes=size))
    gc.collect()
    gc.freeze()
    started = time.thread_time()
    for episode in episodes:
        record_episode(tracer, episode, child_spans=False, summary_attributes=False)
    built = time.thread_time() - started
    started = time.thread_time()
    views = [read_ahead(from_readable_span(span), True) for span in ended]
    read = time.thread_time() - started
    assert len(views) == count and all(view.prepared is not None for view in views)
    return {"build_ms": 1000 * built / count, "read_ms": 1000 * read / count}


def run_side(root: Path, args: argparse.Namespace, seed: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, __file__, CHILD_FLAG, str(args.episodes), str(args.size), str(seed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the run of {root} failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=8000, help="bytes per episode record")
    args = parser.parse_args()
    sides = {"this": HERE} if args.base is None else {"base": args.base.resolve(), "this": HERE}
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for number in range(args.rounds):
        order = list(sides) if number % 2 == 0 else list(reversed(sides))
        for side in order:
            figures = run_side(sides[side], args, seed=number)
            results[side].append(figures)
            cells = "  ".join(f"{name} {value:.4f}" for name, value in figures.items())
            print(f"round {number + 1} {side:>4}: {cells}", flush=True)
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for side, samples in results.items():
        for name in samples[0]:
            values = [sample[name] for sample in samples]
            print(
                f"produce_read.{side}.{name} min {min(values):.4f} "
                f"median {statistics.median(values):.4f} ms"
            )


def _child_main(argv: list[str]) -> None:
    figures: Any = child(int(argv[0]), int(argv[1]), int(argv[2]))
    print(json.dumps(figures))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        _child_main(sys.argv[2:])
    else:
        main()
