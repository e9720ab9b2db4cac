"""GPU check for the HF path: `HFBackend` sampling, constrained decoding and the GRPO trainer on
CUDA (no vLLM, nothing downloaded). The model is built in code: a random 2-layer Llama (hidden
128) with a real byte-level BPE tokenizer (~300 ids), as tests/tiny_glue.py builds it, larger.

1. `HFBackend.from_pretrained(dir)` with no device given picks cuda and bfloat16.
2. Seeded sampling reproduces: the same requests (n=2, temperature 1) with the same seeds give
   the same token ids twice; other seeds give other ids.
3. float32 on the device vs float32 on CPU: greedy token ids equal on 4 prompts, and the
   log-probs of a fixed continuation (one full forward) within --tol; prints the max |diff|.
4. Constrained decoding on the device: a json tool-call constraint (`tool_call_constraint`, as
   tests/test_constrain.py) on 12 samples; every token replays through the grammar, every
   completion finishes, parses and validates against the schema (jsonschema).
5. Two GRPO steps with LoRA on the device, on groups the float32 backend sampled there
   (constrained and top-p turns, so the trainer replays grammar masks on the device): loss
   finite, first-update PPO ratio within --tol of 1 (sampler and trainer agree), every LoRA
   parameter moved, every base parameter unchanged; the adapter written by `save_checkpoint`
   loads into an `HFBackend` on the device, where it scores a fixed continuation as the trainer
   does and differently from the base model.
6. `save_checkpoint` / `load_checkpoint` restore the RNG (torch CPU and CUDA, Python): a draw
   after saving equals a draw after loading.

    python bench/gpu_check_hf.py [--device cuda|cpu] [--tol 1e-3]

Prints one PASS/FAIL line per check with what it measured; exits 1 if any check fails, 2 if
CUDA is asked for and absent. `--device cpu` is a smoke test for machines without a GPU
(check 1 then expects cpu / float32, check 3 compares CPU with CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tiny_glue
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from coevo.models.base import Request, Sampling  # noqa: E402

PICK = {"name": "pick", "parameters": {"type": "object", "required": ["color"], "properties": {
    "color": {"type": "string", "enum": ["red", "green", "blue"]}, "bold": {"type": "boolean"}}}}
PROMPTS = ["the quick brown fox", "Say something about 7.", "The answer is", "lazy dog"]


def save_model(path: Path) -> Path:
    """tests/tiny_glue.py's tokenizer and 2-layer Llama, wider (hidden 128, 4 heads)."""
    from tiny_glue import save_tiny_model

    return save_tiny_model(path, hidden=128, heads=4, kv_heads=2)


def chat(text: str, constraint=None, n: int = 1, **sampling) -> Request:
    return Request(messages=[{"role": "user", "content": text}], n=n, constraint=constraint,
                   sampling=Sampling(**{"max_new_tokens": 16, **sampling}))


def full_logprobs(model, prompt: list[int], ids: list[int], dev) -> torch.Tensor:
    """Reference: log-probs [len(ids)] of `ids` after `prompt`, one full forward, no cache."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + ids], device=dev)).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1: len(prompt) - 1 + len(ids)], -1)
    return lp.gather(1, torch.tensor(ids, device=dev)[:, None])[:, 0].cpu()


def check_default_device(d: Path, dev: str, args) -> tuple[bool, str]:
    from coevo.models.hf import HFBackend

    b = HFBackend.from_pretrained(d)
    p = next(b.model.parameters())
    want = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    got = (b.device.type, p.dtype)
    ok = got == want and p.device.type == want[0]
    return ok, f"got {got[0]} {got[1]}, want {want[0]} {want[1]}"


def check_seeds(d: Path, dev: str, args) -> tuple[bool, str]:
    from coevo.models.hf import HFBackend

    b = HFBackend.from_pretrained(d, device=dev)
    ids = lambda off: [[c.token_ids for c in g] for g in b.generate(  # noqa: E731
        [chat(p, n=2, temperature=1.0, seed=i + off) for i, p in enumerate(PROMPTS)])]
    first, again, other = ids(0), ids(0), ids(100)
    pairs = [(a, o) for ga, go in zip(first, other) for a, o in zip(ga, go)]
    differ = sum(a != o for a, o in pairs)
    within = sum(g[0] != g[1] for g in first)
    ok = first == again and differ == len(pairs) and within == len(first)
    return ok, (f"{next(b.model.parameters()).dtype}: repeat identical {first == again}; "
                f"other seed differs {differ}/{len(pairs)}; samples of a request differ "
                f"{within}/{len(first)}")


def check_cpu_agreement(d: Path, dev: str, args) -> tuple[bool, str]:
    from coevo.models.hf import HFBackend

    cpu = HFBackend.from_pretrained(d, device="cpu", dtype="float32")
    gpu = HFBackend.from_pretrained(d, device=dev, dtype="float32")
    reqs = [chat(p, temperature=0.0, max_new_tokens=24) for p in PROMPTS]
    a, b = [g[0] for g in cpu.generate(reqs)], [g[0] for g in gpu.generate(reqs)]
    same = sum(x.token_ids == y.token_ids for x, y in zip(a, b))
    diff = gen_diff = 0.0
    for x, y in zip(a, b):  # the CPU's continuation scored by both; the loop's own log-probs
        ref = full_logprobs(cpu.model, x.prompt_ids, x.token_ids, "cpu")
        diff = max(diff, float((ref - full_logprobs(gpu.model, x.prompt_ids, x.token_ids,
                                                     dev)).abs().max()))
        if x.token_ids == y.token_ids:
            gen_diff = max([gen_diff] + [abs(u - v) for u, v in zip(x.logprobs, y.logprobs)])
    ok = same == len(reqs) and diff < args.tol and gen_diff < args.tol
    return ok, (f"greedy ids equal {same}/{len(reqs)}; max |logprob diff| full forward "
                f"{diff:.2e}, sampling loop {gen_diff:.2e} (tol {args.tol:g})")


def check_constrained(d: Path, dev: str, args) -> tuple[bool, str]:
    import jsonschema

    from coevo.models.grammars import tool_call_constraint
    from coevo.models.hf import HFBackend
    from coevo.models.masks import Grammars

    b = HFBackend.from_pretrained(d, device=dev)
    c = tool_call_constraint([PICK], "json", max_calls=2)
    t0 = time.perf_counter()
    out = b.generate([chat(p, c, n=3, temperature=1.0, top_k=20, max_new_tokens=80, seed=i)
                      for i, p in enumerate(PROMPTS)])
    secs = time.perf_counter() - t0
    g, comps, bad = Grammars(b.tokenizer, b._eos), [x for grp in out for x in grp], []
    for comp in comps:
        if comp.error:
            return False, f"sampling error: {comp.error}"
        g.replay(c, comp.token_ids)  # raises if any sampled token was not allowed
        try:
            jsonschema.validate(json.loads(comp.text), c.json_schema)
        except (ValueError, jsonschema.ValidationError):
            bad.append(comp.text)
    done, n = sum(x.finish_reason == "stop" for x in comps), len(comps)
    return done == n and not bad, (f"{n - len(bad)}/{n} valid, {done}/{n} finished, in "
                                   f"{secs:.1f} s (the first call compiles the mask kernel); "
                                   f"e.g. {(bad or [comps[0].text])[0]!r}")


def sample_groups(backend, constraint) -> list:
    """3 GRPO groups of 4 sampled by `backend`: 2 constrained, 1 top-p; reward = share of
    sampled ids in the lower half of the vocabulary (varies within a group)."""
    from coevo.trajectory import Trajectory, Turn, TurnSampling

    half = len(backend.tokenizer) // 2
    reqs = [chat(PROMPTS[0], constraint, n=4, temperature=1.0, top_k=20, max_new_tokens=40, seed=1),
            chat(PROMPTS[1], constraint, n=4, temperature=0.8, max_new_tokens=40, seed=2),
            chat(PROMPTS[2], None, n=4, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=3)]
    trajs = []
    for g, (req, group) in enumerate(zip(reqs, backend.generate(reqs))):
        s = req.sampling
        for i, c in enumerate(group):
            p, n = len(c.prompt_ids), len(c.token_ids)
            turn = Turn(index=0, start=p, end=p + n, text=c.text, finish_reason=c.finish_reason,
                        sampling=TurnSampling(temperature=s.temperature, top_k=s.top_k,
                                              top_p=s.top_p), constraint=req.constraint)
            trajs.append(Trajectory(
                env="gpu-check", task_id=f"t{g}", group_id=f"g{g}", sample_index=i,
                token_ids=c.prompt_ids + c.token_ids, loss_mask=[0] * p + [1] * n,
                logprobs=[0.0] * p + c.logprobs, prompt_len=p, turns=[turn],
                reward=sum(t < half for t in c.token_ids) / max(n, 1)))
    return trajs


def load_model(d: Path, dev: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).to(dev)


def check_grpo(d: Path, dev: str, args) -> tuple[bool, str]:
    from coevo.models.grammars import tool_call_constraint
    from coevo.models.hf import HFBackend
    from coevo.rl import TrainConfig, Trainer, save_checkpoint

    sampler = HFBackend.from_pretrained(d, device=dev, dtype="float32")
    trajs = sample_groups(sampler, tool_call_constraint([PICK], "json", max_calls=2))
    trainer = Trainer(load_model(d, dev), TrainConfig(lr=1e-2), tokenizer=sampler.tokenizer)
    lora0 = {n: p.detach().clone() for n, p in trainer.named_trainable_parameters()}
    base0 = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
             if not p.requires_grad}
    stats = [trainer.step(trajs), trainer.step(trajs)]
    params = dict(trainer.model.named_parameters())
    moved = sum(not torch.equal(params[n], v) for n, v in lora0.items())
    fixed = sum(torch.equal(params[n], v) for n, v in base0.items())
    ck = Path(tempfile.mkdtemp(prefix="coevo-gpu-hf-")) / "ck"
    save_checkpoint(trainer, ck)
    adapted = HFBackend.from_pretrained(d, adapter=ck, device=dev, dtype="float32")
    t = trajs[0]
    prompt, ids = t.token_ids[:t.prompt_len], t.token_ids[t.prompt_len:]
    trainer.model.eval()
    lp_trainer = full_logprobs(trainer.model, prompt, ids, dev)
    lp_adapted = full_logprobs(adapted.model, prompt, ids, dev)
    lp_base = full_logprobs(sampler.model, prompt, ids, dev)
    same = float((lp_adapted - lp_trainer).abs().max())
    change = float((lp_adapted - lp_base).abs().max())
    s0 = stats[0]
    ok = (all(s.updated and math.isfinite(s.loss) for s in stats)
          and abs(s0.ratio_mean - 1) < args.tol and s0.clip_fraction == 0
          and moved == len(lora0) and fixed == len(base0) and same < args.tol and change > 1e-2)
    return ok, (f"losses {stats[0].loss:.4f}, {stats[1].loss:.4f}; step-1 ratio "
                f"{s0.ratio_mean:.7f} clip {s0.clip_fraction:g} ({s0.signal_groups}/{s0.groups} "
                f"groups with signal, {s0.tokens} tokens); LoRA moved {moved}/{len(lora0)}, base "
                f"unchanged {fixed}/{len(base0)}; loaded adapter vs trainer max |diff| "
                f"{same:.2e}, vs base {change:.3f}")


def check_rng(d: Path, dev: str, args) -> tuple[bool, str]:
    from coevo.rl import TrainConfig, Trainer, load_checkpoint, save_checkpoint

    trainer = Trainer(load_model(d, dev), TrainConfig())
    ck = Path(tempfile.mkdtemp(prefix="coevo-gpu-hf-")) / "ck"

    def draw():
        return (torch.rand(4, device=dev).tolist(), torch.rand(4).tolist(), random.random())

    torch.manual_seed(1234)
    draw()  # leave the generators mid-stream, not at a fresh seed
    save_checkpoint(trainer, ck)
    a = draw()
    torch.manual_seed(999)
    random.seed(999)
    load_checkpoint(trainer, ck)
    b = draw()
    saved = torch.load(ck / "trainer_state.pt", weights_only=True)["rng"]
    return a == b, f"draws equal {a == b}; cuda state saved {'cuda' in saved}"


CHECKS = [("default device/dtype", check_default_device), ("seeded sampling", check_seeds),
          ("fp32 vs CPU", check_cpu_agreement), ("constrained decoding", check_constrained),
          ("GRPO + LoRA", check_grpo), ("checkpoint RNG", check_rng)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: this check needs one (--device cpu for a smoke test)")
        return 2
    import peft
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per check, not per weight file
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__} on {name}")
    d = save_model(Path(tempfile.mkdtemp(prefix="coevo-gpu-hf-")) / "model")
    failed = 0
    for k, (title, fn) in enumerate(CHECKS, 1):
        t0 = time.perf_counter()
        try:
            ok, detail = fn(d, args.device, args)
        except Exception as e:  # one broken check must not hide the others' results
            traceback.print_exc()
            ok, detail = False, f"{type(e).__name__}: {e}"
        failed += not ok
        print(f"{k}. {'PASS' if ok else 'FAIL'} {title} ({time.perf_counter() - t0:.1f} s): "
              f"{detail}", flush=True)
    print("OK" if not failed else f"FAILED: {failed} of {len(CHECKS)} checks")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
