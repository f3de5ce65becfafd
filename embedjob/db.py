"""The shared database schema (SQLAlchemy Core) and its migrations.

The driver writes these tables; the controller reads `runs`/`batches` to report progress,
and takes and marks pool leases (`controller.pool_leases`) to remove idle shared pools. Bookkeeping tables have fixed names (prefix `embedjob_`) and are created by
the Alembic migrations in `embedjob/migrations`. The vectors table is named by the
user (`spec.sink.table`) and its width depends on the model, so it is created by
`embedjob.vectors_schema.vectors_table(...).create(checkfirst=True)` once the model's dimension is known.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql


metadata = sa.MetaData()


def _ts(name: str, **kw) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), **kw)


# One row per driver run over one input snapshot. A job (keyed by the EmbeddingJob's uid,
# or `local/<namespace>/<name>/<table>/<collection>` for `embedjob run`) normally has one
# run; a new one is started only when the input changed and the user asked for it.
runs = sa.Table(
    "embedjob_runs",
    metadata,
    sa.Column("run_id", sa.String(36), primary_key=True),
    sa.Column("job_key", sa.String(300), nullable=False, index=True),
    sa.Column("job_name", sa.String(253), nullable=False),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("collection", sa.String(128), nullable=False),
    sa.Column("vectors_table", sa.String(63), nullable=False),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("revision", sa.String(128), nullable=False),
    sa.Column("input_fingerprint", sa.String(64), nullable=False),
    sa.Column("config_fingerprint", sa.String(64), nullable=False),
    # What config_fingerprint hashes, field by field (spec paths, e.g. "sink.collection"), so
    # a refused re-run names the fields that changed; NULL for runs older than migration 0003.
    sa.Column("identity", postgresql.JSONB),
    # The input input_fingerprint identifies (uri, size, modified, content: sha256 or the
    # store's stamp; embedjob_worker.source.snapshot), for the refusal's message; NULL before 0006.
    sa.Column("input", postgresql.JSONB),
    sa.Column("state", sa.String(16), nullable=False),  # running | succeeded | failed
    # The run's counters: one column per field of api.RunCounters (tests/test_db.py checks),
    # nullable where the field may be unknown.
    sa.Column("batches_total", sa.Integer),  # known once the input has been read through
    sa.Column("batches_succeeded", sa.Integer, nullable=False, server_default="0"),
    sa.Column("batches_failed", sa.Integer, nullable=False, server_default="0"),
    sa.Column("records_total", sa.BigInteger),
    sa.Column("records_embedded", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("records_failed", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("texts_per_second", sa.Float, nullable=False, server_default="0"),
    sa.Column("index_build_seconds", sa.Float),  # set by a run that built the vector index (migration 0007)
    # Incremental runs (migration 0008): what the run found new, changed, up to date, and deleted.
    sa.Column("records_new", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("records_changed", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("records_unchanged", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("records_deleted", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("chunks_embedded", sa.BigInteger, nullable=False, server_default="0"),  # migration 0009
    sa.Column("precision_cosine_mean", sa.Float),  # migration 0012
    sa.Column("precision_cosine_min", sa.Float),
    sa.Column("prompt", sa.Text),  # migration 0013: the document prompt used, and why (status.progress.prompt)
    # A table run read by its change column (migration 0016; core.change_window.ChangeWindow.record): the column,
    # the watermark the read started from (none: every row), and the one it leaves for the next run.
    sa.Column("change_window", postgresql.JSONB),
    sa.Column("reason", sa.String(64)),  # CamelCase, e.g. TooManyFailedBatches; set when failed
    sa.Column("error", sa.Text),
    # The driver session that owns the run (migration 0010): set by each start or resume; a group
    # write of another session (a dead driver's writer actor) updates no row and rolls back.
    sa.Column("driver_session", sa.String(36)),
    # That session's own counts (batches done before, records up to date, bad records) as the counters above
    # hold them (migration 0011): a driver write adds only its counts beyond these, so a write retried after
    # its commit reply was lost adds nothing twice. Cleared by a resume, which recounts them.
    sa.Column("driver_counts", postgresql.JSONB),
    _ts("started_at", nullable=False, server_default=sa.func.now()),
    _ts("heartbeat_at", nullable=False, server_default=sa.func.now()),
    _ts("finished_at"),
)

# One row per batch: its final (or current) state. Marked `succeeded` in the same
# transaction that writes its vectors.
batches = sa.Table(
    "embedjob_batches",
    metadata,
    sa.Column("job_key", sa.String(300), primary_key=True),
    sa.Column("batch_id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(36), sa.ForeignKey(runs.c.run_id, ondelete="CASCADE"), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False),  # running | succeeded | failed
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("records", sa.Integer, nullable=False),
    sa.Column("failed_records", sa.Integer, nullable=False, server_default="0"),
    sa.Column("error", sa.Text),
    sa.Column("worker", sa.String(128)),
    _ts("started_at"),
    _ts("finished_at"),
    sa.Column("duration_s", sa.Float),
)

# Every attempt at a batch, with why it ended: the audit trail of retries and splits.
batch_attempts = sa.Table(
    "embedjob_batch_attempts",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_key", sa.String(300), nullable=False),
    sa.Column("batch_id", sa.String(64), nullable=False),
    sa.Column("run_id", sa.String(36), sa.ForeignKey(runs.c.run_id, ondelete="CASCADE"), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("worker", sa.String(128)),
    sa.Column("outcome", sa.String(16), nullable=False),  # succeeded | retry | split | failed
    sa.Column("reason", sa.Text),
    _ts("started_at"),
    _ts("finished_at", nullable=False, server_default=sa.func.now()),
    sa.Index("ix_embedjob_batch_attempts_batch", "job_key", "batch_id"),
)

# Records rejected as bad input (never retried), one row per record and run.
record_errors = sa.Table(
    "embedjob_record_errors",
    metadata,
    sa.Column("run_id", sa.String(36), sa.ForeignKey(runs.c.run_id, ondelete="CASCADE"), primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True),  # 0-based record number in the input
    sa.Column("job_key", sa.String(300), nullable=False, index=True),
    sa.Column("record_id", sa.Text),
    sa.Column("batch_id", sa.String(64)),
    sa.Column("reason", sa.String(32), nullable=False),
    sa.Column("detail", sa.Text),
    _ts("created_at", nullable=False, server_default=sa.func.now()),
)

# Each record id a running run has read, with the position of its first occurrence: the
# driver asks PostgreSQL which records are duplicates instead of keeping every id in memory.
# Deleted when the run finishes (a resumed run rebuilds the same rows from the same input).
seen_ids = sa.Table(
    "embedjob_seen_ids",
    metadata,
    sa.Column("run_id", sa.String(36), sa.ForeignKey(runs.c.run_id, ondelete="CASCADE"), primary_key=True),
    sa.Column("record_id", sa.Text, primary_key=True),
    sa.Column("position", sa.BigInteger, nullable=False),
)



# One row per shard of a dataset (spec.source.uri a prefix or glob) that a run's driver has read through: consecutive
# files, from `first_file` (its place in the run's listing) on. A resumed session skips a shard whose `batch_ids`
# (the batches it sent to the model) have all been written, and adds `counts` (what only the driver counts) and
# its records to its own instead of reading its files again. The rows go at the run's end, like its seen ids.
run_shards = sa.Table(
    "embedjob_run_shards",
    metadata,
    sa.Column("run_id", sa.String(36), sa.ForeignKey(runs.c.run_id, ondelete="CASCADE"), primary_key=True),
    sa.Column("first_file", sa.Integer, primary_key=True),
    sa.Column("files", sa.Integer, nullable=False),
    sa.Column("records", sa.BigInteger, nullable=False),
    sa.Column("batches", sa.Integer, nullable=False),
    sa.Column("counts", postgresql.JSONB, nullable=False),
    sa.Column("batch_ids", postgresql.ARRAY(sa.Text), nullable=False),
)

# The files of a dataset (spec.source.uri a prefix or glob) as one driver session listed them, in reading order
# (`position`, from 0), written page by page as the store lists them so that a listing of millions of files is
# never held in the driver's memory. A run's input record names its listing (`"listing": listing_id`); a
# session's start keeps only the listing of the job's latest started run (sink.listings).
listed_files = sa.Table(
    "embedjob_listed_files",
    metadata,
    sa.Column("listing_id", sa.String(36), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("job_key", sa.String(300), nullable=False, index=True),
    sa.Column("namespace", sa.String(63), nullable=False),  # the job's (row-level security)
    sa.Column("key", sa.Text, nullable=False),  # under the dataset's root: what the fingerprint names
    sa.Column("uri", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger),  # None: the store gave none
    sa.Column("content", sa.Text, nullable=False),  # source.snapshot.InputSnapshot.content
    sa.Column("modified", sa.Text),
)

# The state of each (vectors table, collection, model, revision) written by a run: `embedding` from a run's start
# until a run of it succeeds with every batch written, then `ready` (at most one per table and collection: the
# revision searches read, through the table's `_current` view) until another revision becomes ready, then `retired`
# (kept for spec.sink.retainPrevious switches, then deleted with its vectors). `vectors_table` is schema-qualified.
REVISION_STATES = ("embedding", "ready", "retired")
revisions = sa.Table(
    "embedjob_revisions",
    metadata,
    sa.Column("vectors_table", sa.String(128), primary_key=True),
    sa.Column("collection", sa.String(128), primary_key=True),
    sa.Column("model", sa.String(256), primary_key=True),
    sa.Column("revision", sa.String(128), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("namespace", sa.String(63), nullable=False),  # the job's that last changed it (row-level security)
    sa.Column("run_id", sa.String(36), nullable=False),  # the run that last changed it
    _ts("changed_at", nullable=False, server_default=sa.func.now()),
    sa.CheckConstraint(f"state IN {REVISION_STATES}", name="embedjob_revisions_state"),
    sa.Index("embedjob_revisions_one_ready", "vectors_table", "collection", unique=True,
             postgresql_where=sa.text("state = 'ready'")),
)

# One row per job that uses a detached actor pool on a shared Ray cluster
# (spec.clusterSelector). A lease is live while it is not released and its heartbeat is
# fresh; the operator removes a pool's actors only when none of its leases is live, and
# marks the leases it covered with `pool_removed_at` (a later lease starts a new pool).
pool_leases = sa.Table(
    "embedjob_pool_leases",
    metadata,
    sa.Column("lease_id", sa.String(36), primary_key=True),
    sa.Column("pool", sa.String(64), nullable=False),
    # `<namespace>/<RayCluster name>`: where the operator finds the cluster's dashboard.
    sa.Column("cluster", sa.String(317), nullable=False),
    sa.Column("job_key", sa.String(300), nullable=False),
    sa.Column("job_name", sa.String(253), nullable=False),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("actors", sa.Integer, nullable=False),  # pool slots this job uses: <pool>-0 .. <pool>-(actors-1)
    _ts("acquired_at", nullable=False, server_default=sa.func.now()),
    _ts("heartbeat_at", nullable=False, server_default=sa.func.now()),
    _ts("released_at"),
    _ts("pool_removed_at"),
    sa.Index("ix_embedjob_pool_leases_pool", "cluster", "pool"),
)


# Which namespaces' rows a role may use: a member of a role listed here is confined to those
# namespaces by row-level security (migration 0005); kept by `python -m embedjob.tenants`.
tenant_namespaces = sa.Table(
    "embedjob_tenant_namespaces",
    metadata,
    sa.Column("role", sa.String(63), primary_key=True),
    sa.Column("namespace", sa.String(63), primary_key=True),
)


MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "embedjob_alembic_version"
# Two-key advisory locks: the first key says what kind of thing is locked, the second is
# hashtext(its name). They live in a key space apart from the migrations' one-key lock (schema.py).
JOB_LOCK = 0x6A6F6273  # "jobs": a job's run bookkeeping (two drivers of one job)
TABLE_LOCK = 0x7461626C  # "tabl": creating a vectors table (drivers of two jobs)
POOL_LOCK = 0x706F6F6C  # "pool": a pool's lease acquisition (driver) against its removal (operator)


def advisory_lock_sql(kind: str, scope: int) -> sa.TextClause:
    """`SELECT pg_advisory_<kind>(scope, hashtext(:name))`, e.g. kind pg_advisory_xact_lock."""
    return sa.text(f"SELECT {kind}({scope}, hashtext(:name))")


def pool_lock_name(cluster: str, pool: str) -> str:
    return f"{cluster}/{pool}"


def engine_url(url: str | sa.URL) -> sa.URL:
    """The URL with psycopg 3 as the driver: the plain libpq URLs people keep in Secrets
    (postgresql://, postgres://) would otherwise mean psycopg2 or nothing at all."""
    parsed = sa.engine.make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    return parsed


# Every engine the driver opens: connecting, any one statement and any lock wait (advisory
# locks included) are bounded, so a database that hangs fails the job instead of stalling it.
CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_S = 300
LOCK_TIMEOUT_S = 60


def create_engine(url: str | sa.URL, settings: dict[str, int] | None = None, **kwargs) -> sa.Engine:
    """An engine (psycopg 3) whose sessions have connect, statement and lock timeouts, and `settings` (server
    parameters any role may set, given at connection start)."""
    settings = {"statement_timeout": STATEMENT_TIMEOUT_S * 1000, "lock_timeout": LOCK_TIMEOUT_S * 1000,
                **(settings or {})}
    options = " ".join(f"-c {name}={value}" for name, value in settings.items())
    connect_args = {"connect_timeout": CONNECT_TIMEOUT_S, "options": options, **kwargs.pop("connect_args", {})}
    return sa.create_engine(engine_url(url), connect_args=connect_args, **kwargs)
