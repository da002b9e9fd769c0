"""Study claims: the worker tuning a study holds its row, so one study is tuned by one worker.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 10:10:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('ks_study_claims',
    sa.Column('study_name', sa.String(length=300), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('study_name', name=op.f('pk_ks_study_claims'))
    )


def downgrade() -> None:
    op.drop_table('ks_study_claims')
