"""The peer-method modes (coevo/modes/) end to end on CPU with the loop tests' parts: the tiny
random Llama trained by the real RL stage, the scripted policy (it passes iff the system
prompt carries HINT), FirstCharEnv, the real store. Plus the pure pieces: fst's Pareto front,
BetterTogether's strategy string, SkillOpt's edit count."""

from __future__ import annotations

import random

import pytest
from test_loop import HELPS, HINT, NO_EFFECT, build, config

from coevo.assets.skill import Skill, SkillLibrary
from coevo.errors import AssetError
from coevo.loop import run_coevolution
from coevo.modes.fst import Member, dominator, draw, pareto_front
from coevo.modes.settings import parse_strategy
from coevo.assets.skill import SkillRef
from coevo.propose.base import Candidate

BETTER = {**HELPS, "round": None}  # fires every round
SAME = {**NO_EFFECT, "round": None}


def _run(tmp_path, mode, candidates=(HELPS, NO_EFFECT), rounds=2, setup=None, **kw):
    cfg = config(tmp_path, mode, candidates, rounds=rounds, name=f"run-{mode}", **kw)
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'modes.db'}")
    if setup is not None:
        setup(store, parts)
    return store, run_coevolution(cfg, store, parts)


def _reasons(store, run):
    return {p.rationale: (p.status, store.decisions(p.id)[-1].reason)
            for p in store.proposals(run) if p.status != "invalid"}


def _charged_equals_episodes(store, run):
    """Every rollout the mode ran is charged: the `rollouts` rows equal the stored episodes
    outside the val curve (charged apart as eval_rollouts) and the final test (not charged)."""
    spent = store.budget_totals(run)
    trajs = store.trajectories(run)
    test = [t for t in trajs if t.split == "test"]
    assert spent["rollouts"] == len(trajs) - len(test) - spent.get("eval_rollouts", 0)
    return spent


# --- fst ---------------------------------------------------------------------------------------


def _m(*scores):
    return Member(harness=str(len(scores)), scores={f"t{i}": s for i, s in enumerate(scores)})


def test_pareto_front_on_a_hand_made_table():
    pop = [_m(1, 0, 0, 0.5),   # 0: alone best on t0
           _m(0, 1, 0, 0.5),   # 1: alone best on t1
           _m(0, 1, 0, 0.2),   # 2: ties 1 on t1, worse elsewhere: dominated by 1
           _m(0, 0, 0, 0.5),   # 3: ties on t2, t3 only, each shared with 0 and 1: dominated
           _m(0.5, 0.5, 1, 0)]  # 4: alone best on t2
    assert pareto_front(pop) == [0, 1, 4]
    # Parent / rollout draws come from the front only, and every front member is drawn.
    rng = random.Random(0)
    assert {draw(pop, rng) for _ in range(200)} == {0, 1, 4}
    # Weak dominance: a copy of member 1 is dominated, one better task is enough to join.
    assert dominator(pop, {"t0": 0, "t1": 1, "t2": 0, "t3": 0.5}) == 1
    assert dominator(pop, {"t0": 0, "t1": 0, "t2": 0, "t3": 0.9}) is None


def test_fst_runs_two_rounds_with_a_population(tmp_path):
    round1 = {**NO_EFFECT, "round": 1, "rationale": "round-1 style"}
    store, res = _run(tmp_path, "fst", candidates=(HELPS, NO_EFFECT, round1))
    props = _reasons(store, res.run)
    assert props[HELPS["rationale"]][0] == "accepted"
    assert props[HELPS["rationale"]][1].startswith("fst: non-dominated, joins population as member 1")
    # The seed scores 0 everywhere: a no-op revision ties it on every task and is dominated.
    assert props[NO_EFFECT["rationale"]] == ("rejected", props[NO_EFFECT["rationale"]][1])
    assert props[NO_EFFECT["rationale"]][1].startswith("fst: dominated by member 0")
    assert props["round-1 style"][1].startswith("fst: dominated by member 1")
    rounds = store.rounds(res.run)
    pop0 = rounds[0].summary["fst"]["population"]
    assert [(sum(m["scores"].values()), m["round"]) for m in pop0] == [(0.0, 0), (12.0, 0)]
    # Round 1's rollouts sample only its front: member 1 dominates the seed, so only HINT.
    front1 = rounds[1].summary["fst"]["front"]
    assert front1 == [pop0[1]["harness"]]
    assert {t.harness for t in store.trajectories(res.run, round=1, split="train")} == set(front1)
    # Round 0's front was the seed alone; the incumbent is the best member under C.
    assert rounds[0].summary["fst"]["front"] == [pop0[0]["harness"]]
    assert res.incumbent["harness"] == pop0[1]["harness"] and res.final.mean == 1.0
    assert store.decisions(store.proposals(res.run)[0].id)[-1].policy == "fst"
    _charged_equals_episodes(store, res.run)


# --- bettertogether ----------------------------------------------------------------------------


def test_strategy_string_is_parsed_and_bad_ones_name_the_field(tmp_path):
    assert parse_strategy("p -> w -> p") == ["p", "w", "p"]
    assert parse_strategy("w->p") == ["w", "p"]
    with pytest.raises(AssetError) as e:
        config(tmp_path, "bettertogether", bettertogether={"strategy": "p -> x"})
    assert e.value.field == "bettertogether.strategy" and "'x'" in str(e.value)


def test_bettertogether_runs_its_stages_in_order(tmp_path):
    store, res = _run(tmp_path, "bettertogether", candidates=(BETTER, SAME), rounds=3)
    rounds = store.rounds(res.run)
    assert [r.summary["stage"] for r in rounds] == ["p", "w", "p"]
    assert [r.summary["stage_index"] for r in rounds] == [0, 1, 2]
    # p: proposals selected on val mean; w: an RL stage and no proposals.
    by_round = {r.index: [p for p in store.proposals(res.run) if p.round == r.index] for r in rounds}
    assert by_round[1] == [] and rounds[1].summary["rl_steps"]
    assert "rl_steps" not in rounds[0].summary and "rl_steps" not in rounds[2].summary
    ck = store.latest_checkpoint(res.run)
    assert ck.round == 1 and res.incumbent["checkpoint"] == ck.id
    r0 = {p.rationale: p for p in by_round[0]}
    d_help = store.decisions(r0[HELPS["rationale"]].id)[-1]
    d_same = store.decisions(r0[NO_EFFECT["rationale"]].id)[-1]
    assert (d_help.accepted, d_help.reason) == (True, "bettertogether: val mean 1.000 > 0.000 (incumbent)")
    assert (d_same.accepted, d_same.reason) == (False, "bettertogether: val mean 0.000 not > 0.000 (incumbent)")
    assert len(d_help.evidence) == 12 and {(e.incumbent, e.candidate) for e in d_help.evidence} == {(0.0, 1.0)}
    # Round 2 (p again, under the RL checkpoint): a copy of HINT no longer beats the incumbent.
    r2 = {p.rationale: p.status for p in by_round[2] if p.status != "invalid"}
    assert set(r2.values()) == {"rejected"}
    assert res.final.mean == 1.0
    _charged_equals_episodes(store, res.run)


def test_bettertogether_with_the_gate_judges_its_p_stages_by_the_paired_gate(tmp_path):
    """`select: gate`: a p stage's candidates go through the gated mode's paired gate (its
    policy, statistic and evidence), before the w stage's RL; the w stage still trains."""
    store, res = _run(tmp_path, "bettertogether", candidates=(BETTER, SAME), rounds=2,
                      bettertogether={"strategy": "p -> w", "select": "gate"})
    rounds = store.rounds(res.run)
    assert [r.summary["stage"] for r in rounds] == ["p", "w"]
    r0 = {p.rationale: p for p in store.proposals(res.run) if p.round == 0}
    d_help = store.decisions(r0[HELPS["rationale"]].id)[-1]
    d_same = store.decisions(r0[NO_EFFECT["rationale"]].id)[-1]
    assert d_help.accepted and d_help.policy == "paired" and "Holm over 2" in d_help.reason
    assert not d_same.accepted and d_same.policy == "paired"
    assert d_help.statistic["mean_diff"] == 1.0 and d_help.statistic["seed_base"] == 0.0
    # The gate ran the incumbent arm once (reused for the second candidate): its rollouts
    # are charged to round 0 like the gated mode's.
    assert rounds[1].summary["rl_steps"] and store.latest_checkpoint(res.run).round == 1
    assert res.incumbent["harness"] == r0[HELPS["rationale"]].candidate
    assert res.final.mean == 1.0
    _charged_equals_episodes(store, res.run)


# --- skillopt ----------------------------------------------------------------------------------


class SkillEdits:
    """A real Proposer of skill-library candidates (the skills proposer's shape): a new skill
    whose body is a no-op, one whose body carries HINT (the scripted policy passes with it in
    its system prompt), and one editing two skills at once (over the edit budget of 2 the first two used)."""

    name = "skill-edits"
    last_cost = {"proposer_calls": 1.0}

    def propose(self, ctx):
        lib = ctx.incumbent.library

        def add(*bodies):
            new = [Skill(name=f"say-{len(b)}-{i}", body=b,
                         description="Say something about a number.") for i, b in enumerate(bodies)]
            return Candidate(asset=lib.child(skills=sorted(
                [*lib.skills, *(SkillRef.of(s) for s in new)], key=lambda x: x.name)),
                proposer=self.name, kind="skill_library", skills=new,
                rationale="+".join(b[:8] for b in bodies))
        return [add("Be kind."), add(HINT), add("Be calm.", "Be quick.")] if ctx.round == 0 else []


def _library(store, parts):
    seed = Skill(name="unrelated", description="Handles spreadsheets.", body="Use cells.")
    store.put_asset(seed)
    store.put_asset(SkillLibrary.from_skills("lib", [seed]))
    parts.proposers = [SkillEdits()]


def test_skillopt_accepts_only_strictly_better_edits_within_the_budget(tmp_path):
    store, res = _run(tmp_path, "skillopt", candidates=(), setup=_library,
                      assets={"harness": "tiny", "skill_library": "lib"},
                      skillopt={"max_edits": 2})
    props = _reasons(store, res.run)
    assert props["Be kind."] == ("rejected", "skillopt: val mean 0.000 not > 0.000 (incumbent)")
    assert props[HINT[:8]] == ("accepted", "skillopt: val mean 1.000 > 0.000 (incumbent)")
    assert props["Be calm.+Be quick"] == (
        "rejected", "skillopt: 2 skill edit(s) exceed the step's edit budget (0 of 2 left)")
    # No RL: SkillOpt keeps the model frozen.
    assert store.latest_checkpoint(res.run) is None and res.incumbent["checkpoint"] is None
    lib, skills = store.get_library(res.incumbent["skill_library"])
    assert {s.name for s in skills} == {"unrelated", f"say-{len(HINT)}-0"} and res.final.mean == 1.0
    assert [r.summary["val_score"] for r in store.rounds(res.run)] == [1.0, 1.0]
    _charged_equals_episodes(store, res.run)


# --- the bench's budget planning (bench/coevolution_budget.py) -------------------------------


def test_bench_plans_peer_rounds_at_their_worst_case():
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "bench"))
    import coevolution as bench
    import coevolution_budget as budget
    import coevolution_report as report

    assert report.MODE_ORDER == ("weight-only", "harness-only", "ungated", "gated")  # defaults
    b = bench.base_config("arithmetic", False, REPO / "unused", None, ["demos"], "embedded")
    r = budget.Rates(eval=500, rl=1000, call=2500)  # RL 32 rollouts; val 20; train rollouts 16
    # fst: the RL steps + seed and candidate on val (round 0), then the candidate alone.
    assert budget.plan_round(b, "fst", r, 52_000, 0) == budget.Plan(False, None, 52_000)
    assert budget.plan_round(b, "fst", r, 51_999, 0) is None
    assert budget.plan_round(b, "fst", r, 42_000, 1) == budget.Plan(False, None, 42_000)
    # bettertogether "p -> w -> p": train rollouts + incumbent and candidate on val; then RL.
    assert budget.plan_round(b, "bettertogether", r, 1e9, 0).estimate == 16 * 500 + 2 * 20 * 500
    assert budget.plan_round(b, "bettertogether", r, 1e9, 1).estimate == 32 * 1000
    assert (budget.trains(b, "bettertogether", 0), budget.trains(b, "bettertogether", 1)) == (False, True)
    assert budget.plan_round(b, "skillopt", r, 1e9, 0).estimate == 16 * 500 + 2 * 20 * 500
    assert budget.trains(b, "skillopt", 0) is False and budget.trains(b, "fst", 0) is True
