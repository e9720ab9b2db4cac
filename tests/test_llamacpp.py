"""The llama.cpp backend against a stand-in `llama_cpp` module and model (llama-cpp-python
is an optional extra that compiles from source for ~5 minutes, not installed here): which
grammar each constraint kind gets, grammar caching, refusals, and behaviour log-probs.

The stand-in model follows llama-cpp-python's `Llama.generate`: the prompt is evaluated
(`n_tokens` = its length), each token is sampled from `scores[n_tokens - 1]`, yielded, then
evaluated (`n_tokens` + 1)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from coevo.models.base import Request, Sampling
from coevo.models.constrain import Constraint
from coevo.models.llamacpp import LlamaCppBackend

V, EOS = 10, 9
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


class Grammar:
    def __init__(self, text: str):
        self.text, self.resets = text, 0

    def reset(self):
        self.resets += 1


class LlamaGrammar:
    built: list[tuple[str, bool]] = []

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> Grammar:
        cls.built.append((json_schema, verbose))
        if "$unsupported" in json_schema:
            raise ValueError("Unrecognized schema: $unsupported")
        return Grammar(json_schema)


class FakeLlama:
    def __init__(self, script: list[int]):
        self.script = script
        self.rows = np.random.default_rng(0).normal(0, 2, (len(script), V)).astype(np.float32)
        self.scores = np.zeros((512, V), dtype=np.float32)
        self.n_tokens = 0
        self.calls: list[dict] = []

    def token_eos(self):
        return EOS

    def n_ctx(self):
        return 512

    def set_seed(self, seed):
        pass

    def generate(self, prompt, **kw):
        self.calls.append(kw)
        self.n_tokens = len(prompt)
        for i, tok in enumerate(self.script):
            self.scores[self.n_tokens - 1] = self.rows[i]
            yield tok
            self.n_tokens += 1


class Tok:
    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens=True):
        return "".join("abcdefghi"[i] for i in ids if i != EOS)


@pytest.fixture()
def backend(monkeypatch):
    LlamaGrammar.built = []
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(LlamaGrammar=LlamaGrammar))
    return LlamaCppBackend(FakeLlama([3, 5, EOS]), Tok(), name="llamacpp:test")


def req(constraint=None, n=1, **sampling) -> Request:
    return Request(prompt_ids=[1, 2], n=n, sampling=Sampling(seed=1, **sampling),
                   constraint=constraint)


def test_json_schema_becomes_a_cached_llama_grammar(backend):
    c = Constraint.of_json_schema(SCHEMA)
    out = backend.generate([req(c, n=2), req(c)])
    assert LlamaGrammar.built == [(c.text, False)]  # built once per constraint.key
    grammar = backend.llm.calls[0]["grammar"]
    assert isinstance(grammar, Grammar) and grammar.text == c.text
    assert [k["grammar"] for k in backend.llm.calls] == [grammar] * 3
    assert grammar.resets == 3  # a fresh parse per sample
    assert all(g[0].text == "df" and g[0].token_ids == [3, 5, EOS] for g in out)
    # llama.cpp's GBNF mask is not the llguidance mask the trainer replays.
    assert not any(c.trainable for g in out for c in g)
    assert backend.generate([req()])[0][0].trainable
    assert backend.llm.calls[-1]["grammar"] is None


def test_lark_and_regex_are_refused_before_sampling(backend):
    out = backend.generate([req(Constraint.of_lark('start: "a"')), req(Constraint.of_regex("a+"))])
    for group, kind in zip(out, ["lark", "regex"]):
        assert group[0].finish_reason == "error"
        assert group[0].error == (
            f"UnsupportedConstraint: llama.cpp enforces JSON Schemas only (as GBNF): a {kind} "
            "constraint cannot be honoured by the llamacpp backend (no Lark or regex grammars "
            "in llama-cpp-python); use the hf or vllm backend")
    assert backend.llm.calls == []


def test_a_schema_the_converter_cannot_express_fails_its_request(backend):
    bad = Constraint.of_json_schema({"$unsupported": True}, source="harness x@2")
    out = backend.generate([req(bad, n=2), req()])
    assert [c.finish_reason for c in out[0]] == ["error", "error"]
    assert out[0][0].error == ("UnsupportedConstraint: harness x@2: json_schema constraint: "
                               "llama.cpp's converter failed: ValueError: Unrecognized schema: "
                               "$unsupported")
    assert out[1][0].finish_reason == "stop" and len(backend.llm.calls) == 1


def test_logprobs_are_those_of_the_sampled_distribution(backend):
    # Temperature 0.5 then top-3: llama.cpp's order (top-k before temperature) keeps the same
    # tokens, so the record is the tempered, renormalized log-prob - a trainable completion.
    c = backend.generate([req(temperature=0.5, top_k=3)])[0][0]
    rows = backend.llm.rows
    ref = []
    for row, tok in zip(rows, [3, 5, EOS]):
        x = row.astype(np.float64) / 0.5
        keep = np.argsort(-x)[:3]
        if tok not in keep:  # a token outside the filter stays in the support (logits.py)
            keep = np.append(keep, tok)
        ref.append(x[tok] - np.log(np.exp(x[keep]).sum()))
    assert c.trainable and c.logprobs == pytest.approx(ref, abs=1e-5)
    # Top-p after a temperature other than 1: llama.cpp applies top-p before temperature,
    # coevo after: not the same distribution, so not trainable.
    assert not backend.generate([req(temperature=0.7, top_p=0.9)])[0][0].trainable
