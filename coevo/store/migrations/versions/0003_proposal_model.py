"""Proposals record the proposer's model.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

- proposals.model: the model an LLM proposer ran on (backend spec or served model name; empty
  for proposers without a model, e.g. demos), so a reviewer can tell which model wrote what.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa

revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('proposals') as batch:
        batch.add_column(sa.Column('model', sa.String(length=200), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('proposals') as batch:
        batch.drop_column('model')
