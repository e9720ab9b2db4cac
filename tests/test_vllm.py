"""The vLLM backend against stand-in `vllm` modules (vLLM needs a CUDA GPU and is not
installed here): the engine options and the exact `SamplingParams` / structured-output objects
built for each constraint kind, in the current API (>= 0.10.2) and the older guided one,
which completions are trainable, and failures isolated to their request.

The stand-ins mirror the names of the real API (vllm/sampling_params.py,
vllm/engine/arg_utils.py): `EngineArgs` is a dataclass, so an engine option this vLLM does not
have is a TypeError, as `LLM(**kwargs)` -> `EngineArgs(**kwargs)` is in vLLM."""

from __future__ import annotations

import dataclasses
import doctest
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from coevo.models import vllm as vllm_backend
from coevo.models.base import Request, Sampling
from coevo.models.constrain import Constraint
from coevo.models.vllm import VLLMBackend

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
BASE_FIELDS = ["model", "enable_lora", "max_lora_rank", "gpu_memory_utilization", "dtype",
               "seed", "max_model_len"]


@dataclass
class StructuredOutputsParams:  # vllm.sampling_params, >= 0.10.2
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):  # vllm.sampling_params, < 0.12
    backend: str | None = None


@dataclass
class Logprob:
    logprob: float


@dataclass
class Output:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    finish_reason: str = "stop"


class FakeLLM:
    """Records what it is built with and asked for; answers two tokens per sample."""

    def __init__(self, engine_args: type, **kwargs: Any):
        self.args = engine_args(**kwargs)  # TypeError on an option this vLLM does not have
        self.kwargs = kwargs
        self.calls: list[tuple[list, list]] = []

    def get_tokenizer(self):
        return None  # prompt_ids requests only

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.calls.append((prompts, params))
        for p in params:
            so = getattr(p, "structured_outputs", None) or getattr(p, "guided_decoding", None)
            if so is not None and "REJECT" in str(so.regex):
                raise ValueError("Grammar error: rejected by the engine")
        return [types.SimpleNamespace(outputs=[
            Output(j, f"out{j}", [7 + j, 8], [{7 + j: Logprob(-0.25)}, {8: Logprob(-1.5)}])
            for j in reversed(range(p.n))]) for p in params]


def install(monkeypatch, version: str, new_api: bool = True, logprobs_mode: bool = True):
    """Stand-in `vllm` packages: >= 0.10.2 (structured outputs) or older (guided decoding)."""
    names = list(BASE_FIELDS)
    names += (["structured_outputs_config"] if new_api
              else ["guided_decoding_backend", "guided_decoding_disable_any_whitespace"])
    names += ["logprobs_mode"] if logprobs_mode else []
    engine_args = dataclasses.make_dataclass(
        "EngineArgs", [(n, Any, field(default=None)) for n in names])
    kw = "structured_outputs" if new_api else "guided_decoding"
    sampling_params = dataclasses.make_dataclass("SamplingParams", [
        (n, Any, field(default=None)) for n in
        ["n", "temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "logprobs", kw]])
    vllm = types.ModuleType("vllm")
    vllm.__version__ = version
    vllm.EngineArgs = engine_args
    vllm.SamplingParams = sampling_params
    vllm.LLM = lambda **kwargs: FakeLLM(engine_args, **kwargs)
    sp = types.ModuleType("vllm.sampling_params")
    sp.SamplingParams = sampling_params
    if new_api:
        sp.StructuredOutputsParams = StructuredOutputsParams
    else:
        sp.GuidedDecodingParams = GuidedDecodingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    lora = types.ModuleType("vllm.lora")
    lora_request = types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = lambda *a: ("lora", *a)
    vllm.sampling_params = sp
    for name, mod in {"vllm": vllm, "vllm.sampling_params": sp, "vllm.inputs": inputs,
                      "vllm.lora": lora, "vllm.lora.request": lora_request}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return sampling_params


def req(constraint: Constraint | None = None, n: int = 1, **sampling) -> Request:
    sampling.setdefault("seed", 5)
    return Request(prompt_ids=[1, 2, 3], n=n, sampling=Sampling(**sampling),
                   constraint=constraint)


def test_engine_is_built_for_llguidance_masks_and_processed_logprobs(monkeypatch):
    install(monkeypatch, "0.34.0")
    b = VLLMBackend("/m", max_lora_rank=8)
    assert b.llm.kwargs == {
        "model": "/m", "enable_lora": True, "max_lora_rank": 8, "gpu_memory_utilization": 0.85,
        "dtype": "auto", "seed": 0, "logprobs_mode": "processed_logprobs",
        "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True}}
    assert b.llguidance and b.processed
    old = install(monkeypatch, "0.9.2", new_api=False, logprobs_mode=False)
    b = VLLMBackend("/m")
    assert b.llm.kwargs["guided_decoding_backend"] == "guidance"
    assert b.llm.kwargs["guided_decoding_disable_any_whitespace"] is True
    assert "logprobs_mode" not in b.llm.kwargs and b.llguidance and not b.processed
    assert b._SamplingParams is old


def test_each_constraint_kind_maps_to_the_exact_structured_outputs_params(monkeypatch):
    SP = install(monkeypatch, "0.34.0")
    b = VLLMBackend("/m")
    lark = 'start: "yes" | "no"'
    reqs = [req(Constraint.of_json_schema(SCHEMA), temperature=0.7, top_k=20, top_p=0.9,
                max_new_tokens=12, stop=["\n"]),
            req(Constraint.of_regex("[0-9]+"), n=2),
            req(Constraint.of_lark(lark)), req()]
    out = b.generate(reqs)
    _, params = b.llm.calls[0]
    schema_text = Constraint.of_json_schema(SCHEMA).text
    assert params[0] == SP(n=1, temperature=0.7, top_p=0.9, top_k=20, max_tokens=12,
                           stop=["\n"], seed=5, logprobs=0,
                           structured_outputs=StructuredOutputsParams(json=schema_text))
    assert params[1].structured_outputs == StructuredOutputsParams(regex="[0-9]+")
    assert params[1].n == 2 and params[1].top_k == -1
    assert params[2].structured_outputs == StructuredOutputsParams(
        grammar="%llguidance {}\n" + lark)
    assert params[3].structured_outputs is None
    # Processed log-probs of llguidance masks: every completion trains, samples in index order.
    assert [[c.text for c in g] for g in out] == [["out0"], ["out0", "out1"], ["out0"], ["out0"]]
    assert all(c.trainable and c.logprobs == [-0.25, -1.5] for g in out for c in g)
    assert out[1][1].token_ids == [8, 8] and out[0][0].prompt_ids == [1, 2, 3]


def test_older_vllm_gets_guided_decoding_and_raw_logprobs_limit_training(monkeypatch):
    SP = install(monkeypatch, "0.9.2", new_api=False, logprobs_mode=False)
    b = VLLMBackend("/m")
    out = b.generate([req(Constraint.of_regex("[a-z]+"), temperature=0.7),
                      req(Constraint.of_json_schema(SCHEMA), temperature=1.0)])
    _, params = b.llm.calls[0]
    assert params[0] == SP(n=1, temperature=0.7, top_p=1.0, top_k=-1, max_tokens=256,
                           stop=None, seed=5, logprobs=0,
                           guided_decoding=GuidedDecodingParams(regex="[a-z]+"))
    assert params[1].guided_decoding == GuidedDecodingParams(
        json=Constraint.of_json_schema(SCHEMA).text)
    # Raw log-probs (masked, untempered): right at temperature 1 only.
    assert not out[0][0].trainable and out[0][0].token_ids == [7, 8]
    assert out[1][0].trainable


def test_logprobs_mode_without_top_k_top_p_is_not_processed(monkeypatch):
    # 0.10.0 / 0.10.1 had logprobs_mode, but "processed" stopped before top-k / top-p.
    install(monkeypatch, "0.10.1", new_api=False)
    b = VLLMBackend("/m")
    assert b.llm.kwargs["logprobs_mode"] == "processed_logprobs" and not b.processed
    filtered, greedy = b.generate([req(temperature=1.0, top_k=5), req(temperature=0.0)])
    assert not filtered[0].trainable and greedy[0].trainable


def test_another_grammar_backend_refuses_lark_and_untrains_the_rest(monkeypatch):
    install(monkeypatch, "0.34.0")
    b = VLLMBackend("/m", structured_outputs_config={"backend": "xgrammar"})
    assert b.llm.kwargs["structured_outputs_config"] == {"backend": "xgrammar"}
    lark, regex, free = b.generate([req(Constraint.of_lark('start: "a"')),
                                    req(Constraint.of_regex("a+")), req()])
    assert lark[0].finish_reason == "error"
    assert "lark constraints need vLLM's guidance (llguidance)" in lark[0].error
    assert regex[0].error is None and not regex[0].trainable
    assert free[0].trainable
    assert len(b.llm.calls[0][1]) == 2  # the lark request never reached the engine


def test_bad_and_rejected_constraints_fail_alone(monkeypatch):
    install(monkeypatch, "0.34.0")
    b = VLLMBackend("/m")
    uncompilable = Constraint.of_lark("start: undefined_rule")
    out = b.generate([req(uncompilable), req(Constraint.of_regex("REJECT")), req(n=2)])
    assert out[0][0].finish_reason == "error"
    assert out[0][0].error.startswith("UnsupportedConstraint: lark constraint: ")
    assert out[1][0].finish_reason == "error" and out[1][0].error == (
        "ValueError: Grammar error: rejected by the engine "
        "(a request constrained by a regex grammar)")
    assert out[1][0].prompt_ids == [1, 2, 3]
    assert [c.text for c in out[2]] == ["out0", "out1"] and out[2][0].trainable
    # The batch failed once, then each request ran alone (the uncompilable one never ran).
    assert [len(p) for _, p in b.llm.calls] == [2, 1, 1]


def test_version_doctest():
    assert doctest.testmod(vllm_backend).failed == 0
