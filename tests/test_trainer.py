"""The GRPO Trainer on a tiny random Llama built in code (2 layers, hidden 64, vocab 128).

Trajectories are sampled from the tiny model itself, so their stored log-probs are real
sampling log-probs, and some include a tool-observation segment (mask 0) mid-episode.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from coevo.errors import InfraError
from coevo.rl import CheckpointError, TrainConfig, Trainer, TrajectoryError, load_checkpoint, save_checkpoint
from coevo.rl.batch import microbatches, plan_grpo
from coevo.rl.trainer import _regroup
from coevo.trajectory import Trajectory

VOCAB = 128
# Tiny models are slower with several threads on a shared 2-core machine (10x measured).
torch.set_num_threads(1)


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).float()


def _sample(model, ids: list[int], n: int, gen: torch.Generator) -> tuple[list[int], list[float]]:
    out, lps = [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1].float()
            logp = torch.log_softmax(logits, -1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            out.append(tok)
            lps.append(float(logp[tok]))
    return out, lps


def sample_batch(model, groups: int = 2, g: int = 4, prompt_len: int = 12, seed: int = 0,
                 multi_turn: bool = True) -> list[Trajectory]:
    """groups x g trajectories; reward = share of sampled tokens below VOCAB/2 (learnable)."""
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    trajs = []
    for k in range(groups):
        prompt = torch.randint(1, VOCAB, (prompt_len,), generator=gen).tolist()
        for i in range(g):
            ids, mask, lps = list(prompt), [0] * prompt_len, [0.0] * prompt_len
            n1 = 3 + (i % 3)  # different lengths -> padding
            toks, lp = _sample(model, ids, n1, gen)
            ids, mask, lps = ids + toks, mask + [1] * n1, lps + lp
            if multi_turn and i % 2 == 0:  # tool observation (mask 0), then another turn
                obs = torch.randint(1, VOCAB, (3,), generator=gen).tolist()
                ids, mask, lps = ids + obs, mask + [0] * 3, lps + [0.0] * 3
                toks, lp = _sample(model, ids, 2, gen)
                ids, mask, lps = ids + toks, mask + [1] * 2, lps + lp
            sampled = [t for t, m in zip(ids, mask) if m]
            reward = sum(t < VOCAB // 2 for t in sampled) / len(sampled)
            trajs.append(Trajectory(env="tiny", task_id=f"t{k}", group_id=f"g{k}", sample_index=i,
                                    token_ids=ids, loss_mask=mask, logprobs=lps,
                                    prompt_len=prompt_len, reward=reward, success=reward > 0.5))
    return trajs


def _randomize_lora_b(trainer: Trainer, seed: int = 3) -> None:
    # B = 0 at init makes every A gradient zero; a random B makes the gradient check meaningful.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in trainer.named_trainable_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def _full_forward_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """Reference: one sequence, batch 1, no cache; [n] with position 0 = 0."""
    logits = model(input_ids=ids[None]).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(1), lp])


def _lora_grads(trainer):
    return {n: p.grad.clone() for n, p in trainer.named_trainable_parameters()}


def _capture_update_grads(trainer) -> list[list[torch.Tensor]]:
    """Gradients as the optimizer sees them at each update (Adam's first step is about
    lr * sign(g), so comparing parameters would amplify float noise in tiny gradients)."""
    seen: list[list[torch.Tensor]] = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append([p.grad.clone() for p in trainer.trainable_parameters()]))
    return seen


def test_shared_prompt_logprobs_and_grads_equal_full_sequence_forward():
    trainer = Trainer(tiny_model(), TrainConfig(shared_prompt=True))
    trajs = sample_batch(trainer.model, groups=2, g=4)
    _randomize_lora_b(trainer)
    samples = plan_grpo(trajs).samples
    assert all(len(set(s.ids.tolist())) > 1 for s in samples)
    weights = [torch.randn(s.n, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(samples)]
    trainer.model.train()

    shared = trainer.sequence_logprobs(samples, grad=True)
    sum(((lp * w * s.mask).sum() for lp, w, s in zip(shared, weights, samples))).backward()
    g_shared = _lora_grads(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)

    full = [_full_forward_logprobs(trainer.model, s.ids) for s in samples]
    sum(((lp * w * s.mask).sum() for lp, w, s in zip(full, weights, samples))).backward()
    g_full = _lora_grads(trainer)

    for lp_s, lp_f, s in zip(shared, full, samples):
        assert torch.allclose(lp_s.detach(), lp_f.detach() * s.mask, atol=1e-5)
        assert float(lp_s.detach().abs().sum()) > 1.0  # real values, not zeros
    for n in g_full:
        assert float(g_full[n].abs().max()) > 0, n
        assert torch.allclose(g_shared[n], g_full[n], atol=1e-5), n


def test_shared_path_runs_each_prompt_once():
    trainer = Trainer(tiny_model(), TrainConfig())
    samples = plan_grpo(sample_batch(trainer.model, groups=2, g=4, prompt_len=40)).samples
    shared = microbatches(_regroup(samples), 10_000, shared=True)
    plain = microbatches(_regroup(samples), 10_000, shared=False)
    assert [mb.prompt_ids is not None for mb in shared] == [True, True]
    assert sum(mb.cost for mb in shared) < sum(mb.cost for mb in plain) / 2
    # the plain micro-batched path (padded batch, one forward) agrees with the shared one
    _randomize_lora_b(trainer)
    a = trainer.sequence_logprobs(samples)
    trainer.config = trainer.config.model_copy(update={"shared_prompt": False})
    b = trainer.sequence_logprobs(samples)
    for x, y, s in zip(a, b, samples):
        assert float(x.abs().sum()) > 1.0 and torch.allclose(x, y, atol=1e-5)
        assert torch.count_nonzero(x[s.mask == 0]) == 0


def test_step_changes_only_lora_parameters():
    trainer = Trainer(tiny_model(), TrainConfig(lr=1e-2))
    trajs = sample_batch(trainer.model)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    stats = trainer.step(trajs)
    assert stats.updated and stats.tokens == sum(t.sampled_tokens for t in trajs)
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    lora_b = {n for n, _ in trainer.named_trainable_parameters() if "lora_B" in n}
    assert lora_b and lora_b <= changed  # every B moved off zero
    assert all("lora_" in n for n in changed)  # and nothing of the base model moved
    assert len(trainer.trainable_parameters()) == 16  # 2 layers x 4 modules x (A, B)


def test_full_finetuning_changes_base_parameters():
    trainer = Trainer(tiny_model(), TrainConfig(lr=1e-3, lora={"enabled": False}))
    trajs = sample_batch(trainer.model)
    w = trainer.model.model.layers[0].mlp.up_proj.weight
    before = w.detach().clone()
    trainer.step(trajs)
    assert not torch.equal(w, before)


def test_loss_decreases_on_a_fixed_batch():
    trainer = Trainer(tiny_model(), TrainConfig(lr=5e-3, clip_eps_high=10.0, clip_eps_low=0.9))
    trajs = sample_batch(trainer.model, groups=2, g=4)
    losses = [trainer.step(trajs).loss for _ in range(6)]
    assert losses[-1] < losses[0] - 0.1, losses
    assert all(b <= a + 1e-6 for a, b in zip(losses, losses[1:])), losses


def test_kl_is_zero_at_init_and_positive_after_updates():
    trainer = Trainer(tiny_model(), TrainConfig(lr=1e-2, kl_coef=0.1))
    trajs = sample_batch(trainer.model)
    first = trainer.step(trajs)
    assert first.kl == 0.0  # B = 0: the adapter-disabled reference equals the policy exactly
    later = [trainer.step(trajs).kl for _ in range(2)]
    assert later[-1] > 1e-5


def test_num_updates_recomputes_old_logprobs():
    model = tiny_model()
    trajs = sample_batch(Trainer(tiny_model(), TrainConfig()).model)
    for t in trajs:  # stored log-probs off by 0.3: used as old policy they move the ratio
        t.logprobs = [lp - 0.3 if m else 0.0 for lp, m in zip(t.logprobs, t.loss_mask)]
    stale = Trainer(tiny_model(), TrainConfig()).step(trajs)
    assert stale.ratio_mean == pytest.approx(torch.exp(torch.tensor(0.3)).item(), abs=1e-4)
    fresh = Trainer(model, TrainConfig(num_updates_per_batch=2)).step(trajs)
    assert fresh.ratio_mean == pytest.approx(1.0, abs=1e-5) and fresh.clip_fraction == 0.0


def test_microbatching_and_shared_prompt_do_not_change_the_update():
    trajs = sample_batch(tiny_model(), groups=2, g=4)
    results = []
    for cfg in (dict(shared_prompt=True), dict(shared_prompt=False),
                dict(shared_prompt=True, max_tokens_per_microbatch=20)):
        t = Trainer(tiny_model(), TrainConfig(lr=1e-2, **cfg))
        _randomize_lora_b(t)
        grads = _capture_update_grads(t)
        results.append((t.step(trajs), grads[0]))
    assert results[2][0].microbatches > results[0][0].microbatches == 2
    for stats, grads in results[1:]:
        assert stats.loss == pytest.approx(results[0][0].loss, abs=1e-6)
        for a, b in zip(grads, results[0][1]):
            assert float(b.abs().max()) > 0 and torch.allclose(a, b, atol=1e-6)


def test_oom_halves_the_microbatch_and_retries():
    trajs = sample_batch(tiny_model(), groups=1, g=4)
    trainer = Trainer(tiny_model(), TrainConfig(lr=1e-2))
    _randomize_lora_b(trainer)
    got = _capture_update_grads(trainer)

    def fail_big(module, args, kwargs):  # a device that cannot hold more than 2 sequences
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (test)")

    handle = trainer.model.get_base_model().register_forward_pre_hook(fail_big, with_kwargs=True)
    stats = trainer.step(trajs)
    # one retry; every micro-batch now fits the 2-sequence device (the hook would raise again)
    assert stats.oom_retries == 1 and stats.microbatches >= 2 and stats.updated
    ref = Trainer(tiny_model(), TrainConfig(lr=1e-2))
    _randomize_lora_b(ref)
    want = _capture_update_grads(ref)
    ref.step(trajs)
    for a, b in zip(got[0], want[0]):  # the retried update is the same update
        assert torch.allclose(a, b, atol=1e-6)
    handle.remove()
    trainer.model.get_base_model().register_forward_pre_hook(
        lambda m, a, k: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")), with_kwargs=True)
    with pytest.raises(InfraError, match="single trajectory"):
        trainer.step(sample_batch(tiny_model(), groups=1, g=2))


def test_infra_failures_are_excluded_and_untrainable_refused():
    trainer = Trainer(tiny_model(), TrainConfig())
    trajs = sample_batch(trainer.model, groups=2, g=3, multi_turn=False)
    trajs.append(Trajectory(env="tiny", task_id="t0", group_id="g0", status="infra_error",
                            trainable=False, error="timeout"))
    stats = trainer.step(trajs)
    assert stats.excluded == 1 and stats.trajectories == 7 and stats.groups == 2
    bad = trajs[0].model_copy(update={"id": "traj-without-ids", "trainable": False})
    with pytest.raises(TrajectoryError, match="traj-without-ids"):
        trainer.step(trajs[1:3] + [bad])
    big = trajs[0].model_copy(update={"id": "traj-big-ids", "token_ids": [VOCAB + 5] * len(trajs[0].token_ids)})
    with pytest.raises(TrajectoryError, match="traj-big-ids: token_ids: ids outside"):
        trainer.step(trajs[1:3] + [big])


def test_no_signal_means_no_update():
    trainer = Trainer(tiny_model(), TrainConfig())
    trajs = [t.model_copy(update={"reward": 1.0}) for t in sample_batch(trainer.model)]
    before = [p.detach().clone() for p in trainer.trainable_parameters()]
    stats = trainer.step(trajs)
    assert not stats.updated and stats.signal_fraction == 0.0 and stats.skipped == 8
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.trainable_parameters()))


def test_sft_warmup_lowers_nll_of_successes():
    trainer = Trainer(tiny_model(), TrainConfig(lr=1e-2, warmup_steps=3))
    trajs = sample_batch(trainer.model, groups=2, g=4)
    n_success = sum(t.success for t in trajs)
    assert 0 < n_success < len(trajs)
    stats = [trainer.train_step(trajs) for _ in range(4)]
    assert [s.kind for s in stats] == ["sft", "sft", "sft", "grpo"]
    assert stats[0].tokens == sum(t.sampled_tokens for t in trajs if t.success)
    assert stats[2].loss < stats[0].loss - 0.05


def test_resume_is_bit_exact_and_adapter_loads_with_peft(tmp_path):
    cfg = TrainConfig(lr=1e-2, lora={"dropout": 0.1}, num_updates_per_batch=2)
    trajs = sample_batch(tiny_model())
    batches = [trajs, trajs[:4] + trajs[5:], trajs, trajs[2:]]

    straight = Trainer(tiny_model(), cfg)
    losses_a = [straight.step(b).loss for b in batches]

    first = Trainer(tiny_model(), cfg)
    losses_b = [first.step(b).loss for b in batches[:2]]
    info = save_checkpoint(first, tmp_path / "ck")
    assert info.step == 2 and len(info.sha256) == 64
    torch.manual_seed(12345)  # disturb the RNG: the checkpoint must restore it
    resumed = Trainer(tiny_model(), cfg)
    assert load_checkpoint(resumed, tmp_path / "ck").sha256 == info.sha256
    losses_b += [resumed.step(b).loss for b in batches[2:]]

    assert losses_a == losses_b
    for (n, a), (_, b) in zip(straight.named_trainable_parameters(), resumed.named_trainable_parameters()):
        assert torch.equal(a, b), n

    from peft import PeftModel

    loaded = PeftModel.from_pretrained(tiny_model(), str(tmp_path / "ck"))
    got = dict(loaded.named_parameters())
    for n, p in first.named_trainable_parameters():
        assert torch.equal(got[n], p), n

    (tmp_path / "ck" / "adapter_model.safetensors").write_bytes(b"corrupt")
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(Trainer(tiny_model(), cfg), tmp_path / "ck")


def test_checkpoint_of_other_lora_settings_is_refused(tmp_path):
    trainer = Trainer(tiny_model(), TrainConfig())
    save_checkpoint(trainer, tmp_path / "ck")
    other = Trainer(tiny_model(), TrainConfig(lora={"rank": 4}))
    with pytest.raises(CheckpointError, match="adapter_model.safetensors"):
        load_checkpoint(other, tmp_path / "ck")


def test_config_typos_and_kl_without_adapter_are_errors():
    from coevo.errors import AssetError

    with pytest.raises(AssetError, match="run.yaml: lr_rate"):
        TrainConfig.from_mapping({"lr_rate": 1e-4}, "run.yaml")
    with pytest.raises(AssetError, match="lora.enabled"):
        TrainConfig.from_mapping({"kl_coef": 0.1, "lora": {"enabled": False}}, "run.yaml")


@pytest.mark.slow
def test_embedded_model_shared_prompt_equals_full_forward_and_step_moves_lora():
    """The cache path on the real SmolLM2-135M (30 layers, grouped-query attention)."""
    from transformers import AutoModelForCausalLM

    from coevo.models.embedded import embedded_model_dir

    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32)
    trainer = Trainer(model, TrainConfig(lr=1e-3, kl_coef=0.05))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (40,), generator=gen).tolist()
    trajs = []
    for i in range(3):
        toks, lps = _sample(trainer.model, prompt, 6 + i, gen)
        trajs.append(Trajectory(env="e", task_id="t", group_id="g", token_ids=prompt + toks,
                                loss_mask=[0] * 40 + [1] * len(toks), logprobs=[0.0] * 40 + lps,
                                prompt_len=40, reward=float(i)))
    samples = plan_grpo(trajs).samples
    _randomize_lora_b(trainer)
    with torch.no_grad():
        shared = trainer.sequence_logprobs(samples)
        full = [_full_forward_logprobs(trainer.model, s.ids) * s.mask for s in samples]
    for a, b in zip(shared, full):
        assert float(a.abs().sum()) > 1.0 and torch.allclose(a, b, atol=1e-4)
    for n, p in trainer.named_trainable_parameters():  # back to B = 0: policy == base
        if "lora_B" in n:
            torch.nn.init.zeros_(p)
    before = [p.detach().clone() for p in trainer.trainable_parameters()]
    stats = trainer.step(trajs)
    assert stats.kl == 0.0 and stats.ratio_mean == pytest.approx(1.0, abs=1e-3)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable_parameters()))


def test_gigpo_estimator_trains_on_a_group_grpo_skips():
    """Equal episode rewards (no GRPO signal), but the one-turn answer beats the two-turn one
    from the same prompt state: gigpo updates the weights, grpo does not."""
    from coevo.trajectory import Turn

    def ep(tid, actions):
        ids, mask, turns = [5, 6, 7], [0, 0, 0], []
        for k, a in enumerate(actions):
            turns.append(Turn(index=k, start=len(ids), end=len(ids) + 2, text=""))
            ids, mask = ids + [a, a + 1, 40], mask + [1, 1, 0]
        return Trajectory(id=tid, env="e", task_id="t", group_id="g", token_ids=ids,
                          loss_mask=mask, prompt_len=3, turns=turns, reward=1.0)

    trajs = [ep("long", [10, 20]), ep("short", [30])]
    for name, moves in (("grpo", False), ("gigpo", True)):
        trainer = Trainer(tiny_model(), TrainConfig(estimator=name, recompute_old_logprobs=True,
                                                    estimator_options={"gamma": 0.5} if moves else {}))
        before = [p.detach().clone() for p in trainer.trainable_parameters()]
        stats = trainer.step(trajs)
        changed = any(not torch.equal(b, p) for b, p in zip(before, trainer.trainable_parameters()))
        assert (stats.updated, changed, stats.signal_fraction) == (moves, moves, float(moves))


def test_a_gpu_trainer_resumes_its_checkpoint_with_the_cuda_rng_state(tmp_path, monkeypatch):
    """A GPU trainer's checkpoint holds the CUDA generators' states; torch's setter takes CPU
    byte tensors only ("RNG state must be a torch.ByteTensor" for a state on the GPU, which
    bench/gpu_check_hf.py met on an H200 when the state file was loaded onto the trainer's
    device). Emulated here: CUDA reported available, its RNG calls recorded, the trainer on
    "cuda", and torch.load marking what it would place on a non-CPU device."""
    import coevo.rl.lora as lora

    cuda_state = [torch.arange(16, dtype=torch.uint8)]
    restored: list = []

    class OnDevice:  # a tensor torch.load placed on the GPU
        def __init__(self, t, device):
            self.t, self.device = t, device

    def set_rng_state_all(states):
        for s in states:
            if not (isinstance(s, torch.Tensor) and s.device.type == "cpu" and s.dtype == torch.uint8):
                raise TypeError("RNG state must be a torch.ByteTensor")
        restored.extend(states)

    real_load, real_load_file = torch.load, lora.load_file

    def load(path, map_location=None, **kw):
        state = real_load(path, map_location="cpu", **kw)
        if str(map_location) != "cpu":
            state["rng"]["cuda"] = [OnDevice(t, map_location) for t in state["rng"]["cuda"]]
        return state

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [t.clone() for t in cuda_state])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_rng_state_all)
    monkeypatch.setattr(lora.torch, "load", load)
    monkeypatch.setattr(lora, "load_file", lambda path, device=None: real_load_file(path, device="cpu"))

    trainer = Trainer(tiny_model(), TrainConfig(lr=1e-2))
    trainer.step(sample_batch(tiny_model()))
    info = save_checkpoint(trainer, tmp_path / "ck")
    resumed = Trainer(tiny_model(), TrainConfig(lr=1e-2))
    monkeypatch.setattr(resumed, "device", torch.device("cuda"))
    assert load_checkpoint(resumed, tmp_path / "ck").step == info.step == 1
    assert len(restored) == 1 and torch.equal(restored[0], cuda_state[0])
    assert resumed.step_count == 1
