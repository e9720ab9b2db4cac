"""Cost of grammar-constrained decoding in the hf backend on the embedded model, as ratios.

Prompts: BFCL simple_python tasks rendered by the seed `function_calling` harness (~500 prompt
tokens). Modes, each at batch 1 (one request per call) and batch 8 (one call):
- `none`: unconstrained sampling (the harness's temperature / top-k / top-p);
- `mask`: a grammar that allows almost every token and cannot end before `--tokens` tokens
  (`(?s).{400,}`): the engine computes and applies a full-vocabulary mask at every step, and
  every row decodes exactly `--tokens` tokens: the pure per-step overhead;
- `tool_calls`: the real per-task BFCL call grammar (rows stop when their call is complete).

Decode throughput excludes the prefill, timed separately with one new token per row (the same
for every mode), so `mask / none` is the constrained per-token cost. Target: <= 1.15x.
Repeats are interleaved (none, mask, tool_calls, none, ...) and the median is reported, so a
load change on a shared machine hits every mode alike.

    python bench/constrained.py [--tokens 48] [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from coevo.agent.episode import build_messages
    from coevo.assets.io import load_asset
    from coevo.envs.bfcl import BFCLEnv
    from coevo.models.base import Request, Sampling
    from coevo.models.constrain import Constraint
    from coevo.models.embedded import load_embedded

    torch.set_num_threads(args.threads)
    backend = load_embedded()
    seed_h = load_asset(ROOT / "harnesses" / "function_calling.yaml")
    cons_h = load_asset(ROOT / "harnesses" / "function_calling_constrained.yaml")
    tasks = BFCLEnv("simple_python").tasks("train", 8)
    every = Constraint.of_regex(r"(?s).{400,}")

    def requests(mode: str, n_tokens: int) -> list[Request]:
        out = []
        for i, t in enumerate(tasks):
            c = {"none": None, "mask": every, "tool_calls": cons_h.constraint(t.tools)}[mode]
            s = Sampling(**seed_h.decoding.model_dump(exclude={"constrain", "max_new_tokens"}),
                         max_new_tokens=n_tokens, seed=i)
            out.append(Request(messages=build_messages(seed_h, t, []), sampling=s, constraint=c))
        return out

    def timed(reqs: list[Request], batch: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        toks = 0
        for k in range(0, len(reqs), batch):
            for group in backend.generate(reqs[k: k + batch]):
                toks += sum(len(c.token_ids) for c in group)
        return time.perf_counter() - t0, toks

    backend.generate(requests("mask", 4)[:2])  # warm-up: grammar engine, tokenizer view
    modes = ("none", "mask", "tool_calls")
    print(f"embedded model, {len(tasks)} BFCL prompts, up to {args.tokens} new tokens, "
          f"{args.threads} threads, {args.reps} interleaved repeats (median)")
    print("| batch | mode | tokens/row | decode tok/s | x none (per token) | wall s |")
    print("|---|---|---|---|---|---|")
    for batch in (1, 8):
        prefill = statistics.median(timed(requests("none", 1), batch)[0] for _ in range(args.reps))
        runs: dict[str, list[tuple[float, int]]] = {m: [] for m in modes}
        for _ in range(args.reps):
            for m in modes:
                runs[m].append(timed(requests(m, args.tokens), batch))
        speed = {}
        for m in modes:
            wall = statistics.median(r[0] for r in runs[m])
            toks = statistics.median(r[1] for r in runs[m])
            decode = max(wall - prefill, 1e-9)
            speed[m] = (toks - len(tasks)) / decode  # the first token came with the prefill
            ratio = speed["none"] / speed[m]
            print(f"| {batch} | {m} | {toks / len(tasks):.1f} | {speed[m]:.1f} | {ratio:.3f} | "
                  f"{wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
