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


def set_blob(
    span: Span, tracer: Tracer, key: str, text: str, data: bytes | None = None
) -> list[str]:
    """Chunk ``text`` under the length limit and pin its size and digest
    (computed over ``data``, its UTF-8 bytes, when the caller has them);
    the chunks set last.

    Set last on the span so count-based eviction takes older attributes first.
    """
    if data is None:
        data = text.encode("utf-8")
    span.set_attribute(sc.blob_size_key(key), len(data))
    span.set_attribute(sc.blob_sha256_key(key), sc.blob_sha256(data))
    step = max(1, _environment_limit() or sc.DEFAULT_BLOB_CHUNK_CHARS)
    chunks = _chunks(text, step)
    span.set_attribute(key, chunks)
    cut_at = _cut_at(span, key, chunks)
    if cut_at is not None and 0 < cut_at < step:
        chunks = _chunks(text, cut_at)
        span.set_attribute(key, chunks)
    return chunks


def _chunks(text: str, step: int) -> list[str]:
    if len(text) <= step:
        return [text]
    return [text[offset : offset + step] for offset in range(0, len(text), step)]


def _environment_limit() -> int | None:
    """The attribute value length limit the environment sets, as the SDK
    reads it (the span-specific variable and the general one): what a
    provider built without limits of its own in code truncates at."""
    limits = []
    for variable in (sc.SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT_ENV, sc.ATTRIBUTE_VALUE_LENGTH_LIMIT_ENV):
        raw = os.environ.get(variable, "").strip()
        if raw.isdigit():
            limits.append(int(raw))
    return min(limits) if limits else None


def _cut_at(span: Span, key: str, chunks: list[str]) -> int | None:
    """The length the span cut the chunks to, read back from what it kept
    (``ReadableSpan.attributes``, public on the SDK's spans): a provider
    given ``SpanLimits`` in code truncates below what the environment says,
    and the SDK says its limits nowhere else. ``None`` when nothing was cut
    (or the span keeps no attributes: not the SDK's, or not recording)."""
    kept = getattr(span, "attributes", None)
    if kept is None:
        return None
    stored = kept.get(key)
    if not isinstance(stored, (tuple, list)) or len(stored) != len(chunks):
        return None
    if all(len(theirs) == len(mine) for mine, theirs in zip(chunks, stored, strict=True)):
        return None
    return max(len(theirs) for theirs in stored)  # a cut chunk is as long as the limit
