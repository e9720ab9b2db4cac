"""Bad asset files: every one must raise AssetError naming the file (and the field when there
is one), never another exception type. Explicit cases first, then hypothesis properties over
mutations of the real seed files."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from coevo.assets import Asset, format_asset, parse_asset
from coevo.assets.io import load_asset
from coevo.assets.skill import SKILL_NAME
from coevo.errors import AssetError

REPO = Path(__file__).resolve().parent.parent
SEED_FILES = sorted(
    [*REPO.glob("harnesses/*.yaml"), *REPO.glob("rubrics/*.yaml"), *REPO.glob("skills/*/SKILL.md")]
)
SEEDS = {str(p.relative_to(REPO)): p.read_text() for p in SEED_FILES}
YAML_SEEDS = {k: v for k, v in SEEDS.items() if k.endswith(".yaml")}
SKILL_SEEDS = {k: v for k, v in SEEDS.items() if k.endswith("SKILL.md")}
# Free-form JSON inside assets: unknown keys there are legitimate content.
FREE_FORM = {"parameters", "json_schema", "kwargs", "metadata"}

# COEVO_FUZZ_EXAMPLES=3000 for a long hunt; the default keeps the file under ~20 s on 2 cores.
PROPS = settings(
    max_examples=int(os.environ.get("COEVO_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def expect_error(text: str, source: str) -> AssetError:
    with pytest.raises(AssetError) as info:
        parse_asset(text, source)
    err = info.value
    assert err.source == source and str(err).startswith(source + ": ")
    return err


def parse_or_error(text: str, source: str) -> Asset | AssetError:
    """The property every input must satisfy: an asset, or an AssetError naming the file."""
    try:
        asset = parse_asset(text, source)
    except AssetError as e:
        assert e.source == source and str(e).startswith(source + ": ") and e.reason
        return e
    asset.hash  # a valid asset must also hash (canonical JSON of whatever was accepted)
    return asset


def split_skill(text: str) -> tuple[dict, str]:
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def skill_text(front: dict, body: str) -> str:
    return "---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True) + "---\n" + body


def seed_data(source: str) -> tuple[dict, str]:
    if source.endswith("SKILL.md"):
        return split_skill(SEEDS[source])
    return yaml.safe_load(SEEDS[source]), ""


def render(source: str, data: dict, body: str) -> str:
    if source.endswith("SKILL.md"):
        return skill_text(data, body)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def dict_paths(node, prefix=()):
    """Paths of every model-level mapping in an asset's data (free-form JSON excluded)."""
    if isinstance(node, dict):
        yield prefix
        for k, v in node.items():
            if k not in FREE_FORM:
                yield from dict_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from dict_paths(v, prefix + (i,))


def leaf_paths(node, prefix=()):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaf_paths(v, prefix + (k,))
    elif isinstance(node, list) and node:
        for i, v in enumerate(node):
            yield from leaf_paths(v, prefix + (i,))
    else:
        yield prefix


def get_at(data, path):
    for p in path:
        data = data[p]
    return data


# -- explicit cases ------------------------------------------------------------------------

H = "harnesses/h.yaml"
R = "rubrics/r.yaml"
S = "skills/x/SKILL.md"
TOOL = "name: h\nsystem_prompt: s\ntools: [{type: function, function: {name: f, parameters: %s}}]\n"
CASES = [
    # (source, text, field, reason fragment)
    (H, "name: h\nsystem_prompt: [s\n", None, "YAML syntax error at line 3"),
    (H, "name: h\nsystem_prompt: s\n  bad: 1\n", None, "YAML syntax error at line 3"),
    (H, "name: h\nname: g\nsystem_prompt: s\n", "name", "duplicate key (line 2)"),
    (H, "- a\n", None, "expected a mapping of fields, got a list"),
    (H, "", None, "got an empty document"),
    (H, "1: 2\nname: h\n", "1", "keys must be strings"),
    (H, "name: h\nsystem_prompt: s\nworkflow: {max_turn: 3}\n", "workflow.max_turn", "unknown key (allowed: max_turns"),
    (H, "name: h\nsystem_prompt: s\nsystem_promt: t\n", "system_promt", "unknown key"),
    (H, "name: h\n", "system_prompt", "required field is missing"),
    (H, "name: h\nsystem_prompt: 3\n", "system_prompt", "valid string (got int)"),
    (H, "name: h\nsystem_prompt: s\nworkflow: {max_turns: 33}\n", "workflow.max_turns", "less than or equal to 32"),
    (H, "name: h\nsystem_prompt: s\nskills: {top_k: 9}\n", "skills.top_k", "less than or equal to 8"),
    (H, "name: h\nsystem_prompt: s\ndecoding: {top_p: 0}\n", "decoding.top_p", "greater than 0"),
    (H, "name: h\nsystem_prompt: s\ntool_format: xml\n", "tool_format", "'json', 'python' or 'chat_template'"),
    (H, TOOL % "{type: objekt}", "tools.0.function.parameters", "invalid JSON Schema at type"),
    (H, TOOL % "{type: string}", "tools.0.function.parameters", "object schema"),
    (H, TOOL % "{type: object, required: x}", "tools.0.function.parameters", "invalid JSON Schema at required"),
    (H, TOOL % "[1]", "tools.0.function.parameters", "valid dictionary"),
    (H, "name: h\nsystem_prompt: s\ntools: [{function: {name: 'f g'}}]\n", "tools.0.function.name", "an identifier"),
    (H, "name: h\nsystem_prompt: s\ntools: [{function: {name: f}}, {function: {name: f}}]\n", "tools", "'f' is defined twice"),
    (H, "name: h\nsystem_prompt: s\nworkflow: {answer_extraction: {method: regex, pattern: '('}}\n",
     "workflow.answer_extraction", "pattern does not compile"),
    (H, "name: h\nsystem_prompt: s\nworkflow: {answer_extraction: {method: regex}}\n",
     "workflow.answer_extraction", "needs a pattern"),
    (H, "name: h\nsystem_prompt: s\ndemos: [{messages: [{role: user, content: a}, {role: bot, content: b}]}]\n",
     "demos.0.messages.1.role", "'user', 'assistant' or 'tool'"),
    (H, "name: h\nsystem_prompt: s\ndemos: [{messages: [{role: assistant, content: a}, {role: assistant, content: b}]}]\n",
     "demos.0.messages", "starts with a user message"),
    (H, "name: 'bad name'\nsystem_prompt: s\n", "name", "is not valid"),
    (R, "name: r\ncriteria: [{id: a, kind: regexp, params: {pattern: x}}]\n", "criteria.0.kind", "does not match any of the expected tags"),
    (R, "name: r\ncriteria: [{id: a, params: {pattern: x}}]\n", "criteria.0.kind", "Unable to extract tag"),
    (R, "name: r\ncriteria: [{id: a, kind: regex, params: {pattern: '['}}]\n", "criteria.0.params.pattern", "does not compile"),
    (R, "name: r\ncriteria: [{id: a, kind: regex}]\n", "criteria.0.params", "required field is missing"),
    (R, "name: r\ncriteria: [{id: a, kind: regex, params: {pattern: x, foo: 1}}]\n", "criteria.0.params.foo", "unknown key (allowed: pattern"),
    (R, "name: r\ncriteria: [{id: a, kind: regex, params: {pattern: x, target: all}}]\n", "criteria.0.params.target", "'answer' or 'text'"),
    (R, "name: r\ncriteria: [{id: a, kind: python, params: {callable: os.path}}]\n", "criteria.0.params.callable", "'package.module:function'"),
    (R, "name: r\ncriteria: [{id: a, kind: json_schema, params: {json_schema: {type: 5}}}]\n", "criteria.0.params.json_schema", "invalid JSON Schema"),
    (R, "name: r\ncriteria: [{id: a, kind: llm_judge, params: {question: q, scale: 0}}]\n", "criteria.0.params.scale", "greater than or equal to 1"),
    (R, "name: r\ncriteria: [{id: a, kind: tool_called, params: {name_in_ofered: true}}]\n", "criteria.0.params.name_in_ofered", "unknown key"),
    (R, "name: r\ncriteria: [{id: a, kind: outcome}, {id: a, kind: outcome}]\n", "criteria", "id 'a' is used twice"),
    (R, "name: r\ncriteria: [{id: a, kind: outcome, weight: 0}]\n", "criteria", "weights sum to 0"),
    (R, "name: r\ncriteria: [{id: a, kind: outcome, weight: -1}]\n", "criteria.0.weight", "greater than or equal to 0"),
    (R, "name: r\ncriteria: [{id: 'A b', kind: outcome}]\n", "criteria.0.id", "lowercase slug"),
    (R, "name: r\noutcome_weight: 0\n", None, "the reward is always 0"),
    (S, "name: x\n", None, "must start with a '---' line"),
    (S, "---\nname: x\ndescription: d\n", None, "not closed"),
    (S, "---\nname: x\ndescription: d\n  bad: [\n---\n", None, "YAML syntax error at line 4"),
    (S, "---\nname: x\nname: x\n---\n", "name", "duplicate key (line 3)"),
    (S, "---\nname: x\ndescription: d\nfoo: 1\n---\nbody", "foo", "unknown key (allowed: name, parent, description"),
    (S, "---\nname: x\ndescription: d\nbody: b\n---\n", "body", "unknown key"),
    (S, "---\nname: y\ndescription: d\n---\n", "name", "must equal its folder name 'x'"),
    (S, "---\nname: x\ndescription: '  '\n---\n", "description", "must not be empty"),
    (S, "---\nname: x\ndescription: " + "d" * 1025 + "\n---\n", "description", "at most 1024"),
    (S, "---\nname: x\n---\n", "description", "required field is missing"),
    (S, "---\nname: x\ndescription: d\nstate: gone\n---\n", "state", "'active', 'hidden' or 'retired'"),
    (S, "---\nname: x\ndescription: d\ntargets: [Outcome]\n---\n", "targets", "not a criterion id"),
    (S, "---\nname: x\ndescription: d\nmetadata: {a: [1]}\n---\n", "metadata.a", "valid string"),
    ("notes/x.yaml", "name: x\n", None, "cannot tell the asset kind"),
]


@pytest.mark.parametrize("source,text,field,fragment", CASES)
def test_invalid_case(source, text, field, fragment):
    err = expect_error(text, source)
    assert err.field == field, str(err)
    assert fragment in err.reason, str(err)


@pytest.mark.parametrize(
    "bad", ["Bad", "-ab", "ab-", "a--b", "a_b", "a b", "é", "a" * 65, ""]
)
def test_bad_skill_names(bad):
    err = expect_error(skill_text({"name": bad, "description": "d"}, ""), "skills/x/SKILL.md")
    assert err.field == "name"


def test_file_level_errors(tmp_path):
    with pytest.raises(AssetError, match="no such file"):
        load_asset(tmp_path / "harnesses" / "missing.yaml")
    bad = tmp_path / "harnesses" / "latin1.yaml"
    bad.parent.mkdir()
    bad.write_bytes(b"name: h\nsystem_prompt: caf\xe9\n")
    with pytest.raises(AssetError, match=r"not UTF-8 text \(line 2, byte 26\)"):
        load_asset(bad)
    with pytest.raises(AssetError, match="is a folder"):
        load_asset(bad.parent)
    with pytest.raises(AssetError, match="unknown asset kind 'widget'"):
        parse_asset("name: x\n", "x.yaml", kind="widget")


# -- properties ----------------------------------------------------------------------------

YAML_NOISE = st.text(alphabet=st.sampled_from(list(":-[]{}'\"#&*!|>%@?,\n\t  abcXYZ019")), max_size=8)


@st.composite
def mutated_text(draw):
    source = draw(st.sampled_from(sorted(SEEDS)))
    text = SEEDS[source]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 20)))
        op = draw(st.sampled_from(["delete", "insert", "replace"]))
        noise = draw(st.one_of(YAML_NOISE, st.text(max_size=6)))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "insert":
            text = text[:i] + noise + text[i:]
        else:
            text = text[:i] + noise + text[j:]
    return source, text


@PROPS
@given(mutated_text())
def test_random_text_mutations_raise_only_asset_error(case):
    source, text = case
    parse_or_error(text, source)


@PROPS
@given(st.sampled_from(sorted(SEEDS)), st.data())
def test_unknown_key_is_named(source, data):
    content, body = seed_data(source)
    paths = list(dict_paths(content))
    where = data.draw(st.sampled_from(paths))
    key = "x_" + data.draw(st.from_regex(r"[a-z]{1,10}", fullmatch=True))  # never a field name
    mutated = copy.deepcopy(content)
    get_at(mutated, where)[key] = data.draw(st.one_of(st.integers(), st.text(max_size=5)))
    err = expect_error(render(source, mutated, body), source)
    assert err.field == ".".join(map(str, where + (key,))) and err.reason.startswith("unknown key")


@PROPS
@given(st.sampled_from(sorted(SKILL_SEEDS)), st.one_of(st.text(max_size=70), st.integers(), st.none()))
def test_bad_skill_name_is_named(source, name):
    assume(not (isinstance(name, str) and re.fullmatch(SKILL_NAME, name) and len(name) <= 64))
    front, body = split_skill(SKILL_SEEDS[source])
    err = expect_error(skill_text(front | {"name": name}, body), source)
    assert err.field == "name", str(err)


INVALID_SCHEMAS = st.one_of(
    st.fixed_dictionaries({"type": st.text(max_size=8).filter(
        lambda t: t not in {"object", "array", "string", "number", "integer", "boolean", "null"})}),
    st.fixed_dictionaries({"type": st.just("object"),
                           "properties": st.one_of(st.integers(), st.text(), st.lists(st.integers(), max_size=2))}),
    st.fixed_dictionaries({"type": st.just("object"), "required": st.one_of(st.integers(), st.text())}),
    st.fixed_dictionaries({"type": st.just("object"), "minProperties": st.integers(max_value=-1)}),
    st.fixed_dictionaries({"type": st.just("object"),
                           "additionalProperties": st.one_of(st.integers(), st.text(), st.lists(st.none(), max_size=2))}),
    st.fixed_dictionaries({"type": st.just("object"), "properties": st.fixed_dictionaries(
        {"x": st.fixed_dictionaries({"type": st.integers()})})}),
)


@PROPS
@given(INVALID_SCHEMAS)
def test_bad_tool_schema_is_named(schema):
    data = yaml.safe_load(YAML_SEEDS["harnesses/function_calling.yaml"])
    data["tools"] = [{"type": "function", "function": {"name": "calc", "parameters": schema}}]
    err = expect_error(yaml.safe_dump(data), "harnesses/function_calling.yaml")
    assert err.field == "tools.0.function.parameters" and "JSON Schema" in err.reason, str(err)


@PROPS
@given(INVALID_SCHEMAS)
def test_bad_rubric_schema_is_named(schema):
    data = yaml.safe_load(YAML_SEEDS["rubrics/reasoning.yaml"])
    n = len(data["criteria"])
    data["criteria"].append({"id": "is-json", "kind": "json_schema", "params": {"json_schema": schema}})
    err = expect_error(yaml.safe_dump(data), "rubrics/reasoning.yaml")
    assert err.field == f"criteria.{n}.params.json_schema" and "JSON Schema" in err.reason, str(err)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@PROPS
@given(st.sampled_from(sorted(SEEDS)), st.data())
def test_random_value_replacement_raises_only_asset_error(source, data):
    content, body = seed_data(source)
    path = data.draw(st.sampled_from(list(leaf_paths(content))))
    mutated = copy.deepcopy(content)
    parent = get_at(mutated, path[:-1])
    parent[path[-1]] = data.draw(JSONISH)
    result = parse_or_error(render(source, mutated, body), source)
    if isinstance(result, Asset):
        # whatever was accepted dumps to a file that loads back as the same version
        assert parse_asset(format_asset(result), source).hash == result.hash
    elif result.field:
        # the reported field is a real location: its first part is a key of the file
        assert result.field.split(".")[0] in set(mutated) | {"kind"}, str(result)
