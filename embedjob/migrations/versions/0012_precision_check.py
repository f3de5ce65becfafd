"""A reduced precision's check against float32 (spec.model.minCosine), two columns as api.RunCounters has them.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("precision_cosine_mean", sa.Float))
    op.add_column("embedjob_runs", sa.Column("precision_cosine_min", sa.Float))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "precision_cosine_min")
    op.drop_column("embedjob_runs", "precision_cosine_mean")
