"""Assets: file and JSON round trips, hash stability, diffs, rendering, skill libraries, seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from coevo.assets import (
    ASSET_TYPES,
    Harness,
    Rubric,
    Skill,
    SkillLibrary,
    asset_path,
    diff,
    dump_asset,
    forbidden_changes,
    format_asset,
    format_diff,
    load_asset,
    load_seed_dir,
    parse_asset,
)
from coevo.assets.harness import python_signature, render_tool_docs
from coevo.errors import AssetError, NotFound
from coevo.models.base import Sampling

REPO = Path(__file__).resolve().parent.parent

AREA = {
    "type": "function",
    "function": {
        "name": "calculate_triangle_area",
        "description": "Area of a triangle from its base and height.",
        "parameters": {
            "type": "object",
            "properties": {
                "base": {"type": "integer", "description": "The base length."},
                "height": {"type": "integer", "description": "The height."},
                "unit": {"type": "string", "enum": ["cm", "m"], "default": "cm"},
            },
            "required": ["base", "height"],
        },
    },
}


@pytest.fixture(scope="module")
def seeds():
    return load_seed_dir(REPO)


def by_name(assets, kind, name):
    return next(a for a in assets if a.kind == kind and a.name == name)


def skill(name="unit-check", **kw):
    data = {"name": name, "description": f"Check {name}.", "body": "Step 1.\nStep 2."} | kw
    return Skill(**data)


# -- seeds ---------------------------------------------------------------------------------


def test_seed_assets_load(seeds):
    kinds = {}
    for a in seeds:
        kinds.setdefault(a.kind, set()).add(a.name)
    pairs = {"function_calling", "function_calling_constrained", "function_calling_multi",
             "reasoning"}
    assert kinds["harness"] == pairs and kinds["rubric"] == pairs  # rubrics named like harnesses
    assert {"function-call-format", "argument-extraction", "arithmetic-checking"} <= kinds["skill"]
    assert kinds["skill_library"] == {"seed"}
    lib = by_name(seeds, "skill_library", "seed")
    assert lib.names == sorted(kinds["skill"])
    # members first: the library's refs resolve against the skills loaded before it
    assert [s.name for s in lib.resolve(a for a in seeds if a.kind == "skill")] == lib.names


def test_seed_function_calling_rubric_guards_against_copying(seeds):
    r = by_name(seeds, "rubric", "function_calling")
    assert r.ids == ["outcome", "decodes", "function_name_offered", "required_args"]
    assert r.criterion("function_name_offered").params.name_in_offered is True
    assert r.criterion("required_args").params.required_args is True
    assert r.criterion("decodes").kind == "tool_called"
    # decoding alone must be worth less than naming an offered function
    assert r.criterion("decodes").weight < r.criterion("function_name_offered").weight


def test_seed_harnesses(seeds):
    fc = by_name(seeds, "harness", "function_calling")
    assert fc.tool_format in ("python", "json") and len(fc.demos) == 1
    assert fc.workflow.answer_extraction.method == "tool_call"
    rs = by_name(seeds, "harness", "reasoning")
    ex = rs.workflow.answer_extraction
    assert ex.method == "regex"
    assert ex.extract("7 * 3 = 21\n12 + 21 = 33\nAnswer: 33") == "33"
    assert ex.extract("answer: 1\nthen\nAnswer:  -4.5  ") == "-4.5"  # last one wins
    assert ex.extract("no answer line") is None
    # the reasoning demo itself must satisfy its own extraction and rubric regexes
    demo_answer = rs.demos[0].messages[-1].content
    assert ex.extract(demo_answer) == "33"
    rubric = by_name(seeds, "rubric", "reasoning")
    from coevo.rewards import regex_reward  # what scores them: RE2 (`\Z` translated)

    line = rubric.criterion("answer_line").params.pattern
    assert regex_reward(demo_answer, line) == 1.0 and regex_reward(demo_answer + "\nmore", line) == 0.0
    assert regex_reward("33", rubric.criterion("numeric_answer").params.pattern) == 1.0


# -- round trips ---------------------------------------------------------------------------


def test_every_kind_round_trips_through_file_and_json(seeds, tmp_path):
    for a in seeds:
        path = dump_asset(a, asset_path(tmp_path, a))
        back = load_asset(path)
        assert type(back) is type(a) and back.hash == a.hash and back == a
        via_json = type(a).model_validate(json.loads(a.canonical()))
        assert via_json.hash == a.hash
        # dumping the reloaded asset reproduces the file byte for byte (stable dumps)
        assert format_asset(back) == path.read_text()
    assert {a.kind for a in seeds} == {"harness", "skill", "rubric", "skill_library"}


def test_parent_survives_file_but_not_hash(seeds, tmp_path):
    h = by_name(seeds, "harness", "function_calling")
    child = h.child(system_prompt="Call functions.")
    assert child.parent == h.hash
    back = load_asset(dump_asset(child, tmp_path / "harnesses" / "x.yaml"))
    assert back.parent == h.hash and back.hash == child.hash


def test_skill_markdown_round_trip_exact(seeds):
    for s in (a for a in seeds if a.kind == "skill"):
        text = s.to_markdown()
        again = Skill.from_markdown(text, f"skills/{s.name}/SKILL.md")
        assert again.hash == s.hash and again.body == s.body and again.to_markdown() == text
    bare = skill(body="")
    assert Skill.from_markdown(bare.to_markdown()).hash == bare.hash


def test_multiline_strings_are_block_style(seeds):
    text = format_asset(by_name(seeds, "harness", "function_calling"))
    assert "system_prompt: |" in text and "answer_format: |" in text
    assert "null" not in text  # unset optional fields are left out, not written as null


# -- hashes --------------------------------------------------------------------------------


def test_hash_ignores_key_order_and_yaml_formatting():
    src = "harnesses/h.yaml"
    a = parse_asset(
        "name: h\nsystem_prompt: |\n  Be brief.\n  Use tools.\n"
        "decoding:\n  temperature: 0.5\n  top_k: 10\n",
        src,
    )
    b = parse_asset(  # keys reordered, flow style, quoted string, CRLF, trailing spaces
        'decoding: {top_k: 10, temperature: 0.50}\r\n'
        'system_prompt: "Be brief.  \\nUse tools.\\n\\n"\r\nname:   h\r\n',
        src,
    )
    assert a.hash == b.hash
    c = parse_asset("name: h\nsystem_prompt: Be brief.\n", src)
    assert c.hash != a.hash
    d = a.model_copy(update={"parent": "0" * 64})
    assert d.hash == a.hash
    e = a.child(decoding={"temperature": 0.5, "top_k": 11})
    assert e.hash != a.hash and e.parent == a.hash


def test_kind_is_part_of_identity():
    h = Harness(name="x", system_prompt="p")
    assert h.hash != Rubric(name="x").hash


def test_skill_library_hash_is_order_independent():
    s1, s2, s3 = skill("alpha"), skill("beta"), skill("gamma")
    a = SkillLibrary.from_skills("lib", [s1, s2, s3])
    b = SkillLibrary.from_skills("lib", [s3, s1, s2])
    assert a.hash == b.hash and a.names == ["alpha", "beta", "gamma"]
    changed = SkillLibrary.from_skills("lib", [s1, s2, s3.child(body="Other.")])
    assert changed.hash != a.hash


# -- diffs and editable fields -------------------------------------------------------------


def test_diff_on_changed_prompt_shows_only_that_field(seeds):
    h = by_name(seeds, "harness", "function_calling")
    lines = h.system_prompt.split("\n")
    new = h.child(system_prompt=lines[0] + "\nAlways answer with a call.")
    d = diff(h, new)
    assert list(d) == ["system_prompt"]
    text = d["system_prompt"]
    assert text.startswith(f"--- {h.hash[:12]}:system_prompt\n+++ {new.hash[:12]}:system_prompt\n")
    assert f"-{lines[1]}\n" in text and "+Always answer with a call.\n" in text
    assert f" {lines[0]}\n" in text  # unchanged context line
    assert format_diff(h, new) == text
    assert format_diff(h, h) == "(no changes)\n"


def test_nested_diff_and_forbidden_changes(seeds):
    h = by_name(seeds, "harness", "reasoning")
    new = h.child(decoding=h.decoding.model_copy(update={"temperature": 0.3}).model_dump())
    assert list(diff(h, new)) == ["decoding.temperature"]
    assert forbidden_changes(h, new) == []
    renamed = h.child(name="other")
    assert forbidden_changes(h, renamed) == ["name"]
    r = by_name(seeds, "rubric", "reasoning")
    assert forbidden_changes(h, r) == ["kind"]
    s = by_name(seeds, "skill", "arithmetic-checking")
    assert forbidden_changes(s, s.child(state="hidden")) == []
    assert forbidden_changes(s, s.child(license="MIT")) == ["license"]


# -- harness rendering ---------------------------------------------------------------------


def test_render_system_python_signature_and_skills(seeds):
    h = by_name(seeds, "harness", "function_calling")
    active = skill("fmt", body="Write the call only.")
    hidden = skill("secret", state="hidden", body="Never shown.")
    text = h.render_system([AREA], [active, hidden])
    assert text.startswith(h.system_prompt)
    assert text.endswith(h.answer_format)  # the answer format is the last thing read
    assert "def calculate_triangle_area(base: int, height: int, unit: Literal[\"cm\", \"m\"] = \"cm\"):" in text
    assert "Write the call only." in text and "Never shown." not in text
    off = h.child(skills={"method": "none", "top_k": 0})
    assert "Write the call only." not in off.render_system([AREA], [active])


def test_render_system_json_docs_and_chat_template():
    h = Harness(name="j", system_prompt="Sys.", tool_doc_format="json", answer_format="Fmt.")
    text = h.render_system([AREA["function"]])  # a bare BFCL-style spec is accepted too
    line = next(ln for ln in text.split("\n") if ln.startswith("{"))
    assert json.loads(line) == AREA["function"]
    native = h.child(tool_format="chat_template")
    assert native.render_system([AREA]) == "Sys.\n\nFmt."  # specs go to Request.tools instead
    assert native.tool_specs([AREA]) == [AREA]


def test_task_function_wins_over_harness_tool_of_same_name():
    own = {"type": "function", "function": {"name": "calculate_triangle_area", "description": "mine"}}
    calc = {"type": "function", "function": {"name": "calculator", "description": "Evaluate.",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}
    h = Harness(name="t", system_prompt="s", tools=[own, calc])
    specs = h.tool_specs([AREA])
    assert [s["function"]["name"] for s in specs] == ["calculate_triangle_area", "calculator"]
    assert specs[0]["function"]["description"] == AREA["function"]["description"]


def test_python_signature_multiline_description_and_types():
    sig = python_signature({"name": "f", "description": "Line one.\nLine two.", "parameters": {
        "type": "object", "properties": {"xs": {"type": "array", "items": {"type": "number"}},
                                        "flag": {"type": "boolean"}}, "required": ["xs"]}})
    assert sig.split("\n")[:3] == ['def f(xs: list[float], flag: bool = None):',
                                   '    """Line one.', "    Line two."]
    with pytest.raises(ValueError, match="no function name"):
        render_tool_docs([{"type": "function", "function": {}}], "json")


def test_sampling_mirrors_decoding(seeds):
    h = by_name(seeds, "harness", "function_calling")
    s = h.sampling(seed=7)
    assert isinstance(s, Sampling)
    assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens, s.seed) == (0.7, 0.95, 40, 96, 7)
    # Decoding is Sampling minus the per-request seed, plus the grammar (travels on Request).
    assert set(Sampling.model_fields) - {"seed"} == set(type(h.decoding).model_fields) - {"constrain"}


def test_demo_messages_flatten_in_order(seeds):
    msgs = by_name(seeds, "harness", "function_calling").demo_messages()
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    assert msgs[1]["content"].startswith("[get_stock_price(")


# -- skill library -------------------------------------------------------------------------


def test_skill_library_helpers():
    a, b = skill("alpha"), skill("beta", state="hidden")
    lib = SkillLibrary.from_skills("lib", [a, b])
    assert [r.name for r in lib.active()] == ["alpha"]
    a2 = a.child(body="Revised.")
    lib2 = lib.with_skill(a2)
    assert lib2.parent == lib.hash and lib2.names == ["alpha", "beta"]
    assert lib2.skills[0].hash == a2.hash != a.hash
    lib3 = lib2.without("beta")
    assert lib3.names == ["alpha"] and lib3.parent == lib2.hash
    with pytest.raises(NotFound, match="not in library"):
        lib3.without("beta")
    assert lib2.resolve([b, a2, a]) == [a2]
    assert lib2.resolve([b, a2], only_active=False) == [a2, b]
    with pytest.raises(NotFound, match="alpha"):
        lib2.resolve([a, b])  # the old version of alpha is not the member
    with pytest.raises(ValueError, match="appears twice"):
        SkillLibrary.from_skills("lib", [a, a2])


def test_skill_targets_are_a_set():
    assert skill(targets=["b", "a"]).hash == skill(targets=["a", "b"]).hash


def test_library_file_round_trip(tmp_path):
    lib = SkillLibrary.from_skills("picked", [skill("alpha"), skill("beta")])
    path = dump_asset(lib, asset_path(tmp_path, lib))
    assert path == tmp_path / "skill_libraries" / "picked.yaml"
    assert yaml.safe_load(path.read_text())["skills"][0]["name"] == "alpha"
    assert load_asset(path).hash == lib.hash
    # a library file of the seed name replaces the one load_seed_dir would build
    s = skill("gamma")
    dump_asset(s, asset_path(tmp_path, s))
    dump_asset(lib.model_copy(update={"name": "seed"}), tmp_path / "skill_libraries" / "seed.yaml")
    libs = [a for a in load_seed_dir(tmp_path) if a.kind == "skill_library"]
    assert sorted(x.name for x in libs) == ["picked", "seed"]
    assert by_name(libs, "skill_library", "seed").names == ["alpha", "beta"]


# -- rubric kinds --------------------------------------------------------------------------


def test_every_criterion_kind_parses_and_round_trips(tmp_path):
    text = """
name: all-kinds
outcome_weight: 0.5
criteria:
  - {id: outcome, kind: outcome}
  - {id: details-ast, kind: outcome, params: {detail: ast_valid}}
  - {id: no-sorry, kind: regex, params: {pattern: "(?i)sorry", must_match: false, target: text}}
  - id: is-json
    kind: json_schema
    params: {json_schema: {type: object, required: [x]}}
  - {id: named, kind: tool_called, params: {name: calculator, args_match: true}}
  - {id: custom, kind: python, params: {callable: "coevo.checks:answer_is_number", kwargs: {k: 1}}}
  - {id: judge, kind: llm_judge, weight: 0.0, params: {question: "Is the answer polite?", scale: 10}}
"""
    r = parse_asset(text, "rubrics/all-kinds.yaml")
    assert [c.kind for c in r.criteria] == [
        "outcome", "outcome", "regex", "json_schema", "tool_called", "python", "llm_judge"]
    assert r.criterion("details-ast").params.detail == "ast_valid"
    assert r.criterion("judge").params.scale == 10
    back = load_asset(dump_asset(r, tmp_path / "rubrics" / "all-kinds.yaml"))
    assert back.hash == r.hash
    with pytest.raises(KeyError, match="no criterion"):
        r.criterion("missing")


def test_error_message_names_file_and_field():
    with pytest.raises(AssetError) as e:
        parse_asset("name: h\nsystem_prompt: s\nworkflow: {max_turns: 33}\n", "harnesses/h.yaml")
    assert e.value.source == "harnesses/h.yaml" and e.value.field == "workflow.max_turns"
    assert str(e.value).startswith("harnesses/h.yaml: workflow.max_turns: ")
