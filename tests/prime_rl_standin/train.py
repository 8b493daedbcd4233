"""The trainer's reporting in prime-rl (``src/prime_rl/trainer/rl/train.py``):
rank 0 calls ``monitors.setup`` without a prime config (the trainer's
monitors config has none), each in its own ``asyncio.run``, then logs its
own metrics (perf, optimizer) every step, one ``asyncio.run(monitors.log(...))``
per dict (each carrying ``"step"``), and never calls ``finalize``."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from prime_rl import monitors
from prime_rl.configs.orchestrator import TrainerConfig


def run(output_dir: Path, steps: int) -> None:
    cfg = TrainerConfig(max_steps=steps, output_dir=output_dir)
    asyncio.run(monitors.setup(wandb=None, file=None, output_dir=output_dir, run_config=cfg))
    for step in range(steps):
        asyncio.run(monitors.log({"perf/throughput": 1000.0 + step, "step": step}, step=step))
        asyncio.run(monitors.log({"optim/lr": 1e-6, "step": step}, step=step))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=12)
    args = parser.parse_args()
    run(args.output_dir, args.max_steps)


if __name__ == "__main__":
    main()
