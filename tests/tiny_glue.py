"""Test helpers shared by test_evaluate.py, test_executors.py and test_stage.py: a tiny random
Llama with a real byte-level BPE tokenizer (built in code, saved to a folder so Ray workers and
`load_backend("hf:DIR")` can load the very same weights), and two small environments.

Copied from the builders in tests/test_models.py and tests/test_agent.py (tests are not a
package, so they cannot be imported from there).
"""

from __future__ import annotations

import functools
from pathlib import Path

from coevo.assets.harness import Harness
from coevo.envs.base import Response, Score, Task
from coevo.trajectory import ToolResult

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = ["the quick brown fox jumps over the lazy dog", "Say something about a number",
          "assistant The answer is 42. user system", '{"name": "add", "arguments": {"a": 1}}']


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    """A real byte-level BPE tokenizer (~300 ids) with a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Printable ASCII + space + newline only: every id a random model samples decodes to
    # whole characters (no half UTF-8 sequences).
    keep = {chr(b) for b in range(33, 127)} | {chr(256 + 32), chr(256 + 10)}
    alphabet = sorted(c for c in pre_tokenizers.ByteLevel.alphabet() if c in keep)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHATML)


def save_tiny_model(path: Path, seed: int = 0, sharpen: float = 4.0, hidden: int = 32,
                    heads: int = 2, kv_heads: int = 1) -> Path:
    """A 2-layer Llama (hidden 32 unless told) + the tokenizer, `save_pretrained` into `path`
    (bench/gpu_check_hf.py builds a wider one)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=512, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=None,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a little sharper than uniform, so samples differ by seed
        model.lm_head.weight.mul_(sharpen)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def load_tiny_model(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(path)), AutoTokenizer.from_pretrained(str(path))


def first_char(text: str) -> str:
    return text.lstrip()[:1]


class SingleTurnEnv:
    """Base of the single-turn test environments: no state, no environment functions."""

    single_turn = True

    def start(self, task):
        return None

    def step(self, state, calls):
        return []


class FirstCharEnv(SingleTurnEnv):
    """Single-turn: reward 1 when the reply starts with a character in `target` (trivially
    learnable: the policy only has to move mass onto some first tokens). `details["short"]`
    is partial credit for a reply of at most 8 characters."""

    name = "test:first-char"

    def __init__(self, target: str = "abcdefghijklmnopqrstuvwxyz", size: int = 12):
        self.target, self.size = target, size

    def tasks(self, split: str = "train", n: int | None = None) -> list[Task]:
        out = [Task(id=f"{split}-{i}", env=self.name, family="say",
                    messages=[{"role": "user", "content": f"Say something about {i}."}])
               for i in range(self.size)]
        return out[:n] if n is not None else out

    def score(self, task: Task, state, response: Response) -> Score:
        ok = first_char(response.text) in set(self.target) and bool(response.text.strip())
        return Score(outcome=float(ok), success=ok,
                     details={"short": float(len(response.text.strip()) <= 8)})


class EchoToolEnv:
    """Multi-turn: an `echo` tool; the answer must contain the task's word (scripted tests)."""

    name = "test:echo"
    single_turn = False
    WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger")
    TOOL = {"type": "function", "function": {
        "name": "echo", "description": "Returns its text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"]}}}

    def tasks(self, split: str = "val", n: int | None = None) -> list[Task]:
        out = [Task(id=f"{split}-{w}", env=self.name, tools=[self.TOOL], answer=w,
                    messages=[{"role": "user", "content": f"Echo the word {w}."}])
               for w in self.WORDS]
        return out[:n] if n is not None else out

    def start(self, task):
        return {"calls": 0}

    def step(self, state, calls):
        state["calls"] += len(calls)
        return [ToolResult(name=c.name, content=str(c.arguments.get("text", ""))) for c in calls]

    def score(self, task: Task, state, response: Response) -> Score:
        ok = task.answer in response.text
        return Score(outcome=float(ok), success=ok, details={"called": float(state["calls"] > 0)})


def tiny_harness(**kw) -> Harness:
    data = dict(name="tiny", system_prompt="Reply briefly.", tool_format="json",
                workflow={"max_turns": 1},
                decoding={"temperature": 1.0, "max_new_tokens": 4})
    data.update(kw)
    return Harness.model_validate(data)


class NumberFormatEnv(SingleTurnEnv):
    """Single-turn arithmetic where only the format is rewarded: outcome 1 when the whole
    reply is a bare integer (the harness asks for exactly that); the value is not checked,
    so a small model can learn it in a few GRPO steps."""

    name = "test:number-format"

    def tasks(self, split: str = "train", n: int | None = None) -> list[Task]:
        off = {"train": 0, "val": 100, "test": 200}[split]
        out = [Task(id=f"{split}-{i}", env=self.name, answer=str(2 * i + 3 + off),
                    messages=[{"role": "user", "content": f"What is {i + off} + {i + 3}?"}])
               for i in range(16)]
        return out[:n] if n is not None else out

    def score(self, task: Task, state, response: Response) -> Score:
        ok = response.text.strip().isdigit()
        return Score(outcome=float(ok), success=ok)


HINT = "Begin with the letter a."


def hint_policy():
    """Replies "a fine" (FirstCharEnv scores 1) iff the system prompt carries HINT, else "zz"."""
    from coevo.models.scripted import ScriptedBackend

    tok = tiny_tokenizer()

    def reply(req, i):
        seen = tok.decode(req.prompt_ids) if req.prompt_ids else str(req.messages)
        return "a fine" if HINT in seen else "zz"

    return ScriptedBackend(reply, tokenizer=tok, name="scripted-policy")


def hint_loop_run(tmp: Path, proposers: list, name: str = "harness-run"):
    """A 1-round harness-only gated loop on FirstCharEnv (target a-m) under `hint_policy`
    with the given proposers, from the `tiny` harness; returns (store, result)."""
    from coevo.config import RunConfig
    from coevo.loop import Parts, run_coevolution
    from coevo.store import Store

    cfg = RunConfig.from_mapping({
        "name": name, "env": "test:first-char", "mode": "harness-only", "rounds": 1,
        "assets": {"harness": "tiny"}, "proposers": [],
        "gate": {"screen_size": 12, "n_boot": 200},
        "splits": {"val_n": 12, "test_n": 6, "train_n": 4}})
    store = Store.open(f"sqlite:///{tmp / 'loop.db'}")
    store.put_asset(tiny_harness(decoding={"temperature": 1.0, "max_new_tokens": 8}))
    env = FirstCharEnv(target="abcdefghijklm", size=12)
    res = run_coevolution(cfg, store, Parts(env=env, backend=hint_policy(), proposers=proposers))
    return store, res
