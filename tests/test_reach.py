"""Reach or solve (coevo/reach.py) on hand-built stores whose decomposition is known: B reaches
a new state on task 1 and solves it, both reach state s on task 2 and only B solves it; the
CLI table and JSON, and the report's section. REACH + SOLVE = gain everywhere."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from coevo.cli import app
from coevo.reach import compare_checkpoints, reach_or_solve, split_task
from coevo.report import render_report
from coevo.store import Store
from coevo.trajectory import Trajectory, Turn

ENV = "test:tool"
PROMPT = [1, 2, 3]


def episode(task: str, observations: list[list[int]], success: bool, checkpoint: str | None = None,
            policy_step: int | None = None, env: str = ENV, status: str = "ok") -> Trajectory:
    """The prompt, then one sampled token per turn with an observation between turns: the
    episode visits `start` and one state per observation."""
    ids, mask, turns = list(PROMPT), [0] * len(PROMPT), []
    for k in range(len(observations) + 1):
        turns.append(Turn(index=k, start=len(ids), end=len(ids) + 1, text="x"))
        ids.append(50 + k)
        mask.append(1)
        if k < len(observations):
            ids += observations[k]
            mask += [0] * len(observations[k])
    ok = status == "ok"
    return Trajectory(env=env, task_id=task, token_ids=ids, loss_mask=mask, turns=turns,
                      prompt_len=len(PROMPT), success=success and ok,
                      outcome=float(success) if ok else None, reward=float(success) if ok else None,
                      status=status, checkpoint=checkpoint, policy_step=policy_step)


S, A_ONLY, B_ONLY = [9], [5, 6], [7, 8]


def known_world(a: str | None, b: str | None, b_step: int = 4) -> tuple[list[Trajectory], list[Trajectory]]:
    arm_a = [
        episode("t1", [A_ONLY], False, a), episode("t1", [S], False, a),  # t1: A stays on known ground
        episode("t2", [S], False, a), episode("t2", [S], False, a),       # t2: both reach s
        episode("t4", [S], True, a),                                      # t4: only A ran it
    ]
    arm_b = [
        episode("t1", [B_ONLY], True, b), episode("t1", [S], False, b),   # new state, solved
        episode("t2", [S], True, b), episode("t2", [S], True, b),         # s, solved by B only
        episode("t2", [B_ONLY], True, b, status="infra_error"),           # missing data
    ]
    return arm_a, arm_b


def test_known_decomposition_of_two_tasks():
    res = reach_or_solve(*known_world("A", "B"), metric="success")
    t1, t2 = res.rows
    # t1: B's first episode visits a state A never reached and succeeds: REACH 1/2
    assert (t1.reach, t1.solve, t1.gain, t1.new_b, t1.lost_a) == (0.5, 0.0, 0.5, 1, 1)
    assert (t1.states_a, t1.states_b, t1.states_shared) == (3, 3, 2)
    # t2: both reach s, only B succeeds from it: SOLVE 1
    assert (t2.reach, t2.solve, t2.gain, t2.n_b) == (0.0, 1.0, 1.0, 2)
    assert (res.tasks, res.left_out, res.episodes_a, res.episodes_b) == (2, 1, 4, 4)
    assert (res.p_a, res.p_b) == (0.0, 0.75)
    assert (res.reach, res.solve, res.gain) == (0.25, 0.5, 0.75)
    assert res.reach + res.solve == res.gain
    assert (res.new_fraction_b, res.lost_fraction_a) == (0.25, 0.25)


def test_a_state_b_no_longer_reaches_counts_against_reach():
    a = [episode("t", [A_ONLY], True), episode("t", [S], False)]
    b = [episode("t", [S], True), episode("t", [S], True)]
    row = split_task("t", a, b)
    # A earned 1/2 through a state B never reached; from s, B went from 0/2 to 2/2.
    assert (row.reach, row.solve, row.gain) == (-0.5, 1.0, 0.5)


def test_single_turn_episodes_are_all_solve():
    a = [Trajectory(env=ENV, task_id="t", success=s, outcome=float(s)) for s in (True, False)]
    b = [Trajectory(env=ENV, task_id="t", success=True, outcome=1.0) for _ in range(2)]
    res = reach_or_solve(a, b)
    assert (res.reach, res.solve, res.gain) == (0.0, 0.5, 0.5)


@pytest.mark.parametrize("seed", range(20))
def test_reach_plus_solve_is_the_gain_on_random_worlds(seed):
    rng = random.Random(seed)

    def arm() -> list[Trajectory]:
        return [episode(f"t{rng.randrange(4)}",
                        [[rng.randrange(3)] for _ in range(rng.randrange(3))], rng.random() < 0.5)
                for _ in range(rng.randrange(4, 16))]

    res = reach_or_solve(arm(), arm())
    if res.tasks:
        assert res.reach + res.solve == pytest.approx(res.gain, abs=1e-12)
        for r in res.rows:
            assert r.reach + r.solve == pytest.approx(r.gain, abs=1e-12)


# --- from the store, the CLI and the report --------------------------------------------------------


@pytest.fixture
def store_world(tmp_path):
    db = tmp_path / "reach.db"
    store = Store.open(f"sqlite:///{db}")
    store.create_run("r")
    store.start_round("r", 0)
    ck = {name: store.add_checkpoint(path=str(tmp_path / name), sha256=name * 64,
                                     base_model="tiny", step=step, run="r", round=0).id
          for name, step in (("a", 2), ("b", 4))}
    arm_a, arm_b = known_world(ck["a"], ck["b"])
    later = [episode("t2", [B_ONLY], False, ck["b"], policy_step=5)]  # later weights, same ckpt
    other_env = [episode("t1", [S], True, ck["a"], env="other")]
    store.add_trajectories([*arm_a, *arm_b, *later, *other_env], run="r", round=0)
    yield db, store, ck
    store.close()


def test_compare_checkpoints_from_the_store(store_world):
    _, store, ck = store_world
    res = compare_checkpoints(store, ck["a"], ck["b"], ENV, run="r")
    assert (res.a, res.b, res.reach, res.solve, res.gain) == (ck["a"], ck["b"], 0.25, 0.5, 0.75)
    # --any-step adds B's rollout of later weights: t2 gains a failed episode on a new state
    wide = compare_checkpoints(store, ck["a"], ck["b"], ENV, run="r", exact=False)
    assert wide.rows[1].n_b == 3 and wide.rows[1].new_b == 1
    assert wide.gain == pytest.approx((0.5 + 2 / 3) / 2)
    assert wide.reach + wide.solve == pytest.approx(wide.gain)


def test_cli_table_json_and_errors(store_world):
    db, _, ck = store_world
    runner = CliRunner()
    r = runner.invoke(app, ["compare-checkpoints", ck["a"], ck["b"], "--env", ENV, "--db", str(db),
                            "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert (data["reach"], data["solve"], data["gain"], data["tasks"]) == (0.25, 0.5, 0.75, 2)
    assert [row["task_id"] for row in data["rows"]] == ["t1", "t2"]
    r = runner.invoke(app, ["compare-checkpoints", ck["a"], ck["b"], "--env", ENV, "--db", str(db)],
                      terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "REACH (states only B reached)" in r.output and "+0.250" in r.output
    assert "+0.500" in r.output and "67%" in r.output  # SOLVE is 2/3 of the gain
    r = runner.invoke(app, ["compare-checkpoints", ck["a"], "base", "--env", ENV, "--db", str(db)])
    assert r.exit_code != 0 and "checkpoint base: no stored trajectories" in r.output
    r = runner.invoke(app, ["compare-checkpoints", ck["a"], "nope", "--env", ENV, "--db", str(db)])
    assert r.exit_code != 0 and "nope" in r.output and len(r.output.strip().splitlines()) == 1


def test_report_section_between_val_evaluations(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'rep.db'}")
    store.create_run("r")
    ck = store.add_checkpoint(path=str(tmp_path / "b"), sha256="b" * 64, base_model="tiny",
                              step=4, run="r")
    arm_a, arm_b = known_world(None, ck.id)
    evs = {}
    for key, ckpt, arm in (("val_start", None, arm_a), ("val", ck.id, arm_b)):
        evs[key] = store.create_evaluation(split="val", env=ENV, run="r", checkpoint=ckpt)
        store.add_trajectories([t.model_copy(update={"split": "val"}) for t in arm],
                               evaluation=evs[key])
    store.start_round("r", 0)
    store.finish_round("r", 0, "done", summary={"evaluations": evs})
    text = render_report(store, "r")
    assert "<h2>Reach or solve</h2>" in text
    row = text.split("<h2>Reach or solve</h2>")[1].split("</table>")[0]
    assert "<td>round 0 start (base)</td>" in row and f"<td>round 0 ({ck.id[:12]})</td>" in row
    cells = [c for c in row.split('<td class="num">')[1:]]
    # tasks 2; val 0.000 -> 0.750; gain +0.750 = REACH +0.250 + SOLVE +0.500; 25% on new states
    assert [c.split("<")[0] for c in cells] == ["2", "0.000", "0.750", "+0.750", "+0.250",
                                                "+0.500", "25%"]
    store.close()
