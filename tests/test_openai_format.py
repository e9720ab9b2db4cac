"""A harness from an OpenAI chat-completions request body and back: `coevo harness import
--openai` stores it, `coevo harness export --openai` writes the same request; what a harness
cannot hold is refused with the request's field named, and nothing is stored."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from coevo.assets.openai_format import harness_from_request, request_from_harness
from coevo.cli import app
from coevo.errors import AssetError
from coevo.store import Store

runner = CliRunner()

REQUEST = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are the support agent of Acme Travel.\n"
                                      "Call a tool when the user asks for a booking."},
        {"role": "user", "content": "Find me a flight from Oslo to Rome on 2026-05-01."},
        {"role": "assistant", "content": "Searching flights OSL -> FCO on 2026-05-01."},
        {"role": "user", "content": [{"type": "text", "text": "Cancel booking "},
                                     {"type": "text", "text": "AB12."}]},
        {"role": "assistant", "content": "Cancelling booking AB12."},
        {"role": "user", "content": "{{customer_message}}"},
    ],
    "tools": [
        {"type": "function", "function": {
            "name": "search_flights",
            "description": "Search flights between two airports.",
            "parameters": {
                "type": "object",
                "properties": {
                    "route": {"type": "object", "properties": {
                        "from": {"type": "string", "description": "IATA code"},
                        "to": {"type": "string", "description": "IATA code"}},
                        "required": ["from", "to"]},
                    "date": {"type": "string", "format": "date"},
                    "passengers": {"type": "array", "items": {"type": "object", "properties": {
                        "age": {"type": "integer", "minimum": 0},
                        "cabin": {"type": "string", "enum": ["economy", "business"]}}}},
                },
                "required": ["route", "date"],
            }}},
        {"type": "function", "function": {
            "name": "cancel_booking",
            "description": "Cancel a booking by its reference.",
            "parameters": {"type": "object", "properties": {
                "reference": {"type": "string", "pattern": "^[A-Z0-9]{4}$"},
                "refund": {"type": "boolean", "default": True}},
                "required": ["reference"]}}},
        {"type": "function", "function": {"name": "handoff_to_human",
                                          "parameters": {"type": "object", "properties": {}}}},
    ],
    "temperature": 0.2,
    "top_p": 0.9,
    "max_tokens": 512,
    "stop": ["</reply>"],
    "tool_choice": "auto",
}


def test_import_maps_every_field():
    imp = harness_from_request(copy.deepcopy(REQUEST), "acme", "acme.json")
    h = imp.harness
    assert h.system_prompt.startswith("You are the support agent of Acme Travel.")
    assert [t.function.name for t in h.tools] == ["search_flights", "cancel_booking", "handoff_to_human"]
    route = h.tools[0].function.parameters["properties"]["route"]
    assert route["required"] == ["from", "to"]
    assert h.tool_format == "chat_template"
    assert [[m.content for m in d.messages] for d in h.demos] == [
        ["Find me a flight from Oslo to Rome on 2026-05-01.", "Searching flights OSL -> FCO on 2026-05-01."],
        ["Cancel booking AB12.", "Cancelling booking AB12."]]
    assert (h.decoding.temperature, h.decoding.top_p, h.decoding.max_new_tokens,
            h.decoding.stop) == (0.2, 0.9, 512, ["</reply>"])
    assert any(x.startswith("model:") for x in imp.left_out)
    assert any(x.startswith("messages.5:") for x in imp.left_out)  # the task's user message


def test_cli_round_trip_gives_the_same_request(tmp_path):
    src = tmp_path / "acme_support.json"
    src.write_text(json.dumps(REQUEST))
    db = f"sqlite:///{tmp_path / 'c.db'}"
    r = runner.invoke(app, ["harness", "import", "--openai", str(src), "--db", db])
    assert r.exit_code == 0, r.output
    assert "3 tools, 2 demos" in r.output and "left out: model" in r.output
    h = Store.open(db).get_asset("harness", "acme_support")
    out = tmp_path / "deploy" / "acme.json"
    r = runner.invoke(app, ["harness", "export", "acme_support", "--openai", str(out), "--db", db])
    assert r.exit_code == 0, r.output
    back = json.loads(out.read_text())
    expected = {k: v for k, v in REQUEST.items() if k not in ("model", "tool_choice")}
    expected["messages"] = REQUEST["messages"][:3] + [
        {"role": "user", "content": "Cancel booking AB12."}, REQUEST["messages"][4]]
    assert back == expected
    # and the exported body imports to the very same version
    assert harness_from_request(back, "acme_support", "x.json").harness.hash == h.hash


def test_json_schema_response_format_is_the_constraint():
    body = {"messages": [{"role": "system", "content": "Reply in JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}}
    h = harness_from_request(body, "j", "j.json").harness
    assert h.decoding.constrain.mode == "json_schema"
    assert h.decoding.constrain.json_schema["required"] == ["city"]
    back, _ = request_from_harness(h, "j")
    assert back["response_format"] == body["response_format"]


@pytest.mark.parametrize("change, field", [
    (lambda b: b.update(seed=7), "seed"),
    (lambda b: b.update(frequency_penalty=0.5), "frequency_penalty"),
    (lambda b: b.update(tool_choice="required"), "tool_choice"),
    (lambda b: b["tools"][1]["function"].update(strict=True), "tools.1.function.strict"),
    (lambda b: b["messages"][2].update(tool_calls=[]), "messages.2.tool_calls"),
    (lambda b: b["messages"].insert(1, {"role": "system", "content": "x"}), "messages.1.role"),
    (lambda b: b.update(max_tokens=100_000), "max_tokens"),
    (lambda b: b["tools"][0]["function"]["parameters"].update(type="objekt"),
     "tools.0.function.parameters"),
])
def test_what_a_harness_cannot_hold_is_refused_naming_the_field(tmp_path, change, field):
    body = copy.deepcopy(REQUEST)
    change(body)
    with pytest.raises(AssetError) as e:
        harness_from_request(body, "acme", "acme.json")
    assert e.value.field == field, str(e.value)
    src = tmp_path / "acme.json"
    src.write_text(json.dumps(body))
    db = f"sqlite:///{tmp_path / 'c.db'}"
    r = runner.invoke(app, ["harness", "import", "--openai", str(src), "--db", db])
    assert r.exit_code == 1 and f"acme.json: {field}:" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert Store.open(db).list_assets("harness") == []


def test_export_refuses_text_tool_calls(tmp_path):
    h = harness_from_request(copy.deepcopy(REQUEST), "acme", "acme.json").harness
    with pytest.raises(AssetError) as e:
        request_from_harness(h.child(tool_format="json"), "h")
    assert e.value.field == "tool_format"
    body, notes = request_from_harness(h.child(workflow={"max_turns": 4}), "h")
    assert notes == ["workflow.max_turns: 4"] and body["tools"]
