"""Benchmark one GRPO update of coevo's Trainer; prints ratios, not just seconds.

    python bench/train_step.py              # tiny random Llama (seconds)
    python bench/train_step.py --embedded   # SmolLM2-135M (coevo.models.embedded), minutes on CPU

Workload (the FACTS.md prototype shape): 4 groups x 4 samples, a ~500-token prompt per group,
48-token completions, LoRA r=16 on q,k,v,o. Figures printed:
- training tokens/s of one coevo update (policy tokens / wall seconds of `Trainer.step`);
- coevo update / bare forward+backward of the same sequences (plain HF forward keeping only
  the completion logits, cross-entropy, backward; same micro-batching): the trainer's overhead;
- shared-prompt speed-up: coevo update with `shared_prompt=False` / with `shared_prompt=True`.
Each timing is the median of --repeats interleaved runs after one warm-up round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from coevo.rl import TrainConfig, Trainer  # noqa: E402
from coevo.trajectory import Trajectory  # noqa: E402


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return LlamaForCausalLM(cfg), "tiny-llama"


def embedded_model():
    from transformers import AutoModelForCausalLM

    from coevo.models.embedded import MODEL_NAME, embedded_model_dir

    return AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32), MODEL_NAME


def make_trajectories(vocab: int, groups: int, g: int, prompt: int, completion: int,
                      seed: int = 0) -> list[Trajectory]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in range(groups):
        head = torch.randint(1, vocab, (prompt,), generator=gen).tolist()
        for i in range(g):
            tail = torch.randint(1, vocab, (completion,), generator=gen).tolist()
            out.append(Trajectory(
                env="bench", task_id=f"t{k}", group_id=f"g{k}", sample_index=i,
                token_ids=head + tail, loss_mask=[0] * prompt + [1] * completion,
                logprobs=[0.0] * prompt + [-5.0] * completion, prompt_len=prompt,
                reward=float(torch.rand((), generator=gen)),
            ))
    return out


def bare_forward_backward(model, trajs: list[Trajectory], per_mb: int, completion: int) -> None:
    """What a plain HF fine-tuning loop does with the same sequences: no cache sharing."""
    model.train()
    for i in range(0, len(trajs), per_mb):
        ids = torch.tensor([t.token_ids for t in trajs[i:i + per_mb]])
        logits = model(input_ids=ids, logits_to_keep=completion + 1).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ids[:, -completion:].reshape(-1))
        loss.backward()
    model.zero_grad(set_to_none=True)


def timed(fns: dict[str, object], repeats: int) -> dict[str, float]:
    """Median seconds per variant; variants are interleaved (a, b, c, a, b, c, ...) so a
    change in machine load hits all of them alike. One warm-up round first."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats + 1):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedded", action="store_true", help="use SmolLM2-135M (coevo.models.embedded)")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--completion", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when redirected to a file
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (1 if args.embedded else 3)

    t0 = time.perf_counter()
    model, name = embedded_model() if args.embedded else tiny_model()
    vocab = model.config.vocab_size
    print(f"model {name}: loaded in {time.perf_counter() - t0:.1f} s, torch threads "
          f"{torch.get_num_threads()}")
    trajs = make_trajectories(vocab, args.groups, args.samples, args.prompt, args.completion)
    seq = args.prompt + args.completion
    # One group per shared micro-batch (prompt once + G completions); the plain path packs
    # the same number of sequences, so both run the same number of optimizer-free passes.
    cap = seq * args.samples
    cfg = TrainConfig(lr=1e-5, max_tokens_per_microbatch=cap,
                      lora={"rank": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    trainer = Trainer(model, cfg, base_model=name)
    n_params = sum(p.numel() for p in trainer.trainable_parameters())
    policy_tokens = sum(t.sampled_tokens for t in trajs)
    print(f"workload: {args.groups} x {args.samples} samples, prompt {args.prompt}, completion "
          f"{args.completion} ({len(trajs) * seq} tokens, {policy_tokens} policy tokens); "
          f"LoRA trainable params {n_params:,}")

    stats = {}

    def run(shared: bool):
        trainer.config = cfg.model_copy(update={"shared_prompt": shared})
        stats[shared] = trainer.step(trajs)

    t = timed({"shared": lambda: run(True), "plain": lambda: run(False),
               "bare": lambda: bare_forward_backward(trainer.model, trajs, args.samples, args.completion)},
              repeats)
    t_shared, t_plain, t_bare = t["shared"], t["plain"], t["bare"]
    s = stats[True]
    print(f"coevo update, shared prompt : {t_shared:7.2f} s  ({policy_tokens / t_shared:8.1f} policy tok/s, "
          f"{s.forward_tokens / t_shared:8.1f} model tok/s, {s.microbatches} micro-batches)")
    print(f"coevo update, plain path    : {t_plain:7.2f} s  ({policy_tokens / t_plain:8.1f} policy tok/s, "
          f"{stats[False].forward_tokens} model tokens)")
    print(f"bare forward+backward       : {t_bare:7.2f} s  (same sequences, completion logits only)")
    print(f"ratio coevo(shared) / bare fwd+bwd : {t_shared / t_bare:5.2f}")
    print(f"ratio coevo(plain)  / bare fwd+bwd : {t_plain / t_bare:5.2f}")
    print(f"shared-prompt speed-up (plain / shared): {t_plain / t_shared:5.2f}x")


if __name__ == "__main__":
    main()
