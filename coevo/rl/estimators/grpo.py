"""`grpo`: the group-relative episode advantage (DeepSeekMath; coevo/rl/grpo.py), the default.

Every token of a trajectory gets (r_i - mean(r)) / (std(r) + eps) over its group (or r_i -
mean(r) with advantage_scale "none"); no per-turn credit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coevo.rl.estimators.base import ESTIMATORS, Credit, Estimator
from coevo.rl.grpo import Scale, group_advantages
from coevo.trajectory import Trajectory


def episode_advantages(groups: Mapping[str, Sequence[Trajectory]], scale: Scale,
                       eps: float) -> dict[str, list[float]]:
    """{group id: group-relative advantage of each member's reward}."""
    return {gid: group_advantages([float(t.reward) for t in members], scale=scale, eps=eps)
            for gid, members in groups.items()}


@ESTIMATORS.register("grpo")
class GrpoEstimator(Estimator):
    def credit(self, groups: Mapping[str, Sequence[Trajectory]]) -> dict[str, list[Credit]]:
        return {gid: [Credit(a) for a in advs]
                for gid, advs in episode_advantages(groups, self.scale, self.eps).items()}
