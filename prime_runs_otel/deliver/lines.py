"""Prime Traces lines built where their record was read, kept for the uploader.

An episode's Prime Traces line is its record stamped with the platform's run
id. The uploader would have to parse the stored record again to make it; the
producer in this process has the record parsed when it hands it to its
exporter, so it builds the line there, with a placeholder for the run id
(:func:`~prime_runs_otel.read.projection.traces_line_template`), and the
uploader only fills the id in. The lines live here, in memory, by the
episode's spool sequence number, from the export that stored the episode to
the upload that sends it.

Only a shortcut: an episode whose line is not here (another process stored
it, the cache was full, the process restarted) is parsed from the spool as
before, and makes the same bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..read.projection import LineTemplate

__all__ = ["DEFAULT_LINE_CACHE_BYTES", "LineCache"]

#: At most this many bytes of lines are kept. When the uploader falls this far
#: behind (an outage), new lines are not kept: the oldest are the next to go
#: out, and the rest are parsed from the spool when their turn comes.
DEFAULT_LINE_CACHE_BYTES = 32 * 1024 * 1024


class LineCache:
    """Line templates by spool sequence number, bounded in bytes; thread-safe."""

    def __init__(self, max_bytes: int = DEFAULT_LINE_CACHE_BYTES) -> None:
        self._max_bytes = max_bytes
        self._lines: dict[int, LineTemplate] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def keep(self, lines: Iterable[tuple[int, LineTemplate]]) -> None:
        """Keep each ``(seq, template)`` while there is room."""
        with self._lock:
            for seq, template in lines:
                if self._bytes + len(template.data) > self._max_bytes:
                    return
                if seq not in self._lines:
                    self._lines[seq] = template
                    self._bytes += len(template.data)

    def take(self, seq: int) -> LineTemplate | None:
        """The template of episode ``seq``, forgotten here once taken."""
        with self._lock:
            template = self._lines.pop(seq, None)
            if template is not None:
                self._bytes -= len(template.data)
            return template

    def clear(self) -> None:
        with self._lock:
            self._lines.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._lines)

    @property
    def size_bytes(self) -> int:
        return self._bytes
