"""Read-only queries for the reviewer web app (coevo/serve/): pages of runs and proposals,
per-run aggregates, the version tree of an asset, and the episodes behind a gate decision.

Part of the store (the only code that talks SQL), kept apart from store.py: nothing here
writes, and every function takes a `Store` (normally one opened by `open_readonly`, whose
connections refuse writes). List queries take `offset` / `limit` and come with a count, so a
page costs the same on a store of 100 or 100,000 rows (bench/serve.py).

Which episodes a decision's evidence came from. Evidence rows name a task and sample, not a
trajectory, so the link is recovered from the evaluations the gate wrote: in the proposal's
round, the val-split evaluations other than the loop's own val tracking (the ids in the round
summary's `evaluations`) are gate arms. The incumbent arm is an evaluation of the round-start
incumbent (the previous done round's `incumbent`, else the run's seed); the candidate arm one
whose asset slot of the proposal's kind holds the candidate, the other slots the incumbent's.
A rubric candidate is gated on the incumbent arm's own episodes (coevo/validity.py), so both
sides of its evidence are the same episode.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict

from coevo.errors import CoevoError, NotFound
from coevo.store import tables as T
from coevo.store.engine import make_engine, resolve_url
from coevo.store.records import (
    PROPOSAL_STATUSES,
    REVIEW_POLICY,
    AssetRecord,
    RoundRecord,
    RunRecord,
    asset_record,
    round_record,
    run_record,
)
from coevo.store.store import Store

SLOTS = ("harness", "skill_library", "rubric")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunStats(_Record):
    """What the runs page shows per run besides the run row itself."""

    rounds: list[RoundRecord]
    proposals: dict[str, int]  # status -> count
    spent: dict[str, float]  # budget kind -> total
    episodes: dict[str, int]  # split -> episodes of the run's evaluations (gate arms, val
    #                           tracking, harness-only train rollouts, the final test)


class ProposalSummary(_Record):
    """A proposal without its long texts, with its latest decision (None: not decided)."""

    id: str
    run: str | None
    run_name: str | None
    round: int | None
    proposer: str
    model: str
    kind: str
    status: str
    parent: str | None
    candidate: str | None
    rationale: str
    error: str | None
    created_at: datetime
    accepted: bool | None = None
    reason: str = ""
    policy: str = ""
    statistic: dict[str, Any] = {}
    rollouts: int = 0


class EpisodeSummary(_Record):
    """One stored episode's headline numbers (no messages, no token arrays)."""

    id: str
    task_id: str
    sample: int
    status: str
    outcome: float | None
    reward: float | None
    success: bool
    criteria: dict[str, float]


class ProposalFilter(_Record):
    """Search criteria; None matches everything. `text` is a case-insensitive substring of the
    rationale, predicted effect, prompt, raw output, error, a decision's reason, or a prefix of
    the proposal id or candidate hash."""

    run: str | None = None
    round: int | None = None
    status: str | None = None
    proposer: str | None = None
    kind: str | None = None
    text: str | None = None


def open_readonly(url: str | None = None, *, readonly: bool = True) -> Store:
    """The store at `url` (see engine.resolve_url) opened for reading only: no migration, no
    file created, every write refused by the database (`readonly=False`: writable, for
    `coevo serve --review`, still never migrated or created). Fails with a clear error when
    there is no store there or its schema is not this coevo's."""
    store = Store(make_engine(resolve_url(url), readonly=readonly))
    try:
        have, head = store.current_revision(), store.head_revision()
    except sa.exc.SQLAlchemyError as e:
        store.close()
        raise CoevoError(f"{store.url}: cannot read the store: {getattr(e, 'orig', e)}") from None
    if have != head:
        store.close()
        what = "has no coevo schema" if have is None else f"has schema {have}, this coevo {head}"
        raise CoevoError(f"{store.url} {what}: run `coevo db upgrade --db ...` (or coevo init) first")
    return store


def _run_id(s: Any, ref: str) -> str:
    row = s.get(T.Run, ref) or s.execute(sa.select(T.Run).where(T.Run.name == ref)).scalar()
    if row is None:
        raise NotFound(f"no run with id or name {ref!r}")
    return row.id


# --- runs --------------------------------------------------------------------------------------


def count_runs(store: Store) -> int:
    with store.transaction() as s:
        return s.execute(sa.select(sa.func.count()).select_from(T.Run)).scalar_one()


def runs_page(store: Store, offset: int = 0, limit: int = 25) -> list[RunRecord]:
    """Runs, newest first."""
    with store.transaction() as s:
        rows = s.execute(sa.select(T.Run).order_by(T.Run.created_at.desc(), T.Run.id.desc())
                         .offset(offset).limit(limit)).scalars()
        return [run_record(r) for r in rows]


def run_stats(store: Store, run_ids: Iterable[str]) -> dict[str, RunStats]:
    """Rounds, proposal counts by status, spend by kind and evaluation episodes by split of
    each run: four grouped queries, whatever the number of runs."""
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        return {}
    p, b, ev = T.Proposal, T.Budget, T.Evaluation
    rounds: dict[str, list[RoundRecord]] = defaultdict(list)
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    spent: dict[str, dict[str, float]] = defaultdict(dict)
    with store.transaction() as s:
        for r in s.execute(sa.select(T.Round).where(T.Round.run_id.in_(ids))
                           .order_by(T.Round.run_id, T.Round.index)).scalars():
            rounds[r.run_id].append(round_record(r))
        for run, status, n in s.execute(sa.select(p.run_id, p.status, sa.func.count())
                                        .where(p.run_id.in_(ids)).group_by(p.run_id, p.status)):
            counts[run][status] = n
        for run, kind, amount in s.execute(sa.select(b.run_id, b.kind, sa.func.sum(b.amount))
                                           .where(b.run_id.in_(ids)).group_by(b.run_id, b.kind)):
            spent[run][kind] = float(amount)
        episodes: dict[str, dict[str, int]] = defaultdict(dict)
        for run, split, n in s.execute(sa.select(ev.run_id, ev.split, sa.func.sum(ev.n))
                                       .where(ev.run_id.in_(ids)).group_by(ev.run_id, ev.split)):
            episodes[run][split] = int(n or 0)
    return {i: RunStats(rounds=rounds[i], proposals={k: counts[i].get(k, 0) for k in PROPOSAL_STATUSES},
                        spent=dict(sorted(spent[i].items())), episodes=episodes[i])
            for i in ids}


# --- proposals ---------------------------------------------------------------------------------


def _filtered(s: Any, f: ProposalFilter) -> Any:
    p, d = T.Proposal, T.Decision
    q = sa.select(p, T.Run.name).outerjoin(T.Run, T.Run.id == p.run_id)
    if f.run is not None:
        q = q.where(p.run_id == _run_id(s, f.run))
    for col, value in ((p.round, f.round), (p.status, f.status), (p.proposer, f.proposer),
                       (p.kind, f.kind)):
        if value is not None:
            q = q.where(col == value)
    if f.text:
        t = f.text
        q = q.where(sa.or_(
            *(col.icontains(t, autoescape=True) for col in
              (p.rationale, p.predicted_effect, p.prompt, p.raw_output, p.error)),
            p.id.startswith(t.lower(), autoescape=True),
            p.candidate_hash.startswith(t.lower(), autoescape=True),
            sa.exists().where(d.proposal_id == p.id, d.reason.icontains(t, autoescape=True))))
    return q


def count_proposals(store: Store, f: ProposalFilter = ProposalFilter()) -> int:
    """How many proposals match `f`."""
    with store.transaction() as s:
        q = _filtered(s, f)
        return s.execute(sa.select(sa.func.count()).select_from(q.subquery())).scalar_one()


def proposals_page(store: Store, f: ProposalFilter = ProposalFilter(), offset: int = 0,
                   limit: int = 50, newest_first: bool = False) -> list[ProposalSummary]:
    """One page of the proposals matching `f` (in the order they were made, or newest first),
    each with its latest decision."""
    p = T.Proposal
    with store.transaction() as s:
        order = p.seq.desc() if newest_first else p.seq
        rows = s.execute(_filtered(s, f).order_by(order).offset(offset).limit(limit)).all()
        return _summaries(s, rows)


def proposals_for_versions(store: Store, hashes: Iterable[str]) -> dict[str, list[ProposalSummary]]:
    """The proposals whose candidate is each version (oldest first); a version no proposal
    produced (a seed, an imported file) is absent."""
    wanted = list(dict.fromkeys(hashes))
    out: dict[str, list[ProposalSummary]] = defaultdict(list)
    p = T.Proposal
    with store.transaction() as s:
        for i in range(0, len(wanted), 500):  # bounded IN lists
            rows = s.execute(sa.select(p, T.Run.name).outerjoin(T.Run, T.Run.id == p.run_id)
                             .where(p.candidate_hash.in_(wanted[i:i + 500])).order_by(p.seq)).all()
            for summary in _summaries(s, rows):
                out[summary.candidate].append(summary)  # type: ignore[index]
    return dict(out)


def invalid_children(store: Store, parents: Iterable[str]) -> dict[str, list[ProposalSummary]]:
    """Invalid proposals (no stored candidate) made against each parent version."""
    wanted = list(dict.fromkeys(parents))
    out: dict[str, list[ProposalSummary]] = defaultdict(list)
    p = T.Proposal
    with store.transaction() as s:
        for i in range(0, len(wanted), 500):
            rows = s.execute(sa.select(p, T.Run.name).outerjoin(T.Run, T.Run.id == p.run_id)
                             .where(p.parent_hash.in_(wanted[i:i + 500]),
                                    p.candidate_hash.is_(None)).order_by(p.seq)).all()
            for summary in _summaries(s, rows):
                out[summary.parent].append(summary)  # type: ignore[index]
    return dict(out)


def _summaries(s: Any, rows: list[Any]) -> list[ProposalSummary]:
    d = T.Decision
    ids = [r[0].id for r in rows]
    latest: dict[str, Any] = {}
    gate: dict[str, Any] = {}  # the gate's verdict: its numbers stay after a review's
    if ids:
        for dec in s.execute(sa.select(d).where(d.proposal_id.in_(ids))
                             .order_by(d.created_at, d.id)).scalars():
            latest[dec.proposal_id] = dec
            if dec.policy != REVIEW_POLICY:
                gate[dec.proposal_id] = dec
    out = []
    for prop, run_name in rows:
        dec, numbers = latest.get(prop.id), gate.get(prop.id)
        extra = {} if dec is None else dict(accepted=dec.accepted, reason=dec.reason,
                                              policy=dec.policy)
        if numbers is not None:
            extra.update(statistic=numbers.statistic, rollouts=numbers.rollouts)
        out.append(ProposalSummary(
            id=prop.id, run=prop.run_id, run_name=run_name, round=prop.round,
            proposer=prop.proposer, model=prop.model or "", kind=prop.kind, status=prop.status,
            parent=prop.parent_hash, candidate=prop.candidate_hash, rationale=prop.rationale,
            error=prop.error, created_at=T.UTCDateTime().process_result_value(prop.created_at, None),
            **extra))
    return out


def proposal_facets(store: Store) -> dict[str, list[str]]:
    """The distinct proposers and kinds (the search form's choices)."""
    p = T.Proposal
    with store.transaction() as s:
        return {"proposer": list(s.execute(sa.select(p.proposer).distinct().order_by(p.proposer)).scalars()),
                "kind": list(s.execute(sa.select(p.kind).distinct().order_by(p.kind)).scalars())}


# --- assets ------------------------------------------------------------------------------------


def asset_names(store: Store) -> list[dict[str, Any]]:
    """One row per (kind, name): how many versions, and the newest version's hash."""
    av = T.AssetVersion
    with store.transaction() as s:
        rows = s.execute(sa.select(av.kind, av.name, sa.func.count(), sa.func.max(av.seq))
                         .group_by(av.kind, av.name).order_by(av.kind, av.name)).all()
        newest = dict(s.execute(sa.select(av.seq, av.hash)
                                .where(av.seq.in_([r[3] for r in rows]))).all()) if rows else {}
    return [{"kind": k, "name": n, "versions": c, "newest": newest[m]} for k, n, c, m in rows]


def asset_contents(store: Store, hashes: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The stored content of each version (what its hash covers), without rebuilding the
    asset classes."""
    wanted = list(dict.fromkeys(hashes))
    av = T.AssetVersion
    out: dict[str, dict[str, Any]] = {}
    with store.transaction() as s:
        for i in range(0, len(wanted), 500):
            out.update(s.execute(sa.select(av.hash, av.content)
                                 .where(av.hash.in_(wanted[i:i + 500]))).all())
    return out


def version_tree(store: Store, ref: str, limit: int = 2000) -> tuple[AssetRecord, list[AssetRecord]]:
    """The root of `ref`'s ancestry and every version derived from that root (by depth, then
    insertion order), at most `limit` of them: the whole family tree `ref` belongs to."""
    chain = store.ancestors(ref)
    root = chain[-1] if chain else store.resolve(None, ref)
    av = T.AssetVersion.__table__
    tree = (sa.select(av.c.hash, av.c.parent_hash, sa.literal(0).label("depth"))
            .where(av.c.hash == root.hash).cte("tree", recursive=True))
    tree = tree.union_all(sa.select(av.c.hash, av.c.parent_hash, (tree.c.depth + 1).label("depth"))
                          .join(tree, av.c.parent_hash == tree.c.hash))
    q = (sa.select(av.c.hash, av.c.kind, av.c.name, av.c.parent_hash, av.c.created_at, tree.c.depth)
         .join(tree, tree.c.hash == av.c.hash).where(tree.c.depth > 0)
         .order_by(tree.c.depth, av.c.seq).limit(limit))
    with store.transaction() as s:
        rows = [asset_record(r, r.depth) for r in s.execute(q)]
    return root.model_copy(update={"depth": 0}), rows


# --- the episodes behind a decision ------------------------------------------------------------


def round_start_incumbent(store: Store, run: str, round: int) -> dict[str, str | None]:
    """The asset hashes in force when `round` started: the last earlier done round's
    incumbent, else the run's seed."""
    rec = store.get_run(run)
    hashes: Mapping[str, Any] = rec.config.get("seed") or {}
    for r in store.rounds(rec.id):
        if r.index >= round:
            break
        if r.status == "done" and isinstance(r.summary.get("incumbent"), Mapping):
            hashes = r.summary["incumbent"]
    return {k: hashes.get(k) for k in SLOTS}


def evidence_episodes(store: Store, proposal: str) -> dict[tuple[str, int], tuple[EpisodeSummary | None, EpisodeSummary | None]]:
    """(task id, sample) -> (incumbent episode, candidate episode) for a proposal's gate
    evidence (module docstring); empty when the proposal had no gate arms."""
    prop = store.get_proposal(proposal)
    if prop.run is None or prop.round is None or prop.kind not in SLOTS:
        return {}
    start = round_start_incumbent(store, prop.run, prop.round)
    tracked = store.get_round(prop.run, prop.round).summary.get("evaluations") or {}
    ev = T.Evaluation
    cols = {"harness": ev.harness_hash, "skill_library": ev.skill_library_hash, "rubric": ev.rubric_hash}
    with store.transaction() as s:
        q = sa.select(ev.id, *cols.values()).where(
            ev.run_id == prop.run, ev.round == prop.round, ev.split == "val",
            ev.id.not_in([v for v in tracked.values() if isinstance(v, str)] or [""]))
        arms = [(a[0], dict(zip(SLOTS, a[1:]))) for a in s.execute(q)]
        inc = [i for i, have in arms if have == start]
        cand = inc if prop.kind == "rubric" else [
            i for i, have in arms if prop.candidate and have == {**start, prop.kind: prop.candidate}]
        if not inc and not cand:
            return {}
        er, tt = T.EvaluationResult, T.Trajectory
        results = s.execute(sa.select(er.evaluation_id, er.task_id, er.sample, er.trajectory_id)
                            .where(er.evaluation_id.in_(list({*inc, *cand})))
                            .order_by(er.id)).all()
        traj_ids = [r.trajectory_id for r in results if r.trajectory_id]
        episodes: dict[str, EpisodeSummary] = {}
        for i in range(0, len(traj_ids), 500):
            for t in s.execute(sa.select(tt.id, tt.task_id, tt.sample_index, tt.status, tt.outcome,
                                         tt.reward, tt.success, tt.criteria)
                               .where(tt.id.in_(traj_ids[i:i + 500]))):
                episodes[t.id] = EpisodeSummary(
                    id=t.id, task_id=t.task_id, sample=t.sample_index, status=t.status,
                    outcome=t.outcome, reward=t.reward, success=t.success, criteria=t.criteria or {})
    sides: dict[str, dict[tuple[str, int], EpisodeSummary]] = {"inc": {}, "cand": {}}
    for r in results:
        e = episodes.get(r.trajectory_id) if r.trajectory_id else None
        if e is None:
            continue
        for side, ids in (("inc", inc), ("cand", cand)):
            if r.evaluation_id in ids:
                sides[side].setdefault((r.task_id, r.sample), e)  # the first, if run twice
    keys = sides["inc"].keys() | sides["cand"].keys()
    return {k: (sides["inc"].get(k), sides["cand"].get(k)) for k in sorted(keys)}


# --- outcomes for the gate's power (coevo/gateplan.py) -------------------------------------------


def task_outcomes(store: Store, env: str, harness: str, split: str = "val") -> dict[str, list[float]]:
    """Task id -> the verified outcomes of every stored episode of `env` under `harness` on
    `split` (infrastructure failures and unscored episodes left out), over all runs: how much
    one task's outcome varies from draw to draw, which sets the gate's power."""
    tt = T.Trajectory.__table__
    q = (sa.select(tt.c.task_id, tt.c.outcome)
         .where(tt.c.env == env, tt.c.harness_hash == harness, tt.c.split == split,
                tt.c.status == "ok", tt.c.outcome.is_not(None))
         .order_by(tt.c.seq))
    out: dict[str, list[float]] = defaultdict(list)
    with store.transaction() as s:
        for task_id, outcome in s.execute(q):
            out[task_id].append(float(outcome))
    return dict(out)
