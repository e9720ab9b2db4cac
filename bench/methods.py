"""RL-method plug-ins vs the default: one RL stage per (method, seed), then the val score.

For every method (a named set of `rl.train` / `rl.stage` overrides of the base config's, the
plug-ins of coevo/rl/: estimators, temperature schedule, teacher) and seed, a freshly loaded
policy (`model.backend` of the config, or `--model`) runs one RL stage of the config's steps on
the train split from the seed assets, then the trained policy is evaluated once on the val
split (the config's `val_n` tasks, one sample each, the same sampling seed for every method, so
per-task outcomes pair across methods). Printed, one row per method:

    method | val score [95%] | vs default [95%] | signal fraction | seconds

Intervals are seed-aware: a hierarchical (cluster) bootstrap over seeds, then tasks within each
seed (bench/coevolution_report.py `cluster_bootstrap`); "vs default" bootstraps the per-task
differences method - default paired within each seed. Signal fraction: the mean over RL steps of
the share of GRPO groups whose rewards differ (the teacher's term also trains the others).
Seconds: the RL stage plus the val evaluation. Results go to `--out` (JSON).

The `distill` method's teacher is the same base model reading the incumbent harness plus
`--teacher-demos` extra demos built from the first train tasks and their reference answers in
the harness's answer format (a richer context than the student's), or the demos of
`--teacher-demos-file` (bench/data/teacher-demos-arithmetic.json: the demos the gate accepted
in the co-evolution bench's harness-only runs), weight 0.1, faded by the reward gap, the
teacher measured every 2 steps. Rows keep each step's teacher weight and teacher / student
reward.

    python bench/methods.py [--config training/bench/arithmetic.yaml] [--seeds 2]
        [--methods default,gigpo,progress,tempered,distill] [--model SPEC] [--small]
        [--set KEY=VALUE ...] [--first-seed N]
    python bench/methods.py --report A/methods.json [B/methods.json ...]

The step-level `gigpo` estimator needs multi-turn episodes whose turns start from repeated
observations: its row comes from `--config training/bench/bfcl-multi.yaml --methods gigpo`
(on single-turn arithmetic its anchor groups are the episode groups).

`--small`: 1 seed, 2 RL steps of 1 task x G 2, 3 val tasks, 16 new tokens, the teacher's
weight constant: checks the pipeline, not the numbers (with `--model hf:DIR` on a tiny random
model: 14 s of CPU; 3.3 min wall on the shared 2-core machine at load average 9-10).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from coevolution_report import cluster_bootstrap  # noqa: E402

DEFAULT = "default"


def methods(teacher_demos: list[dict], small: bool = False) -> dict[str, dict[str, Any]]:
    """name -> {"train": rl.train overrides, "stage": rl.stage overrides}. `small`: the
    teacher's weight constant, so the smoke run exercises the teacher pass whatever the
    rewards (the gap schedule turns it off when neither side ever succeeds)."""
    schedule = {"kind": "constant"} if small else {"every": 2}
    return {
        DEFAULT: {},
        "gigpo": {"train": {"estimator": "gigpo"}},
        "progress": {"train": {"estimator": "progress"}},
        "tempered": {"stage": {"temperature": "tempered"}},
        "distill": {"train": {"teacher": {"kind": "distill", "demos": teacher_demos,
                                          "weight": 0.1, "schedule": schedule}}},
        # DARS-style predicates: the number-format credit pays only when the answer line is
        # there (on the reasoning rubric; a rubric without those criteria is left as it is).
        "predicates": {"requires": {"numeric_answer": ["answer_line"]}},
    }


def with_requires(rubric: Any, requires: dict[str, list[str]]) -> Any:
    """`rubric` with prerequisites added to the criteria named in `requires` that it has."""
    ids = {c.id for c in rubric.criteria}
    req = {k: v for k, v in requires.items() if k in ids and set(v) <= ids}
    if not req:
        return rubric
    return rubric.child(criteria=[{**c.model_dump(), "requires": req.get(c.id, list(c.requires))}
                                  for c in rubric.criteria])


def answer_demos(env: Any, harness: Any, k: int) -> list[dict]:
    """k demos from the first train tasks with reference answers, in the answer format the
    harness asks for ("Answer: <x>" for the reasoning harness)."""
    fmt = "Answer: {}" if "Answer:" in (harness.answer_format or "") else "{}"
    out = []
    for t in env.tasks("train"):
        if len(out) == k:
            break
        if t.answer is not None and t.messages:
            out.append({"source": f"train task {t.id}", "messages": [
                *[dict(m) for m in t.messages], {"role": "assistant", "content": fmt.format(t.answer)}]})
    return out


def demos_file(path: Path) -> list[dict]:
    """Harness demos ({"messages": [...], "source": ...}) from a JSON file, checked as the
    harness schema checks them; a bad file is one line naming it."""
    from coevo.errors import CoevoError
    from coevo.assets.harness import Demo

    try:
        items = json.loads(path.read_text())
        return [Demo.model_validate(d).model_dump(mode="json") for d in items]
    except (OSError, ValueError, TypeError) as exc:
        errs = exc.errors() if hasattr(exc, "errors") else None  # pydantic: the first field
        why = (f"{'.'.join(map(str, errs[0]['loc'])) or 'demo'}: {errs[0]['msg']}" if errs
               else str(exc).splitlines()[0])
        raise CoevoError(f"--teacher-demos-file {path}: {why}") from None


def run_method(name: str, over: dict[str, Any], cfg: Any, seed: int, store: Any,
               ckpt_root: Path, max_new_tokens: int | None = None) -> dict[str, Any]:
    """One RL stage of `cfg` with the method's overrides, then the val evaluation
    (`max_new_tokens`: the harness's cap replaced, for the smoke run)."""
    from coevo.envs.registry import make_env
    from coevo.evaluate import evaluate
    from coevo.loop import seed_incumbent
    from coevo.models.registry import load_backend
    from coevo.rl.config import TrainConfig
    from coevo.rl.stage import StageConfig, live_policy, rl_stage
    from coevo.rl.trainer import Trainer

    t0 = time.perf_counter()
    train = TrainConfig.from_mapping({**cfg.rl.train.model_dump(), **over.get("train", {}),
                                      "seed": seed}, f"method {name}: rl.train")
    stage = StageConfig.model_validate({**cfg.rl.stage.model_dump(), **over.get("stage", {}),
                                        "seed": seed, "checkpoint_dir": str(ckpt_root / f"{name}-s{seed}")})
    backend = load_backend(cfg.model.backend, **cfg.model.options)
    trainer = Trainer(backend.model, train, base_model=cfg.model.backend, tokenizer=backend.tokenizer)
    env = make_env(cfg.env)
    assets = seed_incumbent(cfg, store).agent_assets()
    if over.get("requires"):
        rubric = with_requires(assets.rubric, over["requires"])
        store.put_asset(rubric)  # stored like any version the trajectories name
        assets = assets.model_copy(update={"rubric": rubric})
    if max_new_tokens is not None:
        h = assets.harness
        assets = assets.model_copy(update={"harness": h.child(decoding={
            **h.decoding.model_dump(), "max_new_tokens": max_new_tokens})})
    run = store.create_run(f"{name}-s{seed}-{time.time_ns()}", mode="weight-only")
    store.start_round(run.id, 0)
    steps: list[Any] = []
    res = rl_stage(store, run.id, 0, env, assets, trainer, stage, tokenizer=backend.tokenizer,
                   on_step=steps.append)
    policy = live_policy(trainer, backend.tokenizer)
    policy.adapter = store.get_checkpoint(res.checkpoint).path  # already in memory
    val = evaluate(store, env, assets, policy, tasks=env.tasks("val", cfg.splits.val_n),
                   split="val", samples=1, seed=cfg.seed, checkpoint=res.checkpoint, run=run.id)
    return {"method": name, "seed": seed, "val": val.mean,
            "tasks": {t.task_id: t.outcome for t in val.tasks if t.outcome is not None},
            "rewards": {t.task_id: t.reward for t in val.tasks if t.reward is not None},
            "signal": sum(s.signal_fraction for s in steps) / len(steps) if steps else None,
            "teacher_weight": [s.teacher_weight for s in steps],
            "teacher_reward": [s.teacher_reward for s in steps],
            "reward": [s.reward_mean for s in steps],
            "seconds": time.perf_counter() - t0}


def table(rows: list[dict[str, Any]], names: list[str], metric: str = "outcome") -> list[str]:
    """One line per method: val [CI], paired diff vs default [CI], signal fraction, seconds.
    `metric`: the per-task outcome, or the rubric reward ("reward": partial credit included)."""
    f = lambda x, s="": "-" if x is None else f"{x:{s}.3f}"  # noqa: E731
    col = "rewards" if metric == "reward" else "tasks"
    rows = [{**r, "tasks": r.get(col, {})} for r in rows]
    base = {r["seed"]: r["tasks"] for r in rows if r["method"] == DEFAULT}
    lines = [f"{'method':10} {'val [95%]':>24} {'vs default [95%]':>26} {'signal':>7} {'seconds':>8}"]
    for name in names:
        mine = [r for r in rows if r["method"] == name]
        if not mine:
            continue
        m, lo, hi = cluster_bootstrap([list(r["tasks"].values()) for r in mine])
        diffs = [[v - base[r["seed"]][t] for t, v in r["tasks"].items() if t in base.get(r["seed"], {})]
                 for r in mine]
        d, dlo, dhi = cluster_bootstrap(diffs) if name != DEFAULT else (None, None, None)
        sig = [r["signal"] for r in mine if r["signal"] is not None]
        secs = sum(r["seconds"] for r in mine) / len(mine)
        lines.append(f"{name:10} {f(m):>7} [{f(lo)}, {f(hi)}] "
                     f"{f(d, '+'):>8} [{f(dlo, '+')}, {f(dhi, '+')}] "
                     f"{f(sum(sig) / len(sig) if sig else None):>7} {secs:8.0f}")
    return lines


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "training" / "bench" / "arithmetic.yaml"))
    ap.add_argument("--seeds", type=int, default=None, help="default 2; small 1")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds first-seed .. first-seed + seeds - 1 (add seeds to a run's data)")
    ap.add_argument("--methods", default=None, help="comma list (default: all)")
    ap.add_argument("--model", default=None, help="policy backend spec (default: the config's)")
    ap.add_argument("--teacher-demos", type=int, default=3)
    ap.add_argument("--teacher-demos-file", type=Path, default=None, metavar="JSON",
                    help="the teacher's extra demos from this file (a list of harness demos) "
                    "instead of --teacher-demos reference answers")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override, as `coevo run` takes them (repeatable)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--without-default", action="store_true",
                    help="do not add the default row (its rows are in another run's data, "
                    "same config and seeds: combine them with --report)")
    ap.add_argument("--report", type=Path, nargs="+", default=None, metavar="JSON",
                    help="print the table from saved methods.json files (run nothing)")
    ap.add_argument("--metric", choices=("outcome", "reward"), default="outcome",
                    help="the table's per-task value: the verified outcome (default) or the "
                    "rubric reward (partial credit included; rows saved with it)")
    a = ap.parse_args(argv)
    if a.report:
        rows = [r for f in a.report for r in json.loads(f.read_text())]
        names = list(dict.fromkeys([DEFAULT, *(r["method"] for r in rows)]))
        print("\n".join(table(rows, names, a.metric)))
        return rows

    from coevo.config import RunConfig
    from coevo.envs.registry import make_env
    from coevo.errors import CoevoError
    from coevo.store import Store

    over = [f"model.backend={a.model}"] if a.model else []
    if a.small:
        over += ["rl.stage.steps=2", "rl.stage.tasks_per_step=1", "rl.stage.samples=2",
                 "rl.stage.checkpoint_every=2", "splits.val_n=3"]
    cfg = RunConfig.load(a.config, over + a.sets)
    env = make_env(cfg.env)
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-methods-"))
    out.mkdir(parents=True, exist_ok=True)
    store = Store.open(f"sqlite:///{out / 'methods.db'}")
    from coevo.loop import seed_incumbent

    harness = seed_incumbent(cfg, store).harness
    demos = (demos_file(a.teacher_demos_file) if a.teacher_demos_file
             else answer_demos(env, harness, a.teacher_demos))
    table_of = methods(demos, a.small)
    names = (a.methods or ",".join(table_of)).split(",")
    unknown = [n for n in names if n not in table_of]
    if unknown:
        raise CoevoError(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(table_of)}")
    if DEFAULT not in names and not a.without_default:
        names = [DEFAULT, *names]  # every row is compared with it
    rows = []
    for seed in range(a.first_seed, a.first_seed + (a.seeds or (1 if a.small else 2))):
        for name in names:
            row = run_method(name, table_of[name], cfg, seed, store, out / "checkpoints",
                             max_new_tokens=16 if a.small else None)
            rows.append(row)
            (out / "methods.json").write_text(json.dumps(rows, indent=1))  # each row kept
            print(f"{name} seed {seed}: val {row['val']}, signal {row['signal']}, "
                  f"{row['seconds']:.0f} s", flush=True)
    print(f"\n{cfg.env}: {len(rows) // len(names)} seed(s) x {len(names)} methods, "
          f"{cfg.rl.stage.steps} RL steps x {cfg.rl.stage.tasks_per_step} tasks x G "
          f"{cfg.rl.stage.samples}, val n={cfg.splits.val_n}; data {out / 'methods.json'}")
    print("\n".join(table(rows, names, a.metric)))
    return rows


if __name__ == "__main__":
    main()
