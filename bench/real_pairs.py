"""Collect REAL paired outcomes for bench/gate_efficiency.py: the embedded model on a val split
under the seed harness and under a few revisions of it, full evaluation, same tasks and seeds.

Revisions (the kinds a proposer makes; none is hand-tuned to win):
  null         description changed only: the model sees exactly the same prompt
  no-demo      the worked example removed
  terse        answer format reduced to "Reply with the answer only: Answer: <number>"
  two-demos    a second worked example (addition) next to the first
  cold         sampling temperature 0.7 -> 0.2

    python bench/real_pairs.py [--env ENV] [--n 100] [--out bench/out/real_pairs.json]
    python bench/gate_efficiency.py --real bench/out/real_pairs.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coevo.assets.io import load_seed_dir  # noqa: E402
from coevo.evaluate import evaluate  # noqa: E402
from coevo.executors import AgentAssets  # noqa: E402
from coevo.store import Store  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EASY = ("rg:basic_arithmetic?min_terms=2&max_terms=2&max_digits=1&allow_negation=false"
        "&allow_parentheses=false")


def variants(h):
    demo2 = {"messages": [{"role": "user", "content": "What is 8 + 5?"},
                          {"role": "assistant", "content": "8 + 5 = 13\nAnswer: 13"}],
             "source": "handwritten"}
    return {
        "null": h.child(description=h.description + " (reviewed)"),
        "no-demo": h.child(demos=[]),
        "terse": h.child(answer_format="Reply with the answer only:\nAnswer: <number>"),
        "two-demos": h.child(demos=[*h.demos, h.demos[0].model_validate(demo2)]),
        "cold": h.child(decoding=h.decoding.model_copy(update={"temperature": 0.2})),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default=EASY)
    ap.add_argument("--harness", default="reasoning")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "real_pairs.json")
    args = ap.parse_args(argv)
    from coevo.envs.registry import make_env
    from coevo.models.registry import load_backend

    store = Store.open(f"sqlite:///{tempfile.mkdtemp()}/pairs.db")
    seeds = {a.name: a for a in load_seed_dir(ROOT) if a.kind == "harness"}
    base = seeds[args.harness]
    env = make_env(args.env)
    tasks = list(env.tasks("val", args.n))
    backend = load_backend("embedded")
    t0 = time.time()
    arms = {"seed": base, **variants(base)}
    scores: dict[str, dict[str, float | None]] = {}
    for name, h in arms.items():
        # One sample per task with the gate's per-task seed, as compare() would draw it.
        res = evaluate(store, env, AgentAssets(harness=h), backend, tasks=tasks, split="val",
                       seed=0)
        scores[name] = {t.task_id: t.outcome for t in res.tasks}
        print(f"{name:10} {res.line()}  ({time.time() - t0:.0f} s)", flush=True)
    comps = []
    for name in arms:
        if name == "seed":
            continue
        pairs = [{"task_id": t.id, "sample": 0, "incumbent": scores["seed"][t.id],
                  "candidate": scores[name][t.id],
                  "status": "ok" if None not in (scores["seed"][t.id], scores[name][t.id]) else "dropped"}
                 for t in tasks]
        comps.append({"name": name, "pairs": pairs})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"env": args.env, "n": len(tasks), "comparisons": comps}, indent=1))
    print(f"wrote {args.out} ({len(comps)} comparisons x {len(tasks)} tasks, {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
