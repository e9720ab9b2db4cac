"""How each policy token was drawn, so the trainer scores it under the same distribution.

A trajectory's turns record their sampling settings (temperature, top-k, top-p) and grammar
(`Turn.sampling`, `Turn.constraint`). The trainer must compute the policy's log-probabilities
under exactly that distribution (coevo/models/logits.py): otherwise the stored behaviour
log-probabilities and the recomputed ones differ before any update, and the PPO ratio and its
clipping act on an artefact. The grammar masks are not stored (6 KB per token for a 49k
vocabulary): they are replayed from the turn's constraint over the sampled tokens, which the
grammar engine does deterministically and cheaply (coevo/models/masks.py).

- `TokenProcessing.of(traj)`: per sample, the settings of every sampled position and the
  constrained spans (None when every turn was sampled raw and unconstrained: the trainer's fast
  path, and how trajectories stored before these fields read).
- `replay(processing, ids, grammars)`: fill the bitmask of every constrained position.
- `window_processing(samples, start, width, mask)`: the settings and bitmasks of a micro-batch's
  scored positions, in row-major order of its mask.
- `scored_logprobs(logits, targets, mask, wp)`: [B, W] log-probabilities under them.

SFT warm-up steps train the raw likelihood (no processing): imitation of successful episodes
is a supervised loss, not an importance-weighted one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from coevo.models.constrain import Constraint
from coevo.models.logits import RAW, Settings, sampled_logprobs
from coevo.trajectory import Trajectory


@dataclass
class TokenProcessing:
    """One sample's per-position settings (absent: raw) and constrained spans."""

    settings: dict[int, Settings] = field(default_factory=dict)
    spans: list[tuple[int, int, Constraint]] = field(default_factory=list)  # [start, end)
    bitmask: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> [words]

    @classmethod
    def of(cls, traj: Trajectory) -> "TokenProcessing | None":
        proc = cls()
        for turn in traj.turns:
            s = turn.sampling
            settings = RAW if s is None else Settings(s.temperature, s.top_k, s.top_p)
            if settings != RAW:
                for pos in range(turn.start, turn.end):
                    proc.settings[pos] = settings
            if turn.constraint is not None and turn.end > turn.start:
                proc.spans.append((turn.start, turn.end, turn.constraint))
        return proc if proc.settings or proc.spans else None

    @property
    def replayed(self) -> bool:
        return all(all(p in self.bitmask for p in range(a, b)) for a, b, _ in self.spans)


def replay(proc: TokenProcessing, ids: Sequence[int], grammars: Any) -> None:
    """Fill `proc.bitmask` for every constrained position (UnsupportedConstraint names a token
    the grammar rejects: the trajectory was not sampled under this constraint)."""
    for a, b, constraint in proc.spans:
        rows = grammars.replay(constraint, [int(t) for t in ids[a:b]])
        for k, pos in enumerate(range(a, b)):
            proc.bitmask[pos] = rows[k]


@dataclass
class WindowProcessing:
    """A micro-batch's scored positions (row-major over mask > 0): settings and grammar."""

    settings: list[Settings]
    bitmask: torch.Tensor | None  # [C, words] int32 of the constrained positions, or None
    constrained: torch.Tensor  # [L] bool

    @property
    def plain(self) -> bool:
        return self.bitmask is None and all(s.plain for s in self.settings)


def window_processing(samples: Sequence[Any], start: int, width: int,
                      mask: torch.Tensor) -> WindowProcessing | None:
    """The processing of a micro-batch window (None: every scored token was sampled raw)."""
    if all(getattr(s, "processing", None) is None for s in samples):
        return None
    settings: list[Settings] = []
    rows: list[torch.Tensor] = []
    constrained: list[bool] = []
    for b, s in enumerate(samples):
        proc: TokenProcessing | None = s.processing
        for c in torch.nonzero(mask[b] > 0)[:, 0].tolist():
            pos = start + c
            settings.append(proc.settings.get(pos, RAW) if proc else RAW)
            row = proc.bitmask.get(pos) if proc else None
            constrained.append(row is not None)
            if row is not None:
                rows.append(row)
    return WindowProcessing(settings=settings,
                            bitmask=torch.stack(rows) if rows else None,
                            constrained=torch.tensor(constrained, dtype=torch.bool))


def scored_logprobs(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                    wp: WindowProcessing) -> torch.Tensor:
    """Log-probabilities [B, W] of `targets` under each position's sampling distribution
    (0 where mask is 0). logits [B, W, V] (with grad when training)."""
    from coevo.models.masks import additive_mask

    live = mask > 0
    lg = logits[live]  # [L, V]
    add = None
    if wp.bitmask is not None:
        add = torch.zeros(lg.shape, dtype=torch.float32, device=lg.device)
        add[wp.constrained.to(lg.device)] = additive_mask(wp.bitmask, lg.shape[-1], lg.device)
    lp = sampled_logprobs(lg, targets[live], wp.settings, add)  # [L]
    out = torch.zeros(mask.shape, dtype=lp.dtype, device=lp.device)
    return out.masked_scatter(live, lp)
