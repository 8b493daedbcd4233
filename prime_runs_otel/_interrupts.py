"""Imports a Ctrl-C must not cut in half.

Python raises ``KeyboardInterrupt`` wherever the main thread is running
Python code, including in the middle of an extension module's
initialisation when that calls back into Python. Some extensions do not
survive it: orjson's (a Rust module) crashes the whole process with a
segmentation fault when the interrupt lands while it initialises, which a
Ctrl-C in the first second of ``prime-runs-otel export`` did about one time
in ten. Around such an import the interrupt is held back, and raised the
moment the import is done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["interrupts_held"]


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold back SIGINT's handler for the block, then run it once if a
    SIGINT came meanwhile (by default: raise ``KeyboardInterrupt`` then).
    Only the main thread runs signal handlers, so elsewhere, or where the
    handler is not a Python function, nothing is held back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        yield
        return
    came: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        came.append((signum, frame))

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if came:
            handler(*came[0])
