"""The `demos` proposer on hand-built trajectories: picks successes by reward, one per task and
spread over families, strips what the harness put into the transcript, returns a harness child."""

from __future__ import annotations

from coevo.assets.harness import Harness
from coevo.propose import Incumbent, ProposalContext, check_candidate, make_proposer
from coevo.trajectory import Trajectory

H = Harness.model_validate({"name": "h", "system_prompt": "Be brief.", "demos": [{"messages": [
    {"role": "user", "content": "old q"}, {"role": "assistant", "content": "old a"}]}]})


def traj(task: str, reward: float, success: bool = True, **kw) -> Trajectory:
    msgs = [{"role": "system", "content": "Be brief."}, *H.demo_messages(),
            {"role": "user", "content": f"q {task}"}, {"role": "assistant", "content": f"a {task} {reward}"}]
    return Trajectory(env="e", task_id=task, success=success, reward=reward, outcome=float(success),
                      messages=msgs, harness=H.hash, **kw)


def ctx(trajs):
    return ProposalContext(run="r", round=0, incumbent=Incumbent(harness=H), trajectories=trajs,
                           harnesses={H.hash: H})


def test_picks_best_success_per_task_across_families_and_strips_harness_messages():
    trajs = [traj("add-1", 0.9), traj("add-1", 1.0), traj("add-2", 0.95), traj("mul-1", 0.5),
             traj("add-3", 1.0, success=False), traj("mul-2", 1.0, split="val")]
    [cand] = make_proposer("demos", k=2).propose(ctx(trajs))
    demos = cand.asset.demos
    assert [d.source for d in demos] == ["add-1", "mul-1"]  # family diversity beats add-2's 0.95
    assert [m.content for m in demos[0].messages] == ["q add-1", "a add-1 1.0"]  # best sample
    assert cand.asset.parent == H.hash and check_candidate(cand, ctx(trajs).incumbent) is None


def test_keep_and_no_success_means_no_candidate():
    [cand] = make_proposer("demos", k=1, keep=1).propose(ctx([traj("t-1", 1.0)]))
    assert [d.source for d in cand.asset.demos] == [None, "t-1"]
    assert make_proposer("demos").propose(ctx([traj("t-1", 1.0, success=False)])) == []
