"""Initial schema: devices, kernels, cases, jobs, records with history, trial summaries, counters.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 20:23:24.175609
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('ks_counters',
    sa.Column('name', sa.String(length=32), nullable=False),
    sa.Column('value', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_ks_counters'))
    )
    op.create_table('ks_devices',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('compute_capability', sa.String(length=16), nullable=True),
    sa.Column('memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('multiprocessors', sa.Integer(), nullable=True),
    sa.Column('cuda_version', sa.String(length=32), nullable=True),
    sa.Column('driver_version', sa.String(length=32), nullable=True),
    sa.Column('interpreter', sa.Boolean(), nullable=False),
    sa.Column('info', sa.JSON(), nullable=True),
    sa.Column('first_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_devices')),
    sa.UniqueConstraint('name', name=op.f('uq_ks_devices_name'))
    )
    op.create_table('ks_kernels',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_kernels')),
    sa.UniqueConstraint('name', name=op.f('uq_ks_kernels_name'))
    )
    op.create_table('ks_cases',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kernel_id', sa.Integer(), nullable=False),
    sa.Column('axes', sa.JSON(), nullable=False),
    sa.Column('axes_key', sa.String(length=500), nullable=False),
    sa.Column('work', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['kernel_id'], ['ks_kernels.id'], name=op.f('fk_ks_cases_kernel_id_ks_kernels'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_cases')),
    sa.UniqueConstraint('kernel_id', 'axes_key', name=op.f('uq_ks_cases_kernel_id'))
    )
    op.create_table('ks_jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kernel_id', sa.Integer(), nullable=False),
    sa.Column('cases', sa.JSON(), nullable=False),
    sa.Column('n_trials', sa.Integer(), nullable=False),
    sa.Column('sampler', sa.String(length=32), nullable=False),
    sa.Column('timeout_s', sa.Float(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('trials_done', sa.Integer(), nullable=False),
    sa.Column('device', sa.String(length=200), nullable=True),
    sa.Column('best', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('owner', sa.String(length=200), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('current_case', sa.JSON(), nullable=True),
    sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name=op.f('ck_ks_jobs_status')),
    sa.ForeignKeyConstraint(['kernel_id'], ['ks_kernels.id'], name=op.f('fk_ks_jobs_kernel_id_ks_kernels')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_jobs'))
    )
    with op.batch_alter_table('ks_jobs', schema=None) as batch_op:
        batch_op.create_index('ix_ks_jobs_status_id', ['status', 'id'], unique=False)

    op.create_table('ks_records',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kernel_id', sa.Integer(), nullable=False),
    sa.Column('case_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('device_info', sa.JSON(), nullable=True),
    sa.Column('torch_version', sa.String(length=64), nullable=False),
    sa.Column('triton_version', sa.String(length=64), nullable=False),
    sa.Column('source_hash', sa.String(length=128), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('latency_median_us', sa.Float(), nullable=False),
    sa.Column('latency_min_us', sa.Float(), nullable=False),
    sa.Column('latency_max_us', sa.Float(), nullable=False),
    sa.Column('latency_iqr_us', sa.Float(), nullable=False),
    sa.Column('timing_method', sa.String(length=32), nullable=False),
    sa.Column('roofline_pct', sa.Float(), nullable=True),
    sa.Column('speedup_eager', sa.Float(), nullable=True),
    sa.Column('speedup_compile', sa.Float(), nullable=True),
    sa.Column('rel_error', sa.Float(), nullable=False),
    sa.Column('n_trials', sa.Integer(), nullable=False),
    sa.Column('n_failed', sa.Integer(), nullable=False),
    sa.Column('study_name', sa.String(length=300), nullable=True),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('tuned_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('is_current', sa.Boolean(), nullable=False),
    sa.Column('superseded_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('superseded_by', sa.Integer(), nullable=True),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['case_id'], ['ks_cases.id'], name=op.f('fk_ks_records_case_id_ks_cases')),
    sa.ForeignKeyConstraint(['device_id'], ['ks_devices.id'], name=op.f('fk_ks_records_device_id_ks_devices')),
    sa.ForeignKeyConstraint(['kernel_id'], ['ks_kernels.id'], name=op.f('fk_ks_records_kernel_id_ks_kernels')),
    sa.ForeignKeyConstraint(['superseded_by'], ['ks_records.id'], name=op.f('fk_ks_records_superseded_by_ks_records')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_records')),
    sa.UniqueConstraint('fingerprint', name=op.f('uq_ks_records_fingerprint'))
    )
    with op.batch_alter_table('ks_records', schema=None) as batch_op:
        batch_op.create_index('ix_ks_records_kernel_device', ['kernel_id', 'device_id', 'is_current'], unique=False)
        batch_op.create_index('uq_ks_records_current', ['case_id', 'device_id'], unique=True, sqlite_where=sa.text('is_current = 1'), postgresql_where=sa.text('is_current'))

    op.create_table('ks_trials',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('study_name', sa.String(length=300), nullable=False),
    sa.Column('trial_number', sa.Integer(), nullable=False),
    sa.Column('kernel_id', sa.Integer(), nullable=False),
    sa.Column('case_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('latency_median_us', sa.Float(), nullable=True),
    sa.Column('failure_kind', sa.String(length=32), nullable=True),
    sa.Column('message', sa.Text(), nullable=True),
    sa.Column('extra', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['case_id'], ['ks_cases.id'], name=op.f('fk_ks_trials_case_id_ks_cases')),
    sa.ForeignKeyConstraint(['device_id'], ['ks_devices.id'], name=op.f('fk_ks_trials_device_id_ks_devices')),
    sa.ForeignKeyConstraint(['kernel_id'], ['ks_kernels.id'], name=op.f('fk_ks_trials_kernel_id_ks_kernels')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_trials')),
    sa.UniqueConstraint('study_name', 'trial_number', name=op.f('uq_ks_trials_study_name'))
    )
    with op.batch_alter_table('ks_trials', schema=None) as batch_op:
        batch_op.create_index('ix_ks_trials_case_device', ['case_id', 'device_id'], unique=False)

    counters = sa.table('ks_counters', sa.column('name', sa.String), sa.column('value', sa.BigInteger))
    op.bulk_insert(counters, [{'name': 'records', 'value': 0}, {'name': 'jobs', 'value': 0}])



def downgrade() -> None:
    with op.batch_alter_table('ks_trials', schema=None) as batch_op:
        batch_op.drop_index('ix_ks_trials_case_device')

    op.drop_table('ks_trials')
    with op.batch_alter_table('ks_records', schema=None) as batch_op:
        batch_op.drop_index('uq_ks_records_current', sqlite_where=sa.text('is_current = 1'), postgresql_where=sa.text('is_current'))
        batch_op.drop_index('ix_ks_records_kernel_device')

    op.drop_table('ks_records')
    with op.batch_alter_table('ks_jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_ks_jobs_status_id')

    op.drop_table('ks_jobs')
    op.drop_table('ks_cases')
    op.drop_table('ks_kernels')
    op.drop_table('ks_devices')
    op.drop_table('ks_counters')
