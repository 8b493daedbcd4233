"""The spool's tables, and how a spool written by an earlier release is
brought up to them.

Every table is created if missing on open, columns added since the first
release are added in place, and data that moved between tables is moved in
one transaction: an upgrade never needs the spool emptied first.
"""

from __future__ import annotations

import sqlite3
from contextlib import suppress

#: 2: record bodies moved out of ``episodes`` into ``records`` (see ``_SCHEMA``).
SCHEMA_VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    local_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT,
    identity TEXT NOT NULL,
    mode TEXT NOT NULL,
    config TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    platform_id TEXT,
    url TEXT,
    create_state TEXT NOT NULL DEFAULT 'pending',
    create_started REAL,
    sink TEXT NOT NULL DEFAULT 'traces',
    traces_written INTEGER NOT NULL DEFAULT 0,
    end_status TEXT,
    end_error TEXT,
    end_expected INTEGER,
    ended_at REAL,
    close_state TEXT NOT NULL DEFAULT 'open',
    closed_at REAL,
    summary_state TEXT NOT NULL,
    episodes INTEGER NOT NULL DEFAULT 0,
    duplicates INTEGER NOT NULL DEFAULT 0,
    corrupt INTEGER NOT NULL DEFAULT 0,
    rejected INTEGER NOT NULL DEFAULT 0,
    unencodable INTEGER NOT NULL DEFAULT 0,
    uncertain INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    last_seen REAL NOT NULL
);
-- Runs whose delivery stopped: every ingest asks what they hold (size.py).
CREATE INDEX IF NOT EXISTS runs_stopped ON runs (local_id)
    WHERE create_state = 'failed' OR close_state = 'gave_up';
CREATE TABLE IF NOT EXISTS episodes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    episode_id TEXT NOT NULL,
    rollout_number INTEGER,
    has_traces INTEGER NOT NULL,
    size INTEGER NOT NULL,
    record BLOB,
    state TEXT NOT NULL DEFAULT 'pending',
    upload_id TEXT,
    step INTEGER,
    UNIQUE (run_id, episode_id)
);
CREATE INDEX IF NOT EXISTS episodes_by_state ON episodes (run_id, state, seq);
CREATE INDEX IF NOT EXISTS episodes_by_upload ON episodes (upload_id) WHERE upload_id IS NOT NULL;
-- The record bodies, apart from the small rows whose state changes: SQLite
-- rewrites a whole row on every update, and an episode's state changes two
-- or three times on its way to the platform. (episodes.record is where
-- schema version 1 kept them; it is moved here on open and stays NULL.)
CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    run_id TEXT NOT NULL,
    example_key TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (run_id, example_key)
);
CREATE TABLE IF NOT EXISTS uploads (
    upload_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    body BLOB,
    episodes INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    step INTEGER,
    sample_offset INTEGER,
    object_url TEXT,
    object_key TEXT
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    row TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    updated_at REAL NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS producers (
    run_id TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    pid_start TEXT NOT NULL,
    last_seen REAL NOT NULL,
    owner INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (run_id, host, pid, pid_start)
);
CREATE TABLE IF NOT EXISTS lease (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires REAL NOT NULL
);
"""

#: Columns added after the first release, added in place to an older spool
#: file so that an upgrade never needs the spool emptied first.
ADDED_COLUMNS = {
    "runs": (
        # 1: the run's record bodies stay after delivery (a local run pushed,
        # still to be read with `export`); 0: dropped once the platform has them.
        ("keep_records", "INTEGER NOT NULL DEFAULT 0"),
        # The producer's own run summary (JSON), sent instead of the aggregated one.
        ("end_summary", "TEXT"),
        # Episodes the producer could not encode (reported with the run's end).
        ("unencodable", "INTEGER NOT NULL DEFAULT 0"),
    ),
    "episodes": (("step", "INTEGER"),),
    "producers": (("owner", "INTEGER NOT NULL DEFAULT 1"),),
    "uploads": (
        ("step", "INTEGER"),
        ("sample_offset", "INTEGER"),
        ("object_url", "TEXT"),
        ("object_key", "TEXT"),
        # 'gzip' for a Prime Traces body stored as it is sent; NULL: stored plain.
        ("body_encoding", "TEXT"),
    ),
}


def create_tables(db: sqlite3.Connection) -> None:
    """Create what is missing; outside a transaction (``executescript``
    commits), and harmless when another process does the same."""
    db.executescript(SCHEMA)
    for table, columns in ADDED_COLUMNS.items():
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, kind in columns:
            if name not in present:
                with suppress(sqlite3.OperationalError):  # another process added it
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def stored_version(db: sqlite3.Connection) -> int:
    """The schema version the spool was last written with (a new spool is
    at this release's)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else SCHEMA_VERSION


def migrate(db: sqlite3.Connection, version: int) -> None:
    """Bring a spool at ``version`` (not newer than this release's) to this
    schema, inside the caller's transaction."""
    if version < 2:
        db.execute(
            "INSERT OR IGNORE INTO records (seq, body) "
            "SELECT seq, record FROM episodes WHERE record IS NOT NULL"
        )
        db.execute("UPDATE episodes SET record = NULL WHERE record IS NOT NULL")
    # Written only when it changes: opening a spool on a full disk must not
    # need room (``size.py``).
    db.execute(
        "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
        "ON CONFLICT DO UPDATE SET value = excluded.value WHERE value != excluded.value",
        (str(SCHEMA_VERSION),),
    )
