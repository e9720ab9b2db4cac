"""`fst`: Fast-Slow Training style co-evolution (GEPA blog, 2026-05, "fast-slow").

    population = [(seed harness, its per-task val scores)]
    for round r:
        front  = Pareto front of the population over val tasks       # GEPA's candidate selection
        C      = RL for T steps (fst.every), each group's harness drawn from the front
        parent = a front member (drawn as GEPA draws: by how many tasks it is best on)
        cands  = proposers(parent, its rollouts of this round)       # the reflective round
        for cand: scores = val(cand under C); joins the population iff no member dominates it
        incumbent = (best member by val mean, C)                      # what val / test score

The fast loop is RL (weights), the slow one reflective prompt evolution (the harness); the two
meet in the rollouts, which sample harnesses from the front so the policy trains under every
prompt that is still best somewhere.

Reused from the `gepa` package (the code coevo's `gepa` proposer runs on): the per-task front
and its pruning (`gepa.gepa_utils.remove_dominated_programs`) and the parent draw
(`select_program_candidate_from_pareto_front`). The reflection is the run's proposers: with
`gepa` configured it is GEPA's own reflective search seeded with the parent's texts; with
`harness` it is one reflective rewrite from the parent's failed rollouts.

Departures from the blog's recipe: one reflection round per T RL steps is one coevo round (an
fst round runs T = `fst.every` steps, default `rl.stage.steps`, then reflects), so RL and
reflection interleave at round boundaries and a crash resumes at either; members keep the val
scores they were measured with (under the checkpoint of the round they joined) instead of
being re-scored after every RL stage, which would cost the whole population's val episodes
per round; no statistical gate (as the blog); a candidate tying a member on every val task is
dominated (weak dominance), so copies do not crowd the front; candidates of other kinds
(skills, rubrics) are recorded as rejected: the slow loop evolves the harness only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coevo.modes.common import Scores, decide, evidence, mean, note, pending_of, val_scores
from coevo.propose.base import Candidate, Incumbent

POLICY = "fst"


class Member(BaseModel):
    """One harness of the population: its hash, per-task val scores, and where it came from."""

    model_config = ConfigDict(extra="forbid")
    harness: str
    scores: Scores = Field(default_factory=dict)
    round: int = 0
    proposal: str | None = None  # None: the seed

    @property
    def mean(self) -> float:
        return mean(self.scores)


def task_fronts(pop: list[Member]) -> dict[str, set[int]]:
    """Per val task, the members with the top score on it (GEPA's
    program_at_pareto_front_valset); a task a member was not scored on counts 0 for it."""
    tasks = sorted({t for m in pop for t in m.scores})
    out = {}
    for t in tasks:
        top = max(m.scores.get(t, 0.0) for m in pop)
        out[t] = {i for i, m in enumerate(pop) if m.scores.get(t, 0.0) == top}
    return out


def pareto_front(pop: list[Member]) -> list[int]:
    """Indices of the members on the Pareto front over val tasks, as GEPA selects candidates:
    the per-task fronts with dominated members pruned (`remove_dominated_programs`)."""
    from gepa.gepa_utils import remove_dominated_programs

    if len(pop) == 1:
        return [0]
    kept = remove_dominated_programs(task_fronts(pop), scores={i: m.mean for i, m in enumerate(pop)})
    return sorted(set().union(*kept.values())) if kept else list(range(len(pop)))


def draw(pop: list[Member], rng: random.Random) -> int:
    """A front member, drawn as GEPA draws a parent: weighted by the tasks it is best on."""
    from gepa.gepa_utils import select_program_candidate_from_pareto_front

    if len(pop) == 1:
        return 0
    return select_program_candidate_from_pareto_front(task_fronts(pop), [m.mean for m in pop], rng)


def dominator(pop: list[Member], scores: Scores) -> int | None:
    """The first member scoring at least as well as `scores` on every val task (None: the
    candidate is not dominated)."""
    tasks = {t for m in pop for t in m.scores} | set(scores)
    for i, m in enumerate(pop):
        if all(m.scores.get(t, 0.0) >= scores.get(t, 0.0) for t in tasks):
            return i
    return None


def population(run: Any, r: int, incumbent: Incumbent) -> list[Member]:
    """The population round r starts from: the last done round's, else the seed harness
    alone, scored on val under the incumbent's checkpoint (charged, keyed)."""
    for rec in sorted(run.store.rounds(run.id), key=lambda x: -x.index):
        if rec.index < r and rec.status == "done" and "fst" in rec.summary:
            return [Member.model_validate(m) for m in rec.summary["fst"]["population"]]
    scores, _ = val_scores(run, r, incumbent, "fst: seed on val")
    return [Member(harness=incumbent.harness.hash, scores=scores, round=r)]


def harness_sampler(run: Any, pop: list[Member]) -> Callable[[int, Any], Any]:
    """The RL stage's per-group harness: a front member drawn with (seed, step, task)."""
    harnesses = {m.harness: run.store.get_asset("harness", m.harness) for m in pop}

    def pick(step: int, task: Any) -> Any:
        rng = random.Random(f"fst:{run.cfg.seed}:{step}:{task.id}")
        return harnesses[pop[draw(pop, rng)].harness]
    return pick


def fst_round(run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    from coevo.loop import propose_step, rl_step

    done = run.store.get_round(run.id, r).summary.get("fst")
    pop = population(run, r, incumbent)
    front = pareto_front(pop)
    every = run.cfg.fst.every or run.cfg.rl.stage.steps
    incumbent = rl_step(run, r, incumbent, stage=run.cfg.rl.stage.model_copy(update={"steps": every}),
                        harness_for=harness_sampler(run, [pop[i] for i in front]))
    if done is not None:  # a resumed round that had finished its reflection
        pop = [Member.model_validate(m) for m in done["population"]]
        return _best(run, incumbent, pop), []
    p = draw(pop, random.Random(f"fst:{run.cfg.seed}:{r}:parent"))
    parent = incumbent.model_copy(update={"harness": run.store.get_asset("harness", pop[p].harness)})
    trajs = run.store.trajectories(run.id, round=r, split="train")
    own = [t for t in trajs if t.harness == parent.harness.hash] or trajs
    cands = propose_step(run, r, parent, own)
    accepted, pending = pending_of(cands)
    decisions = []
    for i, (pid, cand) in enumerate(pending):
        if cand.kind != "harness":
            decisions.append((pid, False, f"fst: evolves the harness only; a {cand.kind} "
                                          "candidate is not evaluated", {}, 0, []))
            continue
        scores, n = val_scores(run, r, parent.with_candidate(cand), f"fst: candidate {i + 1}")
        k = dominator(pop, scores)
        stat = {"val_mean": mean(scores), "parent": p, "parent_val_mean": pop[p].mean}
        if k is None:
            pop.append(Member(harness=cand.hash, scores=scores, round=r, proposal=pid))
            accepted.append(cand)
            why = (f"fst: non-dominated, joins population as member {len(pop) - 1} "
                   f"(val mean {mean(scores):.3f}; parent {p}: {pop[p].mean:.3f})")
        else:
            why = (f"fst: dominated by member {k} (val mean {pop[k].mean:.3f}, at least as good "
                   f"on every val task; candidate {mean(scores):.3f})")
        decisions.append((pid, k is None, why, stat, n, evidence(pop[p].scores, scores)))
    with run.store.transaction():
        for pid, ok, why, stat, n, rows in decisions:
            decide(run, pid, POLICY, ok, why, statistic=stat, rollouts=n, rows=rows)
        note(run, r, fst={"population": [m.model_dump(mode="json") for m in pop],
                          "front": [pop[i].harness for i in front], "parent": p, "every": every})
    return _best(run, incumbent, pop), accepted


def _best(run: Any, incumbent: Incumbent, pop: list[Member]) -> Incumbent:
    """The incumbent the round ends with: the member with the highest val mean (the first of
    equals), under this round's checkpoint."""
    best = max(range(len(pop)), key=lambda i: (pop[i].mean, -i))
    if pop[best].harness == incumbent.harness.hash:
        return incumbent
    return incumbent.model_copy(update={"harness": run.store.get_asset("harness", pop[best].harness)})
