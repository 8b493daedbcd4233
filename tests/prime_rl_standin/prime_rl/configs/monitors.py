"""prime-rl's monitor configs (``prime_rl/configs/monitors.py``)."""

from pathlib import Path

from prime_rl.utils.config import BaseConfig


class WandbMonitorConfig(BaseConfig):
    project: str = "prime-rl"
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] | None = None
    offline: bool = False


class FileMonitorConfig(BaseConfig):
    path: Path = Path("metrics.jsonl")


class PrimeMonitorConfig(BaseConfig):
    name: str | None = None


class MonitorsConfig(BaseConfig):
    wandb: WandbMonitorConfig | None = None
    file: FileMonitorConfig | None = FileMonitorConfig()


class OrchestratorMonitorsConfig(MonitorsConfig):
    prime: PrimeMonitorConfig | None = None
