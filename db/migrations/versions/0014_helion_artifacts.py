"""Helion's compiled kernels served with its entries: an artifact set belongs to a record or to a
Helion entry (exactly one; `helion_entry_id` ON DELETE CASCADE), so the Triton compile group of
the kernel Helion generated for an entry's config is withdrawn with that entry.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 14:50:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_artifact_sets') as batch:
        batch.alter_column('record_id', existing_type=sa.Integer(), nullable=True)
        batch.add_column(sa.Column('helion_entry_id', sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f('fk_ks_artifact_sets_helion_entry_id_ks_helion_entries'),
                                 'ks_helion_entries', ['helion_entry_id'], ['id'],
                                 ondelete='CASCADE')
        batch.create_unique_constraint(op.f('uq_ks_artifact_sets_helion_entry_id'),
                                       ['helion_entry_id', 'cache_key', 'env_fingerprint'])
        batch.create_check_constraint(
            'one_owner', sa.text('(record_id IS NULL) <> (helion_entry_id IS NULL)'))
        batch.create_index('ix_ks_artifact_sets_helion_entry_id', ['helion_entry_id'])


def downgrade() -> None:
    op.execute('DELETE FROM ks_artifact_sets WHERE record_id IS NULL')
    with op.batch_alter_table('ks_artifact_sets') as batch:
        batch.drop_index('ix_ks_artifact_sets_helion_entry_id')
        batch.drop_constraint(op.f('ck_ks_artifact_sets_one_owner'), type_='check')
        batch.drop_constraint(op.f('uq_ks_artifact_sets_helion_entry_id'), type_='unique')
        batch.drop_constraint(op.f('fk_ks_artifact_sets_helion_entry_id_ks_helion_entries'),
                              type_='foreignkey')
        batch.drop_column('helion_entry_id')
        batch.alter_column('record_id', existing_type=sa.Integer(), nullable=False)
