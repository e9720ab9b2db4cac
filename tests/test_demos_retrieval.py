"""Per-task retrieved demos: `Harness.demo_selection` (coevo/assets/harness.py), the runtime's
selection (coevo/agent/demos.py) and the `demos` proposer's `select: retrieve`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coevo.agent.demos import held_out_ids, select_demos
from coevo.agent.episode import build_messages, run_episodes_sync
from coevo.assets.harness import Demo, DemoSelection, Harness
from coevo.assets.io import format_asset, load_asset, parse_asset
from coevo.envs import make_env
from coevo.envs.base import Task
from coevo.errors import AssetError
from coevo.models.scripted import ScriptedBackend
from coevo.propose import Incumbent, ProposalContext, check_candidate, make_proposer
from coevo.propose.digest import episode_messages
from coevo.trajectory import Trajectory
from tiny_glue import tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
# Computed from the seed files at the commit before `demo_selection` existed: a harness that
# does not retrieve keeps its identity (stored versions, trajectories, decisions point to it).
PINNED = {"reasoning": "d2786ce3f64f98f5a4397cf6cbafbfad07966e91c805c59ae79be9b61628b6b7",
          "function_calling": "30f9b7e1a085e97b6e8a23a51ba37842787c15d4db979a0398b13de84e64c3e8"}


def demo(q: str, a: str, source: str | None = None) -> Demo:
    return Demo.model_validate({"source": source, "messages": [
        {"role": "user", "content": q}, {"role": "assistant", "content": a}]})


POOL = [demo("Convert 30 degrees Celsius to Fahrenheit.", "86", "train-temp"),
        demo("What is the area of a triangle with base 6 and height 4?", "12", "train-tri"),
        demo("How many days are there between March 1 and March 10?", "9", "train-days"),
        demo("Find the perimeter of a square with side 5.", "20", "train-square")]


def retrieving(pool=POOL, k: int = 2, **kw) -> Harness:
    return Harness.model_validate({"name": "h", "system_prompt": "Solve it.", **kw,
                                   "demo_selection": {"select": "retrieve", "k": k,
                                                      "pool": [d.model_dump() for d in pool]}})


def task(tid: str, question: str) -> Task:
    return Task(id=tid, env="e", messages=[{"role": "user", "content": question}])


def test_old_harness_hashes_are_unchanged_and_a_pool_is_part_of_the_hash():
    for name, pinned in PINNED.items():
        h = load_asset(ROOT / "harnesses" / f"{name}.yaml")
        assert h.hash == pinned
        explicit = h.model_copy(update={"demo_selection": DemoSelection()})
        assert explicit.hash == pinned and "demo_selection" not in format_asset(h)
    r = retrieving()
    assert r.hash != retrieving(pool=POOL[:3]).hash != retrieving(k=3).hash
    edited = POOL[:3] + [demo("Find the perimeter of a square with side 6.", "24", "train-square")]
    assert retrieving(pool=edited).hash != r.hash
    assert parse_asset(format_asset(r), "harnesses/h.yaml").hash == r.hash  # file round trip
    with pytest.raises(ValueError, match="only used with select: retrieve"):
        Harness.model_validate({"name": "h", "system_prompt": "x", "demo_selection": {
            "pool": [POOL[0].model_dump()]}})


def test_retrieval_ranks_the_lexically_closest_demo_first():
    h = retrieving(k=2)
    picked = select_demos(h, task("t9", "What is the area of a triangle with base 10 and height 3?"))
    assert [d.source for d in picked] == ["train-tri", "train-days"]  # then the one sharing "10"
    temp = select_demos(h, task("t8", "Convert 100 degrees Fahrenheit to Celsius."))
    assert temp[0].source == "train-temp"
    # static demos are retrieval candidates too, and k bounds what is shown
    both = retrieving(k=1, demos=[demo("How many days are in a leap year?", "366").model_dump()])
    assert select_demos(both, task("t7", "How many days in a leap year?"))[0].source is None


def test_the_pool_never_serves_the_current_task_or_a_held_out_one():
    h = retrieving(k=4)
    own = select_demos(h, task("train-tri", "What is the area of a triangle with base 6 and height 4?"))
    assert "train-tri" not in [d.source for d in own] and len(own) == 3
    held = select_demos(h, task("t1", "Convert 30 degrees Celsius"), held_out={"train-temp"})
    assert "train-temp" not in [d.source for d in held]


def test_a_retrieving_episode_shows_the_chosen_demos_before_the_task():
    env = make_env("rg:basic_arithmetic?min_terms=2&max_terms=2", size=40)
    train, val = env.tasks("train"), env.tasks("val")
    pool = [demo(t.messages[0]["content"], f"Answer: {t.answer['answer']}", t.id) for t in train[:6]]
    leak = demo(val[0].messages[0]["content"], f"Answer: {val[0].answer['answer']}", val[0].id)
    h = retrieving(pool=[*pool, leak], k=2)
    assert val[0].id in held_out_ids(env, h) and not held_out_ids(env, retrieving().model_copy(
        update={"demo_selection": DemoSelection()}))
    backend = ScriptedBackend(lambda req, i: "Answer: 0", tiny_tokenizer())
    trajs = run_episodes_sync(env, [train[0], val[0]], h, backend=backend, samples=1)
    for t, traj in zip([train[0], val[0]], trajs):
        msgs = traj.messages
        chosen = select_demos(h, t, held_out_ids(env, h))
        assert len(chosen) == 2 and t.id not in {d.source for d in chosen}
        assert val[0].id not in {d.source for d in chosen}  # never the val task's own answer
        expected = [{"role": m.role, "content": m.content} for d in chosen for m in d.messages]
        assert msgs[0]["role"] == "system" and msgs[1:5] == expected
        assert msgs[5:] == [*t.messages, {"role": "assistant", "content": "Answer: 0"}]
        assert build_messages(h, t, [], held_out_ids(env, h)) == msgs[:6]  # the task after its demos
    everything = retrieving(pool=[*pool, leak], k=7)
    assert val[0].id in {d.source for d in select_demos(everything, train[0])}
    assert val[0].id not in {d.source for d in select_demos(everything, train[0],
                                                            held_out_ids(env, everything))}


def traj(tid: str, split: str = "train", success: bool = True, shown=()) -> Trajectory:
    msgs = [{"role": "system", "content": "Solve it."},
            *[m.model_dump(exclude_none=True) for d in shown for m in d.messages],
            {"role": "user", "content": f"question {tid}"}, {"role": "assistant", "content": f"answer {tid}"}]
    return Trajectory(env="e", task_id=tid, split=split, success=success, outcome=float(success),
                      reward=float(success), messages=msgs)


def test_demos_proposer_switches_to_retrieve_with_a_pool_of_train_successes():
    h = Harness(name="h", system_prompt="Solve it.")
    trajs = [traj("a-1"), traj("a-2"), traj("b-1", success=False), traj("v-1", split="val")]
    ctx = ProposalContext(run="r", round=3, incumbent=Incumbent(harness=h), trajectories=trajs,
                          harnesses={h.hash: h})
    [cand] = make_proposer("demos", select="retrieve", k=1, pool_size=8).propose(ctx)
    sel = cand.asset.demo_selection
    assert (sel.select, sel.k) == ("retrieve", 1) and check_candidate(cand, ctx.incumbent) is None
    assert sorted(d.source for d in sel.pool) == ["a-1", "a-2"]  # train successes only
    assert [m.content for m in sel.pool[0].messages][0].startswith("question a-")

    # the next round merges: a task's new demo replaces its old one, the rest are kept
    inc = cand.asset
    later = [traj("a-2", shown=select_demos(inc, task("a-2", "question a-2"))), traj("c-1")]
    ctx2 = ProposalContext(run="r", round=4, incumbent=Incumbent(harness=inc), trajectories=later,
                           harnesses={inc.hash: inc})
    [cand2] = make_proposer("demos", select="retrieve", k=1).propose(ctx2)
    pool2 = cand2.asset.demo_selection.pool
    assert sorted(d.source for d in pool2) == ["a-1", "a-2", "c-1"] and cand2.asset.parent == inc.hash
    # the retrieved demo the episode was shown is stripped from its transcript
    shown = episode_messages(later[0], inc)
    assert [m["content"] for m in shown] == ["question a-2", "answer a-2"]


def test_a_pool_file_is_inlined_when_the_harness_file_is_read(tmp_path):
    folder = tmp_path / "harnesses"
    folder.mkdir()
    (folder / "pool.jsonl").write_text("\n".join(json.dumps(d.model_dump(exclude_none=True)) for d in POOL))
    (folder / "h.yaml").write_text("name: h\nsystem_prompt: Solve it.\n"
                                   "demo_selection: {select: retrieve, k: 2, pool_file: pool.jsonl}\n")
    h = load_asset(folder / "h.yaml")
    assert h.demo_selection.pool == POOL and h.hash == retrieving().hash
    (folder / "pool.jsonl").write_text('{"messages": [{"role": "assistant", "content": "x"}]}\n')
    with pytest.raises(AssetError, match=r"pool.jsonl:1.*messages"):
        load_asset(folder / "h.yaml")
