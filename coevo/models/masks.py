"""llguidance wired into coevo's own sampling loop and trainer: matchers, bitmasks, replay.

The grammar engine does all the grammar work (compiling, tracking the parse, computing which
tokens may come next); this module only moves its answers around:

- `Grammars(tokenizer, eos_ids)` holds the engine's view of one tokenizer (built once, ~0.5 s
  for a 49k vocabulary) and a cache of compiled grammars; `matcher(constraint)` is a fresh
  parser state (a deep copy of the compiled one, so a GRPO group of G samples compiles once).
- `fill(matchers)` computes the next-token bitmasks of a batch of matchers in parallel
  (`fill_next_token_bitmask_par`, the engine's thread pool): [R, ceil(V/32)] int32.
- `apply_bitmask(logits, bitmask)` sets forbidden logits to -inf with the engine's own kernel:
  its numpy kernel on CPU, its torch kernel on CUDA. (The torch kernel is `torch.compile`d;
  on CPU its first call compiles for ~24 s, the numpy one takes 0.5 ms for 8 x 49k.)
- `replay(constraint, tokens)` re-runs the grammar over sampled tokens and returns the mask that
  was in force before each one: the trainer applies exactly the masks the sampler applied.

A matcher enters an error state instead of raising (the engine's convention); coevo turns that
into `UnsupportedConstraint` with the engine's message, never into unconstrained sampling.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from coevo.models.constrain import Constraint, UnsupportedConstraint


def _llg():
    import llguidance
    import llguidance.hf
    import llguidance.numpy
    import llguidance.torch

    return llguidance


class Grammars:
    """The grammar engine over one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Any, eos_ids: set[int] | None = None):
        self.tokenizer = tokenizer
        self.eos_ids = sorted(eos_ids or {tokenizer.eos_token_id})
        self._lltok: Any = None
        self._compiled: dict[str, Any] = {}
        self._executor: Any = None
        self._lock = threading.Lock()

    @property
    def lltok(self) -> Any:
        if self._lltok is None:
            llg = _llg()
            try:
                self._lltok = llg.hf.from_tokenizer(self.tokenizer, eos_token=self.eos_ids)
            except ValueError as e:  # a slow (Python) tokenizer
                raise UnsupportedConstraint(f"constrained decoding needs a fast tokenizer: {e}") from None
        return self._lltok

    @property
    def words(self) -> int:
        """int32 words of one bitmask row."""
        return (self.lltok.vocab_size + 31) // 32

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher at the start of `constraint`'s grammar."""
        with self._lock:
            base = self._compiled.get(constraint.key)
            if base is None:
                llg = _llg()
                base = llg.LLMatcher(self.lltok, constraint.llguidance_grammar(), log_level=0)
                if base.is_error():
                    where = f"{constraint.source}: " if constraint.source else ""
                    raise UnsupportedConstraint(
                        f"{where}{constraint.kind} constraint: {_first_line(base.get_error())}")
                if len(self._compiled) >= 256:  # a long run's many grammars: keep the newest
                    self._compiled.pop(next(iter(self._compiled)))
                self._compiled[constraint.key] = base
        return base.deep_copy()

    def fill(self, matchers: list[Any]) -> torch.Tensor:
        """Next-token bitmasks [R, words] (int32, CPU) of `matchers`, computed in parallel."""
        llg = _llg()
        bitmask = torch.full((len(matchers), self.words), -1, dtype=torch.int32)
        if len(matchers) == 1:
            llg.torch.fill_next_token_bitmask(matchers[0], bitmask, 0)
        elif matchers:
            if self._executor is None:
                self._executor = llg.LLExecutor()
            llg.torch.fill_next_token_bitmask_par(
                self._executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        return bitmask

    def replay(self, constraint: Constraint, tokens: list[int]) -> torch.Tensor:
        """The bitmask in force before each of `tokens` [n, words]; raises
        UnsupportedConstraint naming the first token the grammar does not allow."""
        m = self.matcher(constraint)
        rows = torch.full((len(tokens), self.words), -1, dtype=torch.int32)
        llg = _llg()
        eos = set(self.eos_ids)
        for i, tok in enumerate(tokens):
            # A complete grammar allows only EOS: engines that sample it (vLLM) end with it,
            # coevo's loop stops before it. Either way nothing else may follow.
            if m.is_stopped() and int(tok) not in eos:
                raise UnsupportedConstraint(f"token {i} ({tok}) follows the end of the grammar")
            llg.torch.fill_next_token_bitmask(m, rows, i)
            if not m.consume_token(int(tok)):
                raise UnsupportedConstraint(f"token {i} ({tok}) is not allowed by the grammar: "
                                            f"{_first_line(m.get_error())}")
        return rows


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: logits [R, V] of forbidden tokens (bit 0 in bitmask [R, words]) -> -inf.
    Ids past the bitmask (a model vocabulary padded beyond the tokenizer's) are forbidden."""
    llg = _llg()
    if logits.device.type == "cpu":
        llg.numpy.apply_token_bitmask_inplace(logits.detach().numpy(), bitmask.numpy())
    else:
        llg.torch.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True))


def additive_mask(bitmask: torch.Tensor, vocab: int, device: torch.device | str) -> torch.Tensor:
    """[R, vocab] float32 of 0 (allowed) / -inf (forbidden): a constant added to logits that
    need gradients (the trainer), where masking in place would break autograd."""
    out = torch.zeros((bitmask.shape[0], vocab), dtype=torch.float32)
    if bitmask.shape[0]:
        apply_bitmask(out, bitmask)
    return out.to(device)


def allowed_count(bitmask: torch.Tensor) -> np.ndarray:
    """Allowed tokens per row [R] (1 = the grammar forced the token)."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1)
    return bits.sum(axis=1)


def _first_line(message: str) -> str:
    return " ".join(str(message).split("<state>")[0].split())[:400]
