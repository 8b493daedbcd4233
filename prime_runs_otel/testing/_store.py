"""What the fake platform holds: every run, record, upload and request it
was sent, behind one lock.

One store for all the platform's services, because a test asks questions
that cross them (the episodes Prime Traces stored for a run the evaluations
API created) and must get one consistent answer while uploads are still
arriving. The service modules write here; :class:`~.fake_platform.FakePlatform`
reads copies out for tests. The one rule two services share, that a closed
run stays closed, lives here too.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

from ._http import JSONObject, detail
from ._traces_upload import LineFormat

RunStatus = Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED"]
RunKind = Literal["eval", "train"]


@dataclass
class FakeRun:
    """One run as the platform holds it. ``status_updates`` keeps every status
    change that was asked for, with the HTTP status it was answered with, so a
    test can tell a rejected second close from one that never came."""

    id: str
    name: str
    kind: RunKind
    create_payload: JSONObject
    status: RunStatus = "RUNNING"
    metadata: JSONObject = field(default_factory=dict)
    metrics: JSONObject = field(default_factory=dict)
    error_message: str | None = None
    environments: list[JSONObject] = field(default_factory=list)
    team_id: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    finalize_calls: int = 0
    #: Each ``/finalize`` body as it came, for callers compared request by request.
    finalize_bodies: list[JSONObject] = field(default_factory=list)
    status_updates: list[JSONObject] = field(default_factory=list)

    @property
    def closed(self) -> bool:
        return self.status != "RUNNING"


@dataclass
class FakeUpload:
    """One committed Prime Traces upload. ``replays`` counts later requests with
    the same bytes that were answered from this receipt instead of stored."""

    id: str
    line_format: LineFormat
    context: dict[str, str]
    num_lines: int
    schema_version: int
    run_ids: list[str | None]
    record_ids: list[str]
    team_id: str | None
    compressed: bool
    size_bytes: int
    received_at: float
    replays: int = 0


@dataclass(frozen=True)
class FakeStepSamples:
    """A confirmed training-step sample object (the bytes the client PUT)."""

    run_id: str
    step: int
    s3_key: str
    data: bytes


@dataclass(frozen=True)
class RecordedRequest:
    """One request as received. ``fault`` names the injected fault that
    answered it (``"fail"``, ``"ambiguous"``), if any."""

    method: str
    path: str
    query: str
    status: int
    headers: dict[str, str]
    received_at: float
    body_bytes: int
    fault: str | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:20]}"


@dataclass
class Store:
    """The platform's state. Hold :attr:`lock` to read or write any of it."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    #: Eval and training runs, by id.
    runs: dict[str, FakeRun] = field(default_factory=dict)
    #: Legacy v0 sample rows, by eval run id.
    samples: dict[str, list[JSONObject]] = field(default_factory=dict)
    #: One metrics row per step, by training run id.
    training_metrics: dict[str, list[JSONObject]] = field(default_factory=dict)
    #: Every metrics row as it was posted, by training run id, in arrival order.
    metrics_posts: dict[str, list[JSONObject]] = field(default_factory=dict)
    #: Confirmed step sample objects, by training run id.
    step_samples: dict[str, list[FakeStepSamples]] = field(default_factory=dict)
    #: Environments resolved by name, by (team id, name).
    named_environments: dict[tuple[str | None, str], str] = field(default_factory=dict)
    #: Environments published on the hub, by ``owner/name``.
    published_environments: dict[str, str] = field(default_factory=dict)
    #: Every environment's name, by id.
    environment_names: dict[str, str] = field(default_factory=dict)
    #: Committed Prime Traces uploads, by digest, in commit order.
    uploads: dict[str, FakeUpload] = field(default_factory=dict)
    #: Episode lines, by run id (read from the line) and episode id.
    episodes: dict[str | None, dict[str, JSONObject]] = field(default_factory=dict)
    #: Bare trace lines, by run id and trace id.
    traces: dict[str | None, dict[str, JSONObject]] = field(default_factory=dict)
    #: How many committed uploads carried each (run id, episode id).
    deliveries: dict[tuple[str | None, str], int] = field(default_factory=dict)
    #: Presigned object keys: (signature, run id, step).
    presigned: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    #: The storage bucket behind presigned URLs, by key.
    objects: dict[str, bytes] = field(default_factory=dict)
    #: Every request, in arrival order.
    requests: list[RecordedRequest] = field(default_factory=list)

    def close_run(self, run: FakeRun, status: RunStatus, error_message: str | None) -> None:
        """The status guard: a closed run stays closed."""
        update: JSONObject = {"status": status, "error_message": error_message}
        run.status_updates.append(update)
        if run.closed:
            update["answered"] = 409
            raise detail(409, f"Run {run.id} is already {run.status}")
        update["answered"] = 200
        run.status = status
        run.error_message = error_message
