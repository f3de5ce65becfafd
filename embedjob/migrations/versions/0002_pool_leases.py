"""Leases of detached actor pools on shared Ray clusters.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _ts(name, **kw):
    return sa.Column(name, sa.DateTime(timezone=True), **kw)


def upgrade() -> None:
    op.create_table(
        "embedjob_pool_leases",
        sa.Column("lease_id", sa.String(36), primary_key=True),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("cluster", sa.String(317), nullable=False),
        sa.Column("job_key", sa.String(300), nullable=False),
        sa.Column("job_name", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("actors", sa.Integer, nullable=False),
        _ts("acquired_at", nullable=False, server_default=sa.func.now()),
        _ts("heartbeat_at", nullable=False, server_default=sa.func.now()),
        _ts("released_at"),
        _ts("pool_removed_at"),
    )
    op.create_index("ix_embedjob_pool_leases_pool", "embedjob_pool_leases", ["cluster", "pool"])


def downgrade() -> None:
    op.drop_table("embedjob_pool_leases")
