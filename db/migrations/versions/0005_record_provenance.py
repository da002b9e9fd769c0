"""Record provenance: where a record came from (worker, upload, import), who uploaded it, from
which host. Records stored before are a worker's or an import's; they become "worker", so an
upload never outranks them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 04:15:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_records', schema=None) as batch_op:
        batch_op.add_column(sa.Column('origin', sa.String(length=16), server_default='worker',
                                      nullable=False))
        batch_op.add_column(sa.Column('uploaded_by', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('uploaded_from', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ks_records', schema=None) as batch_op:
        batch_op.drop_column('uploaded_from')
        batch_op.drop_column('uploaded_by')
        batch_op.drop_column('origin')
