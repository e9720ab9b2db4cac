"""The model-backend contract: the single integration point between coevo and an LLM.

A backend turns a batch of requests (chat messages or token-id prompts) into completions that
carry the exact sampled token ids and their log-probabilities, because RL trains on exactly
what was sampled. Backends that cannot return token ids (a hosted API) mark their completions
`trainable=False`; they are still fine for evaluation and for proposers.

Log-probabilities are those of the sampled token under the distribution it was actually drawn
from: the grammar mask of the request's `constraint`, then temperature, top-k and top-p
(`coevo.models.logits`). The trainer recomputes the policy's log-probabilities under the same
settings and masks, so the importance ratio of an on-policy update is exactly 1. (Temperature 0
records the temperature-1 log-probability with the same filters.)

A request's `constraint` (coevo/models/constrain.py) must be honoured or the request fails
with a message naming why: a backend never samples unconstrained in its place.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from coevo.models.constrain import Constraint


class Sampling(BaseModel):
    """Decoding settings. `seed` makes a request's sample reproducible on its own, whatever
    else is in the batch (the gate compares two arms on the same seeds)."""

    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(0.7, ge=0.0, le=5.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # 0 = off
    max_new_tokens: int = Field(256, ge=1)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None


class Request(BaseModel):
    """One prompt. Give `messages` (rendered with the backend's chat template, generation
    prompt added) or `prompt_ids` (used as they are). `n` samples share one prompt encoding."""

    model_config = ConfigDict(extra="forbid")
    messages: list[dict[str, Any]] | None = None
    prompt_ids: list[int] | None = None
    tools: list[dict[str, Any]] | None = None  # OpenAI function specs, for chat-template tools
    sampling: Sampling = Field(default_factory=Sampling)
    n: int = Field(1, ge=1)
    constraint: Constraint | None = None  # the grammar every completion must match


class Completion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)
    finish_reason: str = "stop"  # stop | length | error
    trainable: bool = True
    error: str | None = None  # set with finish_reason="error": an infrastructure failure


def error_completion(message: str, prompt_ids: list[int] | None = None) -> Completion:
    """A request that failed: data (finish_reason="error", the reason in `error`), not a raise."""
    return Completion(text="", prompt_ids=prompt_ids or [], finish_reason="error",
                      trainable=False, error=message)


@runtime_checkable
class Tokenizer(Protocol):
    """The subset of a Hugging Face tokenizer the runtime relies on."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: list[dict], **kwargs: Any) -> Any: ...


@runtime_checkable
class Backend(Protocol):
    """Contract:
    - `generate(requests)` returns, for each request in order, a list of `n` completions.
    - A failure of the backend itself (timeout, HTTP error, OOM) is reported as a completion
      with finish_reason="error" and `error` set, never raised for one bad request, so one
      episode's failure is that episode's missing data, not the batch's.
    - `tokenizer` is None for backends that only speak text (then completions are untrainable).
    - `name` identifies the model (stored with every trajectory).
    """

    name: str
    tokenizer: Tokenizer | None

    def generate(self, requests: list[Request]) -> list[list[Completion]]: ...
