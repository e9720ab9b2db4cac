"""Trajectories record the trainer step of the weights that sampled them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

- trajectories.policy_step: trainer steps applied to the policy when an RL rollout was sampled
  (None outside the RL stage). `checkpoint_id` names the newest stored checkpoint the policy
  descends from; with the step, the exact weights are that checkpoint when its step equals
  `policy_step`, else it plus the run's stored updates up to `policy_step`.

Revisions are never edited once released: a schema change is a new revision.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('trajectories') as batch:
        batch.add_column(sa.Column('policy_step', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('trajectories') as batch:
        batch.drop_column('policy_step')
