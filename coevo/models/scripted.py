"""A scripted backend: replays given completion texts (STYLE.md item 9, a stand-in instead of
`if test:` flags). Used by tests of the agent runtime, the gate and the proposers.

With a tokenizer the completions are real-shaped: the prompt is rendered with the same
`render_prompt` the HF backend uses, the reply text is tokenized (plus EOS, as a model would
sample it), `stop` strings cut the text as in the HF backend, and `max_new_tokens` truncates
the tokens with finish_reason "length". Log-probabilities are a fixed `logprob` per token: the
replayed text was not sampled from any distribution, so no value would be more truthful.
Without a tokenizer the completions carry text only and are untrainable, like a hosted API.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from coevo.models.base import Completion, Request
from coevo.models.base import error_completion
from coevo.models.hf import first_stop, render_prompt

Script = Sequence[str] | Callable[[Request, int], str]


class ScriptedBackend:
    """`script` is a list of texts, consumed in order (one per sample), or a callable
    `(request, call_index) -> text`. When a list runs out, completions are errors
    ("script exhausted"), which is how a real backend's failure looks. Every request seen is
    kept in `.requests`."""

    def __init__(self, script: Script, tokenizer: Any = None, *, name: str = "scripted",
                 logprob: float = -1.0):
        self._script = script if callable(script) else list(script)
        self.tokenizer = tokenizer
        self.name = name
        self.logprob = logprob
        self.requests: list[Request] = []
        self._calls = 0

    def _next_text(self, request: Request) -> str | None:
        index = self._calls
        self._calls += 1
        if callable(self._script):
            return self._script(request, index)
        return self._script[index] if index < len(self._script) else None

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        out: list[list[Completion]] = []
        for req in requests:
            self.requests.append(req)
            out.append([self._one(req) for _ in range(req.n)])
        return out

    def _one(self, req: Request) -> Completion:
        text = self._next_text(req)
        if text is None:
            return error_completion("script exhausted: no scripted completion left")
        if self.tokenizer is None:
            cut = first_stop(text, req.sampling.stop)
            return Completion(text=text[:cut] if cut >= 0 else text, trainable=False,
                              finish_reason="stop")
        try:
            prompt = render_prompt(self.tokenizer, req)
        except Exception as e:  # same contract as a real backend: an error completion
            return error_completion(f"{type(e).__name__}: {e}")
        finish = "stop"
        cut = first_stop(text, req.sampling.stop)
        if cut >= 0:
            # Like a sampling backend, the tokens run through the stop string; text stops before.
            end = cut + len(next(s for s in req.sampling.stop if s and text.startswith(s, cut)))
            ids = list(self.tokenizer.encode(text[:end], add_special_tokens=False))
            text = text[:cut]
        else:
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            eos = getattr(self.tokenizer, "eos_token_id", None)
            if eos is not None:
                ids.append(eos)
        limit = req.sampling.max_new_tokens
        if len(ids) > limit:
            ids = ids[:limit]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            finish = "length"
        return Completion(text=text, token_ids=ids, logprobs=[self.logprob] * len(ids),
                          prompt_ids=prompt, finish_reason=finish)
