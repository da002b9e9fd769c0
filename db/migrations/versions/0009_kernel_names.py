"""Kernel names of any length and script: `ks_kernels.name` widens to 1000 characters and the
store finds a kernel by `name_key`, the SHA-256 of its name (PostgreSQL's btree refuses an entry
past ~2.7 kB, so no index holds the name itself).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 09:45:00
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key(name: str) -> str:
    # db.checks.kernel_key, restated: a migration never imports the code it migrates for.
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()


def upgrade() -> None:
    with op.batch_alter_table('ks_kernels') as batch:
        batch.add_column(sa.Column('name_key', sa.String(length=64), nullable=True))
    kernels = sa.table('ks_kernels', sa.column('id', sa.Integer()), sa.column('name', sa.String()),
                       sa.column('name_key', sa.String()))
    conn = op.get_bind()
    for kid, name in conn.execute(sa.select(kernels.c.id, kernels.c.name)).all():
        conn.execute(kernels.update().where(kernels.c.id == kid).values(name_key=_key(name)))
    with op.batch_alter_table('ks_kernels') as batch:
        batch.alter_column('name_key', existing_type=sa.String(length=64), nullable=False)
        batch.drop_constraint('uq_ks_kernels_name', type_='unique')
        batch.alter_column('name', existing_type=sa.String(length=100),
                           type_=sa.String(length=1000), existing_nullable=False)
        batch.create_unique_constraint('uq_ks_kernels_name_key', ['name_key'])


def downgrade() -> None:
    with op.batch_alter_table('ks_kernels') as batch:
        batch.drop_constraint('uq_ks_kernels_name_key', type_='unique')
        batch.alter_column('name', existing_type=sa.String(length=1000),
                           type_=sa.String(length=100), existing_nullable=False)
        batch.create_unique_constraint('uq_ks_kernels_name', ['name'])
        batch.drop_column('name_key')
