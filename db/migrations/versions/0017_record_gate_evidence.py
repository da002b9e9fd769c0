"""A searched winner's evidence, so a client can decide to serve it from the record alone: the
lower bound of its re-measured gain over the list's best, and how many edge calls of the key the
strict gate ran it on (null: no strict gate ran, as for every record stored before).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 16:50:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0017'
down_revision: str | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_records') as batch:
        batch.add_column(sa.Column('gain_low', sa.Float(), nullable=True))
        batch.add_column(sa.Column('gate_edges', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ks_records') as batch:
        batch.drop_column('gate_edges')
        batch.drop_column('gain_low')
