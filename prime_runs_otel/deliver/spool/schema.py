"""The spool's tables, and how a spool written by an earlier release is
brought up to them.

Every table is created if missing on open, columns added since the first
release are added in place, and data that moved between tables is moved in
one transaction: an upgrade never needs the spool emptied first.

Why not one ``PRAGMA user_version`` step per change, as tools without an ORM
often do: a column added is harmless to an older release reading the spool,
and a version bumped for it would make that release refuse the spool
outright. So only a change an older release cannot read past (data moved
between tables) bumps ``SCHEMA_VERSION``, which an older release refuses
with what to do; additions are declared (``ADDED_COLUMNS``) and checked on
open, which costs a fraction of a millisecond.
"""

from __future__ import annotations

import sqlite3
from contextlib import suppress

#: 2: record bodies moved out of ``episodes`` into ``records`` (see ``_SCHEMA``).
#: 3: ``metrics`` holds rows posted as logged beside the one row of a step
#: (``post``), so its key changed (see ``METRICS_TABLE``).
SCHEMA_VERSION = 3

#: Metrics rows, sent in seq order. post '': a step's one row, to which a
#: step logged again adds its values; otherwise a row posted exactly as
#: logged (prime.run.metrics.verbatim), named by its span's ids, one post each.
METRICS_TABLE = """
CREATE TABLE IF NOT EXISTS metrics (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    post TEXT NOT NULL DEFAULT '',
    row TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    updated_at REAL NOT NULL,
    UNIQUE (run_id, step, post)
)
"""

#: What the viewer shows of a run, by table: folded from its episodes' rows
#: by the first view after they were stored (``folds.py``), so that no page
#: reads the bodies. Apart from the other tables so that a store this user
#: cannot write can be folded in memory, into tables of the same names.
#:
#: Why ``SCHEMA_VERSION`` stays, though these were kept by every commit
#: until ``run_folds`` and ``episodes.view_facts`` were added: an earlier
#: release opening such a spool to write reads and writes everything as
#: before (it folds its own episodes as it stores them, and leaves
#: ``view_facts`` NULL, which the fold passes over); only its viewer shows a
#: run without the episodes this release stored since that run was last
#: viewed here. Bumping the version would make it refuse the whole spool.
VIEW_TABLES = {
    # rollouts' count numbers a run's rollouts as they are stored; the rest
    # of the row is folded.
    "rollouts": """
CREATE TABLE IF NOT EXISTS rollouts (
    run_id TEXT NOT NULL,
    example_key TEXT NOT NULL,
    count INTEGER NOT NULL,
    -- Per-example rewards for the viewer: the sum over the rollouts with a
    -- reward, how many had one, and how many failed.
    reward_sum REAL NOT NULL DEFAULT 0,
    rewarded INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, example_key)
)""",
    # Distributions: how many episodes (model calls, for call_latency) had
    # each value, the value rounded to three significant digits.
    "run_histograms": """
CREATE TABLE IF NOT EXISTS run_histograms (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    bucket REAL NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (run_id, name, bucket)
) WITHOUT ROWID""",
    # Failed episodes by error type, with the first one as an example.
    "run_errors": """
CREATE TABLE IF NOT EXISTS run_errors (
    run_id TEXT NOT NULL,
    error_type TEXT NOT NULL,
    count INTEGER NOT NULL,
    example_id TEXT NOT NULL,
    example_message TEXT,
    PRIMARY KEY (run_id, error_type)
) WITHOUT ROWID""",
    # Rewards and metrics over a run: axis 0 by training step (point =
    # step), axis N > 0 by blocks of N episodes in arrival order (point =
    # block). metrics is JSON: {name: [sum, count]}.
    "run_series": """
CREATE TABLE IF NOT EXISTS run_series (
    run_id TEXT NOT NULL,
    axis INTEGER NOT NULL,
    point INTEGER NOT NULL,
    episodes INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    rewarded INTEGER NOT NULL,
    reward_sum REAL NOT NULL,
    metrics TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    PRIMARY KEY (run_id, axis, point)
) WITHOUT ROWID""",
    # How far each run is folded: the seq of the last of its episodes folded in.
    "run_folds": """
CREATE TABLE IF NOT EXISTS run_folds (
    run_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
) WITHOUT ROWID""",
}

SCHEMA = (
    """
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
    -- What the viewer sorts and filters by (see views.py), set as the episode
    -- is stored. ok: 1 or 0; -1 when its body was gone before it could be
    -- read; NULL until read (an episode stored by an earlier release).
    ok INTEGER,
    reward REAL,
    error_type TEXT,
    tokens INTEGER,
    input_tokens INTEGER,
    output_tokens INTEGER,
    duration REAL,
    turns INTEGER,
    example TEXT,
    UNIQUE (run_id, episode_id)
);
CREATE INDEX IF NOT EXISTS episodes_by_state ON episodes (run_id, state, seq);
CREATE INDEX IF NOT EXISTS episodes_by_upload ON episodes (upload_id) WHERE upload_id IS NOT NULL;
-- The record bodies, apart from the small rows whose state changes: SQLite
-- rewrites a whole row on every update, and an episode's state changes two
-- or three times on its way to the platform. (episodes.record is where
-- schema version 1 kept them; it is moved here on open and stays NULL.)
CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
"""
    + ";".join(VIEW_TABLES.values())
    + """;
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
"""
    + METRICS_TABLE
    + """;
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
)

#: Columns added after the first release, added in place to an older spool
#: file so that an upgrade never needs the spool emptied first.
ADDED_COLUMNS = {
    "runs": (
        # 1: the run's record bodies stay after delivery (for `show`, `ui` and
        # `export`; the default for a run started with
        # PRIME_RUNS_OTEL_KEEP_DELIVERED on, and a local run pushed); 0:
        # dropped once the platform has them.
        ("keep_records", "INTEGER NOT NULL DEFAULT 0"),
        # The producer's own run summary (JSON), sent instead of the aggregated one.
        ("end_summary", "TEXT"),
        # Episodes the producer could not encode (reported with the run's end).
        ("unencodable", "INTEGER NOT NULL DEFAULT 0"),
        # The producer that owns the run (its service.instance.id, '' for none):
        # behind serve, the run's end is taken from this producer only.
        ("owner_id", "TEXT"),
        # Episodes that arrived after the run was closed (delivered to the
        # closed run if the platform takes them), and of those the ones it refused.
        ("late", "INTEGER NOT NULL DEFAULT 0"),
        ("late_refused", "INTEGER NOT NULL DEFAULT 0"),
    ),
    "episodes": (
        ("step", "INTEGER"),
        # When the episode was stored: the age of the oldest one still
        # pending is the delivery lag (`serve`'s /metrics).
        ("stored_at", "REAL"),
        # What the viewer sorts and filters by (see the table above).
        ("ok", "INTEGER"),
        ("reward", "REAL"),
        ("error_type", "TEXT"),
        ("tokens", "INTEGER"),
        ("input_tokens", "INTEGER"),
        ("output_tokens", "INTEGER"),
        ("duration", "REAL"),
        ("turns", "INTEGER"),
        ("example", "TEXT"),
        # What only the run's aggregates need of the episode (views.py's
        # view_facts_text); set by a release that folds them on view (NULL:
        # folded as it was stored, or stored before facts were kept).
        ("view_facts", "TEXT"),
    ),
    "rollouts": (
        ("reward_sum", "REAL NOT NULL DEFAULT 0"),
        ("rewarded", "INTEGER NOT NULL DEFAULT 0"),
        ("failed", "INTEGER NOT NULL DEFAULT 0"),
    ),
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


#: The viewer's indexes over columns added in place: created once the
#: columns are there. Each lets a page of a run's episodes sorted or filtered
#: by that column be read without visiting the run's other episodes
#: (``episodes_failed`` holds a run's failures with every value they are
#: sorted or filtered by, so a page of them is read from it alone);
#: ``episodes_without_facts`` holds only episodes stored by an earlier
#: release (new ones are read as they are stored), so it costs a new spool
#: nothing.
INDEXES = """
CREATE INDEX IF NOT EXISTS episodes_by_run ON episodes (run_id, seq);
CREATE INDEX IF NOT EXISTS episodes_failed
    ON episodes (run_id, error_type, reward, tokens, duration) WHERE error_type IS NOT NULL;
CREATE INDEX IF NOT EXISTS episodes_by_example ON episodes (run_id, example);
CREATE INDEX IF NOT EXISTS episodes_without_facts ON episodes (run_id, seq)
    WHERE ok IS NULL OR ok < 0;
"""

#: The viewer's indexes by a value of the episode (name: column), made the first time a
#: page is read through one (``SpoolCore.index_made``), not on open.
#:
#: Why not on open: a new episode's reward, tokens and duration land
#: anywhere inside these, not at their end, so on a long run every commit
#: of ``export()`` rewrote about a page of each per episode
#: (docs/performance.md); most runs are never sorted by a value, and
#: every run paid. A spool that has them (made by an earlier release, or
#: once sorted) keeps them, kept up to date by SQLite as any index.
#:
#: Why ``SCHEMA_VERSION`` stays: an earlier release opening such a spool to
#: write makes them again on open (its ``INDEXES`` still lists them), and
#: reads everything else as before. The one thing it cannot read past is a
#: page sorted by a value in its viewer, when it opens the spool read-only
#: (it names them in ``INDEXED BY``): bumping the version would make that
#: release refuse the whole spool instead, read-only or not.
MADE_ON_FIRST_USE = {
    "episodes_by_reward": "reward",
    "episodes_by_tokens": "tokens",
    "episodes_by_duration": "duration",
}


def index_on_first_use(name: str) -> str:
    """The statement that makes ``name``, one of :data:`MADE_ON_FIRST_USE`."""
    return f"CREATE INDEX IF NOT EXISTS {name} ON episodes (run_id, {MADE_ON_FIRST_USE[name]})"


#: How many episodes of each run are in each state, kept by triggers on
#: every write to ``episodes`` (whoever writes it, an older release too), so
#: that counting them (``serve``'s /metrics) never reads the episodes.
EPISODE_STATES = (
    "CREATE TABLE episode_states (run_id TEXT NOT NULL, state TEXT NOT NULL, "
    "count INTEGER NOT NULL, PRIMARY KEY (run_id, state)) WITHOUT ROWID",
    "CREATE TRIGGER episode_states_insert AFTER INSERT ON episodes BEGIN "
    "INSERT INTO episode_states VALUES (NEW.run_id, NEW.state, 1) "
    "ON CONFLICT DO UPDATE SET count = count + 1; END",
    "CREATE TRIGGER episode_states_update AFTER UPDATE OF state ON episodes "
    "WHEN OLD.state IS NOT NEW.state BEGIN "
    "UPDATE episode_states SET count = count - 1 WHERE run_id = OLD.run_id AND state = OLD.state; "
    "INSERT INTO episode_states VALUES (NEW.run_id, NEW.state, 1) "
    "ON CONFLICT DO UPDATE SET count = count + 1; END",
    "CREATE TRIGGER episode_states_delete AFTER DELETE ON episodes BEGIN "
    "UPDATE episode_states SET count = count - 1 WHERE run_id = OLD.run_id AND state = OLD.state; "
    "END",
    # What a spool written before the triggers already holds, counted once.
    "INSERT INTO episode_states SELECT run_id, state, COUNT(*) FROM episodes "
    "GROUP BY run_id, state",
)


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
    db.executescript(INDEXES)
    _add_episode_states(db)


def _add_episode_states(db: sqlite3.Connection) -> None:
    """The counts table, its triggers and the counts of what is there, in one
    transaction: no episode written meanwhile is missed or counted twice."""
    if _has_table(db, "episode_states"):
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        if not _has_table(db, "episode_states"):  # another process was first
            for statement in EPISODE_STATES:
                db.execute(statement)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


#: ``metrics`` up to schema 2 was keyed by (run_id, step) alone; a key
#: cannot change in place, so the table is rebuilt, its rows in step order.
_METRICS_V3 = (
    "ALTER TABLE metrics RENAME TO metrics_v2",
    METRICS_TABLE,
    "INSERT INTO metrics (run_id, step, post, row, state, updated_at) "
    "SELECT run_id, step, '', row, state, updated_at FROM metrics_v2 ORDER BY run_id, step",
    "DROP TABLE metrics_v2",
)


def _metrics_to_v3(db: sqlite3.Connection) -> None:
    """Rebuild a schema 2 ``metrics`` table (no ``post`` column), once."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(metrics)")}
    if "post" in columns:
        return
    for statement in _METRICS_V3:
        db.execute(statement)


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return found.fetchone() is not None


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
    _metrics_to_v3(db)
    # Written only when it changes: opening a spool on a full disk must not
    # need room (``size.py``).
    db.execute(
        "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
        "ON CONFLICT DO UPDATE SET value = excluded.value WHERE value != excluded.value",
        (str(SCHEMA_VERSION),),
    )
