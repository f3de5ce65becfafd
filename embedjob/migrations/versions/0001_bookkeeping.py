"""Bookkeeping tables: runs, batches, batch attempts, record errors.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _ts(name, **kw):
    return sa.Column(name, sa.DateTime(timezone=True), **kw)


def upgrade() -> None:
    op.create_table(
        "embedjob_runs",
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
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("batches_total", sa.Integer),
        sa.Column("batches_succeeded", sa.Integer, nullable=False, server_default="0"),
        sa.Column("batches_failed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("records_total", sa.BigInteger),
        sa.Column("records_embedded", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("records_failed", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("texts_per_second", sa.Float, nullable=False, server_default="0"),
        sa.Column("reason", sa.String(64)),
        sa.Column("error", sa.Text),
        _ts("started_at", nullable=False, server_default=sa.func.now()),
        _ts("heartbeat_at", nullable=False, server_default=sa.func.now()),
        _ts("finished_at"),
    )
    op.create_table(
        "embedjob_batches",
        sa.Column("job_key", sa.String(300), primary_key=True),
        sa.Column("batch_id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(36), sa.ForeignKey("embedjob_runs.run_id", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("records", sa.Integer, nullable=False),
        sa.Column("failed_records", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error", sa.Text),
        sa.Column("worker", sa.String(128)),
        _ts("started_at"),
        _ts("finished_at"),
        sa.Column("duration_s", sa.Float),
    )
    op.create_table(
        "embedjob_batch_attempts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job_key", sa.String(300), nullable=False),
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(36), sa.ForeignKey("embedjob_runs.run_id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("worker", sa.String(128)),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        _ts("started_at"),
        _ts("finished_at", nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_embedjob_batch_attempts_batch", "embedjob_batch_attempts", ["job_key", "batch_id"])
    op.create_table(
        "embedjob_record_errors",
        sa.Column("run_id", sa.String(36), sa.ForeignKey("embedjob_runs.run_id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("position", sa.BigInteger, primary_key=True),
        sa.Column("job_key", sa.String(300), nullable=False, index=True),
        sa.Column("record_id", sa.Text),
        sa.Column("batch_id", sa.String(64)),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text),
        _ts("created_at", nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    for table in ("embedjob_record_errors", "embedjob_batch_attempts", "embedjob_batches", "embedjob_runs"):
        op.drop_table(table)
