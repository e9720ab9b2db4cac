"""Proposers of harness / skill / rubric revisions (registry `PROPOSERS`).

Importing the package registers the built-in proposers: `demos` (bootstrapped few-shot, no
LLM) and `scripted` (replays hand-written candidates).
"""

from coevo.propose.base import (
    PROPOSERS,
    Candidate,
    Incumbent,
    ProposalContext,
    Proposer,
    check_candidate,
    make_proposer,
)
from coevo.propose import demos as _demos  # noqa: F401  (registers "demos")
from coevo.propose import scripted as _scripted  # noqa: F401  (registers "scripted")
from coevo.propose import skills as _skills  # noqa: F401  (registers "skills")
from coevo.propose import rubrics as _rubrics  # noqa: F401  (registers "rubrics")
from coevo.propose import gepa as _gepa  # noqa: F401  (registers "gepa")

__all__ = ["PROPOSERS", "Candidate", "Incumbent", "ProposalContext", "Proposer",
           "check_candidate", "make_proposer"]
