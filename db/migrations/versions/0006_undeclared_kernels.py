"""Undeclared kernels and per-config timings: a kernel's definition (what the decorator tells of
a kernel with no declaration) and the median of every config measured with a record.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 04:15:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_kernels') as batch:
        batch.add_column(sa.Column('definition', sa.JSON(), nullable=True))
    with op.batch_alter_table('ks_records') as batch:
        batch.add_column(sa.Column('config_timings', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ks_records') as batch:
        batch.drop_column('config_timings')
    with op.batch_alter_table('ks_kernels') as batch:
        batch.drop_column('definition')
