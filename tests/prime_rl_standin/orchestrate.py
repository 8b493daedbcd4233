"""An orchestrator loop with prime-rl's calling order of its monitors
(``src/prime_rl/orchestrator/orchestrator.py`` at the commit the README names):

- ``setup`` once, with the monitors config and the run config;
- every rollout as it arrives: ``log([episode], step, kind, "all")``;
- every train step: ``log(effective, step, "train", "effective")``, then the
  metrics dict (which carries ``"step": step``);
- an eval epoch: its rollouts as they arrive, ``log(effective, step, "eval",
  "effective")``, then its metrics dict (``"step": float(step)``), after the
  train row of the same step;
- ``finalize`` on a clean exit only; an exception or Ctrl-C leaves it out,
  and an exception ends the process through prime-rl's ``clean_exit``
  (logged, then ``sys.exit(1)``).

The rollouts are real verifiers ``Episode`` objects built from synthetic
records. Options make the exit paths: ``--fail-at`` raises, ``--hang-at``
prints ``HANG`` and waits (for SIGKILL or SIGINT).

After each metrics dict the loop waits until ``PrimeMonitor``'s requests in
flight are answered (``settle``), so that a run's records do not depend on
how fast the machine is: in prime-rl a step takes seconds, far longer than a
post, and its rows reach the platform in the order they are logged. Without
it, a stand-in step takes microseconds, and which fire-and-forget posts an
exception or a signal cuts off would change from run to run. prime-rl's loop
has no such wait; ``--no-settle`` leaves it out.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from prime_rl import monitors
from prime_rl.configs.monitors import (
    FileMonitorConfig,
    OrchestratorMonitorsConfig,
    PrimeMonitorConfig,
    WandbMonitorConfig,
)
from prime_rl.configs.orchestrator import EnvConfig, OrchestratorConfig, TrainConfig

ENV_ID = "gsm8k-demo"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--eval-steps", default="0,10")
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--hang-at", type=int, default=None)
    parser.add_argument("--nan-at", type=int, default=None)
    parser.add_argument("--bad-episode-at", type=int, default=None)
    parser.add_argument("--bad-metric-at", type=int, default=None)
    parser.add_argument("--name", default=None)
    parser.add_argument("--wandb-project", default=None)
    parser.add_argument("--no-prime", action="store_true")
    parser.add_argument("--quiet-steps", action="store_true")
    parser.add_argument("--no-settle", action="store_true")
    return parser.parse_args()


def rollouts(count: int, step: int, kind: str, run_id: str) -> list[Any]:
    """``count`` verifiers Episodes of one step, as the dispatcher hands them over."""
    from verifiers.v1 import WireEpisode

    from prime_runs_otel.produce.synthetic import synthetic_episodes

    episodes = []
    for index, record in enumerate(synthetic_episodes(count, seed=1000 * step + len(kind))):
        record["id"] = f"{kind}-{step}-{index}-{record['id'][:8]}"
        record["run"] = {"type": "train", "id": run_id, "work": {"type": kind, "step": step}}
        record["traces"][0]["info"]["advantage"] = round(0.25 * index - 0.5, 3)
        episodes.append(WireEpisode.model_validate(record))
    return episodes


def config(args: argparse.Namespace) -> OrchestratorConfig:
    return OrchestratorConfig(
        max_steps=args.max_steps,
        batch_size=args.rollouts,
        group_size=2,
        output_dir=args.output_dir,
        train=TrainConfig(source=[EnvConfig(env_id=ENV_ID)]),
        monitors=OrchestratorMonitorsConfig(
            prime=None if args.no_prime else PrimeMonitorConfig(name=args.name),
            wandb=None,
            file=FileMonitorConfig(),
        ),
    )


async def run(args: argparse.Namespace) -> None:
    cfg = config(args)
    wandb = WandbMonitorConfig(project=args.wandb_project) if args.wandb_project else None
    if wandb is not None:
        # The stand-in has no WandbMonitor: the project only reaches the run config.
        cfg.monitors.wandb = wandb
    await monitors.setup(
        wandb=None,
        prime=cfg.monitors.prime,
        file=cfg.monitors.file,
        output_dir=cfg.output_dir,
        run_config=cfg,
        train_env_names=[ENV_ID],
        eval_env_names=[ENV_ID],
    )
    eval_steps = {int(step) for step in args.eval_steps.split(",") if step}
    clean_exit = False
    try:
        for step in range(args.max_steps):
            await one_step(args, step, step in eval_steps)
        clean_exit = True
    finally:
        if clean_exit:
            await monitors.finalize()


async def one_step(args: argparse.Namespace, step: int, with_eval: bool) -> None:
    if step == args.fail_at:
        raise RuntimeError(f"the dispatcher stopped at step {step}")
    if step == args.hang_at:
        print("HANG", flush=True)
        await asyncio.sleep(3600)
    batch = rollouts(args.rollouts, step, "train", "local-run")
    for episode in batch:
        await monitors.log([episode], step, "train", "all")
    if step == args.bad_episode_at:
        await monitors.log([object()], step, "train", "all")
    effective = batch[:-1]  # the last group's rollout is filtered out
    await monitors.log(effective, step, "train", "effective")
    metrics: dict[str, Any] = {
        "train/agg/reward/mean/all": 0.5 + step / 100,
        "progress/rollouts": len(batch),
        "time/step": 0.25,
        "step": step,
    }
    if step == args.nan_at:
        metrics["train/agg/loss/mean"] = float("nan")
    if step == args.bad_metric_at:
        metrics["debug/handle"] = object()
    await monitors.log(metrics, step=step)
    await settle(args)
    if with_eval:
        evals = rollouts(2, step, "eval", "local-run")
        for episode in evals:
            await monitors.log([episode], step, "eval", "all")
        await monitors.log(evals, step, "eval", "effective")
        await monitors.log({f"eval/{ENV_ID}/reward/mean/all": 0.75, "step": float(step)}, step=step)
        await settle(args)
    if not args.quiet_steps:
        print(f"STEP {step}", flush=True)


async def settle(args: argparse.Namespace) -> None:
    """Until ``PrimeMonitor``'s requests in flight are answered (see the
    module's docstring); nothing when prime-rl's monitor is not registered."""
    monitor = monitors.get(monitors.PrimeMonitor)
    if monitor is not None and not args.no_settle:
        await asyncio.gather(*list(monitor.run._tasks), return_exceptions=True)


def clean_exit(func: Any) -> Any:
    """prime-rl's ``clean_exit`` (``src/prime_rl/utils/utils.py``), which wraps
    ``run_orchestrator``: an exception is logged and the process exits with
    ``sys.exit(1)``."""

    async def wrapper(*args: Any) -> Any:
        try:
            return await func(*args)
        except Exception:
            logging.getLogger("prime_rl").exception(f"Fatal error in {func.__name__}")
            sys.exit(1)

    return wrapper


def main() -> None:
    asyncio.run(clean_exit(run)(parse()))


if __name__ == "__main__":
    sys.exit(main())
