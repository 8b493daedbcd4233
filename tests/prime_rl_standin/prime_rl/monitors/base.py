"""prime-rl's ``Monitor`` (``src/prime_rl/monitors/base.py``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

from prime_rl.utils.config import BaseConfig
from prime_rl.utils.logger import get_logger

Kind = Literal["train", "eval"]
Subset = Literal["all", "effective"]


class Monitor(ABC):
    """A destination of metrics dicts and episode cohorts."""

    def __init__(self, config: BaseConfig):
        self.config = config
        self.logger = get_logger()

    async def init(self, **kwargs: Any) -> None:  # noqa: B027 (as prime-rl)
        """Initialize the run; subclasses name their own keyword arguments."""

    async def log(
        self,
        data: dict[str, Any] | Any,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        """A dict is scalar metrics; anything else is one episode or a list of them."""
        if isinstance(data, dict):
            await self.log_metrics(data, step=step)
        else:
            episodes = data if isinstance(data, list) else [data]
            await self.log_episodes(episodes, step=step, kind=kind, subset=subset)

    @abstractmethod
    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None: ...

    @abstractmethod
    async def log_episodes(
        self, episodes: list[Any], step: int, kind: Kind, subset: Subset
    ) -> None: ...

    async def finalize(self) -> None:  # noqa: B027 (as prime-rl)
        """Finalize the run."""
