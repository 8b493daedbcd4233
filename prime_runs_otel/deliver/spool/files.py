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
file it is and what to do. Modes are tightened on the open file
(``os.fchmod`` on a descriptor opened with ``O_NOFOLLOW``), never by name,
so a link planted between the check and the change cannot redirect it.

These checks are for a process that writes the store; what remains open is
the moment between them and SQLite opening the file, and the ones done again
once SQLite has made its companions close most of it.
"""

from __future__ import annotations

import os
import pwd
import stat
from contextlib import suppress
from pathlib import Path

#: The spool file's companions, by suffix ("" is the spool itself).
STORE_SUFFIXES = ("", "-wal", "-shm", "-reserve")
#: Opening a store file by descriptor: never through a link, never blocking
#: on a FIFO planted in its place, and never handed to a child process.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
    creates its companions with the umask otherwise), on the open file:
    a link found at any of their names is left alone (and refused by
    :func:`store_problem`), never followed."""
    me = os.geteuid()
    for member in store_files(path):
        try:
            fd = os.open(member, _OPEN_FLAGS)
        except OSError:
            continue  # missing, or a link (ELOOP): nothing of ours to change
        try:
            status = os.fstat(fd)
            if stat.S_ISREG(status.st_mode) and status.st_uid == me and status.st_mode & 0o077:
                os.fchmod(fd, 0o600)
        except OSError:
            pass
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
