"""What a fixed set of episodes puts on the wire, pinned byte for byte.

The episodes go the whole way in process (``start_run`` → episode span →
BatchSpanProcessor → exporter → spool → uploader → the fake platform on
loopback), and what arrives is compared with what prime-runs and
prime-traces make of the same records: every Prime Traces upload must be
exactly the JSONL their encoder writes (the platform checks each upload's
bytes against its ``Idempotency-Key``, the SHA-256 of those bytes, so the
keys received pin the bytes), and the legacy rows and the run's summary
must be the ones prime-runs computes. Any change to how a record is encoded,
read back, digested or turned into a line shows up here first.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest
from prime_runs.metrics import from_episodes
from prime_runs.projection import _nullify_non_finite, build_samples
from prime_runs.run import _clean_metrics
from prime_runs.sinks.base import stamp_run as oracle_stamp_run
from prime_traces.traces import _encode_record

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episode, synthetic_episodes
from prime_runs_otel.testing import FakePlatform

Record = dict[str, Any]


def _fixed_episodes() -> list[Record]:
    """Honest episodes of several shapes (with and without a judge, errors,
    long ones), and the odd values a reader must keep as they are: a NaN
    metric, an infinite reward score, text outside ASCII, a float that
    only ``repr`` writes exactly, and a large integer."""
    records = list(synthetic_episodes(30, seed=38))
    records += [synthetic_episode(number, seed=39, judge=False) for number in range(6)]
    records += list(synthetic_episodes(4, seed=40, target_bytes=40_000))
    odd = list(synthetic_episodes(5, seed=41))
    odd[0]["id"], odd[0]["traces"][0]["metrics"] = "nan-metric", {"loss": math.nan}
    odd[1]["id"] = "inf-score"
    odd[1]["traces"][0]["rewards"] = {"correct": {"score": math.inf, "weight": 1.0}}
    odd[2]["id"] = "unicode"
    message = odd[2]["traces"][0]["nodes"][0]["message"]
    message["content"] = 'naïve — 数学 ✓ \u2028 "quoted" \\ ' + str(message["content"])
    odd[3]["id"] = "floats"
    odd[3]["traces"][0]["metrics"] = {"third": 1 / 3, "tiny": 5e-324, "neg": -0.0, "big": 1e300}
    odd[4]["id"] = "big-int"
    odd[4]["traces"][0]["task"]["data"]["big"] = 2**62 + 1
    return records + odd


def _run(records: list[Record]) -> pro.RunResult:
    run = pro.start_run(
        name="wire", model="demo/model", environments=["gsm8k-demo"], framework="verifiers"
    )
    for record in records:
        run.record_episode(record)
    return run.finish(timeout=60)


def _oracle_line(record: Record, platform_id: str) -> bytes:
    """One Prime Traces line as prime-runs' traces sink writes it."""
    return _encode_record(_nullify_non_finite(oracle_stamp_run(record, platform_id, "eval")), 1)


def test_prime_traces_uploads_are_the_oracle_s_bytes(
    online: FakePlatform, wire_episode: Any
) -> None:
    records = _fixed_episodes()
    result = _run(records)
    assert result.closed and (result.pending, result.corrupt) == (0, 0)
    platform_id = result.platform_id or ""
    by_id = {record["id"]: record for record in records}

    uploads = [upload for upload in online.uploads if platform_id in upload.run_ids]
    assert sorted(i for upload in uploads for i in upload.record_ids) == sorted(by_id)
    expected = {
        "sha256:"
        + hashlib.sha256(
            b"".join(_oracle_line(by_id[i], platform_id) for i in upload.record_ids)
        ).hexdigest()
        for upload in uploads
    }
    received = {
        request.headers["idempotency-key"]
        for request in online.requests()
        if request.path == "/api/v1/traces" and request.status < 300 and request.fault is None
    }
    assert received == expected

    episodes = [wire_episode.model_validate(record) for record in records]
    summary = _clean_metrics(from_episodes(episodes))
    summary["prime_runs"] = {"traces_episodes_written": len(records)}
    assert online.run(platform_id).metrics == summary


def test_legacy_rows_are_the_oracle_s_rows(
    online: FakePlatform, monkeypatch: pytest.MonkeyPatch, wire_episode: Any
) -> None:
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "true")
    records = _fixed_episodes()
    result = _run(records)
    assert result.closed and (result.pending, result.corrupt) == (0, 0)

    rows = online.samples(result.platform_id or "")
    oracle = build_samples([wire_episode.model_validate(record) for record in records])
    # Compared as the exact JSON text of each row, so a float written
    # differently or a key in another order shows.
    assert [_text(row) for row in rows] == [_text(row) for row in json.loads(json.dumps(oracle))]


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
