"""RunConfig: one YAML file per run plus dotted command-line overrides (`rounds=3 gate.alpha=0.1`).

Every block is pydantic with extra="forbid", so a typo in the YAML or in an override is an error
naming the key (`training/x.yaml: gate.alfa: unknown key`), never a silently ignored default.
Override values are parsed as YAML scalars/flow collections (`rounds=3` is an int,
`proposers=[{name: demos}]` a list), the way simonw/llm parses `-o key value`. A file may start
from another with `extends: base.yaml` and state only what it changes (`read_layers`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from coevo.blocks import merge_blocks
from coevo.errors import AssetError
from coevo.gate import GatePolicy
from coevo.modes.settings import BetterTogetherSettings, FstSettings, SkillOptSettings
from coevo.validity import ValidityPolicy
from coevo.rl.config import TrainConfig
from coevo.rl.stage import StageConfig
from coevo.store.runs import run_name_problem
from coevo.tracking.base import TrackingSpec

Mode = Literal["gated", "ungated", "weight-only", "harness-only", "fst", "bettertogether", "skillopt"]


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Block):
    """The policy: a `load_backend` spec (embedded, hf:PATH, ...) and its constructor options."""

    backend: str = "embedded"
    options: dict[str, Any] = Field(default_factory=dict)


class SeedAssets(_Block):
    """The round-0 incumbent, resolved to exact versions once, when the run is created (the
    run records their hashes): a name is the version in `seed_dir`'s files (harnesses/,
    skills/, rubrics/) when given, else the store's seed version of that name (what `coevo
    init` imported; never a revision another run accepted); `name@hash` or a hash (prefix)
    names one version exactly."""

    harness: str
    skill_library: str | None = None
    rubric: str | None = None
    seed_dir: str | None = None


class RLSettings(_Block):
    """One RL stage per round: the stage (steps, G, tasks per step, checkpoints) + the trainer."""

    stage: StageConfig = Field(default_factory=StageConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)


class ProposerSpec(_Block):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class Splits(_Block):
    """How many tasks of each split the loop uses (None: the whole split)."""

    train_n: int | None = Field(None, ge=1)  # harness-only: train tasks rolled out per round
    train_samples: int = Field(2, ge=1)
    val_n: int | None = Field(40, ge=1)  # the gate's tasks (gate.max_tasks may cut further)
    val_samples: int = Field(1, ge=1)  # episodes per val task and arm (averaged per task)
    test_n: int | None = Field(None, ge=1)
    test_samples: int = Field(1, ge=1)
    # Score the incumbent on the whole val split at the start and after every round (the
    # val curve; not used by any decision, charged as eval_rollouts).
    track_val: bool = True
    # Also score the seed incumbent (seed assets, base model) on the test split at the start,
    # so the final test score has a baseline from the same run, task for task (measurement:
    # no decision reads it; charged as eval_rollouts).
    seed_test: bool = False
    # A frozen split file (`coevo splits freeze`, validation/NAME.yaml): the run refuses to
    # start when the environment's val / test tasks differ from it (coevo/frozen_splits.py).
    frozen: str | None = None


class Budgets(_Block):
    """Per-round limits (None: unlimited). When one is reached the round's remaining candidates
    are recorded as rejected with the reason (never silently dropped), and the run stops after
    that round when `stop_run_on_exhaustion`."""

    rollouts: int | None = Field(None, ge=1)
    tokens: int | None = Field(None, ge=1)
    proposer_calls: int | None = Field(None, ge=1)
    seconds: float | None = Field(None, gt=0)
    stop_run_on_exhaustion: bool = False
    # Stop the run after this many consecutive rounds that accepted nothing (None: never).
    patience: int | None = Field(None, ge=1)
    # Stop a run without RL once a round proposes only candidates the gate already rejected
    # against the same incumbent: the next round would repeat them (coevo/stoprules.py).
    stop_on_repeats: bool = True


class RunConfig(_Block):
    name: str = Field(min_length=1, max_length=200)
    env: str  # a make_env spec, e.g. "rg:basic_arithmetic" or "bfcl:simple_python"
    model: ModelSpec = Field(default_factory=ModelSpec)
    # The backend answering the rubric's llm_judge criteria (None: the policy's own backend).
    judge: ModelSpec | None = None
    assets: SeedAssets
    mode: Mode = "gated"
    rounds: int = Field(3, ge=1)
    seed: int = 0
    rl: RLSettings = Field(default_factory=RLSettings)
    proposers: list[ProposerSpec] = Field(default_factory=lambda: [ProposerSpec(name="demos")])
    gate: GatePolicy = Field(default_factory=GatePolicy)
    validity: ValidityPolicy = Field(default_factory=ValidityPolicy)  # how rubric candidates are gated
    splits: Splits = Field(default_factory=Splits)
    budgets: Budgets = Field(default_factory=Budgets)
    # The peer-method modes' settings (coevo/modes/settings.py); other modes ignore them.
    fst: FstSettings = Field(default_factory=FstSettings)
    bettertogether: BetterTogetherSettings = Field(default_factory=BetterTogetherSettings)
    skillopt: SkillOptSettings = Field(default_factory=SkillOptSettings)
    final_test: bool = True  # evaluate the final incumbent on the test split once
    # Log the run to an experiment tracker (coevo/tracking): {backend: trackio, project: P,
    # dir: FOLDER} or {backend: mlflow, project: EXPERIMENT, uri: URI}; `--track` overrides.
    # None: nothing is tracked. A resume may change it.
    tracking: TrackingSpec | None = None

    @field_validator("name")
    @classmethod
    def _run_name(cls, v: str) -> str:
        problem = run_name_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
             data: dict[str, Any] | None = None) -> "RunConfig":
        """Read `path` (with the files it `extends`; or start from `data`), apply `key.sub=value`
        overrides, validate."""
        source = str(path) if path is not None else "<config>"
        base: dict[str, Any] = dict(data or {})
        if path is not None:
            bases: list[Path] = []
            base = merge_blocks(base, read_layers(Path(path), bases=bases))
            if bases:  # a key may be wrong in any of them
                source += f" (or {', '.join(str(b) for b in bases)}, which it extends)"
        for item in overrides:
            apply_override(base, item, source)
        return cls.from_mapping(base, source)

    @classmethod
    def of_run(cls, stored: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> "RunConfig":
        """The config a stored run was created with (its record's `config`, which keeps the
        RunConfig under "config" next to the seed's hashes), with overrides (`rounds=5`)."""
        return cls.load(data=stored.get("config", stored), overrides=overrides)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str = "<config>") -> "RunConfig":
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or None
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            raise AssetError(source, field, msg) from None


def read_layers(path: Path, chain: tuple[Path, ...] = (),
                bases: list[Path] | None = None) -> dict[str, Any]:
    """The mapping of the run config at `path`, on top of the one its `extends:` names (a path
    relative to this file; that file may extend another). Blocks merge key by key, so a config
    states only what it changes; any other value (a list, a scalar) replaces the base's whole.
    A file's read errors name that file; the bases read are appended to `bases`."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise AssetError(source, None, f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise AssetError(source, None, f"not UTF-8 text (byte {e.start})") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise AssetError(source, None, f"invalid YAML: {e}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise AssetError(source, None, "a run config is a mapping of keys")
    loaded = dict(loaded or {})
    if "extends" not in loaded:
        return loaded
    parent = loaded.pop("extends")
    if not isinstance(parent, str) or not parent.strip():
        raise AssetError(source, "extends",
                         "expected the path of a run config, relative to this file")
    nxt = path.parent / parent
    target, here = nxt.resolve(), path.resolve()
    if target == here or target in chain:
        names = " -> ".join(p.name for p in (*chain, here, target))
        raise AssetError(source, "extends", f"{parent}: a cycle ({names})")
    if not target.is_file():
        raise AssetError(source, "extends", f"{parent}: no such file (relative to {path.parent})")
    if bases is not None:
        bases.append(nxt)
    return merge_blocks(read_layers(nxt, (*chain, here), bases), loaded)


def apply_override(data: dict[str, Any], item: str, source: str = "<config>") -> None:
    """Set `a.b.c=value` in nested `data` (value parsed as YAML), creating blocks on the way;
    unknown keys are left for validation to reject by name.

    >>> d = {"gate": {"alpha": 0.05}}; apply_override(d, "gate.alpha=0.1"); d
    {'gate': {'alpha': 0.1}}
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not p for p in key.split(".")):
        raise AssetError(f"{source} (override)", None,
                         f"{item!r}: expected key=value, e.g. rounds=3 or gate.alpha=0.1")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise AssetError(f"{source} (override)", key, f"value {raw!r} is not valid YAML: {e}") from None
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise AssetError(f"{source} (override)", ".".join(parts[: i + 1]),
                             f"is a {type(nxt).__name__}, not a block of keys")
        node = nxt
    node[parts[-1]] = value
