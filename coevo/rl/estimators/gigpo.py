"""`gigpo`: Group-in-Group Policy Optimization (Feng et al. 2025, "Group-in-Group Policy
Optimization for LLM Agent Training"): step-level credit from repeated environment states.

The episode level is GRPO's: A^E_i = (R_i - mean_G R) / (std_G R + eps). The step level groups
the turns of the whole batch by their *anchor state*; every turn (i, k) that starts from the
same state s gets, within that anchor group,

    R_{i,k}   = sum_{j >= k} gamma^(j-k) r_{i,j}              (discounted return from turn k)
    A^S_{i,k} = (R_{i,k} - mean_s R) / (std_s R + eps)        (group_advantages over the anchor)
    A_{i,k}   = A^E_i + weight * A^S_{i,k}                   (every token of turn k)

so two actions taken from the same state are compared by what followed them, even inside
groups whose episodes all scored alike. A state seen once has A^S = 0.

Choices where the paper leaves room or coevo differs:
- Rewards are per episode: r_{i,j} = 0 for every turn but the last, which gets R_i, so
  R_{i,k} = gamma^(T_i - 1 - k) R_i (the paper's sparse-reward setting; gamma = 0.95, weight
  = 1 are its defaults).
- The anchor is a hash of the token ids the policy saw before the turn, keyed by task id:
  `anchor="observation"` (default) hashes only the observation since the previous turn (the
  prompt for turn 0; tool results and user messages after), the paper's "same environment
  state" reached by any path; `anchor="history"` hashes the whole prefix, so only turns with
  identical histories are compared (a strict tree of prefixes, never a false match).
- Anchor groups span the batch (not one episode group): the same task sampled in two groups of
  a step pools its states. A state met twice in one episode contributes both turns.
- On single-turn episodes every turn's anchor is its prompt, so the anchor group is the
  episode group and A = (1 + weight) A^E: GRPO with a larger step size, nothing more. GiGPO
  is meant for multi-turn environments (bfcl-multi:).
- Std scaling follows `TrainConfig.advantage_scale` at both levels ("none": Dr. GRPO's
  unscaled variant, which the paper also reports).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coevo.rl.estimators.base import ESTIMATORS, Credit, Estimator
from coevo.rl.estimators.grpo import episode_advantages
from coevo.rl.grpo import group_advantages
from coevo.states import anchor_key
from coevo.trajectory import Trajectory


class GigpoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weight: float = Field(1.0, ge=0.0)  # omega: weight of the step-level advantage
    gamma: float = Field(0.95, gt=0.0, le=1.0)  # discount of later turns' rewards
    anchor: Literal["observation", "history"] = "observation"


def step_returns(traj: Trajectory, gamma: float) -> list[float]:
    """Discounted return from each turn with the episode reward on the last turn.

    >>> from coevo.trajectory import Turn
    >>> t = Trajectory(env="e", task_id="t", reward=1.0, turns=[
    ...     Turn(index=i, start=i, end=i, text="") for i in range(3)])
    >>> step_returns(t, 0.5)
    [0.25, 0.5, 1.0]
    """
    n = len(traj.turns)
    return [gamma ** (n - 1 - k) * float(traj.reward) for k in range(n)]


@ESTIMATORS.register("gigpo")
class GigpoEstimator(Estimator):
    Options = GigpoOptions

    def step_advantages(self, groups: Mapping[str, Sequence[Trajectory]]
                        ) -> dict[tuple[str, int, int], float]:
        """{(group id, member, turn): A^S} over the anchor groups of the whole batch."""
        o = self.options
        anchors: dict[tuple[str, str], list[tuple[tuple[str, int, int], float]]] = defaultdict(list)
        for gid, members in groups.items():
            for i, t in enumerate(members):
                for k, ret in enumerate(step_returns(t, o.gamma)):
                    anchors[anchor_key(t, k, o.anchor)].append(((gid, i, k), ret))
        out: dict[tuple[str, int, int], float] = {}
        for items in anchors.values():
            advs = group_advantages([r for _, r in items], scale=self.scale, eps=self.eps)
            out.update((where, a) for (where, _), a in zip(items, advs))
        return out

    def credit(self, groups: Mapping[str, Sequence[Trajectory]]) -> dict[str, list[Credit]]:
        episode = episode_advantages(groups, self.scale, self.eps)
        step = self.step_advantages(groups)
        w = self.options.weight
        out: dict[str, list[Credit]] = {}
        for gid, members in groups.items():
            out[gid] = [
                Credit(a, tuple(a + w * step[(gid, i, k)] for k in range(len(t.turns)))
                       if t.turns else None)
                for i, (t, a) in enumerate(zip(members, episode[gid]))]
        return out
