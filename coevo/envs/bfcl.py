"""BFCL single-turn categories (Berkeley Function-Calling Leaderboard, `bfcl-eval` package).

Tasks are BFCL's own entries (`load_dataset_entry`) joined with their possible answers; the
verifier is BFCL's own `ast_checker`, called the way `eval_runner._evaluate_single_ast_entry`
calls it, on the agent's tool calls converted to BFCL's decoded form `[{"func": {"arg": v}}]`.
(ir)relevance categories follow `eval_runner`'s relevance rule: success = no call (irrelevance)
or at least one call (relevance).

Decoding. The outcome ("BFCL accuracy") decodes the final text exactly as BFCL decodes its
Python prompting format (`coevo.envs.bfcl_decode`, `default_decode_ast_prompting` without its
`eval`): prose around the call list is a decode failure, positional arguments are dropped.
The harness's own parse (`Response.tool_calls`, coevo.envs.callparse: more lenient, a harness
choice) feeds the partial credit and its own detail `lenient_correct` (BFCL's checker on the
harness-parsed calls), next to `bfcl_decodes`. `BFCLEnv(decode="harness")` scores the outcome on
the harness's parse instead, for harnesses that do not write BFCL's Python format (JSON, chat
template tags); such a figure is not BFCL accuracy.

Departures from BFCL's pipeline:
- BFCL `eval`s arithmetic found in arguments; coevo folds arithmetic on numbers only and never
  runs model text (see bfcl_decode.py). The text decoded is the final turn's text as the
  agent's answer extraction returns it (stripped of surrounding whitespace; BFCL strips only
  spaces, newlines and backticks).
- Function names: OpenAI function specs cannot contain ".", so offered tools use BFCL's
  underscore convention (`math.factorial` -> `math_factorial`) and the checker runs with
  `underscore_to_dot=True`, as BFCL does for OpenAI-style models. A call that uses the
  original dotted name is mapped to the underscore name first, so neither spelling is
  penalised.
- `details` (partial credit) are computed here, not by BFCL: decodes, name_offered,
  name_correct, required_args, args_correct (see `partial_credit`).

Importing BFCL: `bfcl_eval.constants.model_config` imports every vendor SDK at module level,
and the checker only reads `MODEL_CONFIG_MAPPING[model].underscore_to_dot`; `bfcl_modules()`
puts a minimal module with that one mapping in `sys.modules` before importing the checker.
BFCL's `eval_config` also creates result/score/lock folders under `BFCL_PROJECT_ROOT` (by
default next to site-packages) at import, and `load_file` takes lock files there: the root is
pointed at a coevo cache folder first, so nothing is written into site-packages or the cwd.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from coevo.envs.base import Feedback, Response, Score, Task
from coevo.envs.bfcl_decode import bfcl_decode
from coevo.envs.splits import SplitSpec, select, split_field
from coevo.errors import CoevoError, InfraError
from coevo.trajectory import ToolCall, ToolResult

# Key under which the checker looks up our "model"; `underscore_to_dot` is read from it.
CHECKER_MODEL = "coevo"

SINGLE_TURN_CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
    "parallel_multiple", "irrelevance", "live_simple", "live_multiple", "live_parallel",
    "live_parallel_multiple", "live_irrelevance", "live_relevance",
)


def _bfcl_root() -> Path:
    base = os.environ.get("COEVO_CACHE_DIR") or str(Path(tempfile.gettempdir()) / "coevo-cache")
    return Path(base) / "bfcl"


@functools.lru_cache(maxsize=1)
def bfcl_modules() -> types.SimpleNamespace:
    """BFCL's data loader, checkers and prompt helper, imported without the vendor SDKs."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(_bfcl_root()))
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)
        stub.__doc__ = "coevo stand-in: only MODEL_CONFIG_MAPPING[...].underscore_to_dot is read"
        stub.MODEL_CONFIG_MAPPING = {}  # type: ignore[attr-defined]
        sys.modules[name] = stub
    mapping = sys.modules[name].MODEL_CONFIG_MAPPING  # the real one too, if it was loaded
    mapping.setdefault(CHECKER_MODEL, types.SimpleNamespace(underscore_to_dot=True))
    try:
        from bfcl_eval import utils
        from bfcl_eval.constants.default_prompts import DEFAULT_SYSTEM_PROMPT_FORMAT
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval import ast_checker as ast_mod
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as mt_checker
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils as mt_utils
        from bfcl_eval.model_handler.utils import formulate_system_prompt
    except ImportError as e:
        raise InfraError(
            f"BFCL is not importable ({e}); install it with `pip install --no-deps bfcl-eval` "
            "plus tree_sitter==0.21.3 tree-sitter-java==0.21.0 tree-sitter-javascript==0.21.4 "
            "overrides"
        ) from e
    return types.SimpleNamespace(
        utils=utils, Language=Language, ast_checker=ast_mod.ast_checker,
        standardize_string=ast_mod.standardize_string, mt_checker=mt_checker,
        mt_utils=mt_utils, formulate_system_prompt=formulate_system_prompt,
        default_prompt_format=DEFAULT_SYSTEM_PROMPT_FORMAT,
    )


# ------------------------------------------------------------------- function docs -> tools

_TYPES = {
    "dict": "object", "object": "object", "float": "number", "double": "number",
    "number": "number", "integer": "integer", "int": "integer", "long": "integer",
    "string": "string", "str": "string", "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array",
}


def openai_name(name: str) -> str:
    """BFCL's underscore convention for names with dots (OpenAI allows [a-zA-Z0-9_-])."""
    return re.sub(r"\.", "_", name)


def _schema(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if k not in ("properties", "items", "type")}
    t = node.get("type")
    if t is not None and t != "any":  # "any": no type constraint at all
        out["type"] = _TYPES.get(t, "string")  # BFCL maps unknown types to string too
    if isinstance(node.get("properties"), dict):
        out["properties"] = {k: _schema(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = _schema(node["items"])
    return out


def to_openai_tool(func: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI function spec (dict->object, float->number,
    tuple->array, any->untyped; descriptions and `required` kept)."""
    params = _schema(func.get("parameters") or {"type": "dict", "properties": {}})
    params["type"] = "object"
    params.setdefault("properties", {})
    return {
        "type": "function",
        "function": {
            "name": openai_name(func["name"]),
            "description": func.get("description", ""),
            "parameters": params,
        },
    }


def bfcl_system_prompt(functions: list[dict[str, Any]], prompt_format: str | None = None) -> str:
    """BFCL's own prompting-model system prompt for these function docs (a seed harness)."""
    m = bfcl_modules()
    return m.formulate_system_prompt(prompt_format or m.default_prompt_format, functions)


# ----------------------------------------------------------------------------------- loading


@functools.lru_cache(maxsize=32)
def _load(category: str) -> tuple[list[dict], dict[str, Any]]:
    """(entries without language hints, {id: possible answer}) for one category."""
    m = bfcl_modules()
    try:
        entries = m.utils.load_dataset_entry(
            category, include_prereq=False, include_language_specific_hint=False
        )
    except FileNotFoundError as e:
        raise CoevoError(f"bfcl: no data for category {category!r} ({e.filename})") from None
    answers: dict[str, Any] = {}
    if "relevance" not in category:  # (ir)relevance categories have no possible answers
        answers = {a["id"]: a["ground_truth"] for a in m.utils.load_ground_truth_entry(category)}
    return entries, answers


def load_entries(category: str) -> tuple[list[dict], dict[str, Any]]:
    entries, answers = _load(category)
    return copy.deepcopy(entries), answers  # BFCL helpers mutate entries in place


def language_of(category: str) -> str:
    return "javascript" if "javascript" in category else "java" if "java" in category else "python"


# --------------------------------------------------------------------------------- scoring


def _norm(value: Any, standardize) -> Any:
    """BFCL's value equivalence: strings standardized, ints equal to floats, recursively."""
    if isinstance(value, str):
        return standardize(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_norm(v, standardize) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v, standardize) for k, v in value.items()}
    return value


def _nested(accepted: Any) -> bool:
    """A nested answer: {key: [options]} (a plain dict value has non-list values)."""
    return isinstance(accepted, dict) and all(isinstance(v, list) for v in accepted.values())


def _matches(value: Any, accepted: Any, standardize) -> bool:
    """Is `value` one acceptable value `accepted`? Possible answers nest: a dict parameter's
    answer is {key: [acceptable values]}, a list-of-dicts parameter's is [{key: [...]}, ...]."""
    if _nested(accepted):
        if not isinstance(value, dict) or any(k not in accepted for k in value):
            return False
        return all(
            ("" in options) if k not in value
            else any(o != "" and _matches(value[k], o, standardize) for o in options)
            for k, options in accepted.items()
        )
    if isinstance(accepted, list) and accepted and all(_nested(a) for a in accepted):
        return (isinstance(value, list) and len(value) == len(accepted)
                and all(_matches(v, a, standardize) for v, a in zip(value, accepted)))
    return _norm(value, standardize) == _norm(accepted, standardize)


def _arg_hits(args: dict[str, Any], expected: dict[str, list], standardize) -> int:
    """How many expected parameters this call gets right ("" in the list = may be omitted)."""
    hits = 0
    for param, accepted in expected.items():
        if param not in args:
            hits += "" in accepted
            continue
        hits += any(v != "" and _matches(args[param], v, standardize) for v in accepted)
    return hits


def _first_value(accepted: Any) -> Any:
    """The first acceptable value, resolving nested dict / list-of-dict answers."""
    if _nested(accepted):
        out = {}
        for k, options in accepted.items():
            given = [o for o in options if o != ""]
            if given:
                out[k] = _first_value(given[0])
        return out
    if isinstance(accepted, list) and accepted and all(_nested(a) for a in accepted):
        return [_first_value(a) for a in accepted]
    return accepted


def reference_calls(answer: list[dict] | None, functions: list[dict] | None = None) -> list[ToolCall]:
    """A possible answer as tool calls, under the offered underscore names: the first
    acceptable value of each argument; an optional argument that may be omitted ("" among
    its options) is left out, which also steps around the few answers that list a parameter
    the function doc lacks. A reference solution for tests and few-shot demos."""
    required = {
        openai_name(f["name"]): set(f.get("parameters", {}).get("required", []))
        for f in functions or []
    }
    calls = []
    for item in answer or []:
        for name, params in item.items():
            args = {}
            for param, options in params.items():
                given = [o for o in options if o != ""]
                if given and ("" not in options or param in required.get(openai_name(name), ())):
                    args[param] = _first_value(given[0])
            calls.append(ToolCall(name=openai_name(name), arguments=args))
    return calls


def partial_credit(
    calls: list[ToolCall], functions: list[dict], answer: list[dict] | None, standardize
) -> dict[str, float]:
    """Partial-credit signals in [0, 1] (names already in underscore form):
    decodes: at least one call; name_offered: every called name is an offered function;
    name_correct: calls paired by name with possible-answer functions / max(#expected, #calls);
    required_args: fraction of calls that give all required parameters of their function;
    args_correct: accepted possible-answer parameters / all of them (unpaired ones count 0)."""
    docs = {openai_name(f["name"]): f for f in functions}
    d = {"decodes": float(bool(calls))}
    if not calls:
        return d | {"name_offered": 0.0, "name_correct": 0.0, "required_args": 0.0, "args_correct": 0.0}
    d["name_offered"] = float(all(c.name in docs for c in calls))
    req = [
        c.name in docs and all(p in c.arguments for p in docs[c.name]["parameters"].get("required", []))
        for c in calls
    ]
    d["required_args"] = sum(req) / len(calls)
    if answer is None:
        return d
    expected = [(openai_name(k), v) for item in answer for k, v in item.items()]
    free = list(range(len(calls)))
    matched, hits, total = 0, 0, sum(len(v) for _, v in expected)
    for name, params in expected:
        same = [i for i in free if calls[i].name == name]
        if not same:
            continue
        best = max(same, key=lambda i: _arg_hits(calls[i].arguments, params, standardize))
        free.remove(best)
        matched += 1
        hits += _arg_hits(calls[best].arguments, params, standardize)
    d["name_correct"] = matched / max(len(expected), len(calls))
    d["args_correct"] = hits / total if total else float(matched > 0)
    return d


def normalize_names(calls: list[ToolCall], functions: list[dict]) -> list[ToolCall]:
    """Map original dotted names to the underscore names the tools were offered under."""
    dotted = {f["name"]: openai_name(f["name"]) for f in functions}
    return [c.model_copy(update={"name": dotted.get(c.name, c.name)}) for c in calls]


def _verdict(category: str, functions: list[dict], answer: list[dict] | None,
             decoded: list[dict] | None) -> tuple[bool, dict[str, Any]]:
    """BFCL's verdict on decoded calls `[{name: {arg: value}}]` (None: the decoder failed),
    as `eval_runner` reaches it: relevance rule, format check, then the AST checker."""
    m = bfcl_modules()
    calls = decoded or []
    if "relevance" in category:  # irrelevance: no call wanted; relevance: some call wanted
        ok = not calls if "irrelevance" in category else bool(calls)
        return ok, {} if ok else {"error": "called a function when none applies" if calls
                                  else "no function call decoded"}
    if not calls:
        return False, {"error": "no function call decoded", "error_type": "ast_decoder:decoder_failed"}
    if not m.utils.is_function_calling_format_output(calls):
        return False, {"error": "decoded output is not [{name: {arg: value}}]"}
    try:
        result = m.ast_checker(
            functions, calls, answer, m.Language(language_of(category)), category, CHECKER_MODEL
        )
    except Exception as e:  # bad model values can trip BFCL's converters: a wrong answer
        result = {"valid": False, "error": [f"checker raised {type(e).__name__}: {e}"],
                  "error_type": "checker_exception"}
    ok = bool(result.get("valid"))
    return ok, {} if ok else {"error": result.get("error"), "error_type": result.get("error_type")}


# BFCL checker error types (`<checker>:<reason>`) -> the normalized kinds a digest groups by;
# matched on the reason first, then on the checker's family (type_error / value_error).
_REASON_KINDS = {
    "wrong_func_name": "wrong_function", "missing_required": "missing_parameter",
    "missing_optional": "missing_parameter", "unexpected_param": "unexpected_parameter",
    "wrong_count": "wrong_call_count", "cannot_find_match": "no_matching_call",
    "decoder_failed": "not_decoded", "force_terminated": "unfinished",
}
_FAMILY_KINDS = {"type_error": "wrong_type", "value_error": "wrong_value",
                 "checker_exception": "checker_error", "ast_decoder": "not_decoded"}


def error_kind(error_type: str | None) -> str:
    """The normalized kind of a BFCL checker `error_type` ("other" when unknown).

    >>> error_kind("type_error:simple"), error_kind("simple_function_checker:wrong_func_name")
    ('wrong_type', 'wrong_function')
    """
    family, _, reason = str(error_type or "").partition(":")
    return _REASON_KINDS.get(reason) or _FAMILY_KINDS.get(family) or "other"


def checker_feedback(why: dict[str, Any], parse_error: str | None = None) -> Feedback:
    """The checker's own verdict on a failed call (`_verdict`'s error and error_type, or the
    multi-turn checker's) as Feedback: kind from `error_kind`, its first message as the line."""
    err = why.get("error")
    text = "; ".join(map(str, err)) if isinstance(err, list) else str(err or "")
    if why.get("error_type"):
        kind = error_kind(why["error_type"])
    elif text == "no function call decoded":
        kind = "no_call"
    elif text.startswith("called a function"):
        kind = "unwanted_call"
    else:
        kind = "bad_format" if text else "other"
    if parse_error and kind in ("not_decoded", "no_call"):
        text += f" (parse error: {parse_error})"
    return Feedback.of(kind, text)


def _offered_names(decoded: list[dict], functions: list[dict]) -> list[dict]:
    """Original dotted names in decoded calls mapped to the offered underscore names."""
    dotted = {f["name"]: openai_name(f["name"]) for f in functions}
    return [{dotted.get(k, k): v for k, v in item.items()} for item in decoded]


def check_single_turn(
    category: str, functions: list[dict], answer: list[dict] | None, response: Response,
    decode: str = "bfcl",
) -> Score:
    """BFCL's verdict on one single-turn response (the final text decoded as BFCL does, or
    with decode="harness" the harness's parsed calls), plus partial credit."""
    m = bfcl_modules()
    calls = normalize_names(response.tool_calls, functions)
    details = partial_credit(calls, functions, answer, m.standardize_string)
    lenient = [{c.name: dict(c.arguments)} for c in calls]
    lenient_ok, _ = _verdict(category, functions, answer, lenient)
    details["lenient_correct"] = float(lenient_ok)
    strict = bfcl_decode(response.text)
    details["bfcl_decodes"] = float(bool(strict))
    decoded = lenient if decode == "harness" else (
        None if strict is None else _offered_names(strict, functions))
    if "relevance" in category:
        details["no_call"] = float(not decoded)
    ok, why = _verdict(category, functions, answer, decoded)
    info: dict[str, Any] = {"decoded": decoded, "decoder": decode, **why}
    if response.parse_error:
        info["parse_error"] = response.parse_error
    feedback = None if ok else checker_feedback(why, response.parse_error)
    return Score(outcome=float(ok), success=ok, details=details, info=info, feedback=feedback)


# ------------------------------------------------------------------------------ environment


class BFCLEnv:
    """`bfcl:<category>` for BFCL's single-turn AST categories."""

    single_turn = True

    def __init__(self, category: str, split: SplitSpec | dict | None = None, limit: int | None = None,
                 decode: str = "bfcl"):
        if decode not in ("bfcl", "harness"):
            raise CoevoError(f"bfcl: decode {decode!r}; expected bfcl (BFCL's own decoder: the "
                             "outcome is BFCL accuracy) or harness (the harness's parse)")
        self.decode = decode
        if category not in SINGLE_TURN_CATEGORIES:
            raise CoevoError(
                f"bfcl: unknown single-turn category {category!r}; known: "
                f"{', '.join(SINGLE_TURN_CATEGORIES)} (multi-turn ones: bfcl-multi:<category>)"
            )
        self.category = category
        # A harness-decoded outcome is not BFCL accuracy: the name says so wherever it is shown.
        self.name = f"bfcl:{category}" + ("?decode=harness" if decode == "harness" else "")
        self.split = split_field(split)
        self.limit = limit  # use only the first `limit` entries (before splitting)
        self._pool: list[Task] | None = None

    def all_tasks(self) -> list[Task]:
        if self._pool is None:
            entries, answers = load_entries(self.category)
            hinted = bfcl_modules().utils.add_language_specific_hint_to_function_doc(
                copy.deepcopy(entries)
            )
            if self.limit is not None:
                entries, hinted = entries[: self.limit], hinted[: self.limit]
            self._pool = [self._task(e, h, answers.get(e["id"])) for e, h in zip(entries, hinted)]
        return self._pool

    def _task(self, entry: dict, hinted: dict, answer: Any) -> Task:
        return Task(
            id=entry["id"],
            env=self.name,
            family=self.category,
            messages=entry["question"][0],
            tools=[to_openai_tool(f) for f in hinted["function"]],
            answer=answer,
            # The checker needs BFCL's own docs (original types, no language hint).
            metadata={"functions": entry["function"], "language": language_of(self.category)},
        )

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        return select(self.all_tasks(), split, self.split, n)

    def start(self, task: Task) -> None:
        return None  # nothing to simulate: single-turn calls are scored, not executed

    def step(self, state: Any, calls: list[ToolCall]) -> list[ToolResult]:
        return [
            ToolResult(name=c.name, content="", error="single-turn task: calls are scored, not executed")
            for c in calls
        ]

    def score(self, task: Task, state: Any, response: Response) -> Score:
        functions = task.metadata.get("functions")
        if functions is None:
            raise InfraError(f"{task.id}: task metadata lacks BFCL 'functions'")
        return check_single_turn(self.category, functions, task.answer, response, self.decode)
