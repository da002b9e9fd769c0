"""Records carry the references' latencies; trial summaries name the job that ran them.

The eager and torch.compile median latencies measured with a record are what its speedups are
ratios of; shipped with the record (export version 2) they keep the speedups computable. A trial's
job id links a failed job to its failed trials.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 10:05:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_records', schema=None) as batch_op:
        batch_op.add_column(sa.Column('eager_latency_us', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('compile_latency_us', sa.Float(), nullable=True))
    with op.batch_alter_table('ks_trials', schema=None) as batch_op:
        batch_op.add_column(sa.Column('job_id', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_ks_trials_job_id'), ['job_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('ks_trials', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ks_trials_job_id'))
        batch_op.drop_column('job_id')
    with op.batch_alter_table('ks_records', schema=None) as batch_op:
        batch_op.drop_column('compile_latency_us')
        batch_op.drop_column('eager_latency_us')
