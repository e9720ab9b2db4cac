"""vLLM offline-engine backend (optional extra `coevo[vllm]`, GPU only).

`vllm.LLM` with `enable_lora=True`; the current checkpoint is a `LoRARequest(name, int_id,
path)` passed with every `generate`. vLLM caches adapters by integer id, so each
`load_adapter` call (a new checkpoint, possibly at the same path) gets a fresh id; reusing an
id would serve the stale cached weights.

Prompts are rendered locally (the engine's own tokenizer and chat template) and sent as
`TokensPrompt(prompt_token_ids=...)`, so `prompt_ids` are exactly what the engine saw.
vLLM seeds a request once and draws its `n` samples from that stream, so seeded results are
reproducible within vLLM but differ from the HF backend's.

Behaviour log-probs. `SamplingParams(logprobs=0)` returns the sampled token's log-prob, and
the engine is built with `logprobs_mode="processed_logprobs"` where `EngineArgs` has it.
"Processed" is the distribution vLLM's sampler drew from: the logits after the grammar
bitmask (applied by the model runner before the sampler, so raw log-probs include it too),
its logits processors (allowed / bad words, min_tokens, logit bias: coevo sets none),
penalties (none), temperature, min_p (0), then top-k and top-p - coevo's definition, in
coevo's order (coevo.models.logits). coevo counts on top-k / top-p in it from vLLM 0.10.2 on
(vllm#22387; 0.10.0's processed mode stopped after temperature), so older engines count as
raw: their completions of tempered or filtered requests keep their token ids but are marked
untrainable (`dialects.vllm_logprobs_exact`, which also covers greedy requests with top-k /
top-p: vLLM drops those filters at temperature 0, coevo records them).

Constraints. `Request.constraint` becomes `SamplingParams(structured_outputs=
StructuredOutputsParams(json= | regex= | grammar=))` (vLLM >= 0.10.2), or on older engines
`guided_decoding=GuidedDecodingParams(...)` (removed in 0.12), whichever `vllm.sampling_params`
has. vLLM picks the grammar engine once per engine (a per-request choice is refused), so the
engine is built with the `guidance` backend - llguidance, coevo's grammar engine - and no free
JSON whitespace, as coevo compiles JSON: `structured_outputs_config={"backend": "guidance",
"disable_any_whitespace": True}`, or `guided_decoding_backend="guidance",
guided_decoding_disable_any_whitespace=True` on older engines, whichever `EngineArgs` has.
Then the masks vLLM samples under are the ones the trainer replays. An engine built otherwise
(engine options override these) still takes json and regex constraints, their completions
marked untrainable, while lark constraints fail: another backend would read the Lark text as
its own EBNF. A grammar llguidance cannot compile fails its request before the engine sees
it; one the engine rejects fails alone (the batch is retried request by request).

Departure from the hf backend: once a grammar is complete, vLLM's guidance backend allows
only EOS and samples it (log-prob 0), so a constrained completion that finished its grammar
ends with that EOS; the hf backend stops without spending a step on it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

from coevo.errors import CoevoError
from coevo.models.base import Completion, Request, error_completion
from coevo.models.constrain import Constraint, UnsupportedConstraint
from coevo.models.dialects import vllm_fields, vllm_logprobs_exact
from coevo.models.hf import render_prompt, request_seed

log = logging.getLogger(__name__)

PROCESSED_SINCE = (0, 10, 2)  # "processed_logprobs" includes top-k / top-p (vllm#22387)


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


def structured_api() -> tuple[Any, str]:
    """(params class, SamplingParams keyword) of this vLLM's structured outputs."""
    from vllm import sampling_params as sp

    if hasattr(sp, "StructuredOutputsParams"):
        return sp.StructuredOutputsParams, "structured_outputs"
    if hasattr(sp, "GuidedDecodingParams"):
        return sp.GuidedDecodingParams, "guided_decoding"
    return None, ""


def engine_defaults(vllm: Any) -> dict[str, Any]:
    """The engine options coevo's contract needs, in the names this vLLM's `EngineArgs` has
    (module docstring): the llguidance grammar backend and processed log-probs."""
    try:
        fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    except (AttributeError, TypeError):
        fields = set()
    opts: dict[str, Any] = {}
    if "structured_outputs_config" in fields:
        opts["structured_outputs_config"] = {"backend": "guidance", "disable_any_whitespace": True}
    elif {"guided_decoding_backend", "guided_decoding_disable_any_whitespace"} <= fields:
        opts["guided_decoding_backend"] = "guidance"
        opts["guided_decoding_disable_any_whitespace"] = True
    if "logprobs_mode" in fields:
        opts["logprobs_mode"] = "processed_logprobs"
    return opts


def uses_llguidance(opts: dict[str, Any]) -> bool:
    """Whether an engine built with `opts` compiles grammars as coevo does."""
    cfg = opts.get("structured_outputs_config")
    if cfg is not None:
        get = cfg.get if isinstance(cfg, dict) else (lambda k: getattr(cfg, k, None))
        return get("backend") == "guidance" and bool(get("disable_any_whitespace"))
    return (opts.get("guided_decoding_backend") == "guidance"
            and bool(opts.get("guided_decoding_disable_any_whitespace")))


def version_tuple(version: str) -> tuple[int, ...]:
    """
    >>> version_tuple("0.10.2rc1.dev5+gabc") >= (0, 10, 2) > version_tuple("0.10.1")
    True
    """
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)


class VLLMBackend:
    def __init__(self, path: str, *, adapter: str | None = None, max_lora_rank: int = 64,
                 gpu_memory_utilization: float = 0.85, dtype: str = "auto", seed: int = 0,
                 max_model_len: int | None = None, name: str | None = None,
                 **engine_opts: Any):
        vllm, self._TokensPrompt, self._LoRARequest = _import_vllm()
        self._SamplingParams = vllm.SamplingParams
        self._Structured, self._structured_kw = structured_api()
        opts: dict[str, Any] = dict(
            model=str(path), enable_lora=True, max_lora_rank=max_lora_rank,
            gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed,
        )
        if max_model_len is not None:
            opts["max_model_len"] = max_model_len
        opts.update(engine_defaults(vllm))
        opts.update(engine_opts)  # the caller's word wins; the flags below say what it means
        self.llguidance = uses_llguidance(opts)
        self.processed = (opts.get("logprobs_mode") == "processed_logprobs"
                          and version_tuple(getattr(vllm, "__version__", "")) >= PROCESSED_SINCE)
        if not self.processed:
            log.warning("vLLM %s reports raw log-probs: tempered or filtered completions are "
                        "untrainable (needs vLLM >= 0.10.2)", getattr(vllm, "__version__", "?"))
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
        kw: dict[str, Any] = dict(
            n=req.n, temperature=s.temperature, top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else -1,  # -1 = off in every vLLM >= 0.8
            max_tokens=s.max_new_tokens, stop=list(s.stop) or None, seed=request_seed(req),
            logprobs=0,  # the sampled token's logprob only
        )
        if req.constraint is not None:
            kw[self._structured_kw] = self._structured(req.constraint)
        return self._SamplingParams(**kw)

    def _structured(self, c: Constraint) -> Any:
        if self._Structured is None:
            raise UnsupportedConstraint("this vLLM has no structured outputs "
                                        "(neither StructuredOutputsParams nor GuidedDecodingParams)")
        if c.kind == "lark" and not self.llguidance:
            raise UnsupportedConstraint(
                "lark constraints need vLLM's guidance (llguidance) structured-output backend "
                "with disable_any_whitespace; this engine was built with other options")
        c.check()  # what llguidance cannot compile fails here, with the engine's reason
        return self._Structured(**vllm_fields(c))

    def _exact(self, req: Request) -> bool:
        """Whether the engine's log-probs are coevo's behaviour log-probs for `req`."""
        return (vllm_logprobs_exact(req.sampling, self.processed)
                and (req.constraint is None or self.llguidance))

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        results: list[list[Completion] | None] = [None] * len(requests)
        todo: list[tuple[int, list[int], Any]] = []
        for i, req in enumerate(requests):
            try:
                todo.append((i, render_prompt(self.tokenizer, req), self._params(req)))
            except Exception as e:  # a bad request (or constraint) is that request's error
                results[i] = [error_completion(f"{type(e).__name__}: {e}")] * req.n
        if todo:
            self._run(requests, todo, results)
        return results  # type: ignore[return-value]

    def _run(self, requests, todo, results) -> None:
        prompts = [self._TokensPrompt(prompt_token_ids=ids) for _, ids, _ in todo]
        params = [p for _, _, p in todo]
        try:
            outs = self.llm.generate(prompts, params, lora_request=self._lora, use_tqdm=False)
        except Exception as e:
            if len(todo) > 1:  # isolate the failing request(s), as the HF backend does
                for item in todo:
                    self._run(requests, [item], results)
                return
            log.warning("vLLM generation failed: %s", e)
            i, ids, _ = todo[0]
            c = requests[i].constraint
            why = f" (a request constrained by a {c.kind} grammar)" if c is not None else ""
            message = f"{type(e).__name__}: {e}{why}"
            results[i] = [error_completion(message, ids)] * requests[i].n
            return
        for (i, ids, _), out in zip(todo, outs):
            exact = self._exact(requests[i])
            results[i] = [self._completion(o, ids, exact)
                          for o in sorted(out.outputs, key=lambda o: o.index)]

    @staticmethod
    def _completion(o: Any, prompt: list[int], exact: bool) -> Completion:
        tokens = list(o.token_ids)
        # o.logprobs: one {token_id: Logprob} dict per sampled token; the sampled id is
        # always present (vLLM adds it next to the top-k, and k=0 here).
        lps = [float(step[tok].logprob) for step, tok in zip(o.logprobs or [], tokens)]
        ok = len(lps) == len(tokens)
        return Completion(
            text=o.text, token_ids=tokens if ok else [], logprobs=lps if ok else [],
            prompt_ids=prompt, finish_reason="length" if o.finish_reason == "length" else "stop",
            trainable=ok and exact,
        )
