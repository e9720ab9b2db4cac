"""A `Constraint` in the dialects of engines that enforce it themselves: vLLM's structured
outputs (offline `SamplingParams` and server request fields) and OpenAI's `response_format`;
when their reported log-probs are coevo's behaviour log-probs; and a check that a returned
text follows the grammar.

vLLM compiles grammars with llguidance when its structured-output backend is `guidance`, the
engine coevo uses everywhere (coevo/models/constrain.py), so the masks it samples under are
the ones the trainer replays - provided JSON is compiled the same way (no free whitespace:
vLLM's `disable_any_whitespace`). Its other backends (xgrammar, outlines) speak other
dialects: a Lark grammar handed to them would be read as their EBNF.

vLLM's `grammar` field takes "Lark or GBNF" and tells them apart by looking for a `start:`
line (llguidance's `any_to_lark`); a valid Lark grammar written `?start:` would be misread as
GBNF. `%llguidance {}` (an empty options directive) marks the text as Lark for every reader.

This module imports neither torch nor llguidance; `violation` imports llguidance when called.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from coevo.models.base import Sampling
from coevo.models.constrain import Constraint, UnsupportedConstraint

_LLG_DIRECTIVE = re.compile(r"(?m)^\s*%llguidance\b")


def vllm_fields(constraint: Constraint) -> dict[str, str]:
    """The constraint as vLLM's structured-output fields: the keyword of
    `StructuredOutputsParams` (the server's `structured_outputs` object) and its value.

    >>> vllm_fields(Constraint.of_regex("[0-9]+"))
    {'regex': '[0-9]+'}
    >>> vllm_fields(Constraint.of_lark('start: "a"'))
    {'grammar': '%llguidance {}\\nstart: "a"'}
    """
    if constraint.kind == "json_schema":
        return {"json": constraint.text}  # the text: property order is part of the grammar
    if constraint.kind == "regex":
        return {"regex": constraint.text}
    text = constraint.text
    if not _LLG_DIRECTIVE.search(text):
        text = "%llguidance {}\n" + text
    return {"grammar": text}


def response_format(constraint: Constraint) -> dict[str, Any]:
    """OpenAI's structured-output request field for a json_schema constraint (strict: the
    server must enforce the schema, not merely aim for it).

    >>> response_format(Constraint.of_json_schema({"type": "object"}, source="harness x@1"))
    ... # doctest: +NORMALIZE_WHITESPACE
    {'type': 'json_schema',
     'json_schema': {'name': 'harness_x_1', 'schema': {'type': 'object'}, 'strict': True}}
    """
    if constraint.kind != "json_schema":
        raise UnsupportedConstraint(
            f"response_format carries JSON Schemas only, not {constraint.kind}")
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", constraint.source).strip("_")[:64] or "output"
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": constraint.json_schema, "strict": True}}


def vllm_logprobs_exact(sampling: Sampling, processed: bool) -> bool:
    """Whether the log-prob vLLM reports for a sampled token is coevo's behaviour log-prob
    (coevo.models.logits) under `sampling`. The grammar mask is applied to the logits before
    vLLM's sampler, so both of its modes include it. `processed` (logprobs_mode
    "processed_logprobs", vLLM >= 0.10.2) adds temperature, top-k and top-p; raw log-probs
    match only an untempered, unfiltered draw. At temperature 0 vLLM drops top-k / top-p
    while coevo records the temperature-1 log-prob with them (logits.py).

    >>> vllm_logprobs_exact(Sampling(temperature=0.7, top_k=20), processed=True)
    True
    >>> vllm_logprobs_exact(Sampling(temperature=0.7), processed=False)
    False
    >>> vllm_logprobs_exact(Sampling(temperature=0.0, top_p=0.9), processed=True)
    False
    """
    unfiltered = sampling.top_k == 0 and sampling.top_p >= 1.0
    if sampling.temperature == 0:
        return unfiltered
    return processed or (unfiltered and sampling.temperature == 1.0)


def violation(constraint: Constraint, text: str) -> str:
    """"" when `text` is a prefix of a string the constraint accepts (a completion cut by a
    stop string or max_tokens is still a prefix), else the grammar engine's reason. JSON is
    checked with free whitespace: another engine's JSON (a server's default) may pad it."""
    import llguidance

    m = llguidance.LLMatcher(_byte_tokenizer(), _check_grammar(constraint.kind, constraint.text),
                             log_level=0)
    if m.consume_tokens(list(text.encode("utf-8"))) and not m.is_error():
        return ""
    return " ".join(m.get_error().split("<state>")[0].split())[:300] or "rejected"


class _Bytes:
    """A tokenizer whose token i is byte i (256 ends the text): grammars checked on text."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"</s>"]
    special_token_ids = [256]

    def __call__(self, s: str | bytes) -> list[int]:
        return list(s if isinstance(s, bytes) else s.encode("utf-8"))


@functools.lru_cache(maxsize=1)
def _byte_tokenizer() -> Any:
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


@functools.lru_cache(maxsize=256)
def _check_grammar(kind: str, text: str) -> str:
    from llguidance import LLMatcher

    if kind == "json_schema":
        return LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": True})
    if kind == "lark":
        return LLMatcher.grammar_from_lark(text)
    return LLMatcher.grammar_from_regex(text)
