"""Rollout overhead: the runtime (graph, token sequence, batcher, scoring) vs raw batched
generate on the same prompts.

Both sides decode the same N single-turn episodes' prompts greedily with the same
max_new_tokens: "raw" is one `backend.generate` call on the N prompt-id requests; "runtime" is
`run_episodes` (N episodes through the harness graph, DynamicBatcher, verifier). Prints the
wall-time ratio runtime / raw (target <= 1.05 on CPU). Greedy decoding makes both sides decode
the same tokens, so the difference is the runtime's own cost.

    python bench/rollout_overhead.py              # tiny random Llama built here (seconds)
    python bench/rollout_overhead.py --embedded   # SmolLM2-135M on bfcl:simple_python
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from coevo.agent.context import TokenSequence
from coevo.agent.episode import build_messages, run_episodes
from coevo.assets.harness import Harness
from coevo.envs.base import Response, Score, Task
from coevo.models.base import Request

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class EchoEnv:
    """Single-turn tasks whose verifier checks nothing expensive (the bench times the runtime)."""

    name = "bench:echo"
    single_turn = True

    def tasks(self, split="train", n=None):
        return [Task(id=f"b{i}", env=self.name,
                     messages=[{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}])
                for i in range(n or 16)]

    def start(self, task):
        return None

    def step(self, state, calls):
        return []

    def score(self, task, state, response: Response) -> Score:
        ok = str(2 * int(task.id[1:])) in response.text
        return Score(outcome=float(ok), success=ok)


def tiny_backend():
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from coevo.models.hf import HFBackend

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                  "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["system user assistant question what is the answer"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHATML)
    torch.manual_seed(0)
    # Big enough that decoding, not Python, dominates as it does for a real model.
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=512,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, eos_token_id=None,
                      pad_token_id=fast.pad_token_id, bos_token_id=None)
    # eos_token_id=None on the model and a tokenizer EOS the random model never samples at
    # greedy: every row decodes exactly max_new_tokens on both sides.
    return HFBackend(LlamaForCausalLM(cfg), fast, name="tiny-llama-bench", max_batch=64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedded", action="store_true", help="SmolLM2-135M on bfcl:simple_python")
    ap.add_argument("-n", type=int, default=16, help="episodes")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    if args.embedded:
        from coevo.envs.registry import make_env
        from coevo.models.registry import load_backend

        env, backend = make_env("bfcl:simple_python"), load_backend("embedded")
        tasks = env.tasks("train", n=args.n)
    else:
        env, backend = EchoEnv(), tiny_backend()
        tasks = env.tasks(n=args.n)
    harness = Harness.model_validate(dict(
        name="bench", system_prompt="You are a helpful assistant.", tool_format="python",
        decoding={"temperature": 0.0, "max_new_tokens": args.max_new_tokens}))
    # The exact prompt ids the runtime sends on its first (only) turn.
    requests = [Request(prompt_ids=TokenSequence(backend.tokenizer,
                                                 build_messages(harness, t, [])).ids,
                        sampling=harness.sampling(0)) for t in tasks]

    def raw() -> list:
        # In a worker thread, as the DynamicBatcher calls it: on the shared 2-core machine a
        # main-thread generate measured 5-10x slower than the same call from a thread, which
        # would flatter the runtime.
        return asyncio.run(asyncio.to_thread(backend.generate, requests))

    def runtime() -> list:
        return asyncio.run(run_episodes(env, tasks, harness, backend=backend))

    raw(), runtime()  # warm-up: allocator, kernels, BFCL checker import
    raw_t, run_t = [], []
    for _ in range(args.repeats):  # interleaved, so machine load drifts hit both sides
        t0 = time.perf_counter()
        out_raw = raw()
        raw_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trajs = runtime()
        run_t.append(time.perf_counter() - t0)
    same = all(t.token_ids[t.prompt_len:] == r[0].token_ids for t, r in zip(trajs, out_raw))
    raw_s, run_s = statistics.median(raw_t), statistics.median(run_t)
    tokens = sum(t.sampled_tokens for t in trajs)
    print(f"model={backend.name} episodes={len(tasks)} max_new_tokens={args.max_new_tokens} "
          f"sampled_tokens={tokens} same_tokens={same}")
    print(f"raw batched generate: {raw_s:.3f} s   runtime: {run_s:.3f} s   "
          f"ratio runtime/raw: {run_s / raw_s:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
