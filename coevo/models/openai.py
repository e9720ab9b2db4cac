"""A client for any OpenAI-compatible server (vLLM, llama.cpp server, SGLang, hosted APIs),
over plain httpx.

`messages` requests go to `POST {base}/chat/completions`; `prompt_ids` requests go to
`POST {base}/completions` with the ids as the prompt (vLLM and SGLang accept token-id prompts).
With `token_ids=True` (the default) the request also carries vLLM's extensions
(`return_tokens_as_token_ids`, `return_token_ids`, `top_k`), so a vLLM server returns the sampled
token ids, their log-probabilities and the prompt ids. A server that returns text only (or
`token_ids=False`, for APIs that reject unknown fields) gives `trainable=False` completions,
fine for evaluation and proposers.

Constraints (`Request.constraint`, coevo/models/dialects.py for the field shapes):
- json_schema on a chat request: OpenAI's `response_format` (json_schema, strict), which
  hosted APIs and vLLM both enforce.
- lark and regex, and any constraint on a token-id prompt: vLLM's request fields, sent only
  to vLLM (`token_ids=True`): `structured_outputs: {grammar | regex | json}` (vLLM >= 0.10.2;
  the `guided_*` fields it replaced were removed in 0.12), or with
  `constraint_fields="guided"` the old `guided_grammar` / `guided_regex` / `guided_json`.
  `constraint_fields="none"` (or `token_ids=False`) sends none: such a request fails.
- A server that rejects the fields (HTTP 400 / 422) gives error completions naming the
  constraint kind, the fields sent and the server's message; it is never retried without
  them. vLLM does not reject fields it does not know: it ignores them (a field of the other
  style included) and samples unconstrained. So every returned text is checked against the
  grammar (`verify_constraints`, with llguidance), and a text that breaks it fails the whole
  request, naming the fields that were probably ignored.

Behaviour log-probs: the contract's are those of the distribution sampled (grammar mask,
temperature, top-k, top-p). A vLLM server reports raw ones unless started with
`--logprobs-mode processed_logprobs`, and its grammar masks are coevo's only with the
llguidance backend and no free JSON whitespace
(`--structured-outputs-config '{"backend": "guidance", "disable_any_whitespace": true}'`).
The client cannot see those flags: say `exact_logprobs=True` when the server runs with both;
otherwise only unconstrained, untempered, unfiltered completions are trainable (the others
keep their token ids, marked `trainable=False`).

Trainable rollouts: with a `tokenizer` (a Hugging Face tokenizer or the path of one:
`openai:URL?tokenizer=PATH` on the command line), the agent runtime renders and tokenizes the
prompt itself and sends token-id prompts, so the trajectory holds the exact prompt ids, the
sampled ids the server returns and their log-probabilities. The tokenizer must be the served
model's. `load_adapter(path)` makes later requests use a LoRA adapter through vLLM's runtime
LoRA API (`POST /load_lora_adapter`, the request's `model` then names the adapter), which is
how the RL stage's rollouts follow its policy step by step (`coevo train --rollout-model`).

Departures from a plain client: a timeout, a connection failure, an HTTP error or a malformed
body becomes `finish_reason="error"` completions (the contract), after `retries` retries of
errors that may be transient (connection, timeout, 429, 5xx). Requests of one `generate` call
are sent concurrently (up to `max_concurrency`), each as one HTTP call carrying `n`.
This module imports neither torch nor llguidance at import time.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from coevo.errors import CoevoError
from coevo.models.base import Completion, Request, error_completion
from coevo.models.constrain import UnsupportedConstraint
from coevo.models.dialects import (response_format, violation, vllm_fields,
                                   vllm_logprobs_exact)

log = logging.getLogger(__name__)

_TRANSIENT = {408, 429, 500, 502, 503, 504}
_REJECTED = {400, 422}  # a request the server refuses as written (e.g. fields it does not take)
CONSTRAINT_FIELDS = ("structured_outputs", "guided", "none")


class HTTPStatusError(CoevoError):
    """The server answered with an HTTP error status (kept, to tell rejections apart)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class OpenAIBackend:
    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key_env: str | None = None,
        timeout: float = 120.0,
        retries: int = 1,
        max_concurrency: int = 8,
        token_ids: bool = True,
        tokenizer: Any = None,
        extra_body: dict[str, Any] | None = None,
        constraint_fields: str = "structured_outputs",
        verify_constraints: bool = True,
        exact_logprobs: bool = False,
        name: str | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise CoevoError(
                f"openai backend: base URL must start with http(s)://, got {base_url!r}")
        if constraint_fields not in CONSTRAINT_FIELDS:
            raise CoevoError(f"openai backend: constraint_fields must be one of "
                             f"{', '.join(CONSTRAINT_FIELDS)}, got {constraint_fields!r}")
        self.base_url = base_url.rstrip("/")
        headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise CoevoError(f"openai backend: environment variable {api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        self.model = model
        self.retries = retries
        self.max_concurrency = max_concurrency
        self.token_ids = token_ids
        self.extra_body = dict(extra_body or {})
        self.constraint_fields = constraint_fields
        self.verify_constraints = verify_constraints
        self.exact_logprobs = exact_logprobs
        self.tokenizer = _load_tokenizer(tokenizer)
        self.name = name or f"openai:{model or self.base_url}"
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers)
        self._timeout = timeout
        self.adapter: str | None = None  # the LoRA folder requests use (load_adapter)
        self._lora: str | None = None  # its name on the server
        self._lora_prefix = f"coevo-{uuid.uuid4().hex[:8]}"
        self._loads = 0

    def close(self) -> None:
        self._client.close()

    # -- generation -------------------------------------------------------------------------

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        if len(requests) <= 1 or self.max_concurrency <= 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def _one(self, req: Request) -> list[Completion]:
        try:
            path, body = self._body(req)
            data = self._post(path, body)
            return self._parse(req, data)
        except HTTPStatusError as e:
            message = str(e)
            if req.constraint is not None and e.status in _REJECTED:
                # Never resent without the fields: that would sample unconstrained.
                sent = ", ".join(self._constraint_body(req)) or "none"
                message = (f"the server rejected a request constrained by a "
                           f"{req.constraint.kind} grammar (sent as: {sent}): {e}")
            return [error_completion(message, req.prompt_ids)] * req.n
        except Exception as e:  # the contract: a failed call is that request's missing data
            return [error_completion(_describe(e), req.prompt_ids)] * req.n

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter in folder `path` for every later request (vLLM's runtime
        LoRA API). The server must read `path` (the same machine or a shared file system) and
        run with `--enable-lora` (`--max-lora-rank` at least the adapter's rank) and
        VLLM_ALLOW_RUNTIME_LORA_UPDATING=True. vLLM keeps adapters by name, so each call
        loads a new name (the RL stage publishes a new folder every step) and unloads the
        previous one."""
        self._model_name()  # the base model, asked before the server lists adapters too
        self._loads += 1
        name = f"{self._lora_prefix}-{self._loads}"
        try:
            self._send("POST", "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)},
                       json_reply=False)
        except CoevoError as e:
            raise CoevoError(
                f"openai backend: the server did not load the LoRA adapter {path} ({e}); a vLLM "
                "server loads adapters at run time when started with --enable-lora and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") from None
        old, self._lora, self.adapter = self._lora, name, str(path)
        if old is not None:
            try:
                self._send("POST", "/unload_lora_adapter", {"lora_name": old}, json_reply=False)
            except CoevoError as e:  # a leftover adapter costs server memory, not correctness
                log.warning("could not unload LoRA adapter %s: %s", old, e)

    def _model_name(self) -> str:
        if self._lora is not None:
            return self._lora
        if self.model is None:
            # One model served (the usual vLLM setup): ask which, once.
            data = self._send("GET", "/models", None)
            try:
                self.model = data["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise CoevoError(f"{self.base_url}/models: no model listed; pass model=") from None
        return self.model

    def _body(self, req: Request) -> tuple[str, dict[str, Any]]:
        s = req.sampling
        body: dict[str, Any] = {
            "model": self._model_name(),
            "n": req.n,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_new_tokens,
        }
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if req.prompt_ids is not None and req.messages is not None:
            raise CoevoError("request: give either messages or prompt_ids, not both")
        if req.prompt_ids is not None:
            path = "/completions"
            body["prompt"] = list(req.prompt_ids)
            body["logprobs"] = 1 if self.token_ids else None
        elif req.messages is not None:
            path = "/chat/completions"
            body["messages"] = req.messages
            if req.tools:
                body["tools"] = req.tools
            if self.token_ids:
                body["logprobs"] = True
        else:
            raise CoevoError("request: neither messages nor prompt_ids given")
        if self.token_ids:
            body["return_tokens_as_token_ids"] = True
            body["return_token_ids"] = True
            if s.top_k > 0:
                body["top_k"] = s.top_k
        body.update(self._constraint_body(req))
        body.update(self.extra_body)
        return path, {k: v for k, v in body.items() if v is not None}

    def _constraint_body(self, req: Request) -> dict[str, Any]:
        """The request fields that carry `req.constraint` (module docstring)."""
        c = req.constraint
        if c is None:
            return {}
        if c.kind == "json_schema" and req.prompt_ids is None:
            return {"response_format": response_format(c)}
        if not self.token_ids or self.constraint_fields == "none":
            what = "a token-id prompt" if req.prompt_ids is not None else "a chat request"
            raise UnsupportedConstraint(
                f"{c.kind} constraint on {what} needs vLLM's structured-output request fields, "
                f"and this backend sends none (token_ids={self.token_ids}, "
                f"constraint_fields={self.constraint_fields!r}); OpenAI's API takes JSON "
                "Schemas on chat requests only")
        fields = vllm_fields(c)
        if self.constraint_fields == "guided":
            return {f"guided_{k}": v for k, v in fields.items()}
        return {"structured_outputs": fields}

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._send("POST", path, body)

    def _send(self, method: str, path: str, body: dict[str, Any] | None,
              json_reply: bool = True) -> Any:
        url = self.base_url + path
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))
            try:
                resp = self._client.request(method, url, json=body)
            except httpx.TimeoutException as e:
                last = CoevoError(
                    f"{url}: timed out after {self._timeout:g} s ({type(e).__name__})")
                continue
            except httpx.HTTPError as e:
                last = CoevoError(f"{url}: {type(e).__name__}: {e}")
                continue
            if resp.status_code >= 400:
                last = HTTPStatusError(f"{url}: HTTP {resp.status_code}: {resp.text[:300]}",
                                       resp.status_code)
                if resp.status_code in _TRANSIENT:
                    continue
                raise last
            if not json_reply:
                return resp.text
            try:
                return resp.json()
            except ValueError:
                raise CoevoError(f"{url}: response is not JSON: {resp.text[:200]!r}") from None
        assert last is not None
        raise last

    def _parse(self, req: Request, data: dict[str, Any]) -> list[Completion]:
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != req.n:
            raise CoevoError(f"server returned {len(choices)} choices for n={req.n}")
        if req.constraint is not None and self.verify_constraints:
            self._verify(req, choices)
        # Token-id prompts are what the server saw; chat prompts are rendered server-side, so
        # only the server can say (vLLM: `prompt_token_ids` with return_token_ids).
        prompt_ids = req.prompt_ids or data.get("prompt_token_ids") or []
        exact = (vllm_logprobs_exact(req.sampling, processed=self.exact_logprobs)
                 and (req.constraint is None or self.exact_logprobs))
        out = []
        for c in choices:
            text, ids, lps = _choice_fields(c)
            ids = c.get("token_ids") or ids
            aligned = bool(ids) and ids is not None and len(ids) == len(lps)
            out.append(Completion(
                text=text,
                token_ids=ids if aligned else [],
                logprobs=lps if aligned else [],
                prompt_ids=list(req.prompt_ids or c.get("prompt_token_ids") or prompt_ids),
                finish_reason="length" if c.get("finish_reason") == "length" else "stop",
                trainable=aligned and exact,
            ))
        return out

    def _verify(self, req: Request, choices: list[dict[str, Any]]) -> None:
        """Raise unless every choice's text follows the constraint (module docstring)."""
        c = req.constraint
        assert c is not None
        for choice in choices:
            msg = choice.get("message")
            if msg is not None and msg.get("tool_calls"):
                continue  # a server-side parser took the text apart: nothing left to check
            text = (msg.get("content") if msg is not None else choice.get("text")) or ""
            why = violation(c, text)
            if why:
                sent = ", ".join(self._constraint_body(req))
                raise CoevoError(
                    f"the server's completion does not follow the {c.kind} constraint ({why}); "
                    f"it may have ignored the field(s) {sent} (vLLM ignores fields it does "
                    f"not know: see constraint_fields); text: {text[:120]!r}")


def _choice_fields(choice: dict[str, Any]) -> tuple[str, list[int], list[float]]:
    """(text, token ids, logprobs) of one choice, for both the chat and completions shapes.
    Token ids come from vLLM's `token_id:N` token strings; anything else yields no ids."""
    lp = choice.get("logprobs") or {}
    if "message" in choice:
        msg = choice["message"] or {}
        text = msg.get("content") or ""
        if msg.get("tool_calls"):
            # A server-side tool parser moved the call out of the text; put it back as JSON so
            # the agent runtime, which parses calls from text, still sees it.
            calls = [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
                     for t in msg["tool_calls"] if t.get("function")]
            text = (text + "\n" if text else "") + json.dumps(calls)
        entries = lp.get("content") or []
        tokens = [e.get("token") for e in entries]
        lps = [e.get("logprob") for e in entries]
    else:
        text = choice.get("text") or ""
        tokens = lp.get("tokens") or []
        lps = lp.get("token_logprobs") or []
    ids: list[int] = []
    for t in tokens:
        if not isinstance(t, str) or not t.startswith("token_id:"):
            return text, [], []
        ids.append(int(t.split(":", 1)[1]))
    if any(x is None for x in lps):
        return text, [], []
    return text, ids, [float(x) for x in lps]


def _load_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None or not isinstance(tokenizer, str):
        return tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError) as e:
        raise CoevoError(f"{tokenizer}: cannot load tokenizer: {e}") from e


def _describe(e: BaseException) -> str:
    return str(e) if isinstance(e, CoevoError) else f"{type(e).__name__}: {e}"
