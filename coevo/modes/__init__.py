"""The peer methods as modes of `coevo run`: each replaces the loop's RL -> propose -> gate
round with its own, over the same parts, store and budget charges (coevo/ledger.py), so
bench/coevolution.py compares them with the co-evolving modes at equal spend.

| mode | module | the round |
| --- | --- | --- |
| `fst` | fst.py | RL with rollouts on a Pareto population of harnesses, then a reflective round; a candidate joins if not dominated |
| `bettertogether` | bettertogether.py | one stage of the strategy (`p -> w -> p`): prompt optimization selected on val mean, or an RL stage |
| `skillopt` | skillopt.py | skill-document edits under an edit budget, accepted when strictly better on val; no RL |

Every candidate is stored as a proposal with its decision and the reason in the mode's words,
so `coevo proposals list` and the review app show them like the gate's."""

from __future__ import annotations

from typing import Any, Protocol

from coevo.errors import CoevoError
from coevo.propose.base import Candidate, Incumbent


class PeerRound(Protocol):
    """One round of a peer method. Contract: runs round r from `incumbent` (the round-start
    assets and checkpoint); stores every proposal and its decision (accepted or rejected with
    the reason) and charges every rollout and proposer call to round r under idempotency keys
    (so a resumed round redoes and charges nothing twice); returns the incumbent the round
    ends with and the candidates it accepted."""

    def __call__(self, run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]: ...


def _fst(run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    from coevo.modes.fst import fst_round

    return fst_round(run, r, incumbent)


def _bettertogether(run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    from coevo.modes.bettertogether import bettertogether_round

    return bettertogether_round(run, r, incumbent)


def _skillopt(run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    from coevo.modes.skillopt import skillopt_round

    return skillopt_round(run, r, incumbent)


PEER_ROUNDS: dict[str, PeerRound] = {"fst": _fst, "bettertogether": _bettertogether,
                                     "skillopt": _skillopt}


def peer_round(run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    """Round r of the run's peer mode (its `Mode.peer` name)."""
    name = run.mode.peer
    if name not in PEER_ROUNDS:
        raise CoevoError(f"mode: {name!r} has no round; known: {', '.join(sorted(PEER_ROUNDS))}")
    return PEER_ROUNDS[name](run, r, incumbent)
