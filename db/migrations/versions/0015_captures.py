"""Calls an undeclared kernel's users tuned themselves (no job), kept per kernel so a search of
their keys has a call to run (`kernelsearch search --from-captures` for the default
policy, which queues no job).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 17:30:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0015'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'ks_captures',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('kernel_id', sa.Integer(), nullable=False),
        sa.Column('axes', sa.JSON(), nullable=False),
        sa.Column('axes_key', sa.String(500), nullable=False),
        sa.Column('digest', sa.String(64), nullable=False),
        sa.Column('capture', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['kernel_id'], ['ks_kernels.id'], ondelete='CASCADE',
                                name=op.f('fk_ks_captures_kernel_id_ks_kernels')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_captures')),
        sa.UniqueConstraint('kernel_id', 'digest', name=op.f('uq_ks_captures_kernel_id')),
    )
    op.create_index('ix_ks_captures_kernel_id', 'ks_captures', ['kernel_id'])


def downgrade() -> None:
    op.drop_table('ks_captures')
