"""What every facet of the spool reaches through: the one :class:`SpoolCore`
of its file (connections, transactions, the file's settings).

A facet (``facets.py``) is made of parts, one per table module, each a
subclass of :class:`SpoolPart`; every part of every facet of one spool holds
the same core, so they share its connections, its writer and its state, and
none holds state of its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from .core import SpoolCore


class SpoolPart:
    """A share of one facet: the core's reads, writes and settings, by name."""

    def __init__(self, core: SpoolCore) -> None:
        self._core = core

    @property
    def path(self) -> Path:
        return self._core.path

    @property
    def max_bytes(self) -> int:
        return self._core.max_bytes

    @property
    def keep_delivered(self) -> bool:
        return self._core.keep_delivered

    @property
    def _reported_damaged(self) -> set[str]:
        return self._core._reported_damaged

    @property
    def _warned_full(self) -> bool:
        return self._core._warned_full

    @_warned_full.setter
    def _warned_full(self, warned: bool) -> None:
        self._core._warned_full = warned

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._core._query(sql, params)

    def _transaction(self, *, fsync: bool = True) -> AbstractContextManager[sqlite3.Connection]:
        return self._core._transaction(fsync=fsync)

    def _connection(self) -> sqlite3.Connection:
        return self._core._connection()

    def _run_script(self, sql: str) -> None:
        self._core._run_script(sql)
