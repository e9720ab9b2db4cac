"""Budget ledger and audit-query indexes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

- budgets: one row per charge (rollouts, tokens, proposer calls, seconds) of a run or round;
  totals are SUMs, so concurrent writers never race on a counter.
- ix_trajectories_harness_hash: "every trajectory of harness version X".
- ix_proposals_run_id_status: "pending proposals of run R".

Revisions are never edited once released: a schema change is a new revision. Types are spelled
out here rather than imported from coevo.store.tables, which keeps moving.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# JSONB on PostgreSQL, JSON (text) elsewhere.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table('budgets',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('run_id', sa.String(length=64), nullable=False),
        sa.Column('round', sa.Integer(), nullable=True),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('amount', sa.Float(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['run_id', 'round'], ['rounds.run_id', 'rounds.index'], name='fk_budgets_run_id_round_rounds'),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_budgets_run_id_runs'),
        sa.PrimaryKeyConstraint('id', name='pk_budgets')
    )
    op.create_index('ix_budgets_run_id_round', 'budgets', ['run_id', 'round'], unique=False)
    op.create_index('ix_proposals_run_id_status', 'proposals', ['run_id', 'status'], unique=False)
    op.create_index('ix_trajectories_harness_hash', 'trajectories', ['harness_hash'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_trajectories_harness_hash', table_name='trajectories')
    op.drop_index('ix_proposals_run_id_status', table_name='proposals')
    op.drop_index('ix_budgets_run_id_round', table_name='budgets')
    op.drop_table('budgets')
