"""Idempotency keys enforced by unique indexes; what the gate decided on.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

A crash and resume must write nothing twice (coevo/loop.py, "Resume"):
- budgets.key + a unique index on (run_id, kind, key): a charge is recorded once per key (an RL step, a
  gate arm's evaluation, a round's proposals), however often the work is redone.
- evaluations.key, unique: a gate arm's evaluation (run, round, assets, checkpoint, tasks and
  seeds); a resumed round reuses it instead of running the episodes again.
- unique proposals (run_id, round, proposer, candidate_hash): the proposal's idempotency key.
- unique decisions (proposal_id): one verdict per proposal.
Audit of the soft gate and the sequential stages:
- evidence.incumbent_partial / candidate_partial: the per-task partial credit of each arm.
- decisions.metric (outcome | partial | auc) and decisions.stages (JSON list of the sequential
  comparison's stage records; the last one is the stop the reason cites).

Revisions are never edited once released: a schema change is a new revision.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision: str = '0004'
down_revision: Union[str, Sequence[str], None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    # Unique indexes, not constraints: SQLite adds an index in place, while a constraint makes
    # batch mode recreate the table, which foreign keys from other tables' rows forbid.
    with op.batch_alter_table('budgets') as batch:
        batch.add_column(sa.Column('key', sa.String(length=200), nullable=True))
    op.create_index('uq_budgets_run_id_kind_key', 'budgets', ['run_id', 'kind', 'key'], unique=True)
    with op.batch_alter_table('evaluations') as batch:
        batch.add_column(sa.Column('key', sa.String(length=64), nullable=True))
    op.create_index('uq_evaluations_key', 'evaluations', ['key'], unique=True)
    op.create_index('uq_proposals_run_id_round_proposer_candidate_hash', 'proposals',
                    ['run_id', 'round', 'proposer', 'candidate_hash'], unique=True)
    with op.batch_alter_table('decisions') as batch:
        batch.add_column(sa.Column('metric', sa.String(length=16), nullable=False, server_default=''))
        batch.add_column(sa.Column('stages', JSON, nullable=True))
    op.create_index('uq_decisions_proposal_id', 'decisions', ['proposal_id'], unique=True)
    with op.batch_alter_table('evidence') as batch:
        batch.add_column(sa.Column('incumbent_partial', sa.Float(), nullable=True))
        batch.add_column(sa.Column('candidate_partial', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evidence') as batch:
        batch.drop_column('candidate_partial')
        batch.drop_column('incumbent_partial')
    op.drop_index('uq_decisions_proposal_id', table_name='decisions')
    with op.batch_alter_table('decisions') as batch:
        batch.drop_column('stages')
        batch.drop_column('metric')
    op.drop_index('uq_proposals_run_id_round_proposer_candidate_hash', table_name='proposals')
    op.drop_index('uq_evaluations_key', table_name='evaluations')
    with op.batch_alter_table('evaluations') as batch:
        batch.drop_column('key')
    op.drop_index('uq_budgets_run_id_kind_key', table_name='budgets')
    with op.batch_alter_table('budgets') as batch:
        batch.drop_column('key')
