"""Python rubric checks are registered code (coevo/checks.py): a plugin's entry point, the
project's decorator, and nothing else; proposals and rubric files naming anything else are
refused where they come in, and a stored rubric naming one does not stop scoring."""

from __future__ import annotations

import sys
import textwrap

import pytest

from coevo.assets.io import parse_asset
from coevo.assets.rubric import Rubric
from coevo.checks import CHECKS, ENTRY_POINT_GROUP, registered, resolve_check
from coevo.envs.base import Response, Score, Task
from coevo.errors import AssetError, CoevoError
from coevo.propose.base import Candidate, Incumbent, candidate_from_changes, check_candidate
from coevo.rewards import score_rubric

from tiny_glue import tiny_harness

TASK = Task(id="t", env="e", messages=[])
SEED = Rubric.model_validate({"name": "r", "criteria": [
    {"id": "number", "kind": "python", "params": {"callable": "coevo.checks:answer_is_number"}}]})


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed plugin: a module and a dist-info whose entry point registers its check;
    `broken` is registered too, but its module is gone (uninstalled since)."""
    (tmp_path / "coevo_plugin_checks.py").write_text(textwrap.dedent("""
        IMPORTED = []
        IMPORTED.append(1)
        def long_answer(task, response, score, min_chars=3):
            return len(response.text) >= min_chars
    """))
    dist = tmp_path / "coevo_plugin_checks-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: coevo-plugin-checks\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nlong = coevo_plugin_checks:long_answer\n"
        "broken = coevo_gone_plugin:check\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # a resolved plugin check is cached in the registry: give each test its own copy
    monkeypatch.setattr(CHECKS, "_items", dict(CHECKS._items))
    yield
    sys.modules.pop("coevo_plugin_checks", None)


def test_registered_checks_are_the_projects_and_the_plugins(plugin):
    names = registered()
    assert "coevo.checks:answer_is_number" in names
    assert {"coevo_plugin_checks:long_answer", "coevo_gone_plugin:check"} <= set(names)
    assert "coevo_plugin_checks" not in sys.modules  # listing imports nothing
    fn = resolve_check("coevo_plugin_checks:long_answer")
    assert fn(TASK, Response(text="abcd"), None) and sys.modules["coevo_plugin_checks"].IMPORTED == [1]
    with pytest.raises(CoevoError, match="python check 'builtins:print' is not registered"):
        resolve_check("builtins:print")
    with pytest.raises(CoevoError, match="plugin 'broken'.*cannot import 'coevo_gone_plugin'"):
        resolve_check("coevo_gone_plugin:check")


def test_a_proposal_may_choose_registered_checks_only(plugin):
    inc = Incumbent(harness=tiny_harness(), rubric=SEED)

    def with_check(ref, kwargs=None):
        crit = {"id": "py", "kind": "python", "params": {"callable": ref, "kwargs": kwargs or {}}}
        return candidate_from_changes("scripted", SEED, {"criteria": [
            SEED.criteria[0].model_dump(mode="json"), crit]})

    bad = with_check("builtins:print", {"sep": "PWNED"})
    assert bad.asset is not None  # a valid rubric by its schema ...
    why = check_candidate(bad, inc)  # ... but not an admissible proposal
    assert why.startswith("criteria.1.params.callable: python check 'builtins:print' is not "
                          "registered") and "coevo.checks:answer_is_number" in why
    assert check_candidate(with_check("os:system"), inc).startswith("criteria.1.params.callable")
    # choosing a registered one (the project's or a plugin's), kwargs included, is fine
    assert check_candidate(with_check("coevo_plugin_checks:long_answer", {"min_chars": 2}), inc) is None
    assert check_candidate(with_check("coevo.checks:answer_is_number"), inc) is None
    # an incumbent rubric that already names an unregistered check cannot be kept by a
    # proposal that only reweights it: the check is on the candidate, whatever its history
    legacy = Rubric.model_validate({"name": "r", "criteria": [
        {"id": "p", "kind": "python", "params": {"callable": "builtins:print"}}]})
    reweighted = Candidate(asset=legacy.child(outcome_weight=2.0), proposer="p", kind="rubric")
    assert "is not registered" in check_candidate(reweighted, Incumbent(harness=tiny_harness(),
                                                                        rubric=legacy))


def test_a_rubric_file_naming_an_unregistered_check_is_refused():
    text = "name: r\ncriteria:\n  - {id: p, kind: python, params: {callable: 'builtins:print'}}\n"
    with pytest.raises(AssetError) as e:
        parse_asset(text, "rubrics/r.yaml")
    assert str(e.value).startswith("rubrics/r.yaml: criteria.0.params.callable: python check "
                                   "'builtins:print' is not registered")
    ok = parse_asset(text.replace("builtins:print", "coevo.checks:answer_is_number"), "rubrics/r.yaml")
    assert ok.criteria[0].params.callable == "coevo.checks:answer_is_number"


def test_scoring_never_stops_on_an_unusable_check(plugin):
    """A stored rubric naming a check that is gone (plugin uninstalled) or was never
    registered scores the other criteria; the run and its resume go on."""
    r = Rubric.model_validate({"name": "r", "criteria": [
        {"id": "number", "kind": "python", "params": {"callable": "coevo.checks:answer_is_number"}},
        {"id": "long", "kind": "python", "params": {"callable": "coevo_plugin_checks:long_answer",
                                                   "kwargs": {"min_chars": 1}}},
        {"id": "gone", "kind": "python", "params": {"callable": "coevo_gone_plugin:check"}},
        {"id": "never", "kind": "python", "params": {"callable": "no_such_pkg.mod:f"}}]})
    got = score_rubric(r, TASK, Response(text="42"), Score(outcome=1.0, success=True))
    assert got == {"number": 1.0, "long": 1.0}
