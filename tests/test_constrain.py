"""Structured decoding: grammars from function specs, masks in batched sampling, the harness
knob, and RL consistency (behaviour log-probs = the trainer's recomputation under the masks).

Grammars are checked with the real engine (llguidance) over a real byte-level BPE tokenizer:
a text is accepted when every one of its tokens is allowed and the grammar can end there.
"""

from __future__ import annotations

import json

import pytest
import torch

from coevo.assets.harness import Harness
from coevo.envs.callparse import parse_tool_calls
from coevo.errors import AssetError
from coevo.models.base import Request, Sampling
from coevo.models.constrain import Constraint, UnsupportedConstraint
from coevo.models.grammars import calls_json_schema, clean_schema, tool_call_constraint
from coevo.models.hf import HFBackend
from coevo.models.masks import Grammars, allowed_count
from tiny_glue import load_tiny_model, save_tiny_model, tiny_tokenizer

torch.set_num_threads(1)

WEATHER = {"type": "function", "function": {
    "name": "weather.get_forecast", "description": "Forecast for a city.",
    "parameters": {"type": "object", "required": ["city", "days"], "properties": {
        "city": {"type": "string", "description": "City name."},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "hours": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "where": {"type": "object", "required": ["lat"], "properties": {
            "lat": {"type": "number"}, "exact": {"type": "boolean"}}}}}}}
NOTE = {"name": "note", "parameters": {"type": "object", "properties": {
    "text": {"type": "string"}}, "required": ["text"]}}


@pytest.fixture(scope="module")
def grammars():
    return Grammars(tiny_tokenizer())


def accepts(grammars: Grammars, constraint: Constraint, text: str) -> bool:
    m = grammars.matcher(constraint)
    ids = grammars.tokenizer.encode(text, add_special_tokens=False)
    return all(m.consume_token(i) for i in ids) and m.is_accepting()


# -- grammar construction ----------------------------------------------------------------------


@pytest.mark.parametrize("text,ok", [
    ('[weather.get_forecast(city="Paris", days=3)]', True),
    ('[weather.get_forecast(city="Paris", days=3, unit="fahrenheit", hours=[1, 2, 3], '
     'where={"lat": -1.5, "exact": True})]', True),
    ('[weather.get_forecast(city="Paris", days=3, where={"exact": False, "lat": 1})]', False),
    ('[weather.get_forecast(city="Paris", days=3, where={"lat": 1})]', True),
    ('[weather.get_forecast(city="Paris")]', False),  # required `days` missing
    ('[weather.get_forecast(city="Paris", days=3.5)]', False),  # integer
    ('[weather.get_forecast(city="Paris", days=3, unit="kelvin")]', False),  # enum
    ('[weather.get_forecast(city="Paris", days=3, hours=[1, 2, 3, 4])]', False),  # maxItems
    ('[weather.get_forecast(city="Paris", days=3, wind=2)]', False),  # unknown key
    ('[weather_get_forecast(city="Paris", days=3)]', False),  # not the offered name
    ('[note(text="a \\"quoted\\" word")]', True),
    ('[note(text="x"), weather.get_forecast(city="Rome", days=1)]', True),  # 2 calls allowed
    ('[note(text="x"), note(text="y"), note(text="z")]', False),  # max_calls 2
    ('Sure! [note(text="x")]', False),
])
def test_python_grammar_from_function_specs(grammars, text, ok):
    c = tool_call_constraint([WEATHER, NOTE], "python", max_calls=2)
    assert accepts(grammars, c, text) is ok
    if ok:  # what the grammar admits, coevo's parser reads as the same calls
        assert parse_tool_calls(text, "python").calls


@pytest.mark.parametrize("text,ok", [
    ('{"name":"weather.get_forecast","arguments":{"city":"Oslo","days":2}}', True),
    ('{"name":"weather.get_forecast","arguments":{"city":"Oslo","days":2,"unit":"celsius",'
     '"where":{"lat":59.9}}}', True),
    ('{"name":"weather.get_forecast","arguments":{"city":"Oslo"}}', False),
    ('{"name":"weather.get_forecast","arguments":{"city":"Oslo","days":2,"x":1}}', False),
    ('{"name":"weather.get_forecast","arguments":{"city":"Oslo","days":2,"where":{"lat":1,'
     '"alt":3}}}', False),  # nested objects are closed too
    ('{"name":"note","arguments":{"text":"hi"}}', True),
    ('{"name":"nope","arguments":{}}', False),
    ('[{"name":"note","arguments":{"text":"hi"}}]', False),  # max_calls 1: one object
])
def test_json_grammar_from_function_specs(grammars, text, ok):
    c = tool_call_constraint([WEATHER, NOTE], "json", max_calls=1)
    assert c.kind == "json_schema"
    assert accepts(grammars, c, text) is ok


def test_json_list_of_calls_and_allow_text(grammars):
    c = tool_call_constraint([NOTE], "json", max_calls=3, allow_text=True)
    assert accepts(grammars, c, '[{"name":"note","arguments":{"text":"a"}}]')
    assert accepts(grammars, c, "No function fits this question.")
    assert not accepts(grammars, c, ' [{"name":"note"')  # a call cannot hide behind a space
    strict = tool_call_constraint([NOTE], "python", max_calls=1)
    assert not accepts(grammars, strict, "No function fits this question.")
    lenient = tool_call_constraint([NOTE], "python", max_calls=1, allow_text=True)
    assert accepts(grammars, lenient, "No function fits this question.")
    assert accepts(grammars, lenient, '[note(text="x")]')


def test_chat_template_grammar(grammars):
    c = tool_call_constraint([NOTE], "chat_template", max_calls=2)
    assert accepts(grammars, c, '<tool_call>\n{"name":"note","arguments":{"text":"a"}}\n</tool_call>')
    assert not accepts(grammars, c, '{"name":"note","arguments":{"text":"a"}}')


def test_clean_schema_closes_objects_and_drops_annotations():
    schema = calls_json_schema([WEATHER])
    args = schema["properties"]["arguments"]
    assert args["additionalProperties"] is False
    assert args["properties"]["where"]["additionalProperties"] is False
    assert "description" not in json.dumps(schema) and "default" not in json.dumps(schema)
    # a required key the spec never declares would make a closed object unsatisfiable
    assert clean_schema({"type": "object", "properties": {"a": {}}, "required": ["a", "b"]})[
        "required"] == ["a"]


@pytest.mark.parametrize("fmt,params,match", [
    ("json", {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not"),
    ("json", {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
     "uniqueItems"),
    ("python", {"type": "object", "properties": {"a": {"allOf": [{"type": "string"}]}}},
     "allOf"),
    ("python", {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}}, r"\$ref"),
    ("python", {"type": "object", "properties": {"bad-name": {"type": "string"}}},
     "not a Python identifier"),
    ("python", {"type": "object", "properties": {"a": {"type": "decimal"}}}, "decimal"),
])
def test_unsupported_schemas_are_named_errors(fmt, params, match):
    with pytest.raises(UnsupportedConstraint, match=match):
        tool_call_constraint([{"name": "f", "parameters": params}], fmt)


def test_no_functions_and_unknown_format_are_errors():
    with pytest.raises(UnsupportedConstraint, match="no functions"):
        tool_call_constraint([], "json")
    with pytest.raises(UnsupportedConstraint, match="format 'yaml'"):
        tool_call_constraint([NOTE], "yaml")


# -- the harness knob --------------------------------------------------------------------------


def _harness(**decoding) -> Harness:
    return Harness.model_validate({"name": "h", "system_prompt": "Call a function.",
                                   "tool_format": "python", "decoding": decoding})


def test_constrain_knob_shorthands_and_hash():
    plain = _harness()
    assert plain.decoding.constrain.mode == "none" and plain.constraint([NOTE]) is None
    # unconstrained harnesses keep the hash they had before the knob existed
    assert "constrain" not in plain.content()["decoding"]
    calls = _harness(constrain="tool_calls")
    assert calls.hash != plain.hash and calls.content()["decoding"]["constrain"]["mode"] == "tool_calls"
    assert _harness(constrain={"mode": "tool_calls", "max_calls": 2}).hash != calls.hash
    c = calls.constraint([NOTE])
    assert c.kind == "lark" and "note(" in c.text
    assert calls.constraint([]) is None  # nothing offered, nothing to call
    regex = _harness(constrain={"regex": r"Answer: -?\d+"})
    assert regex.decoding.constrain.mode == "regex" and regex.constraint().kind == "regex"
    schema = _harness(constrain={"json_schema": {"type": "object", "properties": {
        "answer": {"type": "integer"}}, "required": ["answer"]}})
    assert schema.constraint().json_schema["required"] == ["answer"]


def test_constrain_knob_round_trips_through_yaml(tmp_path):
    from coevo.assets.io import dump_asset, load_asset

    h = _harness(constrain={"mode": "tool_calls", "max_calls": 3, "allow_text": True})
    back = load_asset(dump_asset(h, tmp_path / "h.yaml"), kind="harness")
    assert back.hash == h.hash and back.decoding.constrain.max_calls == 3
    plain = dump_asset(_harness(), tmp_path / "p.yaml").read_text()
    assert "constrain" not in plain


@pytest.mark.parametrize("constrain,match", [
    ({"mode": "regex"}, "needs `regex`"),
    ({"mode": "tool_calls", "regex": "a"}, "takes no `regex`"),
    ({"regex": "(unclosed"}, "regex constraint"),
    ({"json_schema": {"type": "objekt"}}, "objekt"),
    ({"mode": "tool_calls", "max_calls": 0}, "greater than or equal to 1"),
])
def test_bad_constrain_settings_name_the_field(tmp_path, constrain, match):
    from coevo.assets.io import load_asset

    path = tmp_path / "h.yaml"
    path.write_text(json.dumps({"name": "h", "system_prompt": "x",
                                "decoding": {"constrain": constrain}}))
    with pytest.raises(AssetError, match=match) as info:
        load_asset(path, kind="harness")
    assert "decoding.constrain" in str(info.value)


# -- masks in batched sampling -----------------------------------------------------------------


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    model, tok = load_tiny_model(save_tiny_model(tmp_path_factory.mktemp("tiny")))
    return HFBackend(model, tok)


def _req(constraint, seed, n=1, **s):
    sampling = dict(temperature=1.0, top_k=20, top_p=0.9, max_new_tokens=80, seed=seed)
    sampling.update(s)
    return Request(messages=[{"role": "user", "content": "Say something about a number"}],
                   sampling=Sampling(**sampling), constraint=constraint, n=n)


PICK = {"name": "pick", "parameters": {"type": "object", "required": ["color"], "properties": {
    "color": {"type": "string", "enum": ["red", "green", "blue"]},
    "bold": {"type": "boolean"}}}}


def test_batched_sampling_respects_each_rows_grammar(backend):
    py = tool_call_constraint([PICK, NOTE], "python", max_calls=2)
    js = tool_call_constraint([PICK], "json", max_calls=1)
    reqs = [_req(py, 1, n=4), _req(js, 2, n=3), _req(None, 3, n=2), _req(py, 4, temperature=0)]
    out = backend.generate(reqs)
    g = Grammars(backend.tokenizer, backend._eos)
    done = 0
    for group, fmt, c_ in zip(out, ["python", "json", None, "python"], [py, js, None, py]):
        for c in group:
            assert c.error is None
            if fmt is None:
                continue
            g.replay(c_, c.token_ids)  # every sampled token was allowed by its row's grammar
            if c.finish_reason == "length":  # a random model may ramble inside a string
                continue
            done += 1
            parsed = parse_tool_calls(c.text, fmt)
            assert parsed.ok and parsed.calls, c.text
            assert {k.name for k in parsed.calls} <= {"pick", "note"}
            for k in parsed.calls:
                if k.name == "pick":
                    assert k.arguments["color"] in ("red", "green", "blue")
                    assert set(k.arguments) <= {"color", "bold"}
    assert done >= 5
    # a random model left alone does not write calls: the masks did
    assert not any(parse_tool_calls(c.text, "python").calls for c in out[2])


def test_constrained_rows_do_not_depend_on_batch_mates(backend):
    py = tool_call_constraint([WEATHER, NOTE], "python", max_calls=2)
    alone = backend.generate([_req(py, 7, n=2)])[0]
    mixed = backend.generate([_req(None, 1, n=3), _req(py, 7, n=2),
                              _req(tool_call_constraint([NOTE], "json"), 9)])[1]
    for a, b in zip(alone, mixed):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   atol=1e-4, rtol=0)


def test_a_constrained_group_still_shares_its_prefill(backend):
    py = tool_call_constraint([PICK, NOTE], "python", max_calls=2)
    separate = HFBackend(backend.model, backend.tokenizer, share_prefill=False)
    shared = backend.generate([_req(py, 3, n=4)])[0]
    alone = separate.generate([_req(py, 3, n=4)])[0]
    assert [c.token_ids for c in shared] == [c.token_ids for c in alone]
    assert len({tuple(c.token_ids) for c in shared}) > 1


def test_constrained_logprobs_are_of_the_masked_distribution(backend):
    """Independent check: a full forward, each position's allowed set from a fresh replay of
    the grammar, temperature and top-k applied by hand."""
    py = tool_call_constraint([WEATHER, NOTE], "python", max_calls=2)
    req = _req(py, 5, n=2, temperature=0.8, top_k=5, top_p=1.0)
    prompt = backend.encode_prompt(req)
    g = Grammars(backend.tokenizer, backend._eos)
    forced = 0
    for c in backend.generate([req])[0]:
        with torch.no_grad():
            logits = backend.model(input_ids=torch.tensor([prompt + c.token_ids])).logits[0].float()
        rows = logits[len(prompt) - 1: len(prompt) - 1 + len(c.token_ids)]
        bitmask = g.replay(py, c.token_ids)
        counts = allowed_count(bitmask)
        for i, (row, tok) in enumerate(zip(rows, c.token_ids)):
            bits = [(int(bitmask[i, j // 32]) >> (j % 32)) & 1 for j in range(row.shape[0])]
            allowed = [j for j, b in enumerate(bits) if b]
            assert tok in allowed and len(allowed) == counts[i]
            x = row[allowed] / 0.8
            keep = x >= x.topk(min(5, len(allowed))).values[-1]
            lp = x[keep] - torch.logsumexp(x[keep], 0)
            want = float(lp[[j for j, a in enumerate(allowed) if keep[j]].index(allowed.index(tok))])
            assert abs(c.logprobs[i] - want) < 1e-5
            if counts[i] == 1:
                forced += 1
                assert c.logprobs[i] == 0.0  # a forced token: probability 1
    assert forced > 5  # names and punctuation the grammar dictates


def test_replay_accepts_a_forced_eos_after_the_grammar_ends(backend):
    # vLLM samples the EOS a complete grammar forces; coevo's loop stops before it. Both replay.
    py = tool_call_constraint([NOTE], "python")
    g = Grammars(backend.tokenizer, backend._eos)
    ids = backend.tokenizer.encode('[note(text="a")]', add_special_tokens=False)
    rows = g.replay(py, ids + [backend.tokenizer.eos_token_id])
    assert allowed_count(rows)[-1] == 1  # the EOS was the only choice
    with pytest.raises(UnsupportedConstraint, match="follows the end of the grammar"):
        g.replay(py, ids + ids[:1])


def test_a_request_the_engine_rejects_fails_with_its_reason(backend):
    bad = Constraint.of_json_schema({"type": "object", "properties": {"a": {"not": {}}}})
    [[c]] = backend.generate([_req(bad, 1)])
    assert c.finish_reason == "error" and "not" in c.error and not c.token_ids


# -- strings: copy -----------------------------------------------------------------------------

HOTEL = {"name": "hotel", "parameters": {"type": "object", "required": ["city", "nights"],
         "properties": {"city": {"type": "string"}, "nights": {"type": "integer"},
                        "room": {"type": "string", "enum": ["single", "double"]},
                        "tags": {"type": "array", "items": {"type": "string"}}}}}
ASK = 'Book 3 nights in New York, near "Central Park", for me.\nThanks'


@pytest.mark.parametrize("text,ok", [
    ('[hotel(city="New York", nights=3)]', True),
    ('[hotel(city="in New York, near", nights=3)]', True),  # any run of whole words
    ('[hotel(city="Central Park", nights=3, room="double")]', True),  # enums stay enums
    ('[hotel(city="Thanks", nights=3, tags=["nights", "me."])]', True),  # list items too
    ('[hotel(city="Paris", nights=3)]', False),  # not in the question
    ('[hotel(city="ew Yo", nights=3)]', False),  # not whole words
    ('[hotel(city="New  York", nights=3)]', False),
    ('[hotel(city=" New York", nights=3)]', False),  # no space at either end
    ('[hotel(city="", nights=3)]', False),
    ('[hotel(city=",", nights=3)]', False),  # punctuation alone is no value
    ('[hotel(city="3", nights=3)]', True),
    ('[hotel(city="near \\"Central", nights=3)]', False),  # a span stops at a quote
    ('[hotel(city="me.\\nThanks", nights=3)]', False),  # and at a line break
    ('[hotel(city="New York", nights=3, room="triple")]', False),
])
def test_copied_strings_are_spans_of_the_task_text(grammars, text, ok):
    c = tool_call_constraint([HOTEL], "python", copy_from=ASK)
    assert accepts(grammars, c, text) is ok
    free = tool_call_constraint([HOTEL], "python")
    assert accepts(grammars, free, '[hotel(city="Paris", nights=3)]')


def test_strings_copy_is_a_harness_knob_checked_where_it_is_written(tmp_path):
    from coevo.assets.io import load_asset

    calls = _harness(constrain="tool_calls")
    copy = _harness(constrain={"mode": "tool_calls", "strings": "copy"})
    # `free`, the default, hashes as before the knob existed; `copy` is a new version
    assert "strings" not in calls.content()["decoding"]["constrain"]
    assert copy.hash != calls.hash and copy.content()["decoding"]["constrain"]["strings"] == "copy"
    assert "%regex" not in calls.constraint([HOTEL], copy_from=ASK).text
    grammar = copy.constraint([HOTEL], copy_from=ASK).text
    assert '"substring_words": "Book 3 nights in New York, near"' in grammar
    for bad, match in [({"decoding": {"constrain": {"mode": "tool_calls", "strings": "copy"}}},
                        "for tool_format python only"),
                       ({"tool_format": "python", "decoding": {"constrain": {"strings": "copy"}}},
                        "needs mode tool_calls"),
                       ({"tool_format": "python", "decoding": {"constrain": {
                           "mode": "tool_calls", "strings": "quote"}}}, "strings")]:
        path = tmp_path / "h.yaml"
        path.write_text(json.dumps({"name": "h", "system_prompt": "x", **bad}))
        with pytest.raises(AssetError, match=match):
            load_asset(path, kind="harness")
    with pytest.raises(UnsupportedConstraint, match="python tool format only"):
        tool_call_constraint([HOTEL], "json", copy_from=ASK)


def test_an_episode_copies_string_values_from_its_own_task(backend):
    """Through the runtime: each task's grammar is built from that task's question, so a
    random model's sampled city is always a span of its own question, never another's."""
    from coevo.agent.episode import run_episodes_sync
    from coevo.envs.base import Score, Task
    from tiny_glue import SingleTurnEnv

    class HotelEnv(SingleTurnEnv):
        name = "test:hotel"
        CITIES = ("Lima", "Oslo", "Cairo", "Quito")

        def tasks(self, split="train", n=None):
            return [Task(id=f"h-{c}", env=self.name, tools=[{"type": "function", "function": CITY}],
                         messages=[{"role": "user", "content": f"Two nights in {c} please"}])
                    for c in self.CITIES]

        def score(self, task, state, response):
            return Score(outcome=0.0, success=False)

    CITY = {"name": "stay", "parameters": {"type": "object", "required": ["city"],
            "properties": {"city": {"type": "string"}}}}
    env = HotelEnv()
    h = _harness(constrain={"mode": "tool_calls", "strings": "copy"},
                 temperature=1.0, max_new_tokens=60)
    trajs = run_episodes_sync(env, env.tasks(), h, backend=backend, samples=3, seeds=11)
    cities = []
    for t in trajs:
        question = t.messages[-2]["content"]
        for call in t.turns[-1].tool_calls:
            cities.append(call.arguments["city"])
            assert call.arguments["city"] in question, (call.arguments, question)
            for other in HotelEnv.CITIES:
                if other not in question:
                    assert other not in call.arguments["city"]
    assert len(cities) >= 6 and len(set(cities)) >= 3  # sampled, not one fixed answer
