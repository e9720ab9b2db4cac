"""The SQL schema of coevo's audit store (SQLAlchemy 2 declarative ORM).

Rows are append-only in spirit: an asset version, trajectory, result, decision or evidence row
is written once and never updated. Only lifecycle fields change (run / round / proposal status,
an evaluation's summary once its results are in).

Conventions:
- Asset versions are identified by their content hash (`asset_versions.hash`, sha256 hex);
  every table that says "which harness / skill library / rubric" holds that hash, with a
  foreign key, so a trajectory cannot claim a version the store does not have.
- A round is addressed by `(run_id, round)`, a composite foreign key to `rounds(run_id,
  index)`; with `round` NULL the row belongs to the run as a whole (or to nothing, for ad-hoc
  evaluations), and SQL's MATCH SIMPLE leaves such a key unchecked.
- Per-token arrays are packed blobs (see coevo/store/codec.py), never one row per token.
- Integer surrogate keys (`seq`) give an unambiguous insertion order where timestamps can tie
  ("the latest version with this name", trajectories in the order they were added); the
  public identifier (`hash`, `id`) is a unique column next to it.

The alembic revisions under migrations/versions/ build exactly this schema; tests/
test_migrations.py compares the two, so a change here needs a new revision.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# JSONB on PostgreSQL (indexable, compact), JSON (text) elsewhere.
JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
HASH = sa.String(64)  # sha256 hex
ID = sa.String(64)  # uuid4 hex by default; callers may supply their own ids


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(sa.TypeDecorator):
    """Timezone-aware UTC datetimes on every backend. SQLite keeps no zone, so values read back
    naive are re-labelled UTC (everything is written in UTC)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use timezone-aware UTC")
        return value.astimezone(timezone.utc) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


# Unique keys added after revision 0001 are unique INDEXES (named uq_...): SQLite can add an
# index in place, while a new constraint would make batch mode recreate the table, which fails
# with foreign keys on once other tables' rows refer to it.
# Stable constraint names: alembic needs them to alter or drop constraints later (SQLite batch
# mode recreates tables by name).
NAMING = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


def _created() -> Mapped[datetime]:
    return mapped_column(UTCDateTime(), default=utcnow, nullable=False)


def _asset_fk(nullable: bool = True) -> Mapped[Any]:
    return mapped_column(HASH, sa.ForeignKey("asset_versions.hash"), nullable=nullable)


def _round_fk() -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["run_id", "round"], ["rounds.run_id", "rounds.index"])


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    config: Mapped[dict] = mapped_column(JSONType, default=dict)
    mode: Mapped[str] = mapped_column(sa.String(32))  # gated | ungated | weight-only | harness-only
    status: Mapped[str] = mapped_column(sa.String(32))  # created | running | done | failed ...
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    # 0006: why a `failed` run failed ("ExceptionClass: message"); cleared when it is resumed.
    error: Mapped[str | None] = mapped_column(sa.Text)


class RunLease(Base):
    """0006: who is executing a run (coevo/store/lease.py). One row per leased run; on SQLite
    the row IS the lease (taken in one transaction, renewed by a heartbeat, stale once expired
    or its process is gone), on PostgreSQL an advisory lock is and the row says who holds it."""

    __tablename__ = "run_leases"
    run_id: Mapped[str] = mapped_column(ID, sa.ForeignKey("runs.id"), primary_key=True)
    token: Mapped[str] = mapped_column(ID)  # the holder's random id: only it renews or releases
    pid: Mapped[int] = mapped_column(sa.Integer)
    host: Mapped[str] = mapped_column(sa.String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Round(Base):
    __tablename__ = "rounds"
    __table_args__ = (sa.UniqueConstraint("run_id", "index"),)
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ID, sa.ForeignKey("runs.id"))
    index: Mapped[int] = mapped_column(sa.Integer)
    status: Mapped[str] = mapped_column(sa.String(32))  # running | done | failed
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    summary: Mapped[dict] = mapped_column(JSONType, default=dict)


class AssetVersion(Base):
    __tablename__ = "asset_versions"
    __table_args__ = (sa.Index("ix_asset_versions_kind_name", "kind", "name"),)
    seq: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    hash: Mapped[str] = mapped_column(HASH, unique=True)
    kind: Mapped[str] = mapped_column(sa.String(32))
    name: Mapped[str] = mapped_column(sa.String(200))
    # Lineage. The parent must be stored first (a foreign key), so ancestry never dangles.
    parent_hash: Mapped[str | None] = mapped_column(
        HASH, sa.ForeignKey("asset_versions.hash"), index=True
    )
    content: Mapped[dict] = mapped_column(JSONType)
    created_at: Mapped[datetime] = _created()


class SkillLibraryMember(Base):
    __tablename__ = "skill_library_members"
    library_hash: Mapped[str] = mapped_column(
        HASH, sa.ForeignKey("asset_versions.hash"), primary_key=True
    )
    skill_hash: Mapped[str] = mapped_column(
        HASH, sa.ForeignKey("asset_versions.hash"), primary_key=True, index=True
    )
    position: Mapped[int] = mapped_column(sa.Integer)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (_round_fk(),)
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    run_id: Mapped[str | None] = mapped_column(ID, sa.ForeignKey("runs.id"), index=True)
    round: Mapped[int | None] = mapped_column(sa.Integer)
    path: Mapped[str] = mapped_column(sa.Text)
    sha256: Mapped[str] = mapped_column(HASH, index=True)
    base_model: Mapped[str] = mapped_column(sa.String(300))
    step: Mapped[int] = mapped_column(sa.Integer)
    parent_id: Mapped[str | None] = mapped_column(ID, sa.ForeignKey("checkpoints.id"))
    harness_hash: Mapped[str | None] = _asset_fk()
    skill_library_hash: Mapped[str | None] = _asset_fk()
    rubric_hash: Mapped[str | None] = _asset_fk()
    created_at: Mapped[datetime] = _created()


class Evaluation(Base):
    __tablename__ = "evaluations"
    __table_args__ = (_round_fk(), sa.Index("uq_evaluations_key", "key", unique=True))
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    run_id: Mapped[str | None] = mapped_column(ID, sa.ForeignKey("runs.id"), index=True)
    round: Mapped[int | None] = mapped_column(sa.Integer)
    split: Mapped[str] = mapped_column(sa.String(16))
    env: Mapped[str] = mapped_column(sa.String(200))
    harness_hash: Mapped[str | None] = _asset_fk()
    skill_library_hash: Mapped[str | None] = _asset_fk()
    rubric_hash: Mapped[str | None] = _asset_fk()
    checkpoint_id: Mapped[str | None] = mapped_column(ID, sa.ForeignKey("checkpoints.id"))
    n: Mapped[int] = mapped_column(sa.Integer, default=0)  # results recorded
    summary: Mapped[dict] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = _created()
    # 0004: idempotency key of a gate arm's evaluation (run, round, assets, checkpoint, tasks
    # and seeds); a resumed round finds it instead of running the episodes again.
    key: Mapped[str | None] = mapped_column(sa.String(64))


class Trajectory(Base):
    __tablename__ = "trajectories"
    __table_args__ = (
        _round_fk(),
        sa.Index("ix_trajectories_run_id_round", "run_id", "round"),
    )
    seq: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(ID, unique=True)  # coevo.trajectory.Trajectory.id
    run_id: Mapped[str | None] = mapped_column(ID, sa.ForeignKey("runs.id"))
    round: Mapped[int | None] = mapped_column(sa.Integer)
    evaluation_id: Mapped[str | None] = mapped_column(
        ID, sa.ForeignKey("evaluations.id"), index=True
    )
    env: Mapped[str] = mapped_column(sa.String(200))
    task_id: Mapped[str] = mapped_column(sa.String(300))
    split: Mapped[str] = mapped_column(sa.String(16))
    group_id: Mapped[str | None] = mapped_column(sa.String(64))
    sample_index: Mapped[int] = mapped_column(sa.Integer)
    seed: Mapped[int] = mapped_column(sa.BigInteger)
    status: Mapped[str] = mapped_column(sa.String(16))  # ok | infra_error
    error: Mapped[str | None] = mapped_column(sa.Text)
    answer: Mapped[str | None] = mapped_column(sa.Text)
    outcome: Mapped[float | None] = mapped_column(sa.Float)
    success: Mapped[bool] = mapped_column(sa.Boolean)
    reward: Mapped[float | None] = mapped_column(sa.Float)
    criteria: Mapped[dict] = mapped_column(JSONType)
    messages: Mapped[list] = mapped_column(JSONType)
    turns: Mapped[list] = mapped_column(JSONType)
    token_ids: Mapped[bytes] = mapped_column(sa.LargeBinary)  # codec.pack_ids
    loss_mask: Mapped[bytes] = mapped_column(sa.LargeBinary)  # codec.pack_mask
    logprobs: Mapped[bytes] = mapped_column(sa.LargeBinary)  # codec.pack_logprobs
    n_tokens: Mapped[int] = mapped_column(sa.Integer)  # len(token_ids), for queries w/o decoding
    prompt_len: Mapped[int] = mapped_column(sa.Integer)
    trainable: Mapped[bool] = mapped_column(sa.Boolean)
    active_skills: Mapped[list] = mapped_column(JSONType)
    harness_hash: Mapped[str | None] = _asset_fk()
    skill_library_hash: Mapped[str | None] = _asset_fk()
    rubric_hash: Mapped[str | None] = _asset_fk()
    checkpoint_id: Mapped[str | None] = mapped_column(ID, sa.ForeignKey("checkpoints.id"))
    policy_step: Mapped[int | None] = mapped_column(sa.Integer)  # RL rollouts: trainer steps
    model: Mapped[str] = mapped_column(sa.String(300))
    timings: Mapped[dict] = mapped_column(JSONType)
    created_at: Mapped[datetime] = _created()


class EvaluationResult(Base):
    __tablename__ = "evaluation_results"
    __table_args__ = (sa.UniqueConstraint("evaluation_id", "task_id", "sample"),)
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    evaluation_id: Mapped[str] = mapped_column(ID, sa.ForeignKey("evaluations.id"))
    task_id: Mapped[str] = mapped_column(sa.String(300))
    sample: Mapped[int] = mapped_column(sa.Integer)
    outcome: Mapped[float | None] = mapped_column(sa.Float)  # None: infrastructure failure
    success: Mapped[bool] = mapped_column(sa.Boolean)
    reward: Mapped[float | None] = mapped_column(sa.Float)
    criteria: Mapped[dict] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(sa.String(16))
    trajectory_id: Mapped[str | None] = mapped_column(ID, sa.ForeignKey("trajectories.id"))


class Proposal(Base):
    __tablename__ = "proposals"
    # 0004: the idempotency key of a proposal (a resumed round reloads, never re-proposes).
    __table_args__ = (_round_fk(), sa.Index("uq_proposals_run_id_round_proposer_candidate_hash",
                                            "run_id", "round", "proposer", "candidate_hash",
                                            unique=True))
    seq: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(ID, unique=True)
    run_id: Mapped[str | None] = mapped_column(ID, sa.ForeignKey("runs.id"))
    round: Mapped[int | None] = mapped_column(sa.Integer)
    proposer: Mapped[str] = mapped_column(sa.String(100))
    model: Mapped[str] = mapped_column(sa.String(200), default="", server_default="")  # 0003
    kind: Mapped[str] = mapped_column(sa.String(32))  # asset kind revised
    parent_hash: Mapped[str | None] = _asset_fk()
    candidate_hash: Mapped[str | None] = _asset_fk()  # None for an invalid proposal
    status: Mapped[str] = mapped_column(sa.String(16))  # pending | accepted | rejected | invalid
    rationale: Mapped[str] = mapped_column(sa.Text, default="")
    predicted_effect: Mapped[str] = mapped_column(sa.Text, default="")
    prompt: Mapped[str] = mapped_column(sa.Text, default="")
    raw_output: Mapped[str] = mapped_column(sa.Text, default="")
    error: Mapped[str | None] = mapped_column(sa.Text)
    # field path -> unified diff; "@edits": the typed edit operations (records.EDITS_KEY)
    diff: Mapped[dict] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = _created()


class Decision(Base):
    __tablename__ = "decisions"
    # 0004: one verdict per proposal; 0007: one per proposal and policy (the gate's verdict,
    # then a human review's, policy "review", when the run holds candidates for review).
    __table_args__ = (sa.Index("uq_decisions_proposal_id_policy", "proposal_id", "policy",
                               unique=True),)
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    proposal_id: Mapped[str] = mapped_column(ID, sa.ForeignKey("proposals.id"), index=True)
    policy: Mapped[str] = mapped_column(sa.String(100))
    accepted: Mapped[bool] = mapped_column(sa.Boolean)
    reason: Mapped[str] = mapped_column(sa.Text)
    statistic: Mapped[dict] = mapped_column(JSONType)  # estimate, interval, p-value, stage ...
    rollouts: Mapped[int] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = _created()
    # 0004: what the gate decided on, so a decision can be re-derived from its rows: the
    # per-task metric (outcome | partial; "auc" for a rubric's validity) and the stage records
    # of the sequential comparison (screen, chunks; the last one is the stop the reason cites).
    metric: Mapped[str] = mapped_column(sa.String(16), default="", server_default="")
    stages: Mapped[list | None] = mapped_column(JSONType)


class Evidence(Base):
    __tablename__ = "evidence"
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    decision_id: Mapped[str] = mapped_column(ID, sa.ForeignKey("decisions.id"), index=True)
    proposal_id: Mapped[str] = mapped_column(ID, sa.ForeignKey("proposals.id"))
    task_id: Mapped[str] = mapped_column(sa.String(300))
    sample: Mapped[int] = mapped_column(sa.Integer)
    incumbent: Mapped[float | None] = mapped_column(sa.Float)  # None: missing (infra failure)
    candidate: Mapped[float | None] = mapped_column(sa.Float)
    status: Mapped[str] = mapped_column(sa.String(16))  # ok | infra_error
    # 0004: the partial-credit metric of each arm (what the `soft` gate decides on)
    incumbent_partial: Mapped[float | None] = mapped_column(sa.Float)
    candidate_partial: Mapped[float | None] = mapped_column(sa.Float)


# --- added by revision 0002 -------------------------------------------------------------------


class Budget(Base):
    """Spend ledger: one row per charge (rollouts, tokens, proposer calls, seconds); totals are
    a SUM, so concurrent writers never race on a counter."""

    __tablename__ = "budgets"
    __table_args__ = (
        _round_fk(),
        sa.Index("ix_budgets_run_id_round", "run_id", "round"),
        sa.Index("uq_budgets_run_id_kind_key", "run_id", "kind", "key", unique=True),
    )
    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ID, sa.ForeignKey("runs.id"))
    round: Mapped[int | None] = mapped_column(sa.Integer)
    kind: Mapped[str] = mapped_column(sa.String(32))
    amount: Mapped[float] = mapped_column(sa.Float)
    created_at: Mapped[datetime] = _created()
    # 0004: idempotency key of a charge (e.g. "rl:0:3" for step 3 of round 0's RL stage): a
    # step or evaluation redone after a crash is charged once.
    key: Mapped[str | None] = mapped_column(sa.String(200))


# --- added by revision 0007 -------------------------------------------------------------------


class Review(Base):
    """A person's verdict on a candidate the gate passed and the run holds for review
    (`gate.human_review`): approve or veto, with who and why. One per proposal; the loop
    applies it at the next round start and records that as a decision (policy "review")."""

    __tablename__ = "reviews"
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    proposal_id: Mapped[str] = mapped_column(ID, sa.ForeignKey("proposals.id"), unique=True)
    reviewer: Mapped[str] = mapped_column(sa.String(200))
    decision: Mapped[str] = mapped_column(sa.String(16))  # approve | veto
    note: Mapped[str] = mapped_column(sa.Text, default="")
    created_at: Mapped[datetime] = _created()


# Audit-query indexes, also from revision 0002: "every trajectory of harness version X" and
# "pending proposals of run R".
sa.Index("ix_trajectories_harness_hash", Trajectory.harness_hash)
sa.Index("ix_proposals_run_id_status", Proposal.run_id, Proposal.status)
