"""Environment specs -> environments.

A spec is `<kind>:<argument>[?key=value&...]`:

- `bfcl:<category>` single-turn BFCL, `bfcl-multi:<category>` multi-turn BFCL,
  `rg:<dataset>` a reasoning-gym dataset (query keys and unknown options are the dataset's
  kwargs: `rg:basic_arithmetic?min_terms=2&max_terms=3`), `jsonl:<path>` a task file
  (`jsonl:tasks.jsonl?verifier=numeric&tolerance=0.01`, coevo/envs/jsonl.py),
  `verifiers:pkg.module:factory` a PrimeIntellect verifiers taskset (coevo/envs/verifiers_env.py),
  `openenv:pkg.module:Env` an OpenEnv environment run in-process (coevo/envs/openenv_env.py),
  `textarena:<game id>` a single-player TextArena game, one task per seed (extra `textarena`;
  `textarena:GuessTheNumber-v0?max_number=50`, coevo/envs/textarena_env.py);
- `pkg.module:ClassOrFactory` a plugin: imported and called with the options; the result
  must satisfy `coevo.envs.base.Environment`.

Query values are read as JSON when they parse (`3`, `true`, `[1,2]`), else as strings.
Keyword options passed to `make_env` override query values. An unknown kind fails with the
list of known kinds (`coevo.registry.Registry`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from coevo.envs.base import Environment
from coevo.errors import CoevoError
from coevo.registry import Registry, UnknownName, import_dotted, parse_query

EnvFactory = Callable[..., Environment]
ENV_KINDS: Registry[EnvFactory] = Registry("environment kind")

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def register_env(kind: str) -> Callable[[EnvFactory], EnvFactory]:
    """Decorator: `@register_env("mykind")` on `factory(argument: str, **opts)`."""
    return ENV_KINDS.register(kind)


def _bfcl(category: str, **opts: Any) -> Environment:
    from coevo.envs.bfcl import BFCLEnv

    return BFCLEnv(category, **opts)


def _bfcl_multi(category: str, **opts: Any) -> Environment:
    from coevo.envs.bfcl_multi import BFCLMultiEnv

    return BFCLMultiEnv(category, **opts)


_RG_ENV_OPTIONS = {"size", "seed", "split", "calculator"}


def _rg(dataset: str, **opts: Any) -> Environment:
    from coevo.envs.reasoning_gym import ReasoningGymEnv

    env_opts = {k: opts.pop(k) for k in list(opts) if k in _RG_ENV_OPTIONS}
    kwargs = {**opts.pop("dataset_kwargs", {}), **opts}  # everything else configures the dataset
    return ReasoningGymEnv(dataset, dataset_kwargs=kwargs, **env_opts)


def _jsonl(path: str, **opts: Any) -> Environment:
    from coevo.envs.jsonl import JsonlEnv

    return JsonlEnv(path, **opts)


def _verifiers(target: str, **opts: Any) -> Environment:
    from coevo.envs.verifiers_env import VerifiersEnv

    return VerifiersEnv(target, **opts)


def _openenv(target: str, **opts: Any) -> Environment:
    from coevo.envs.openenv_env import OpenEnvEnv

    return OpenEnvEnv(target, **opts)


def _textarena(game: str, **opts: Any) -> Environment:
    from coevo.envs.textarena_env import TextArenaEnv

    return TextArenaEnv(game, **opts)


ENV_KINDS.add("bfcl", _bfcl)
ENV_KINDS.add("bfcl-multi", _bfcl_multi)
ENV_KINDS.add("rg", _rg)
ENV_KINDS.add("jsonl", _jsonl)
ENV_KINDS.add("verifiers", _verifiers)
ENV_KINDS.add("openenv", _openenv)
ENV_KINDS.add("textarena", _textarena)


def parse_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """(kind or plugin path, argument, query options)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise CoevoError(
            f"environment spec {spec!r} must look like <kind>:<argument> or "
            f"pkg.module:Factory; known kinds: {', '.join(ENV_KINDS.names())}"
        )
    head, rest = spec.split(":", 1)
    arg, _, query = rest.partition("?")
    return head, arg, parse_query(query)


def make_env(spec: str, **opts: Any) -> Environment:
    """Build the environment a spec names (see module docstring)."""
    head, arg, query = parse_spec(spec)
    options = {**query, **opts}
    if head in ENV_KINDS:
        factory = ENV_KINDS.get(head)
        try:
            return factory(arg, **options)
        except TypeError as e:  # an option the environment does not take
            if "argument" not in str(e):
                raise
            raise CoevoError(f"environment {spec!r}: {e}") from None
    if _DOTTED.match(head) and _DOTTED.match(arg):
        return _plugin(spec, head, arg, options)
    try:
        ENV_KINDS.get(head)
    except UnknownName as e:
        raise CoevoError(f"environment {spec!r}: {e} (or a plugin pkg.module:Factory)") from None
    raise AssertionError("unreachable")


def _plugin(spec: str, module_name: str, attr_path: str, options: dict[str, Any]) -> Environment:
    known = ", ".join(ENV_KINDS.names())
    try:
        obj = import_dotted(module_name, attr_path, f"environment {spec!r}")
    except ImportError as e:
        raise CoevoError(
            f"environment {spec!r}: {module_name!r} is neither a known kind ({known}) "
            f"nor an importable module ({e})"
        ) from None
    try:
        env = obj(**options)
    except TypeError as e:
        if "argument" not in str(e):
            raise
        raise CoevoError(f"environment {spec!r}: {e}") from None
    if not isinstance(env, Environment):
        missing = [m for m in ("name", "single_turn", "tasks", "start", "step", "score") if not hasattr(env, m)]
        raise CoevoError(f"environment {spec!r}: {attr_path} returned {type(env).__name__}, "
                         f"which lacks {', '.join(missing)} (see coevo.envs.base.Environment)")
    return env


def spec_name(head: str, arg: str, options: dict[str, Any]) -> str:
    """The spec an environment was built from, options sorted: its `name` (trajectories
    record it, so the same options give the same name whatever their order).

    >>> spec_name("openenv", "m:Env", {"seeds": 3, "reward": "last"})
    'openenv:m:Env?reward=last&seeds=3'
    """
    query = "&".join(f"{k}={v if isinstance(v, str) else json.dumps(v, sort_keys=True)}"
                     for k, v in sorted(options.items()))
    return f"{head}:{arg}" + (f"?{query}" if query else "")


def import_factory(target: str, what: str) -> Callable[..., Any]:
    """`pkg.module:attr` (an adapter's argument) imported: the callable it names. A missing
    module or attribute is one CoevoError line prefixed with `what`."""
    module_name, _, attr = target.partition(":")
    if not (_DOTTED.match(module_name) and _DOTTED.match(attr)):
        raise CoevoError(f"{what}: {target!r} must look like pkg.module:factory")
    try:
        return import_dotted(module_name, attr, what)
    except ImportError as e:
        raise CoevoError(f"{what}: cannot import {module_name!r} ({e})") from None


def env_kinds() -> list[str]:
    return ENV_KINDS.names()
