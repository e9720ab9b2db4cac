"""The gate reuses the incumbent's outcomes across rounds while the gated incumbent (assets
and checkpoint) is unchanged: same seed base, the earlier rounds' stored evidence as the
incumbent arm, nothing run or charged twice; a new checkpoint (RL) starts a new stretch."""

from __future__ import annotations

from test_loop import HELPS, NO_EFFECT, _run

STYLE2 = {"kind": "harness", "changes": {"answer_format": "Be brief."}, "rationale": "style 2"}
PER_ROUND = ({**NO_EFFECT, "round": 0}, {**STYLE2, "round": 1}, {**HELPS, "round": 2})


def _decisions(store, run):
    return {p.round: store.decisions(p.id)[0] for p in store.proposals(run)}


def test_unchanged_incumbent_is_scored_once_across_rounds(tmp_path):
    """harness-only (no checkpoint), rounds 0 and 1 accept nothing: rounds 1 and 2 compare
    with the incumbent outcomes round 0 stored (12 val tasks), run only the candidate arm, and
    charge 12 gate rollouts instead of 24; the verdicts are those of a fresh incumbent arm."""
    cfg, store, _, res = _run(tmp_path, "harness-only", PER_ROUND, rounds=3,
                              budgets={"patience": None})
    dec = _decisions(store, res.run)
    assert [dec[r].accepted for r in range(3)] == [False, False, True]
    assert {dec[r].statistic["seed_base"] for r in range(3)} == {float(cfg.seed)}
    assert [dec[r].statistic["incumbent_reused"] for r in range(3)] == [0.0, 12.0, 12.0]
    # the same pairs' incumbent side: round 0's stored outcomes
    inc = [{(e.task_id, e.sample): e.incumbent for e in dec[r].evidence} for r in range(3)]
    assert inc[0] == inc[1] == inc[2] and len(inc[0]) == 12
    assert {(e.incumbent, e.candidate) for e in dec[2].evidence} == {(0.0, 1.0)}
    train = cfg.splits.train_n * cfg.splits.train_samples  # harness-only train rollouts
    spent = [store.budget_totals(res.run, round=r)["rollouts"] - train for r in range(3)]
    assert spent == [24.0, 12.0, 12.0]
    # and after the accepted revision the incumbent is new: the next stretch starts over
    assert store.rounds(res.run)[2].summary["accepted"]


def test_a_new_checkpoint_starts_a_new_stretch(tmp_path):
    """gated mode: RL leaves a new checkpoint every round, so each round has its own seed
    base and scores the incumbent arm itself."""
    cfg, store, _, res = _run(tmp_path, "gated", PER_ROUND[:2], rounds=2,
                              budgets={"patience": None})
    dec = _decisions(store, res.run)
    assert [dec[r].statistic["seed_base"] for r in range(2)] == [cfg.seed, cfg.seed + 1.0]
    assert [dec[r].statistic["incumbent_reused"] for r in range(2)] == [0.0, 0.0]
    ck = [store.rounds(res.run)[r].summary["incumbent"]["checkpoint"] for r in range(2)]
    assert ck[0] != ck[1]


def test_a_candidate_rejected_earlier_in_the_stretch_is_not_compared_again(tmp_path):
    """harness-only, the same no-effect candidate proposed in rounds 0, 1 and 2 (a
    deterministic proposer on an unchanged incumbent): round 0 compares it (24 gate
    rollouts); rounds 1 and 2 repeat that rejection with round 0's evidence and run nothing:
    a new comparison of the same hypothesis would only re-draw the noise."""
    again = {**NO_EFFECT, "round": None}
    cfg, store, _, res = _run(tmp_path, "harness-only", (again,), rounds=3,
                              budgets={"patience": None, "stop_on_repeats": False})
    props = sorted(store.proposals(res.run), key=lambda p: p.round)
    assert len({p.candidate for p in props}) == 1 and [p.status for p in props] == ["rejected"] * 3
    dec = [store.decisions(p.id)[0] for p in props]
    assert dec[0].rollouts > 0 and "mean_diff" in dec[0].statistic
    assert [d.rollouts for d in dec[1:]] == [0, 0]
    assert all(d.reason.startswith("rejected without a new comparison: the same candidate was "
                                   f"compared with this incumbent (same assets, checkpoint and "
                                   f"seeds) in round 0 (proposal {props[0].id[:12]})")
               for d in dec[1:])
    assert [{(e.task_id, e.incumbent, e.candidate) for e in d.evidence} for d in dec[1:]] == [
        {(e.task_id, e.incumbent, e.candidate) for e in dec[0].evidence}] * 2
    train = cfg.splits.train_n * cfg.splits.train_samples
    spent = [store.budget_totals(res.run, round=r)["rollouts"] - train for r in range(3)]
    assert spent[1:] == [0.0, 0.0] and spent[0] > 0
    # A run's proposer stats count the comparison once: the repeats were not compared.
    from coevo.proposer_stats import proposer_stats

    [st] = [s for s in proposer_stats(store, run=res.run) if s.gated or s.proposals]
    assert (st.proposals, st.gated, st.accepted) == (3, 1, 0)


def test_a_run_without_rl_stops_once_its_proposers_only_repeat_rejected_candidates(tmp_path):
    """harness-only, the same no-effect candidate every round: round 1 proposes only what
    round 0's gate rejected against the same incumbent, so the run stops there (round 2 would
    repeat it again) and records why. A gated run, whose RL stage gives every round a new
    checkpoint, runs all its rounds on the same proposals."""
    again = {**NO_EFFECT, "round": None}
    _, store, _, res = _run(tmp_path, "harness-only", (again,), rounds=3,
                            budgets={"patience": None})
    rounds = store.rounds(res.run)
    assert [x.index for x in rounds] == [0, 1]
    assert [x.summary["stop"] for x in rounds] == [None, (
        "round 1 proposed only candidates the gate already rejected against this incumbent "
        "(1), and no RL stage changes it")]
    assert res.final is not None  # the test split is still scored once
    _, store2, _, res2 = _run(tmp_path / "g", "gated", (again,), rounds=3,
                              budgets={"patience": None})
    assert [x.summary["stop"] for x in store2.rounds(res2.run)] == [None, None, None]


def test_a_new_candidate_after_repeats_keeps_the_run_going(tmp_path):
    """Round 1 repeats round 0's rejected candidate but also proposes a new one: the run goes
    on (the new one was compared, round 2 runs)."""
    again = {**NO_EFFECT, "round": None}
    cfg, store, _, res = _run(tmp_path, "harness-only", (again, {**STYLE2, "round": 1}),
                              rounds=3, budgets={"patience": None})
    rounds = store.rounds(res.run)
    assert [x.index for x in rounds] == [0, 1, 2]
    assert rounds[1].summary["stop"] is None
    assert rounds[2].summary["stop"].startswith("round 2 proposed only candidates")
