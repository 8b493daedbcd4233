"""The Prime Traces endpoint: ``POST /api/v1/traces``, content-addressed and
all or nothing.

An upload is validated in full (``_traces_upload.py``) before anything of it
is stored, and one whose bytes were committed before is answered from that
receipt instead of stored again: the two properties the client's
exactly-once delivery rests on, so the fake keeps both. Each episode line is
filed under the run id read from the line itself, as the service does.
"""

from __future__ import annotations

import re
import time
from typing import Protocol

from prime_traces.models import ErrorCode

from ._http import MIB, Request, Response, Route, coded, detail, json_response, route
from ._store import FakeUpload, Store
from ._traces_upload import Document, Limits, Upload, decode_upload, parse_documents

#: Prime Traces limits, defined over the uncompressed bytes.
MAX_LINE_BYTES = 64 * MIB
MAX_UPLOAD_BYTES = 256 * MIB
MAX_UPLOAD_LINES = 1_000_000


class Platform(Protocol):
    """What the Prime Traces endpoint reads of the platform it is part of."""

    service_not_enabled: bool
    closed_runs_take_episodes: bool
    max_line_bytes: int
    max_upload_bytes: int
    max_upload_lines: int


class PrimeTraces:
    def __init__(self, store: Store, platform: Platform) -> None:
        self._store = store
        self._platform = platform

    def routes(self) -> list[Route]:
        return [route("POST", r"/api/v1/traces", self._upload, "traces")]

    def _upload(self, request: Request, match: re.Match[str]) -> Response:
        """Content-addressed and all-or-nothing: validated in full before
        anything is stored, and the same bytes again replay the receipt."""
        platform = self._platform
        if platform.service_not_enabled:
            raise coded(
                403,
                ErrorCode.SERVICE_NOT_ENABLED,
                "Prime Traces is not enabled for this account",
            )
        limits = Limits(
            platform.max_line_bytes, platform.max_upload_bytes, platform.max_upload_lines
        )
        upload = decode_upload(request, limits)
        with self._store.lock:
            if upload.digest in self._store.uploads:
                return self._replay(upload)
        documents = parse_documents(upload, limits)
        with self._store.lock:
            if upload.digest in self._store.uploads:
                return self._replay(upload)
            if not platform.closed_runs_take_episodes:
                self._refuse_closed_runs(documents)
            self._commit(upload, documents)
        return json_response(201, {"upload_id": upload.digest, "status": "committed"})

    def _refuse_closed_runs(self, documents: list[Document]) -> None:
        """A platform that takes nothing for a run once it is closed: the
        whole upload is refused when one of its lines names such a run."""
        for document in documents:
            run = self._store.runs.get(document.run_id or "")
            if run is not None and run.closed:
                raise detail(409, f"Run {run.id} is {run.status}: it takes no more episodes")

    def _replay(self, upload: Upload) -> Response:
        committed = self._store.uploads[upload.digest]
        if committed.line_format != upload.line_format:
            raise coded(
                409,
                ErrorCode.LINE_FORMAT_CONFLICT,
                f"upload {upload.digest} was committed as {committed.line_format} lines; "
                f"it cannot be replayed as {upload.line_format} lines",
            )
        committed.replays += 1
        return json_response(201, {"upload_id": committed.id, "status": "committed"})

    def _commit(self, upload: Upload, documents: list[Document]) -> None:
        store = self._store
        lines = store.episodes if upload.line_format == "episode" else store.traces
        for document in documents:
            lines.setdefault(document.run_id, {})[document.id] = document.record
            if upload.line_format == "episode":
                key = (document.run_id, document.id)
                store.deliveries[key] = store.deliveries.get(key, 0) + 1
        store.uploads[upload.digest] = FakeUpload(
            id=upload.digest,
            line_format=upload.line_format,
            context=dict(upload.context),
            num_lines=len(documents),
            schema_version=upload.schema_version,
            run_ids=list(dict.fromkeys(document.run_id for document in documents)),
            record_ids=[document.id for document in documents],
            team_id=upload.team_id,
            compressed=upload.compressed,
            size_bytes=len(upload.data),
            received_at=time.time(),
        )
