"""The settings of a `coevo train` run: stored with the run when it is created, restored by
`coevo train --resume`.

A resumed stage must continue the run that was started, not a different one: the assets are
the exact versions (by hash) the run started with, and every setting that shapes the
trajectories or the update (env, model, steps, G, tasks per step, learning rate, LoRA rank,
checkpoint cadence, SFT warm-up, seed) is read back from the run. A flag given on the resume
command line that differs from the stored value is refused, naming each flag and both
values; a flag that is absent takes the stored value. How the rollouts are executed
(`--executor`, `--actors`, `--rollout-model`) is not part of the run and may change.

Runs created before the full settings were stored keep only `env`, `model`, `steps` and
`seed`; the other settings come from the flags (there is nothing stored to conflict with).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict

from coevo.errors import CoevoError


class TrainSettings(BaseModel):
    """What `coevo train` stores as the run's config (assets by hash)."""

    model_config = ConfigDict(extra="forbid")
    command: Literal["train"] = "train"
    env: str
    model: str
    harness: Optional[str] = None  # content hashes of the asset versions trained under
    rubric: Optional[str] = None
    skill_library: Optional[str] = None
    steps: int = 10
    group_size: int = 4
    tasks_per_step: int = 4
    lr: float = 1e-4
    lora_rank: int = 16
    checkpoint_every: int = 5
    warmup_steps: int = 0
    seed: int = 0


# Setting -> the flag that sets it (for messages).
FLAGS = {"env": "--env", "model": "--model", "harness": "--harness", "rubric": "--rubric",
         "skill_library": "--skills", "steps": "--steps", "group_size": "--group-size",
         "tasks_per_step": "--tasks-per-step", "lr": "--lr", "lora_rank": "--lora-rank",
         "checkpoint_every": "--checkpoint-every", "warmup_steps": "--warmup-steps",
         "seed": "--seed"}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _show(field: str, value: Any) -> str:
    if field in ("harness", "rubric", "skill_library") and isinstance(value, str):
        return value[:12]
    return repr(value) if isinstance(value, str) else str(value)


def resume_settings(run: str, stored: dict[str, Any], given: dict[str, Any],
                    explicit: set[str]) -> TrainSettings:
    """The settings a resumed `coevo train` runs with.

    `stored` is the run's config, `given` the settings the command line would use (flags and
    their defaults, assets resolved to hashes), `explicit` the settings whose flag was given.
    Stored values win; an explicit flag that differs from its stored value is an error."""
    if stored.get("command") != "train":
        raise CoevoError(f"run {run!r} was not created by `coevo train`; continue it with "
                         f"`coevo run --resume {run}`")
    known = {k: v for k, v in stored.items() if k in TrainSettings.model_fields}
    conflicts = [f"{FLAGS[k]} {_show(k, given[k])} (stored: {_show(k, known[k])})"
                 for k in FLAGS if k in explicit and k in known and given.get(k) is not None
                 and not _same(given[k], known[k])]
    if conflicts:
        raise CoevoError(f"train --resume {run}: {'; '.join(conflicts)} differ from the settings "
                         "the run was started with; drop those flags (name the run with --run) to "
                         "continue it as stored, or start a new run under another --run name")
    return TrainSettings(**{**{k: v for k, v in given.items() if k in FLAGS}, **known})


def stored_agent_assets(store: Any, settings: TrainSettings) -> Any:
    """AgentAssets of the exact versions the run stored (by hash, never by name)."""
    from coevo.executors import AgentAssets

    lib, members = (store.get_library(settings.skill_library) if settings.skill_library
                    else (None, []))
    rubric = store.get_asset("rubric", settings.rubric) if settings.rubric else None
    return AgentAssets(harness=store.get_asset("harness", settings.harness), rubric=rubric,
                       library=lib, skills=members)
