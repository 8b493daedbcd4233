"""Prime Traces uploads: one content-addressed request at a time.

The bytes and their idempotency key are built (and persisted) by the
uploader before the first attempt, so a replay after a crash or a lost
answer sends exactly the same request and the service answers with the
receipt it already committed instead of storing the episodes twice.

The request is the one prime-traces' client sends (multipart ``metadata`` +
gzip'd ``traces.jsonl``, ``Idempotency-Key`` over the uncompressed bytes,
``X-Prime-Line-Format: episode``), built here for one reason: the gzip
level. prime-traces compresses at level 9, which costs about three times
the CPU of level 3 for a third less size on episode lines; compression is
transport-only (the key is over the uncompressed bytes), so the level is
ours to choose. Error mapping stays prime-traces' own.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any

import httpx
from prime_traces import LineFormat

from .http import (
    UPLOAD_TIMEOUT,
    PlatformError,
    classify_response,
    classify_transport_error,
    tls_context,
    user_agent,
)
from .watch import WATCH

SERVICE_NOT_ENABLED = "service_not_enabled"
GZIP_LEVEL = 3
SCHEMA_VERSION = 1


def compress_lines(lines: bytes) -> bytes:
    """The upload's ``traces.jsonl`` part as it is sent and stored: gzip, no timestamp."""
    return gzip.compress(lines, compresslevel=GZIP_LEVEL, mtime=0)


def upload_key(lines: bytes) -> str:
    """The idempotency key of an upload: the digest of its uncompressed lines."""
    return f"sha256:{hashlib.sha256(lines).hexdigest()}"


class TracesAPI:
    def __init__(self, *, api_key: str, traces_url: str, team_id: str | None) -> None:
        headers = {"Authorization": f"Bearer {api_key}", "User-Agent": user_agent()}
        if team_id:
            headers["X-Prime-Team-ID"] = team_id
        self._url = f"{traces_url.rstrip('/')}/api/v1/traces"
        self._client = httpx.Client(headers=headers, timeout=UPLOAD_TIMEOUT, verify=tls_context())

    def upload_episodes(
        self, compressed: bytes, key: str, context: dict[str, str]
    ) -> dict[str, Any]:
        """Send one upload of episode lines (``compressed`` by :func:`compress_lines`,
        ``key`` from :func:`upload_key` over the lines); the receipt, or
        :class:`PlatformError`.

        Every failure of an upload is safe to replay (content addressing), so
        transport errors and 5xx are all *retryable*; a 403 is not, and its
        code tells a disabled account (``service_not_enabled``) from a
        credential without the traces scope.
        """
        metadata: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        if context:
            metadata["context"] = context
        metadata_part: tuple[str | None, bytes, str] = (
            None,
            json.dumps(metadata).encode(),
            "application/json",
        )
        traces_part: tuple[str, bytes, str, dict[str, str]] = (
            "traces.jsonl",
            compressed,
            "application/x-ndjson",
            {"Content-Encoding": "gzip"},
        )
        headers = {"Idempotency-Key": key, "X-Prime-Line-Format": LineFormat.EPISODE.value}
        try:
            with WATCH.waiting("Prime Traces upload"):
                response = self._client.post(
                    self._url,
                    headers=headers,
                    files={"metadata": metadata_part, "traces": traces_part},
                )
        except httpx.RequestError as exc:
            raise classify_transport_error(exc, "Prime Traces upload") from exc
        WATCH.answered()
        failure = classify_response(response, "Prime Traces upload")
        if failure is not None:
            raise failure
        try:
            receipt = response.json()
        except ValueError:
            raise PlatformError(
                f"Prime Traces answered {response.status_code} without a JSON receipt",
                status=response.status_code,
                retryable=True,
            ) from None
        if not isinstance(receipt, dict):
            raise PlatformError("Prime Traces answered a receipt that is not an object")
        return receipt

    def close(self) -> None:
        self._client.close()
