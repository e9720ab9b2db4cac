"""The `knobs` proposer: a declared sweep over harness knobs (decoding, workflow), no LLM.

A run config lists the values worth trying per knob, e.g.

    proposers:
      - name: knobs
        options: {grid: {temperature: [0.0, 0.3], max_new_tokens: [160]}}

Each round it proposes `per_round` harness children, each changing ONE knob of the incumbent
to one listed value (a value equal to the incumbent's is skipped), taken in the grid's order
from position `round * per_round`, cycling: the sweep walks the grid over the rounds, and a
rejected setting comes back only after the rest have had their turn. The gate decides, as for
any candidate; nothing is accepted because it was listed. A setting that comes back while the
incumbent (assets and checkpoint) is unchanged is the same hypothesis, and the gate repeats its
earlier rejection without testing it again (coevo/gatestep.py, "Across rounds"); after an RL
stage or an accepted revision it is compared afresh.

Why: the embedded 135M model cannot be relied on to pick a knob value from a prompt (the
`harness` and `edits` proposers offer the same knobs to the model), while some knobs move a
small model's score by themselves: on BFCL simple_python val (72 tasks) greedy decoding of the
constrained harness won 7 tasks and lost 1 against its sampling at 0.7 (bench/README.md).
A sweep is DSPy's and GEPA's plain hyperparameter search on the harness's side.

Joint settings (`combine: true`). One knob at a time is coordinate ascent, and each step must
pass the gate on its own: where two knobs add up, the second one's increment can be too small
for the val split while the pair's effect against the incumbent is not. With `combine`, the
options are every combination of the grid's settings (at most one value per knob, at least one
knob changed), singles first, then pairs, and so on in grid order; `per_round` at the number of
combinations proposes them all as one round, which the gate decides as one Holm family and
keeps the best accepted of (coevo/gatestep.py). The price is power: each candidate must pass
Holm's level for the whole family. Measured (bench/README.md, `bfcl-joint`): on BFCL
simple_python, the joint setting (copied strings and greedy decoding) did not beat the
constrained seed on val at the gate's seeds, and copied strings alone, accepted at alpha in
every seed of the one-knob sweep, missed alpha / 3 in one of two seeds. Off by default.

Safety: knobs are the `harness` proposer's whitelist (`coevo.propose.harness.KNOBS`), each
value is checked against the knob's declared type and bounds when the proposer is built (a
bad one is refused naming `grid.<knob>`), and the child is built by the same code as the
`harness` proposer's revisions (`build_revision`), so it can reach no other field. A harness
whose temperature a sweep sets to 0 decodes greedily: the RL stage then needs its own
sampling temperature (`rl.stage.temperature_options: {value: T}`), or its groups are copies.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from coevo.propose.base import Candidate, ProposalContext
from coevo.propose.harness import KNOBS, build_revision, knob_schema, knob_value


class KnobsProposer:
    name = "knobs"

    def __init__(self, grid: Mapping[str, Sequence[Any]], per_round: int = 1,
                 combine: bool = False, name: str = "knobs"):
        if not isinstance(grid, Mapping) or not grid:
            raise ValueError("grid: give at least one knob with the values to try")
        if per_round < 1:
            raise ValueError("per_round must be >= 1")
        if not isinstance(combine, bool):
            raise ValueError(f"combine: expected true or false, got {json.dumps(combine)[:40]}")
        for knob, values in grid.items():
            if knob not in KNOBS:
                raise ValueError(f"grid.{knob}: not a harness knob (knobs: {', '.join(KNOBS)})")
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise ValueError(f"grid.{knob}: expected a non-empty list of values")
            for v in values:
                try:
                    jsonschema.validate(v, knob_schema(knob))
                except jsonschema.ValidationError as e:
                    raise ValueError(f"grid.{knob}: {json.dumps(v)[:40]} is out of bounds "
                                     f"({e.message})") from None
        self.grid = {k: list(v) for k, v in grid.items()}
        self.per_round, self.combine, self.name = per_round, combine, name

    def options(self, h: Any) -> list[dict[str, Any]]:
        """Every setting the sweep can propose from harness `h`, in sweep order: one knob each,
        or with `combine` every combination of them (a value equal to h's is no change)."""
        per_knob = {k: [v for v in vs if v != knob_value(h, k)] for k, vs in self.grid.items()}
        singles = [{k: v} for k, vs in per_knob.items() for v in vs]
        if not self.combine:
            return singles
        out = []
        for size in range(1, len(per_knob) + 1):
            for knobs in itertools.combinations([k for k, vs in per_knob.items() if vs], size):
                out += [dict(zip(knobs, vals))
                        for vals in itertools.product(*(per_knob[k] for k in knobs))]
        return out

    def settings(self, ctx: ProposalContext) -> list[dict[str, Any]]:
        """This round's settings ({knob: value, ...}), in sweep order."""
        options = self.options(ctx.incumbent.harness)
        if not options:
            return []
        start = ctx.round * self.per_round
        return [options[(start + i) % len(options)]
                for i in range(min(self.per_round, len(options)))]

    def propose(self, ctx: ProposalContext) -> list[Candidate]:
        h = ctx.incumbent.harness
        out = []
        for setting in self.settings(ctx):
            child, error = build_revision(h, {"workflow": setting}, list(self.grid))
            change = ", ".join(f"{k} {json.dumps(knob_value(h, k))} -> {json.dumps(v)}"
                               for k, v in setting.items())
            out.append(Candidate(
                asset=child, proposer=self.name, kind="harness", error=error,
                rationale=f"knob sweep: {change} (round {ctx.round}; grid "
                          f"{json.dumps(self.grid)}{'; combined' if self.combine else ''})",
                predicted_effect=f"a better {' and '.join(setting)} for this model and "
                                 f"environment; the gate measures it"))
        return out
