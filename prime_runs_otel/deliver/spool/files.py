"""The store's files on a shared machine: whose they are, and who else may
write them.

The spool (``spool.sqlite3``) and its companions (SQLite's ``-wal`` and
``-shm``, the disk reserve ``-reserve``) hold prompts and completions, and
what is in them is delivered to the platform under the user's API key. In a
folder other users can write (a shared ``/tmp``, a group folder), any of
them could leave a file there first: a spool of their own, readable and
writable by all, that would then receive this user's episodes, or a symbolic
link that turns the store's ``chmod`` onto a file of the user's elsewhere.

So a store file is used only when it is a regular file (not a link, not a
device), owned by the user who runs the process, and writable by nobody
else unless its folder is private (mode 700: nobody else could have reached
it, and its mode is only tightened). Anything else is refused, with whose
file it is and what to do. Modes are tightened on the file found at the
name (a descriptor opened with ``O_NOFOLLOW``), never by a name looked up
again, so a link planted between the check and the change cannot redirect it.

The same process creates the spool file private (mode 600) before SQLite
opens it, and says so when an existing one looks cut to nothing on disk.

These checks are for a process that writes the store; what remains open is
the moment between them and SQLite opening the file, and the ones done again
once SQLite has made its companions close most of it.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
import time
from contextlib import suppress
from pathlib import Path

from ..._text import shown

logger = logging.getLogger(__name__)

#: The spool file's companions, by suffix ("" is the spool itself).
STORE_SUFFIXES = ("", "-wal", "-shm", "-reserve")
#: Linux's descriptor of a file that is not opened for reading or writing
#: (see ``_tighten``); ``None`` where the system has none.
_O_PATH: int | None = getattr(os, "O_PATH", None)


def reserve_path(path: Path) -> Path:
    """The disk reserve's file beside the spool ``path`` (see ``size.py``)."""
    return Path(f"{path}-reserve")


def release_reserve(path: Path) -> bool:
    """Give the disk reserve's room beside the spool ``path`` to the
    spool's writes (the disk is full); ``False`` when there was none to
    give. Said once in the log, with what to do."""
    reserve = reserve_path(path)
    try:
        size = reserve.stat().st_size
        reserve.unlink()
    except OSError:
        return False
    logger.warning(
        "The disk holding the spool %s is full: released the spool's %d-byte reserve so "
        "that delivery can go on and free room. New episodes are refused (and counted on "
        "their runs) until the disk has room again: free space on it, or move "
        "PRIME_RUNS_OTEL_DIR to a larger disk.",
        shown(str(path)),
        size,
    )
    return True


def store_files(path: Path) -> list[Path]:
    """The spool file and its companions."""
    return [Path(f"{path}{suffix}") for suffix in STORE_SUFFIXES]


def folder_is_private(folder: Path) -> bool:
    """Whether only this user can reach into ``folder``: theirs, mode 700."""
    try:
        status = folder.stat()
    except OSError:
        return False
    return status.st_uid == os.geteuid() and not status.st_mode & 0o077


def store_problem(path: Path) -> str | None:
    """Why the spool at ``path`` (or one of its companions) must not be
    used by this process, as a sentence that says what to do; ``None``
    when every one that exists is safe to use."""
    private = folder_is_private(path.parent)
    for member in store_files(path):
        problem = file_problem(member, private_folder=private)
        if problem is not None:
            return problem
    return None


def file_problem(member: Path, *, private_folder: bool) -> str | None:
    """Why the store file ``member`` must not be used; ``None`` when it is
    missing (it is created private) or safe."""
    try:
        status = member.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"the store file {str(member)!r} cannot be checked ({exc.strerror or exc})"
    elsewhere = (
        "Point PRIME_RUNS_OTEL_DIR at a folder of your own (the default, ~/.prime/runs-otel, "
        "is private)"
    )
    if stat.S_ISLNK(status.st_mode):
        target = _link_target(member)
        return (
            f"the store file {str(member)!r} is a symbolic link (to {target!r}), which "
            "prime-runs-otel never follows: whoever can write its folder could point the "
            f"store's writes at another file. Remove the link (rm {member}) if you made it by "
            f"mistake. {elsewhere}"
        )
    if not stat.S_ISREG(status.st_mode):
        return f"the store file {str(member)!r} is not a regular file: move it away. {elsewhere}"
    me = os.geteuid()
    if status.st_uid != me:
        owner = owner_name(status.st_uid)
        return (
            f"the store file {str(member)!r} belongs to {owner} (uid {status.st_uid}), not to "
            f"you (uid {me}): whoever owns it can read and change every episode written into "
            f"it, so prime-runs-otel does not use it. {elsewhere}, or ask {owner} to remove "
            "it if it is a store of theirs left in a shared folder"
        )
    if status.st_mode & 0o022 and not private_folder:
        return (
            f"the store file {str(member)!r} can be written by other users (mode "
            f"{oct(status.st_mode & 0o777)}) in a folder they can reach, so its contents may "
            "not be yours: prime-runs-otel does not use it. If you trust what is in it, make "
            f"it private (chmod 600 {member}) and start again; otherwise move it aside. "
            f"{elsewhere}"
        )
    return None


def tighten_modes(path: Path) -> None:
    """Make the spool's files of this user readable by them only (SQLite
    creates its companions with the umask otherwise), on the file itself:
    a link found at any of their names is left alone (and refused by
    :func:`store_problem`), never followed."""
    me = os.geteuid()
    for member in store_files(path):
        with suppress(OSError):
            _tighten(member, me)


def _tighten(member: Path, me: int) -> None:
    """``chmod 600`` of ``member`` when it is a regular file of ``me`` with
    a wider mode, without following a link at its name.

    Through an ``O_PATH`` descriptor (and its ``/proc/self/fd`` name, as
    ``fchmod`` refuses such a descriptor): opening the spool's files for
    reading instead, and closing them, would drop every POSIX lock SQLite
    holds on them in this process (closing any descriptor of a file does),
    letting another process checkpoint under a reader's feet."""
    if _O_PATH is None:  # no O_PATH (not Linux): checked by name, then changed
        status = member.lstat()
        if stat.S_ISREG(status.st_mode) and status.st_uid == me and status.st_mode & 0o077:
            os.chmod(member, 0o600)
        return
    fd = os.open(member, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        status = os.fstat(fd)
        if stat.S_ISREG(status.st_mode) and status.st_uid == me and status.st_mode & 0o077:
            os.chmod(f"/proc/self/fd/{fd}", 0o600)
    finally:
        os.close(fd)


def owner_name(uid: int) -> str:
    """The user name of ``uid``, or the number where it has none."""
    with suppress(KeyError):
        return pwd.getpwuid(uid).pw_name
    return f"user {uid}"


def _link_target(member: Path) -> str:
    try:
        return os.readlink(member)
    except OSError:
        return "?"


def warn_if_shared(folder: Path) -> None:
    """Say so when other users of this machine can read the spool's folder:
    the records in it hold prompts and completions."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return
    if mode & 0o077:
        logger.warning(
            "The local store %s can be read by other users of this machine (mode %s), and "
            "the episodes in it hold prompts and completions. Make it private: chmod 700 %s",
            folder,
            oct(mode & 0o777),
            folder,
        )


def create_private(path: Path) -> None:
    """Create the spool file readable by its owner only (SQLite creates it,
    and its WAL and shared-memory files after it, with the process umask
    otherwise, 0644 on most machines); tighten an existing one of ours.
    ``OSError`` when it cannot be created (the caller says what to do)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        pass
    else:
        os.close(fd)
        return
    try:
        status = path.stat()
    except OSError:
        return
    if _truncated(path, status):
        logger.warning(
            "The spool %s is empty (0 bytes); starting a new one in it. If it held runs, it "
            "was truncated on disk and they are gone: restore it from a backup to get them "
            "back",
            path,
        )
    tighten_modes(path)


#: An empty spool file younger than this is another process creating it.
_CREATING_SECONDS = 30.0


def _truncated(path: Path, status: os.stat_result) -> bool:
    """Whether an existing spool file looks cut to nothing on disk: empty,
    with nothing in its write-ahead log either, and not just created by
    another process starting at the same moment (which has not written its
    first page yet, or holds it in the log)."""
    if status.st_size:
        return False
    try:
        if os.path.getsize(f"{path}-wal"):
            return False
    except OSError:
        pass
    return time.time() - status.st_mtime > _CREATING_SECONDS


def disk_free(folder: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``folder``'s disk."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
