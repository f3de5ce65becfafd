"""The document prompt a run embedded its texts with (spec.model.prompt, or the model's own), as status.progress.prompt
shows it.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("embedjob_runs", sa.Column("prompt", sa.Text))


def downgrade() -> None:
    op.drop_column("embedjob_runs", "prompt")
