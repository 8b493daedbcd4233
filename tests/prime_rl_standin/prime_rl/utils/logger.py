"""prime-rl's ``get_logger``: one process-wide logger (loguru there, logging here)."""

import logging

_LOGGER = logging.getLogger("prime_rl")


def get_logger() -> logging.Logger:
    return _LOGGER
