"""Deterministic train / val / test assignment by hashing task ids.

Each task id gets a point `u = sha256(f"{seed}:{task_id}") / 2**256` in [0, 1): the same on
every machine and Python version (no `hash()`, no RNG state). Two ways to cut:

- fractions (default 0.6 / 0.2 / 0.2): a task's split depends on its own id only, so adding
  tasks to a pool never moves an existing task to another split;
- sizes: the pool is ranked by `u` and cut into consecutive blocks of the given sizes (tasks
  past the last block belong to no split). Exact sizes, at the price of depending on the pool.

Within a split, tasks are ordered by `u` as well, so "the first n" is a random-like sample
rather than the first n of a dataset that is sorted by category or difficulty.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from coevo.envs.base import SPLITS
from coevo.errors import CoevoError

T = TypeVar("T")


class SplitSpec(BaseModel):
    """How a pool of tasks is cut. Give `fractions` or `sizes`, not both."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    seed: int = 0
    fractions: dict[str, float] | None = None
    sizes: dict[str, int] | None = None

    @model_validator(mode="after")
    def _check(self) -> "SplitSpec":
        if self.fractions is not None and self.sizes is not None:
            raise ValueError("give split fractions or sizes, not both")
        for field, value in (("fractions", self.fractions), ("sizes", self.sizes)):
            if value is None:
                continue
            unknown = sorted(set(value) - set(SPLITS))
            if unknown:
                raise ValueError(f"{field}: unknown split(s) {unknown}; known: {list(SPLITS)}")
            if any(v < 0 for v in value.values()):
                raise ValueError(f"{field}: values must be >= 0")
        if self.fractions is not None and sum(self.fractions.values()) > 1.0 + 1e-9:
            raise ValueError(f"fractions sum to {sum(self.fractions.values())} > 1")
        return self

    @property
    def effective_fractions(self) -> dict[str, float]:
        return self.fractions if self.fractions is not None else dict(DEFAULT_FRACTIONS)


DEFAULT_FRACTIONS = {"train": 0.6, "val": 0.2, "test": 0.2}


def hash_unit(task_id: str, seed: int = 0) -> float:
    """The task's point in [0, 1): first 64 bits of sha256, exact in a float's 53 bits.

    >>> hash_unit("simple_python_0", 0) == hash_unit("simple_python_0", 0)
    True
    """
    digest = hashlib.sha256(f"{seed}:{task_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise CoevoError(f"split {split!r} is unknown; known: {', '.join(SPLITS)}")
    return split


def split_of(task_id: str, spec: SplitSpec) -> str | None:
    """The split of one id under fractions (None: in the unassigned remainder)."""
    if spec.sizes is not None:
        raise CoevoError("split_of needs fractions: with sizes, the split depends on the pool")
    u, edge = hash_unit(task_id, spec.seed), 0.0
    for name in SPLITS:
        edge += spec.effective_fractions.get(name, 0.0)
        if u < edge:
            return name
    return None


def assign(ids: Sequence[str], spec: SplitSpec) -> dict[str, list[str]]:
    """{split: ids in hash order} for a whole pool; duplicates are an error (they would make
    the same task appear in two places)."""
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CoevoError(f"task id {dup!r} occurs more than once in the pool")
    ranked = sorted(ids, key=lambda i: (hash_unit(i, spec.seed), i))
    out: dict[str, list[str]] = {name: [] for name in SPLITS}
    if spec.sizes is not None:
        need = sum(spec.sizes.values())
        if need > len(ranked):
            raise CoevoError(f"split sizes {spec.sizes} need {need} tasks; the pool has {len(ranked)}")
        start = 0
        for name in SPLITS:
            k = spec.sizes.get(name, 0)
            out[name] = ranked[start : start + k]
            start += k
        return out
    for i in ranked:
        name = split_of(i, spec)
        if name is not None:
            out[name].append(i)
    return out


def select(
    items: Sequence[T], split: str, spec: SplitSpec, n: int | None = None,
    key: Callable[[T], str] = lambda t: t.id,  # type: ignore[attr-defined]
) -> list[T]:
    """The items of `split` (hash order), at most `n` of them."""
    check_split(split)
    by_id = {key(t): t for t in items}
    chosen = assign([key(t) for t in items], spec)[split]
    if n is not None:
        if n < 0:
            raise CoevoError(f"n must be >= 0, got {n}")
        chosen = chosen[:n]
    return [by_id[i] for i in chosen]


def split_field(value: SplitSpec | dict | None) -> SplitSpec:
    """Accept a SplitSpec, its dict form (from YAML / make_env options) or None (defaults)."""
    if value is None:
        return SplitSpec()
    if isinstance(value, SplitSpec):
        return value
    try:
        return SplitSpec.model_validate(value)
    except Exception as e:  # pydantic's message names the field
        raise CoevoError(f"split: {e}") from None


__all__ = [
    "DEFAULT_FRACTIONS", "SplitSpec", "assign", "check_split", "hash_unit", "select",
    "split_field", "split_of",
]
