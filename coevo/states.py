"""Environment states of an episode, read from its token sequence (no torch, no model).

An episode's state before turn k is identified by the tokens the policy saw since its previous
turn: its "anchor". Used by the GiGPO estimator (coevo/rl/estimators/gigpo.py: turns from the
same state share an anchor group) and by Reach-or-Solve (coevo/reach.py: which states two
checkpoints reached).
"""

from __future__ import annotations

import hashlib
from typing import Literal

from coevo.trajectory import Trajectory

Anchor = Literal["observation", "history"]


def anchor_key(traj: Trajectory, k: int, anchor: Anchor = "observation") -> tuple[str, str]:
    """(task id, hash of the tokens before turn k): turns with equal keys share a state.
    "observation" hashes only the tokens since the previous turn (the prompt for turn 0): the
    same environment state reached by any path; "history" hashes the whole prefix."""
    turn = traj.turns[k]
    lo = 0 if anchor == "history" or k == 0 else traj.turns[k - 1].end
    ids = traj.token_ids[lo: turn.start]
    return traj.task_id, hashlib.blake2b(",".join(map(str, ids)).encode(), digest_size=16).hexdigest()
