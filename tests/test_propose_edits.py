"""The `edits` proposer: typed edit operations on the seed harnesses and the seed skill
library, the per-round grammar (checked with jsonschema and with llguidance), the proposer
end to end (a replayed cassette through the loop; a tiny random model under the grammar),
and the edits stored with the proposal and shown by `proposals show` and the review page.

tests/cassettes/edits_hint.jsonl was recorded once by `record()` below (run `python
tests/test_propose_edits.py`) with a scripted backend whose answers are written out here; a
changed prompt or grammar is a CassetteMiss naming the file: re-record.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest
import torch

from coevo.assets.base import changed_fields
from coevo.assets.harness import demo_messages
from coevo.assets.io import load_seed_dir
from coevo.audit import proposal_view, render_text
from coevo.envs.base import Feedback
from coevo.models.constrain import Constraint
from coevo.models.dialects import violation
from coevo.models.grammars import bound_strings, clean_schema
from coevo.models.scripted import ScriptedBackend
from coevo.propose import make_proposer
from coevo.propose.base import Incumbent, ProposalContext, check_candidate
from coevo.propose.demos import to_demo
from coevo.propose.edits import (EditAssets, EditsProposer, apply_edits, demo_refs, error_kinds,
                                 parse_edits)
from coevo.propose.lm import output_schema
from coevo.propose.operators import RULES_CLOSE, RULES_OPEN, EditView, edits_schema, split_rules
from coevo.serve.app import create_app
from coevo.store.queries import open_readonly
from coevo.trajectory import Trajectory, Turn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_glue import HINT, hint_loop_run, load_tiny_model, save_tiny_model  # noqa: E402

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent
CASSETTES = Path(__file__).resolve().parent / "cassettes"
SEEDS: dict = {}
for _a in load_seed_dir(ROOT):
    SEEDS.setdefault(_a.kind, {})[_a.name] = _a
REASONING, CALLING = SEEDS["harness"]["reasoning"], SEEDS["harness"]["function_calling"]
LIBRARY, SKILLS = SEEDS["skill_library"]["seed"], list(SEEDS["skill"].values())
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def episode(h, i: int, ok: bool, reply: str, criteria: dict, tools=(), parse_error=None):
    task_id = f"rg:x@0:{i}"  # as the runtime does: a task is never shown its own demo
    msgs = [{"role": "system", "content": h.render_system(task_tools=tools)},
            *demo_messages([d for d in h.demos if d.source != task_id]),
            {"role": "user", "content": f"What is {i} + {i}?"},
            {"role": "assistant", "content": reply}]
    return Trajectory(id=f"traj-{i}-{int(ok)}", env="rg:x", task_id=task_id,
                      messages=msgs, outcome=float(ok), success=ok, reward=float(ok),
                      answer=None if "Answer" not in reply else reply.split()[-1],
                      criteria=criteria, harness=h.hash, split="train",
                      turns=[Turn(index=0, start=0, end=1, text=reply, parse_error=parse_error)])


def reasoning_ctx(harness=REASONING, library=LIBRARY, skills=SKILLS) -> ProposalContext:
    """Two tasks solved (Answer: line), two failed (one without an answer line)."""
    trajs = [episode(harness, 1, True, "1 + 1 = 2\nAnswer: 2", {"answer_line": 1.0}),
             episode(harness, 2, True, "2 + 2 = 4\nAnswer: 4", {"answer_line": 1.0}),
             episode(harness, 3, False, "3 + 3 = 7\nAnswer: 7", {"answer_line": 1.0}),
             episode(harness, 4, False, "It is eight.", {"answer_line": 0.0})]
    inc = Incumbent(harness=harness, library=library, skills=skills,
                    rubric=SEEDS["rubric"]["reasoning"])
    return ProposalContext(run="r", round=1, incumbent=inc, trajectories=trajs,
                           harnesses={harness.hash: harness}, seed=1)


def calling_ctx() -> ProposalContext:
    trajs = [episode(CALLING, i, False, "The weather is nice.", {"decodes": 0.0}, tools=[WEATHER],
                     parse_error="not a Python call list" if i == 1 else None) for i in (1, 2)]
    return ProposalContext(run="r", round=1, trajectories=trajs, harnesses={CALLING.hash: CALLING},
                           incumbent=Incumbent(harness=CALLING, library=LIBRARY, skills=SKILLS,
                                               rubric=SEEDS["rubric"]["function_calling"]))


def view_of(ctx: ProposalContext, max_tokens: int = 768) -> EditView:
    return EditsProposer(model={"max_tokens": max_tokens}, backend=ScriptedBackend([])).view(ctx)


def edit(ctx: ProposalContext, *edits: dict, max_ops: int = 2):
    """The candidates for `edits` (parsed against the round's schema, applied)."""
    view = view_of(ctx)
    ops, error = parse_edits(list(edits), edits_schema(view, max_ops))
    assert error is None, error
    cands = apply_edits(ops, view, "edits")
    for c in cands:
        assert c.asset is None or check_candidate(c, ctx.incumbent) is None
    return cands


# --------------------------------------------------------------------------- each operator


def test_add_and_drop_rule_edit_one_line_of_the_rules_block():
    ctx = reasoning_ctx()
    rule = "Always end with the line Answer: <number>."
    [c] = edit(ctx, {"kind": "add_rule", "error_kind": "criterion:answer_line", "text": rule})
    assert changed_fields(REASONING, c.asset) == ["system_prompt"]
    assert c.asset.system_prompt == f"{REASONING.system_prompt}\n\n{RULES_OPEN}\n1. {rule}\n{RULES_CLOSE}"
    assert c.asset.system_prompt.count("\n") == REASONING.system_prompt.count("\n") + 4
    assert c.edits == [{"kind": "add_rule", "error_kind": "criterion:answer_line", "text": rule}]

    two = c.asset.child(system_prompt=f"{c.asset.system_prompt[:-len(RULES_CLOSE)]}2. Check the sum.\n{RULES_CLOSE}")
    assert split_rules(two.system_prompt) == (REASONING.system_prompt, [rule, "Check the sum."])
    ctx2 = reasoning_ctx(harness=two)
    [d] = edit(ctx2, {"kind": "drop_rule", "index": 1})
    assert split_rules(d.asset.system_prompt) == (REASONING.system_prompt, ["Check the sum."])
    assert "1. Check the sum." in d.asset.system_prompt  # renumbered
    assert d.edits == [{"kind": "drop_rule", "index": 1, "rule": rule}]
    # both dropped: the prompt is the hand-written one again, exactly
    [e] = edit(ctx2, {"kind": "drop_rule", "index": 2}, {"kind": "drop_rule", "index": 1})
    assert e.asset.system_prompt == REASONING.system_prompt and e.asset.hash == REASONING.hash
    # the same rule twice: the second is skipped, recorded, and alone it changes nothing
    [f] = edit(reasoning_ctx(harness=c.asset), {"kind": "add_rule", "error_kind": "wrong_answer",
                                                "text": rule})
    assert f.asset is None and "every edit was skipped" in f.error
    assert f.edits[0]["skipped"] == "already a rule"


def test_demo_operations_use_the_rounds_successful_train_trajectories():
    ctx = reasoning_ctx()
    refs = demo_refs(ctx, 4)
    assert list(refs) == ["t1", "t2"]  # the two successful episodes, nothing failed
    assert refs["t1"].demo == to_demo(ctx.trajectories[0], REASONING)
    assert refs["t1"].demo.messages[-1].content == "1 + 1 = 2\nAnswer: 2"

    [a] = edit(ctx, {"kind": "add_demo", "trajectory_ref": "t2"})
    assert a.asset.demos == [*REASONING.demos, refs["t2"].demo]
    assert changed_fields(REASONING, a.asset) == ["demos"]
    assert a.edits[0]["trajectory"] == "traj-2-1" and a.edits[0]["task"] == "rg:x@0:2"

    [r] = edit(ctx, {"kind": "replace_demo", "index": 1, "trajectory_ref": "t1"})
    assert r.asset.demos == [refs["t1"].demo] and r.edits[0]["demo_source"] == "handwritten"

    # drop_demo removes the right one of two; indices refer to the incumbent as shown
    two = a.asset
    ctx2 = reasoning_ctx(harness=two)
    [d] = edit(ctx2, {"kind": "drop_demo", "index": 1})
    assert d.asset.demos == [refs["t2"].demo]
    [d2] = edit(ctx2, {"kind": "drop_demo", "index": 1},
                {"kind": "replace_demo", "index": 1, "trajectory_ref": "t1"})
    assert d2.asset.demos == [refs["t2"].demo]
    assert d2.edits[1]["skipped"] == "demo 1 was already removed"
    assert [x.task for x in demo_refs(ctx2, 4).values()] == ["rg:x@0:1"]  # not its demos again



def test_retrieve_demos_switches_to_per_task_retrieval_over_the_offered_episodes():
    ctx = reasoning_ctx()
    refs = demo_refs(ctx, 4)
    assert "retrieve_demos" in json.dumps(edits_schema(view_of(ctx), 2))
    [c] = edit(ctx, {"kind": "retrieve_demos", "k": 3})
    assert changed_fields(REASONING, c.asset) == ["demo_selection.k", "demo_selection.pool",
                                                  "demo_selection.select"]
    sel = c.asset.demo_selection
    assert sel.select == "retrieve" and sel.k == 3
    assert sel.pool == [refs["t1"].demo, refs["t2"].demo]  # the successful train episodes
    assert c.asset.demos == REASONING.demos and c.asset.hash != REASONING.hash
    assert c.edits == [{"kind": "retrieve_demos", "k": 3, "pool": ["traj-1-1", "traj-2-1"]}]
    # once retrieving, the switch is not offered again; k outside 1..4 never is
    assert "retrieve_demos" not in json.dumps(edits_schema(view_of(reasoning_ctx(harness=c.asset)), 2))
    ops, error = parse_edits([{"kind": "retrieve_demos", "k": 5}], edits_schema(view_of(ctx), 2))
    assert not ops and "retrieve_demos" in error


def test_error_kinds_follow_the_verifiers_diagnosis_of_failed_train_episodes():
    ctx = calling_ctx()
    assert error_kinds(ctx.trajectories, ctx.incumbent.rubric) == {
        "criterion:decodes": 2, "no_answer": 1, "parse_error": 1}
    fb = {"traj-1-0": Feedback(kind="wrong_type", text="wrong type for parameter 'city'"),
          "traj-2-0": Feedback(kind="wrong_type", text="wrong type for parameter 'city'")}
    ctx = ctx.model_copy(update={"feedback": fb})
    assert error_kinds(ctx.trajectories, ctx.incumbent.rubric, fb) == {
        "criterion:decodes": 2, "wrong_type": 2}
    schema = edits_schema(view_of(ctx), 2)
    add_rule = [b for b in schema["items"]["anyOf"]
                if b["properties"]["kind"]["const"] == "add_rule"]
    assert add_rule[0]["properties"]["error_kind"]["enum"] == ["criterion:decodes", "wrong_type"]
    # the digest the model reads carries the diagnosis
    p = EditsProposer(model={"max_tokens": 768}, backend=ScriptedBackend([]))
    inputs = p.inputs(ctx, p.view(ctx))
    assert "wrong_type" in inputs["round_digest"] and "parameter 'city'" in inputs["round_digest"]

def test_text_knob_and_constrain_operations_change_exactly_their_field():
    ctx = calling_ctx()
    cases = [
        ({"kind": "tighten_answer_format", "text": "Reply with [name(arg=value)] only."},
         ["answer_format"], lambda h: h.answer_format == "Reply with [name(arg=value)] only."),
        ({"kind": "set_tool_doc", "preamble": "Pick exactly one of these:"},
         ["tool_doc_preamble"], lambda h: h.tool_doc_preamble == "Pick exactly one of these:"),
        ({"kind": "toggle_constrain", "value": "tool_calls"},  # (the default constrain is
         # left out of a harness's content, so all of its fields appear at once)
         ["decoding.constrain." + f for f in ("allow_text", "json_schema", "max_calls", "mode",
                                              "regex")],
         lambda h: h.decoding.constrain.mode == "tool_calls"
         and h.decoding.constrain.max_calls == 1),
        ({"kind": "set_knob", "name": "temperature", "value": 0.2},
         ["decoding.temperature"], lambda h: h.decoding.temperature == 0.2),
        ({"kind": "set_knob", "name": "max_turns", "value": 3},
         ["workflow.max_turns"], lambda h: h.workflow.max_turns == 3),
        ({"kind": "set_knob", "name": "tool_doc_format", "value": "json"},
         ["tool_doc_format"], lambda h: h.tool_doc_format == "json"),
    ]
    for op, fields, ok in cases:
        [c] = edit(ctx, op)
        assert changed_fields(CALLING, c.asset) == fields and ok(c.asset), op
        assert c.asset.parent == CALLING.hash and c.kind == "harness"
    # the reasoning harness shows no tool docs: no preamble, no tool_calls grammar offered
    view = view_of(reasoning_ctx())
    kinds = {b["properties"]["kind"]["const"] for b in edits_schema(view, 2)["items"]["anyOf"]}
    assert "set_tool_doc" not in kinds and "toggle_constrain" not in kinds and "add_rule" in kinds


def test_skill_operations_retire_and_activate_library_members():
    ctx = reasoning_ctx()
    [c] = edit(ctx, {"kind": "retire_skill", "name": "function-call-format"})
    assert c.kind == "skill_library" and [s.name for s in c.skills] == ["function-call-format"]
    assert c.skills[0].state == "retired" and c.skills[0].parent is not None
    assert {r.name: r.state for r in c.asset.skills} == {
        "argument-extraction": "active", "arithmetic-checking": "active",
        "function-call-format": "retired"}
    # a hidden member can be activated; retired is final (not offered)
    from coevo.propose.skills import child_library

    hidden = next(s for s in SKILLS if s.name == "argument-extraction").child(state="hidden")
    skills = [hidden if s.name == hidden.name else s for s in SKILLS]
    ctx2 = reasoning_ctx(library=child_library(LIBRARY, [hidden]), skills=skills)
    kinds = {b["properties"]["kind"]["const"]: b for b in edits_schema(view_of(ctx2), 2)["items"]["anyOf"]}
    assert kinds["activate_skill"]["properties"]["name"] == {"enum": ["argument-extraction"]}
    [a] = edit(ctx2, {"kind": "activate_skill", "name": "argument-extraction"})
    assert {r.name: r.state for r in a.asset.skills}["argument-extraction"] == "active"
    # harness and skill edits in one answer: two candidates, one per asset
    both = edit(ctx, {"kind": "set_knob", "name": "top_k", "value": 10},
                {"kind": "retire_skill", "name": "argument-extraction"})
    assert [x.kind for x in both] == ["harness", "skill_library"]
    assert [len(x.edits) for x in both] == [1, 1]


# --------------------------------------------------------------------------- the grammar


def test_the_rounds_schema_admits_only_what_the_round_offers():
    ctx = reasoning_ctx()
    view = view_of(ctx, max_tokens=320)
    schema = edits_schema(view, 2)
    assert error_kinds(ctx.trajectories, ctx.incumbent.rubric) == {
        "criterion:answer_line": 1, "no_answer": 1, "wrong_answer": 1}
    good = [{"kind": "set_knob", "name": "temperature", "value": 0.3},
            {"kind": "add_rule", "error_kind": "no_answer", "text": "End with Answer: <number>."}]
    jsonschema.validate(good, schema)
    bad = {
        "unknown knob": [{"kind": "set_knob", "name": "gate.alpha", "value": 0.5}],
        "knob not offered": [{"kind": "set_knob", "name": "top_p", "value": 0.5}],
        "out of range": [{"kind": "set_knob", "name": "temperature", "value": 3.5}],
        "no such ref": [{"kind": "add_demo", "trajectory_ref": "t9"}],
        "no such rule": [{"kind": "drop_rule", "index": 1}],
        "no such demo": [{"kind": "drop_demo", "index": 2}],
        "unseen error kind": [{"kind": "add_rule", "error_kind": "timeout", "text": "Be fast."}],
        "two lines": [{"kind": "add_rule", "error_kind": "no_answer", "text": "a\nb c d"}],
        "not words": [{"kind": "add_rule", "error_kind": "no_answer", "text": "1.00"}],
        "too long": [{"kind": "tighten_answer_format", "text": "Say " + "x" * 93}],
        "unknown kind": [{"kind": "run_python", "code": "print(1)"}],
        "extra slot": [{"kind": "drop_demo", "index": 1, "path": "/etc"}],
        "too many": good + good[:1],
    }
    for why, edits in bad.items():
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(edits, schema)
        ops, error = parse_edits(edits, schema)
        assert ops == [] and error, why
    assert parse_edits(bad["unknown knob"], schema)[1].startswith(
        'edits[0] set_knob: name "gate.alpha" is not offered (offered: max_turns, temperature')
    assert "3.5 is greater than the maximum of 2.0" in parse_edits(bad["out of range"], schema)[1]
    assert 'trajectory_ref: \'t9\' is not one of' in parse_edits(bad["no such ref"], schema)[1]
    assert "kind \"run_python\" is not offered" in parse_edits(bad["unknown kind"], schema)[1]

    # llguidance compiles the constraint the engine builds and holds the same line
    full = output_schema(EditAssets)
    full["properties"].update({"edits": schema, "rationale": {"type": "string", "maxLength": 40,
                                                              "pattern": "^\\S[^\\n\\r]*$"}})
    bounded = bound_strings(clean_schema(full), 320)
    assert bounded["properties"]["edits"]["items"]["anyOf"] == schema["items"]["anyOf"]  # caps kept
    c = Constraint.of_json_schema(bounded, source="edits")
    c.check()

    def answer(edits):
        return json.dumps({"edits": edits, "rationale": "r"}, separators=(",", ":"))

    assert violation(c, answer(good)) == ""
    for why in ("unknown knob", "out of range", "no such ref", "no such rule", "unseen error kind",
                "two lines", "not words", "too long", "unknown kind", "extra slot", "too many"):
        assert violation(c, answer(bad[why])), why


# --------------------------------------------------------------------------- end to end

HINT_ANSWER = {"edits": [{"kind": "add_rule", "error_kind": "wrong_answer", "text": HINT}],
               "rationale": "every reply starts with z; the verifier wants a-m"}
ESCAPE_ANSWER = {"edits": [{"kind": "add_rule", "error_kind": "wrong_answer",
                            "text": "Say <script>alert(1)</script> & hi"},
                           {"kind": "set_knob", "name": "temperature", "value": 0.5}],
                 "rationale": "<b>bold</b>"}


def loop_run(tmp: Path, proposers: list):
    return hint_loop_run(tmp, proposers, name="edits-run")


def test_replayed_edits_are_gated_stored_and_shown(tmp_path):
    p = make_proposer("edits", cassette=str(CASSETTES / "edits_hint.jsonl"), mode="replay",
                      candidates=2)
    store, res = loop_run(tmp_path, [p])
    assert p.lm.coevo_engine.calls == 0  # replayed: no model loaded
    hint, escaped = store.proposals(res.run)
    assert hint.status == "accepted" and hint.proposer == "edits" and hint.error is None
    assert hint.edits == HINT_ANSWER["edits"]
    assert sorted(hint.diff) == ["system_prompt"]  # field paths only: the edits are split out
    final = store.get_asset("harness", res.incumbent["harness"])
    assert split_rules(final.system_prompt) == ("Reply briefly.", [HINT])
    assert res.final is not None and res.final.mean == 1.0
    assert escaped.edits[1] == {"kind": "set_knob", "name": "temperature", "value": 0.5}

    from typer.testing import CliRunner

    from coevo.cli import app

    shown = CliRunner().invoke(app, ["proposals", "show", hint.id[:12], "--db",
                                     f"sqlite:///{tmp_path / 'loop.db'}"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert f'1. add_rule(error_kind="wrong_answer", text="{HINT}")' in shown.output
    assert "edits (1)" in shown.output
    two = render_text(proposal_view(store, escaped.id), width=200)
    assert '2. set_knob(name="temperature", value=0.5)' in two

    page = page_client(tmp_path / "loop.db").get(f"/proposals/{escaped.id}").text
    assert "<script>alert(1)</script>" not in page and "<b>bold</b>" not in page
    assert "Say &lt;script&gt;alert(1)&lt;/script&gt; &amp; hi" in page
    assert page.count('class="edit-row"') == 2 and "set_knob" in page


def page_client(db: Path):
    from starlette.testclient import TestClient

    return TestClient(create_app(open_readonly(f"sqlite:///{db}", readonly=True)))


def test_a_bad_unconstrained_answer_is_an_invalid_candidate_naming_the_edit():
    ctx = reasoning_ctx()
    answers = [json.dumps({"edits": [{"kind": "set_knob", "name": "temperature", "value": 9}],
                           "rationale": "hot"}), "no JSON here"]
    p = EditsProposer(backend=ScriptedBackend(answers), candidates=2)
    bad, garbage = p.propose(ctx)
    assert bad.asset is None and "edits[0] set_knob: value: 9 is greater than the maximum" in bad.error
    assert garbage.asset is None and "not the requested JSON" in garbage.error
    assert p.last_cost["proposer_calls"] == 2.0


def test_a_tiny_random_model_under_the_grammar_always_gives_valid_edits(tmp_path):
    from coevo.models.hf import HFBackend

    model, tok = load_tiny_model(save_tiny_model(tmp_path / "tiny"))
    backend = HFBackend(model, tok)
    base = reasoning_ctx()
    kinds = set()
    for seed in range(6):
        ctx = base.model_copy(update={"seed": seed})
        p = EditsProposer(model={"max_tokens": 200, "temperature": 1.0}, backend=backend,
                          max_digest_chars=300, transcript_chars=100, ref_chars=80)
        schema = edits_schema(p.view(ctx), p.max_ops)
        cands = p.propose(ctx)
        assert cands and p.lm.coevo_engine.calls == 1
        raw = json.loads(cands[0].raw_output)
        jsonschema.validate(raw["edits"], schema)
        for c in cands:
            assert c.asset is not None and check_candidate(c, ctx.incumbent) is None, c.error
            kinds.update(e["kind"] for e in c.edits)
    assert len(kinds) >= 2  # the seeds explore different operations


def test_each_call_lists_the_operations_in_its_own_seeded_order(monkeypatch):
    """The embedded model takes the first listed operation, so a fixed menu order made one
    operation the only edit it ever proposed: each call's menu and grammar branches follow a
    permutation drawn from its seed (the same operations, the same order in both)."""
    seen = []
    monkeypatch.setattr(EditsProposer, "_one",
                        lambda self, view, schema, inputs, seed: seen.append((schema, inputs)) or [])
    base = reasoning_ctx()
    kinds = lambda schema: [b["properties"]["kind"]["const"] for b in schema["items"]["anyOf"]]
    firsts = []
    for shuffle in (True, False):
        seen.clear()
        for seed in range(6):
            p = EditsProposer(model={"max_tokens": 768}, backend=ScriptedBackend([]),
                              candidates=2, shuffle=shuffle)
            p.propose(base.model_copy(update={"seed": seed}))
        full = kinds(edits_schema(view_of(base), 2))
        assert len(seen) == 12
        for schema, inputs in seen:
            order = list(dict.fromkeys(kinds(schema)))  # a knob operator has several branches
            assert sorted(kinds(schema)) == sorted(full)  # the same branches, reordered
            menu = [ln[2:].split("(")[0] for ln in inputs["operations"].splitlines()[1:]]
            assert menu == order
        firsts.append({kinds(schema)[0] for schema, _ in seen})
    assert len(firsts[0]) >= 4 and firsts[1] == {"add_rule"}


def test_an_operator_missing_part_of_the_contract_is_refused_at_registration():
    from typing import Literal

    from coevo.propose import operators

    class Half(operators.Operator):
        kind: Literal["half_op"] = "half_op"

        @classmethod
        def branches(cls, view):
            return []

    before = operators.OPERATORS.names()
    with pytest.raises(TypeError, match="operator Half: does not implement apply, menu"):
        operators.register(Half)
    assert operators.OPERATORS.names() == before and "half_op" not in operators.ORDER


def test_bad_options_are_clear_errors():
    from coevo.errors import CoevoError

    for options, fragment in [({"ops": ["rewrite_all"]}, "ops: unknown rewrite_all"),
                              ({"max_ops": 0}, "max_ops"), ({"knobs": ["gate.alpha"]}, "knobs"),
                              ({"model": {"max_tokens": 64}, "max_ops": 4}, "too small")]:
        with pytest.raises(CoevoError, match=fragment):
            make_proposer("edits", backend=ScriptedBackend([]), **options)


def record() -> None:
    """Re-record the cassette with scripted answers (run this file as a script)."""
    tape = CASSETTES / "edits_hint.jsonl"
    tape.unlink(missing_ok=True)
    answers = [json.dumps(HINT_ANSWER), json.dumps(ESCAPE_ANSWER)]
    p = EditsProposer(cassette=str(tape), mode="record", candidates=2,
                      backend=ScriptedBackend(answers))
    with tempfile.TemporaryDirectory() as tmp:
        store, res = loop_run(Path(tmp), [p])
        print({x.id[:8]: (x.status, x.error) for x in store.proposals(res.run)})


if __name__ == "__main__":
    record()
