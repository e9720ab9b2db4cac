"""Answer checks for task files (`jsonl:PATH`): plain callables, looked up by name.

A check is `check(response, answer, **options) -> float | bool | Score`: `response` is what
the agent produced (coevo.envs.base.Response: the extracted answer text and the final turn's
tool calls), `answer` the task line's `answer`. A float is the outcome in [0, 1]; success means
outcome 1. Built in:

- exact: the answer text equals `answer` (both stripped);
- normalized: equal after lower-casing, dropping punctuation and collapsing whitespace;
- regex: `answer` is a pattern the whole text must match (RE2, coevo/linear_regex.py: a task
  file is untrusted input, and RE2 matches in linear time);
- numeric: the last number in the text is within `tolerance` (absolute, default 1e-6) of
  `answer`;
- tool_calls: the final turn's calls match `answer` (a call `{"name", "arguments"}` or a list
  of them) one to one, in any order; an expected argument must be present with a matching
  value, where an object matches when it contains the expected keys (JSON subset) and extra
  arguments the answer does not name are allowed.

A plugin `pkg.module:function` with the same signature is imported by name
(`coevo.registry.import_dotted`), as environment plugins are.

A failed check gets the verifier's diagnosis (`Score.feedback`): the built-in checks say what
was expected and what was given (`explain`); a plugin may return a Score with its own
feedback, else the line names the check and the score.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Callable
from typing import Any

from coevo.envs.base import Feedback, Response, Score
from coevo.errors import CoevoError, InfraError
from coevo.linear_regex import compile_pattern
from coevo.registry import Registry, import_dotted

Check = Callable[..., "float | bool | Score"]
CHECKS: Registry[Check] = Registry("answer check")
# The options each built-in check takes (a task file naming another is refused at load).
CHECK_OPTIONS: dict[str, frozenset[str]] = {}
_PLUGIN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _check(name: str, *options: str) -> Callable[[Check], Check]:
    CHECK_OPTIONS[name] = frozenset(options)
    return CHECKS.register(name)


@_check("exact")
def exact(response: Response, answer: Any) -> float:
    """The stripped texts are equal.

    >>> exact(Response(text=" Paris "), "Paris")
    1.0
    """
    return float(response.text.strip() == str(answer).strip())


def normalize(text: str) -> str:
    """Lower case, no punctuation, single spaces.

    >>> normalize("  The  Eiffel-Tower! ")
    'the eiffeltower'
    """
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(text.split())


@_check("normalized")
def normalized(response: Response, answer: Any) -> float:
    """Equal after `normalize`.

    >>> normalized(Response(text="the eiffel tower."), "The Eiffel  Tower")
    1.0
    """
    return float(normalize(response.text) == normalize(str(answer)))


@_check("regex", "ignore_case")
def regex(response: Response, answer: Any, ignore_case: bool = False) -> float:
    """The whole stripped text matches the pattern `answer` (RE2).

    >>> regex(Response(text="42 km"), r"\\d+\\s*km"), regex(Response(text="about 42 km"), r"\\d+\\s*km")
    (1.0, 0.0)
    """
    return float(compile_pattern(f"^(?:{answer})$", ignore_case).search(response.text.strip()) is not None)


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands commas allowed), or None.

    >>> last_number("It is 1,250.5 meters, not 3"), last_number("none")
    (3.0, None)
    """
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


@_check("numeric", "tolerance")
def numeric(response: Response, answer: Any, tolerance: float = 1e-6) -> float:
    """The last number in the text is within `tolerance` of `answer`.

    >>> numeric(Response(text="The answer is 3.1416"), 3.14159, tolerance=0.001)
    1.0
    """
    got = last_number(response.text)
    return float(got is not None and math.isfinite(got) and abs(got - float(answer)) <= tolerance)


def json_subset(expected: Any, got: Any) -> bool:
    """Whether `got` matches `expected`: objects by the expected keys (extra keys allowed),
    lists item by item, numbers by value (1 == 1.0), anything else by equality.

    >>> json_subset({"route": {"from": "OSL"}}, {"route": {"from": "OSL", "to": "FCO"}, "n": 2})
    True
    >>> json_subset({"route": {"from": "OSL"}}, {"route": {"from": "BGO"}})
    False
    """
    if isinstance(expected, dict):
        return isinstance(got, dict) and all(k in got and json_subset(v, got[k])
                                             for k, v in expected.items())
    if isinstance(expected, list):
        return (isinstance(got, list) and len(got) == len(expected)
                and all(json_subset(e, g) for e, g in zip(expected, got)))
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got
    return expected == got


def expected_calls(answer: Any) -> list[dict[str, Any]]:
    """`answer` as a list of `{"name", "arguments"}` (ValueError naming what is wrong)."""
    calls = answer if isinstance(answer, list) else [answer]
    for i, c in enumerate(calls):
        if not (isinstance(c, dict) and isinstance(c.get("name"), str)
                and isinstance(c.get("arguments", {}), dict) and set(c) <= {"name", "arguments"}):
            raise ValueError(f'call {i} must be {{"name": ..., "arguments": {{...}}}}')
    return calls


@_check("tool_calls")
def tool_calls(response: Response, answer: Any) -> Score:
    """One to one, any order: each expected call matched by a distinct call of the final turn."""
    want = expected_calls(answer)
    got = list(response.tool_calls)
    free = list(range(len(got)))
    matched = 0
    for w in want:
        for j in free:
            if got[j].name == w["name"] and json_subset(w.get("arguments", {}), got[j].arguments):
                free.remove(j)
                matched += 1
                break
    names = sorted(c.name for c in got) == sorted(w["name"] for w in want)
    ok = matched == len(want) and len(got) == len(want)
    return Score(outcome=float(ok), success=ok,
                 details={"names": float(names), "matched": matched / max(len(want), 1)},
                 info={"calls": [c.model_dump() for c in got]} if not ok else {},
                 feedback=None if ok else _calls_feedback(want, got, names))


def _calls_feedback(want: list[dict[str, Any]], got: list[Any], names: bool) -> Feedback:
    def show(calls: list[tuple[str, Any]]) -> str:
        return ", ".join(f"{n}({json.dumps(a, ensure_ascii=False, sort_keys=True)})" for n, a in calls)

    expected = show([(w["name"], w.get("arguments", {})) for w in want])
    given = show([(c.name, c.arguments) for c in got])
    kind = ("no_call" if not got else "wrong_call_count" if len(got) != len(want)
            else "wrong_arguments" if names else "wrong_function")
    return Feedback.of(kind, f"expected {expected}; given {given or 'no call'}")


def resolve_check(name: str, options: dict[str, Any], where: str) -> Check:
    """The check `name` names (built-in or plugin); CoevoError prefixed with `where`."""
    if name in CHECKS:
        unknown = sorted(set(options) - CHECK_OPTIONS[name])
        if unknown:
            allowed = ", ".join(sorted(CHECK_OPTIONS[name])) or "none"
            raise CoevoError(f"{where}: verifier {name!r} takes no option {unknown[0]!r} "
                             f"(options: {allowed})")
        return CHECKS.get(name)
    if not _PLUGIN.match(name):
        raise CoevoError(f"{where}: unknown verifier {name!r}; known: "
                         f"{', '.join(CHECKS.names())}, or a plugin pkg.module:function")
    module, attr = name.split(":", 1)
    try:
        return import_dotted(module, attr, f"{where}: verifier {name!r}")
    except ImportError as e:
        raise CoevoError(f"{where}: verifier {name!r}: cannot import {module!r} ({e})") from None


def run_check(check: Check, response: Response, answer: Any, options: dict[str, Any],
              name: str | None = None) -> Score:
    """The check's verdict as a Score, with feedback when it failed (`explain`; `name` is the
    check's name in the task file). The built-in checks take any agent output (answers are
    validated when the file is read), so a check that raises or returns something other than a
    number in [0, 1] or a Score is a broken verifier: InfraError, missing data, not a zero."""
    try:
        value = check(response, answer, **options)
    except Exception as e:  # noqa: BLE001 - a plugin's own bug
        raise InfraError(f"verifier {_name(check)} raised {type(e).__name__}: {e}") from e
    if isinstance(value, Score):
        score = value
    elif isinstance(value, (bool, int, float)) and 0.0 <= float(value) <= 1.0:
        score = Score(outcome=float(value), success=float(value) >= 1.0)
    else:
        raise InfraError(f"verifier {_name(check)} returned {value!r}, not a number in [0, 1] or a Score")
    if score.success or score.feedback is not None:
        return score
    return score.model_copy(update={"feedback": explain(name or _name(check), response, answer,
                                                        options, score.outcome)})


def explain(name: str, response: Response, answer: Any, options: dict[str, Any],
            outcome: float = 0.0) -> Feedback:
    """Why check `name` failed: what it expected and what it was given.

    >>> explain("numeric", Response(text="about 3.2"), 3.14, {"tolerance": 0.01}).text
    "expected 3.14 (tolerance 0.01), given 3.2 (from 'about 3.2')"
    """
    text = response.text.strip()
    given = repr(text if len(text) <= 80 else text[:77] + "...")
    if not text:
        return Feedback.of("no_answer", "the answer was empty" + (
            f"; expected {answer!r}" if name in ANSWER_RULES else ""))
    if name in ("exact", "normalized"):
        return Feedback.of("wrong_answer", f"expected {str(answer)!r}, given {given}"
                           + (" (compared after normalizing)" if name == "normalized" else ""))
    if name == "regex":
        return Feedback.of("no_match", f"expected a match of the pattern {answer!r}, given {given}")
    if name == "numeric":
        got = last_number(text)
        if got is None:
            return Feedback.of("no_number", f"expected a number near {answer}, given {given}")
        tol = options.get("tolerance", 1e-6)
        return Feedback.of("wrong_answer", f"expected {answer} (tolerance {tol:g}), given {got:g} "
                           f"(from {given})")
    return Feedback.of("wrong_answer", f"verifier {name} scored {outcome:.2f}; given {given}")


def _name(check: Check) -> str:
    return f"{getattr(check, '__module__', '?')}:{getattr(check, '__qualname__', check)}"


def _text_answer(answer: Any) -> None:
    if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
        raise ValueError(f"must be a string or a number, got {type(answer).__name__}")


def _pattern_answer(answer: Any) -> None:
    if not isinstance(answer, str):
        raise ValueError(f"must be a regex string, got {type(answer).__name__}")
    compile_pattern(f"^(?:{answer})$")  # ValueError with RE2's reason


def _number_answer(answer: Any) -> None:
    if isinstance(answer, bool) or not isinstance(answer, (int, float, str)):
        raise ValueError(f"must be a number, got {type(answer).__name__}")
    if not math.isfinite(float(answer)):  # a non-numeric string raises ValueError here
        raise ValueError("must be a finite number")


# What each built-in check needs in `answer`: raise ValueError when it cannot be used, so a bad
# task line is refused when the file is read, not scored 0 in every episode.
ANSWER_RULES: dict[str, Callable[[Any], None]] = {
    "exact": _text_answer, "normalized": _text_answer, "regex": _pattern_answer,
    "numeric": _number_answer, "tool_calls": lambda a: expected_calls(a) and None,
}
