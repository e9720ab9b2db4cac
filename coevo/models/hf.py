"""Hugging Face transformers backend with a hand-written sampling loop.

Algorithm: batched autoregressive sampling with a KV cache, i.e. what `model.generate` does,
written out because coevo needs three things `generate` does not give together:

1. **Log-probabilities of the distribution actually sampled.** Each step's logits go through
   the grammar mask (when the request carries a `Constraint`: llguidance's bitmask, filled in
   parallel for the batch's matchers), temperature, top-k and top-p, in `coevo.models.logits`;
   the token is drawn from that distribution and its log-probability under it is recorded.
   The trainer recomputes the policy's log-probabilities with the same function and the same
   masks (replayed), so the importance ratio of an on-policy update is exactly 1.
   `generate(output_scores=True)` gives no per-row grammar masks and no batch-independent
   seeds.
2. **One prefill per distinct prompt.** The unique prompts of a batch are left-padded and
   prefilled once; the KV cache (and the last-position logits) are then gathered along the
   batch dimension (`DynamicCache.batch_select_indices` with repeated indices) so the `n`
   samples of a request (and identical prompts of different requests, e.g. a GRPO group sent
   as G requests) share that encoding. FACTS.md measured 24.7 s -> 11 s per GRPO step from this.
3. **Per-sample randomness.** Sample j of a request draws from its own `torch.Generator`
   seeded from `(sampling.seed, j)` (one uniform per step, inverse-CDF sampling), so what a
   request samples does not depend on what else is in the batch, nor on how `max_batch`
   splits it. Padding changes matmul shapes, so logits differ across batch compositions by
   float rounding (~1e-6 in float32); tokens are equal unless a uniform falls within that
   distance of a CDF boundary. Tests assert equal tokens and logprobs within 1e-4.

Finished rows are dropped from the cache each step (batch_select_indices) so long stragglers
do not pay for finished rows. Prompts are left-padded with explicit `position_ids` computed
from the attention mask, so padding never shifts rotary positions.

Constrained rows stop when their grammar is complete (the engine's matcher reports it stopped:
nothing but end-of-sequence could follow), without spending a step on the EOS token; a grammar
that can continue (a regex with a free tail, text allowed) ends on EOS as usual.

Stop strings follow vLLM's convention: the completion `text` ends just before the stop string,
while `token_ids` / `logprobs` keep every sampled token, including the ones that spelled the
stop string and the EOS token, because training must see exactly what was sampled.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from coevo.errors import CoevoError
from coevo.registry import BadOptions
from coevo.models.base import Completion, Request, Sampling, error_completion
from coevo.models.cpu_memory import pin_mmap_threshold
from coevo.models.logits import Settings, filter_logits, token_logprobs

log = logging.getLogger(__name__)


def sample_seed(seed: int, index: int) -> int:
    """The generator seed of sample `index` of a request seeded `seed` (stable across runs
    and platforms, unlike Python's salted `hash`).

    >>> sample_seed(7, 0) == sample_seed(7, 0) != sample_seed(7, 1)
    True
    """
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def request_seed(request: Request) -> int:
    """The request's seed, or a fresh one from torch's global RNG (so `torch.manual_seed`
    makes unseeded runs repeatable too)."""
    if request.sampling.seed is not None:
        return request.sampling.seed
    return int(torch.randint(0, 2**62, (1,)).item())


def render_prompt(tokenizer: Any, request: Request) -> list[int]:
    """Prompt token ids: `prompt_ids` as given, else `messages` rendered with the chat template
    (generation prompt added, `tools` passed through). The template is rendered to text and
    encoded without special tokens, because templates that need a BOS write it themselves."""
    if request.prompt_ids is not None:
        if request.messages is not None:
            raise CoevoError("request: give either messages or prompt_ids, not both")
        if not request.prompt_ids:
            raise CoevoError("request: prompt_ids is empty")
        return list(request.prompt_ids)
    if request.messages is None:
        raise CoevoError("request: neither messages nor prompt_ids given")
    if tokenizer is None:
        raise CoevoError("request: messages need a tokenizer, and this backend has none")
    if not getattr(tokenizer, "chat_template", None):
        raise CoevoError("tokenizer: no chat_template, so messages cannot be rendered")
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False}
    if request.tools:
        kwargs["tools"] = request.tools
    text = tokenizer.apply_chat_template(request.messages, **kwargs)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise CoevoError("request: messages rendered to an empty prompt")
    return list(ids)


def eos_ids(tokenizer: Any, model: Any = None) -> set[int]:
    """Token ids that end a completion: the tokenizer's EOS plus the generation config's
    (chat models often list both <|im_end|> and <|endoftext|>)."""
    ids: set[int] = set()
    for value in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def first_stop(text: str, stops: list[str]) -> int:
    """Index of the earliest stop string in `text`, or -1.

    >>> first_stop("abc</s>def<END>", ["<END>", "</s>"])
    3
    """
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else -1


@dataclass
class _Row:
    """One sample being generated: request `req`, sample index `index`."""

    req: int
    index: int
    prompt: tuple[int, ...]
    sampling: Sampling
    generator: torch.Generator | None
    matcher: Any = None  # llguidance matcher of a constrained request, else None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str | None = None
    finish: str | None = None


class HFBackend:
    """A transformers causal LM (optionally with a peft LoRA adapter) behind the Backend
    contract. `.model`, `.tokenizer` and `.device` are public so the trainer can share them.

    `max_batch` bounds the rows (samples) decoded together; `share_prefill=False` prefills
    every row separately (for measurement and tests of the shared path)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "hf",
        device: str | torch.device | None = None,
        max_batch: int = 64,
        share_prefill: bool = True,
        threads: int | None = None,
        adapter: str | Path | None = None,
    ):
        if max_batch < 1:
            raise CoevoError(f"max_batch: must be >= 1, got {max_batch}")
        if threads is not None:
            torch.set_num_threads(threads)
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.max_batch = max_batch
        self.share_prefill = share_prefill
        if self.device.type == "cpu":  # keeps freed tensors from staying resident (cpu_memory.py)
            pin_mmap_threshold()
        self.adapter: str | None = None
        self._adapters_loaded = 0
        self._eos = eos_ids(tokenizer, model)
        pad = getattr(tokenizer, "pad_token_id", None)
        # Pad positions are masked out, so any valid id works when the tokenizer has none.
        self._pad = pad if pad is not None else (min(self._eos) if self._eos else 0)
        self._cache_kw = _cache_kwarg(model)
        self._grammars: Any = None
        if adapter is not None:
            self.load_adapter(adapter)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        adapter: str | Path | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        name: str | None = None,
        **opts: Any,
    ) -> "HFBackend":
        """Load a model folder (`save_pretrained` layout) and its tokenizer; `adapter` is a
        peft LoRA folder applied on top. device defaults to cuda when available."""
        try:  # the rest of `opts` go to __init__: a key it does not take fails before loading
            inspect.signature(cls).bind(None, None, **opts)
        except TypeError as e:
            raise BadOptions(f"{e}; options given: {', '.join(sorted(opts))}") from None
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        if not path.exists():
            raise CoevoError(f"{path}: model folder does not exist")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:
            # bf16 on GPU halves memory at no cost in sampling quality; CPU bf16 matmuls are
            # slow, so CPU stays float32 (as the trainer does).
            torch_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        else:
            torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
        except (OSError, ValueError) as e:
            raise CoevoError(f"{path}: cannot load model: {e}") from e
        model.to(dev)
        model.eval()
        return cls(model, tokenizer, name=name or f"hf:{path}", device=dev, adapter=adapter,
                   **opts)

    # -- adapters ---------------------------------------------------------------------------

    def load_adapter(self, path: str | Path | None) -> None:
        """Switch to the LoRA adapter saved (peft format) at `path`; None returns to the base
        weights. The previous adapter is deleted so repeated checkpoints do not pile up."""
        from peft import PeftModel

        if path is None:
            if isinstance(self.model, PeftModel):
                self.model = self.model.unload()
            self.adapter = None
            return
        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise CoevoError(f"{path}: not a LoRA adapter folder (no adapter_config.json)")
        self._adapters_loaded += 1
        new = f"coevo{self._adapters_loaded}"
        if isinstance(self.model, PeftModel):
            old = self.model.active_adapter
            self.model.load_adapter(str(path), adapter_name=new)
            self.model.set_adapter(new)
            if old and old != new and old in self.model.peft_config:
                self.model.delete_adapter(old)
        else:
            self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=new)
        self.model.to(self.device)
        self.model.eval()
        self.adapter = str(path)

    # -- generation -------------------------------------------------------------------------

    def encode_prompt(self, request: Request) -> list[int]:
        return render_prompt(self.tokenizer, request)

    @property
    def grammars(self):
        """The grammar engine over this backend's tokenizer (built on first use)."""
        if self._grammars is None:
            from coevo.models.masks import Grammars

            self._grammars = Grammars(self.tokenizer, self._eos)
        return self._grammars

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        results: list[list[Completion | None]] = [[None] * r.n for r in requests]
        rows: list[_Row] = []
        for i, req in enumerate(requests):
            try:
                prompt = tuple(self.encode_prompt(req))
                matchers = [None] * req.n
                if req.constraint is not None:  # UnsupportedConstraint: this request's error
                    matchers = [self.grammars.matcher(req.constraint) for _ in range(req.n)]
            except Exception as e:  # a bad request is that request's error, not the batch's
                results[i] = [error_completion(_describe(e))] * req.n
                continue
            seed = request_seed(req)
            for j in range(req.n):
                gen = None
                if req.sampling.temperature > 0:
                    gen = torch.Generator(device=self.device)
                    gen.manual_seed(sample_seed(seed, j))
                rows.append(_Row(i, j, prompt, req.sampling, gen, matchers[j]))

        for start in range(0, len(rows), self.max_batch):
            self._run_isolated(rows[start : start + self.max_batch])
        for row in rows:
            results[row.req][row.index] = self._completion(row)
        return results  # type: ignore[return-value]

    def _run_isolated(self, rows: list[_Row]) -> None:
        """Run a chunk; if it fails (e.g. OOM), rerun request by request so only the requests
        that fail on their own become errors."""
        try:
            self._run(rows)
            return
        except Exception as e:
            err = e
        _free_memory(self.device)
        by_req: dict[int, list[_Row]] = {}
        for r in rows:
            by_req.setdefault(r.req, []).append(r)
        if len(by_req) == 1:
            log.warning("generation failed: %s", _describe(err))
            for r in rows:
                r.finish, r.text = "error", _describe(err)
            return
        for group in by_req.values():
            for r in group:
                r.ids, r.logprobs, r.finish, r.text = [], [], None, None
                if r.generator is not None:  # restart the sample's stream from its seed
                    r.generator.manual_seed(r.generator.initial_seed())
                if r.matcher is not None:  # and its grammar from the start
                    r.matcher.reset()
            self._run_isolated(group)

    def _forward(self, ids, mask, pos, cache):
        kwargs = {self._cache_kw: cache}
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         logits_to_keep=1, **kwargs)
        return out.logits[:, -1, :].float()  # [rows, vocab]

    def _run(self, rows: list[_Row]) -> None:
        from transformers import DynamicCache

        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                self._decode(rows, DynamicCache(config=self.model.config))
        finally:
            if was_training:
                self.model.train()

    def _decode(self, rows: list[_Row], cache: Any) -> None:
        dev = self.device
        # Prefill the distinct prompts once; `src[r]` is row r's prompt index.
        if self.share_prefill:
            uniq: dict[tuple[int, ...], int] = {}
            src = [uniq.setdefault(r.prompt, len(uniq)) for r in rows]
            prompts = list(uniq)
        else:
            prompts, src = [r.prompt for r in rows], list(range(len(rows)))
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for k, p in enumerate(prompts):  # left padding: every prompt ends at column width-1
            ids[k, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[k, width - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [U, width]: true positions under padding
        logits = self._forward(ids, mask, pos, cache)  # [U, V]

        index = torch.tensor(src, dtype=torch.long, device=dev)
        cache.batch_select_indices(index)  # [U, ...] -> [B, ...], repeats share the prefill
        logits, mask = logits[index], mask[index]
        next_pos = pos[index, -1] + 1  # [B]
        active = list(rows)
        max_steps = max(r.sampling.max_new_tokens for r in rows)

        for _ in range(max_steps):
            self._mask(logits, active)
            filtered, base = filter_logits(logits, [_settings(r.sampling) for r in active])
            tokens = _sample(filtered, base, active, dev)  # [A]
            chosen = token_logprobs(filtered, base, tokens).tolist()
            keep: list[int] = []
            for k, (row, tok, lp) in enumerate(zip(active, tokens.tolist(), chosen)):
                row.ids.append(tok)
                row.logprobs.append(lp)
                if row.matcher is not None and not row.matcher.consume_token(tok):
                    raise CoevoError(f"grammar rejected its own allowed token {tok}: "
                                     f"{row.matcher.get_error()[:200]}")
                if self._finished(row, tok):
                    continue
                keep.append(k)
            if not keep:
                break
            if len(keep) < len(active):
                sel = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(sel)
                tokens, mask, next_pos = tokens[sel], mask[sel], next_pos[sel]
                active = [active[k] for k in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            logits = self._forward(tokens[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1

    def _mask(self, logits: torch.Tensor, rows: list[_Row]) -> None:
        """Forbid, in place, the tokens each constrained row's grammar does not allow next."""
        from coevo.models.masks import apply_bitmask

        idx = [k for k, r in enumerate(rows) if r.matcher is not None]
        if not idx:
            return
        bitmask = self.grammars.fill([rows[k].matcher for k in idx])
        sel = torch.tensor(idx, dtype=torch.long, device=logits.device)
        sub = logits[sel]  # a copy: [C, V]
        apply_bitmask(sub, bitmask)
        logits[sel] = sub

    def _finished(self, row: _Row, tok: int) -> bool:
        if tok in self._eos:
            row.finish = "stop"
            return True
        if row.matcher is not None and row.matcher.is_stopped():
            row.finish = "stop"  # the grammar is complete: only EOS could follow
            return True
        if row.sampling.stop:
            text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
            cut = first_stop(text, row.sampling.stop)
            if cut >= 0:
                row.finish, row.text = "stop", text[:cut]
                return True
        if len(row.ids) >= row.sampling.max_new_tokens:
            row.finish = "length"
            return True
        return False

    def _completion(self, row: _Row) -> Completion:
        if row.finish == "error":
            return error_completion(row.text or "error", list(row.prompt))
        text = row.text
        if text is None:
            text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
        return Completion(
            text=text, token_ids=row.ids, logprobs=row.logprobs, prompt_ids=list(row.prompt),
            finish_reason=row.finish or "length",
        )


def _settings(s: Sampling) -> Settings:
    return Settings(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)


def _sample(filtered: torch.Tensor, base: torch.Tensor, rows: list[_Row],
            dev: torch.device) -> torch.Tensor:
    """Next token per row ([A, V] logits -> [A] ids): the arg-max of the masked logits for
    temperature 0, else inverse-CDF sampling (vocabulary order) of the filtered distribution
    with one uniform drawn from the row's own generator (never a shared RNG, see the module
    docstring), so how a row is sampled depends only on its own settings and seed."""
    tokens = base.argmax(dim=-1)
    live = [k for k, r in enumerate(rows) if r.generator is not None]
    if live:
        sel = torch.tensor(live, device=dev)
        u = torch.stack([torch.rand((), generator=rows[k].generator, device=dev) for k in live])
        cdf = torch.softmax(filtered[sel], dim=-1).cumsum(-1)  # [P, V]
        # A uniform of exactly 0 must not land on a leading zero-probability token.
        target = (u * cdf[:, -1]).clamp(min=torch.finfo(cdf.dtype).tiny)
        pick = torch.searchsorted(cdf, target[:, None])[:, 0]
        tokens[sel] = pick.clamp(max=filtered.shape[-1] - 1)
    return tokens


def _model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _cache_kwarg(model: Any) -> str:
    """Name of the KV-cache argument: transformers 5.24 renamed `past_key_values` to `cache`
    (the old name still works until 5.40, with a warning); older 5.x only know the old one."""
    base = model
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):  # peft wraps forward(*args, **kwargs): look at the real model
        base = get_base()
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
