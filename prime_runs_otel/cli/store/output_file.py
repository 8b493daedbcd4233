"""``export -o FILE``: the exported episodes written as privately as the
store keeps them.

What ``export`` writes holds the prompts and completions the store keeps
readable by its owner only, so the file gets the same mode (0600), whatever
the umask. It is written to a new file beside it (created with ``O_EXCL``,
so nothing planted under that name is reused) and renamed over ``FILE`` at
the end, so an export that fails leaves the old file as it was and never a
half-written one.

A symbolic link at ``FILE`` is refused: in a folder other users can write,
one of them could have put it there to have the export written into a file
of the user's own choosing or a place they can read. ``--force`` writes
through it, to the file it names. A link to something that is not a
regular file (``-o /dev/stdout``, a named pipe) is written to as it is:
there is no file to keep private, and nothing to rename.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TextIO

from ..exits import UsageError


@contextmanager
def private_output(path: str, *, force: bool = False) -> Iterator[TextIO]:
    """``path`` for writing, private (0600), replaced whole at the end."""
    target = _target(path, force)
    if target is None:  # a device or a pipe: written as it is
        with _open_stream(path) as stream:
            yield stream
        return
    folder = os.path.dirname(target) or "."
    try:
        fd, temporary = tempfile.mkstemp(
            prefix=f".{os.path.basename(target)}.", suffix=".part", dir=folder
        )
    except FileNotFoundError:
        raise UsageError(
            f"cannot write {path!r}: the folder {folder!r} does not exist; create it first "
            "(mkdir -p), or pass another -o FILE"
        ) from None
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        os.fchmod(fd, 0o600)  # mkstemp's mode already; said here for the reader
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            yield stream
        _replace(temporary, target)
    except BaseException:
        with suppress(OSError):
            os.unlink(temporary)
        raise


def _replace(temporary: str, target: str) -> None:
    try:
        os.replace(temporary, target)
    except OSError as exc:
        raise UsageError(
            f"cannot replace {target!r} ({exc.strerror or exc}): it may belong to another user "
            "in a shared folder; pass another -o FILE"
        ) from None


def _target(path: str, force: bool) -> str | None:
    """The regular file to replace for ``path`` (through a link only with
    ``force``), or ``None`` when ``path`` leads to a device or a pipe."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    if stat.S_ISLNK(status.st_mode):
        try:
            pointed = os.stat(path)
        except OSError:
            pointed = None
        if pointed is not None and not stat.S_ISREG(pointed.st_mode):
            return None
        if not force:
            raise UsageError(
                f"{path!r} is a symbolic link (to {os.readlink(path)!r}); export does not write "
                "through a link unless asked, since whoever can write its folder may have put it "
                "there. Remove it (rm "
                f"{path}), pass another -o FILE, or add --force to write to the file it names"
            )
        return os.path.realpath(path)
    if stat.S_ISREG(status.st_mode):
        return path
    if stat.S_ISDIR(status.st_mode):
        raise UsageError(f"{path!r} is a folder; pass a file name, e.g. -o {path}/export.jsonl")
    return None


def _open_stream(path: str) -> TextIO:
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise _cannot_write(path, exc) from None


def _cannot_write(path: str, exc: OSError) -> UsageError:
    return UsageError(f"cannot write {path!r} ({exc.strerror or exc}); pass another -o FILE")
