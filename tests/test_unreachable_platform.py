"""A platform that never answers: said within seconds, recorded on the run,
and the end of the run waits a short, stated time instead of the whole
finish timeout.

The platform is a real loopback socket that takes connections and never
answers (as a black-holed address or a hung proxy does): every request to
it waits for its read timeout.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest

import prime_runs_otel as pro
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes


@pytest.fixture
def black_hole(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A platform address whose connections are taken and never answered."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)  # the kernel completes the handshakes; nobody reads
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        for name in ("PRIME_API_BASE_URL", "PRIME_TRACES_URL", "PRIME_FRONTEND_URL"):
            monkeypatch.setenv(name, url)
        monkeypatch.setenv("PRIME_API_KEY", "pit_black_hole")
        yield url


def _wait_for_log(caplog: pytest.LogCaptureFixture, text: str, timeout: float) -> float:
    started = time.monotonic()
    while text not in caplog.text:
        if time.monotonic() - started > timeout:
            raise AssertionError(f"nothing said about {text!r} in {timeout:.0f}s:\n{caplog.text}")
        time.sleep(0.1)
    return time.monotonic() - started


def test_a_platform_that_never_answers_is_said_at_once_recorded_and_waited_for_briefly(
    black_hole: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert resolve_settings().finish_timeout >= 300, "the default finish timeout applies"
    run = pro.start_run(name="unanswered", environments=["gsm8k"])
    for record in synthetic_episodes(5, seed=1):
        run.record_episode(record)

    said = _wait_for_log(caplog, "cannot be reached", timeout=60)
    assert f"prime-runs-otel push {run.id}" in caplog.text, "where the episodes are, and how on"
    started = time.monotonic()
    result = run.finish()
    waited = time.monotonic() - started
    print(f"said after {said:.1f}s; finish() returned after {waited:.1f}s")

    said_where = [
        record
        for record in caplog.records
        if record.name.endswith("uploader") and "cannot be reached" in record.getMessage()
    ]
    assert len(said_where) == 1, "said once"
    assert "Waiting 10s more for it, not the 300s finish timeout" in caplog.text
    assert waited < 60, "the end of the run does not wait the whole finish timeout"
    assert not result.closed and result.pending == 5
    assert result.error is not None, "the error is recorded on the run"
    assert black_hole in result.error or "timed out" in result.error, result.error
    assert "kept locally" in result.describe() and "push" in result.describe()
    spool = Spool(resolve_settings().spool_path, max_bytes=1024**3)
    row = spool.reading.run(run.id)
    assert row is not None and row.last_error is not None
    assert row.episodes == 5, "every episode is kept for push"
