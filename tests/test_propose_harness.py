"""The `harness` proposer: trajectories -> DSPy program (replayed from a cassette) -> candidate
harness -> the loop's recording and paired gate.

The cassettes tests/cassettes/harness_*.jsonl were recorded once by `record()` below (run
`python tests/test_propose_harness.py`) with `HandWritten`, a fake backend whose answers are
written out here: the cassette holds exactly what a model would have returned to each prompt.
A changed prompt (signature, digest, trajectories, loop) is a CassetteMiss naming the file:
re-record.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from coevo.assets.base import changed_fields, forbidden_changes
from coevo.assets.harness import Harness
from coevo.assets.rubric import Rubric
from coevo.errors import CoevoError
from coevo.models.base import Completion
from coevo.propose import make_proposer
from coevo.propose.base import Incumbent, ProposalContext, check_candidate
from coevo.propose.digest import PREAMBLE
from coevo.propose.harness import (
    DEFAULT_KNOBS,
    KNOBS,
    HarnessProposer,
    build_revision,
    harness_text,
    knobs_text,
)
from coevo.trajectory import Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_glue import HINT, hint_loop_run, tiny_harness  # noqa: E402

CASSETTES = Path(__file__).resolve().parent / "cassettes"
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluates an expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}

# What a model returns in each scenario (JSON, as the JSONAdapter asks).
HINT_ANSWER = {
    "system_prompt": f"Reply briefly.\n{HINT}", "answer_format": None, "tool_doc_preamble": None,
    "tool_descriptions": {}, "workflow": {"temperature": 0.5},
    "rationale": "Every episode answered 'zz' and failed; the verifier wants a first letter a-m.",
    "predicted_effect": "success 0% -> 100% on the say family"}
MALFORMED = "Sure! I would make the system prompt say: begin with the letter a. Hope this helps"
TOOLS_ANSWERS = [  # candidates=3: one call each, different seeds
    {"tool_descriptions": {"calculator": "Evaluates an arithmetic expression such as 2*(3+4). "
                                         "Pass it as the string argument expression."},
     "workflow": {"reflect_on_tool_error": True, "max_turns": 4},
     "rationale": "2 of 3 failures pass a number instead of an expression string",
     "predicted_effect": "fewer tool errors"},
    {"workflow": {"max_turns": 99}, "rationale": "more turns", "predicted_effect": "more retries"},
    {"tool_descriptions": {"python": "Runs code."}, "rationale": "r", "predicted_effect": "p"},
]


class HandWritten:
    """A coevo Backend answering request i with answers[i] (used only to record cassettes)."""

    name, tokenizer = "hand-written", None

    def __init__(self, answers: list):
        self.answers = [a if isinstance(a, str) else json.dumps(a) for a in answers]
        self.requests: list = []

    def generate(self, requests):
        out = []
        for r in requests:
            out.append([Completion(text=self.answers[len(self.requests) % len(self.answers)],
                                   trainable=False)])
            self.requests.append(r)
        return out


# --------------------------------------------------------------------------- the loop end to end


def loop_run(tmp: Path, proposers: list):
    return hint_loop_run(tmp, proposers)


def replay(tape: str, **kw) -> HarnessProposer:
    return make_proposer("harness", cassette=str(CASSETTES / tape), mode="replay", **kw)


def test_revision_is_recorded_gated_and_accepted_malformed_one_stored_invalid(tmp_path):
    good = replay("harness_hint.jsonl")
    bad = HarnessProposer(cassette=str(CASSETTES / "harness_malformed.jsonl"), mode="replay",
                          name="harness-2")
    store, res = loop_run(tmp_path, [good, bad])
    assert good.lm.coevo_engine.calls == 0 == bad.lm.coevo_engine.calls  # no model loaded
    rows = {p.proposer: p for p in store.proposals(res.run)}
    ok, broken = rows["harness"], rows["harness-2"]

    # the valid revision: stored with the exchange, its field diff, gated and accepted
    assert ok.status == "accepted" and ok.kind == "harness" and ok.error is None
    assert json.loads(ok.raw_output) == HINT_ANSWER
    assert sorted(ok.diff) == ["decoding.temperature", "system_prompt"]
    assert f"+{HINT}" in ok.diff["system_prompt"] and "+0.5" in ok.diff["decoding.temperature"]
    assert ok.rationale.startswith("Every episode answered 'zz'")
    assert ok.model == "embedded"
    assert ok.predicted_effect == HINT_ANSWER["predicted_effect"]
    prompt = "\n".join(m["content"] for m in json.loads(ok.prompt))
    assert PREAMBLE in prompt and "<<<TRAJECTORY 1 FAILED task=train-" in prompt and "[assistant] zz" in prompt
    assert "max_turns = 1 (integer 1..32)" in prompt and "temperature = 1.0 (number 0.0..2.0)" in prompt
    assert '"system_prompt": "Reply briefly."' in prompt
    assert "success rate: 0%" in prompt
    [d] = store.decisions(ok.id)
    assert d.accepted and d.policy == "paired" and len(d.evidence) == 12
    assert {(e.incumbent, e.candidate) for e in d.evidence} == {(0.0, 1.0)}
    final = store.get_asset("harness", res.incumbent["harness"])
    assert final.hash == ok.candidate and final.parent == ok.parent
    assert HINT in final.system_prompt and final.decoding.temperature == 0.5
    assert final.decoding.max_new_tokens == 8 and final.name == "tiny"  # the rest is kept
    assert res.final is not None and res.final.mean == 1.0

    # the malformed one: invalid, raw output and parse error kept, never gated
    assert broken.status == "invalid" and broken.candidate is None and broken.diff == {}
    assert broken.raw_output == MALFORMED and "not the requested JSON" in broken.error
    assert json.loads(broken.prompt) and store.decisions(broken.id) == []
    assert broken.model == "embedded"
    assert store.budget_totals(res.run, round=0)["proposer_calls"] == 2.0


# --------------------------------------------------------------------------- several candidates


def tool_context() -> ProposalContext:
    """A harness with its own calculator tool; episodes that pass a number, not a string."""
    h = tiny_harness(tools=[CALCULATOR], workflow={"max_turns": 2})
    rubric = Rubric.model_validate({"name": "calc", "criteria": [
        {"id": "called", "kind": "outcome", "description": "a tool call ran",
         "params": {"detail": "called"}}]})
    trajs = []
    for i in range(4):
        ok = i == 3
        call = '{"name": "calculator", "arguments": {"expression": "%s"}}' % (f"{i}+1" if ok else i)
        msgs = [{"role": "system", "content": h.system_prompt},
                {"role": "user", "content": f"What is {i} + 1?"},
                {"role": "assistant", "content": call},
                {"role": "tool", "name": "calculator",
                 "content": str(i + 1) if ok else "error: expression must be a string"},
                {"role": "assistant", "content": str(i + 1) if ok else "I cannot."}]
        trajs.append(Trajectory(env="test:calc", task_id=f"train-{i}", messages=msgs,
                                outcome=float(ok), success=ok, reward=float(ok),
                                criteria={"called": float(ok)}, harness=h.hash))
    return ProposalContext(run="r", round=2, incumbent=Incumbent(harness=h, rubric=rubric),
                           trajectories=trajs, harnesses={h.hash: h}, seed=3)


def test_candidates_are_separate_calls_with_different_seeds_each_checked():
    p = replay("harness_tools.jsonl", candidates=3)
    ctx = tool_context()
    h = ctx.incumbent.harness
    good, bounds, unknown = p.propose(ctx)
    # replayed from the cassette: three calls, no tokens computed
    assert p.last_cost == {"proposer_calls": 3.0, "tokens": 0.0} and p.lm.coevo_engine.calls == 0
    prompts = [json.loads(c.prompt) for c in (good, bounds, unknown)]
    assert prompts[0] == prompts[1] == prompts[2]  # same prompt, the seed is what differs
    tape = [json.loads(line) for line in (CASSETTES / "harness_tools.jsonl").read_text().splitlines()]
    assert [t["sampling"]["seed"] for t in tape] == [3 * 1009, 3 * 1009 + 1, 3 * 1009 + 2]

    # 1: only the tool's description and two workflow knobs change; parameters are untouched
    assert check_candidate(good, ctx.incumbent) is None
    assert changed_fields(h, good.asset) == ["tools", "workflow.max_turns",
                                             "workflow.reflect_on_tool_error"]
    fn = good.asset.tools[0].function
    assert fn.description.startswith("Evaluates an arithmetic expression")
    assert fn.name == "calculator" and fn.parameters == CALCULATOR["function"]["parameters"]
    assert good.asset.workflow.max_turns == 4 and good.asset.workflow.reflect_on_tool_error
    text = "\n".join(m["content"] for m in prompts[0])
    assert '"calculator": "Evaluates an expression."' in text
    assert "called (a tool call ran): 25%" in text
    assert "error: expression must be a string" in text  # the tool result reached the digest
    assert "[system]" not in text and h.system_prompt not in text.split("round_digest")[-1]

    # 2: a value outside the declared bounds, named with its field; 3: a tool it does not have
    assert bounds.asset is None and bounds.error.startswith("workflow.max_turns (harness.workflow.max_turns)")
    assert "less than or equal to 32" in bounds.error and json.loads(bounds.raw_output) == TOOLS_ANSWERS[1]
    assert unknown.asset is None and unknown.error.startswith("tool_descriptions.python: no such tool")
    assert "its tools: calculator" in unknown.error
    assert check_candidate(bounds, ctx.incumbent) == bounds.error


# --------------------------------------------------------------------------- building revisions


def test_build_revision_rejects_bad_output_naming_the_field():
    h = tiny_harness(tools=[CALCULATOR])
    cases = [
        ({}, "changes nothing"),
        ({"system_prompt": "  Reply briefly.  \n\n", "answer_format": ""}, "changes nothing"),
        ({"workflow": {"max_turns": 1}}, "changes nothing"),  # equal to the current value
        ({"system_prompt": ["a", "list"]}, "system_prompt: expected text or null, got list"),
        ({"workflow": {"gate.alpha": 1.0}}, "workflow.gate.alpha: not a knob you may set"),
        ({"workflow": {"name": "pwned"}}, "workflow.name: not a knob"),
        ({"workflow": {"top_p": 0.5}}, "workflow.top_p: not a knob"),  # known, not offered
        ({"workflow": {"temperature": 3}}, "workflow.temperature (harness.decoding.temperature)"),
        ({"workflow": {"tool_doc_format": "yaml"}}, "workflow.tool_doc_format (harness.tool_doc_format)"),
        ({"workflow": "max_turns=3"}, "workflow: expected an object, got str"),
        ({"tool_descriptions": {"/etc/passwd": "x"}}, "tool_descriptions./etc/passwd: no such tool"),
        ({"tool_descriptions": {"calculator": {"parameters": {}}}}, "tool_descriptions.calculator: expected text"),
        ({"answer_format": "x" * 6000}, "harness.answer_format: String should have at most 5000"),
    ]
    for out, fragment in cases:
        asset, error = build_revision(h, out, DEFAULT_KNOBS)
        assert asset is None and error is not None and fragment in error, (out, error)
    asset, error = build_revision(h, {"workflow": {"top_p": 0.5}}, list(KNOBS))
    assert error is None and asset.decoding.top_p == 0.5 and asset.parent == h.hash
    asset, error = build_revision(h, {"answer_format": "Answer in one word.",
                                      "workflow": {"max_new_tokens": 16, "temperature": 0.0}},
                                  DEFAULT_KNOBS)
    assert error is None and forbidden_changes(h, asset) == []
    assert changed_fields(h, asset) == ["answer_format", "decoding.max_new_tokens",
                                        "decoding.temperature"]
    assert asset.decoding.top_k == h.decoding.top_k  # the section's other knobs are kept


def test_prompt_inputs_show_the_fields_and_bounds():
    h = tiny_harness(tools=[CALCULATOR])
    text = knobs_text(h, list(KNOBS))
    assert "max_turns = 1 (integer 1..32)" in text
    assert "reflect_on_tool_error = false (true|false)" in text
    assert "top_p = 1.0 (number >0.0..1.0)" in text
    assert 'tool_doc_format = "json" ("json"|"python_signature")' in text
    assert "(text <= 2000 chars)" in text
    data = json.loads(harness_text(h))
    assert data == {"system_prompt": "Reply briefly.", "answer_format": "",
                    "tool_doc_preamble": h.tool_doc_preamble,
                    "tool_descriptions": {"calculator": "Evaluates an expression."}}


def test_no_scored_trajectory_means_no_call_and_bad_options_are_clear():
    p = HarnessProposer(backend=HandWritten(["{}"]))
    h = tiny_harness()
    ctx = ProposalContext(run="r", round=0, incumbent=Incumbent(harness=h), trajectories=[
        Trajectory(env="e", task_id="t", status="infra_error", outcome=None)])
    assert p.propose(ctx) == [] and p.lm.coevo_engine.calls == 0
    assert p.last_cost == {"proposer_calls": 0.0}
    for options, fragment in [({"candidates": 0}, "candidates"), ({"knobs": ["gate.alpha"]}, "knobs"),
                              ({"n_fail": 0, "n_success": 0}, "n_fail"), ({"bogus": 1}, "bogus")]:
        with pytest.raises(CoevoError, match=fragment):
            make_proposer("harness", **options)


def test_a_failing_proposer_model_is_an_invalid_candidate_not_a_crash():
    class Down:
        name, tokenizer = "down", None

        def generate(self, requests):
            return [[Completion(text="", finish_reason="error", error="connection refused",
                                trainable=False)] for _ in requests]

    p = HarnessProposer(backend=Down())
    [c] = p.propose(tool_context())
    assert c.asset is None and "connection refused" in c.error and c.model == "down"


# --------------------------------------------------------------------------- the real model


@pytest.mark.slow
def test_embedded_model_as_proposer_gives_a_candidate_or_an_error():
    """The 135M model mostly fails the format: either outcome is fine, a crash is not."""
    import time

    p = HarnessProposer(model={"backend": "embedded", "max_tokens": 300}, n_fail=2, n_success=1,
                        transcript_chars=300, max_digest_chars=1500)
    t0 = time.perf_counter()
    [c] = p.propose(tool_context())
    wall = time.perf_counter() - t0
    print(f"\nembedded proposer: {wall:.1f} s; "
          f"{'valid' if c.asset is not None else 'invalid: ' + str(c.error)}\nraw: {c.raw_output[:600]}")
    assert c.raw_output and c.prompt and p.lm.coevo_engine.calls == 1
    if c.asset is None:
        assert c.error
    else:
        assert isinstance(c.asset, Harness) and c.error is None
        assert check_candidate(c, tool_context().incumbent) is None


def record() -> None:
    """Re-record every cassette with HandWritten answers (run this file as a script)."""
    for tape in ("harness_hint.jsonl", "harness_malformed.jsonl", "harness_tools.jsonl"):
        (CASSETTES / tape).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        good = HarnessProposer(cassette=str(CASSETTES / "harness_hint.jsonl"), mode="record",
                               backend=HandWritten([HINT_ANSWER]))
        bad = HarnessProposer(cassette=str(CASSETTES / "harness_malformed.jsonl"), mode="record",
                              backend=HandWritten([MALFORMED]), name="harness-2")
        store, res = loop_run(Path(tmp), [good, bad])
        print({p.proposer: p.status for p in store.proposals(res.run)})
    p = HarnessProposer(cassette=str(CASSETTES / "harness_tools.jsonl"), mode="record",
                        backend=HandWritten(TOOLS_ANSWERS), candidates=3)
    print([c.error for c in p.propose(tool_context())])


if __name__ == "__main__":
    record()


def test_the_proposer_model_is_stored_with_the_proposal(tmp_path):
    from coevo.assets.harness import Harness
    from coevo.store import Store

    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    h = Harness.model_validate({"name": "h", "system_prompt": "s"})
    store.put_asset(h)
    pid = store.add_proposal(proposer="harness", kind="harness", parent=h.hash,
                             candidate=h.child(system_prompt="t"), model="openai:http://x/v1")
    assert store.get_proposal(pid).model == "openai:http://x/v1"
