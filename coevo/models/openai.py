"""A client for any OpenAI-compatible server (vLLM, llama.cpp server, SGLang, hosted APIs),
over plain httpx.

`messages` requests go to `POST {base}/chat/completions`; `prompt_ids` requests go to
`POST {base}/completions` with the ids as the prompt (vLLM and SGLang accept token-id prompts).
With `token_ids=True` (the default) the request also carries vLLM's extensions
(`return_tokens_as_token_ids`, `return_token_ids`, `top_k`), so a vLLM server returns the sampled
token ids, their log-probabilities and the prompt ids: those completions are trainable. A
server that returns text only (or `token_ids=False`, for APIs that reject unknown fields) gives
`trainable=False` completions, fine for evaluation and proposers.

vLLM's logprobs are raw (pre-temperature) by default in its V1 engine (`logprobs_mode=
"raw_logprobs"`), which is the contract's definition; other servers may report processed ones.

Departures from a plain client: a timeout, a connection failure, an HTTP error or a malformed
body becomes `finish_reason="error"` completions (the contract), after `retries` retries of
errors that may be transient (connection, timeout, 429, 5xx). Requests of one `generate` call
are sent concurrently (up to `max_concurrency`), each as one HTTP call carrying `n`.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from coevo.errors import CoevoError
from coevo.models.base import Completion, Request
from coevo.models.hf import error_completion

_TRANSIENT = {408, 429, 500, 502, 503, 504}


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
        name: str | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise CoevoError(
                f"openai backend: base URL must start with http(s)://, got {base_url!r}")
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
        self.tokenizer = _load_tokenizer(tokenizer)
        self.name = name or f"openai:{model or self.base_url}"
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers)
        self._timeout = timeout

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
        except Exception as e:  # the contract: a failed call is that request's missing data
            return [error_completion(_describe(e), req.prompt_ids)] * req.n

    def _model_name(self) -> str:
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
        body.update(self.extra_body)
        return path, {k: v for k, v in body.items() if v is not None}

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._send("POST", path, body)

    def _send(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
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
                last = CoevoError(f"{url}: HTTP {resp.status_code}: {resp.text[:300]}")
                if resp.status_code in _TRANSIENT:
                    continue
                raise last
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
        # Token-id prompts are what the server saw; chat prompts are rendered server-side, so
        # only the server can say (vLLM: `prompt_token_ids` with return_token_ids).
        prompt_ids = req.prompt_ids or data.get("prompt_token_ids") or []
        out = []
        for c in choices:
            text, ids, lps = _choice_fields(c)
            ids = c.get("token_ids") or ids
            trainable = bool(ids) and ids is not None and len(ids) == len(lps)
            out.append(Completion(
                text=text,
                token_ids=ids if trainable else [],
                logprobs=lps if trainable else [],
                prompt_ids=list(req.prompt_ids or c.get("prompt_token_ids") or prompt_ids),
                finish_reason="length" if c.get("finish_reason") == "length" else "stop",
                trainable=trainable,
            ))
        return out


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
