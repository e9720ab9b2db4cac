"""The loop's gate step (the box's `gate.compare` + `store.record`): every pending candidate of a
round is compared with the ROUND-START incumbent under checkpoint C, the round's candidates are
decided as one Holm family (`coevo.gate.decide_family`), one winner per asset kind is kept, and
every decision is stored with its evidence: both arms' outcome AND partial credit per task and
sample (what the `soft` gate decides on), the metric and the comparison's stage records.

Family. Every candidate of a round is compared with the round-start incumbent (a fixed family
of hypotheses, the same footing for each), m = the round's non-rubric candidates, fixed before
any comparison; each comparison stops at the family's levels (coevo/sequential.py), then Holm
decides them together. Several accepted candidates of one kind cannot all be applied to one
parent: the one with the largest mean difference wins, the others are recorded as rejected
("superseded"). Departure from the box in ARCHITECTURE.md: comparing candidate k against an
incumbent that already absorbed candidates < k would change the hypotheses mid-family and void
Holm's guarantee. Rubric candidates are gated on predictive validity instead (`judge_rubric`).

Seeds. The arms sample with the gate's own per-(task, sample) seeds (coevo.sequential.seed_for,
passed as `EpisodeJob.task_seeds`), identical for both arms by construction; the incumbent
arm's scores are cached per (task, seed) and reused by every candidate of the round.

Across rounds. While the gated incumbent stays the same (asset versions AND checkpoint: a
harness-only run, or any run whose RL left no new checkpoint, after rounds that accepted
nothing), its seed base stays that of the stretch's first round, and the incumbent outcomes
that earlier rounds' decisions stored as evidence are reused on the same (task, seed): the
same assets, weights and seeds, so the same distribution, with no episode run or charged
twice. The stretch is read from the finished rounds' stored summaries (incumbent hashes,
accepted) and decisions, so a resumed round finds the same one. A rubric candidate's
validity still runs on this round's own incumbent episodes (it reads their trajectories).
Each decision's statistic records its `seed_base` and `incumbent_reused`, the pairs whose
incumbent side came from an earlier round (only decisions at the same base are reused), and
its `family_size`. A candidate with the same content as one an earlier round of the stretch
compared and rejected (a deterministic proposer, such as `demos` on the same trajectories or a
`knobs` sweep coming round again) is not compared again: the same assets, weights and seeds
draw from the same distribution (a rerun differs only through batch-dependent numerics), so a
new comparison would re-draw noise, and testing one hypothesis until it passes would inflate
the false-accept rate. It is rejected with that decision's evidence and no rollout, provided
that family was no larger (its levels no stricter than this round's).

Budget. Before each candidate the round's spend is checked (`coevo.ledger.GateLedger`); with a
rollout budget the comparison plans only as many val tasks as the rollouts left can pay for in
the worst case (both arms on every planned task), so a round never overshoots its budget, and
a candidate that cannot afford the screen is "not gated: budget".

Resume. Every arm evaluation is stored under an idempotency key (run, round, assets,
checkpoint, tasks and seeds; a unique index) with its budget charge in the same transaction, so
a gate resumed after a crash replays the same comparisons from stored rows: nothing is
evaluated or charged twice, and the ledger sees the spend an uninterrupted run saw. The round's
decisions are written in one transaction (all or none).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from coevo.evaluate import evaluate
from coevo.gate import Decision, Evidence, GatePolicy, decide_family
from coevo.killpoints import kill_point
from coevo.ledger import GATE_KEY, GateLedger, eval_charge
from coevo.propose.base import Candidate, Incumbent
from coevo.sequential import RunArm, compare, seed_for

Verdict = tuple[Decision, Evidence | list[dict[str, Any]] | None]  # rows: a rubric's validity


def gate_step(run: Any, r: int, incumbent: Incumbent,
              cands: list[tuple[str, Candidate, str]], *,
              gated: bool | None = None) -> list[Candidate]:
    """Decide every pending candidate and store the decisions (one transaction); returns the
    accepted candidates in proposal order (a resumed round returns the stored verdicts). With
    gate.human_review none is returned: the accepted ones stay pending until a person
    reviews them (coevo/reviewstep.py applies the reviews at a later round start). `gated`:
    judge with the gate (True) or accept every valid one (False); None: as the run's mode."""
    done = [c for _, c, s in cands if s == "accepted"]
    # Pending with a decision: accepted by the gate and held for review (gate.human_review).
    pending = [(pid, c) for pid, c, s in cands if s == "pending" and not run.store.decisions(pid)]
    if not pending:
        return done
    gated = run.mode.gated if gated is None else gated
    verdicts = (judge_gated if gated else judge_ungated)(run, r, incumbent, pending)
    hold = run.cfg.gate.human_review
    with run.store.transaction():
        for (pid, _), (d, evidence) in zip(pending, verdicts):
            held = hold and d.accepted
            run.store.add_decision(pid, policy=d.policy, accepted=d.accepted,
                                   reason=d.reason + ("; held for human review" if held else ""),
                                   statistic=d.statistic, rollouts=d.rollouts,
                                   evidence=evidence_rows(evidence), metric=d.metric,
                                   stages=d.stages, status="pending" if held else None)
    return [] if hold else [c for (_, c), (d, _) in zip(pending, verdicts) if d.accepted]


def evidence_rows(evidence: Evidence | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The store's evidence rows: a rubric's rows as they are, a comparison's pairs with both
    arms' outcome and partial credit."""
    if evidence is None or isinstance(evidence, list):
        return evidence or []
    return [{"task_id": p.task_id, "sample": p.sample, "incumbent": p.incumbent,
             "candidate": p.candidate, "incumbent_partial": p.incumbent_partial,
             "candidate_partial": p.candidate_partial, "status": p.status}
            for p in evidence.pairs]


def judge_ungated(run: Any, r: int, incumbent: Incumbent,
                  pending: list[tuple[str, Candidate]]) -> list[Verdict]:
    """Ungated ablation: every valid candidate is accepted, no evaluation. Several of one
    kind are applied in order, so the last one of each kind is what the incumbent keeps."""
    d = Decision(accepted=True, reason="ungated mode: every valid proposal is accepted",
                 statistic={}, policy="ungated", rollouts=0)
    return [(d, None) for _ in pending]


def judge_gated(run: Any, r: int, incumbent: Incumbent,
                pending: list[tuple[str, Candidate]]) -> list[Verdict]:
    """Sequential compare of each candidate with the round-start incumbent under C at the
    family's levels, then Holm over the family, then one winner per asset kind."""
    base, earlier = gate_seed(run, r, incumbent)
    arms = ArmScores(run, r, incumbent, GateLedger(run.store, run.id, r, run.cfg.budgets),
                     seed=base, prior=prior_incumbent_scores(run.store, run.id, earlier, base))
    m = sum(c.kind != "rubric" for _, c in pending)
    seen = prior_rejections(run.store, run.id, earlier, base, m)
    tested: list[tuple[int, Evidence]] = []
    out: list[Verdict | None] = [None] * len(pending)
    for i, (_, cand) in enumerate(pending):
        if cand.kind != "rubric" and cand.hash in seen:
            out[i] = seen[cand.hash]
            continue
        policy, short = affordable(run, arms.ledger)
        if policy is None:
            out[i] = (Decision(accepted=False, reason=f"not gated: round budget exhausted ({short})",
                               statistic={}, policy="budget", rollouts=0), None)
            continue
        rubric = cand.kind == "rubric"  # validity: the incumbent arm on every val task
        with arms.counting(f"round {r}: gate {i + 1}/{len(pending)}",
                           run.val if rubric else run.val[:policy.max_tasks], both=not rubric):
            if rubric:
                out[i] = judge_rubric(run, r, incumbent, cand, arms)
                continue
            evidence, _ = compare(arms.runner(incumbent.with_candidate(cand)), run.val, policy,
                                  samples=run.cfg.splits.val_samples, seed=base,
                                  test_guard=run.test_ids, family_size=m)
        tested.append((i, evidence))
        kill_point(f"gate_candidate:{r}:{i}")
    for (i, evidence), d in zip(tested, decide_family([e for _, e in tested], run.cfg.gate, m)):
        reused = sum((p.task_id, seed_for(p.task_id, p.sample, base)) in arms.prior
                     for p in evidence.pairs)
        out[i] = (d.model_copy(update={"statistic": {
            **d.statistic, "seed_base": float(base), "incumbent_reused": float(reused),
            "family_size": float(m)}}), evidence)
    _one_winner_per_kind(out, [c for _, c in pending])
    return out  # type: ignore[return-value]


def affordable(run: Any, ledger: GateLedger) -> tuple[GatePolicy | None, str]:
    """The gate policy for the next comparison, its planned tasks cut to what the round's
    rollouts left can pay for (both arms, every sample); (None, why) when not even the screen
    fits or another budget is used up."""
    exhausted = ledger.exhausted()
    if exhausted:
        return None, exhausted
    policy, left = run.cfg.gate, ledger.rollouts_left()
    if left is None:
        return policy, ""
    planned = min(len(run.val), policy.max_tasks or len(run.val))
    n = int(left // (2 * run.cfg.splits.val_samples))
    if n < min(policy.screen_size, planned):
        return None, f"rollouts left {left:g} cannot pay for a screen of {policy.screen_size} tasks"
    return (policy.model_copy(update={"max_tasks": n}) if n < planned else policy), ""


def judge_rubric(run: Any, r: int, incumbent: Incumbent, cand: Candidate,
                 arms: "ArmScores") -> Verdict:
    """A rubric is never gated on its own scores (a policy can always score higher on the
    rubric it is trained against): it is gated on predictive validity (`coevo.validity`) on
    the incumbent arm's val episodes under C, whose outcomes the verifier confirmed. Those
    are the same episodes the harness candidates are compared on (the cache, same seeds),
    completed to the whole val split; no candidate episodes are spent. Not part of the Holm
    family: the validity test has no sign-test p-value, it controls its own bootstrap level."""
    from coevo.validity import validity_decision

    if incumbent.rubric is None:
        return (Decision(accepted=False, reason="the incumbent has no rubric to compare with",
                         statistic={}, policy="validity", rollouts=0, metric="auc"), [])
    before = arms.ledger.spent.get("rollouts", 0.0)
    samples = run.cfg.splits.val_samples
    tasks = [t for t in run.val for _ in range(samples)]
    seeds = [seed_for(t.id, s, arms.seed) for t in run.val for s in range(samples)]
    arms.score(incumbent, tasks, seeds, cache=True, prior=False)  # this round's episodes, all val
    spent = int(arms.ledger.spent.get("rollouts", 0.0) - before)
    trajs = [t for e in arms.evaluations for t in run.store.trajectories(evaluation=e)]
    d, rows = validity_decision(incumbent.rubric, cand.asset, trajs, run.parts.env,
                                run.cfg.validity, judge=run.judge)
    return d.model_copy(update={"rollouts": spent, "metric": "auc"}), rows


def _one_winner_per_kind(out: list[Any], cands: list[Candidate]) -> None:
    def gain(d: Decision) -> float:
        return d.statistic.get("mean_diff", d.statistic.get("auc_diff", 0.0))

    best: dict[str, int] = {}
    for i, (d, _) in enumerate(out):
        if d.accepted:
            k = cands[i].kind
            if k not in best or gain(d) > gain(out[best[k]][0]):
                best[k] = i
    for i, (d, ev) in enumerate(out):
        if d.accepted and best[cands[i].kind] != i:
            out[i] = (d.model_copy(update={"accepted": False, "reason": f"{d.reason}; superseded "
                                           f"by a better accepted {cands[i].kind} this round"}), ev)


def gate_seed(run: Any, r: int, incumbent: Incumbent) -> tuple[int, list[int]]:
    """(The seed base of round r's gate, the earlier rounds gated with this same incumbent):
    walking back from r - 1, every finished round that ended with these hashes and accepted
    nothing was gated with them; the base is `seed + ` the stretch's first round (module
    docstring, "Across rounds")."""
    want = incumbent.hashes()
    done = {x.index: x.summary for x in run.store.rounds(run.id) if x.status == "done"}
    same, k = [], r - 1
    while k in done and done[k].get("incumbent") == want and not done[k].get("accepted"):
        same.append(k)
        k -= 1
    return run.cfg.seed + (same[-1] if same else r), same


def prior_incumbent_scores(store: Any, run: str, rounds: list[int],
                           base: int) -> dict[tuple[str, int], dict[str, float | None]]:
    """{(task id, seed): incumbent score} from the evidence the decisions of `rounds` stored
    (pairs whose incumbent side was scored) at seed base `base` (their `seed_base`)."""
    out: dict[tuple[str, int], dict[str, float | None]] = {}
    for k in rounds:
        for p in store.proposals(run, round=k):
            for d in store.decisions(p.id):
                if (d.statistic or {}).get("seed_base") != base:
                    continue  # another base (or a decision stored before bases were recorded)
                for e in d.evidence:
                    if e.incumbent is not None:
                        out[(e.task_id, seed_for(e.task_id, e.sample, base))] = {
                            "outcome": e.incumbent, "partial": e.incumbent_partial}
    return out


def prior_rejections(store: Any, run: str, rounds: list[int], base: int,
                     m: int) -> dict[str, Verdict]:
    """{candidate hash: the verdict to repeat} for the candidates that `rounds` (the stretch
    with this incumbent) compared at seed base `base` in a family of at most `m` and rejected:
    a rejection with that decision's evidence, policy and metric, and no rollout of its own."""
    out: dict[str, Verdict] = {}
    for k in rounds:
        for p in store.proposals(run, round=k):
            for d in store.decisions(p.id):
                st = d.statistic or {}
                if (d.accepted or p.candidate is None or st.get("seed_base") != base
                        or not 0 < st.get("family_size", m + 1) <= m or "mean_diff" not in st):
                    continue
                rows = [{"task_id": e.task_id, "sample": e.sample, "incumbent": e.incumbent,
                         "candidate": e.candidate, "incumbent_partial": e.incumbent_partial,
                         "candidate_partial": e.candidate_partial, "status": e.status}
                        for e in d.evidence]
                out[p.candidate] = (Decision(
                    accepted=False, policy=d.policy, metric=d.metric, rollouts=0,
                    statistic={"seed_base": float(base), "family_size": float(m)},
                    reason=f"rejected without a new comparison: the same candidate was compared "
                           f"with this incumbent (same assets, checkpoint and seeds) in round "
                           f"{k} (proposal {p.id[:12]}) and rejected: {d.reason}"), rows)
    return out


class ArmScores:
    """The gate's run_arm for round r: evaluate() on val tasks under checkpoint C for either
    arm, with the seeds the gate gives (base `seed`), each evaluation keyed so a resumed round
    reuses it. `prior`: the incumbent's scores from earlier rounds of its stretch."""

    def __init__(self, run: Any, r: int, inc: Incumbent, ledger: GateLedger,
                 seed: int | None = None, prior: dict[tuple[str, int], Any] | None = None):
        self.run, self.r, self.inc, self.ledger = run, r, inc, ledger
        self.seed = run.cfg.seed + r if seed is None else seed
        self.prior = prior or {}  # incumbent arm, earlier rounds: (task id, seed) -> score
        self.cache: dict[tuple[str, int], Any] = {}  # incumbent arm: (task id, seed) -> score
        self.evaluations: list[str] = []  # the incumbent arm's (their episodes, for rubrics)
        self.count = 0  # evaluations asked for this round (run or reused): the kill points
        self.phase, self.total, self.done, self.ran = "", 0, 0, 0  # the comparison's run.count

    @contextmanager
    def counting(self, phase: str, tasks: list[Any], both: bool) -> Iterator[None]:
        """Count the episodes run inside as `phase` (run.count): at most every task's samples
        for the candidate arm (`both`) plus those the incumbent arm has not cached; a
        sequential comparison that stops early ends its count where it stopped."""
        samples, seed = self.run.cfg.splits.val_samples, self.seed
        known = self.cache.keys() | self.prior.keys() if both else self.cache.keys()
        todo = sum((t.id, seed_for(t.id, s, seed)) not in known
                   for t in tasks for s in range(samples))
        self.phase, self.total, self.done = phase, todo + (len(tasks) * samples if both else 0), 0
        self.run.count(phase, 0, self.total)
        yield
        self.run.count(phase, self.done, self.done)
        self.phase = ""

    def _progress(self, done: int, total: int) -> None:  # one evaluation, within the phase
        self.ran = done
        self.run.count(self.phase, self.done + done, max(self.total, self.done + total))

    def runner(self, candidate: Incumbent) -> RunArm:
        def run_arm(arm: str, tasks: list[Any], seeds: list[int]) -> list[Any]:
            inc = arm == "incumbent"
            return self.score(self.inc if inc else candidate, tasks, seeds, cache=inc)
        return run_arm

    def score(self, who: Incumbent, tasks: list[Any], seeds: list[int], *, cache: bool,
              prior: bool = True) -> list[Any]:
        """Scores of `who` on (task, seed); the incumbent (`cache`) from this round's cache,
        then (`prior`) from earlier rounds', evaluating only what neither has."""
        keys = [(t.id, s) for t, s in zip(tasks, seeds)]
        known = ({**self.prior, **self.cache} if prior else self.cache) if cache else {}
        todo = [(t, s) for t, s in zip(tasks, seeds) if (t.id, s) not in known]
        got = self._evaluate(who, todo) if todo else {}
        if cache:
            self.cache.update(got)
            got = {**known, **got}
        return [got.get(k) for k in keys]

    def _evaluate(self, who: Incumbent, entries: list[tuple[Any, int]]) -> dict[tuple[str, int], Any]:
        by_task: dict[str, list[int]] = {}
        tasks: dict[str, Any] = {}
        for t, s in entries:
            by_task.setdefault(t.id, []).append(s)
            tasks[t.id] = t
        out: dict[tuple[str, int], Any] = {}
        for k in sorted({len(v) for v in by_task.values()}):  # one job per sample count
            seeds = {tid: v for tid, v in by_task.items() if len(v) == k}
            out.update(self._one(who, [tasks[tid] for tid in seeds], seeds, k))
        return out

    def _one(self, who: Incumbent, tasks: list[Any], seeds: dict[str, list[int]],
             samples: int) -> dict[tuple[str, int], Any]:
        run, r = self.run, self.r
        key = arm_key(run.id, r, who, seeds)

        def charge(res: Any) -> None:
            run.store.charge(run.id, eval_charge(res), round=r, key=f"{GATE_KEY}{key}")

        self.ran = 0
        res = evaluate(run.store, run.parts.env, who.agent_assets(), run.parts.backend,
                       tasks=tasks, split="val", samples=samples, task_seeds=seeds,
                       checkpoint=who.checkpoint, run=run.id, round=r, judge=run.judge,
                       key=key, on_stored=charge, progress=self._progress if self.phase else None)
        self.done += self.ran
        self.ledger.add(eval_charge(res))
        if who is self.inc:
            self.evaluations.append(res.evaluation)
        kill_point(f"gate_eval:{r}:{self.count}")
        self.count += 1
        rows = run.store.get_evaluation(res.evaluation).results
        return {(x.task_id, seeds[x.task_id][x.sample]):
                None if x.outcome is None or x.status != "ok" else
                {"outcome": x.outcome, "partial": unit_reward(x.reward, who.rubric)} for x in rows}


def arm_key(run: str, r: int, who: Incumbent, seeds: dict[str, list[int]]) -> str:
    """The idempotency key of one arm evaluation: run, round, the arm's asset versions and
    checkpoint, and every task with its seeds, in order."""
    blob = json.dumps({"run": run, "round": r, "arm": who.hashes(),
                       "seeds": list(seeds.items())}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def unit_reward(reward: float | None, rubric: Any) -> float | None:
    """The reward on [0, 1] for the `soft` gate: outcome_weight * outcome + partial credit
    (each in [0, 1]) over its maximum, outcome_weight + 1 (the outcome itself without a rubric)."""
    if reward is None:
        return None
    top = 1.0 if rubric is None else rubric.outcome_weight + (1.0 if rubric.criteria else 0.0)
    x = reward / top if top > 0 else 0.0
    return min(max(float(x), 0.0), 1.0)
