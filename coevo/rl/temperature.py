"""Sampling-temperature schedules of the RL stage (`rl.stage.temperature`, registry
`TEMPERATURES`): `fixed` (the harness's decoding temperature for every task, the default, or
the stage's own `value`) and `tempered` (posterior-tempered group sampling, PTGS-style).

GRPO learns only from groups whose rewards differ. A task the policy nearly always solves gives
G equal successes; one it nearly never solves, G equal failures. `tempered` keeps a Beta
posterior of each task's pass rate from the stage's own history and samples hard tasks hotter
(more diverse attempts: a success becomes likelier) and easy ones cooler (fewer careless
failures are sampled only to be pushed down), within bounds:

    a_t, b_t = prior + successes_t, prior + failures_t       (train rollouts of this run
                                                              sampled before step s)
    q_t      = b_t / (a_t + b_t)                             (posterior mean failure rate)
    T_t      = clamp(base + spread * (2 q_t - 1), min_temperature, max_temperature)

A task with no history (q = 1/2) is sampled at `base` (default: the harness's temperature),
so the first step equals `fixed`. The temperature of every turn is recorded in its
`Turn.sampling` (the executor replaces the harness's temperature by the task's), so the
trainer scores the tokens under the distribution they were drawn from
(coevo/rl/processing.py): the stored behaviour log-probs still equal its recomputation.

Determinism: the history is the run's stored train trajectories with `policy_step < s`, a
function of the step, so a resumed stage samples at the temperatures an uninterrupted one
used. Departures from PTGS: the posterior mean is mapped linearly to a temperature (no
search for the temperature that maximises the expected reward spread); successes are the
verifier's `success` flags, not rewards; `history_steps` bounds how far back the counts reach.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coevo.envs.base import Task
from coevo.errors import CoevoError
from coevo.registry import Registry, UnknownName, validate_options
from coevo.trajectory import Trajectory


@runtime_checkable
class TemperatureSchedule(Protocol):
    """Contract: `temperatures(step, tasks)` returns {task id: temperature} for the tasks of
    trainer step `step` (None: every task at the harness's temperature). A pure function of
    the construction, the step and what the store held of steps before `step`.

    Factories in `TEMPERATURES` are called `factory(harness_temperature, *, store, run,
    **options)`: the harness's decoding temperature, `options` are `StageConfig.temperature_options`."""

    def temperatures(self, step: int, tasks: Sequence[Task]) -> dict[str, float] | None: ...


class FixedOptions(BaseModel):
    """`StageConfig.temperature_options` of the "fixed" schedule."""

    model_config = ConfigDict(extra="forbid")
    # The RL stage's own sampling temperature for every task (None: the harness's). A harness
    # that decodes greedily (temperature 0, as a `knobs` sweep may set it) gives a GRPO group
    # G copies of one answer and no advantage; the stage then samples at `value` instead.
    value: float | None = Field(None, gt=0.0, le=5.0)


class FixedTemperature:
    """The harness's temperature for every task (the ablation of `tempered`), or `value`."""

    Options = FixedOptions

    def __init__(self, harness_temperature: float, *, store: Any = None, run: str | None = None,
                 value: float | None = None):
        self.base = harness_temperature if value is None else value
        self.value = value

    def temperatures(self, step: int, tasks: Sequence[Task]) -> dict[str, float] | None:
        if self.value is None:
            return None
        return {t.id: self.value for t in tasks}


class TemperedOptions(BaseModel):
    """`StageConfig.temperature_options` of the "tempered" schedule."""

    model_config = ConfigDict(extra="forbid")
    base: float | None = Field(None, gt=0.0)  # the temperature at q = 1/2 (None: the harness's)
    spread: float = Field(0.3, ge=0.0)  # T moves from base - spread (q=0) to base + spread (q=1)
    min_temperature: float = Field(0.1, gt=0.0)
    max_temperature: float = Field(1.5, gt=0.0, le=5.0)
    prior: float = Field(1.0, gt=0.0)  # Beta(prior, prior) before any rollout of the task
    history_steps: int | None = Field(None, ge=1)  # only the last N steps (None: all earlier)

    @model_validator(mode="after")
    def _bounds(self) -> "TemperedOptions":
        if self.min_temperature > self.max_temperature:
            raise ValueError(f"min_temperature {self.min_temperature} is above "
                             f"max_temperature {self.max_temperature}")
        return self


def tempered(q: float, base: float, o: TemperedOptions) -> float:
    """The temperature of a task with posterior mean failure rate `q`.

    >>> o = TemperedOptions(spread=0.4, max_temperature=1.0)
    >>> tempered(0.5, 0.7, o), tempered(0.0, 0.7, o), round(tempered(1.0, 0.7, o), 6)
    (0.7, 0.3, 1.0)
    """
    return min(o.max_temperature, max(o.min_temperature, base + o.spread * (2.0 * q - 1.0)))


class TemperedTemperature:
    """Per-task temperatures from Beta posteriors of the stage's own history (module doc)."""

    Options = TemperedOptions

    def __init__(self, harness_temperature: float, *, store: Any = None,
                 run: str | None = None, **options: Any):
        try:
            self.options = temperature_options("tempered", options)
        except ValueError as exc:
            raise CoevoError(f"rl.stage.temperature_options: {exc}") from None
        self.base = self.options.base if self.options.base is not None else harness_temperature
        self.store, self.run = store, run

    def history(self, step: int) -> list[Trajectory]:
        """The run's verified train rollouts sampled before `step` (within history_steps)."""
        if self.store is None or self.run is None:
            return []
        lo = step - self.options.history_steps if self.options.history_steps else None
        return [t for t in self.store.trajectories(run=self.run, split="train")
                if t.policy_step is not None and t.policy_step < step
                and (lo is None or t.policy_step >= lo)
                and not t.infra_failed and t.outcome is not None]

    def posteriors(self, step: int, tasks: Sequence[Task]) -> dict[str, tuple[float, float]]:
        """{task id: (a, b)} of each task's pass-rate Beta posterior before `step`."""
        wins: dict[str, int] = defaultdict(int)
        losses: dict[str, int] = defaultdict(int)
        for t in self.history(step):
            (wins if t.success else losses)[t.task_id] += 1
        k = self.options.prior
        return {t.id: (k + wins[t.id], k + losses[t.id]) for t in tasks}

    def temperatures(self, step: int, tasks: Sequence[Task]) -> dict[str, float]:
        return {tid: tempered(b / (a + b), self.base, self.options)
                for tid, (a, b) in self.posteriors(step, tasks).items()}


TEMPERATURES: Registry[Any] = Registry("temperature schedule")
TEMPERATURES.add("fixed", FixedTemperature)
TEMPERATURES.add("tempered", TemperedTemperature)


def temperature_options(name: str, options: dict[str, Any] | None) -> BaseModel:
    """`options` validated by schedule `name`'s Options; one ValueError line naming the key."""
    return validate_options(TEMPERATURES, name, options)


def build_temperature(name: str, harness_temperature: float, *, store: Any = None, run: str | None = None,
                      options: dict[str, Any] | None = None) -> TemperatureSchedule:
    """The schedule `StageConfig.temperature` names; bad names or options are a CoevoError
    naming the config field."""
    try:
        factory = TEMPERATURES.get(name)
    except UnknownName as exc:
        raise CoevoError(f"rl.stage.temperature: {exc}") from None
    try:
        temperature_options(name, options)
    except ValueError as exc:
        raise CoevoError(f"rl.stage.temperature_options: {exc}") from None
    return factory(harness_temperature, store=store, run=run, **(options or {}))
