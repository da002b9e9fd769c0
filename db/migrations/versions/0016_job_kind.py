"""A job's kind (statuses.JobKind: declared, capture, search, helion), the worker's dispatch,
set at submission. Jobs queued before are given the kind their sampler and capture said.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 17:00:00
"""
from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The kinds and their rule as this revision knows them (statuses.job_kind may grow).
KINDS = ('declared', 'capture', 'search', 'helion')


def _kind(sampler: str, capture: object) -> str:
    if isinstance(capture, str):
        capture = json.loads(capture)
    if capture is None:
        return 'declared'
    if isinstance(capture, dict) and capture.get('kind') == 'helion':
        return 'helion'
    return 'search' if sampler == 'search' else 'capture'


def upgrade() -> None:
    with op.batch_alter_table('ks_jobs') as batch:
        batch.add_column(sa.Column('kind', sa.String(length=16), nullable=True))
    jobs = sa.table('ks_jobs', sa.column('id', sa.Integer()), sa.column('sampler', sa.String()),
                    sa.column('capture', sa.JSON()), sa.column('kind', sa.String()))
    conn = op.get_bind()
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.sampler, jobs.c.capture)).all()
    for job_id, sampler, capture in rows:
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(kind=_kind(sampler, capture)))
    with op.batch_alter_table('ks_jobs') as batch:
        batch.alter_column('kind', existing_type=sa.String(length=16), nullable=False)
        batch.create_check_constraint('kind', sa.text(f"kind IN ({', '.join(repr(k) for k in KINDS)})"))


def downgrade() -> None:
    with op.batch_alter_table('ks_jobs') as batch:
        batch.drop_constraint(op.f('ck_ks_jobs_kind'), type_='check')
        batch.drop_column('kind')
