"""A record's winner origin (the kernel's config list, or a search beyond it) and a searched
winner's gain over the list's best. Records stored before are the list's.

Revision ID: 0013_search_origin
Revises: 0012_artifacts
Create Date: 2026-12-03 13:30:00
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('ks_records') as batch:
        batch.add_column(sa.Column('winner_origin', sa.String(length=16), nullable=False,
                                   server_default='list'))
        batch.add_column(sa.Column('gain_vs_list', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ks_records') as batch:
        batch.drop_column('gain_vs_list')
        batch.drop_column('winner_origin')
