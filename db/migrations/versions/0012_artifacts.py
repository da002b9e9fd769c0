"""Compiled kernels served with their configs: content-addressed blobs (sha256), and the
artifact sets (one Triton compile group each) tying them to the record that produced them and to
the compile fingerprint they load under. A record's deletion deletes its sets (ON DELETE CASCADE).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 13:30:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'ks_artifact_blobs',
        sa.Column('sha256', sa.String(64), nullable=False),
        sa.Column('size', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('sha256', name=op.f('pk_ks_artifact_blobs')),
    )
    op.create_table(
        'ks_artifact_sets',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('record_id', sa.Integer(), nullable=False),
        sa.Column('cache_key', sa.String(64), nullable=False),
        sa.Column('env_fingerprint', sa.String(64), nullable=False),
        sa.Column('env', sa.JSON(), nullable=False),
        sa.Column('group', sa.String(200), nullable=False),
        sa.Column('origin', sa.String(16), nullable=False),
        sa.Column('uploaded_by', sa.String(200), nullable=True),
        sa.Column('uploaded_from', sa.String(200), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['record_id'], ['ks_records.id'], ondelete='CASCADE',
                                name=op.f('fk_ks_artifact_sets_record_id_ks_records')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_ks_artifact_sets')),
        sa.UniqueConstraint('record_id', 'cache_key', 'env_fingerprint',
                            name=op.f('uq_ks_artifact_sets_record_id')),
    )
    op.create_index('ix_ks_artifact_sets_env_fingerprint', 'ks_artifact_sets', ['env_fingerprint'])
    op.create_index('ix_ks_artifact_sets_cache_key', 'ks_artifact_sets', ['cache_key'])
    op.create_table(
        'ks_artifact_files',
        sa.Column('set_id', sa.Integer(), nullable=False),
        sa.Column('filename', sa.String(200), nullable=False),
        sa.Column('sha256', sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(['set_id'], ['ks_artifact_sets.id'], ondelete='CASCADE',
                                name=op.f('fk_ks_artifact_files_set_id_ks_artifact_sets')),
        sa.ForeignKeyConstraint(['sha256'], ['ks_artifact_blobs.sha256'],
                                name=op.f('fk_ks_artifact_files_sha256_ks_artifact_blobs')),
        sa.PrimaryKeyConstraint('set_id', 'filename', name=op.f('pk_ks_artifact_files')),
    )
    op.create_index('ix_ks_artifact_files_sha256', 'ks_artifact_files', ['sha256'])


def downgrade() -> None:
    op.drop_table('ks_artifact_files')
    op.drop_table('ks_artifact_sets')
    op.drop_table('ks_artifact_blobs')
