"""Proposers of harness / skill / rubric revisions (registry `PROPOSERS`).

Importing the package registers the built-in proposers: `demos` (bootstrapped few-shot, no
LLM), `scripted` (replays hand-written candidates) and the LLM proposers `harness` (VACE
harness revision), `skills` (ARISE skill distillation, refinement and lifecycle), `rubrics`
(ARISE rubric evolution, gated on predictive validity), `gepa` (the gepa package's
reflective search), `edits` (typed edit operations chosen under a per-round grammar) and
`knobs` (a declared sweep over the harness's knobs, no LLM, but it shares the `harness`
proposer's whitelist). These are registered as factories that import their module on first
use: they pull in DSPy (and litellm), a few seconds that commands which never
propose (`coevo harness list`, `coevo eval`) should not pay.
"""

from importlib import import_module
from typing import Any

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


def _lazy(module: str, cls: str):
    def factory(**options: Any) -> Proposer:
        return getattr(import_module(f"coevo.propose.{module}"), cls)(**options)

    factory.__name__ = factory.__qualname__ = cls
    return factory


for _name, _module, _cls in (("harness", "harness", "HarnessProposer"),
                             ("skills", "skills", "SkillsProposer"),
                             ("rubrics", "rubrics", "RubricsProposer"),
                             ("gepa", "gepa", "GepaProposer"),
                             ("edits", "edits", "EditsProposer"),
                             ("knobs", "knobs", "KnobsProposer")):
    PROPOSERS.add(_name, _lazy(_module, _cls))

__all__ = ["PROPOSERS", "Candidate", "Incumbent", "ProposalContext", "Proposer",
           "check_candidate", "make_proposer"]
