"""`progress`: per-turn verified-progress credit (ProCredit-style process credit).

The episode advantage (GRPO's) says whether the whole episode beat its group; it cannot tell
the turn that made real progress in a failed episode from the turn that undid it. This
estimator re-runs the rubric's verifier-backed checks on the state after every turn and
credits each turn with the change in (weighted) checks passed:

    P_k   = sum_c w_c s_c(state_k) / sum_c w_c         (state_0: before any turn)
    D_k   = P_{k+1} - P_k                              (turn k, 0-based; in [-1, 1])
    A_k   = A^E_i + weight * D_k                       (every token of turn k)

so a turn that made verified progress is reinforced even when the episode fails, and one
that broke a passing check is pushed down even when the episode succeeds.

What each check sees (the state after turn k): the episode as if it had stopped after turn k
(`prefix`): its first k turns, the answer being the k-th turn's text (the stored extracted
answer after the last turn), the Response built as the verifier saw the whole episode
(coevo.validity.response_of), and the environment's Score on its state replayed through those
k turns (coevo.validity.replay_state, a fresh `env.start` each time). State 0 has no turns and
an empty answer.

Checks: the rubric's criteria except `llm_judge` (not verifier-backed); the rubric validity
rule (coevo/validity.py) still governs which rubrics are accepted. Criteria with prerequisites
count as the reward pays them (coevo.rewards.paid_criteria). Without a rubric the one check is
the verifier's outcome. A check that cannot be scored at some state of an episode
(missing data, e.g. a detail reported only for final answers) is left out of that episode's
P entirely, so appearing or vanishing is never mistaken for progress; an episode whose
verifier cannot run (InfraError) or with no check scored at every state gets the episode
advantage alone.

Departures: ProCredit learns a progress estimate; here progress is measured by re-running
checks, which costs T + 1 verifier calls per episode of T turns (each replaying the episode
from the start, so O(T^2) environment steps) and needs a deterministic environment. D_k is not
normalised within the group: it is already on the reward's scale of [0, 1] per check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from coevo.errors import CoevoError
from coevo.rl.estimators.base import ESTIMATORS, Credit, Estimator
from coevo.rl.estimators.grpo import episode_advantages
from coevo.trajectory import Trajectory


class ProgressOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weight: float = Field(1.0, ge=0.0)  # weight of the per-turn progress term


def prefix(traj: Trajectory, k: int) -> Trajectory:
    """The episode stopped after its first k turns (the state the checks see after turn k-1)."""
    n = len(traj.turns)
    answer = traj.answer if k == n else (traj.turns[k - 1].text if k else "")
    return traj.model_copy(update={"turns": traj.turns[:k], "answer": answer})


def verifier_checks(rubric):
    """The rubric's verifier-backed criteria (no llm_judge), or None: the outcome alone."""
    if rubric is None:
        return None
    kept = [c for c in rubric.criteria if c.kind != "llm_judge"]
    return rubric.model_copy(update={"criteria": kept}) if kept else None


def progress_curves(trajs: Sequence[Trajectory], env, rubric) -> list[list[float] | None]:
    """P_0 .. P_T of each trajectory (None: not measurable; see the module docstring)."""
    from coevo.rewards import paid_criteria, score_rubric
    from coevo.validity import rebuild

    checks = verifier_checks(rubric)
    states = [[prefix(t, k) for k in range(len(t.turns) + 1)] for t in trajs]
    rebuilt = iter(rebuild([p for ps in states for p in ps], env))
    out: list[list[float] | None] = []
    for ps in states:
        scored = []
        for p, r in zip(ps, [next(rebuilt) for _ in ps]):
            if r is None:
                scored.append(None)
            elif checks is None:
                scored.append({"outcome": float(r[2].outcome)})
            else:
                scored.append(paid_criteria(checks, score_rubric(checks, *r, trajectory=p)))
        if any(s is None for s in scored):
            out.append(None)
            continue
        common = set.intersection(*(set(s) for s in scored))
        weights = {c.id: c.weight for c in checks.criteria} if checks else {"outcome": 1.0}
        total = sum(weights[c] for c in common)
        out.append([sum(weights[c] * s[c] for c in common) / total for s in scored]
                   if total > 0 else None)
    return out


@ESTIMATORS.register("progress")
class ProgressEstimator(Estimator):
    Options = ProgressOptions

    def credit(self, groups: Mapping[str, Sequence[Trajectory]]) -> dict[str, list[Credit]]:
        env = self.context.env
        if env is None:
            raise CoevoError("rl.train.estimator 'progress' re-runs the rubric's checks and "
                             "needs the environment (Trainer.context, bound by the RL stage)")
        episode = episode_advantages(groups, self.scale, self.eps)
        members = [t for ms in groups.values() for t in ms]
        curves = iter(progress_curves(members, env, self.context.rubric))
        w = self.options.weight
        out: dict[str, list[Credit]] = {}
        for gid, ms in groups.items():
            out[gid] = []
            for t, a in zip(ms, episode[gid]):
                p = next(curves)
                turns = None if p is None or not t.turns else tuple(
                    a + w * (p[k + 1] - p[k]) for k in range(len(t.turns)))
                out[gid].append(Credit(a, turns))
        return out
