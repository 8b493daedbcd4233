"""The store's files on a shared machine, and what ``export -o`` writes.

Real folders with real links and real files of other users: the suite runs
as root (as the CI does), gives files away with ``os.chown``, and runs the
victim as an unprivileged user where the check depends on who runs it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import prime_runs_otel as pro
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.deliver.spool.core import SpoolError
from prime_runs_otel.produce.synthetic import synthetic_episodes

#: Another user of the machine (``nobody``), who left files in a shared folder.
OTHER_UID = 65534
#: The user whose episodes are at stake: no root powers, no name.
VICTIM_UID = 4242
CAP = 1024**3
PACKAGE_ROOT = Path(pro.__file__).resolve().parent.parent


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail(
            "this test gives files to other users and runs a process as another user: run it "
            "as root (the CI does)"
        )


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may write (mode 777), outside root's private
    temporary folders so that an unprivileged process can reach it."""
    _need_root()
    folder = Path(tempfile.mkdtemp(prefix="prime-runs-otel-shared-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _interpreter_for(uid: int) -> str:
    """A Python of this version that ``uid`` may run (the test's own may sit
    in root's home), found by trying."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, shutil.which(version), f"/usr/bin/{version}"):
        if candidate is None:
            continue
        try:
            probe = subprocess.run(
                [candidate, "-c", "pass"],
                user=uid,
                group=uid,
                extra_groups=[],
                check=False,
                capture_output=True,
                cwd="/",
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.fail(f"no {version} that uid {uid} may run: install one outside root's home")


def _run_as(uid: int, code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh Python as ``uid``, with this checkout importable."""
    path = os.pathsep.join([str(PACKAGE_ROOT), sysconfig.get_paths()["purelib"]])
    return subprocess.run(
        [_interpreter_for(uid), "-c", textwrap.dedent(code)],
        user=uid,
        group=uid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path, **env},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _given_away(spool_path: Path, mode: int) -> None:
    """The spool and its companions, made here, given to the other user."""
    Spool(spool_path, max_bytes=CAP).close()
    for member in spool_path.parent.iterdir():
        os.chown(member, OTHER_UID, OTHER_UID)
        member.chmod(mode)


# -- files of other users ----------------------------------------------------------------


def test_a_spool_another_user_owns_in_a_shared_folder_is_refused_and_left_untouched(
    shared: Path,
) -> None:
    store = shared / "store"
    store.mkdir(mode=0o777)
    store.chmod(0o777)
    spool_path = store / "spool.sqlite3"
    _given_away(spool_path, 0o666)
    before = _digest(spool_path)
    home = shared / "victim-home"
    home.mkdir()
    os.chown(home, VICTIM_UID, VICTIM_UID)

    done = _run_as(
        VICTIM_UID,
        """
        import prime_runs_otel as pro
        from prime_runs_otel.produce.synthetic import synthetic_episodes
        run = pro.start_run(name="mine", environments=["gsm8k"], mode="local")
        for record in synthetic_episodes(3, seed=1):
            run.record_episode(record)
        print(run.finish().describe())
        """,
        {"HOME": str(home), "PRIME_RUNS_OTEL_DIR": str(store)},
    )

    assert done.returncode != 0, done.stdout + done.stderr
    assert "belongs to nobody (uid 65534)" in done.stderr, done.stderr
    assert "PRIME_RUNS_OTEL_DIR" in done.stderr
    assert _digest(spool_path) == before, "another user's spool was written"


def test_a_store_file_others_can_write_is_refused_in_a_shared_folder(shared: Path) -> None:
    spool_path = shared / "spool.sqlite3"
    Spool(spool_path, max_bytes=CAP).close()
    spool_path.chmod(0o666)

    with pytest.raises(SpoolError) as refused:
        Spool(spool_path, max_bytes=CAP)
    assert "can be written by other users" in str(refused.value)
    assert f"chmod 600 {spool_path}" in str(refused.value)


def test_a_store_file_of_ours_in_a_private_folder_is_tightened_not_refused(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    spool_path = folder / "spool.sqlite3"
    Spool(spool_path, max_bytes=CAP).close()
    spool_path.chmod(0o666)

    Spool(spool_path, max_bytes=CAP).close()
    assert stat.S_IMODE(spool_path.stat().st_mode) == 0o600


def test_a_link_planted_at_the_shared_memory_name_is_refused_and_not_followed(
    shared: Path, tmp_path: Path
) -> None:
    shared.chmod(0o1777)  # sticky: nobody removes another's files
    spool_path = shared / "spool.sqlite3"
    Spool(spool_path, max_bytes=CAP).close()
    spool_path.chmod(0o644)  # a store of an older release, readable by all
    for suffix in ("-wal", "-shm"):
        Path(f"{spool_path}{suffix}").unlink(missing_ok=True)
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's own\n")
    precious.chmod(0o644)
    link = Path(f"{spool_path}-shm")
    link.symlink_to(precious)
    os.lchown(link, OTHER_UID, OTHER_UID)  # planted by the other user

    with pytest.raises(SpoolError) as refused:
        Spool(spool_path, max_bytes=CAP)
    assert "symbolic link" in str(refused.value) and str(precious) in str(refused.value)
    assert stat.S_IMODE(precious.stat().st_mode) == 0o644, "the link was followed"
    assert precious.read_text() == "the user's own\n"


# -- export -o ---------------------------------------------------------------------------


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        preexec_fn=lambda: os.umask(0o022),  # the usual one: files readable by all
        check=False,
    )


@pytest.fixture
def local_run() -> str:
    run = pro.start_run(name="to-export", environments=["gsm8k"], mode="local")
    for record in synthetic_episodes(5, seed=7):
        run.record_episode(record)
    return run.finish().local_id


def test_export_to_a_file_keeps_the_store_private_whatever_the_umask(
    local_run: str, tmp_path: Path
) -> None:
    out = tmp_path / "episodes.jsonl"
    done = _cli("export", local_run, "-o", str(out))

    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert len(out.read_text().splitlines()) >= 5
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_export_refuses_a_link_at_its_file_and_writes_through_it_when_forced(
    local_run: str, tmp_path: Path
) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's own\n")
    out = tmp_path / "episodes.jsonl"
    out.symlink_to(precious)

    refused = _cli("export", local_run, "-o", str(out))
    assert refused.returncode != 0
    assert "symbolic link" in refused.stderr and "--force" in refused.stderr, refused.stderr
    assert precious.read_text() == "the user's own\n"

    forced = _cli("export", local_run, "-o", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert out.is_symlink(), "the link itself stays"
    assert len(precious.read_text().splitlines()) >= 5
    assert stat.S_IMODE(precious.stat().st_mode) == 0o600


def test_export_to_dev_stdout_writes_to_the_pipe(local_run: str) -> None:
    done = _cli("export", local_run, "-o", "/dev/stdout")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) >= 5
