"""Invalid-proposal rate of the LLM proposers on the embedded model, unconstrained vs
constrained to the signature's JSON Schema, over the same recorded round contexts.

Step 1 (`--collect`, once): real round contexts. For each environment (reasoning-gym
arithmetic under the `reasoning` seed harness, BFCL simple_python under `function_calling`)
and context seed, the embedded model rolls out 4 train tasks x 4 samples at the harness's
sampling settings, scored by the environment and the seed rubric, as an RL stage would. The
trajectories (token ids dropped: proposers read messages) are saved to
bench/data/proposer_contexts.json, so every later measurement reads the same digests.

Step 2 (default): every LLM proposer (`harness`, `skills`, `rubrics`; `edits` on request)
proposes on every context twice, with `json_schema: false` and `true` (the only difference),
on the embedded model with the co-evolution bench's settings (320 new tokens). A candidate is
invalid when the proposer could not build a revision: output that does not parse or fit the
signature, or a revision its own checks refuse (whitelist, bounds, schema); rows measured
since `edits` was added also count what the loop's `check_candidate` would refuse
(`refused`). Printed: invalid / all with a 95% Wilson interval per proposer and mode, and the
errors; saved to bench/data/proposer_validity.json, where a run adds its rows to the ones
already there (a proposer and mode already measured on a context is not measured again).

    python bench/proposer_validity.py --collect [--contexts 3]
    python bench/proposer_validity.py [--proposers harness,skills,rubrics] [--max-tokens 320]
    python bench/proposer_validity.py --proposers edits --modes constrained
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bfcl_harnesses import wilson  # noqa: E402

ENVS = {
    "arithmetic": ("rg:basic_arithmetic?min_terms=2&max_terms=2&max_digits=1"
                   "&allow_negation=false&allow_parentheses=false", "reasoning", "reasoning"),
    "bfcl": ("bfcl:simple_python", "function_calling", "function_calling"),
}
DATA = ROOT / "bench" / "data"
OUT = DATA / "proposer_validity.json"
PARTIAL = DATA / "proposer_validity.partial.jsonl"  # rows so far (removed once the run ends)


def seeds() -> dict:
    from coevo.assets.io import load_seed_dir

    out: dict = {}
    for a in load_seed_dir(ROOT):
        out.setdefault(a.kind, {})[a.name] = a
    return out


def incumbent(env_key: str):
    from coevo.propose.base import Incumbent

    s = seeds()
    _, harness, rubric = ENVS[env_key]
    lib = s["skill_library"]["seed"]
    members = [sk for sk in s.get("skill", {}).values()]
    return Incumbent(harness=s["harness"][harness], library=lib, skills=members,
                     rubric=s["rubric"][rubric])


def collect(n_contexts: int) -> None:
    from coevo.agent.episode import run_episodes_sync
    from coevo.envs.registry import make_env
    from coevo.models.registry import load_backend

    backend = load_backend("embedded")
    contexts = []
    for env_key, (spec, _, _) in ENVS.items():
        env = make_env(spec)
        inc = incumbent(env_key)
        pool = env.tasks("train")
        for c in range(n_contexts):
            tasks = pool[4 * c: 4 * c + 4]
            trajs = run_episodes_sync(env, tasks, inc.harness, skills=inc.skills,
                                      library=inc.library, rubric=inc.rubric, backend=backend,
                                      samples=4, seeds=1000 + c, split="train")
            slim = [t.model_copy(update={"token_ids": [], "loss_mask": [], "logprobs": []})
                    .model_dump(mode="json") for t in trajs]
            contexts.append({"env": env_key, "seed": c, "trajectories": slim})
            print(f"{env_key} context {c}: {sum(t.success for t in trajs)}/{len(trajs)} "
                  "successes", flush=True)
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "proposer_contexts.json").write_text(json.dumps(contexts))


def measure(proposers: list[str], max_tokens: int,
            modes: tuple[bool, ...] = (False, True)) -> dict:
    from coevo.models.registry import load_backend
    from coevo.propose import make_proposer
    from coevo.propose.base import ProposalContext, check_candidate
    from coevo.trajectory import Trajectory

    contexts = json.loads((DATA / "proposer_contexts.json").read_text())
    backend = load_backend("embedded")
    # Rows are appended as they are measured, so a stopped run resumes where it stopped; the
    # saved rows of earlier runs are kept.
    rows = json.loads(OUT.read_text())["rows"] if OUT.exists() else []
    rows += [json.loads(x) for x in PARTIAL.read_text().splitlines()] if PARTIAL.exists() else []
    done = {(r["env"], r["context"], r["proposer"], r["constrained"]) for r in rows}
    for ctx_data in contexts:
        inc = incumbent(ctx_data["env"])
        trajs = [Trajectory.model_validate(t) for t in ctx_data["trajectories"]]
        ctx = ProposalContext(run="bench", round=0, incumbent=inc, trajectories=trajs,
                              harnesses={inc.harness.hash: inc.harness}, seed=ctx_data["seed"])
        for name in proposers:
            for constrained in modes:
                if (ctx_data["env"], ctx_data["seed"], name, constrained) in done:
                    continue
                model = {"backend": "embedded", "max_tokens": max_tokens,
                         "json_schema": constrained}
                p = make_proposer(name, model=model, backend=backend)
                t0 = time.perf_counter()
                cands = p.propose(ctx)
                secs = time.perf_counter() - t0
                new = [{"env": ctx_data["env"], "context": ctx_data["seed"],
                        "proposer": name, "constrained": constrained,
                        "invalid": c.asset is None, "error": c.error,
                        "refused": check_candidate(c, inc) if c.asset is not None else None,
                        "raw": c.raw_output[:400], "seconds": secs / max(len(cands), 1),
                        "kind": c.kind, "edits": c.edits}
                       for c in cands]
                rows += new
                with PARTIAL.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in new)
                errors = "; ".join((c.error or "")[:160] for c in cands if c.asset is None)
                print(f"{ctx_data['env']}#{ctx_data['seed']} {name} constrained={constrained}: "
                      f"{sum(c.asset is None for c in cands)}/{len(cands)} invalid "
                      f"({secs:.0f} s){': ' + errors if errors else ''}", flush=True)
    return {"max_tokens": max_tokens, "rows": rows}


def report(data: dict) -> str:
    lines = ["| proposer | decoding | candidates | invalid [95% Wilson] | most frequent errors |",
             "|---|---|---|---|---|"]
    groups: dict = collections.defaultdict(list)
    for r in data["rows"]:
        groups[(r["proposer"], r["constrained"])].append(r)
    for (name, constrained), rs in sorted(groups.items()):
        k, n = sum(bool(r["invalid"] or r.get("refused")) for r in rs), len(rs)
        lo, hi = wilson(k, n)
        errs = collections.Counter((r["error"] or r.get("refused") or "")[:70] for r in rs
                                   if r["invalid"] or r.get("refused"))
        top = "; ".join(f"{e} ({c})" for e, c in errs.most_common(2)) or "-"
        lines.append(f"| {name} | {'constrained' if constrained else 'free'} | {n} | "
                     f"{k}/{n} = {k / n:.2f} [{lo:.2f}, {hi:.2f}] | {top} |")
    return "\n".join(lines)


def edits_report(data: dict) -> str:
    """What the `edits` proposer's valid candidates did: operations chosen, skipped, per env."""
    rows = [r for r in data["rows"] if r["proposer"] == "edits" and not r["invalid"]]
    if not rows:
        return ""
    ops = collections.Counter((r["env"], e["kind"]) for r in rows for e in r.get("edits") or [])
    skipped = sum(bool(e.get("skipped")) for r in rows for e in r.get("edits") or [])
    return ("edits chosen by valid candidates (env, operation: count): " + "; ".join(
        f"{env} {kind}: {c}" for (env, kind), c in sorted(ops.items()))
        + f"; skipped within a valid candidate: {skipped}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collect", action="store_true")
    ap.add_argument("--contexts", type=int, default=3)
    ap.add_argument("--proposers", default="harness,skills,rubrics")
    ap.add_argument("--max-tokens", type=int, default=320)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--modes", default="free,constrained",
                    help="decoding modes to measure, in this order (free, constrained)")
    args = ap.parse_args()
    out = OUT
    if args.collect:
        collect(args.contexts)
        return
    if not args.report_only:
        modes = tuple({"free": False, "constrained": True}[m] for m in args.modes.split(","))
        data = measure(args.proposers.split(","), args.max_tokens, modes)
        out.write_text(json.dumps(data, indent=1))
        PARTIAL.unlink(missing_ok=True)
    if args.report_only and PARTIAL.exists():  # a run still going, or stopped: what it has
        rows = [json.loads(x) for x in PARTIAL.read_text().splitlines()]
        print(f"(partial: {len(rows)} candidates measured so far)")
        print(report({"rows": rows}))
        return
    print(report(json.loads(out.read_text())))
    print(edits_report(json.loads(out.read_text())))


if __name__ == "__main__":
    main()
