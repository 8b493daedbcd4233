"""prime-rl's monitor registry (``src/prime_rl/monitors/__init__.py``): ``setup``
registers one monitor per config on rank 0; ``log`` and ``finalize`` fan out
and never raise."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from prime_rl.configs.monitors import FileMonitorConfig, PrimeMonitorConfig, WandbMonitorConfig
from prime_rl.monitors.base import Kind, Monitor, Subset
from prime_rl.monitors.file import FileMonitor
from prime_rl.monitors.prime import PrimeMonitor
from prime_rl.utils.config import BaseConfig
from prime_rl.utils.logger import get_logger

__all__ = ["FileMonitor", "Monitor", "PrimeMonitor", "finalize", "get", "log", "setup"]

MONITORS: list[Monitor] = []


async def setup(
    wandb: WandbMonitorConfig | None = None,
    prime: PrimeMonitorConfig | None = None,
    file: FileMonitorConfig | None = None,
    *,
    output_dir: Path,
    run_config: BaseConfig | None = None,
    train_env_names: list[str] | None = None,
    eval_env_names: list[str] | None = None,
    overview_flavor: Literal["rl", "sft"] = "rl",
) -> None:
    assert not MONITORS, "Monitors already set up. Call `setup` only once per process."
    rank = int(os.environ.get("RANK", os.environ.get("DP_RANK", "0")))
    if rank != 0:
        return
    monitors: list[tuple[Monitor, dict[str, Any]]] = []
    if prime is not None:
        monitors.append((PrimeMonitor(prime), dict(config=run_config)))
    if wandb is not None:
        raise NotImplementedError("the stand-in has no WandbMonitor")
    if file is not None:
        monitors.append((FileMonitor(file), dict(output_dir=output_dir)))
    for monitor, init_kwargs in monitors:
        await monitor.init(**init_kwargs)
        MONITORS.append(monitor)


def get(monitor_cls: type[Monitor]) -> Monitor | None:
    return next((monitor for monitor in MONITORS if isinstance(monitor, monitor_cls)), None)


async def log(data: Any, step: int, kind: Kind = "train", subset: Subset = "effective") -> None:
    for monitor in MONITORS:
        try:
            await monitor.log(data, step=step, kind=kind, subset=subset)
        except Exception as e:
            get_logger().warning(f"Failed to log to {monitor.__class__.__name__}: {e}")


async def finalize() -> None:
    for monitor in MONITORS:
        try:
            await monitor.finalize()
        except Exception as e:
            get_logger().warning(f"Failed to finalize {monitor.__class__.__name__}: {e}")
