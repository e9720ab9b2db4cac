"""Run leases and the error of a failed run.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

- run_leases: who is executing a run (pid, host, since, heartbeat, expiry); one row per run,
  see coevo/store/lease.py.
- runs.error: why a `failed` run failed.

Revisions are never edited once released: a schema change is a new revision.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0006'
down_revision: Union[str, Sequence[str], None] = '0005'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('error', sa.Text(), nullable=True))
    op.create_table(
        'run_leases',
        sa.Column('run_id', sa.String(64), sa.ForeignKey('runs.id'), primary_key=True),
        sa.Column('token', sa.String(64), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=False),
        sa.Column('host', sa.String(255), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('run_leases')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('error')
