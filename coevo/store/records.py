"""The store's read models (plain pydantic records of stored rows) and the row conversions.

Callers never see ORM objects (they would tie them to a session and to SQL); they get these
frozen records, and pass the `*Row` inputs (or equivalent dicts) when writing results and
evidence. Full asset versions come back as their `coevo.assets` classes instead, trajectories
as `coevo.trajectory.Trajectory` with their packed arrays decoded.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from coevo.store import codec
from coevo.store import tables as T
from coevo.trajectory import Trajectory

ProposalStatus = Literal["pending", "accepted", "rejected", "invalid"]
PROPOSAL_STATUSES: tuple[str, ...] = ("pending", "accepted", "rejected", "invalid")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AssetRecord(_Record):
    """One stored asset version without its content. `depth` is set by lineage queries:
    1 = parent (or child), 2 = grandparent (grandchild), ...; 0 otherwise."""

    hash: str
    kind: str
    name: str
    parent: str | None
    created_at: datetime
    depth: int = 0


class RunRecord(_Record):
    id: str
    name: str
    config: dict[str, Any]
    mode: str
    status: str
    created_at: datetime
    updated_at: datetime
    error: str | None = None  # why a failed run failed


class RoundRecord(_Record):
    run: str
    index: int
    status: str
    started_at: datetime
    ended_at: datetime | None
    summary: dict[str, Any]


class CheckpointRecord(_Record):
    id: str
    run: str | None
    round: int | None
    path: str
    sha256: str
    base_model: str
    step: int
    parent: str | None
    harness: str | None
    skill_library: str | None
    rubric: str | None
    created_at: datetime


class ResultRow(_Record):
    """One per-task result of an evaluation. `outcome` None = the episode failed for
    infrastructure reasons (missing data, never a zero)."""

    task_id: str
    sample: int = 0
    outcome: float | None = None
    success: bool = False
    reward: float | None = None
    criteria: dict[str, float] = Field(default_factory=dict)
    status: Literal["ok", "infra_error"] = "ok"
    trajectory: str | None = None  # trajectory id, when the episode was stored


class EvaluationRecord(_Record):
    id: str
    run: str | None
    round: int | None
    split: str
    env: str
    harness: str | None
    skill_library: str | None
    rubric: str | None
    checkpoint: str | None
    n: int
    summary: dict[str, Any]
    created_at: datetime
    results: list[ResultRow] = Field(default_factory=list)
    key: str | None = None  # idempotency key (a gate arm's evaluation)


class ProposalRecord(_Record):
    id: str
    run: str | None
    round: int | None
    proposer: str
    kind: str
    parent: str | None
    candidate: str | None
    status: ProposalStatus
    model: str = ""  # the proposer's model (empty: a proposer without one)
    rationale: str
    predicted_effect: str
    prompt: str
    raw_output: str
    error: str | None
    diff: dict[str, Any]
    created_at: datetime
    edits: list[dict[str, Any]] = Field(default_factory=list)  # typed edit operations, in order


class EvidenceRow(_Record):
    """One paired comparison: the same task and sample scored under incumbent and candidate.
    A None score is missing data (infrastructure failure)."""

    task_id: str
    sample: int = 0
    incumbent: float | None = None
    candidate: float | None = None
    status: Literal["ok", "infra_error"] = "ok"
    incumbent_partial: float | None = None  # each arm's partial credit (the soft gate's metric)
    candidate_partial: float | None = None


class DecisionRecord(_Record):
    id: str
    proposal: str
    policy: str
    accepted: bool
    reason: str
    statistic: dict[str, Any]
    rollouts: int
    created_at: datetime
    evidence: list[EvidenceRow] = Field(default_factory=list)
    metric: str = ""  # outcome | partial | auc (rubric validity); "" without a gate run
    stages: list[dict[str, Any]] = Field(default_factory=list)  # the last is the cited stop


REVIEW_DECISIONS: tuple[str, ...] = ("approve", "veto")
REVIEW_POLICY = "review"  # the policy of the decision that applies a review


class ReviewRecord(_Record):
    """A person's approve / veto of a candidate held for review (coevo/store/reviews.py)."""

    id: str
    proposal: str
    by: str
    decision: str  # approve | veto
    note: str
    created_at: datetime


# --- row -> record conversions -------------------------------------------------------------


def asset_record(row: Any, depth: int = 0) -> AssetRecord:
    # `row` may be a Core row from a CTE select, so created_at may come back naive.
    return AssetRecord(hash=row.hash, kind=row.kind, name=row.name, parent=row.parent_hash,
                       created_at=_utc(row.created_at), depth=depth)


def _utc(value: Any) -> datetime:
    # Core selects bypass the ORM type on some paths (CTEs, raw columns); re-label naive as UTC.
    return T.UTCDateTime().process_result_value(value, None)


def run_record(r: T.Run) -> RunRecord:
    return RunRecord(id=r.id, name=r.name, config=r.config, mode=r.mode, status=r.status,
                     created_at=r.created_at, updated_at=r.updated_at, error=r.error)


def round_record(r: T.Round) -> RoundRecord:
    return RoundRecord(run=r.run_id, index=r.index, status=r.status, started_at=r.started_at,
                       ended_at=r.ended_at, summary=r.summary)


def checkpoint_record(r: T.Checkpoint) -> CheckpointRecord:
    return CheckpointRecord(id=r.id, run=r.run_id, round=r.round, path=r.path,
                            sha256=r.sha256, base_model=r.base_model, step=r.step,
                            parent=r.parent_id, harness=r.harness_hash,
                            skill_library=r.skill_library_hash, rubric=r.rubric_hash,
                            created_at=r.created_at)


# A proposal's edit operations live in its `diff` JSON under this key (no migration: the
# column already holds what changed); field paths never start with "@", so nothing clashes,
# and records split it out again (`ProposalRecord.diff` holds field paths only).
EDITS_KEY = "@edits"


def with_edits(diff: dict[str, Any], edits: Any) -> dict[str, Any]:
    return {**diff, EDITS_KEY: [dict(e) for e in edits]} if edits else dict(diff)


def edit_text(edit: dict[str, Any]) -> str:
    """One stored edit operation as a call (coevo/propose/operators.py).

    >>> edit_text({"kind": "add_rule", "error_kind": "no_answer", "text": "End with Answer: N."})
    'add_rule(error_kind="no_answer", text="End with Answer: N.")'
    >>> edit_text({"kind": "drop_demo", "index": 2, "skipped": "gone"})
    'drop_demo(index=2) [skipped: gone]'
    """
    slots = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in edit.items()
                      if k not in ("kind", "skipped"))
    out = f"{edit.get('kind', '?')}({slots})"
    return out + (f" [skipped: {edit['skipped']}]" if edit.get("skipped") else "")


def proposal_record(r: T.Proposal) -> ProposalRecord:
    diff = dict(r.diff or {})
    edits = diff.pop(EDITS_KEY, None) or []
    return ProposalRecord(id=r.id, run=r.run_id, round=r.round, proposer=r.proposer,
                          kind=r.kind, parent=r.parent_hash, candidate=r.candidate_hash,
                          status=r.status, rationale=r.rationale,
                          predicted_effect=r.predicted_effect, prompt=r.prompt,
                          raw_output=r.raw_output, error=r.error, diff=diff,
                          created_at=r.created_at, model=r.model or "", edits=edits)


def trajectory_row(t: Trajectory, run_id: str | None, round: int | None,
                    evaluation: str | None, now: datetime) -> dict[str, Any]:
    return {
        "id": t.id, "run_id": run_id, "round": round, "evaluation_id": evaluation,
        "env": t.env, "task_id": t.task_id, "split": t.split, "group_id": t.group_id,
        "sample_index": t.sample_index, "seed": t.seed, "status": t.status, "error": t.error,
        "answer": t.answer, "outcome": t.outcome, "success": t.success, "reward": t.reward,
        "criteria": t.criteria, "messages": t.messages,
        "turns": t.turns,  # the engine's JSON encoder serialises the Turn models directly
        "token_ids": codec.pack_ids(t.token_ids), "loss_mask": codec.pack_mask(t.loss_mask),
        "logprobs": codec.pack_logprobs(t.logprobs), "n_tokens": len(t.token_ids),
        "prompt_len": t.prompt_len, "trainable": t.trainable, "active_skills": t.active_skills,
        "harness_hash": t.harness, "skill_library_hash": t.skill_library,
        "rubric_hash": t.rubric, "checkpoint_id": t.checkpoint, "policy_step": t.policy_step,
        "model": t.model,
        "timings": t.timings, "created_at": now,
    }


def trajectory_from_row(r: Any) -> Trajectory:
    return Trajectory.model_validate({
        "id": r.id, "env": r.env, "task_id": r.task_id, "split": r.split,
        "group_id": r.group_id, "sample_index": r.sample_index, "seed": r.seed,
        "messages": r.messages, "token_ids": codec.unpack_ids(r.token_ids),
        "loss_mask": codec.unpack_mask(r.loss_mask), "logprobs": codec.unpack_logprobs(r.logprobs),
        "prompt_len": r.prompt_len, "turns": r.turns, "trainable": r.trainable,
        "answer": r.answer, "outcome": r.outcome, "success": r.success, "criteria": r.criteria,
        "reward": r.reward, "status": r.status, "error": r.error,
        "active_skills": r.active_skills, "harness": r.harness_hash,
        "skill_library": r.skill_library_hash, "rubric": r.rubric_hash,
        "checkpoint": r.checkpoint_id, "policy_step": r.policy_step, "model": r.model,
        "timings": r.timings,
    })
