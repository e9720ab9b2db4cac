"""BFCL accuracy of harness variants on the embedded model: seed vs constrained decoding.

For each category x split x harness x decoding (greedy, and the harness's own sampling
settings with one seeded sample per task), every task of the split is run once through coevo's
runtime on the embedded SmolLM2-135M (or `--model`), and scored by BFCL's own AST checker.
Reported per cell: accuracy with a 95% Wilson interval over tasks, BFCL-strict accuracy
(the same outputs decoded by BFCL's own `default_decode_ast_prompting`, which rejects text
around the call list), decode rate, right-function-name rate, and the most frequent checker
errors. Per-task outcomes go to a JSON file (default bench/data/bfcl_harnesses.json), so the
table can be rebuilt (`--report-only`) and paired comparisons made from it.

    python bench/bfcl_harnesses.py [--categories simple_python,multiple] [--splits val,test]
        [--harnesses function_calling,function_calling_constrained[:copy]] [--decodings greedy,sampled]
        [--n N] [--model embedded] [--skills none|seed] [--out bench/data/bfcl_harnesses.json]
        [--report-only]

`--skills seed` shows the model the seed skill library (skills/, chosen per task as the
harness's `skills` section says), as a `coevo run` whose config names `skill_library: seed`
does (the co-evolution bench's configs); its cells are keyed `<harness>+skills`. Without it
the agent is the harness alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def bfcl_strict(text: str, functions: list, answer: list, category: str) -> bool:
    """The output decoded exactly as BFCL decodes prompting models, then BFCL's checker."""
    from bfcl_eval.model_handler.utils import default_decode_ast_prompting

    from coevo.envs.bfcl import CHECKER_MODEL, bfcl_modules, language_of

    m = bfcl_modules()
    try:
        decoded = default_decode_ast_prompting(text)
    except Exception:  # noqa: BLE001 - any decoder failure is BFCL's "decoder failed"
        return False
    if not m.utils.is_function_calling_format_output(decoded):
        return False
    try:
        res = m.ast_checker(functions, decoded, answer, m.Language(language_of(category)),
                            category, CHECKER_MODEL)
    except Exception:  # noqa: BLE001
        return False
    return bool(res.get("valid"))


def seed_skills() -> tuple[list, object]:
    """The skills of the seed folder and the `seed` library holding them (load_seed_dir)."""
    from coevo.assets.io import load_seed_dir

    assets = load_seed_dir(ROOT)
    return ([a for a in assets if a.kind == "skill"],
            next(a for a in assets if a.kind == "skill_library"))


def run_cell(env, tasks, harness, backend, decoding: str, category: str,
             skills: tuple[list, object] = ([], None)) -> list[dict]:
    from coevo.agent.episode import run_episodes_sync
    from coevo.envs.base import Response

    if decoding == "greedy":
        harness = harness.model_copy(update={"decoding": harness.decoding.model_copy(
            update={"temperature": 0.0})})
    trajs = run_episodes_sync(env, tasks, harness, backend=backend, samples=1, seeds=0,
                              split="eval", skills=skills[0], library=skills[1])
    rows = []
    for task, t in zip(tasks, trajs):
        if t.status != "ok":
            rows.append({"task": task.id, "status": t.status, "error": t.error})
            continue
        turn = t.turns[-1]
        score = env.score(task, None, Response(text=turn.text, tool_calls=turn.tool_calls,
                                               parse_error=turn.parse_error))
        err = score.info.get("error_type") or (None if score.success else "other")
        rows.append({
            "task": task.id, "status": "ok", "outcome": score.outcome,
            "strict": float(bfcl_strict(turn.text, task.metadata["functions"], task.answer,
                                        category)),
            "decodes": score.details.get("decodes", 0.0),
            "name_correct": score.details.get("name_correct", 0.0),
            "error_type": err, "text": turn.text[:300], "tokens": turn.end - turn.start,
        })
    return rows


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    n = len(ok)
    k = int(sum(r["outcome"] for r in ok))
    ks = int(sum(r["strict"] for r in ok))
    lo, hi = wilson(k, n)
    errors = collections.Counter(r["error_type"] for r in ok if r["error_type"])
    return {"n": n, "infra": len(rows) - n, "acc": k / n if n else math.nan, "lo": lo, "hi": hi,
            "strict": ks / n if n else math.nan,
            "decodes": sum(r["decodes"] for r in ok) / n if n else math.nan,
            "name": sum(r["name_correct"] for r in ok) / n if n else math.nan,
            "tokens": sum(r["tokens"] for r in ok) / n if n else math.nan,
            "errors": errors.most_common(3)}


def table(data: dict) -> str:
    lines = ["| category | split | harness | decoding | n | accuracy [95% Wilson] | BFCL-strict "
             "| decodes | right name | mean tokens | top checker errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, cell in data["cells"].items():
        cat, split, harness, decoding = key.split("|")
        s = summarize(cell["rows"])
        errs = "; ".join(f"{e} ({c})" for e, c in s["errors"]) or "-"
        lines.append(
            f"| {cat} | {split} | {harness} | {decoding} | {s['n']} | {s['acc']:.3f} "
            f"[{s['lo']:.3f}, {s['hi']:.3f}] | {s['strict']:.3f} | {s['decodes']:.2f} | "
            f"{s['name']:.2f} | {s['tokens']:.1f} | {errs} |")
    return "\n".join(lines)


def load_harness(name: str):
    """harnesses/<name>.yaml; `<name>:copy` is that harness with
    `decoding.constrain.strings: copy` (string arguments copied from the question)."""
    from coevo.assets.io import load_asset

    base, _, variant = name.partition(":")
    harness = load_asset(ROOT / "harnesses" / f"{base}.yaml")
    if variant == "copy":
        d = harness.decoding
        return harness.child(decoding=d.model_copy(update={
            "constrain": d.constrain.model_copy(update={"strings": "copy"})}))
    if variant:
        raise SystemExit(f"--harnesses: unknown variant {variant!r} of {base} (known: copy)")
    return harness


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--categories", default="simple_python,multiple")
    ap.add_argument("--splits", default="val,test")
    ap.add_argument("--harnesses", default="function_calling,function_calling_constrained")
    ap.add_argument("--decodings", default="greedy,sampled")
    ap.add_argument("--n", type=int, default=None, help="tasks per split (default: all)")
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--skills", choices=["none", "seed"], default="none",
                    help="show the seed skill library (skills/) as coevo run does")
    ap.add_argument("--out", default=str(ROOT / "bench" / "data" / "bfcl_harnesses.json"))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {"cells": {}}
    if not args.report_only:
        import torch

        from coevo.envs.bfcl import BFCLEnv
        from coevo.models.registry import load_backend

        torch.manual_seed(0)
        backend = load_backend(args.model)
        skills = seed_skills() if args.skills == "seed" else ([], None)
        suffix = "+skills" if args.skills == "seed" else ""
        for cat in args.categories.split(","):
            env = BFCLEnv(cat)
            for split in args.splits.split(","):
                tasks = env.tasks(split, args.n)
                for name in args.harnesses.split(","):
                    harness = load_harness(name)
                    for decoding in args.decodings.split(","):
                        key = f"{cat}|{split}|{name}{suffix}|{decoding}"
                        if key in data["cells"] and len(data["cells"][key]["rows"]) == len(tasks):
                            continue  # resumable: finished cells are kept
                        t0 = time.perf_counter()
                        rows = run_cell(env, tasks, harness, backend, decoding, cat, skills)
                        secs = time.perf_counter() - t0
                        data["cells"][key] = {"harness_hash": harness.hash, "model": args.model,
                                              "seconds": secs, "rows": rows}
                        s = summarize(rows)
                        print(f"{key}: acc {s['acc']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}] "
                              f"strict {s['strict']:.3f} decodes {s['decodes']:.2f} "
                              f"({len(tasks)} tasks, {secs:.0f} s)", flush=True)
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_text(json.dumps(data, indent=1))
    print(table(data))


if __name__ == "__main__":
    main()
