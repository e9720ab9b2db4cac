"""Registered python checks: the only callables a rubric's `python` criterion may name.

A `python` criterion names its check as "pkg.module:function". That reference is code coevo
will call, so it must be registered: by the project (`register_check`, at import of the module
that defines the check) or by an installed plugin, which declares it as an entry point in the
group `coevo.checks` without coevo importing anything until the check is first used:

    [project.entry-points."coevo.checks"]
    score = "my_pkg.checks:score"

A rubric proposal may choose among registered checks and set their kwargs, never add a new
reference (coevo.propose.base.check_candidate makes it invalid); a seed rubric naming an
unregistered check is refused when it is loaded. At reward time a check that is unregistered
or fails to import (a plugin uninstalled since the rubric was accepted) is missing data,
logged once, never an error that stops a run or its resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar

from coevo.errors import CoevoError
from coevo.registry import Registry, import_dotted

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "coevo.checks"
CHECKS: Registry[Callable[..., Any]] = Registry("python check")

F = TypeVar("F", bound=Callable[..., Any])


def reference(fn: Callable[..., Any]) -> str:
    """"module:qualname", the reference a rubric uses for `fn`.

    >>> reference(reference)
    'coevo.checks:reference'
    """
    return f"{fn.__module__}:{fn.__qualname__}"


def register_check(fn: F) -> F:
    """Decorator: allow rubrics to name `fn` by its reference ("module:qualname")."""
    CHECKS.add(reference(fn), fn)
    return fn


def _plugins() -> dict[str, Any]:
    """reference -> entry point, for every installed plugin's `coevo.checks` entry point."""
    return {ep.value.replace(" ", ""): ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered() -> list[str]:
    """Every reference a rubric may name, sorted."""
    return sorted(set(CHECKS.names()) | set(_plugins()))


def not_registered_message(ref: str) -> str:
    known = ", ".join(registered()) or "(none)"
    return (f"python check {ref!r} is not registered (a project check is registered with "
            f"coevo.checks.register_check, a plugin's with a {ENTRY_POINT_GROUP!r} entry "
            f"point); registered: {known}")


def resolve_check(ref: str) -> Callable[..., Any]:
    """The registered check named `ref`; a plugin's is imported on first use. CoevoError when
    `ref` is not registered or cannot be imported."""
    if ref in CHECKS:
        return CHECKS.get(ref)
    ep = _plugins().get(ref)
    if ep is None:
        raise CoevoError(not_registered_message(ref))
    module_name, _, attr = ref.partition(":")
    try:
        fn = import_dotted(module_name, attr, f"python check {ref!r}")
    except ImportError as exc:
        raise CoevoError(f"python check {ref!r} (plugin {ep.name!r}): cannot import "
                         f"{module_name!r}: {exc}") from None
    CHECKS.add(ref, fn)
    return fn


def python_criteria_problems(rubric: Any) -> list[tuple[str, str]]:
    """(field path, reason) for every `python` criterion of `rubric` naming an unregistered
    check, e.g. ("criteria.2.params.callable", "python check 'builtins:print' is not ...")."""
    plugins = _plugins()
    return [(f"criteria.{i}.params.callable", not_registered_message(c.params.callable))
            for i, c in enumerate(getattr(rubric, "criteria", []))
            if c.kind == "python" and c.params.callable not in CHECKS
            and c.params.callable not in plugins]


@register_check
def answer_is_number(task: Any, response: Any, score: Any) -> bool:
    """Pays when the final answer is a plain number (e.g. "-3.5"); the doctest's check in
    coevo.rewards.python_reward, and a usable format check."""
    return response.text.strip().lstrip("-").replace(".", "", 1).isdigit()
