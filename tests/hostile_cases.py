"""Hostile OTLP requests, described as small JSON-able cases and built into
real request bodies: the seed corpus (``tests/hostile_corpus/``) and the
property-based fuzzer (``test_fuzz_serve.py``) share this builder.

A case is a dict::

    {"transport": "http-protobuf" | "http-json" | "grpc",
     "encoding": "identity" | "gzip" | "gzip-members" | "deflate",
     "members": 1000,                 # gzip-members only: empty members first
     "resource": {key: value},        # the Resource of every span
     "spans": [span, ...],
     "body": "hex"}                   # optional: send these bytes as they are

    span = {"name": str, "trace": int, "span": int, "parent": int | None,
            "attributes": {key: value}, "record": record | None,
            "copies": int}            # that many spans, ids counting up

    record = {"id": str, "depth": int, "bigint": bool, "surrogate": bool}

A value is ``{"s": str}``, ``{"i": int}``, ``{"d": float}``, ``{"b": bool}``,
``{"bytes": hex}``, ``{"a": [value, ...]}`` or ``{"kv": {key: value}}``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from prime_runs_otel import semconv as sc
from prime_runs_otel.produce.synthetic import synthetic_episodes

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

#: Every attribute the package reads, for wrong-typed values.
READ_KEYS = (
    sc.RUN_ID,
    sc.RUN_KIND,
    sc.RUN_NAME,
    sc.RUN_MODEL,
    sc.RUN_ENVIRONMENTS,
    sc.RUN_TAGS,
    sc.RUN_MAX_STEPS,
    sc.RUN_BATCH_SIZE,
    sc.RUN_SEQ_LEN,
    sc.RUN_STATUS,
    sc.RUN_ERROR,
    sc.RUN_EPISODES_RECORDED,
    sc.RUN_STEP,
    sc.RUN_METRICS_TIMESTAMP,
    sc.RUN_METRICS_VALUES,
    sc.RUN_CONFIG,
    sc.EPISODE_ID,
    sc.EPISODE_EXAMPLE_ID,
    sc.EPISODE_ENV,
    sc.EPISODE_OK,
    sc.EPISODE_REWARD,
    sc.EPISODE_STOP_CONDITION,
    sc.EPISODE_RECORD,
    sc.blob_size_key(sc.EPISODE_RECORD),
    sc.blob_sha256_key(sc.EPISODE_RECORD),
    sc.GEN_AI_OPERATION_NAME,
    sc.GEN_AI_AGENT_NAME,
    sc.GEN_AI_REQUEST_MODEL,
    sc.GEN_AI_INPUT_MESSAGES,
    sc.GEN_AI_OUTPUT_MESSAGES,
    sc.GEN_AI_USAGE_INPUT_TOKENS,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS,
    sc.AGENT_REWARD,
    sc.AGENT_TRAINABLE,
    "openinference.span.kind",
    "traceloop.span.kind",
    "llm.request.type",
    "llm.input_messages.0.message.role",
)
SPAN_NAMES = (
    sc.RUN_START_SPAN,
    sc.RUN_END_SPAN,
    sc.RUN_METRICS_SPAN,
    "episode gsm8k",
    "invoke_agent solver",
    "chat gpt",
)


def _any_value(spec: Mapping[str, Any], *, utf8: bool) -> AnyValue:
    value = AnyValue()
    ((kind, raw),) = spec.items()
    if kind == "s":
        value.string_value = _text(raw, utf8)
    elif kind == "i":
        value.int_value = raw
    elif kind == "d":
        value.double_value = raw
    elif kind == "b":
        value.bool_value = raw
    elif kind == "bytes":
        value.bytes_value = bytes.fromhex(raw)
    elif kind == "a":
        value.array_value.values.extend(_any_value(item, utf8=utf8) for item in raw)
    elif kind == "kv":
        value.kvlist_value.values.extend(_pairs(raw, utf8=utf8))
    return value


def _pairs(attributes: Mapping[str, Any], *, utf8: bool) -> list[KeyValue]:
    return [
        KeyValue(key=_text(key, utf8), value=_any_value(value, utf8=utf8))
        for key, value in attributes.items()
    ]


def _text(text: str, utf8: bool) -> str:
    """Protobuf strings are valid UTF-8 by construction: lone surrogates can
    only reach the receiver through OTLP/JSON."""
    return text.encode("utf-8", "replace").decode("utf-8") if utf8 else text


def _nested(depth: int) -> str:
    """JSON text nested ``depth`` deep (written out: an encoder would recurse)."""
    opening = "".join('{"d":' if level % 2 == 0 else "[" for level in range(depth))
    closing = "".join("}" if level % 2 == 0 else "]" for level in reversed(range(depth)))
    return opening + '"bottom"' + closing


def record_blob(spec: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
    """A verifiers-shaped record with something hostile inside, and its exact bytes."""
    record = next(synthetic_episodes(1, seed=zlib.crc32(spec["id"].encode()) % 1000))
    record["id"] = spec["id"]
    info = record.setdefault("info", {})
    if spec.get("depth"):
        info["deep"] = "@deep@"
    if spec.get("bigint"):
        record.setdefault("metrics", {})["huge"] = 10**400
        info["big"] = 2**70
    if spec.get("surrogate"):
        info["\ud800key"] = "value \udfff"
    text = json.dumps(record, separators=(",", ":"))
    if spec.get("depth"):
        text = text.replace('"@deep@"', _nested(spec["depth"]))
    return record, text.encode("utf-8")


def _span_attributes(span: Mapping[str, Any]) -> dict[str, Any]:
    attributes = dict(span.get("attributes", {}))
    record = span.get("record")
    if record is not None:
        _, raw = record_blob(record)
        text = raw.decode("utf-8")
        attributes.setdefault(sc.EPISODE_ID, {"s": record["id"]})
        attributes[sc.EPISODE_RECORD] = {"a": [{"s": text}]}
        attributes[sc.blob_size_key(sc.EPISODE_RECORD)] = {"i": len(raw)}
        attributes[sc.blob_sha256_key(sc.EPISODE_RECORD)] = {"s": hashlib.sha256(raw).hexdigest()}
    return attributes


def build_request(case: Mapping[str, Any], *, utf8: bool = True) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(_pairs(case.get("resource", {}), utf8=utf8))
    scope = resource_spans.scope_spans.add()
    for span in case.get("spans", []):
        attributes = _pairs(_span_attributes(span), utf8=utf8)
        for copy in range(span.get("copies", 1)):
            message = scope.spans.add()
            message.name = _text(span.get("name", "span"), utf8)
            message.trace_id = int(span.get("trace", 1)).to_bytes(16, "big")
            message.span_id = (int(span.get("span", 1)) + copy).to_bytes(8, "big")
            if span.get("parent") is not None:
                message.parent_span_id = int(span["parent"]).to_bytes(8, "big")
            message.start_time_unix_nano = 1_700_000_000_000_000_000 + copy
            message.end_time_unix_nano = 1_700_000_000_000_000_000 + copy + 1
            message.attributes.extend(attributes)
    return request


def merge(request: ExportTraceServiceRequest, other: ExportTraceServiceRequest) -> None:
    request.resource_spans.extend(other.resource_spans)


def json_body(request: ExportTraceServiceRequest, case: Mapping[str, Any]) -> bytes:
    """OTLP/JSON with hex ids; strings of the case as written (surrogates
    included, escaped as JSON allows)."""
    document = {"resourceSpans": [_json_resource_spans(rs) for rs in request.resource_spans]}
    # protobuf cannot hold lone surrogates: put the case's strings back as written
    first = document["resourceSpans"][0]
    first["resource"] = {"attributes": _json_pairs(case.get("resource", {}))}
    spans = first.get("scopeSpans", [{}])[0].get("spans", [])
    index = 0
    for span in case.get("spans", []):
        attributes = _json_pairs(_span_attributes(span))
        for _ in range(span.get("copies", 1)):
            spans[index]["name"] = span.get("name", "span")
            spans[index]["attributes"] = attributes
            index += 1
    return json.dumps(document).encode("ascii")


def _json_resource_spans(resource_spans: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    document: dict[str, Any] = json_format.MessageToDict(resource_spans)
    for scope in document.get("scopeSpans", []):
        for span in scope.get("spans", []):
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in span:
                    span[key] = base64.b64decode(span[key]).hex()
    return document


def _json_pairs(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _json_value(value)} for key, value in attributes.items()]


def _json_value(spec: Mapping[str, Any]) -> dict[str, Any]:
    ((kind, raw),) = spec.items()
    if kind == "s":
        return {"stringValue": raw}
    if kind == "i":
        return {"intValue": str(raw)}
    if kind == "d":
        return {"doubleValue": raw}
    if kind == "b":
        return {"boolValue": raw}
    if kind == "bytes":
        return {"bytesValue": base64.b64encode(bytes.fromhex(raw)).decode()}
    if kind == "a":
        return {"arrayValue": {"values": [_json_value(item) for item in raw]}}
    return {"kvlistValue": {"values": _json_pairs(raw)}}


def encode_body(case: Mapping[str, Any], body: bytes) -> tuple[bytes, dict[str, str]]:
    encoding = case.get("encoding", "identity")
    if encoding == "gzip":
        return gzip.compress(body), {"content-encoding": "gzip"}
    if encoding == "gzip-members":
        empty = gzip.compress(b"")
        return empty * int(case.get("members", 1000)) + gzip.compress(body), {
            "content-encoding": "gzip"
        }
    if encoding == "deflate":
        return zlib.compress(body), {"content-encoding": "deflate"}
    return body, {}


def http_request(
    case: Mapping[str, Any], honest: ExportTraceServiceRequest | None
) -> tuple[bytes, dict[str, str]]:
    """Body and headers of an OTLP/HTTP case, ``honest`` spans beside the hostile ones."""
    if "body" in case:
        return encode_body(case, bytes.fromhex(case["body"]))[0], {
            "content-type": case.get("content_type", PROTOBUF),
            **encode_body(case, b"")[1],
        }
    json_transport = case.get("transport") == "http-json"
    request = build_request(case, utf8=True)
    if honest is not None:
        merge(request, honest)
    if json_transport:
        data, content_type = json_body(request, case), JSON
    else:
        data, content_type = request.SerializeToString(), PROTOBUF
    body, headers = encode_body(case, data)
    return body, {"content-type": content_type, **headers}


def grpc_body(case: Mapping[str, Any], honest: ExportTraceServiceRequest | None) -> bytes:
    if "body" in case:
        return bytes.fromhex(case["body"])
    request = build_request(case, utf8=True)
    if honest is not None:
        merge(request, honest)
    return request.SerializeToString()


def span_count(case: Mapping[str, Any]) -> int:
    return sum(int(span.get("copies", 1)) for span in case.get("spans", []))


def all_keys() -> Sequence[str]:
    return READ_KEYS
