"""The proposal page (who proposed what, the diff against the parent, the gate's verdict,
statistics and stages, the per-task evidence) and the episode pages it links to: both arms of
one evidence row side by side, or one trajectory.

Gate stages. The gate's `compare` evaluates tasks in stages (a screen, then chunks) and stops
as soon as the verdict is settled; since migration 0004 the decision row stores the stage
records themselves (the last one is the stop its reason cites), shown as stored. For decisions
stored before, the evidence rows are in the order they were evaluated, so `gate_stages`
recomputes each stage's wins, losses, ties and sign-test p from them with the run's gate policy
(screen_size, chunk_size); only for the outcome metric: those rows hold no partial credit, on
which the `soft` policy decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coevo.errors import NotFound
from coevo.gatestats import sign_test_p
from coevo.serve.diff import FieldDiff, field_diffs, rows_from_unified
from coevo.serve.views import BadRequest, Page, number
from coevo.store import DecisionRecord, EvidenceRow, ProposalRecord, Store
from coevo.store.queries import EpisodeSummary, asset_contents, evidence_episodes
from coevo.store.records import REVIEW_POLICY

EVIDENCE_PER_PAGE = 100
OUTCOMES = ("won", "lost", "tied", "missing")


@dataclass(frozen=True)
class EvidenceLine:
    row: EvidenceRow
    delta: float | None
    outcome: str  # won | lost | tied | missing (for the candidate)
    incumbent: EpisodeSummary | None
    candidate: EpisodeSummary | None


def common_prefix(task_ids: list[str]) -> str:
    """The part every task id shares up to its last "@" (reasoning-gym and BFCL ids repeat
    the environment spec before it), so the table can show the rest; "" when there is none.

    >>> common_prefix(["rg:x?a=1@0:12", "rg:x?a=1@0:7"])
    'rg:x?a=1@'
    >>> common_prefix(["val-1", "val-2"])
    ''
    """
    if not task_ids:
        return ""
    lo, hi = min(task_ids), max(task_ids)
    n = 0
    while n < min(len(lo), len(hi)) and lo[n] == hi[n]:
        n += 1
    return lo[:lo.rfind("@", 0, n) + 1]


def classify(e: EvidenceRow) -> tuple[float | None, str]:
    """The candidate's result on one paired row.

    >>> classify(EvidenceRow(task_id="t", incumbent=0.0, candidate=1.0))
    (1.0, 'won')
    >>> classify(EvidenceRow(task_id="t", incumbent=1.0, candidate=None))
    (None, 'missing')
    """
    if e.status != "ok" or e.incumbent is None or e.candidate is None:
        return None, "missing"
    d = e.candidate - e.incumbent
    return d, "won" if d > 1e-12 else "lost" if d < -1e-12 else "tied"


def _policy(run_config: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = run_config.get("config") if isinstance(run_config.get("config"), Mapping) else {}
    gate = cfg.get("gate") if isinstance(cfg.get("gate"), Mapping) else {}
    return gate


def gate_stages(d: DecisionRecord, run_config: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """(stage rows, a note on where they come from); see the module docstring."""
    stored = d.stages or d.statistic.get("stages")
    if isinstance(stored, list) and all(isinstance(x, Mapping) for x in stored) and stored:
        return [dict(x) for x in stored], "as recorded by the gate"
    if d.policy == "soft":
        return [], ("not recorded: the soft policy decides on partial credit, which the "
                    "evidence rows do not hold")
    if d.policy not in ("paired", "strict"):
        return [], f"policy {d.policy}: no staged comparison"
    if not d.evidence:
        return [], "no evidence"
    gate = _policy(run_config)
    screen, chunk = int(gate.get("screen_size", 20)), int(gate.get("chunk_size", 10))
    order: list[str] = []
    diffs: dict[str, list[float]] = {}
    pairs: dict[str, int] = {}
    for e in d.evidence:  # stored in evaluation order
        if e.task_id not in pairs:
            order.append(e.task_id)
            pairs[e.task_id] = 0
        pairs[e.task_id] += 1
        delta, _ = classify(e)
        if delta is not None:
            diffs.setdefault(e.task_id, []).append(delta)
    rows, done, k = [], 0, 0
    while done < len(order):
        size = min(screen if k == 0 else chunk, len(order) - done)
        stage_tasks = order[done:done + size]
        done += size
        means = [sum(v) / len(v) for t in order[:done] if (v := diffs.get(t))]
        w = sum(m > 1e-12 for m in means)
        lo = sum(m < -1e-12 for m in means)
        last = done >= len(order)
        rows.append({"name": "screen" if k == 0 else f"chunk {k}", "tasks": size,
                     "tasks_total": done, "rollouts": 2 * sum(pairs[t] for t in stage_tasks),
                     "wins": w, "losses": lo, "ties": len(means) - w - lo,
                     "p_value": sign_test_p(w, lo),
                     "action": ("accept" if d.accepted else "reject") if last else "continue"})
        k += 1
    rule = d.reason.rsplit(": ", 1)[-1] if "stopped at" in d.reason else ""
    if rows and rule:
        rows[-1]["rule"] = rule
    return rows, (f"recomputed from the stored evidence in evaluation order (screen "
                  f"{screen}, chunks of {chunk}); the last stage's action is the decision")


def _diffs(store: Store, p: ProposalRecord) -> tuple[list[FieldDiff], str]:
    if p.parent and p.candidate:
        contents = asset_contents(store, [p.parent, p.candidate])
        return field_diffs(contents.get(p.parent), contents.get(p.candidate)), "stored versions"
    if p.diff:
        out = []
        for f in sorted(p.diff):
            rows = rows_from_unified(str(p.diff[f]))
            out.append(FieldDiff(f, rows, sum(r.tag in ("insert", "replace") for r in rows),
                                 sum(r.tag in ("delete", "replace") for r in rows)))
        return out, "the diff recorded with the proposal (no candidate version was stored)"
    return [], "no candidate version was stored and no diff was recorded"


def proposal_view(store: Store, pid: str, show: str, page: int) -> dict[str, Any]:
    if show not in ("all", *OUTCOMES):
        raise BadRequest(f"show {show!r}: expected all, {', '.join(OUTCOMES)}")
    p = store.get_proposal(pid)
    run = store.get_run(p.run) if p.run else None
    decisions, reviewed = gate_decisions(store, p.id)
    decision = decisions[-1] if decisions else None
    diffs, diff_source = _diffs(store, p)
    episodes = evidence_episodes(store, p.id) if decision and decision.evidence else {}
    lines = []
    for e in decision.evidence if decision else []:
        delta, outcome = classify(e)
        inc, cand = episodes.get((e.task_id, e.sample), (None, None))
        lines.append(EvidenceLine(e, delta, outcome, inc, cand))
    counts = {o: sum(x.outcome == o for x in lines) for o in OUTCOMES}
    chosen = [x for x in lines if show == "all" or x.outcome == show]
    pg = Page(page, EVIDENCE_PER_PAGE, len(chosen)).check()
    stages, stages_note = gate_stages(decision, run.config if run else {}) if decision else ([], "")
    return {
        "p": p, "run": run, "decision": decision, "earlier": decisions[:-1], "diffs": diffs,
        "diff_source": diff_source, "evidence": chosen[pg.offset:pg.offset + pg.size],
        "counts": counts, "n_evidence": len(lines), "show": show, "page": pg,
        "params": {"show": show}, "stages": stages, "stages_note": stages_note,
        "statistic": _statistic_rows(decision.statistic) if decision else [],
        "linked": bool(episodes), "same_episode": p.kind == "rubric",
        "task_prefix": common_prefix([x.row.task_id for x in lines]),
        "reviews": store.reviews(proposal=p.id), "review_decision": reviewed,
        "awaiting": p.status == "pending" and decision is not None and decision.accepted,
    }


def gate_decisions(store: Store, pid: str) -> tuple[list[DecisionRecord], DecisionRecord | None]:
    """A proposal's gate decisions (the last one is the verdict with the evidence) and the
    decision that applied its human review, if any (policy "review", coevo/reviewstep.py)."""
    decisions = store.decisions(pid)
    gate = [d for d in decisions if d.policy != REVIEW_POLICY]
    return gate, next((d for d in decisions if d.policy == REVIEW_POLICY), None)


HEADLINE = ("mean_diff", "ci_low_bound", "ci_low", "ci_high", "p_value", "p_adjusted", "wins",
            "losses", "ties", "n", "n_dropped", "n_unevaluated", "incumbent_mean", "candidate_mean")


def _statistic_rows(st: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The decision's statistics, the headline ones first."""
    out = []
    for k in sorted(st, key=lambda k: (HEADLINE.index(k) if k in HEADLINE else len(HEADLINE), k)):
        if k == "stages":
            continue
        v = number(st[k])
        out.append((k, ("-" if st[k] is None else str(st[k])) if v is None
                    else str(int(v)) if v.is_integer() and abs(v) < 1e12 else f"{v:.4g}"))
    return out


def pair_view(store: Store, pid: str, task: str, sample: int) -> dict[str, Any]:
    """Both arms of one evidence row, full episodes side by side."""
    if not task:
        raise BadRequest("task: give the evidence row's task id (?task=...&sample=...)")
    p = store.get_proposal(pid)
    decisions, _ = gate_decisions(store, p.id)
    rows = [e for e in (decisions[-1].evidence if decisions else [])
            if e.task_id == task and e.sample == sample]
    if not rows:
        raise NotFound(f"proposal {p.id[:12]} has no evidence for task {task!r} sample {sample}")
    inc, cand = evidence_episodes(store, p.id).get((task, sample), (None, None))
    trajs = {t.id: t for t in store.trajectories(ids=[e.id for e in (inc, cand) if e])}
    delta, outcome = classify(rows[0])
    return {"p": p, "row": rows[0], "delta": delta, "outcome": outcome,
            "arms": [("incumbent", p.parent, trajs.get(inc.id) if inc else None),
                     ("candidate", p.candidate, trajs.get(cand.id) if cand else None)],
            "same_episode": p.kind == "rubric"}


def trajectory_view(store: Store, tid: str) -> dict[str, Any]:
    found = store.trajectories(ids=[tid])
    if not found:
        raise NotFound(f"no trajectory {tid!r}")
    return {"t": found[0]}


def reward_rows(t: Any) -> list[tuple[str, str]]:
    """The reward breakdown of an episode: verified outcome, rubric criteria, total."""
    rows = [("outcome (verifier)", "-" if t.outcome is None else f"{t.outcome:.3f}"),
            ("success", "yes" if t.success else "no")]
    rows += [(f"criterion {k}", f"{v:.3f}") for k, v in sorted(t.criteria.items())]
    rows.append(("reward", "-" if t.reward is None else f"{t.reward:.3f}"))
    return rows
