"""prime-rl's ``sanitize`` (``src/prime_rl/utils/utils.py``)."""

import math
from typing import Any


def sanitize(obj: Any) -> tuple[Any, list[str]]:
    """Recursively drop non-finite floats; return the object and the dropped paths."""
    dropped_paths: list[str] = []

    def keep(item: Any, path: str) -> bool:
        if isinstance(item, float) and not math.isfinite(item):
            dropped_paths.append(path)
            return False
        return True

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, dict):
            return {
                key: walk(item, child)
                for key, item in value.items()
                if keep(item, child := f"{path}.{key}" if path else key)
            }
        if isinstance(value, list):
            return [
                walk(item, child)
                for index, item in enumerate(value)
                if keep(item, child := f"{path}[{index}]")
            ]
        return value

    return walk(obj, ""), dropped_paths
