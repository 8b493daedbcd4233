"""prime-rl's ``BaseConfig``: a pydantic model that refuses unknown fields."""

from pydantic import BaseModel, ConfigDict


class BaseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
