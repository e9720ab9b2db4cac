"""The `gepa` proposer (coevo/propose/gepa.py): GEPA's reflective search over the harness's text
fields, run through coevo's agent runtime on train tasks only, with the reflection LM replayed
from cassettes.

Cassettes: tests/cassettes/gepa_*.jsonl. They were recorded with a scripted reflection model
whose answers are written below (`REFLECTIONS`); a missing cassette is recorded again from
them, an existing one is replayed (a changed prompt is then a CassetteMiss, not a silent
re-record)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from coevo.assets.base import changed_fields
from coevo.envs.base import Response, Score, Task
from coevo.errors import CoevoError
from coevo.models.scripted import ScriptedBackend
from coevo.propose import Incumbent, ProposalContext, check_candidate, make_proposer
from coevo.propose.gepa import GepaProposer
from coevo.propose.lm import CassetteMiss
from coevo.trajectory import Trajectory
from tiny_glue import FirstCharEnv, SingleTurnEnv, save_tiny_model, tiny_harness, tiny_tokenizer

torch.set_num_threads(1)

CASSETTES = Path(__file__).resolve().parent / "cassettes"
REFLECTIONS = {
    "improve": "The assistant wrote prose.\n```\nReply with only the number.\n```",
    "useless": "```\nBe creative and tell a story.\n```",
    "vowel": "```\nStart every reply with a vowel, for example: apple.\n```",
    "hint": "```\nReply briefly.\nBegin with the letter a.\n```",
}


def tape(name: str) -> dict:
    """Proposer options replaying cassette `gepa_<name>.jsonl` (recorded if missing)."""
    path = CASSETTES / f"gepa_{name}.jsonl"
    if os.environ.get("COEVO_RECORD_CASSETTES") == "1" or not path.exists():
        path.unlink(missing_ok=True)
        answer = REFLECTIONS[name]
        return {"cassette": str(path), "mode": "record",
                "reflection_backend": ScriptedBackend(lambda req, i: answer, name="reflector")}
    return {"cassette": str(path), "mode": "replay"}  # no backend: a miss is an error


class NumberEnv(SingleTurnEnv):
    """Single-turn: outcome 1 when the whole reply is a bare integer. Records every task it
    scored, so a test can show the search never ran a val or test task."""

    name = "test:gepa-number"

    def __init__(self):
        self.scored: list[str] = []

    def tasks(self, split: str = "train", n: int | None = None) -> list[Task]:
        out = [Task(id=f"{split}-{i}", env=self.name, family="add",
                    messages=[{"role": "user", "content": f"What is {i} + 3?"}])
               for i in range(6)]
        return out[:n] if n is not None else out

    def score(self, task: Task, state, response: Response) -> Score:
        self.scored.append(task.id)
        ok = response.text.strip().isdigit()
        return Score(outcome=float(ok), success=ok)


def obedient_policy() -> ScriptedBackend:
    """A policy that follows the system prompt: a bare number only when told to (real-shaped
    completions through the tiny tokenizer)."""
    tok = tiny_tokenizer()

    def reply(req, i):
        # the runtime sends token ids (it builds the sequence incrementally), not messages
        seen = tok.decode(req.prompt_ids) if req.prompt_ids else str(req.messages)
        return "42" if "only the number" in seen else "I think the answer is 42."
    return ScriptedBackend(reply, tokenizer=tok, name="obedient")


def context(env, harness, extra: list[Trajectory] = ()) -> ProposalContext:
    trajs = [Trajectory(env=env.name, task_id=f"train-{i}", split="train", outcome=0.0,
                        reward=0.0, success=False) for i in range(6)]
    return ProposalContext(run="r", round=0, incumbent=Incumbent(harness=harness),
                           trajectories=[*trajs, *extra], seed=0)


def test_a_better_instruction_becomes_one_harness_candidate():
    env = NumberEnv()
    harness = tiny_harness(system_prompt="Reply briefly.")
    # Trajectory labels are data: a val trajectory, and a "train" one naming a test task,
    # must not bring either task into the search.
    leaks = [Trajectory(env=env.name, task_id="val-0", split="val", outcome=1.0),
             Trajectory(env=env.name, task_id="test-3", split="train", outcome=1.0)]
    prop = GepaProposer(env=env, policy_backend=obedient_policy(), tasks=4,
                        max_metric_calls=12, minibatch=2, **tape("improve"))
    [cand] = prop.propose(context(env, harness, leaks))
    assert check_candidate(cand, Incumbent(harness=harness)) is None
    assert cand.asset.parent == harness.hash and cand.proposer == "gepa"
    assert changed_fields(harness, cand.asset) == ["system_prompt"]
    assert cand.asset.system_prompt == "Reply with only the number."
    res = prop.last_result
    assert res.val_aggregate_scores == [0.0, 1.0]  # seed scores 0 on the 4 tasks, child 1
    assert "scored 1.000 vs the incumbent's 0.000" in cand.rationale
    assert cand.predicted_effect.startswith("+1.000 mean outcome")
    assert "I provided an assistant with the following instructions" in cand.prompt
    assert "Reply with only the number." in cand.raw_output
    assert set(env.scored) <= {f"train-{i}" for i in range(6)} and len(env.scored) == 12
    # the search's own episodes: rollouts and their prefilled + generated tokens
    assert prop.last_cost == {"rollouts": 12.0, "proposer_calls": 1.0,
                              "tokens": float(prop.last_adapter.tokens)}
    assert prop.last_adapter.tokens >= 12 * 20  # every episode's prompt and reply


def test_no_candidate_when_gepa_finds_nothing_better():
    env = NumberEnv()
    harness = tiny_harness(system_prompt="Reply briefly.")
    prop = GepaProposer(env=env, policy_backend=obedient_policy(), tasks=4,
                        max_metric_calls=8, minibatch=2, **tape("useless"))
    assert prop.propose(context(env, harness)) == []
    res = prop.last_result
    assert res.num_candidates == 1 and res.val_aggregate_scores == [0.0]  # child rejected
    assert res.total_metric_calls == 8


def test_tiny_random_model_search_on_recorded_values(tmp_path):
    """The real HF backend on a tiny random Llama, loaded by spec: the reflection's rewrite
    changes what the model sees, and with it the sampled replies and their scores."""
    tiny = save_tiny_model(tmp_path / "tiny")
    env = FirstCharEnv(target="aeiou", size=6)
    harness = tiny_harness(system_prompt="Reply briefly.",
                           decoding={"temperature": 1.0, "max_new_tokens": 4})
    trajs = [Trajectory(env=env.name, task_id=f"train-{i}", split="train", outcome=0.0)
             for i in range(6)]
    ctx = ProposalContext(run="r", round=1, incumbent=Incumbent(harness=harness),
                          trajectories=trajs, seed=3)
    prop = make_proposer("gepa", env=env, policy=f"hf:{tiny}", tasks=4, max_metric_calls=12,
                         minibatch=2, **tape("vowel"))
    cands = prop.propose(ctx)
    res = prop.last_result
    # Recorded: the seed solves 1 of the 4 search tasks; both reflections (system_prompt,
    # then answer_format, round robin) scored no better on their minibatch, so GEPA kept only
    # the seed and the proposer returns no candidate rather than an invalid one.
    assert cands == []
    assert res.val_aggregate_scores == [0.25] and res.total_metric_calls == 12
    assert len(prop.last_reflection.exchanges) == 2
    assert prop.last_adapter.episodes == 12 and prop.last_adapter.infra_failures == 0
    assert set(prop.last_adapter.started) <= {f"train-{i}" for i in range(6)}


def test_a_cassette_miss_is_raised_not_swallowed_by_gepa(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    env = NumberEnv()
    prop = GepaProposer(env=env, policy_backend=obedient_policy(), max_metric_calls=8,
                        cassette=str(empty), mode="replay")
    with pytest.raises(CassetteMiss, match="no recorded exchange"):
        prop.propose(context(env, tiny_harness()))


def test_a_failing_reflection_model_is_an_invalid_proposal():
    env = NumberEnv()
    prop = GepaProposer(env=env, policy_backend=obedient_policy(), max_metric_calls=8,
                        reflection_backend=ScriptedBackend([], name="down"), mode="off")
    [cand] = prop.propose(context(env, tiny_harness()))
    assert cand.asset is None and "every reflection call failed" in cand.error
    assert "script exhausted" in cand.error


def test_options_and_empty_rounds():
    with pytest.raises(CoevoError, match="proposers: gepa: bad options.*fields"):
        make_proposer("gepa", fields=["tools"])  # not a text field
    with pytest.raises(CoevoError, match="score"):
        make_proposer("gepa", score="accuracy")
    env = NumberEnv()
    prop = GepaProposer(env=env, policy_backend=obedient_policy())
    val_only = ProposalContext(run="r", round=0, incumbent=Incumbent(harness=tiny_harness()),
                               trajectories=[Trajectory(env=env.name, task_id="val-1",
                                                        split="val", outcome=0.0)])
    assert prop.propose(val_only) == [] and env.scored == []
    other = ProposalContext(run="r", round=0, incumbent=Incumbent(harness=tiny_harness()),
                            trajectories=[Trajectory(env=env.name, task_id="nope", outcome=0.0)])
    [cand] = prop.propose(other)
    assert cand.asset is None and "train split" in cand.error


def test_the_gepa_candidate_passes_through_coevos_gate_and_is_stored(tmp_path):
    """Trajectories -> GEPA search -> a stored proposal with the reflection exchange -> the
    paired gate on val accepts it (harness-only loop; a policy that begins with "a" only when
    the system prompt asks for it, scored by FirstCharEnv's a-m verifier)."""
    import tiny_glue

    from coevo.config import RunConfig
    from coevo.loop import Parts, run_coevolution
    from coevo.store import Store

    tok = tiny_tokenizer()
    hint = "Begin with the letter a."

    def reply(req, i):
        seen = tok.decode(req.prompt_ids) if req.prompt_ids else str(req.messages)
        return "a fine" if hint in seen else "zz"

    policy = ScriptedBackend(reply, tokenizer=tok, name="scripted-policy")
    env = tiny_glue.FirstCharEnv(target="abcdefghijklm", size=12)
    cfg = RunConfig.from_mapping({
        "name": "gepa-run", "env": "test:first-char", "mode": "harness-only", "rounds": 1,
        "assets": {"harness": "tiny"}, "proposers": [],
        "gate": {"screen_size": 12, "n_boot": 200},
        "splits": {"val_n": 12, "test_n": 6, "train_n": 4}})
    store = Store.open(f"sqlite:///{tmp_path / 'loop.db'}")
    store.put_asset(tiny_harness(decoding={"temperature": 1.0, "max_new_tokens": 8}))
    gepa = GepaProposer(env=env, policy_backend=policy, tasks=4, max_metric_calls=12,
                        minibatch=2, **tape("hint"))
    res = run_coevolution(cfg, store, Parts(env=env, backend=policy, proposers=[gepa]))
    [prop] = store.proposals(res.run)
    assert prop.proposer == "gepa" and prop.status == "accepted", prop
    assert "GEPA reflective search" in prop.rationale and hint in prop.raw_output
    assert "I provided an assistant" in prop.prompt
    [decision] = store.decisions(prop.id)
    assert len(decision.evidence) == 12
    assert {(e.incumbent, e.candidate) for e in decision.evidence} == {(0.0, 1.0)}
    final = store.get_asset("harness", res.incumbent["harness"])
    assert hint in final.system_prompt and final.parent == prop.parent
    assert gepa.last_adapter.started and all(i.startswith("train-") for i in gepa.last_adapter.started)
