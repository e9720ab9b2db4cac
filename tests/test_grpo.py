"""The GRPO objective and batch building: hand-computed values, masks, errors (no model)."""

from __future__ import annotations

import math

import pytest
import torch

from coevo.rl.batch import TrajectoryError, make_microbatch, microbatches, plan_grpo, plan_sft
from coevo.rl.grpo import group_advantages, groups_with_signal, k3_kl, masked_nll, policy_loss
from coevo.rl.trainer import token_logprobs
from coevo.trajectory import Trajectory


# -- advantages ----------------------------------------------------------------------------
def test_advantages_none_is_reward_minus_mean():
    assert group_advantages([1.0, 0.0, 0.0, 0.0], scale="none") == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_advantages_std_divides_by_population_std():
    # mean 0.25, population std sqrt(0.1875) = 0.4330127
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], scale="std", eps=0.0)
    assert adv == pytest.approx([0.75 / 0.4330127, -0.25 / 0.4330127, -0.25 / 0.4330127, -0.25 / 0.4330127])
    adv = group_advantages([2.0, 4.0], scale="std", eps=1e-6)  # std 1
    assert adv == pytest.approx([-1.0 / (1 + 1e-6), 1.0 / (1 + 1e-6)], abs=1e-12)


def test_all_equal_group_is_zero_and_has_no_signal():
    assert group_advantages([0.1, 0.1, 0.1], scale="std") == [0.0, 0.0, 0.0]
    keep, frac = groups_with_signal({"a": [0.1, 0.1], "b": [1.0, 0.0], "c": [0.0], "d": [1, 1, 0]})
    assert keep == ["b", "d"] and frac == 0.5
    assert groups_with_signal({}) == ([], 0.0)


def test_bad_scale_is_a_clear_error():
    with pytest.raises(ValueError, match="scale"):
        group_advantages([1.0, 0.0], scale="rank")


# -- policy loss ---------------------------------------------------------------------------
def test_policy_loss_hand_computed_with_clipping():
    # token 0: ratio e^0.5 = 1.6487 > 1.2 with A > 0 -> clipped to 1.2
    # token 1: ratio 1 -> -A; token 2 masked; row 1: A < 0, ratio e^-0.5 = 0.6065 < 0.8 -> 0.8
    new = torch.tensor([[0.5, 0.0, 9.0], [-0.5, 0.0, 0.0]])
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, m = policy_loss(new, old, None, adv, mask, 0.2, 0.2, agg="token")
    # per token -min(r A, clip(r) A): -1.2, -1.0, and for A=-2: -min(-1.213, -1.6) = 1.6
    assert float(loss) == pytest.approx((-1.2 - 1.0 + 1.6) / 3, abs=1e-6)
    assert m["tokens"] == 3 and m["clip_fraction"] == pytest.approx(2 / 3)
    seq, _ = policy_loss(new, old, None, adv, mask, 0.2, 0.2, agg="sequence")
    assert float(seq) == pytest.approx(((-1.2 - 1.0) / 2 + 1.6) / 2, abs=1e-6)


def test_asymmetric_clip_uses_high_bound():
    new = torch.tensor([[math.log(1.25)]])
    loss, m = policy_loss(new, torch.zeros(1, 1), None, torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.28)
    assert float(loss) == pytest.approx(-1.25) and m["clip_fraction"] == 0.0


def test_loss_ignores_masked_positions_and_gives_them_zero_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)  # [B, W, V]
    targets = torch.randint(0, 11, (2, 5))
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 0, 1, 1, 0]], dtype=torch.float32)
    old = torch.randn(2, 5) * 0.1 - 2.0
    ref = torch.randn(2, 5) * 0.1 - 2.0
    adv = torch.tensor([0.7, -1.3])
    new = token_logprobs(logits, targets)
    loss, _ = policy_loss(new, old, ref, adv, mask, 0.2, 0.28, kl_coef=0.3)
    loss.backward()
    g = logits.grad
    assert torch.count_nonzero(g[mask == 0]) == 0  # exactly zero at every masked column
    assert torch.count_nonzero(g[mask == 1]) > 0
    # Garbage (even inf) in old / ref / new at masked positions changes nothing.
    old2, ref2, new2 = old.clone(), ref.clone(), new.detach().clone()
    old2[mask == 0], ref2[mask == 0], new2[mask == 0] = float("inf"), -float("inf"), 123.0
    a, _ = policy_loss(new.detach(), old, ref, adv, mask, 0.2, 0.28, kl_coef=0.3)
    b, _ = policy_loss(new2, old2, ref2, adv, mask, 0.2, 0.28, kl_coef=0.3)
    assert torch.isfinite(b) and float(a) == float(b)


def test_k3_kl_is_zero_iff_equal_and_positive_otherwise():
    x = torch.tensor([-1.0, -2.0, -0.5])
    assert torch.equal(k3_kl(x, x), torch.zeros(3))
    assert bool((k3_kl(x, x + torch.tensor([0.3, -0.2, 1.0])) > 0).all())
    loss, m = policy_loss(x[None], x[None], x[None] + 0.5, torch.zeros(1), torch.ones(1, 3), kl_coef=2.0)
    kl = math.exp(0.5) - 0.5 - 1
    assert m["kl"] == pytest.approx(kl) and float(loss) == pytest.approx(2.0 * kl)


def test_microbatch_losses_sum_to_the_batch_loss_with_a_global_denominator():
    torch.manual_seed(1)
    new, old = torch.randn(4, 6), torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.4).float()
    adv = torch.randn(4)
    for agg, denom in (("token", float(mask.sum())), ("sequence", 4.0)):
        whole, _ = policy_loss(new, old, None, adv, mask, agg=agg)
        parts = sum(policy_loss(new[i:i + 2], old[i:i + 2], None, adv[i:i + 2], mask[i:i + 2],
                                agg=agg, denom=denom)[0] for i in (0, 2))
        assert float(parts) == pytest.approx(float(whole), abs=1e-6)


def test_masked_nll():
    new = torch.tensor([[-1.0, -2.0, -3.0]])
    loss, m = masked_nll(new, torch.tensor([[0.0, 1.0, 1.0]]))
    assert float(loss) == pytest.approx(2.5) and m["tokens"] == 2


# -- batch building ------------------------------------------------------------------------
def _traj(tid, group, ids, mask, reward=1.0, prompt_len=3, **kw):
    lp = [-0.5 if m else 0.0 for m in mask]
    return Trajectory(id=tid, env="t", task_id="x", group_id=group, token_ids=ids, loss_mask=mask,
                      logprobs=lp, prompt_len=prompt_len, reward=reward, **kw)


def test_untrainable_or_empty_trajectories_are_refused_by_id():
    ok = dict(ids=[1, 2, 3, 4], mask=[0, 0, 0, 1])
    bad = _traj("t-untrainable", "g", **ok, trainable=False)
    with pytest.raises(TrajectoryError, match="t-untrainable: trainable"):
        plan_grpo([bad, _traj("b", "g", **ok, reward=0.0)])
    with pytest.raises(TrajectoryError, match="t-empty: token_ids"):
        plan_grpo([_traj("t-empty", "g", [], [], prompt_len=0), _traj("b", "g", **ok, reward=0.0)])
    with pytest.raises(TrajectoryError, match="t-p: loss_mask: is 1 inside the first prompt"):
        plan_grpo([_traj("t-p", "g", [1, 2, 3, 4], [0, 1, 0, 1]), _traj("b", "g", **ok, reward=0)])
    with pytest.raises(TrajectoryError, match="t-0: loss_mask: is 1 at position 0"):
        plan_grpo([_traj("t-0", "g", [1, 2], [1, 1], prompt_len=0), _traj("b", "g", **ok, reward=0)])
    no_lp = Trajectory(id="t-nolp", env="t", task_id="x", group_id="g", token_ids=[1, 2, 3, 4],
                       loss_mask=[0, 0, 0, 1], prompt_len=3, reward=1.0)
    with pytest.raises(TrajectoryError, match="t-nolp: logprobs"):
        plan_grpo([no_lp, _traj("b", "g", **ok, reward=0.0)])
    plan = plan_grpo([no_lp, _traj("b", "g", **ok, reward=0.0)], need_logprobs=False)
    assert len(plan.samples) == 2


def test_infra_failures_are_excluded_from_their_group_and_counted():
    trajs = [
        _traj("a", "g1", [1, 2, 3, 4, 5], [0, 0, 0, 1, 1], reward=1.0),
        _traj("b", "g1", [1, 2, 3, 6], [0, 0, 0, 1], reward=0.0),
        # an infra failure: no tokens, untrainable: excluded, not an error, not a zero reward
        Trajectory(id="c", env="t", task_id="x", group_id="g1", status="infra_error",
                   trainable=False, reward=None),
        _traj("d", "g2", [1, 2, 3, 7], [0, 0, 0, 1], reward=0.5),
        _traj("e", "g2", [1, 2, 3, 8], [0, 0, 0, 1], reward=0.5),
        _traj("f", "g3", [9, 9, 9, 8], [0, 0, 0, 1], reward=None),  # never rewarded
    ]
    plan = plan_grpo(trajs, scale="none")
    assert plan.excluded == 2 and plan.skipped == 2 and plan.n_groups == 2
    assert plan.signal_fraction == 0.5
    assert [s.traj_id for s in plan.samples] == ["a", "b"]
    assert [s.advantage for s in plan.samples] == [0.5, -0.5]
    assert plan.reward_mean == pytest.approx((1.0 + 0.0 + 0.5 + 0.5) / 4)
    assert plan.groups[0].shared_len == 3  # same first prompt


def test_microbatch_layouts_use_the_stored_ids():
    a = _traj("a", "g", [5, 6, 7, 10, 11, 12], [0, 0, 0, 1, 0, 1], reward=1.0)
    b = _traj("b", "g", [5, 6, 7, 20], [0, 0, 0, 1], reward=0.0)
    g = plan_grpo([a, b]).groups[0]
    shared = make_microbatch(g.samples, g.shared_len)
    assert shared.prompt_ids.tolist() == [5, 6, 7]
    assert shared.input_ids.tolist() == [[10, 11, 12], [20, 0, 0]]  # right-padded continuations
    assert shared.mask.tolist() == [[1, 0, 1], [1, 0, 0]]
    assert shared.old_logp.tolist() == [[-0.5, 0.0, -0.5], [-0.5, 0.0, 0.0]]
    assert shared.cost == 3 + 2 * 3
    plain = make_microbatch(g.samples)
    assert plain.prompt_ids is None and plain.start == 3
    assert plain.input_ids.tolist() == [[5, 6, 7, 10, 11, 12], [5, 6, 7, 20, 0, 0]]
    assert torch.equal(plain.targets, shared.targets) and torch.equal(plain.mask, shared.mask)
    # A cap below one group splits it into chunks that each rerun the prompt.
    assert [len(m.samples) for m in microbatches([g], max_tokens=7)] == [1, 1]
    assert [m.prompt_ids is None for m in microbatches([g], 100, shared=False)] == [True]


def test_different_prompts_are_not_shared():
    a = _traj("a", "g", [5, 6, 7, 10], [0, 0, 0, 1], reward=1.0)
    b = _traj("b", "g", [5, 6, 8, 20], [0, 0, 0, 1], reward=0.0)
    assert plan_grpo([a, b]).groups[0].shared_len == 0


def test_sft_plan_keeps_only_successes():
    trajs = [_traj("a", "g", [1, 2, 3, 4], [0, 0, 0, 1], success=True),
             _traj("b", "g", [1, 2, 3, 5], [0, 0, 0, 1], success=False),
             Trajectory(id="c", env="t", task_id="x", status="infra_error", trainable=False)]
    plan = plan_sft(trajs)
    assert [s.traj_id for s in plan.samples] == ["a"] and plan.skipped == 1 and plan.excluded == 1
