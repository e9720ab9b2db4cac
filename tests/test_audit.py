"""Audit views over a populated store: a run with two rounds, proposals in every status,
decisions with evidence, an evaluation, checkpoints and budgets. The assertions read real
values back out of the rendered text (scores, reasons, diff lines, statuses, lineage)."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

import pytest

from coevo import audit
from coevo.assets.harness import Harness
from coevo.audit import (
    budget_rows,
    find_proposal,
    lineage_tree,
    proposal_rows,
    proposal_view,
    proposals_table,
    render_text,
    rl_steps,
    round_rows,
    run_view,
    runs_table,
)
from coevo.errors import Ambiguous, NotFound
from coevo.store import Store
from coevo.trajectory import Trajectory

ACCEPT_REASON = "accepted: candidate mean 0.750 vs incumbent 0.250, diff +0.500 > min_delta 0.000"
REJECT_REASON = "rejected: sign test p=0.6875 > alpha 0.05 (wins 1, losses 1)"
INVALID_ERROR = "system_prompt: String should have at most 20000 characters"


def populate(store: Store) -> SimpleNamespace:
    """The shared scenario (test_report.py imports it)."""
    h0 = Harness(name="base", system_prompt="You are a tool caller.\nCall one function.")
    h1 = h0.child(system_prompt="You are a careful tool caller.\nCall one function.")
    h2 = h1.child(system_prompt="You are a careful tool caller.\nCall one function.\nThink first.")
    h3 = h0.child(system_prompt="Sibling branch prompt.")  # not an ancestor/descendant of h1
    for h in (h0, h1, h2, h3):
        store.put_asset(h)
    run = store.create_run("exp1", config={"budget": {"max_rollouts": 200, "tokens": 10000}})

    store.start_round(run.id, 0)
    ck0 = store.add_checkpoint(path="/ck/step-2", sha256="a" * 64, base_model="tiny", step=2,
                               run=run.id, round=0, harness=h0.hash)
    p_acc = store.add_proposal(proposer="harness_lm", kind="harness", parent=h0.hash,
                               candidate=h1.hash, run=run.id, round=0,
                               rationale="the model ignores the tool format",
                               predicted_effect="+10 pp decodes", prompt="PROPOSER PROMPT 1")
    store.add_decision(p_acc, policy="paired", accepted=True, reason=ACCEPT_REASON,
                       statistic={"mean_diff": 0.5, "p_value": 0.0625, "p_adjusted": 0.125,
                                  "wins": 2, "losses": 0},
                       rollouts=8, evidence=[
                           {"task_id": "simple_1", "incumbent": 0.0, "candidate": 1.0},
                           {"task_id": "simple_2", "incumbent": 1.0, "candidate": 1.0},
                           {"task_id": "simple_3", "incumbent": 0.0, "candidate": 1.0},
                           {"task_id": "simple_4", "incumbent": None, "candidate": 0.0,
                            "status": "infra_error"}])
    p_inv = store.add_proposal(proposer="harness_lm", kind="harness", parent=h1.hash,
                               candidate=None, run=run.id, round=0, status="invalid",
                               error=INVALID_ERROR, raw_output="```yaml\nsystem_prompt: xxxx")
    for kind, amount in (("rollouts", 64), ("tokens", 5000), ("proposer_calls", 2)):
        store.add_budget(run.id, kind, amount, round=0)
    store.finish_round(run.id, 0, summary={
        "val_score": 0.5, "incumbent": {"harness": h1.hash}, "checkpoint": ck0.id,
        "rl_steps": [{"step": 1, "reward_mean": 0.125, "loss": 0.1},
                     {"step": 2, "mean_reward": 0.375}]})

    store.start_round(run.id, 1)
    ck1 = store.add_checkpoint(path="/ck/step-4", sha256="b" * 64, base_model="tiny", step=4,
                               run=run.id, round=1, parent=ck0.id, harness=h1.hash)
    p_rej = store.add_proposal(proposer="demos", kind="harness", parent=h1.hash,
                               candidate=h2.hash, run=run.id, round=1,
                               rationale="add a reasoning line", predicted_effect="+5 pp")
    store.add_decision(p_rej, policy="paired", accepted=False, reason=REJECT_REASON,
                       statistic={"mean_diff": 0.0, "p_value": 0.6875}, rollouts=4, evidence=[
                           {"task_id": "simple_1", "incumbent": 1.0, "candidate": 0.0},
                           {"task_id": "simple_5", "incumbent": 0.0, "candidate": 1.0}])
    p_pend = store.add_proposal(proposer="skills_lm", kind="harness", parent=h0.hash,
                                candidate=h3.hash, run=run.id, round=1)
    ev = store.create_evaluation(split="val", env="bfcl", run=run.id, round=1, harness=h1.hash,
                                 checkpoint=ck1.id)
    store.add_results(ev, [{"task_id": "v1", "outcome": 1.0}, {"task_id": "v2", "outcome": 0.0},
                           {"task_id": "v3", "outcome": 1.0},
                           {"task_id": "v4", "outcome": None, "status": "infra_error"}])
    store.add_budget(run.id, "rollouts", 96, round=1)
    store.add_budget(run.id, "proposer_calls", 1, round=1)
    store.finish_round(run.id, 1, summary={
        "evaluations": {"val": ev}, "test_score": 0.45, "incumbent": {"harness": h1.hash},
        "rl": {"steps": [{"step": 3, "reward_mean": 0.5}, {"step": 4, "reward_mean": 0.625}],
               "checkpoint": ck1.id, "checkpoints": [ck1.id]}})
    return SimpleNamespace(run=run, h=[h0, h1, h2, h3], ck=[ck0, ck1], acc=p_acc, inv=p_inv,
                           rej=p_rej, pend=p_pend, ev=ev)


@pytest.fixture
def store(db_url):
    s = Store.open(db_url)
    yield s
    s.close()


@pytest.fixture
def world(store):
    return populate(store)


def test_doctests():
    assert doctest.testmod(audit).failed == 0


def test_round_rows_read_summary_keys_and_evaluations(store, world):
    r0, r1 = round_rows(store, "exp1")
    assert (r0.val_score, r0.test_score) == (0.5, None)
    # round 1 has no val_score key: the mean of the evaluation's ok outcomes (infra dropped)
    assert r1.val_score == pytest.approx(2 / 3)
    assert r1.test_score == 0.45
    assert r0.incumbent == {"harness": world.h[1].hash}
    assert (r0.checkpoint, r1.checkpoint, r1.checkpoints) == (world.ck[0].id, world.ck[1].id,
                                                              [world.ck[1].id])
    assert r0.budget == {"proposer_calls": 2.0, "rollouts": 64.0, "tokens": 5000.0}
    assert (r0.proposals, r0.accepted, r1.proposals, r1.accepted) == (2, 1, 2, 0)


def test_rl_steps_from_summaries(store, world):
    steps = rl_steps(store, "exp1")
    assert [(s.round, s.step, s.reward_mean) for s in steps] == [
        (0, 1, 0.125), (0, 2, 0.375), (1, 3, 0.5), (1, 4, 0.625)]


def test_rl_steps_fall_back_to_train_trajectories(store):
    run = store.create_run("bare")
    for r, rewards in ((0, [0.0, 1.0]), (1, [0.5, 1.0, None])):
        store.start_round(run.id, r)
        store.add_trajectories([Trajectory(env="toy", task_id=f"t{i}", reward=x, split="train")
                                for i, x in enumerate(rewards)], run=run.id, round=r)
        # a val trajectory must not count as RL reward
        store.add_trajectories([Trajectory(env="toy", task_id="v", reward=9.0, split="val")],
                               run=run.id, round=r)
    steps = rl_steps(store, "bare")
    assert [(s.round, s.reward_mean) for s in steps] == [(0, 0.5), (1, 0.75)]


def test_budget_rows_spent_vs_limit(store, world):
    rows = {b.kind: b for b in budget_rows(store, "exp1")}
    assert rows["rollouts"].spent == 160 and rows["rollouts"].limit == 200
    assert rows["rollouts"].fraction == pytest.approx(0.8)
    assert rows["tokens"].fraction == pytest.approx(0.5)
    assert rows["proposer_calls"].limit is None and rows["proposer_calls"].fraction is None


def test_runs_table(store, world):
    text = render_text(runs_table(store))
    line = next(ln for ln in text.splitlines() if "exp1" in ln)
    assert world.run.id[:12] in line and "gated" in line
    assert "1/4" in line and "0.667" in line  # accepted/proposals, last val score


def test_run_view_shows_scores_budgets_incumbents_checkpoints(store, world):
    text = render_text(run_view(store, "exp1"), width=200)
    rounds = {ln.split("│")[1].strip(): ln for ln in text.splitlines()
              if ln.count("│") == 12}  # the rounds table has 11 columns
    assert set(rounds) == {"0", "1"}
    assert "0.500" in rounds["0"] and "1/2" in rounds["0"] and "5000" in rounds["0"]
    assert world.ck[0].id[:12] in rounds["0"]
    assert "0.667" in rounds["1"] and "0.450" in rounds["1"] and "0/2" in rounds["1"]
    assert world.ck[1].id[:12] in rounds["1"] and " 96 " in rounds["1"]
    assert text.count(world.h[1].hash[:12]) >= 2  # incumbent harness in both rounds
    budget = next(ln for ln in text.splitlines() if "rollouts" in ln and "%" in ln)
    assert "160" in budget and "200" in budget and "80%" in budget
    assert "/ck/step-2" in text and "/ck/step-4" in text


def test_run_view_degrades_on_missing_keys(store):
    run = store.create_run("empty")
    store.start_round(run.id, 0)
    store.finish_round(run.id, 0, summary={"val_score": "n/a", "rl_steps": "broken"})
    (row,) = round_rows(store, "empty")
    assert row.val_score is None and row.checkpoint is None and row.incumbent == {}
    assert rl_steps(store, "empty") == []
    text = render_text(run_view(store, "empty"), width=200)
    (line,) = [ln for ln in text.splitlines() if ln.count("│") == 12]
    assert [c.strip() for c in line.split("│")[1:-1]] == ["0", "done", *["-"] * 6, "0/0", "-", "-"]


def test_proposals_table_every_status_with_reasons(store, world):
    text = render_text(proposals_table(store, run="exp1"), width=250)
    for status in ("accepted", "rejected", "invalid", "pending"):
        assert status in text
    assert ACCEPT_REASON in text and REJECT_REASON in text and INVALID_ERROR in text
    assert "+0.500" in text and "0.125" in text  # mean diff and the Holm-adjusted p
    only = proposal_rows(store, run="exp1", status="rejected")
    assert [p.id for p in only] == [world.rej]
    assert only[0].reason == REJECT_REASON and only[0].rollouts == 4
    text = render_text(proposals_table(store, status="rejected"), width=250)
    assert "rejected" in text and "accepted" not in text


def test_proposal_view_accepted(store, world):
    text = render_text(proposal_view(store, world.acc), width=160)
    assert "-You are a tool caller." in text
    assert "+You are a careful tool caller." in text
    assert "harness_lm" in text and "the model ignores the tool format" in text
    assert "+10 pp decodes" in text and ACCEPT_REASON in text
    assert "PROPOSER PROMPT" not in text  # only with show_prompt
    ev = {ln.split("│")[1].strip(): ln for ln in text.splitlines()
          if ln.count("│") > 4 and "simple_" in ln}
    assert set(ev) == {"simple_1", "simple_2", "simple_3", "simple_4"}
    assert "+1.000" in ev["simple_1"] and "+0.000" in ev["simple_2"]
    assert "infra_error" in ev["simple_4"] and " - " in ev["simple_4"]
    stats = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in text.splitlines()
             if ln.count("│") == 3}
    assert stats["p_value"] == "0.0625" and stats["p_adjusted"] == "0.1250"
    assert stats["wins"] == "2"
    assert "PROPOSER PROMPT 1" in render_text(proposal_view(store, world.acc, show_prompt=True))


def test_proposal_view_invalid_shows_error_and_raw_output(store, world):
    text = render_text(proposal_view(store, world.inv), width=160)
    assert INVALID_ERROR in text and "system_prompt: xxxx" in text
    assert "raw output" in text and "invalid" in text
    assert "no candidate version" in text


def test_proposal_view_rejected_and_pending(store, world):
    text = render_text(proposal_view(store, world.rej), width=160)
    assert REJECT_REASON in text and "+Think first." in text and "-1.000" in text
    text = render_text(proposal_view(store, world.pend), width=160)
    assert "no gate decision yet" in text and "+Sibling branch prompt." in text


def test_find_proposal_by_prefix(store, world):
    assert find_proposal(store, world.rej[:10]).id == world.rej
    with pytest.raises(NotFound, match="no proposal"):
        find_proposal(store, "zzzzzzzz")
    ids = [world.acc, world.inv, world.rej, world.pend]
    common = next((a[:4] for a in ids for b in ids if a != b and a[:4] == b[:4]), None)
    if common:  # uuids rarely share 4 chars; check the ambiguity path when they do
        with pytest.raises(Ambiguous):
            find_proposal(store, common)


def test_lineage_tree_ancestors_and_descendants(store, world):
    h0, h1, h2, h3 = world.h
    tree = lineage_tree(store, h1.hash[:10])
    # root = the ancestor, then the version, then its descendant: one chain
    assert h0.hash[:12] in str(tree.label)
    (mid,) = tree.children
    assert h1.hash[:12] in str(mid.label) and "this version" in str(mid.label)
    assert "accepted by harness_lm" in str(mid.label)
    (leaf,) = mid.children
    assert h2.hash[:12] in str(leaf.label) and "rejected by demos" in str(leaf.label)
    text = render_text(tree)
    assert h3.hash[:12] not in text  # a sibling branch is neither ancestor nor descendant
    full = render_text(lineage_tree(store, h0.hash, kind="harness"))
    assert all(h.hash[:12] in full for h in world.h) and "pending by skills_lm" in full


def test_unknown_refs_are_clear_errors(store, world):
    with pytest.raises(NotFound, match="no run"):
        run_view(store, "nope")
    with pytest.raises(NotFound, match="no harness version"):
        lineage_tree(store, "nope", kind="harness")


def test_proposal_view_shows_the_soft_gates_metric_and_stages(store, world):
    """A soft-gate decision is auditable: the metric it decided on, each arm's partial credit
    per task, and the sequential stages with the stop the reason cites."""
    from coevo.gate import StageRecord

    h = world.h[0].child(system_prompt="Soft branch.")
    store.put_asset(h)
    pid = store.add_proposal(proposer="harness", kind="harness", parent=world.h[0].hash,
                             candidate=h, run="exp1", round=1)
    stages = [StageRecord(name="screen", tasks=2, tasks_total=2, rollouts=4, wins=2, losses=0,
                          ties=0, p_value=0.25, action="continue", rule="predictive P=0.700"),
              StageRecord(name="chunk 1", tasks=2, tasks_total=4, rollouts=4, wins=4, losses=0,
                          ties=0, p_value=0.0625, action="reject", rule="futility: P=0.010 < 0.1")]
    store.add_decision(pid, policy="soft", accepted=False, reason="rejected: ...; stopped at "
                       "chunk 1 after 4/4 tasks: futility: P=0.010 < 0.1", rollouts=8,
                       metric="partial", stages=stages, evidence=[
                           {"task_id": "simple_9", "incumbent": 0.0, "candidate": 0.0,
                            "incumbent_partial": 0.25, "candidate_partial": 0.75}])
    text = render_text(proposal_view(store, pid), width=200)
    assert "policy soft  metric partial" in text
    row = next(ln for ln in text.splitlines() if "simple_9" in ln)
    assert "0.250" in row and "0.750" in row
    stop = next(ln for ln in text.splitlines() if "chunk 1" in ln and "futility" in ln)
    assert "reject" in stop and "0.0625" in stop


def test_proposer_stats_count_valid_gated_accepted_and_mean_gain(store, world, db_url):
    """`coevo proposals stats`: per proposer, from the stored proposals and decisions; a
    reviewer's veto does not change what the gate accepted."""
    import json

    from typer.testing import CliRunner

    from coevo.cli import app
    from coevo.proposer_stats import proposer_stats, stats_table
    from coevo.store.records import REVIEW_POLICY

    store.add_decision(world.acc, policy=REVIEW_POLICY, accepted=False, reason="vetoed: too long",
                       status="rejected")
    got = {s.proposer: s for s in proposer_stats(store, "exp1")}
    assert sorted(got) == ["demos", "harness_lm", "skills_lm"]
    lm, demos, skills = got["harness_lm"], got["demos"], got["skills_lm"]
    assert (lm.proposals, lm.invalid, lm.gated, lm.accepted) == (2, 1, 1, 1)
    assert (lm.valid_rate, lm.accept_rate, lm.accepted_delta, lm.gated_delta) == (0.5, 1.0, 0.5, 0.5)
    assert (demos.proposals, demos.invalid, demos.gated, demos.accepted) == (1, 0, 1, 0)
    assert (demos.accept_rate, demos.accepted_delta, demos.gated_delta) == (0.0, None, 0.0)
    assert (skills.gated, skills.accept_rate, skills.valid_rate) == (0, None, 1.0)  # pending
    lines = render_text(stats_table(store, "exp1")).splitlines()
    row = next(ln for ln in lines if "harness_lm" in ln)
    assert row.replace("│", " ").split() == ["harness_lm", "2", "1", "0.500", "1", "1", "1", "0.500",
                                             "0.500"]

    res = CliRunner().invoke(app, ["proposals", "stats", "--run", "exp1", "--json",
                                   "--db", db_url])  # store.url masks the password
    assert res.exit_code == 0, res.output
    doc = {d["proposer"]: d for d in json.loads(res.output)}
    assert doc["demos"]["accept_rate"] == 0.0 and doc["harness_lm"]["valid_rate"] == 0.5


def test_proposer_stats_count_a_peer_modes_val_mean_comparisons(store):
    """fst / bettertogether / skillopt decide by val means (no paired gate statistic): a
    compared proposal counts as gated with candidate - reference as its mean difference; one
    the mode did not evaluate (another asset kind) counts in neither."""
    from coevo.proposer_stats import proposer_stats

    h0 = Harness(name="base", system_prompt="p")
    h1, h2, h3, h4 = (h0.child(system_prompt=f"p{i}") for i in (1, 2, 3, 4))
    for h in (h0, h1, h2, h3, h4):
        store.put_asset(h)
    run = store.create_run("peer", config={})
    store.start_round(run.id, 0)
    stats = [("bettertogether", True, {"val_mean": 0.5, "incumbent_val_mean": 0.2, "n_tasks": 20}),
             ("bettertogether", False, {"val_mean": 0.1, "incumbent_val_mean": 0.2, "n_tasks": 20}),
             ("fst", True, {"val_mean": 0.25, "parent": 0, "parent_val_mean": 0.2}),
             ("skillopt", False, {})]  # "edits skill documents only": not evaluated
    for (policy, ok, stat), (proposer, cand) in zip(stats, [("demos", h1), ("harness", h2),
                                                             ("harness", h3), ("demos", h4)]):
        pid = store.add_proposal(proposer=proposer, kind="harness", parent=h0.hash,
                                 candidate=cand.hash, run=run.id, round=0)
        store.add_decision(pid, policy=policy, accepted=ok, reason=f"{policy}: ...", statistic=stat)
    rows = proposal_rows(store, run="peer")
    assert [r.mean_diff for r in rows] == [pytest.approx(0.3), pytest.approx(-0.1),
                                            pytest.approx(0.05), None]
    got = {s.proposer: s for s in proposer_stats(store, "peer")}
    assert (got["demos"].proposals, got["demos"].gated, got["demos"].accepted) == (2, 1, 1)
    assert got["demos"].accepted_delta == pytest.approx(0.3)
    assert (got["harness"].gated, got["harness"].accepted) == (2, 1)
    assert got["harness"].gated_delta == pytest.approx((-0.1 + 0.05) / 2)
