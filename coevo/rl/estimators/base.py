"""Advantage estimators: the extension point that turns a batch's rewards into credit.

An estimator sees the batch's GRPO groups (same task, same assets, G samples; infrastructure
failures and unrewarded trajectories already dropped) and returns one `Credit` per
trajectory: the episode-level advantage and, optionally, one advantage per turn. The trainer
gives every policy token of turn k the turn's advantage (`token_advantages`); policy tokens
outside any recorded turn, and trajectories without per-turn credit, get the episode's.

Estimators are looked up by name in `ESTIMATORS` (`TrainConfig.estimator`, options in
`TrainConfig.estimator_options`, validated by the estimator's `Options` model); an unknown
name fails with the list of known ones. Built-ins: `grpo` (default, coevo/rl/estimators/grpo.py),
`gigpo` (step-level credit by anchor states) and `progress` (per-turn verified progress).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict

from coevo.errors import CoevoError
from coevo.registry import Registry, validate_options
from coevo.trajectory import Trajectory


@dataclass(frozen=True)
class Credit:
    """One trajectory's advantages: `episode`, and per turn (`turns[k]` for `traj.turns[k]`)
    when the estimator assigns credit below the episode (None: every token gets `episode`)."""

    episode: float
    turns: tuple[float, ...] | None = None

    @property
    def nonzero(self) -> bool:
        return self.episode != 0.0 or any(a != 0.0 for a in self.turns or ())


@dataclass
class EstimatorContext:
    """What an estimator may need besides the trajectories: the environment the episodes ran
    in and the rubric that scored them (the RL stage binds both; None outside a stage)."""

    env: Any = None
    rubric: Any = None


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


@runtime_checkable
class AdvantageEstimator(Protocol):
    """Contract: `credit(groups)` returns, for every group id of `groups`, one Credit per
    member in the member order. An all-zero Credit means "no learning signal": a group whose
    credits are all zero is skipped before any forward pass. Credit must be a pure function of
    the trajectories (and the bound context): the same batch gives the same numbers.

    Registered classes are built as `cls(options, scale=, eps=, context=)`, where `options` is
    an instance of the class's `Options` (pydantic, extra="forbid") and scale / eps are
    `TrainConfig.advantage_scale` / `advantage_eps`."""

    Options: ClassVar[type[BaseModel]]

    def credit(self, groups: Mapping[str, Sequence[Trajectory]]) -> dict[str, list[Credit]]: ...


class Estimator:
    """What the built-in estimators share: their options, the advantage scale and eps, and
    the context (subclasses set `Options` and implement `credit`)."""

    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, options: BaseModel | None = None, *, scale: str = "std",
                 eps: float = 1e-6, context: EstimatorContext | None = None):
        self.options = options or self.Options()
        self.scale, self.eps = scale, eps
        self.context = context or EstimatorContext()


ESTIMATORS: Registry[Any] = Registry("advantage estimator")


def estimator_options(name: str, options: Mapping[str, Any] | None) -> BaseModel:
    """`options` validated by estimator `name`'s Options; one ValueError line naming the key."""
    return validate_options(ESTIMATORS, name, dict(options or {}))


def make_estimator(name: str, options: Mapping[str, Any] | None = None, *, scale: str = "std",
                   eps: float = 1e-6, context: EstimatorContext | None = None) -> AdvantageEstimator:
    """The estimator `name`, built with its validated options."""
    try:
        opts = estimator_options(name, options)
    except ValueError as exc:
        raise CoevoError(f"rl.train.estimator_options.{exc}") from None
    return ESTIMATORS.get(name)(opts, scale=scale, eps=eps, context=context or EstimatorContext())


def token_advantages(traj: Trajectory, credit: Credit) -> torch.Tensor | None:
    """[n] per-position advantages (turn k's span gets turns[k], the rest `episode`), or None
    when the credit is the episode's alone (the trainer's per-sequence fast path).

    >>> from coevo.trajectory import Turn
    >>> t = Trajectory(env="e", task_id="t", token_ids=[0, 1, 2, 3, 4], loss_mask=[0, 1, 0, 1, 1],
    ...                turns=[Turn(index=0, start=1, end=2, text="a"),
    ...                       Turn(index=1, start=3, end=5, text="b")])
    >>> token_advantages(t, Credit(0.5, (1.0, -2.0))).tolist()
    [0.5, 1.0, 0.5, -2.0, -2.0]
    """
    if credit.turns is None:
        return None
    if len(credit.turns) != len(traj.turns):
        raise CoevoError(f"trajectory {traj.id}: {len(credit.turns)} turn advantages for "
                         f"{len(traj.turns)} turns")
    out = torch.full((len(traj.token_ids),), float(credit.episode), dtype=torch.float32)
    for turn, a in zip(traj.turns, credit.turns):
        out[turn.start: turn.end] = float(a)
    return out
