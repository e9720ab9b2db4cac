"""The distribution a token is actually sampled from, shared by the sampler and the trainer.

Sampling a token goes: raw logits -> grammar mask (tokens the constraint forbids get -inf)
-> temperature -> top-k -> top-p (nucleus) -> softmax. The behaviour log-probability stored
with a trajectory is the sampled token's log-probability under *that* distribution, and the
trainer recomputes the policy's log-probabilities with the same function, so the PPO ratio is
exactly 1 at the first update (TRL and verl divide by the temperature for the same reason).
Both sides call `filter_logits` + `token_logprobs` below: one definition, no drift.

Conventions (where a choice had to be made):
- Order: grammar mask, then temperature, then top-k, then top-p, as vLLM applies them.
- top-k keeps every token whose logit reaches the k-th largest (ties at the boundary all
  stay); top-p keeps candidates in descending order until the mass strictly before one reaches
  `top_p` (the first always stays), as in the reference nucleus sampler.
- Temperature 0 (greedy) samples the arg-max of the masked logits; its "log-probability" is
  taken at temperature 1 with the same filters (a point mass has no useful log-probability,
  and greedy rollouts are for evaluation, not training).
- The sampled token always belongs to the support. When the trainer scores a token that the
  *current* policy's top-k / top-p would filter out (possible after several updates on one
  batch), the token is kept in the support with its tempered logit, so its log-probability
  stays finite and its gradient defined. At the first update this never happens (the same
  weights produce the same support, up to float rounding at a boundary).
- A grammar-forced token (the only one allowed) has log-probability exactly 0 and, since the
  softmax is over that one token, exactly zero gradient.

Shapes: N rows (one per sampled position), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Settings:
    """Per-row sampling settings (the `Sampling` fields that shape the distribution)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def plain(self) -> bool:
        """The raw distribution: nothing to divide or filter."""
        return self.temperature in (0.0, 1.0) and self.top_k == 0 and self.top_p >= 1.0


RAW = Settings()


def filter_logits(logits: torch.Tensor, settings: Sequence[Settings],
                  mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(filtered, base) logits [N, V]: `base` is masked and tempered; `filtered` is `base`
    with top-k / top-p applied (-inf outside the support). `mask` is an additive [N, V]
    tensor of 0 / -inf (the grammar), or None. Differentiable in `logits`."""
    x = logits.float()
    if mask is not None:
        x = x + mask
    n, vocab = x.shape
    dev = x.device
    temps = torch.tensor([s.temperature if s.temperature > 0 else 1.0 for s in settings],
                         dtype=x.dtype, device=dev)
    if bool((temps != 1.0).any()):
        x = x / temps[:, None]
    base = x
    ks = torch.tensor([s.top_k if 0 < s.top_k < vocab else 0 for s in settings], device=dev)
    with torch.no_grad():
        drop = None
        if bool((ks > 0).any()):
            kmax = int(ks.max())
            kth = x.detach().topk(kmax, dim=-1).values.gather(1, (ks.clamp(min=1) - 1)[:, None])
            kth = torch.where(ks[:, None] > 0, kth, torch.full_like(kth, NEG_INF))
            drop = x.detach() < kth  # [N, V]
        rows = [i for i, s in enumerate(settings) if s.top_p < 1.0]
        if rows:
            sel = torch.tensor(rows, device=dev)
            xs = x.detach()[sel]
            if drop is not None:
                xs = xs.masked_fill(drop[sel], NEG_INF)
            # Only finite candidates can be kept: sort just those (after top-k or a grammar,
            # a handful), in descending order.
            width = max(int(torch.isfinite(xs).sum(-1).max()), 1)
            vals, order = xs.topk(width, dim=-1)  # [R, width], sorted
            probs = torch.softmax(vals, dim=-1)
            ps = torch.tensor([settings[i].top_p for i in rows], dtype=x.dtype, device=dev)
            outside = (probs.cumsum(-1) - probs) >= ps[:, None]
            nucleus = torch.zeros_like(xs, dtype=torch.bool).scatter(1, order, outside)
            nucleus |= ~torch.isfinite(xs)
            if drop is None:
                drop = torch.zeros((n, vocab), dtype=torch.bool, device=dev)
            drop[sel] |= nucleus
    filtered = x.masked_fill(drop, NEG_INF) if drop is not None else x
    return filtered, base


def token_logprobs(filtered: torch.Tensor, base: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor:
    """log p(target) [N] under the filtered distribution, the target always in the support
    (see the module docstring). filtered, base [N, V]; targets [N]."""
    t = targets[:, None]
    fx = filtered.gather(1, t)[:, 0]
    bx = base.gather(1, t)[:, 0]
    lse = torch.logsumexp(filtered, dim=-1)
    outside = torch.isinf(fx) & ~torch.isinf(bx)
    if bool(outside.any()):
        lse = torch.where(outside, torch.logaddexp(lse, bx), lse)
        fx = torch.where(outside, bx, fx)
    return fx - lse


def sampled_logprobs(logits: torch.Tensor, targets: torch.Tensor, settings: Sequence[Settings],
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """log p(target) [N] of the distribution `settings` and `mask` sample from (the trainer's
    entry point; rows of one call may have different settings)."""
    if mask is None and all(s.plain for s in settings):
        x = logits.float()  # raw distribution: no [N, V] copies beyond the logsumexp
        return x.gather(1, targets[:, None])[:, 0] - torch.logsumexp(x, dim=-1)
    filtered, base = filter_logits(logits, settings, mask)
    return token_logprobs(filtered, base, targets)
