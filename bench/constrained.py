"""Cost of grammar-constrained decoding in the hf backend on the embedded model, as ratios.

Prompts: BFCL simple_python tasks rendered by the seed `function_calling` harness (~500 prompt
tokens). Modes, each at batch 1 (one request per call) and batch 8 (one call):
- `none`: unconstrained sampling (the harness's temperature / top-k / top-p), on a backend
  that ignores EOS, so every row decodes exactly `--tokens` tokens;
- `mask`: the same, constrained by a grammar that allows almost every token and cannot end
  before `--tokens` tokens (`(?s).{400,}`): the engine computes and applies a full-vocabulary
  mask at every step. Same rows, same lengths: `mask / none` is the pure per-token overhead of
  constrained decoding. Target: <= 1.15x.
- `tool_calls` vs `seed`: the real per-task BFCL call grammar vs the seed harness unconstrained
  (normal EOS): wall time per row end to end, where the grammar also ends rows earlier.

Decode throughput excludes the prefill, timed separately with one new token per row.
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
    from coevo.models.hf import HFBackend

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

    endless = HFBackend(backend.model, backend.tokenizer, name="no-eos")
    endless._eos = set()  # rows run to max_new_tokens: equal work in `none` and `mask`

    def timed(reqs: list[Request], batch: int, b=None) -> tuple[float, int]:
        b = b or backend
        t0 = time.perf_counter()
        toks = 0
        for k in range(0, len(reqs), batch):
            for group in b.generate(reqs[k: k + batch]):
                toks += sum(len(c.token_ids) for c in group)
        return time.perf_counter() - t0, toks

    backend.generate(requests("mask", 4)[:2])  # warm-up: grammar engine, tokenizer view
    print(f"embedded model, {len(tasks)} BFCL prompts, {args.tokens} new tokens, "
          f"{args.threads} threads, {args.reps} interleaved repeats (median)")
    print("| batch | mode | tokens/row | decode tok/s | per-token time x none | wall s |")
    print("|---|---|---|---|---|---|")
    for batch in (1, 8):
        prefill = statistics.median(timed(requests("none", 1), batch, endless)[0]
                                    for _ in range(args.reps))
        runs: dict[str, list[tuple[float, int]]] = {m: [] for m in ("none", "mask", "seed",
                                                                     "tool_calls")}
        for _ in range(args.reps):
            runs["none"].append(timed(requests("none", args.tokens), batch, endless))
            runs["mask"].append(timed(requests("mask", args.tokens), batch, endless))
            runs["seed"].append(timed(requests("none", args.tokens), batch))
            runs["tool_calls"].append(timed(requests("tool_calls", args.tokens), batch))
        speed = {}
        for m, rs in runs.items():
            wall = statistics.median(r[0] for r in rs)
            toks = statistics.median(r[1] for r in rs)
            speed[m] = (toks - len(tasks)) / max(wall - prefill, 1e-9)
            ref = "none" if m in ("none", "mask") else "seed"
            print(f"| {batch} | {m} | {toks / len(tasks):.1f} | {speed[m]:.1f} | "
                  f"{speed[ref] / speed[m]:.3f} (vs {ref}) | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
