"""vLLM offline-engine backend (optional extra `coevo[vllm]`, GPU only).

`vllm.LLM` with `enable_lora=True`; the current checkpoint is a `LoRARequest(name, int_id,
path)` passed with every `generate`. vLLM caches adapters by integer id, so each
`load_adapter` call (a new checkpoint, possibly at the same path) gets a fresh id; reusing an
id would serve the stale cached weights.

Prompts are rendered locally (the engine's own tokenizer and chat template) and sent as
`TokensPrompt(prompt_token_ids=...)`, so `prompt_ids` are exactly what the engine saw.
`SamplingParams(logprobs=0)` returns the sampled token's log-probability only; vLLM's V1 engine
reports raw (pre-temperature, pre-filter) logprobs by default (`logprobs_mode="raw_logprobs"`),
the contract's definition. vLLM seeds a request once and draws its `n` samples from that
stream, so seeded results are reproducible within vLLM but differ from the HF backend's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from coevo.errors import CoevoError
from coevo.models.base import Completion, Request
from coevo.models.hf import error_completion, render_prompt, request_seed

log = logging.getLogger(__name__)


def _import_vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
    except ImportError:
        raise CoevoError(
            "the vllm backend needs vLLM and a CUDA GPU: `pip install 'coevo[vllm]'`"
        ) from None
    return vllm, TokensPrompt, LoRARequest


class VLLMBackend:
    def __init__(self, path: str, *, adapter: str | None = None, max_lora_rank: int = 64,
                 gpu_memory_utilization: float = 0.85, dtype: str = "auto", seed: int = 0,
                 max_model_len: int | None = None, name: str | None = None,
                 **engine_opts: Any):
        vllm, self._TokensPrompt, self._LoRARequest = _import_vllm()
        self._SamplingParams = vllm.SamplingParams
        opts: dict[str, Any] = dict(
            model=str(path), enable_lora=True, max_lora_rank=max_lora_rank,
            gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed,
        )
        if max_model_len is not None:
            opts["max_model_len"] = max_model_len
        opts.update(engine_opts)
        self.llm = vllm.LLM(**opts)
        self.tokenizer = self.llm.get_tokenizer()
        self.name = name or f"vllm:{path}"
        self.adapter: str | None = None
        self._lora = None
        self._lora_ids = 0
        if adapter is not None:
            self.load_adapter(adapter)

    def load_adapter(self, path: str | Path | None) -> None:
        """Serve the LoRA adapter at `path` (None: the base model) from the next call on."""
        if path is None:
            self._lora, self.adapter = None, None
            return
        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise CoevoError(f"{path}: not a LoRA adapter folder (no adapter_config.json)")
        self._lora_ids += 1
        self._lora = self._LoRARequest(f"coevo{self._lora_ids}", self._lora_ids, str(path))
        self.adapter = str(path)

    def _params(self, req: Request):
        s = req.sampling
        return self._SamplingParams(
            n=req.n, temperature=s.temperature, top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else -1,  # -1 = off in every vLLM >= 0.8
            max_tokens=s.max_new_tokens, stop=list(s.stop) or None, seed=request_seed(req),
            logprobs=0,  # the sampled token's logprob only
        )

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        results: list[list[Completion] | None] = [None] * len(requests)
        todo: list[tuple[int, list[int]]] = []
        for i, req in enumerate(requests):
            try:
                todo.append((i, render_prompt(self.tokenizer, req)))
            except Exception as e:
                results[i] = [error_completion(f"{type(e).__name__}: {e}")] * req.n
        if todo:
            self._run(requests, todo, results)
        return results  # type: ignore[return-value]

    def _run(self, requests, todo, results) -> None:
        prompts = [self._TokensPrompt(prompt_token_ids=ids) for _, ids in todo]
        params = [self._params(requests[i]) for i, _ in todo]
        try:
            outs = self.llm.generate(prompts, params, lora_request=self._lora, use_tqdm=False)
        except Exception as e:
            if len(todo) > 1:  # isolate the failing request(s), as the HF backend does
                for item in todo:
                    self._run(requests, [item], results)
                return
            log.warning("vLLM generation failed: %s", e)
            i, ids = todo[0]
            results[i] = [error_completion(f"{type(e).__name__}: {e}", ids)] * requests[i].n
            return
        for (i, ids), out in zip(todo, outs):
            results[i] = [self._completion(o, ids) for o in sorted(out.outputs,
                                                                   key=lambda o: o.index)]

    @staticmethod
    def _completion(o: Any, prompt: list[int]) -> Completion:
        tokens = list(o.token_ids)
        # o.logprobs: one {token_id: Logprob} dict per sampled token; the sampled id is
        # always present (vLLM adds it next to the top-k, and k=0 here).
        lps = [float(step[tok].logprob) for step, tok in zip(o.logprobs or [], tokens)]
        ok = len(lps) == len(tokens)
        return Completion(
            text=o.text, token_ids=tokens if ok else [], logprobs=lps if ok else [],
            prompt_ids=prompt, finish_reason="length" if o.finish_reason == "length" else "stop",
            trainable=ok,
        )
