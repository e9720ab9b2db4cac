"""Environments: tasks with verifiers (see base.py for the contract).

`make_env(spec, **opts)` builds one from a spec string: `bfcl:<category>`,
`bfcl-multi:<category>`, `rg:<dataset>[?kwargs]`, `jsonl:PATH`, `verifiers:pkg.module:factory`,
`openenv:pkg.module:Env` or a plugin `pkg.module:Factory`. BFCL, reasoning-gym, verifiers and
OpenEnv are imported only when an environment of theirs is built.
"""

from coevo.envs.base import SPLITS, Environment, Response, Score, Task
from coevo.envs.callparse import ParsedCalls, format_tool_calls, parse_tool_calls
from coevo.envs.registry import env_kinds, make_env, register_env
from coevo.envs.splits import SplitSpec

__all__ = [
    "SPLITS", "Environment", "ParsedCalls", "Response", "Score", "SplitSpec", "Task",
    "env_kinds", "format_tool_calls", "make_env", "parse_tool_calls", "register_env",
]
