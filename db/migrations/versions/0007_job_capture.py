"""A job's capture: the call an undeclared kernel's job tunes on (kernels.capture.Capture as JSON).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 10:05:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_jobs') as batch:
        batch.add_column(sa.Column('capture', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ks_jobs') as batch:
        batch.drop_column('capture')
