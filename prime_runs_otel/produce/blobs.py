"""Large text on a span: the episode record, the run config, its summary, a
step's metrics.

An attribute value may be cut at a length limit the exporter does not
control, so a blob is set as chunks under the tightest limit in force, with
its size and digest beside it: the consumer joins the chunks and can tell a
complete blob from a truncated one.
"""

from __future__ import annotations

import os

from opentelemetry.trace import Span, Tracer

from .. import semconv as sc

__all__ = ["set_blob"]


def set_blob(span: Span, tracer: Tracer, key: str, text: str, data: bytes | None = None) -> None:
    """Chunk ``text`` under the length limit and pin its size and digest
    (computed over ``data``, its UTF-8 bytes, when the caller has them).

    Set last on the span so count-based eviction takes older attributes first.
    """
    if data is None:
        data = text.encode("utf-8")
    step = max(1, _length_limit(span, tracer) or sc.DEFAULT_BLOB_CHUNK_CHARS)
    chunks = (
        [text]
        if len(text) <= step
        else [text[offset : offset + step] for offset in range(0, len(text), step)]
    )
    span.set_attribute(sc.blob_size_key(key), len(data))
    span.set_attribute(sc.blob_sha256_key(key), sc.blob_sha256(data))
    span.set_attribute(key, chunks)


def _length_limit(span: Span, tracer: Tracer) -> int | None:
    """The tightest attribute value length limit in force, if any is known.

    Read from the SDK objects first (what actually truncates), then from the
    environment (what a tracer built later, or elsewhere, would use). All of
    it defensively: a tracer that is not the SDK's simply has no limit here.
    """
    limits: list[int] = []
    for holder in (getattr(span, "_limits", None), getattr(tracer, "_span_limits", None)):
        value = getattr(holder, "max_span_attribute_length", None)
        if isinstance(value, int) and value >= 0:
            limits.append(value)
    for variable in (sc.SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT_ENV, sc.ATTRIBUTE_VALUE_LENGTH_LIMIT_ENV):
        raw = os.environ.get(variable, "").strip()
        if raw.isdigit():
            limits.append(int(raw))
    return min(limits) if limits else None
