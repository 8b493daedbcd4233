"""prime-rl's ``FileMonitor`` (``src/prime_rl/monitors/file.py``), metrics rows only."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prime_rl.configs.monitors import FileMonitorConfig
from prime_rl.monitors.base import Kind, Monitor, Subset
from prime_rl.utils.utils import sanitize


class FileMonitor(Monitor):
    config: FileMonitorConfig

    async def init(self, output_dir: Path) -> None:
        self.path = output_dir / self.config.path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a", buffering=1)  # noqa: SIM115

    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        sanitized, _ = sanitize(metrics)
        self.file.write(json.dumps({"step": step, "time": time.time(), **sanitized}) + "\n")

    async def log_episodes(
        self, episodes: list[Any], step: int, kind: Kind, subset: Subset
    ) -> None:
        pass

    async def finalize(self) -> None:
        self.file.close()
