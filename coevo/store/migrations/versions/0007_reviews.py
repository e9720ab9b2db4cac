"""Human reviews of the candidates a run holds for review (`gate.human_review`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

- reviews: who approved or vetoed which proposal, when, with a note (one per proposal).
- decisions: unique per (proposal, policy) instead of per proposal, so the review's
  application (policy "review") is a decision next to the gate's own, each still written once.

Revisions are never edited once released: a schema change is a new revision.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0007'
down_revision: Union[str, Sequence[str], None] = '0006'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        'reviews',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('proposal_id', sa.String(length=64), nullable=False),
        sa.Column('reviewer', sa.String(length=200), nullable=False),
        sa.Column('decision', sa.String(length=16), nullable=False),
        sa.Column('note', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['proposal_id'], ['proposals.id'],
                                name=op.f('fk_reviews_proposal_id_proposals')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_reviews')),
        sa.UniqueConstraint('proposal_id', name=op.f('uq_reviews_proposal_id')),
    )
    op.drop_index('uq_decisions_proposal_id', table_name='decisions')
    op.create_index('uq_decisions_proposal_id_policy', 'decisions', ['proposal_id', 'policy'],
                    unique=True)


def downgrade() -> None:
    op.drop_index('uq_decisions_proposal_id_policy', table_name='decisions')
    op.create_index('uq_decisions_proposal_id', 'decisions', ['proposal_id'], unique=True)
    op.drop_table('reviews')
