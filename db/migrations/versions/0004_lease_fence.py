"""Fenced leases: a study claim remembers the attempt of the job lease it was taken under, so a
worker whose lease was claimed again can no longer write to the study.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 04:15:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Claims held while upgrading have no attempt: they match no lease, and go stale.
    with op.batch_alter_table('ks_study_claims') as batch:
        batch.add_column(sa.Column('job_attempt', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ks_study_claims') as batch:
        batch.drop_column('job_attempt')
