"""What the peer-method modes share: a candidate's val scores (charged like a gate arm) and
its stored decision. The selection rules themselves live in each mode's module."""

from __future__ import annotations

from typing import Any

from coevo.evaluate import evaluate
from coevo.ledger import eval_charge
from coevo.propose.base import Incumbent

Scores = dict[str, float]  # val task id -> the task's mean outcome


def val_scores(run: Any, r: int, who: Incumbent, label: str) -> tuple[Scores, int]:
    """`who` on the run's val tasks under its checkpoint, with the round's seed (every arm of
    round r samples the same per-task seeds: the comparison is paired) -> (per-task mean
    outcome, episodes run). Stored under an idempotency key with its charge in the budget
    kinds the modes are matched on (rollouts, tokens, seconds), so a resumed round and a
    second look at the same arm cost nothing. A task with no scored episode is left out."""
    key = run.key("peer", r, who.hashes())
    res = evaluate(run.store, run.parts.env, who.agent_assets(), run.parts.backend,
                   tasks=run.val, split="val", samples=run.cfg.splits.val_samples,
                   seed=run.cfg.seed + r, checkpoint=who.checkpoint, run=run.id, round=r,
                   judge=run.judge, key=key,
                   on_stored=lambda res: run.store.charge(run.id, eval_charge(res), round=r,
                                                          key=f"peer:{key}"),
                   progress=run.counter(f"round {r}: {label}"))
    return {t.task_id: t.outcome for t in res.tasks if t.outcome is not None}, res.n_episodes


def mean(scores: Scores) -> float:
    return sum(scores.values()) / len(scores) if scores else 0.0


def evidence(ref: Scores, cand: Scores) -> list[dict[str, Any]]:
    """Per-task rows (the reference's and the candidate's mean outcome) for the audit."""
    return [{"task_id": t, "sample": 0, "incumbent": ref.get(t), "candidate": cand.get(t),
             "status": "ok" if t in ref and t in cand else "infra_error"}
            for t in sorted(ref.keys() | cand.keys())]


def decide(run: Any, pid: str, policy: str, accepted: bool, reason: str, *,
           statistic: dict[str, Any] | None = None, rollouts: int = 0,
           rows: list[dict[str, Any]] | None = None) -> None:
    """Store a decision (the proposal's status follows it): what `coevo proposals list` and
    the review app show, with the reason in the mode's words."""
    run.store.add_decision(pid, policy=policy, accepted=accepted, reason=reason,
                           statistic=statistic or {}, rollouts=rollouts, evidence=rows or [],
                           metric="outcome")


def decided(run: Any, pid: str) -> bool | None:
    """A proposal's stored verdict (a resumed round keeps it), None when undecided."""
    ds = run.store.decisions(pid)
    return ds[-1].accepted if ds else None


def note(run: Any, r: int, **values: Any) -> None:
    """Merge `values` into round r's running summary (the mode's stage records)."""
    summary = run.store.get_round(run.id, r).summary
    run.store.finish_round(run.id, r, "running", summary={**summary, **values})


def pending_of(cands: list[tuple[str, Any, str]]) -> tuple[list[Any], list[tuple[str, Any]]]:
    """(already accepted candidates, undecided ones) of a round's proposals: a resumed round
    reloads its proposals with the decisions it stored (written all at once, so all or none)."""
    done = [c for _, c, s in cands if s == "accepted"]
    return done, [(pid, c) for pid, c, s in cands if s == "pending"]


def select_by_mean(run: Any, r: int, incumbent: Incumbent, pending: list[tuple[str, Any]],
                   policy: str) -> list[Any]:
    """Each candidate and the incumbent on the whole val split under the incumbent's
    checkpoint (same seeds); per asset kind, the candidate with the highest val mean is
    accepted when that mean is strictly higher than the incumbent's: no statistical test
    (the selection rule of BetterTogether's and SkillOpt's optimizers). Every decision is
    stored with its reason in one transaction; returns the accepted candidates."""
    base, _ = val_scores(run, r, incumbent, "val: incumbent")
    b = mean(base)
    scored = []
    for i, (pid, cand) in enumerate(pending):
        s, n = val_scores(run, r, incumbent.with_candidate(cand),
                          f"val: candidate {i + 1}/{len(pending)}")
        scored.append((pid, cand, s, n))
    best: dict[str, int] = {}
    for i, (_, c, s, _) in enumerate(scored):
        if mean(s) > b and (c.kind not in best or mean(s) > mean(scored[best[c.kind]][2])):
            best[c.kind] = i
    accepted = []
    with run.store.transaction():
        for i, (pid, c, s, n) in enumerate(scored):
            m, ok = mean(s), best.get(c.kind) == i
            if ok:
                reason = f"{policy}: val mean {m:.3f} > {b:.3f} (incumbent)"
                accepted.append(c)
            elif m > b:
                top = mean(scored[best[c.kind]][2])
                reason = (f"{policy}: val mean {m:.3f} > {b:.3f} (incumbent), superseded by a "
                          f"better {c.kind} candidate ({top:.3f})")
            else:
                reason = f"{policy}: val mean {m:.3f} not > {b:.3f} (incumbent)"
            decide(run, pid, policy, ok, reason, rollouts=n, rows=evidence(base, s),
                   statistic={"val_mean": m, "incumbent_val_mean": b, "n_tasks": len(s)})
    return accepted
