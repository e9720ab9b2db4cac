"""GPU check for the vLLM backend (needs a CUDA GPU and `pip install 'coevo[vllm]'`).

1. Makes a LoRA adapter for the model (peft, r=8 on q/v, random B so it changes outputs).
2. Serves it with vLLM's offline engine through `VLLMBackend` (a `LoRARequest`), samples a
   GRPO-shaped batch and prints tokens/s.
3. Scores vLLM's sampled token ids with the HF backend (same adapter, one full forward per
   sample) and prints how far vLLM's logprobs are from HF's: the trainer recomputes these,
   so they must agree for on-policy importance ratios near 1.
4. Switches to a second adapter (new LoRARequest id) and checks the logprobs change.

    python bench/gpu_check.py [--model DIR] [--prompts 16] [--n 4] [--tokens 128]

Exits non-zero if a check fails. Runs float32 in both engines so the comparison measures
the engines, not bf16 rounding.
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


def make_adapter(model_dir: Path, out: Path, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    model.save_pretrained(str(out))
    return out


def hf_logprobs(hf, prompt: list[int], ids: list[int]) -> torch.Tensor:
    seq = torch.tensor([prompt + ids], device=hf.device)
    with torch.inference_mode():
        logits = hf.model(input_ids=seq).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    n = len(prompt)
    picked = torch.tensor(ids, device=hf.device)[:, None]
    return lp[n - 1 : n - 1 + len(ids)].gather(1, picked)[:, 0].cpu()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--tol", type=float, default=0.02, help="max mean |logprob diff|")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: this check needs one")
        return 2

    from coevo.models.hf import HFBackend
    from coevo.models.vllm import VLLMBackend

    if args.model:
        model_dir = Path(args.model)
    else:
        from coevo.models.embedded import embedded_model_dir

        model_dir = embedded_model_dir()
    tmp = Path(tempfile.mkdtemp(prefix="coevo-gpu-"))
    a1 = make_adapter(model_dir, tmp / "a1", seed=1)
    a2 = make_adapter(model_dir, tmp / "a2", seed=2)

    t = time.perf_counter()
    v = VLLMBackend(str(model_dir), adapter=str(a1), dtype="float32", max_lora_rank=8,
                    gpu_memory_utilization=0.5, max_model_len=2048)
    print(f"vLLM engine up in {time.perf_counter() - t:.1f} s")
    reqs = [Request(messages=[{"role": "user",
                               "content": f"Question {i}: name a prime above {10 * i}."}],
                    n=args.n,
                    sampling=Sampling(temperature=1.0, max_new_tokens=args.tokens, seed=i))
            for i in range(args.prompts)]
    v.generate(reqs[:2])  # warm-up: CUDA graphs, LoRA load
    t = time.perf_counter()
    out = v.generate(reqs)
    dt = time.perf_counter() - t
    n_tok = sum(len(c.token_ids) for g in out for c in g)
    errors = [c.error for g in out for c in g if c.finish_reason == "error"]
    print(f"vLLM + LoRA: {args.prompts} prompts x {args.n} samples, {n_tok} tokens "
          f"in {dt:.2f} s = {n_tok / dt:.0f} tok/s; errors: {len(errors)}")
    ok = not errors and all(c.trainable for g in out for c in g)

    hf = HFBackend.from_pretrained(model_dir, adapter=a1, device="cuda", dtype="float32")
    diffs = []
    for g in out:
        for c in g:
            if c.token_ids:
                ref = hf_logprobs(hf, c.prompt_ids, c.token_ids)
                diffs.append((torch.tensor(c.logprobs) - ref).abs())
    alld = torch.cat(diffs)
    print(f"vLLM vs HF logprobs on {alld.numel()} tokens: mean |diff| {alld.mean():.2e}, "
          f"p99 {alld.quantile(0.99):.2e}, max {alld.max():.2e}")
    ok &= bool(alld.mean() < args.tol)

    probe = [Request(prompt_ids=out[0][0].prompt_ids,
                     sampling=Sampling(temperature=0.0, max_new_tokens=16))]
    before = v.generate(probe)[0][0]
    v.load_adapter(a2)
    after = v.generate(probe)[0][0]
    changed = before.logprobs != after.logprobs
    print(f"adapter switch changes outputs: {changed} (lora ids 1 -> {v._lora_ids})")
    ok &= changed
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
