"""The episode's context: chat messages and the one token sequence the policy acted on.

Algorithm (the "never re-tokenize" rollout used by multi-turn RL systems such as verifiers /
SkyRL): the first prompt is the chat template of [system, demos..., user] with the generation
prompt, tokenized once. Each turn appends the sampled completion ids exactly as sampled (loss
mask 1, their logprobs). An observation (tool results, a reflection nudge) is appended as the
*string suffix* the template adds beyond the text rendered so far - for ChatML
"<|im_end|>\\n<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n" - tokenized on its own
with mask 0. The next request is `Request(prompt_ids=sequence so far)`, so the policy always
continues exactly the ids it produced.

Where this departs from re-rendering the whole chat each turn: the token sequence may differ
from `tokenizer.apply_chat_template(messages)` at turn boundaries (a completion that stopped
without the end-of-turn token gets the template's closing text appended as observation), which
is the point: training sees what the policy saw. Templates that rewrite earlier turns (strip
whitespace of assistant content, drop reasoning) are handled by splicing the template's own
closing text after the sampled text; templates that change *earlier* messages when a new one is
added cannot be continued incrementally and raise `ContextError`.
"""

from __future__ import annotations

from typing import Any

from coevo.errors import CoevoError
from coevo.models.base import Completion, Request, Sampling, Tokenizer
from coevo.models.constrain import Constraint

# A string no model output or template contains: it locates where a template puts the assistant
# content, so the text after it is the template's end-of-turn closing.
_SENTINEL = "\x00coevo-sentinel\x00"


class ContextError(CoevoError):
    """The tokenizer's chat template cannot be extended incrementally."""


def render(tokenizer: Tokenizer, messages: list[dict[str, Any]], *, generation_prompt: bool,
           tools: list[dict[str, Any]] | None = None) -> str:
    """The chat template's text for `messages` (no tokenization)."""
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation_prompt}
    if tools:
        kwargs["tools"] = tools
    try:
        text = tokenizer.apply_chat_template(messages, **kwargs)
    except Exception as exc:  # jinja errors: a role or field the template does not accept
        raise ContextError(f"chat template failed on roles "
                           f"{[m.get('role') for m in messages]}: {exc}") from exc
    if not isinstance(text, str):
        raise ContextError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


class TokenSequence:
    """Messages plus the aligned token sequence of one episode.

    Invariants: `len(ids) == len(mask) == len(logprobs)`; `mask[i] == 1` iff ids[i] was sampled;
    `text` is the string those ids stand for (special tokens included), so the template's
    rendering of the next observation can be cut against it.

    With `tokenizer=None` (a text-only backend) only `messages` are kept and `trainable` is
    False: requests then carry messages, and the backend renders its own template.
    """

    def __init__(self, tokenizer: Tokenizer | None, messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None = None):
        self.tokenizer = tokenizer
        self.tools = tools or None  # passed to the template (chat_template tool format)
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.trainable = tokenizer is not None
        self.text = ""
        self._pending: list[dict[str, Any]] = []  # observation messages not yet tokenized
        if tokenizer is not None:
            self.text = render(tokenizer, self.messages, generation_prompt=True, tools=self.tools)
            self._extend(tokenizer.encode(self.text, add_special_tokens=False), sampled=False)
        self.prompt_len = len(self.ids)

    # -- building ---------------------------------------------------------------------------
    def _extend(self, ids: list[int], *, sampled: bool, logprobs: list[float] | None = None):
        self.ids.extend(ids)
        self.mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def request(self, sampling: Sampling, constraint: Constraint | None = None) -> Request:
        """The next policy request: the token sequence so far (or the messages, text-only)."""
        self.flush()
        if self.tokenizer is None:
            return Request(messages=list(self.messages), tools=self.tools, sampling=sampling,
                           constraint=constraint)
        return Request(prompt_ids=list(self.ids), sampling=sampling, constraint=constraint)

    def add_completion(self, completion: Completion) -> tuple[int, int]:
        """Append a sampled completion; returns the (start, end) span of its ids."""
        if self._pending:
            raise ContextError("a completion arrived before the pending observation was flushed")
        start = len(self.ids)
        self.messages.append({"role": "assistant", "content": completion.text})
        if self.tokenizer is None:
            return start, start
        if not completion.token_ids:
            # A backend with a tokenizer that still gave no ids: keep the text so the episode
            # goes on, but those tokens were not sampled by us as ids -> untrainable, mask 0.
            self.trainable = False
            ids = self.tokenizer.encode(completion.text, add_special_tokens=False)
            self._extend(ids, sampled=False)
            self.text += completion.text
            return start, start
        lps = list(completion.logprobs)
        if len(lps) != len(completion.token_ids):
            self.trainable = False  # no aligned logprobs: the trainer could not use the ratio
            lps = [0.0] * len(completion.token_ids)
        self._extend(list(completion.token_ids), sampled=True, logprobs=lps)
        self.text += self.tokenizer.decode(list(completion.token_ids), skip_special_tokens=False)
        return start, len(self.ids)

    def add_observation(self, messages: list[dict[str, Any]]) -> None:
        """Queue tool / user messages; they are tokenized together with the generation prompt
        when the next request is built (so a reflection nudge joins the tool results)."""
        self._pending.extend(dict(m) for m in messages)

    def flush(self) -> None:
        """Tokenize the pending observation as the template suffix beyond `text` (mask 0)."""
        if not self._pending:
            return
        new, self._pending = self._pending, []
        if self.tokenizer is None:
            self.messages.extend(new)
            return
        suffix = self._suffix(new)
        self.messages.extend(new)
        self.text += suffix
        self._extend(self.tokenizer.encode(suffix, add_special_tokens=False), sampled=False)

    def _suffix(self, new: list[dict[str, Any]]) -> str:
        assert self.tokenizer is not None
        full = render(self.tokenizer, self.messages + new, generation_prompt=True,
                      tools=self.tools)
        if full.startswith(self.text):
            return full[len(self.text):]
        # The template rendered the last assistant turn differently from the sampled text
        # (e.g. trimmed it). Keep the sampled text and splice: the template's closing of an
        # assistant turn (minus what the model already sampled of it) + the new messages.
        before = render(self.tokenizer, self.messages, generation_prompt=False, tools=self.tools)
        if not full.startswith(before):
            raise ContextError(
                "the chat template re-renders earlier messages when a new one is added; "
                "the sequence cannot be extended without re-tokenizing")
        return self._closing() + full[len(before):]

    def _closing(self) -> str:
        """Text the template puts after an assistant message's content, minus the part the
        completion already ended with (a sampled end-of-turn token)."""
        assert self.tokenizer is not None
        probe = self.messages[:-1] + [{"role": "assistant", "content": _SENTINEL}]
        rendered = render(self.tokenizer, probe, generation_prompt=False, tools=self.tools)
        at = rendered.rfind(_SENTINEL)
        closing = rendered[at + len(_SENTINEL):] if at >= 0 else ""
        for k in range(len(closing), 0, -1):  # longest overlap of sampled tail and closing
            if self.text.endswith(closing[:k]):
                return closing[k:]
        return closing

    # -- views ------------------------------------------------------------------------------
    def sampled_positions(self) -> list[int]:
        return [i for i, m in enumerate(self.mask) if m]
