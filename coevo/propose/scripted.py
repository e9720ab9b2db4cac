"""The `scripted` proposer: replays candidates written in the run config or in asset files.

For tests, and for a reviewer who wants a hand-written revision judged by the same gate as a
machine proposal. Each entry is either `changes` (fields deep-merged into the incumbent's
version of `kind`: `{kind: harness, changes: {decoding: {temperature: 0.2}}}`) or `file` (an
asset file, as `coevo harness export` writes it, re-parented onto the incumbent). An entry
fires in the round it names (`round`, default 0; null = every round). A file that does not
parse, or changes that fail validation, become invalid candidates with the reason.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coevo.errors import CoevoError
from coevo.propose.base import (
    PROPOSERS,
    REVISABLE_KINDS,
    Candidate,
    ProposalContext,
    candidate_from_changes,
)


class ScriptedEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str = "harness"
    changes: dict[str, Any] | None = None
    file: str | None = None
    round: int | None = 0
    rationale: str = "hand-written revision"
    predicted_effect: str = ""


class ScriptedProposer:
    name = "scripted"

    def __init__(self, candidates: list[dict[str, Any]] | None = None, name: str = "scripted"):
        self.name = name
        try:
            self.entries = [ScriptedEntry.model_validate(c) for c in candidates or []]
        except ValueError as e:
            raise CoevoError(f"proposers: scripted: candidates: {e}") from None
        for i, e in enumerate(self.entries):
            if (e.changes is None) == (e.file is None):
                raise CoevoError(f"proposers: scripted: candidates.{i}: give exactly one of "
                                 "`changes` or `file`")

    def propose(self, ctx: ProposalContext) -> list[Candidate]:
        return [self._one(e, ctx) for e in self.entries if e.round is None or e.round == ctx.round]

    def _one(self, e: ScriptedEntry, ctx: ProposalContext) -> Candidate:
        fields = dict(rationale=e.rationale, predicted_effect=e.predicted_effect)
        base = ctx.incumbent.asset(e.kind) if e.kind in REVISABLE_KINDS else None
        if base is None:
            return Candidate(asset=None, proposer=self.name, kind=e.kind, **fields,
                             error=f"the incumbent has no {e.kind} to revise")
        if e.changes is not None:
            return candidate_from_changes(self.name, base, e.changes, **fields)
        from coevo.assets.io import load_asset

        try:
            asset = load_asset(e.file, kind=e.kind)
        except CoevoError as exc:
            return Candidate(asset=None, proposer=self.name, kind=e.kind, error=str(exc), **fields)
        # The file is a full version; only its content counts, lineage comes from the incumbent.
        content = asset.model_dump(mode="json", exclude={"parent"})
        return candidate_from_changes(self.name, base, content, raw_output=asset.canonical(),
                                      **fields)


PROPOSERS.add("scripted", ScriptedProposer)
