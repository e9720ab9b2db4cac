"""`jsonl:PATH` task files: every verifier kind scored through `coevo eval` (harness imported
from an OpenAI request, a scripted model), bad lines refused naming file, line and field,
hashed splits that do not depend on line order."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coevo.cli import app
from coevo.envs.registry import make_env
from coevo.errors import CoevoError
from coevo.models.registry import BACKENDS
from coevo.models.scripted import ScriptedBackend
from coevo.store import Store
from conftest import REPO

runner = CliRunner()

FLIGHT = {"name": "search_flights", "arguments": {"route": {"from": "OSL", "to": "FCO"}}}
LINES = [
    # (line, the scripted reply, the expected outcome)
    ({"id": "ex-ok", "prompt": "q1", "answer": "Paris"}, "Paris", 1.0),
    ({"id": "ex-no", "prompt": "q2", "answer": "Paris"}, "paris", 0.0),
    ({"id": "norm-ok", "prompt": "q3", "answer": "The Eiffel Tower", "verifier": "normalized"},
     "the eiffel  tower!", 1.0),
    ({"id": "norm-no", "prompt": "q4", "answer": "Eiffel Tower", "verifier": "normalized"},
     "Louvre", 0.0),
    ({"id": "re-ok", "prompt": "q5", "answer": "[A-Z]{2}[0-9]{2}", "verifier": "regex"}, "AB12", 1.0),
    ({"id": "re-no", "prompt": "q6", "answer": "[A-Z]{2}[0-9]{2}", "verifier": "regex"},
     "ref AB12", 0.0),
    ({"id": "num-ok", "prompt": "q7", "answer": 3.14159,
      "verifier": {"name": "numeric", "tolerance": 0.01}}, "about 3.14", 1.0),
    ({"id": "num-no", "prompt": "q8", "answer": 3.14159, "verifier": "numeric"}, "3.14", 0.0),
    ({"id": "tc-ok", "prompt": "q9", "answer": FLIGHT, "verifier": "tool_calls", "tools": [{
        "type": "function", "function": {"name": "search_flights", "parameters": {
            "type": "object", "properties": {"route": {"type": "object"}, "date": {"type": "string"}}}}}]},
     '<tool_call>{"name": "search_flights", "arguments": {"route": {"from": "OSL", "to": "FCO"}, '
     '"date": "2026-05-01"}}</tool_call>', 1.0),
    ({"id": "tc-no", "prompt": "q10", "answer": FLIGHT, "verifier": "tool_calls"},
     '<tool_call>{"name": "search_flights", "arguments": {"route": {"from": "OSL", "to": "CPH"}}}'
     '</tool_call>', 0.0),
    ({"id": "plug", "messages": [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "ok"},
                                 {"role": "user", "content": "q11"}],
      "answer": 8, "verifier": "test_jsonl_env:length_credit"}, "abcd", 0.5),
]


def length_credit(response, answer):
    """A plugin verifier: partial credit for length."""
    return min(len(response.text) / answer, 1.0)


def write(path, lines):
    path.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines) + "\n")
    return path


def test_coevo_eval_scores_every_verifier_kind(tmp_path, monkeypatch):
    tasks = write(tmp_path / "tasks.jsonl", [line for line, _, _ in LINES])
    replies = {line.get("prompt") or line["messages"][-1]["content"]: reply for line, reply, _ in LINES}

    def script(request, index):
        return replies[request.messages[-1]["content"]]

    monkeypatch.setitem(BACKENDS._items, "scripted", lambda arg, **o: ScriptedBackend(script))
    db = f"sqlite:///{tmp_path / 'c.db'}"
    request = REPO / "training" / "data" / "support_request.json"
    r = runner.invoke(app, ["harness", "import", "--openai", str(request), "--name", "support", "--db", db])
    assert r.exit_code == 0, r.output
    spec = f'jsonl:{tasks}?split={{"fractions":{{"val":1.0}}}}'
    r = runner.invoke(app, ["eval", "--harness", "support", "--env", spec, "--split", "val",
                            "--model", "scripted", "--db", db])
    assert r.exit_code == 0, r.output
    got = {t.task_id: t.outcome for t in Store.open(db).trajectories(split="val")}
    assert got == {line["id"]: outcome for line, _, outcome in LINES}


@pytest.mark.parametrize("line, field, reason", [
    ('{"prompt": "x", "answer": 1', None, "invalid JSON"),
    ('["prompt"]', None, "expected a JSON object"),
    ({"prompt": "x"}, "answer", "required field is missing (verifier 'exact')"),
    ({"prompt": "x", "answer": "y", "hint": "z"}, "hint", "unknown key"),
    ({"messages": [{"role": "system", "content": "x"}], "answer": "y"}, "messages.0.role", "'user'"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "x"}], "answer": "y"}, None, "exactly one"),
    ({"prompt": "x", "answer": "(a)\\1", "verifier": "regex"}, "answer", "RE2 cannot compile"),
    ({"prompt": "x", "answer": "three", "verifier": "numeric"}, "answer", "could not convert"),
    ({"prompt": "x", "answer": {"name": "f", "args": {}}, "verifier": "tool_calls"}, "answer", "call 0"),
    ({"prompt": "x", "answer": "y", "verifier": "fuzzy"}, "verifier", "unknown verifier 'fuzzy'"),
    ({"prompt": "x", "answer": "y", "verifier": {"name": "exact", "tolerance": 1}}, "verifier",
     "takes no option 'tolerance'"),
    ({"prompt": "x", "answer": "y", "tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools.0.function.name", "identifier"),
    ({"id": "a", "prompt": "x", "answer": "y"}, "id", "already the id of line 1"),
])
def test_a_bad_line_names_file_line_and_field(tmp_path, line, field, reason):
    path = write(tmp_path / "t.jsonl", [{"id": "a", "prompt": "ok", "answer": "ok"}, "", line])
    with pytest.raises(CoevoError) as e:
        make_env(f"jsonl:{path}").tasks("train")
    where = f"{path}:3: " + (f"{field}: " if field else "")
    assert str(e.value).startswith(where), str(e.value)
    assert reason in str(e.value)


def test_bad_file_level_verifier_and_missing_file(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"prompt": "x", "answer": "y"}])
    with pytest.raises(CoevoError, match="unknown verifier 'fuzzy'"):
        make_env(f"jsonl:{path}?verifier=fuzzy")
    with pytest.raises(CoevoError, match="no such task file"):
        make_env(f"jsonl:{tmp_path / 'nope.jsonl'}").tasks("val")


def test_splits_are_hashed_from_ids_not_line_order(tmp_path):
    lines = [{"prompt": f"question {i}", "answer": str(i)} for i in range(40)]
    a = make_env(f"jsonl:{write(tmp_path / 'a.jsonl', lines)}?verifier=numeric")
    b = make_env(f"jsonl:{write(tmp_path / 'b.jsonl', lines[::-1])}?verifier=numeric")
    for split in ("train", "val", "test"):
        assert [t.id for t in a.tasks(split)] == [t.id for t in b.tasks(split)]
    sizes = [len(a.tasks(s)) for s in ("train", "val", "test")]
    assert sum(sizes) == 40 and min(sizes) > 0
    assert a.name.endswith("?verifier=numeric")


def test_the_shipped_example_loads():
    env = make_env(f"jsonl:{REPO / 'training' / 'data' / 'support_tasks.jsonl'}")
    tasks = env.all_tasks()
    assert len(tasks) == 60 and {t.family for t in tasks} == {"tools", "policy", "smalltalk"}
    assert {t.metadata["verifier"]["name"] for t in tasks} == {
        "tool_calls", "numeric", "normalized", "exact", "regex"}


def test_declared_tools_are_allowed_only_where_calls_are_scored_not_run():
    from coevo.agent.episode import harness_tools
    from coevo.assets.openai_format import harness_from_request, read_request

    h = harness_from_request(read_request(REPO / "training" / "data" / "support_request.json"),
                             "support", "support_request.json").harness
    assert harness_tools(h, scored_only=True) == {}
    with pytest.raises(CoevoError, match="unknown harness tool 'search_flights'"):
        harness_tools(h)  # a multi-turn environment would have to run it


def test_answer_check_doctests():
    import doctest

    from coevo.envs import answer_checks

    assert doctest.testmod(answer_checks).failed == 0


def test_a_run_on_a_task_file_with_an_imported_harness(tmp_path):
    """The README flow through the loop: an imported OpenAI harness, a task file, a proposal
    that helps, the gate on the file's val tasks, the test split at the end."""
    import tiny_glue
    from coevo.assets.openai_format import harness_from_request, read_request
    from coevo.loop import Parts, run_coevolution
    from coevo.propose import make_proposer
    from test_loop import HINT, ScriptedPolicy, config

    class Policy(ScriptedPolicy):
        def _reply(self, request, index):
            prompt = self.tokenizer.decode(request.prompt_ids)
            return "Yes." if HINT in prompt else "no"

    lines = [{"id": f"t{i}", "prompt": f"Is {i} a number?", "answer": "yes",
              "verifier": "normalized"} for i in range(40)]
    spec = f'jsonl:{write(tmp_path / "t.jsonl", lines)}?split={{"fractions":{{"train":0.2,"val":0.5,"test":0.3}}}}'
    store = Store.open(f"sqlite:///{tmp_path / 'run.db'}")
    h = harness_from_request(read_request(REPO / "training" / "data" / "support_request.json"),
                             "support", "support_request.json").harness
    store.put_asset(h)
    helps = {"kind": "harness", "changes": {"system_prompt": f"{h.system_prompt}\n{HINT}"},
             "rationale": "hint"}
    cfg = config(tmp_path, "harness-only", (helps,), env=spec, assets={"harness": "support"},
                 splits={"val_n": 20, "test_n": 12, "train_n": 4})
    tok = tiny_glue.tiny_tokenizer()
    policy = Policy(tok)
    parts = Parts(env=make_env(spec), backend=policy, tokenizer=tok, rl_backend=policy, trainer=None,
                  proposers=[make_proposer(p.name, **p.options) for p in cfg.proposers])
    res = run_coevolution(cfg, store, parts)
    [prop] = store.proposals(res.run)
    assert prop.status == "accepted", store.decisions(prop.id)[-1].reason
    evidence = store.decisions(prop.id)[-1].evidence
    assert evidence and {e.task_id for e in evidence} <= {t.id for t in make_env(spec).tasks("val")}
    assert {(e.incumbent, e.candidate) for e in evidence} == {(0.0, 1.0)}
    assert res.final.mean == 1.0 and res.final.n_tasks == 12
    assert HINT in store.get_asset("harness", res.incumbent["harness"]).system_prompt
