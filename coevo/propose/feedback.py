"""The verifier's diagnosis of a round's failed TRAIN episodes, for the proposers' digest.

GEPA's feedback function: a proposer edits better against "wrong type for parameter 'base'"
than against a bare 0. Trajectories are stored without the environment's `Score` (their
`outcome` is), so the diagnosis is re-derived here, after the fact: each failed episode's
response is rebuilt from the stored turns and scored again by the environment's own verifier
(`coevo.validity.rebuild`'s route), and its `Score.feedback` kept. Verifiers are
deterministic, so this is the diagnosis the episode got.

Held-out data. A feedback line may name the expected answer ("expected 33, given 32"), so only
train-split trajectories are diagnosed, and only against the environment's train split (a
trajectory whose task is not a train task gets none); the digest drops any feedback of a
non-train trajectory a caller passes anyway (coevo/propose/digest.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coevo.envs.base import Feedback
from coevo.errors import CoevoError, InfraError
from coevo.trajectory import Trajectory

TRAIN = "train"


def verifier_feedback(env: Any, trajectories: Sequence[Trajectory]) -> dict[str, Feedback]:
    """Trajectory id -> the verifier's Feedback, for every failed, scored train trajectory
    whose environment gives one. Never raises for one episode: a task the train split does not
    hold, or a verifier that cannot run (InfraError), just gets no feedback."""
    from coevo.validity import replay_state, response_of

    failed = [t for t in trajectories
              if t.split == TRAIN and not t.success and not t.infra_failed and t.outcome is not None]
    if not failed or env is None:
        return {}
    try:
        tasks = {x.id: x for x in env.tasks(TRAIN)}
    except CoevoError:
        return {}
    out: dict[str, Feedback] = {}
    for t in failed:
        task = tasks.get(t.task_id)
        if task is None or t.env != getattr(env, "name", t.env):
            continue
        try:
            score = env.score(task, replay_state(env, task, t), response_of(t))
        except (InfraError, CoevoError):
            continue
        if score.feedback is not None and not score.success:
            out[t.id] = score.feedback
    return out
