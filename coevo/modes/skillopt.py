"""`skillopt`: Microsoft SkillOpt style optimization of the skill documents of a frozen model.

    for round r (one SkillOpt step):
        trajs  = train rollouts of the incumbent (no RL: SkillOpt keeps the model frozen)
        edits  = proposers' skill-library candidates, in order, while the step's edit budget
                 (skillopt.max_edits skill edits) lasts; the rest are rejected as over budget
        each admitted edit and the incumbent on the val split (the selection split)
        accept the best edit iff its val mean is strictly higher than the incumbent's

SkillOpt treats the SKILL.md documents as the trainable state of a frozen agent: propose an
edit from execution traces, evaluate on held-out examples, accept only on strict improvement,
with an edit budget per step playing the part of a learning rate. It updates no weights, so
this mode runs no RL stage (`MODES["skillopt"].train` is False), like harness-only; the
policy's weights stay the base model's throughout.

Departures: the edits come from coevo's `skills` proposer (ARISE-style distil / refine /
lifecycle, one library candidate per operation) rather than SkillOpt's optimizer prompt; an
edit is counted as one member skill added, changed (body, description, state) or removed, so
a candidate touching more skills than the budget left is rejected whole rather than trimmed;
SkillOpt's negative memory of rejected edits and its momentum are not kept (each round's
proposers see that round's trajectories only); candidates of other kinds are rejected
unevaluated.
"""

from __future__ import annotations

from typing import Any

from coevo.modes.common import decide, pending_of, select_by_mean
from coevo.propose.base import Candidate, Incumbent

POLICY = "skillopt"


def edits(incumbent: Incumbent, cand: Candidate) -> int:
    """Member skills a library candidate adds, changes or removes against the incumbent's."""
    old = {ref.name: ref for ref in (incumbent.library.skills if incumbent.library else [])}
    new = {ref.name: ref for ref in cand.asset.skills}  # type: ignore[union-attr]
    return sum(old.get(n) != new.get(n) for n in old.keys() | new.keys())


def skillopt_round(run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    from coevo.loop import collect_train_rollouts, propose_step

    collect_train_rollouts(run, r, incumbent)
    trajs = run.store.trajectories(run.id, round=r, split="train")
    accepted, pending = pending_of(propose_step(run, r, incumbent, trajs))
    if pending:
        cap, used, admitted, refused = run.cfg.skillopt.max_edits, 0, [], []
        for pid, cand in pending:
            if cand.kind != "skill_library":
                refused.append((pid, f"skillopt: edits skill documents only; a {cand.kind} "
                                      "candidate is not evaluated"))
                continue
            n = edits(incumbent, cand)
            if used + n > cap:
                refused.append((pid, f"skillopt: {n} skill edit(s) exceed the step's edit "
                                     f"budget ({cap - used} of {cap} left)"))
                continue
            used += n
            admitted.append((pid, cand))
        with run.store.transaction():  # decided before any evaluation: a resume keeps them
            for pid, why in refused:
                decide(run, pid, POLICY, False, why)
        accepted = select_by_mean(run, r, incumbent, admitted, POLICY) if admitted else []
    for cand in accepted:
        incumbent = incumbent.with_candidate(cand)
    return incumbent, accepted
