"""Rubric criteria as reward callables, and the reward that combines them with the outcome.

    reward = outcome_weight * outcome + sum_i(w_i * c_i) / sum_i(w_i)

`outcome` is the environment verifier's score; `c_i` in [0, 1] is criterion i's score. A
criterion that cannot be scored (an LLM judge that gave no number, a python check that raised,
a detail the environment does not report) is *missing*: it is left out of the criteria dict and
drops out of both sums, never a zero. Each kind is a plain function with a doctest (in the
style of trl's `rewards/format_rewards.py`); `score_rubric` dispatches a rubric's criteria to
them.

Departure from trl's reward functions, which score a batch of completions at once: these score
one episode and see the task and the verifier's `Score`, because partial credit here (e.g. BFCL
"every called name is an offered function") is defined relative to the task's offered tools.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import jsonschema

from coevo.envs.base import Response, Score, Task
from coevo.errors import CoevoError
from coevo.models.base import Request, Sampling
from coevo import linear_regex
from coevo.checks import resolve_check
from coevo.trajectory import ToolCall

log = logging.getLogger(__name__)


# -- criterion functions -----------------------------------------------------------------------
def outcome_reward(score: Score, detail: str | None = None) -> float | None:
    """The verifier's outcome, or one of its partial-credit details (None if not reported).

    >>> s = Score(outcome=0.0, success=False, details={"decodes": 1.0})
    >>> outcome_reward(s), outcome_reward(s, "decodes"), outcome_reward(s, "name_correct")
    (0.0, 1.0, None)
    """
    if detail is None:
        return float(score.outcome)
    value = score.details.get(detail)
    return None if value is None else _unit(value)


def regex_reward(text: str, pattern: str, must_match: bool = True,
                 ignore_case: bool = False) -> float:
    """1.0 when `pattern` is found in `text` (or, with must_match=False, when it is not).

    >>> regex_reward("Final answer: 42", r"answer:\\s*\\d+", ignore_case=True)
    1.0
    >>> regex_reward("I cannot help with that.", r"cannot help", must_match=False)
    0.0
    """
    # RE2, not `re`: the pattern may come from a proposal, and RE2 matches in linear time.
    return float(linear_regex.search(pattern, text or "", ignore_case) == must_match)


def parse_json_value(text: str) -> Any:
    """The JSON value in `text`: the whole text, a fenced block, or the first object/array.

    >>> parse_json_value('Sure: ```json\\n{"a": 1}\\n```')
    {'a': 1}
    >>> parse_json_value("no json here") is None
    True
    """
    text = (text or "").strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    for candidate in ([fenced.group(1).strip()] if fenced else []) + [text]:
        try:
            return json.loads(candidate)
        except (json.JSONDecodeError, ValueError):
            pass
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            return decoder.raw_decode(text, m.start())[0]
        except json.JSONDecodeError:
            continue
    return None


def json_schema_reward(text: str, schema: dict[str, Any]) -> float:
    """1.0 when the JSON in `text` validates against `schema`, else 0.0 (no JSON: 0.0).

    >>> schema = {"type": "object", "required": ["city"]}
    >>> json_schema_reward('{"city": "Paris"}', schema), json_schema_reward('{"town": 1}', schema)
    (1.0, 0.0)
    """
    value = parse_json_value(text)
    if value is None:
        return 0.0
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return float(cls(schema).is_valid(value))


def _fn(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["function"] if isinstance(spec.get("function"), dict) else spec


def _names(name: str) -> set[str]:
    # BFCL offers `math.factorial` as `math_factorial` (OpenAI names allow no dots).
    return {name, name.replace(".", "_")}


def tool_called_reward(calls: Sequence[ToolCall], offered: Sequence[dict[str, Any]], *,
                       name_in_offered: bool = False, name: str | None = None,
                       required_args: bool = False, args_match: bool = False,
                       details: dict[str, float] | None = None) -> float | None:
    """Properties of the final turn's calls; the constraints asked for are multiplied (all
    must hold). No constraint: 1.0 for any decoded call. name_in_offered: every called name is
    an offered function (so copying a demo's call of another function earns nothing);
    name: some call has exactly this name; required_args: fraction of calls giving all required
    parameters of their offered function; args_match: the environment's own argument-value
    detail ("args_correct" / "args_match"), None (missing) when it reports none.

    >>> offered = [{"name": "area", "parameters": {"required": ["base", "height"]}}]
    >>> ok = [ToolCall(name="area", arguments={"base": 2, "height": 3})]
    >>> copied = [ToolCall(name="demo_function", arguments={"x": 1})]
    >>> tool_called_reward(ok, offered, name_in_offered=True, required_args=True)
    1.0
    >>> tool_called_reward(copied, offered), tool_called_reward(copied, offered, name_in_offered=True)
    (1.0, 0.0)
    >>> tool_called_reward(ok, offered, args_match=True, details={"args_correct": 0.5})
    0.5
    """
    if not calls:
        return 0.0
    docs = {n: _fn(s) for s in offered for n in _names(str(_fn(s).get("name", "")))}
    score = 1.0
    if name_in_offered:
        score *= float(all(_names(c.name) & docs.keys() for c in calls))
    if name is not None:
        score *= float(any(_names(c.name) & _names(name) for c in calls))
    if required_args:
        def complete(c: ToolCall) -> bool:
            doc = next((docs[n] for n in _names(c.name) if n in docs), None)
            if doc is None:
                return False
            required = (doc.get("parameters") or {}).get("required") or []
            return all(p in c.arguments for p in required)
        score *= sum(complete(c) for c in calls) / len(calls)
    if args_match:
        d = details or {}
        value = d.get("args_correct", d.get("args_match"))
        if value is None:
            return None
        score *= _unit(value)
    return score


def python_reward(ref: str, task: Task, response: Response, score: Score,
                  trajectory: Any = None, kwargs: dict[str, Any] | None = None) -> float | None:
    """Call the registered check `ref` (coevo.checks) with (task, response, score[,
    trajectory=...], **kwargs); a number in [0, 1] (bools count), None = missing. An exception
    inside the check is missing data (logged), since it says nothing about the agent; so is a
    check that is not registered or cannot be imported (logged once): loading and proposal
    checks refuse those, and one that slipped through must not stop a run or its resume.

    >>> python_reward("coevo.checks:answer_is_number", Task(id="t", env="e", messages=[]),
    ...               Response(text="42"), Score(outcome=1.0, success=True))
    1.0
    """
    try:
        fn = resolve_check(ref)
    except CoevoError as exc:
        if ref not in _WARNED:
            _WARNED.add(ref)
            log.warning("python criterion scored as missing: %s", exc)
        return None
    extra = dict(kwargs or {})
    try:
        params = inspect.signature(fn).parameters
        if "trajectory" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            extra["trajectory"] = trajectory
    except (TypeError, ValueError):
        pass
    try:
        value = fn(task, response, score, **extra)
    except Exception as exc:  # the check's own bug: missing, not the agent's zero
        log.warning("python criterion %s raised %s: %s", ref, type(exc).__name__, exc)
        return None
    if value is None:
        return None
    if not isinstance(value, (int, float)):
        log.warning("python criterion %s returned %r, not a number", ref, value)
        return None
    return _unit(value)


_WARNED: set[str] = set()  # checks already reported as unusable


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_judge_score(text: str, scale: int) -> float | None:
    """The judge's first number, as a fraction of `scale`; None if absent or out of range.

    >>> parse_judge_score("Score: 4/5 because ...", 5)
    0.8
    >>> parse_judge_score("I would rate it highly.", 5) is None
    True
    >>> parse_judge_score("7", 5) is None
    True
    """
    m = _NUMBER.search(text or "")
    if m is None:
        return None
    value = float(m.group(0))
    if not 0 <= value <= scale or math.isnan(value):
        return None
    return value / scale


def judge_prompt(question: str, task: Task, response: Response, scale: int) -> list[dict]:
    asked = "\n".join(str(m.get("content", "")) for m in task.messages if m.get("role") == "user")
    calls = "\n".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in
                      response.tool_calls)
    answer = response.text + (f"\nTool calls:\n{calls}" if calls else "")
    return [
        {"role": "system", "content": "You grade an assistant's response. Reply with one "
                                      f"integer from 0 to {scale} and nothing else."},
        {"role": "user", "content": f"Task:\n{asked}\n\nResponse:\n{answer}\n\n"
                                    f"Question: {question}\nScore (0-{scale}):"},
    ]


async def llm_judge_reward(judge: Any, question: str, task: Task, response: Response,
                           scale: int = 5) -> float | None:
    """Ask `judge` (a Backend, or a DynamicBatcher with an async generate) `question` about
    the response; greedy, short. No number, an error completion or a crash: None (missing)."""
    request = Request(messages=judge_prompt(question, task, response, scale),
                      sampling=Sampling(temperature=0.0, max_new_tokens=16))
    try:
        if inspect.iscoroutinefunction(judge.generate):
            out = await judge.generate(request)
        else:
            out = (await asyncio.to_thread(judge.generate, [request]))[0]
    except Exception as exc:
        log.warning("llm judge failed: %s: %s", type(exc).__name__, exc)
        return None
    completion = out[0] if isinstance(out, list) else out
    if completion.finish_reason == "error":
        return None
    return parse_judge_score(completion.text, scale)


def _unit(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


# -- the rubric --------------------------------------------------------------------------------
def _final_text(response: Response, trajectory: Any) -> str:
    turns = getattr(trajectory, "turns", None)
    return turns[-1].text if turns else response.text


async def ascore_rubric(rubric: Any, task: Task, response: Response, env_score: Score, *,
                        judge: Any = None, trajectory: Any = None) -> dict[str, float]:
    """{criterion id: score in [0, 1]} for every criterion that could be scored."""
    out: dict[str, float] = {}
    for c in rubric.criteria:
        p = c.params
        value: float | None
        if c.kind == "outcome":
            value = outcome_reward(env_score, p.detail)
        elif c.kind == "regex":
            text = response.text if p.target == "answer" else _final_text(response, trajectory)
            value = regex_reward(text, p.pattern, p.must_match, p.ignore_case)
        elif c.kind == "json_schema":
            text = response.text if p.target == "answer" else _final_text(response, trajectory)
            value = json_schema_reward(text, p.json_schema)
        elif c.kind == "tool_called":
            value = tool_called_reward(
                response.tool_calls, task.tools, name_in_offered=p.name_in_offered, name=p.name,
                required_args=p.required_args, args_match=p.args_match,
                details=env_score.details)
        elif c.kind == "python":
            value = python_reward(p.callable, task, response, env_score, trajectory, p.kwargs)
        elif c.kind == "llm_judge":
            if judge is None:
                raise CoevoError(f"rubric {rubric.name!r}: criterion {c.id!r} is an llm_judge "
                                 "but no judge backend was given")
            value = await llm_judge_reward(judge, p.question, task, response, p.scale)
        else:  # the rubric model's union makes this unreachable for validated rubrics
            raise CoevoError(f"rubric {rubric.name!r}: criterion {c.id!r}: unknown kind {c.kind!r}")
        if value is not None:
            out[c.id] = value
    return out


def score_rubric(rubric: Any, task: Task, response: Response, env_score: Score, *,
                 judge: Any = None, trajectory: Any = None) -> dict[str, float]:
    """Synchronous `ascore_rubric` (for callers outside an event loop)."""
    return asyncio.run(ascore_rubric(rubric, task, response, env_score, judge=judge,
                                     trajectory=trajectory))


def paid_criteria(rubric: Any, criteria: dict[str, float]) -> dict[str, float]:
    """The criterion scores a predicates rubric pays (DARS-style prerequisites): a criterion
    whose prerequisites all passed (their paid score >= 0.5) keeps its score, one with a failed
    prerequisite pays 0, one with a missing prerequisite is missing. Without prerequisites the
    scores are returned as they are.

    >>> from coevo.assets.rubric import Rubric
    >>> r = Rubric.model_validate({"name": "r", "criteria": [
    ...     {"id": "calls", "kind": "tool_called"},
    ...     {"id": "named", "kind": "tool_called", "requires": ["calls"]},
    ...     {"id": "args", "kind": "tool_called", "requires": ["named"]}]})
    >>> paid_criteria(r, {"calls": 1.0, "named": 0.0, "args": 1.0})
    {'calls': 1.0, 'named': 0.0, 'args': 0.0}
    >>> paid_criteria(r, {"named": 1.0, "args": 1.0})  # calls missing: so are the others
    {}
    """
    from coevo.assets.rubric import PASS, prerequisite_order

    by_id = {c.id: c for c in rubric.criteria}
    if not any(c.requires for c in rubric.criteria):
        return dict(criteria)
    paid: dict[str, float] = {}
    for cid in prerequisite_order(rubric.criteria):
        if cid not in criteria or any(p not in paid for p in by_id[cid].requires):
            continue  # missing, or a prerequisite is
        ok = all(paid[p] >= PASS for p in by_id[cid].requires)
        paid[cid] = criteria[cid] if ok else 0.0
    return {k: paid[k] for k in criteria if k in paid}


def reward(rubric: Any, outcome: float | None, criteria: dict[str, float]) -> float | None:
    """outcome_weight * outcome + sum(w_i c_i) / sum(w_i) over the criteria present (as
    `paid_criteria` pays them when criteria have prerequisites).

    No rubric: the outcome itself. No outcome (the verifier did not run): None.

    >>> from coevo.assets.rubric import Rubric
    >>> r = Rubric.model_validate({"name": "r", "outcome_weight": 1.0, "criteria": [
    ...     {"id": "decodes", "kind": "tool_called", "weight": 1.0},
    ...     {"id": "named", "kind": "tool_called", "weight": 3.0,
    ...      "params": {"name_in_offered": True}}]})
    >>> reward(r, 0.0, {"decodes": 1.0, "named": 0.0}), reward(r, 1.0, {"decodes": 1.0})
    (0.25, 2.0)
    """
    if outcome is None:
        return None
    if rubric is None:
        return float(outcome)
    weights = {c.id: c.weight for c in rubric.criteria}
    present = [(weights[k], v) for k, v in paid_criteria(rubric, criteria).items() if k in weights]
    total_w = sum(w for w, _ in present)
    partial = sum(w * v for w, v in present) / total_w if total_w > 0 else 0.0
    return rubric.outcome_weight * float(outcome) + partial
