"""The gate's power before a run: what `coevo run --dry-run` prints, and how
`gate.target_effect` sizes the val split (coevo/power.py does the arithmetic).

A run's gate compares each candidate with the incumbent on `splits.val_n` val tasks (cut to
`gate.max_tasks`) x `splits.val_samples`; at `gate.alpha` that detects, with probability
`gate.target_power`, a mean paired difference of at least the MDE. The MDE depends on the
discordance rate (the share of paired episodes whose outcomes differ), taken from, in order:
`gate.discordance` when the config sets it; else the stored val episodes of the same
environment under the run's seed harness, from any earlier run (`queries.task_outcomes`;
`power.discordance` says how it was estimated); else an assumed DEFAULT_DISCORDANCE. The
printout says which.

Families. The candidates of a round are decided together by Holm: a candidate that is the only
real improvement among m is accepted at alpha / m (coevo/gate.py). m is estimated from the
configured proposers (each of `candidates` per round, default 1; rubric proposals are gated on
validity, outside the family), and the MDE is given at both levels. `gate.target_effect` sizes
the val split at the family level alpha / m, capped by the environment's val split; the
computation is printed, and the run records the resulting `splits.val_n` in its config, so a
resume reuses it instead of sizing again against a store that has changed since.

Nothing here loads a model or writes to the store: the dry run opens the store read-only
(`queries.open_readonly`, which creates no file) or runs without one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from coevo.errors import CoevoError
from coevo.power import DEFAULT_DISCORDANCE, discordance, mde, power, tasks_for

NOT_IN_FAMILY = frozenset({"rubrics"})  # gated on predictive validity, not by Holm


class PowerPlan(BaseModel):
    """The numbers `coevo run --dry-run` prints (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    env: str
    val_split: int  # tasks in the environment's val split
    val_n: int  # tasks the gate plans: sized or configured, cut to the split and max_tasks
    samples: int
    alpha: float
    family: int  # candidates per round, estimated from the proposers
    metric: str
    min_delta: float
    target_power: float
    discordance: float
    discordance_source: str
    mde: float | None  # at alpha (a lone candidate)
    mde_family: float | None  # at alpha / family
    target_effect: float | None = None
    needed: int | None = None  # tasks the target effect needs at alpha / family (None: > split)
    power_at_target: float | None = None  # at val_n

    def lines(self) -> list[str]:
        def pct(x: float | None) -> str:
            return "not reachable (too few tasks)" if x is None else f"{x:+.3f}"

        lvl = self.alpha / self.family
        out = [f"gate power ({self.env}): {self.val_n} val tasks (split holds {self.val_split}) "
               f"x {self.samples} sample(s), {self.metric}, alpha {self.alpha:g}, "
               f"power {self.target_power:g}",
               f"  discordance {self.discordance:.3f}: {self.discordance_source}",
               f"  minimum detectable effect: {pct(self.mde)} (a lone candidate, alpha "
               f"{self.alpha:g})"]
        if self.family > 1:
            out.append(f"  with {self.family} candidates a round (Holm's strictest level "
                       f"alpha/{self.family} = {lvl:.4g}): {pct(self.mde_family)}")
        if self.target_effect is not None:
            need = (f"{self.needed} tasks" if self.needed is not None
                    else f"more than the {self.val_split} the val split holds")
            out.append(f"  gate.target_effect {self.target_effect:g}: power {self.target_power:g} "
                       f"at alpha {lvl:.4g} needs {need}: the first n with exact power >= "
                       f"{self.target_power:g} (coevo/power.py) -> splits.val_n {self.val_n} "
                       f"(power {self.power_at_target:.3f})")
        out.append(f"  effect = mean paired difference, candidate - incumbent (success rate for "
                   f"0/1 outcomes); {2 * self.val_n * self.samples} episodes per candidate at most; "
                   "the sequential gate's futility stops cost a few points of this power")
        if self.metric == "partial":
            out.append("  (metric partial: the discordance of partial credit is not observed; "
                       "the figures use the outcome's)")
        return out


def family_size(cfg: Any) -> int:
    """Candidates a round's Holm family holds, estimated from the configured proposers: each
    proposes `candidates` a round (a count, or a scripted proposer's list), else one."""
    n = 0
    for p in cfg.proposers:
        if p.name in NOT_IN_FAMILY:
            continue
        c = p.options.get("candidates", 1)
        n += len(c) if isinstance(c, list) else c if isinstance(c, int) and c > 0 else 1
    return max(n, 1)


def seed_harness_hash(cfg: Any, store: Any) -> str | None:
    """The hash of the run's seed harness, resolved as `loop.seed_incumbent` would, without
    writing anything (None: not found)."""
    ref = cfg.assets.harness
    if cfg.assets.seed_dir:
        from coevo.assets.io import load_seed_dir

        for asset in load_seed_dir(cfg.assets.seed_dir):
            if asset.kind == "harness" and asset.name == ref:
                return asset.hash
    if store is None:
        return None
    try:
        return store.resolve_seed("harness", ref).hash
    except CoevoError:
        return None


def observed_discordance(cfg: Any, store: Any, env_name: str) -> tuple[float, str] | None:
    """The discordance the store's val episodes of environment `env_name` (episodes record the
    environment's name, not the config's spec) under the run's seed harness show."""
    if store is None:
        return None
    from coevo.store.queries import task_outcomes

    harness = seed_harness_hash(cfg, store)
    if harness is None:
        return None
    found = discordance(task_outcomes(store, env_name, harness))
    if found is None:
        return None
    psi, how = found
    return psi, f"{how}; harness {harness[:12]}"


def plan(cfg: Any, env: Any, store: Any = None, *, note: str = "") -> PowerPlan:
    """The gate's power for `cfg` on `env` (module docstring); `store` may be None."""
    g, s = cfg.gate, cfg.splits
    split = len(env.tasks("val"))
    if split == 0:
        raise CoevoError(f"env {cfg.env}: the val split has no tasks")
    if g.discordance is not None:
        psi, source = g.discordance, "configured (gate.discordance)"
    else:
        psi, source = observed_discordance(cfg, store, getattr(env, "name", cfg.env)) or (
            DEFAULT_DISCORDANCE, "assumed (no stored val episodes of this env and seed harness"
            + (f"; {note}" if note else "") + "; set gate.discordance to give one)")
    psi = min(max(psi, 1e-6), 1.0)
    m, k = family_size(cfg), s.val_samples
    level = g.alpha / m
    needed = None
    n = min(s.val_n or split, split)
    if g.target_effect is not None:
        needed = tasks_for(g.target_effect, psi, level, k, g.target_power, n_max=split,
                           min_delta=g.min_delta)
        n = needed if needed is not None else split
    n = min(n, g.max_tasks or n)
    return PowerPlan(
        env=cfg.env, val_split=split, val_n=n, samples=k, alpha=g.alpha, family=m,
        metric=g.resolved_metric(), min_delta=g.min_delta, target_power=g.target_power,
        discordance=psi, discordance_source=source,
        mde=mde(n, psi, g.alpha, k, g.target_power, g.min_delta),
        mde_family=mde(n, psi, level, k, g.target_power, g.min_delta),
        target_effect=g.target_effect, needed=needed,
        power_at_target=(power(n, g.target_effect, psi, level, k, g.min_delta)
                         if g.target_effect is not None else None))


def size_val_split(cfg: Any, env: Any, store: Any, resume: str | None = None,
                   progress: Callable[[str], None] | None = None) -> Any:
    """`cfg` with `splits.val_n` sized for `gate.target_effect` (unchanged without one). A
    resumed run keeps the val_n it was created with (its stored config)."""
    if cfg.gate.target_effect is None:
        return cfg
    say = progress or (lambda _m: None)
    if resume is not None:
        stored = store.get_run(resume).config.get("config", {}).get("splits", {}).get("val_n")
        say(f"gate.target_effect {cfg.gate.target_effect:g}: splits.val_n {stored} "
            "(sized when the run was created)")
        n = stored
    else:
        p = plan(cfg, env, store)
        for line in p.lines():
            say(line)
        n = p.val_n
    return cfg.model_copy(update={"splits": cfg.splits.model_copy(update={"val_n": n})})


def dry_run(cfg: Any, db: str | None, resume: str | None = None) -> list[str]:
    """What `coevo run --dry-run` prints: the gate's power for `cfg`. Builds the environment
    (its tasks, no model) and reads the store at `db` read-only when there is one."""
    from coevo.envs.registry import make_env
    from coevo.store.queries import open_readonly

    env = make_env(cfg.env)
    try:
        store = open_readonly(db)
    except CoevoError as e:
        store, note = None, f"no store read: {e}"
    else:
        note = ""
    try:
        resumed: list[str] = []
        if resume is not None and store is not None and cfg.gate.target_effect is not None:
            cfg = size_val_split(cfg, env, store, resume, resumed.append)  # not sized again
            cfg = cfg.model_copy(update={"gate": cfg.gate.model_copy(update={"target_effect": None})})
        return plan(cfg, env, store, note=note).lines() + [f"  {x}" for x in resumed]
    finally:
        if store is not None:
            store.close()
