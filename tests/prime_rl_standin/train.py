"""The trainer's reporting in prime-rl: rank 0 calls ``monitors.setup``
without a prime config (the trainer's monitors config has none), then logs
its own metrics (perf, optimizer) every step and finalizes."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from prime_rl import monitors
from prime_rl.configs.orchestrator import TrainerConfig


async def run(output_dir: Path, steps: int) -> None:
    cfg = TrainerConfig(max_steps=steps, output_dir=output_dir)
    await monitors.setup(wandb=None, file=None, output_dir=output_dir, run_config=cfg)
    for step in range(steps):
        await monitors.log(
            {"optim/lr": 1e-6, "perf/throughput": 1000.0 + step, "step": step}, step=step
        )
    await monitors.finalize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=12)
    args = parser.parse_args()
    asyncio.run(run(args.output_dir, args.max_steps))


if __name__ == "__main__":
    main()
