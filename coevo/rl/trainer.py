"""The GRPO trainer: a policy model (LoRA via peft, or full fine-tuning) plus AdamW.

`Trainer.step(trajectories)` is one GRPO batch: plan (credit from the configured advantage
estimator, coevo/rl/estimators/; signal filter, exclusions)
-> optional reference log-probs (adapter disabled) -> optional old log-probs recomputed with
the current policy (when more than one update is made per batch, or when asked) ->
`num_updates_per_batch` optimizer updates, each accumulating gradients over micro-batches.
With a teacher (`TrainConfig.teacher`, coevo/rl/teacher.py) whose weight is above zero, the
teacher's log-probs of the sampled tokens come from one more no-grad pass (adapter disabled,
the teacher's first prompt in place of the student's) and each update adds the distillation
term, also on groups without reward signal.

Shared prompts: the G samples of a group start with the same first prompt of P tokens. The
prompt is run once per micro-batch with gradients (batch 1, only its last logit kept), its
KV cache is repeated G times along the batch (`DynamicCache.batch_repeat_interleave`, an
autograd op, so gradients from every continuation flow back into the one prompt pass), and
the right-padded continuations run on that cache. The prompt's last logit scores the first
continuation token. Log-probs and gradients equal a plain full-sequence forward (tested at
1e-5 in float32); on a 500-token prompt with 48-token completions it saves most of the work.

Right padding needs no attention mask: with causal attention a real token never sees the pad
positions after it, and pad positions carry mask 0.

Out of memory on a micro-batch: the update's gradients are zeroed, the token cap halved and
the update redone from its first micro-batch (a partial backward may have touched some
gradients, so resuming mid-way would not be exact); logged on "coevo.rl".
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

from coevo.errors import CoevoError, InfraError
from coevo.rl.batch import (
    Group,
    MicroBatch,
    Plan,
    Sample,
    TrajectoryError,
    microbatch_cost,
    microbatches,
    plan_grpo,
    plan_sft,
    shared_prefix_len,
)
from coevo.rl.config import TrainConfig
from coevo.rl.estimators import EstimatorContext, make_estimator
from coevo.rl.grpo import masked_nll, policy_loss
from coevo.rl.lora import apply_lora
from coevo.rl.processing import replay, scored_logprobs
from coevo.rl.teacher import distill_loss, make_teacher, teacher_sample, to_student_positions
from coevo.trajectory import Trajectory

log = logging.getLogger("coevo.rl")


class StepStats(BaseModel):
    """What one trainer step did. `tokens` are policy tokens trained on (mask 1);
    `tokens_per_s` = tokens / seconds; `forward_tokens` go through the model per update."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["grpo", "sft"]
    step: int  # trainer steps done after this one
    updated: bool  # False when nothing carried signal (no optimizer update)
    loss: float  # first update's loss (before any update of this batch)
    reward_mean: float
    signal_fraction: float  # groups with signal / groups (SFT: successful / included)
    kl: float  # mean k3 KL to the base model on policy tokens (0 when kl_coef == 0)
    teacher_weight: float = 0.0  # weight of the teacher term this step (0: none)
    teacher_kl: float = 0.0  # mean sampled reverse KL to the teacher per token (first update)
    clip_fraction: float
    ratio_mean: float
    grad_norm: float
    tokens: int
    forward_tokens: int
    tokens_per_s: float
    seconds: float
    trajectories: int
    groups: int
    signal_groups: int
    skipped: int  # trajectories in groups without signal
    excluded: int  # infrastructure failures / unrewarded
    microbatches: int
    oom_retries: int


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] in float32 without materialising the full log-softmax.

    logits [B, W, V], targets [B, W] -> [B, W]."""
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _cache_kwarg(model: torch.nn.Module) -> str:
    # transformers 5.x renamed `past_key_values` to `cache`; support both.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _scored(logits: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """[B, W, V] logits -> [B, W] log-probs of the window's tokens: under the distribution each
    was sampled from (coevo/rl/processing.py), or the raw one when all were sampled raw."""
    wp = mb.processing
    if wp is None or wp.plain:
        return token_logprobs(logits, mb.targets)
    return scored_logprobs(logits, mb.targets, mb.mask, wp)


def window_logprobs(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """Log-probs [B, W] of the micro-batch's window tokens under `model` (grad if enabled)."""
    if mb.prompt_ids is None:
        # Keep only the logits that score the window: positions start-1 .. T-1 (last dropped).
        out = model(input_ids=mb.input_ids, use_cache=False, logits_to_keep=mb.width + 1)
        return _scored(out.logits[:, :-1], mb)
    kw = _cache_kwarg(model)
    b = mb.input_ids.shape[0]
    head = model(input_ids=mb.prompt_ids[None], use_cache=True, logits_to_keep=1)
    cache = getattr(head, kw, None) or getattr(head, "past_key_values", None)
    cache.batch_repeat_interleave(b)  # [1, h, P, d] -> [B, h, P, d] per layer, in the graph
    tail = model(input_ids=mb.input_ids, use_cache=True, **{kw: cache})  # logits [B, W, V]
    first = head.logits[:, -1:, :].expand(b, 1, -1)  # [B, 1, V] scores continuation token 0
    logits = torch.cat([first, tail.logits[:, :-1]], dim=1)  # [B, W, V]
    return _scored(logits, mb)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # The CPU allocator reports failure as a RuntimeError.
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


class Trainer:
    """Holds the policy and its optimizer; one `step` per batch of trajectories."""

    def __init__(self, model: torch.nn.Module, config: TrainConfig | None = None,
                 base_model: str = "", tokenizer: Any = None):
        self.config = config or TrainConfig()
        # Needed only to replay the grammar of constrained turns (coevo/rl/processing.py).
        self.tokenizer = tokenizer
        self._grammars: Any = None
        self.base_model = base_model or getattr(getattr(model, "config", None), "name_or_path", "")
        # Seeded before LoRA init (A is random) so two trainers built alike are identical.
        torch.manual_seed(self.config.seed)
        if self.config.lora.enabled:
            self.model = apply_lora(model, self.config.lora)
        else:
            self.model = model
            for p in self.model.parameters():
                p.requires_grad_(True)
        self.device = next(self.model.parameters()).device
        c = self.config
        self.optimizer = torch.optim.AdamW(
            self.trainable_parameters(), lr=c.lr, betas=c.betas, eps=c.adam_eps,
            weight_decay=c.weight_decay,
        )
        self.step_count = 0
        self.oom_retries = 0
        # The environment and rubric estimators may rescore episodes with (set by the RL stage).
        self.context = EstimatorContext()
        # The teacher term (coevo/rl/teacher.py); the RL stage binds its context.
        self.teacher = make_teacher(self.config.teacher)

    # -- parameters -------------------------------------------------------------------------
    def named_trainable_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.named_trainable_parameters()]

    # -- forward helpers --------------------------------------------------------------------
    def _reference(self):
        return self.model.disable_adapter() if self.config.lora.enabled else nullcontext()

    def _run(self, samples: Sequence[Sample], fn: Callable[[MicroBatch], dict[str, float]],
             grad: bool) -> tuple[list[dict[str, float]], int]:
        """Run `fn` on every micro-batch, halving the token cap on OOM. Returns metrics, cost."""
        cap = self.config.max_tokens_per_microbatch
        groups = _regroup(samples)
        while True:
            mbs = microbatches(groups, cap, shared=self.config.shared_prompt)
            metrics: list[dict[str, float]] = []
            try:
                for mb in mbs:
                    metrics.append(fn(mb.to(self.device)))
                return metrics, sum(mb.cost for mb in mbs)
            except (torch.OutOfMemoryError, RuntimeError) as exc:
                if not _is_oom(exc):
                    raise
                failed = mb
                if len(failed.samples) == 1:
                    raise InfraError(f"out of memory on a single trajectory "
                                     f"({failed.samples[0].traj_id}, {failed.cost} tokens)") from exc
                # Halve the failing micro-batch: the new cap is what its first half costs.
                half = failed.samples[: len(failed.samples) // 2]
                shared_len = failed.start if failed.prompt_ids is not None else 0
                cap = min(cap, failed.cost - 1, microbatch_cost(half, shared_len))
                self.oom_retries += 1
                log.warning("out of memory on a micro-batch of %d sequences (%d tokens); "
                            "retrying with max %d tokens per micro-batch",
                            len(failed.samples), failed.cost, cap)
                if grad:
                    self.optimizer.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    def sequence_logprobs(self, samples: Sequence[Sample], reference: bool = False,
                          grad: bool = False) -> list[torch.Tensor]:
        """Per-sample log-probs [n] at episode positions (0 where mask is 0), in order."""
        out: dict[int, torch.Tensor] = {}
        index = {id(s): i for i, s in enumerate(samples)}

        def fn(mb: MicroBatch) -> dict[str, float]:
            logp = window_logprobs(self.model, mb)  # [B, W]
            for b, s in enumerate(mb.samples):
                k = s.n - mb.start
                row = torch.where(mb.mask[b, :k] > 0, logp[b, :k], torch.zeros_like(logp[b, :k]))
                out[index[id(s)]] = torch.cat([torch.zeros(mb.start, device=row.device), row])
            return {}

        was_training = self.model.training
        # Recomputed / reference log-probs use eval mode: no dropout noise in the baselines.
        self.model.train(grad and was_training)
        ctx = self._reference() if reference else nullcontext()
        with ctx, torch.set_grad_enabled(grad):
            self._run(samples, fn, grad=grad)
        self.model.train(was_training)
        return [out[i] for i in range(len(samples))]

    def teacher_logprobs(self, samples: Sequence[Sample],
                         trajectories: Sequence[Trajectory]) -> None:
        """Fill each sample's `teacher_logp`: its sampled tokens scored by the base model
        (adapter disabled) after the teacher's first prompt instead of the student's."""
        by_id = {t.id: t for t in trajectories}
        pairs = [teacher_sample(s, self.teacher.prompt_ids(by_id[s.traj_id])) for s in samples]
        for s, (_, offset), lp in zip(samples, pairs, self.sequence_logprobs(
                [t for t, _ in pairs], reference=True)):
            s.teacher_logp = to_student_positions(lp.cpu(), s, offset)

    def _replay_grammars(self, samples: Sequence[Sample]) -> None:
        """Rebuild the grammar masks of constrained turns (the sampler's, token for token)."""
        todo = [s for s in samples if s.processing is not None and s.processing.spans]
        if not todo:
            return
        if self._grammars is None:
            if self.tokenizer is None:
                raise TrajectoryError(todo[0].traj_id, "turns.constraint",
                                      "constrained turns need the trainer's tokenizer "
                                      "(Trainer(..., tokenizer=)) to replay their grammar")
            from coevo.models.masks import Grammars
            from coevo.models.hf import eos_ids

            self._grammars = Grammars(self.tokenizer, eos_ids(self.tokenizer, self.model))
        for s in todo:
            if s.processing.replayed:
                continue
            try:
                replay(s.processing, s.ids.tolist(), self._grammars)
            except CoevoError as exc:
                raise TrajectoryError(s.traj_id, "turns.constraint", str(exc)) from None

    # -- steps ------------------------------------------------------------------------------
    def _update(self, samples: Sequence[Sample], loss_of) -> tuple[list[dict[str, float]], int, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)

        def fn(mb: MicroBatch) -> dict[str, float]:
            loss, m = loss_of(window_logprobs(self.model, mb), mb)
            loss.backward()
            return m

        metrics, cost = self._run(samples, fn, grad=True)
        params = self.trainable_parameters()
        if self.config.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        else:
            grads = [p.grad.norm() for p in params if p.grad is not None]
            norm = float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return metrics, cost, norm

    def step(self, trajectories: Sequence[Trajectory]) -> StepStats:
        """One GRPO batch: advantages, (ref / old log-probs), num_updates_per_batch updates."""
        t0 = time.perf_counter()
        c = self.config
        recompute = c.num_updates_per_batch > 1 or c.recompute_old_logprobs
        estimator = make_estimator(c.estimator, c.estimator_options, scale=c.advantage_scale,
                                   eps=c.advantage_eps, context=self.context)
        teach = c.teacher.kind != "none"
        plan = plan_grpo(trajectories, need_logprobs=not recompute, estimator=estimator,
                         keep_all=teach)
        w = 0.0
        if teach and plan.n_groups:
            self.teacher.observe_student(plan.reward_mean)
            w = self.teacher.weight()
        if w <= 0:  # no teacher term this step: the groups without reward signal are skipped
            plan.groups = [g for g in plan.groups if g.samples[0].signal]
        samples = plan.samples
        self._replay_grammars(samples)
        if samples and w > 0:
            self.teacher_logprobs(samples, trajectories)
        if samples and c.kl_coef > 0:
            for s, ref in zip(samples, self.sequence_logprobs(samples, reference=True)):
                s.ref_logp = ref.cpu()
        if samples and recompute:
            for s, old in zip(samples, self.sequence_logprobs(samples)):
                s.old_logp = old.cpu()
        # Each term is normalised over the samples it applies to (GRPO: groups with signal).
        sig = [s for s in samples if s.signal]
        denom = max(float(sum(s.tokens for s in sig) if c.agg == "token" else len(sig)), 1.0)
        t_denom = max(float(sum(s.tokens for s in samples) if c.agg == "token"
                            else len(samples)), 1.0)

        def loss_of(new_logp: torch.Tensor, mb: MicroBatch):
            mask = mb.mask if mb.signal is None else mb.mask * mb.signal[:, None]
            loss, m = policy_loss(new_logp, mb.old_logp, mb.ref_logp, mb.advantages, mask,
                                  c.clip_eps_low, c.clip_eps_high, c.kl_coef, c.agg, denom=denom)
            if mb.teacher_logp is None:
                return loss, m
            t_loss, tm = distill_loss(new_logp, mb.old_logp, mb.teacher_logp, mb.mask, w,
                                      c.agg, denom=t_denom)
            loss = loss + t_loss
            return loss, {**m, **tm, "loss": float(loss.detach()), "teacher_tokens": float(mb.mask.sum())}

        return self._train(plan, loss_of, c.num_updates_per_batch, "grpo", t0, teacher_weight=w)

    def sft_step(self, trajectories: Sequence[Trajectory]) -> StepStats:
        """Supervised warm-up: masked NLL on the policy tokens of successful trajectories."""
        t0 = time.perf_counter()
        plan = plan_sft(trajectories)
        denom = float(sum(s.tokens for s in plan.samples))
        return self._train(plan, lambda lp, mb: masked_nll(lp, mb.mask, denom=denom), 1, "sft", t0)

    def train_step(self, trajectories: Sequence[Trajectory]) -> StepStats:
        """`sft_step` for the first `warmup_steps` steps, `step` (GRPO) afterwards."""
        if self.step_count < self.config.warmup_steps:
            return self.sft_step(trajectories)
        return self.step(trajectories)

    def _train(self, plan: Plan, loss_of, updates: int, kind: str, t0: float,
               teacher_weight: float = 0.0) -> StepStats:
        samples = plan.samples
        vocab = self.model.get_input_embeddings().num_embeddings
        for s in samples:  # a wrong-tokenizer id would otherwise be an opaque index error
            if int(s.ids.max()) >= vocab or int(s.ids.min()) < 0:
                raise TrajectoryError(s.traj_id, "token_ids", f"ids outside the model's "
                                      f"vocabulary 0..{vocab - 1} (another tokenizer?)")
        tokens = sum(s.tokens for s in samples)
        first: list[dict[str, float]] = []
        cost, norm, n_mb = 0, 0.0, 0
        retries0 = self.oom_retries
        if tokens:
            for u in range(updates):
                metrics, cost_u, norm_u = self._update(samples, loss_of)
                if u == 0:
                    first, cost, norm, n_mb = metrics, cost_u, norm_u, len(metrics)
        self.step_count += 1
        secs = time.perf_counter() - t0

        def wmean(key: str, weight: str = "tokens") -> float:
            # micro-batch metrics are means over their tokens: weight by tokens
            n = sum(m.get(weight, 0.0) for m in first)
            return sum(m[key] * m[weight] for m in first if weight in m) / n if n else 0.0

        return StepStats(
            kind=kind, step=self.step_count, updated=bool(tokens),
            loss=sum(m["loss"] for m in first), reward_mean=plan.reward_mean,
            signal_fraction=plan.signal_fraction, kl=wmean("kl"),
            teacher_weight=teacher_weight, teacher_kl=wmean("teacher_kl", "teacher_tokens"),
            clip_fraction=wmean("clip_fraction"), ratio_mean=wmean("ratio_mean"), grad_norm=norm,
            tokens=tokens, forward_tokens=cost, tokens_per_s=tokens / secs if secs > 0 else 0.0,
            seconds=secs, trajectories=plan.n_trajectories, groups=plan.n_groups,
            signal_groups=sum(1 for g in plan.groups if g.samples[0].signal),
            skipped=plan.skipped, excluded=plan.excluded,
            microbatches=n_mb, oom_retries=self.oom_retries - retries0,
        )


def _regroup(samples: Sequence[Sample]) -> list[Group]:
    # Rebuild groups (in first-seen order) so micro-batching can share each group's prompt.
    order: dict[str, list[Sample]] = {}
    for s in samples:
        order.setdefault(s.group, []).append(s)
    return [Group(g, ss, shared_prefix_len(ss)) for g, ss in order.items()]
