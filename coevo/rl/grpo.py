"""GRPO objective: group-relative advantages and the masked, clipped policy loss (pure tensors).

GRPO (Shao et al. 2024, DeepSeekMath, eq. 3) samples G completions per prompt, scores them,
and uses the group-normalised reward as every token's advantage in a PPO-style clipped
objective with a KL penalty to a reference policy:

    A_i     = (r_i - mean(r)) / std(r)
    rho_t   = pi(o_t | ...) / pi_old(o_t | ...)
    L       = -E_t[ min(rho_t A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) A_i) ]
              + beta * KL_k3(pi || pi_ref)
    KL_k3   = exp(ref - logp) - (ref - logp) - 1          (Schulman's unbiased, >= 0 estimator)

Where coevo departs from the paper:
- Aggregation: `agg="token"` (default) averages over all policy tokens of the batch, as DAPO
  (Yu et al. 2025) and Dr. GRPO (Liu et al. 2025) do, so long completions are not
  down-weighted per token; `agg="sequence"` is the paper's per-sequence mean then mean over
  sequences. The denominator is passed in (`denom`) so that the sum of micro-batch losses
  equals the loss of the whole batch: micro-batching never changes the gradient.
- Std scaling is optional (`scale="none"` is Dr. GRPO's unbiased variant); the std is the
  population std (ddof=0), defined for any group size.
- Clipping may be asymmetric (DAPO "clip-higher": eps_high > eps_low keeps exploration).
- Groups whose rewards are all equal have zero advantage everywhere: they are skipped before
  any forward pass, and the fraction with signal is reported. The advantages themselves come
  from the configured estimator (coevo/rl/estimators/: `grpo` is this section's A_i; `gigpo`
  and `progress` add per-turn terms, so `advantages` may be per token), and a group is
  skipped when its credit is zero on every token.
- The reference policy is the base model with the LoRA adapter disabled (no second copy of
  the model); kl_coef defaults to 0 in TrainConfig, as DAPO and Dr. GRPO drop it.
- The mask is the trajectory's loss mask: 1 only on tokens the policy sampled, so prompt,
  tool output and observation tokens contribute nothing (and get exactly zero gradient).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch

Scale = Literal["std", "none"]
Agg = Literal["token", "sequence"]


def _all_equal(values: Sequence[float], tol: float) -> bool:
    return max(values) - min(values) <= tol


def group_advantages(rewards: Sequence[float], scale: Scale = "std", eps: float = 1e-6,
                     tol: float = 1e-9) -> list[float]:
    """Reward minus the group mean, divided by (std + eps) when scale == "std".

    >>> group_advantages([1.0, 0.0, 0.0, 1.0], scale="none")
    [0.5, -0.5, -0.5, 0.5]
    >>> group_advantages([0.3, 0.3, 0.3])
    [0.0, 0.0, 0.0]
    """
    if scale not in ("std", "none"):
        raise ValueError(f"advantage scale must be 'std' or 'none', not {scale!r}")
    if not rewards:
        return []
    # An all-equal group is exactly zero (the float mean of equal values can be off by 1 ulp).
    if _all_equal(rewards, tol):
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    centered = [r - mean for r in rewards]
    if scale == "none":
        return centered
    std = math.sqrt(sum(c * c for c in centered) / len(centered))
    return [c / (std + eps) for c in centered]


def groups_with_signal(rewards_by_group: Mapping[str, Sequence[float]],
                       tol: float = 1e-9) -> tuple[list[str], float]:
    """The groups whose rewards are not all equal, and the fraction of groups they make up.

    >>> groups_with_signal({"a": [1.0, 0.0], "b": [0.5, 0.5]})
    (['a'], 0.5)
    """
    keep = [g for g, rs in rewards_by_group.items() if len(rs) > 1 and not _all_equal(rs, tol)]
    frac = len(keep) / len(rewards_by_group) if rewards_by_group else 0.0
    return keep, frac


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) from samples of pi: >= 0, 0 iff equal."""
    return _k3(ref_logp - logp)


def _k3(d: torch.Tensor) -> torch.Tensor:  # d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def aggregate(per_token: torch.Tensor, live: torch.Tensor, agg: Agg = "token",
              denom: float | None = None) -> torch.Tensor:
    """The scalar loss of per-token terms [B, W] over the live positions: their sum / denom
    (agg "token"), or each sequence's mean summed / denom (agg "sequence"); denom defaults to
    the live tokens (sequences) of this micro-batch. Masked positions count exactly zero."""
    per_token = torch.where(live, per_token, torch.zeros_like(per_token))
    m = live.to(per_token.dtype)
    if agg == "token":
        d = float(denom) if denom is not None else max(float(m.sum()), 1.0)
        return per_token.sum() / d
    per_seq = per_token.sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # [B]
    d = float(denom) if denom is not None else max(float((m.sum(dim=1) > 0).sum()), 1.0)
    return per_seq.sum() / d


def policy_loss(
    new_logp: torch.Tensor,  # [B, W] log pi(token) under the current policy (with grad)
    old_logp: torch.Tensor,  # [B, W] log pi_old(token): sampling or recomputed, no grad
    ref_logp: torch.Tensor | None,  # [B, W] log pi_ref(token), or None (no KL term)
    advantages: torch.Tensor,  # [B] one per sequence, or [B, W] one per token
    mask: torch.Tensor,  # [B, W] 1 on policy-sampled tokens, 0 elsewhere (incl. padding)
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    kl_coef: float = 0.0,
    agg: Agg = "token",
    denom: float | None = None,  # token: tokens in the whole batch; sequence: sequences
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clipped GRPO loss over the masked tokens; returns (scalar loss, metrics).

    metrics: tokens (mask sum), clip_fraction (share of tokens where the clip was active),
    ratio_mean, kl (mean k3 over tokens; 0.0 without a reference), loss.
    """
    if agg not in ("token", "sequence"):
        raise ValueError(f"agg must be 'token' or 'sequence', not {agg!r}")
    if new_logp.shape != old_logp.shape or new_logp.shape != mask.shape:
        raise ValueError(f"shape mismatch: new {tuple(new_logp.shape)}, old "
                         f"{tuple(old_logp.shape)}, mask {tuple(mask.shape)}")
    live = mask > 0  # [B, W] bool
    m = live.to(new_logp.dtype)
    # torch.where (not multiplication) so masked positions get exactly zero gradient and a
    # garbage value there (e.g. -inf at padding) cannot turn into NaN.
    log_ratio = torch.where(live, new_logp - old_logp, torch.zeros_like(new_logp))
    ratio = torch.exp(log_ratio)  # [B, W]
    adv = advantages.to(new_logp.dtype)
    adv = adv[:, None] if adv.dim() == 1 else adv  # [B, 1] or [B, W]
    surr = ratio * adv
    surr_clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    per_token = -torch.minimum(surr, surr_clipped)  # [B, W]

    kl_tok = None
    if ref_logp is not None:
        # d = 0 at masked positions, so their KL is exactly 0 whatever is stored there.
        kl_tok = _k3(torch.where(live, ref_logp - new_logp, torch.zeros_like(new_logp)))
        if kl_coef:
            per_token = per_token + kl_coef * kl_tok

    loss = aggregate(per_token, live, agg, denom)
    n_tok = m.sum()

    with torch.no_grad():
        n = max(float(n_tok), 1.0)
        clipped = ((adv > 0) & (ratio > 1.0 + clip_eps_high)) | ((adv < 0) & (ratio < 1.0 - clip_eps_low))
        metrics = {
            "tokens": float(n_tok),
            "clip_fraction": float((clipped & live).sum()) / n,
            "ratio_mean": float((ratio * m).sum()) / n,
            "kl": float((kl_tok * m).sum()) / n if kl_tok is not None else 0.0,
            "loss": float(loss),
        }
    return loss, metrics


def masked_nll(
    new_logp: torch.Tensor,  # [B, W]
    mask: torch.Tensor,  # [B, W]
    denom: float | None = None,  # tokens in the whole batch
) -> tuple[torch.Tensor, dict[str, float]]:
    """Supervised warm-up loss: mean negative log-likelihood of the policy tokens."""
    live = mask > 0
    nll = torch.where(live, -new_logp, torch.zeros_like(new_logp))
    n_tok = float(live.sum())
    loss = nll.sum() / (float(denom) if denom is not None else max(n_tok, 1.0))
    return loss, {"tokens": n_tok, "loss": float(loss), "clip_fraction": 0.0,
                  "ratio_mean": 1.0, "kl": 0.0}
