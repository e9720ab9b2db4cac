"""The `knobs` proposer: a declared sweep over the harness's knobs, one knob per candidate,
walked over the rounds; bad grids are refused naming the knob."""

from __future__ import annotations

import pytest

from coevo.errors import CoevoError

from coevo.assets.harness import Harness
from coevo.propose import Incumbent, ProposalContext, check_candidate, make_proposer

H = Harness.model_validate({"name": "h", "system_prompt": "Call the function.",
                            "decoding": {"temperature": 0.7, "max_new_tokens": 96}})
GRID = {"temperature": [0.0, 0.7, 0.3], "max_new_tokens": [160]}


def ctx(r: int, h: Harness = H) -> ProposalContext:
    return ProposalContext(run="r", round=r, incumbent=Incumbent(harness=h))


def settings(cands):
    return [(c.asset.decoding.temperature, c.asset.decoding.max_new_tokens) for c in cands]


def test_the_sweep_walks_the_grid_one_knob_at_a_time_and_cycles():
    p = make_proposer("knobs", grid=GRID)
    # 0.7 is the incumbent's temperature: skipped; the rest in grid order, one per round.
    assert [settings(p.propose(ctx(r))) for r in range(4)] == [
        [(0.0, 96)], [(0.3, 96)], [(0.7, 160)], [(0.0, 96)]]
    cand = p.propose(ctx(0))[0]
    assert cand.kind == "harness" and cand.asset.parent == H.hash and cand.proposer == "knobs"
    assert check_candidate(cand, Incumbent(harness=H)) is None
    assert cand.rationale.startswith("knob sweep: temperature 0.7 -> 0.0 (round 0")
    # Everything else of the harness is the incumbent's.
    assert cand.asset.model_dump(exclude={"decoding", "parent"}) == H.model_dump(
        exclude={"decoding", "parent"})
    two = make_proposer("knobs", grid=GRID, per_round=2)
    assert settings(two.propose(ctx(1))) == [(0.7, 160), (0.0, 96)]


def test_a_sweep_with_nothing_left_to_change_proposes_nothing():
    p = make_proposer("knobs", grid={"temperature": [0.7]})
    assert p.propose(ctx(0)) == []


@pytest.mark.parametrize("grid, field", [
    ({"gate.alpha": [0.1]}, "grid.gate.alpha: not a harness knob"),
    ({"temperature": [-1.0]}, "grid.temperature: -1.0 is out of bounds"),
    ({"max_new_tokens": [0]}, "grid.max_new_tokens: 0 is out of bounds"),
    ({"temperature": []}, "grid.temperature: expected a non-empty list"),
    ({}, "grid: give at least one knob"),
])
def test_a_bad_grid_is_refused_naming_the_knob(grid, field):
    with pytest.raises(CoevoError, match=r"proposers: knobs: .*" + field.replace(".", r"\.")):
        make_proposer("knobs", grid=grid)


def test_copying_strings_is_a_knob_a_sweep_can_propose():
    h = Harness.model_validate({"name": "h", "system_prompt": "Call the function.",
                                "tool_format": "python",
                                "decoding": {"constrain": {"mode": "tool_calls"}}})
    [cand] = make_proposer("knobs", grid={"strings": ["copy"]}).propose(ctx(0, h))
    assert cand.error is None and check_candidate(cand, Incumbent(harness=h)) is None
    assert cand.asset.decoding.constrain.strings == "copy"
    assert cand.asset.decoding.constrain.mode == "tool_calls"
    assert cand.rationale.startswith('knob sweep: strings "free" -> "copy"')
    # a json-format harness cannot copy: the candidate is invalid, naming the field
    [bad] = make_proposer("knobs", grid={"strings": ["copy"]}).propose(
        ctx(0, h.model_copy(update={"tool_format": "json"})))
    assert bad.asset is None and "python only" in bad.error
    with pytest.raises(CoevoError, match="grid.strings"):
        make_proposer("knobs", grid={"strings": ["quote"]})


def test_combine_proposes_every_joint_setting_as_one_family():
    h = Harness.model_validate({"name": "h", "system_prompt": "Call the function.",
                                "tool_format": "python",
                                "decoding": {"temperature": 0.7,
                                             "constrain": {"mode": "tool_calls"}}})
    grid = {"strings": ["copy"], "temperature": [0.0, 0.3]}
    p = make_proposer("knobs", grid=grid, combine=True, per_round=5)
    cands = p.propose(ctx(0, h))
    got = [(c.asset.decoding.constrain.strings, c.asset.decoding.temperature) for c in cands]
    # singles in grid order, then the pairs: 1 + 2 singles, 1 x 2 pairs
    assert got == [("copy", 0.7), ("free", 0.0), ("free", 0.3), ("copy", 0.0), ("copy", 0.3)]
    assert all(c.error is None and check_candidate(c, Incumbent(harness=h)) is None
               for c in cands)
    assert cands[3].rationale.startswith(
        'knob sweep: strings "free" -> "copy", temperature 0.7 -> 0.0 (round 0')
    assert cands[3].asset.model_dump(exclude={"decoding", "parent"}) == h.model_dump(
        exclude={"decoding", "parent"})
    # without combine, the same grid is one knob at a time
    assert len(make_proposer("knobs", grid=grid, per_round=5).propose(ctx(0, h))) == 3
    # from an incumbent that already copies, the combinations reduce to temperature alone
    copied = cands[0].asset
    left = make_proposer("knobs", grid=grid, combine=True, per_round=5).propose(ctx(0, copied))
    assert [c.asset.decoding.temperature for c in left] == [0.0, 0.3]
    with pytest.raises(CoevoError, match=r"proposers: knobs: .*combine: expected true or false"):
        make_proposer("knobs", grid=grid, combine="yes")
