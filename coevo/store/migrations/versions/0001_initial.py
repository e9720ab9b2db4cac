"""Initial schema: assets, runs, rounds, checkpoints, trajectories, evaluations, proposals, decisions.

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-02

Every table of the audit store except the budget ledger (added by 0002).

Revisions are never edited once released: a schema change is a new revision. Types are spelled
out here rather than imported from coevo.store.tables, which keeps moving.
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# JSONB on PostgreSQL, JSON (text) elsewhere.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table('asset_versions',
        sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('hash', sa.String(length=64), nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('parent_hash', sa.String(length=64), nullable=True),
        sa.Column('content', JSON, nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['parent_hash'], ['asset_versions.hash'], name='fk_asset_versions_parent_hash_asset_versions'),
        sa.PrimaryKeyConstraint('seq', name='pk_asset_versions'),
        sa.UniqueConstraint('hash', name='uq_asset_versions_hash')
    )
    op.create_index('ix_asset_versions_kind_name', 'asset_versions', ['kind', 'name'], unique=False)
    op.create_index('ix_asset_versions_parent_hash', 'asset_versions', ['parent_hash'], unique=False)
    op.create_table('runs',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('config', JSON, nullable=False),
        sa.Column('mode', sa.String(length=32), nullable=False),
        sa.Column('status', sa.String(length=32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name='pk_runs'),
        sa.UniqueConstraint('name', name='uq_runs_name')
    )
    op.create_table('rounds',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('run_id', sa.String(length=64), nullable=False),
        sa.Column('index', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(length=32), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('summary', JSON, nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_rounds_run_id_runs'),
        sa.PrimaryKeyConstraint('id', name='pk_rounds'),
        sa.UniqueConstraint('run_id', 'index', name='uq_rounds_run_id_index')
    )
    op.create_table('skill_library_members',
        sa.Column('library_hash', sa.String(length=64), nullable=False),
        sa.Column('skill_hash', sa.String(length=64), nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(['library_hash'], ['asset_versions.hash'], name='fk_skill_library_members_library_hash_asset_versions'),
        sa.ForeignKeyConstraint(['skill_hash'], ['asset_versions.hash'], name='fk_skill_library_members_skill_hash_asset_versions'),
        sa.PrimaryKeyConstraint('library_hash', 'skill_hash', name='pk_skill_library_members')
    )
    op.create_index('ix_skill_library_members_skill_hash', 'skill_library_members', ['skill_hash'], unique=False)
    op.create_table('checkpoints',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('run_id', sa.String(length=64), nullable=True),
        sa.Column('round', sa.Integer(), nullable=True),
        sa.Column('path', sa.Text(), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('base_model', sa.String(length=300), nullable=False),
        sa.Column('step', sa.Integer(), nullable=False),
        sa.Column('parent_id', sa.String(length=64), nullable=True),
        sa.Column('harness_hash', sa.String(length=64), nullable=True),
        sa.Column('skill_library_hash', sa.String(length=64), nullable=True),
        sa.Column('rubric_hash', sa.String(length=64), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['harness_hash'], ['asset_versions.hash'], name='fk_checkpoints_harness_hash_asset_versions'),
        sa.ForeignKeyConstraint(['parent_id'], ['checkpoints.id'], name='fk_checkpoints_parent_id_checkpoints'),
        sa.ForeignKeyConstraint(['rubric_hash'], ['asset_versions.hash'], name='fk_checkpoints_rubric_hash_asset_versions'),
        sa.ForeignKeyConstraint(['run_id', 'round'], ['rounds.run_id', 'rounds.index'], name='fk_checkpoints_run_id_round_rounds'),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_checkpoints_run_id_runs'),
        sa.ForeignKeyConstraint(['skill_library_hash'], ['asset_versions.hash'], name='fk_checkpoints_skill_library_hash_asset_versions'),
        sa.PrimaryKeyConstraint('id', name='pk_checkpoints')
    )
    op.create_index('ix_checkpoints_run_id', 'checkpoints', ['run_id'], unique=False)
    op.create_index('ix_checkpoints_sha256', 'checkpoints', ['sha256'], unique=False)
    op.create_table('proposals',
        sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('run_id', sa.String(length=64), nullable=True),
        sa.Column('round', sa.Integer(), nullable=True),
        sa.Column('proposer', sa.String(length=100), nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('parent_hash', sa.String(length=64), nullable=True),
        sa.Column('candidate_hash', sa.String(length=64), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('rationale', sa.Text(), nullable=False),
        sa.Column('predicted_effect', sa.Text(), nullable=False),
        sa.Column('prompt', sa.Text(), nullable=False),
        sa.Column('raw_output', sa.Text(), nullable=False),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('diff', JSON, nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['candidate_hash'], ['asset_versions.hash'], name='fk_proposals_candidate_hash_asset_versions'),
        sa.ForeignKeyConstraint(['parent_hash'], ['asset_versions.hash'], name='fk_proposals_parent_hash_asset_versions'),
        sa.ForeignKeyConstraint(['run_id', 'round'], ['rounds.run_id', 'rounds.index'], name='fk_proposals_run_id_round_rounds'),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_proposals_run_id_runs'),
        sa.PrimaryKeyConstraint('seq', name='pk_proposals'),
        sa.UniqueConstraint('id', name='uq_proposals_id')
    )
    op.create_table('decisions',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('proposal_id', sa.String(length=64), nullable=False),
        sa.Column('policy', sa.String(length=100), nullable=False),
        sa.Column('accepted', sa.Boolean(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('statistic', JSON, nullable=False),
        sa.Column('rollouts', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['proposal_id'], ['proposals.id'], name='fk_decisions_proposal_id_proposals'),
        sa.PrimaryKeyConstraint('id', name='pk_decisions')
    )
    op.create_index('ix_decisions_proposal_id', 'decisions', ['proposal_id'], unique=False)
    op.create_table('evaluations',
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('run_id', sa.String(length=64), nullable=True),
        sa.Column('round', sa.Integer(), nullable=True),
        sa.Column('split', sa.String(length=16), nullable=False),
        sa.Column('env', sa.String(length=200), nullable=False),
        sa.Column('harness_hash', sa.String(length=64), nullable=True),
        sa.Column('skill_library_hash', sa.String(length=64), nullable=True),
        sa.Column('rubric_hash', sa.String(length=64), nullable=True),
        sa.Column('checkpoint_id', sa.String(length=64), nullable=True),
        sa.Column('n', sa.Integer(), nullable=False),
        sa.Column('summary', JSON, nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'], name='fk_evaluations_checkpoint_id_checkpoints'),
        sa.ForeignKeyConstraint(['harness_hash'], ['asset_versions.hash'], name='fk_evaluations_harness_hash_asset_versions'),
        sa.ForeignKeyConstraint(['rubric_hash'], ['asset_versions.hash'], name='fk_evaluations_rubric_hash_asset_versions'),
        sa.ForeignKeyConstraint(['run_id', 'round'], ['rounds.run_id', 'rounds.index'], name='fk_evaluations_run_id_round_rounds'),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_evaluations_run_id_runs'),
        sa.ForeignKeyConstraint(['skill_library_hash'], ['asset_versions.hash'], name='fk_evaluations_skill_library_hash_asset_versions'),
        sa.PrimaryKeyConstraint('id', name='pk_evaluations')
    )
    op.create_index('ix_evaluations_run_id', 'evaluations', ['run_id'], unique=False)
    op.create_table('evidence',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('decision_id', sa.String(length=64), nullable=False),
        sa.Column('proposal_id', sa.String(length=64), nullable=False),
        sa.Column('task_id', sa.String(length=300), nullable=False),
        sa.Column('sample', sa.Integer(), nullable=False),
        sa.Column('incumbent', sa.Float(), nullable=True),
        sa.Column('candidate', sa.Float(), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(['decision_id'], ['decisions.id'], name='fk_evidence_decision_id_decisions'),
        sa.ForeignKeyConstraint(['proposal_id'], ['proposals.id'], name='fk_evidence_proposal_id_proposals'),
        sa.PrimaryKeyConstraint('id', name='pk_evidence')
    )
    op.create_index('ix_evidence_decision_id', 'evidence', ['decision_id'], unique=False)
    op.create_table('trajectories',
        sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('id', sa.String(length=64), nullable=False),
        sa.Column('run_id', sa.String(length=64), nullable=True),
        sa.Column('round', sa.Integer(), nullable=True),
        sa.Column('evaluation_id', sa.String(length=64), nullable=True),
        sa.Column('env', sa.String(length=200), nullable=False),
        sa.Column('task_id', sa.String(length=300), nullable=False),
        sa.Column('split', sa.String(length=16), nullable=False),
        sa.Column('group_id', sa.String(length=64), nullable=True),
        sa.Column('sample_index', sa.Integer(), nullable=False),
        sa.Column('seed', sa.BigInteger(), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('answer', sa.Text(), nullable=True),
        sa.Column('outcome', sa.Float(), nullable=True),
        sa.Column('success', sa.Boolean(), nullable=False),
        sa.Column('reward', sa.Float(), nullable=True),
        sa.Column('criteria', JSON, nullable=False),
        sa.Column('messages', JSON, nullable=False),
        sa.Column('turns', JSON, nullable=False),
        sa.Column('token_ids', sa.LargeBinary(), nullable=False),
        sa.Column('loss_mask', sa.LargeBinary(), nullable=False),
        sa.Column('logprobs', sa.LargeBinary(), nullable=False),
        sa.Column('n_tokens', sa.Integer(), nullable=False),
        sa.Column('prompt_len', sa.Integer(), nullable=False),
        sa.Column('trainable', sa.Boolean(), nullable=False),
        sa.Column('active_skills', JSON, nullable=False),
        sa.Column('harness_hash', sa.String(length=64), nullable=True),
        sa.Column('skill_library_hash', sa.String(length=64), nullable=True),
        sa.Column('rubric_hash', sa.String(length=64), nullable=True),
        sa.Column('checkpoint_id', sa.String(length=64), nullable=True),
        sa.Column('model', sa.String(length=300), nullable=False),
        sa.Column('timings', JSON, nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'], name='fk_trajectories_checkpoint_id_checkpoints'),
        sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], name='fk_trajectories_evaluation_id_evaluations'),
        sa.ForeignKeyConstraint(['harness_hash'], ['asset_versions.hash'], name='fk_trajectories_harness_hash_asset_versions'),
        sa.ForeignKeyConstraint(['rubric_hash'], ['asset_versions.hash'], name='fk_trajectories_rubric_hash_asset_versions'),
        sa.ForeignKeyConstraint(['run_id', 'round'], ['rounds.run_id', 'rounds.index'], name='fk_trajectories_run_id_round_rounds'),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_trajectories_run_id_runs'),
        sa.ForeignKeyConstraint(['skill_library_hash'], ['asset_versions.hash'], name='fk_trajectories_skill_library_hash_asset_versions'),
        sa.PrimaryKeyConstraint('seq', name='pk_trajectories'),
        sa.UniqueConstraint('id', name='uq_trajectories_id')
    )
    op.create_index('ix_trajectories_evaluation_id', 'trajectories', ['evaluation_id'], unique=False)
    op.create_index('ix_trajectories_run_id_round', 'trajectories', ['run_id', 'round'], unique=False)
    op.create_table('evaluation_results',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('evaluation_id', sa.String(length=64), nullable=False),
        sa.Column('task_id', sa.String(length=300), nullable=False),
        sa.Column('sample', sa.Integer(), nullable=False),
        sa.Column('outcome', sa.Float(), nullable=True),
        sa.Column('success', sa.Boolean(), nullable=False),
        sa.Column('reward', sa.Float(), nullable=True),
        sa.Column('criteria', JSON, nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('trajectory_id', sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], name='fk_evaluation_results_evaluation_id_evaluations'),
        sa.ForeignKeyConstraint(['trajectory_id'], ['trajectories.id'], name='fk_evaluation_results_trajectory_id_trajectories'),
        sa.PrimaryKeyConstraint('id', name='pk_evaluation_results'),
        sa.UniqueConstraint('evaluation_id', 'task_id', 'sample', name='uq_evaluation_results_evaluation_id_task_id_sample')
    )


def downgrade() -> None:
    op.drop_table('evaluation_results')
    op.drop_table('trajectories')
    op.drop_table('evidence')
    op.drop_table('evaluations')
    op.drop_table('decisions')
    op.drop_table('proposals')
    op.drop_table('checkpoints')
    op.drop_table('skill_library_members')
    op.drop_table('rounds')
    op.drop_table('runs')
    op.drop_table('asset_versions')
