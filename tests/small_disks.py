"""Small file systems of their own for the tests of a small or full disk:
a tmpfs mounted for the test, grown while it is in use, and always
unmounted afterwards.

Mounting needs root (the CI runs the suite as root). Elsewhere these tests
fail with a message that says so rather than being skipped: a skip would
report the small-disk cases as holding when nobody ran them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(folder: Path, size: str, *, mode: str = "0700") -> Iterator[Path]:
    """``folder`` as a tmpfs of ``size`` (``4m``), unmounted on the way out."""
    if os.geteuid() != 0:
        pytest.fail(
            "this test mounts a small tmpfs and needs root: run it as root (the CI does), "
            "e.g. in a container"
        )
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.fail(f"could not mount a {size} tmpfs on {folder}: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def grow(folder: Path, size: str) -> None:
    """Give the tmpfs at ``folder`` a new size while files in it stay open."""
    subprocess.run(
        ["mount", "-o", f"remount,size={size}", str(folder)], check=True, capture_output=True
    )


def used_bytes(folder: Path) -> int:
    stat = os.statvfs(folder)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def total_bytes(folder: Path) -> int:
    stat = os.statvfs(folder)
    return stat.f_blocks * stat.f_frsize
