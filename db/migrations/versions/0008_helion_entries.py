"""Helion's autotune cache entries (`kernelsearch.helion`), under Helion's own cache keys.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 10:00:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('ks_helion_entries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cache_key', sa.String(length=64), nullable=False),
    sa.Column('kernel', sa.String(length=300), nullable=False),
    sa.Column('hardware', sa.String(length=200), nullable=False),
    sa.Column('specialization_key', sa.Text(), nullable=False),
    sa.Column('axes', sa.JSON(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('data', sa.Text(), nullable=False),
    sa.Column('kernel_source_hash', sa.String(length=128), nullable=False),
    sa.Column('runtime_name', sa.String(length=200), nullable=False),
    sa.Column('backend', sa.String(length=64), nullable=False),
    sa.Column('key_type', sa.String(length=64), nullable=False),
    sa.Column('checked_by', sa.String(length=64), nullable=False),
    sa.Column('uploaded_by', sa.String(length=200), nullable=True),
    sa.Column('uploaded_from', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_helion_entries')),
    sa.UniqueConstraint('cache_key', name=op.f('uq_ks_helion_entries_cache_key'))
    )
    op.create_index('ix_ks_helion_entries_updated_at', 'ks_helion_entries', ['updated_at'], unique=False)
    op.create_index(op.f('ix_ks_helion_entries_kernel'), 'ks_helion_entries', ['kernel'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_ks_helion_entries_kernel'), table_name='ks_helion_entries')
    op.drop_index('ix_ks_helion_entries_updated_at', table_name='ks_helion_entries')
    op.drop_table('ks_helion_entries')
