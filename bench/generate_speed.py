"""Embedded-model generation speed with the HF backend, printed as ratios.

Measures: load time from the GGUF (cache rebuilt in a temporary folder) vs from the cache;
tokens/s for one sequence and for a batch of 8; and a GRPO-shaped call (2 prompts x 4 samples)
with the shared prefill on and off.

    python bench/generate_speed.py [--tokens 48] [--threads 2] [--skip-gguf]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from coevo.models.base import Request, Sampling  # noqa: E402
from coevo.models.embedded import embedded_model_dir  # noqa: E402
from coevo.models.hf import HFBackend  # noqa: E402

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a binary search does.",
    "List three uses of a paperclip.",
    "What is the boiling point of water in Fahrenheit?",
    "Describe a cat to someone who has never seen one.",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
]


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def sampled(out) -> int:
    return sum(len(c.token_ids) for group in out for c in group)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-gguf", action="store_true", help="skip the from-GGUF load")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if not args.skip_gguf:
        with tempfile.TemporaryDirectory() as tmp:
            old = os.environ.get("COEVO_CACHE_DIR")
            os.environ["COEVO_CACHE_DIR"] = tmp
            _, first = timed(lambda: HFBackend.from_pretrained(embedded_model_dir(), device="cpu"))
            if old is None:
                del os.environ["COEVO_CACHE_DIR"]
            else:
                os.environ["COEVO_CACHE_DIR"] = old
    path = embedded_model_dir()
    b, cached = timed(lambda: HFBackend.from_pretrained(path, device="cpu"))
    if not args.skip_gguf:
        print(f"load: from GGUF (dequantize + cache) {first:.1f} s, from cache {cached:.1f} s, "
              f"ratio {first / cached:.1f}x")
    else:
        print(f"load from cache: {cached:.1f} s")

    # A fixed length (min tokens via a stop-free prompt; EOS may end some early, so the count
    # is of tokens actually sampled).
    def run(reqs, backend=b):
        return timed(lambda: backend.generate(reqs))

    mk = lambda p, **kw: Request(messages=[{"role": "user", "content": p}],  # noqa: E731
                                 sampling=Sampling(temperature=0.8, top_k=50,
                                                   max_new_tokens=args.tokens, seed=1), **kw)
    run([mk(PROMPTS[0])])  # warm-up (allocator, kernels)
    out1, t1 = run([mk(PROMPTS[0])])
    out8, t8 = run([mk(p) for p in PROMPTS])
    tps1, tps8 = sampled(out1) / t1, sampled(out8) / t8
    print(f"batch 1: {sampled(out1)} tokens in {t1:.2f} s = {tps1:.1f} tok/s")
    print(f"batch 8: {sampled(out8)} tokens in {t8:.2f} s = {tps8:.1f} tok/s "
          f"(ratio {tps8 / tps1:.1f}x)")

    # Reference: transformers' own generate on the same prompt and length, so the ratio holds
    # even on a loaded machine where absolute tok/s are noisy.
    ids = torch.tensor([out1[0][0].prompt_ids])
    n_new = len(out1[0][0].token_ids)
    with torch.inference_mode():
        _, tg = timed(lambda: b.model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new,
                                               do_sample=True, top_k=50, temperature=0.8))
    print(f"transformers generate, batch 1: {n_new / tg:.1f} tok/s "
          f"(coevo loop / generate: {tps1 / (n_new / tg):.2f}x)")

    grpo = [mk(PROMPTS[1] + " " + "Be precise. " * 40, n=4),
            mk(PROMPTS[2] + " " + "Be brief. " * 40, n=4)]
    shared, ts = run(grpo)
    sep = HFBackend(b.model, b.tokenizer, share_prefill=False)
    separate, tn = run(grpo, sep)
    same = all(a.token_ids == c.token_ids for ga, gc in zip(shared, separate)
               for a, c in zip(ga, gc))
    print(f"GRPO call 2 prompts x 4 samples (~{len(shared[0][0].prompt_ids)} prompt tokens): "
          f"shared prefill {ts:.2f} s, separate {tn:.2f} s, ratio {tn / ts:.2f}x, "
          f"identical samples: {same}")


if __name__ == "__main__":
    main()
