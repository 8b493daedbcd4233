"""Decoding and validating one Prime Traces upload, as the service does.

Pure functions over a :class:`~._http.Request`: every rejection is raised as the
service's coded 400 before anything is stored, which is what makes an upload
all-or-nothing on the fake platform.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass
from typing import Literal

from prime_traces.models import ErrorCode

from ._http import JSONObject, Reject, Request, coded, strict_json
from .multipart import MultipartError, Part, parse_form

LineFormat = Literal["episode", "trace"]
IDEMPOTENCY_KEY = re.compile(r"^sha256:([0-9a-f]{64})$")


@dataclass(frozen=True)
class Limits:
    """The service's ceilings, over uncompressed bytes; adjustable per platform
    so a test can reach them without moving hundreds of MiB."""

    line_bytes: int
    upload_bytes: int
    upload_lines: int


@dataclass(frozen=True)
class Upload:
    """A decoded upload whose digest matched its idempotency key."""

    digest: str
    line_format: LineFormat
    context: dict[str, str]
    schema_version: int
    data: bytes
    compressed: bool
    team_id: str | None


@dataclass(frozen=True)
class Document:
    """One stored line: an episode or a bare trace, and the run it belongs to."""

    id: str
    run_id: str | None
    record: JSONObject
    trace_ids: tuple[str, ...]


def decode_upload(request: Request, limits: Limits) -> Upload:
    """Everything that decides the upload's identity, checked first: a replay
    is only a replay once its bytes are proven to be the ones the key names."""
    digest = _idempotency_digest(request.header("Idempotency-Key"))
    line_format = _line_format(request.header("X-Prime-Line-Format"))
    try:
        parts = {part.name: part for part in _unique_parts(request)}
    except MultipartError as exc:
        raise coded(400, ErrorCode.MALFORMED_ENCODING, str(exc)) from exc
    schema_version, context = _metadata(parts.get("metadata"))
    traces = parts.get("traces")
    if traces is None:
        raise coded(400, ErrorCode.INVALID_TRACE, "the upload has no `traces` part")
    data = _traces_bytes(traces, limits)
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise coded(
            400,
            ErrorCode.DIGEST_MISMATCH,
            f"Idempotency-Key is sha256:{digest} but the uncompressed traces are sha256:{actual}; "
            "the key must be the digest of the exact JSONL bytes before gzip",
        )
    return Upload(
        digest=digest,
        line_format=line_format,
        context=context,
        schema_version=schema_version,
        data=data,
        compressed=(traces.content_encoding or "").lower() == "gzip",
        team_id=request.header("X-Prime-Team-ID"),
    )


def _unique_parts(request: Request) -> list[Part]:
    parts = parse_form(request.header("Content-Type"), request.body)
    names = [part.name for part in parts]
    for name in ("metadata", "traces"):
        if names.count(name) > 1:
            code = ErrorCode.INVALID_METADATA if name == "metadata" else ErrorCode.INVALID_TRACE
            raise coded(400, code, f"the upload has {names.count(name)} `{name}` parts; send one")
    return parts


def _idempotency_digest(key: str | None) -> str:
    match = IDEMPOTENCY_KEY.match(key or "")
    if match is None:
        raise coded(
            400,
            ErrorCode.INVALID_IDEMPOTENCY_KEY,
            f"Idempotency-Key must be sha256:<64 lowercase hex> of the uncompressed JSONL, "
            f"got {key!r}",
        )
    return match.group(1)


def _line_format(header: str | None) -> LineFormat:
    if header is None or header == "trace":
        return "trace"
    if header == "episode":
        return "episode"
    raise coded(
        400,
        ErrorCode.LINE_FORMAT_MISMATCH,
        f"X-Prime-Line-Format must be `episode` or absent, got {header!r}",
    )


def _metadata(part: Part | None) -> tuple[int, dict[str, str]]:
    if part is None:
        raise coded(400, ErrorCode.INVALID_METADATA, "the upload has no `metadata` part")
    try:
        metadata = strict_json(part.data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise coded(400, ErrorCode.INVALID_METADATA, f"`metadata` is not JSON: {exc}") from exc
    if not isinstance(metadata, dict):
        raise coded(400, ErrorCode.INVALID_METADATA, "`metadata` must be a JSON object")
    version = metadata.get("schema_version")
    if version != 1:
        raise coded(
            400,
            ErrorCode.UNSUPPORTED_SCHEMA_VERSION,
            f"schema_version {version!r} is not supported; send 1",
        )
    context = metadata.get("context") or {}
    if not isinstance(context, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in context.items()
    ):
        raise coded(400, ErrorCode.INVALID_METADATA, "`context` must map strings to strings")
    return version, context


def _traces_bytes(part: Part, limits: Limits) -> bytes:
    encoding = (part.content_encoding or "identity").lower()
    if encoding == "identity":
        data = part.data
    elif encoding == "gzip":
        data = _gunzip(part.data, limits.upload_bytes)
    else:
        raise coded(
            400, ErrorCode.MALFORMED_ENCODING, f"Content-Encoding {encoding!r} is not supported"
        )
    if len(data) > limits.upload_bytes:
        raise _upload_too_large(limits.upload_bytes)
    return data


def _gunzip(data: bytes, limit: int) -> bytes:
    """Decompressed with a ceiling, so a small bomb cannot inflate past the limit."""
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as exc:
        raise coded(
            400, ErrorCode.MALFORMED_ENCODING, f"the traces part is not gzip: {exc}"
        ) from exc
    if len(out) > limit:
        raise _upload_too_large(limit)
    if not decompressor.eof or decompressor.unused_data:
        raise coded(
            400, ErrorCode.MALFORMED_ENCODING, "the gzip stream is truncated or has trailing data"
        )
    return out


def _upload_too_large(limit: int) -> Reject:
    return coded(
        400,
        ErrorCode.UPLOAD_TOO_LARGE,
        f"the uncompressed upload exceeds {limit} bytes; split it into batches",
    )


def _split_lines(data: bytes, limits: Limits) -> list[bytes]:
    lines = [line for line in data.split(b"\n") if line.strip()]
    if not lines:
        raise coded(400, ErrorCode.INVALID_TRACE, "the upload contains no lines")
    if len(lines) > limits.upload_lines:
        raise coded(
            400,
            ErrorCode.TOO_MANY_TRACES_IN_UPLOAD,
            f"{len(lines)} lines exceed the {limits.upload_lines}-line limit for one upload",
        )
    for number, line in enumerate(lines, start=1):
        if len(line) > limits.line_bytes:
            raise coded(
                400,
                ErrorCode.TRACE_TOO_LARGE,
                f"line {number} is {len(line)} bytes, over the {limits.line_bytes}-byte limit",
            )
    return lines


def parse_documents(upload: Upload, limits: Limits) -> list[Document]:
    """Every line validated before any is stored: an upload commits whole or not at all."""
    documents: list[Document] = []
    for number, line in enumerate(_split_lines(upload.data, limits), start=1):
        record = _json_line(line, number)
        if upload.line_format == "episode":
            documents.append(_episode_document(record, number))
        else:
            documents.append(_trace_document(record, number))
    _reject_duplicates(documents, upload.line_format)
    return documents


def _json_line(line: bytes, number: int) -> JSONObject:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise coded(400, ErrorCode.MALFORMED_ENCODING, f"line {number} is not UTF-8") from exc
    try:
        record = strict_json(text)
    except ValueError as exc:
        raise coded(400, ErrorCode.INVALID_TRACE, f"line {number} is not JSON: {exc}") from exc
    if not isinstance(record, dict):
        raise coded(400, ErrorCode.INVALID_TRACE, f"line {number} is not a JSON object")
    return record


def _record_id(record: JSONObject, what: str, number: int) -> str:
    identifier = record.get("id")
    if not isinstance(identifier, str) or not identifier:
        raise coded(400, ErrorCode.INVALID_TRACE, f"line {number}: {what} has no string `id`")
    return identifier


def _run_id(record: JSONObject) -> str | None:
    run = record.get("run")
    run_id = run.get("id") if isinstance(run, dict) else None
    return run_id if isinstance(run_id, str) else None


def _episode_document(record: JSONObject, number: int) -> Document:
    members = record.get("traces")
    if not isinstance(members, list):
        raise coded(
            400,
            ErrorCode.LINE_FORMAT_MISMATCH,
            f"line {number} has no `traces` list but the upload declares episode lines",
        )
    episode_id = _record_id(record, "the episode", number)
    run_id = _run_id(record)
    trace_ids: list[str] = []
    for member in members:
        if not isinstance(member, dict):
            raise coded(
                400, ErrorCode.INVALID_TRACE, f"line {number}: a member trace is not an object"
            )
        trace_id = _record_id(member, "a member trace", number)
        if _run_id(member) != run_id:
            raise coded(
                400,
                ErrorCode.INVALID_TRACE,
                f"line {number}: member trace {trace_id!r} has run.id {_run_id(member)!r} but its "
                f"episode has {run_id!r}; the run is read from each trace, so stamp it on every "
                "member trace",
            )
        trace_ids.append(trace_id)
    return Document(episode_id, run_id, record, tuple(trace_ids))


def _trace_document(record: JSONObject, number: int) -> Document:
    if isinstance(record.get("traces"), list):
        raise coded(
            400,
            ErrorCode.LINE_FORMAT_MISMATCH,
            f"line {number} is an episode; send episode lines with X-Prime-Line-Format: episode",
        )
    trace_id = _record_id(record, "the trace", number)
    return Document(trace_id, _run_id(record), record, (trace_id,))


def _reject_duplicates(documents: list[Document], line_format: LineFormat) -> None:
    if line_format == "episode":
        _first_duplicate(
            [document.id for document in documents], ErrorCode.DUPLICATE_EPISODE_ID, "episode"
        )
    trace_ids = [trace_id for document in documents for trace_id in document.trace_ids]
    _first_duplicate(trace_ids, ErrorCode.DUPLICATE_TRACE_ID, "trace")


def _first_duplicate(identifiers: list[str], code: ErrorCode, what: str) -> None:
    seen: set[str] = set()
    for identifier in identifiers:
        if identifier in seen:
            raise coded(400, code, f"{what} id {identifier!r} appears twice in one upload")
        seen.add(identifier)
