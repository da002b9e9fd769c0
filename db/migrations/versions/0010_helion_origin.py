"""Helion entries' provenance: a worker's tuning or an upload, so an upload never replaces a
worker's entry. Entries stored before are uploads, but those a worker stored (its `uploaded_by`
is "worker <owner>").

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 10:00:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_helion_entries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('origin', sa.String(length=16), server_default='upload',
                                      nullable=False))
    op.execute("UPDATE ks_helion_entries SET origin = 'worker' WHERE uploaded_by LIKE 'worker %'")


def downgrade() -> None:
    with op.batch_alter_table('ks_helion_entries', schema=None) as batch_op:
        batch_op.drop_column('origin')
