"""Task samplers for the RL stage: uniform (the ablation) and capability-aware (ARISE).

GRPO learns only from groups whose G rewards differ (coevo/rl/grpo.py skips the rest and
`StepLog.signal_fraction` records the share that had signal). A task the policy always solves,
or never solves, spends G rollouts on nothing. ARISE therefore samples training tasks weighted
towards task families and rubric criteria whose recent pass rates are intermediate.

`CapabilitySampler` (registered as "capability"), at construction:

1. reads the run's stored TRAIN trajectories of the `rounds` rounds before the current one
   (never the current round: a resumed stage has some of this round's rollouts stored already
   and must draw what an uninterrupted stage drew; never val/test);
2. counts successes per task, per task family (`Task.family`) and overall, and sums each rubric
   criterion's scores (`Trajectory.criteria`) the same way;
3. smooths with a Beta prior that backs off task -> family -> everything:
       m_all  = (S + 1) / (N + 2)                        # Laplace
       m_fam  = (S_f + k m_all) / (N_f + k)
       p_task ~ Beta(s_t + k m_fam, n_t - s_t + k (1 - m_fam))
   so an unseen task inherits its family's rate with the weight of k pseudo-rollouts;
4. weighs each task by the probability that a group of G samples has signal,
       P(signal) = 1 - E[p^G] - E[(1-p)^G],   E[p^G] = prod_{i<G} (a+i) / (a+b+i)
   (for G = 2 this is 2 E[p(1-p)]: the brief's "smoothed p(1-p)", generalised to the stage's
   group size and integrated over the Beta rather than plugged in at its mean, so a task seen
   twice is not as certain as one seen forty times), plus `criteria_weight` times the mean of
   the same quantity over the rubric criteria; the sum is divided by (1 + criteria_weight),
   so weights lie in [0, 1], and floored at `min_weight` so no task starves;
5. draws step s's k distinct tasks without replacement with those weights from
   `Random(f"{seed}:{step}")` by Efraimidis-Spirakis keys (u^(1/w), the k largest), which has
   the distribution of successive weighted draws and one random number per task.

Weights are fixed for the whole stage (the TaskSampler contract: a pure function of
construction and step). `weights()` and `audit()` expose them; `rl_stage` stores `audit()` in
the round's summary under "sampler", next to the per-step signal fractions the loop stores
under "rl_steps".

Departures from ARISE: pass rates come from the previous rounds' stored rollouts, not a running
estimate updated inside the stage (that would make the draw depend on earlier steps and break
bit-exact resume); criterion scores in [0, 1] are counted as fractional successes (a Beta
approximation for partial credit); families are `Task.family` strings, not learned clusters.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coevo.envs.base import Task
from coevo.errors import CoevoError
from coevo.registry import Registry, UnknownName
from coevo.trajectory import Trajectory


@runtime_checkable
class TaskSampler(Protocol):
    """Contract: `sample(step, k)` returns k distinct train tasks for trainer step `step`.
    It must be a pure function of (its construction, step), never of earlier calls, so a
    resumed stage draws what an uninterrupted one would have drawn. Capability-aware
    samplers read the store at construction, not between steps.

    Factories in `SAMPLERS` are called `factory(tasks, seed, *, store, run, round, samples,
    **options)`: the store, run id and round let a sampler read recent pass rates; `samples`
    is the stage's group size G; `options` are `StageConfig.sampler_options`."""

    def sample(self, step: int, k: int) -> list[Task]: ...


def _check_k(k: int, n: int) -> None:
    if k > n:
        raise CoevoError(f"tasks_per_step: {k} is more than the {n} train "
                         "tasks available (a task twice in one step would merge groups)")


def _rng(seed: int, step: int) -> random.Random:
    return random.Random(f"{seed}:{step}")  # str seeds are hashed stably (sha512)


class UniformSampler:
    """k tasks uniformly without replacement from the pool, from `Random(f"{seed}:{step}")`.
    The ablation of the capability-aware sampler; it ignores the store."""

    def __init__(self, tasks: Sequence[Task], seed: int = 0, *, store: Any = None,
                 run: str | None = None, round: int | None = None, samples: int = 2):
        if not tasks:
            raise CoevoError("task sampler: the train split has no tasks")
        self.tasks, self.seed = list(tasks), seed

    def sample(self, step: int, k: int) -> list[Task]:
        _check_k(k, len(self.tasks))
        return _rng(self.seed, step).sample(self.tasks, k)

    def weights(self) -> dict[str, float]:
        return {t.id: 1.0 for t in self.tasks}


# --- capability-aware ----------------------------------------------------------------------------


class CapabilityOptions(BaseModel):
    """`StageConfig.sampler_options` of the "capability" sampler."""

    model_config = ConfigDict(extra="forbid")
    rounds: int = Field(1, ge=1)  # how many earlier rounds' train rollouts to read
    max_trajectories: int | None = Field(None, ge=1)  # keep only the newest N of them
    prior_strength: float = Field(2.0, gt=0.0)  # k: pseudo-rollouts of the family's rate
    criteria_weight: float = Field(0.5, ge=0.0)  # lambda: weight of the rubric-criteria term
    min_weight: float = Field(0.05, gt=0.0, le=1.0)  # floor, so no task starves
    group_size: int | None = Field(None, ge=2)  # G; default: the stage's `samples`


class _Counts:
    """Successes and trials, keyed; fractional successes allowed (criterion scores)."""

    def __init__(self) -> None:
        self.s: dict[Any, float] = defaultdict(float)
        self.n: dict[Any, int] = defaultdict(int)

    def add(self, key: Any, value: float) -> None:
        self.s[key] += value
        self.n[key] += 1


def beta_power_mean(a: float, b: float, g: int) -> float:
    """E[p^g] for p ~ Beta(a, b).

    >>> round(beta_power_mean(1.0, 1.0, 4), 6)  # uniform: 1/(g+1)
    0.2
    """
    out = 1.0
    for i in range(g):
        out *= (a + i) / (a + b + i)
    return out


def signal_probability(a: float, b: float, g: int) -> float:
    """P(a group of g Bernoulli(p) samples is not all equal), p ~ Beta(a, b).

    >>> round(signal_probability(50.0, 50.0, 2), 3)  # ~ 2 p (1 - p) at p = 0.5
    0.495
    >>> signal_probability(1e-9, 1.0, 4) < 1e-8  # never solved: no signal
    True
    """
    return max(0.0, 1.0 - beta_power_mean(a, b, g) - beta_power_mean(b, a, g))


class CapabilitySampler:
    """Weighted sampling towards tasks with intermediate recent pass rates (module docstring)."""

    def __init__(self, tasks: Sequence[Task], seed: int = 0, *, store: Any = None,
                 run: str | None = None, round: int | None = None, samples: int = 2,
                 **options: Any):
        if not tasks:
            raise CoevoError("task sampler: the train split has no tasks")
        try:
            self.options = CapabilityOptions.model_validate(options)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise CoevoError(f"rl.stage.sampler_options.{where}: {err['msg']} "
                             "(sampler 'capability')") from None
        self.tasks, self.seed = list(tasks), seed
        self.group = self.options.group_size or samples
        self.history = self._history(store, run, round)
        self._weights = self._compute()

    # -- reading the store --

    def _history(self, store: Any, run: str | None, round: int | None) -> list[Trajectory]:
        """Train rollouts of the `rounds` rounds before `round` (all rounds when round is None),
        without infrastructure failures (missing data, not failures)."""
        if store is None or run is None:
            return []
        if round is None:
            rounds: list[int | None] = [None]
        else:
            rounds = list(range(max(0, round - self.options.rounds), round))
        out: list[Trajectory] = []
        for r in rounds:
            out.extend(store.trajectories(run=run, round=r, split="train"))
        out = [t for t in out if not t.infra_failed and t.outcome is not None]
        if self.options.max_trajectories is not None:
            out = out[-self.options.max_trajectories:]  # insertion order: newest last
        return out

    # -- the weights --

    def _compute(self) -> dict[str, float]:
        o, g = self.options, self.group
        family = {t.id: t.family for t in self.tasks}
        outcome = {"task": _Counts(), "family": _Counts(), "all": _Counts()}
        crit = {"task": _Counts(), "family": _Counts(), "all": _Counts()}
        for t in self.history:
            if t.task_id not in family:
                continue  # a task no longer in the pool says nothing about its family here
            f = family[t.task_id]
            ok = float(t.success)
            outcome["task"].add(t.task_id, ok)
            outcome["family"].add(f, ok)
            outcome["all"].add(None, ok)
            for c, v in t.criteria.items():
                v = min(1.0, max(0.0, float(v)))
                crit["task"].add((t.task_id, c), v)
                crit["family"].add((f, c), v)
                crit["all"].add(c, v)
        criteria = sorted(crit["all"].n)

        def posterior(counts: dict[str, _Counts], task: str, fam: str, key: Any = None):
            key_all, key_fam, key_task = (key, (fam, key), (task, key)) if key is not None \
                else (None, fam, task)
            c_all, c_fam, c_task = counts["all"], counts["family"], counts["task"]
            m_all = (c_all.s[key_all] + 1.0) / (c_all.n[key_all] + 2.0)
            m_fam = (c_fam.s[key_fam] + o.prior_strength * m_all) / (c_fam.n[key_fam] + o.prior_strength)
            s, n = c_task.s[key_task], c_task.n[key_task]
            return s + o.prior_strength * m_fam, n - s + o.prior_strength * (1.0 - m_fam)

        self._rates: dict[str, float] = {}
        out: dict[str, float] = {}
        for t in self.tasks:
            a, b = posterior(outcome, t.id, t.family)
            self._rates[t.id] = a / (a + b)
            w = signal_probability(a, b, g)
            if criteria and o.criteria_weight > 0:
                terms = [signal_probability(*posterior(crit, t.id, t.family, c), g)
                         for c in criteria]
                w = (w + o.criteria_weight * sum(terms) / len(terms)) / (1.0 + o.criteria_weight)
            out[t.id] = max(o.min_weight, w)
        self._families = {
            f: {"n": outcome["family"].n[f],
                "pass_rate": (outcome["family"].s[f] / outcome["family"].n[f]
                              if outcome["family"].n[f] else None)}
            for f in sorted({t.family for t in self.tasks})}
        self._criteria = {c: crit["all"].s[c] / crit["all"].n[c] for c in criteria}
        return out

    def weights(self) -> dict[str, float]:
        """{task id: sampling weight} (before normalisation), for audit."""
        return dict(self._weights)

    def audit(self) -> dict[str, Any]:
        """What the weights were computed from: JSON for the round's summary."""
        return {"name": "capability", "group_size": self.group,
                "options": self.options.model_dump(mode="json"),
                "trajectories_read": len(self.history), "families": self._families,
                "criteria_pass_rates": self._criteria,
                "weights": {k: round(v, 6) for k, v in self._weights.items()}}

    def sample(self, step: int, k: int) -> list[Task]:
        _check_k(k, len(self.tasks))
        rng = _rng(self.seed, step)
        # Efraimidis-Spirakis: key = log(u) / w; the k largest keys are a weighted sample
        # without replacement. One draw per task in pool order, so the result depends only on
        # (seed, step, pool, weights).
        keyed = []
        for i, t in enumerate(self.tasks):
            u = max(rng.random(), 1e-300)
            keyed.append((math.log(u) / self._weights[t.id], -i))
        order = sorted(range(len(self.tasks)), key=lambda i: keyed[i], reverse=True)
        return [self.tasks[i] for i in order[:k]]


SAMPLERS: Registry[Callable[..., TaskSampler]] = Registry("task sampler")
SAMPLERS.add("uniform", UniformSampler)
SAMPLERS.add("capability", CapabilitySampler)


def build_sampler(name: str, tasks: Sequence[Task], seed: int, *, store: Any = None,
                  run: str | None = None, round: int | None = None, samples: int = 2,
                  options: dict[str, Any] | None = None) -> TaskSampler:
    """The sampler `StageConfig.sampler` names, built with its `sampler_options`; bad names or
    options are a CoevoError naming the config field."""
    try:
        factory = SAMPLERS.get(name)
    except UnknownName as exc:
        raise CoevoError(f"rl.stage.sampler: {exc}") from None
    try:
        return factory(tasks, seed, store=store, run=run, round=round, samples=samples,
                       **(options or {}))
    except TypeError as exc:  # an option the factory does not take (the uniform sampler: any)
        raise CoevoError(f"rl.stage.sampler_options: sampler {name!r} does not take "
                         f"{sorted(options or {})}: {exc}") from None


def record_sampler(store: Any, run: str, round: int, name: str, sampler: Any) -> None:
    """Store what the sampler did in round `round`'s summary under "sampler" (the round's
    status is kept); samplers without `audit()` record their name only."""
    audit = sampler.audit() if hasattr(sampler, "audit") else {"name": name}
    rec = store.get_round(run, round)
    store.finish_round(run, round, rec.status, summary={**rec.summary, "sampler": audit})
