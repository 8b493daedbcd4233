"""Records this process encoded itself, remembered until its exporter reads them.

In process, the run's producer thread encodes each episode record and sets it
on the episode span in chunks; a moment later ``export()`` joins the chunks,
encodes them to bytes again and checks the record's nesting, all to learn
what the producer knew already: these bytes, written by orjson within
:data:`prime_runs_otel._json.MAX_NESTING`. The span still carries the record
(every other reader of the span, an OTLP exporter, a collector, needs it), so
nothing changes on the wire; only the exporter of the process that wrote it
skips work.

A remembered record is used only when the span's record attribute still
holds the very chunk objects the producer set (the SDK stores string values
as they are, and a length limit would have cut them into new ones), so what
the exporter reads is exactly what was encoded. Anything else (a span from
another process, an entry evicted, chunks that are not the producer's) takes
the ordinary path, which is always correct.

Nothing is remembered until this package's exporter is built in the
process (:meth:`EncodedHere.enable`): ``record_episode`` on a provider that
exports elsewhere must not hold records nobody takes. Bounded in entries and
in bytes, for spans that never reach the exporter all the same (another
provider beside it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["EncodedHere", "encoded_here"]

#: Spans remembered at most: above the SDK's default export queue (2048).
MAX_ENTRIES = 4096
#: Bytes of records remembered at most: the oldest are forgotten to make room,
#: and a record larger than all of it is not remembered.
MAX_BYTES = 32 * 1024 * 1024


class EncodedHere:
    """Span id → (the chunks set on the span, the record's bytes)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[Sequence[str], bytes]] = {}
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self.enabled = False

    def enable(self) -> None:
        """An exporter of this package reads spans in this process from now on."""
        self.enabled = True

    def note(self, span_id: int, chunks: Sequence[str], data: bytes) -> None:
        """Remember that the span ``span_id`` carries ``data`` as ``chunks``,
        written by orjson within the nesting limit."""
        if not self.enabled:
            return
        if len(data) > self._max_bytes:
            return
        with self._lock:
            entries = self._entries
            old = entries.pop(span_id, None)
            if old is not None:
                self._bytes -= len(old[1])
            # The oldest go first, by count and by bytes alike: entries whose
            # spans never reach the exporter age out instead of filling the
            # budget for good.
            while entries and (
                len(entries) >= self._max_entries or self._bytes + len(data) > self._max_bytes
            ):
                oldest = entries.pop(next(iter(entries)))
                self._bytes -= len(oldest[1])
            entries[span_id] = (chunks, data)
            self._bytes += len(data)

    def take(self, span_id: int, value: Any) -> bytes | None:
        """The bytes noted for ``span_id``, forgotten now, when ``value`` (the
        span's record attribute) holds the very chunks noted; else ``None``."""
        with self._lock:
            entry = self._entries.pop(span_id, None)
            if entry is None:
                return None
            self._bytes -= len(entry[1])
        chunks, data = entry
        if not isinstance(value, (tuple, list)) or len(value) != len(chunks):
            return None
        for theirs, mine in zip(value, chunks, strict=True):
            if theirs is not mine:
                return None
        return data

    def __len__(self) -> int:
        return len(self._entries)

    def after_fork(self) -> None:
        """A forked child starts empty: the lock may be held by a thread it has not."""
        self._lock = threading.Lock()
        self._entries = {}
        self._bytes = 0


#: The one registry of the process.
encoded_here = EncodedHere()
os.register_at_fork(after_in_child=encoded_here.after_fork)
