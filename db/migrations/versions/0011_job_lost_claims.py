"""A job's lost claims: how many times a worker holding it went silent past its lease (died or
hung) and it was taken over, so that a job killing what runs it is failed at KS_JOB_MAX_CLAIMS
instead of claimed again for ever.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 09:45:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_jobs') as batch:
        batch.add_column(sa.Column('lost_claims', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('ks_jobs') as batch:
        batch.drop_column('lost_claims')
