"""The fields of prime-rl's ``OrchestratorConfig`` (and the trainer's config)
that its monitors read."""

from pathlib import Path

from prime_rl.configs.monitors import MonitorsConfig, OrchestratorMonitorsConfig
from prime_rl.utils.config import BaseConfig


class ModelConfig(BaseConfig):
    name: str = "Qwen/Qwen3-0.6B"


class EnvConfig(BaseConfig):
    env_id: str


class TrainConfig(BaseConfig):
    source: list[EnvConfig] = []


class OrchestratorConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    max_steps: int | None = None
    batch_size: int = 8
    group_size: int = 4
    seq_len: int = 2048
    output_dir: Path = Path("outputs")
    train: TrainConfig = TrainConfig()
    monitors: OrchestratorMonitorsConfig = OrchestratorMonitorsConfig()


class TrainerConfig(BaseConfig):
    model: ModelConfig = ModelConfig()
    max_steps: int | None = None
    output_dir: Path = Path("outputs")
    monitors: MonitorsConfig = MonitorsConfig()
