"""Frozen validation splits: the task ids of an environment's val and test splits and a content
hash of those tasks, written once (`coevo splits freeze`) to `validation/NAME.yaml`.

A run config names the file (`splits.frozen: validation/NAME.yaml`); the loop checks it before
anything runs, on a new run and on every resume, and refuses to run when the environment no
longer serves the same tasks: a benchmark whose data changed (a dataset release, an edited task
file, another library version generating different items) must not pass for the same
validation set. The gate compares arms on the run's val tasks, which this check pins.

The hash of a task is the sha256 of its canonical JSON (id, env, family, messages, tools,
answer, metadata), less `VOLATILE_METADATA` (where a task sits in its file says nothing about
the task); a split's hash is the sha256 of its tasks' hashes in split order. The run's own
`val_n` / `test_n` may use fewer tasks than were frozen (the first ones, in the same hash
order), never more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coevo.assets.base import canonical_json, sha256_hex
from coevo.assets.io import asset_error_from_validation, parse_yaml, to_yaml
from coevo.envs.base import SPLITS, Environment, Task
from coevo.errors import AssetError, CoevoError

VOLATILE_METADATA = frozenset({"line"})
FROZEN_SPLITS = ("val", "test")


class FrozenSplit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    ids: list[str]


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: str  # what was frozen, as given (`coevo splits check` rebuilds the environment)
    env: str  # the environment's name, which a run's environment must have
    splits: dict[str, FrozenSplit]


def task_hash(task: Task) -> str:
    data = task.model_dump(mode="json")
    data["metadata"] = {k: v for k, v in data["metadata"].items() if k not in VOLATILE_METADATA}
    return sha256_hex(canonical_json(data))


def split_hash(tasks: list[Task]) -> str:
    return sha256_hex("\n".join(task_hash(t) for t in tasks))


def freeze(env: Environment, spec: str, n: int | None = None,
           splits: tuple[str, ...] = FROZEN_SPLITS) -> Frozen:
    """The frozen record of `env`'s splits (at most `n` tasks each, in split order)."""
    for s in splits:
        if s not in SPLITS:
            raise CoevoError(f"split {s!r} is unknown; known: {', '.join(SPLITS)}")
    out = {}
    for s in splits:
        tasks = list(env.tasks(s, n))
        out[s] = FrozenSplit(n=len(tasks), sha256=split_hash(tasks), ids=[t.id for t in tasks])
    return Frozen(spec=spec, env=env.name, splits=out)


def write_frozen(frozen: Frozen, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    head = ("# Frozen by `coevo splits freeze`: a run naming this file (splits.frozen) refuses to\n"
            "# start when the environment's tasks differ from these. Do not edit by hand.\n")
    p.write_text(head + to_yaml(frozen.model_dump(mode="json")), encoding="utf-8")
    return p


def find_frozen(path: str | Path) -> Path:
    """`path` as given, else relative to the checkout coevo runs from (a run config found by
    `coevo quickstart` from any folder names `validation/...` relative to that checkout)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    checkout = Path(__file__).resolve().parent.parent / p
    return checkout if checkout.exists() else p


def read_frozen(path: str | Path) -> Frozen:
    p = find_frozen(path)
    source = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AssetError(source, None, "no such frozen split file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AssetError(source, None, f"cannot read: {e}") from None
    data = parse_yaml(text, source)
    try:
        frozen = Frozen.model_validate(data)
    except ValidationError as e:
        raise asset_error_from_validation(e, source, data, Frozen) from None
    for name, s in frozen.splits.items():
        if name not in SPLITS:
            raise AssetError(source, f"splits.{name}", f"unknown split; known: {', '.join(SPLITS)}")
        if s.n != len(s.ids):
            raise AssetError(source, f"splits.{name}.n", f"is {s.n} but {len(s.ids)} ids are listed")
    return frozen


def check_frozen(path: str | Path, env: Environment, uses: dict[str, int | None] | None = None) -> None:
    """Raise CoevoError unless `env` serves exactly the frozen tasks of every split in the file,
    and `uses` (split -> tasks the run takes, None: all) stays within them."""
    frozen = read_frozen(path)
    where = str(find_frozen(path))
    if frozen.env != env.name:
        raise CoevoError(f"{where}: env: frozen for {frozen.env!r}, the run's environment is "
                         f"{env.name!r}")
    for name, s in frozen.splits.items():
        tasks = list(env.tasks(name, s.n))
        ids = [t.id for t in tasks]
        if ids != s.ids:
            diff = next((i for i, (a, b) in enumerate(zip(ids, s.ids)) if a != b), min(len(ids), len(s.ids)))
            got = ids[diff] if diff < len(ids) else "(none)"
            want = s.ids[diff] if diff < len(s.ids) else "(none)"
            raise CoevoError(f"{where}: splits.{name}: the environment's {name} tasks changed "
                             f"(task {diff}: {got!r}, frozen {want!r}); refusing to run")
        if split_hash(tasks) != s.sha256:
            raise CoevoError(f"{where}: splits.{name}: the content of the {name} tasks changed "
                             f"(same {len(tasks)} ids, sha256 {split_hash(tasks)[:12]} != frozen "
                             f"{s.sha256[:12]}); refusing to run on a different {name} set")
    for name, want in (uses or {}).items():
        s = frozen.splits.get(name)
        if s is None:
            continue
        available = len(env.tasks(name))
        need = available if want is None else min(want, available)
        if need > s.n:
            raise CoevoError(f"{where}: splits.{name}: the run takes {need} {name} tasks, only "
                             f"{s.n} are frozen (set splits.{name}_n <= {s.n})")


def describe(frozen: Frozen) -> dict[str, Any]:
    return {name: {"n": s.n, "sha256": s.sha256[:12]} for name, s in frozen.splits.items()}
