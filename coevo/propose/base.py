"""Proposers: the extension point that suggests revisions of the incumbent's assets.

A proposer sees the incumbent (harness, skill library + skills, rubric, checkpoint) and the
round's trajectories, and returns `Candidate`s: each a new version of ONE asset whose parent is
the incumbent's version of that kind. The loop validates every candidate (`check_candidate`)
before it is stored: a candidate that touches a field outside its kind's whitelist
(`coevo.assets.base.forbidden_changes`), changes nothing, has the wrong parent, lowers the
verified outcome's share of a rubric's reward (`Rubric.outcome_share`), or failed to
build (a proposer that could not produce a valid asset returns `Candidate(asset=None,
error=...)`) becomes an `invalid` proposal with its reason: stored, never gated, never a crash.

Proposers are looked up by name in `PROPOSERS` (`make_proposer(name, **options)`); an unknown
name fails with the list of known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from coevo.assets.base import Asset, changed_fields, forbidden_changes
from coevo.assets.harness import Harness
from coevo.assets.rubric import Rubric
from coevo.assets.skill import Skill, SkillLibrary
from coevo.blocks import merge_blocks
from coevo.checks import python_criteria_problems
from coevo.envs.base import Feedback
from coevo.errors import CoevoError
from coevo.executors import AgentAssets
from coevo.registry import Registry, UnknownName
from coevo.trajectory import Trajectory

REVISABLE_KINDS = ("harness", "skill_library", "rubric")


class Incumbent(BaseModel):
    """The accepted state a round starts from: asset versions + the model checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    harness: Harness
    library: SkillLibrary | None = None
    skills: list[Skill] = Field(default_factory=list)
    rubric: Rubric | None = None
    checkpoint: str | None = None  # store checkpoint id (None: the base model)

    def asset(self, kind: str) -> Asset | None:
        return {"harness": self.harness, "skill_library": self.library,
                "rubric": self.rubric}.get(kind)

    def agent_assets(self) -> AgentAssets:
        return AgentAssets(harness=self.harness, rubric=self.rubric, library=self.library,
                           skills=list(self.skills))

    def with_candidate(self, cand: "Candidate") -> "Incumbent":
        """The incumbent with `cand`'s asset in place of its kind (`incumbent.with(cand)`)."""
        a = cand.asset
        if a is None:
            raise CoevoError(f"proposal by {cand.proposer}: an invalid candidate cannot be applied")
        if a.kind == "harness":
            return self.model_copy(update={"harness": a})
        if a.kind == "rubric":
            return self.model_copy(update={"rubric": a})
        by_hash = {s.hash: s for s in [*self.skills, *cand.skills]}
        members = [by_hash[r.hash] for r in a.skills if r.hash in by_hash]  # type: ignore[attr-defined]
        return self.model_copy(update={"library": a, "skills": members})

    def with_checkpoint(self, checkpoint: str | None) -> "Incumbent":
        return self.model_copy(update={"checkpoint": checkpoint})

    def hashes(self) -> dict[str, str | None]:
        return {"harness": self.harness.hash,
                "skill_library": self.library.hash if self.library else None,
                "rubric": self.rubric.hash if self.rubric else None,
                "checkpoint": self.checkpoint}


class Candidate(BaseModel):
    """One proposed revision. `asset` is the new version (its `parent` the incumbent's hash of
    that kind); None when the proposer failed to build one (then `error` says why). `skills`
    carries new member skills a skill-library candidate refers to. `prompt` / `raw_output` are
    an LLM proposer's exchange, kept for audit."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    asset: Asset | None
    proposer: str
    kind: str
    rationale: str = ""
    predicted_effect: str = ""
    prompt: str = ""
    raw_output: str = ""
    error: str | None = None
    skills: list[Skill] = Field(default_factory=list)
    model: str = ""  # the proposer's model, for LLM proposers
    # The typed edit operations that built the asset (the `edits` proposer: kind + slots, and
    # what a skipped one would have done), stored with the proposal for audit.
    edits: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def hash(self) -> str | None:
        return self.asset.hash if self.asset is not None else None


class ProposalContext(BaseModel):
    """What a proposer sees. `trajectories` are the round's (train) trajectories;
    `harnesses` maps the harness hashes they name to the versions, so a proposer can strip
    what the harness put into a transcript (system message, demos). `imported` are a team's
    own production traces of the run's environment (coevo/traces.py): extra evidence, from
    another harness and model, never scored by coevo. `feedback` maps a failed train
    trajectory's id to the verifier's diagnosis (coevo/propose/feedback.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    run: str
    round: int
    incumbent: Incumbent
    trajectories: list[Trajectory] = Field(default_factory=list)
    imported: list[Trajectory] = Field(default_factory=list)
    harnesses: dict[str, Harness] = Field(default_factory=dict)
    feedback: dict[str, Feedback] = Field(default_factory=dict)
    seed: int = 0


@runtime_checkable
class Proposer(Protocol):
    """Contract: `propose(ctx)` returns zero or more candidates, each revising ONE asset of
    `ctx.incumbent` with that asset as parent. It must not raise for a bad idea: a candidate
    it cannot build is returned with `asset=None, error=...` (stored as invalid). It never
    sees validation or test data; it may read only `ctx`. `name` is recorded on each proposal."""

    name: str

    def propose(self, ctx: ProposalContext) -> list[Candidate]: ...


PROPOSERS: Registry[Callable[..., Proposer]] = Registry("proposer")


def make_proposer(name: str, /, **options: Any) -> Proposer:
    """Build a registered proposer; bad options are a CoevoError naming the proposer."""
    import coevo.propose  # noqa: F401  (registers the built-in proposers)

    try:
        factory = PROPOSERS.get(name)
    except UnknownName as e:
        raise CoevoError(f"proposers: {e}") from None
    try:
        return factory(**options)
    except (TypeError, ValueError) as e:
        raise CoevoError(f"proposers: {name}: bad options {sorted(options)}: {e}") from None


def check_candidate(cand: Candidate, incumbent: Incumbent) -> str | None:
    """Why `cand` may not be gated (None: it is admissible)."""
    if cand.asset is None:
        return cand.error or "the proposer returned no asset"
    if cand.kind != cand.asset.kind:
        return f"declared kind {cand.kind!r} but the asset is a {cand.asset.kind!r}"
    if cand.kind not in REVISABLE_KINDS:
        return f"kind {cand.kind!r} is not revisable; expected one of {', '.join(REVISABLE_KINDS)}"
    old = incumbent.asset(cand.kind)
    if old is None:
        return f"the incumbent has no {cand.kind} to revise"
    if cand.asset.parent != old.hash:
        got = cand.asset.parent[:12] if cand.asset.parent else None
        return f"parent {got} is not the incumbent {cand.kind} {old.hash[:12]}"
    bad = forbidden_changes(old, cand.asset)
    if bad:
        return f"changes fields outside the {cand.kind} whitelist: {', '.join(bad)}"
    if not changed_fields(old, cand.asset):
        return "changes nothing (same content as the incumbent)"
    if cand.kind == "harness":
        bad_tools = tool_contract_changes(old, cand.asset)  # type: ignore[arg-type]
        if bad_tools:
            return bad_tools
    if cand.kind == "rubric":
        # A python criterion is code coevo calls: a proposal may pick a registered check,
        # never name a new callable (`builtins:print` with kwargs of its choosing ran).
        problems = python_criteria_problems(cand.asset)
        if problems:
            return "{}: {}".format(*problems[0])
        before, after = old.outcome_share(), cand.asset.outcome_share()  # type: ignore[attr-defined]
        if after < before - 1e-9:
            return (f"lowers the verified outcome's share of the reward from {before:.3f} to "
                    f"{after:.3f} (outcome_weight and outcome criteria): the outcome must "
                    "keep dominating what the policy is trained on")
    return member_violations(cand, incumbent)


def member_violations(cand: Candidate, incumbent: Incumbent) -> str | None:
    """Why a skill-library candidate's member skills are not admissible (None: they are).

    A carried skill whose name is an incumbent member must be a child of that member's version
    changing only `Skill.editable_fields`; any member reference whose version is not in the
    incumbent must be carried (hidden and retired ones too: the store needs every member)."""
    if cand.kind != "skill_library" or not isinstance(cand.asset, SkillLibrary):
        return None
    old = {s.name: s for s in incumbent.skills}
    for s in cand.skills:
        prev = old.get(s.name)
        if prev is None or prev.hash == s.hash:
            continue
        if s.parent != prev.hash:
            return f"skill {s.name!r}: parent is not the incumbent version {prev.hash[:12]}"
        bad = forbidden_changes(prev, s)
        if bad:
            return f"skill {s.name!r} changes fields outside the skill whitelist: {', '.join(bad)}"
    have = {s.hash for s in [*incumbent.skills, *cand.skills]}
    missing = [r.name for r in cand.asset.skills if r.hash not in have]
    if missing:
        return f"library refers to skills it does not carry: {', '.join(missing)}"
    return None


def tool_contract_changes(old: Harness, new: Harness) -> str | None:
    """`tools` is whitelisted for its descriptions only: a tool's name and parameter schema
    are a contract with the code that runs it (coevo.agent.tools), and its `sandbox` is a
    safety setting only a person may choose (`none` runs model-written code unisolated), so
    a proposal may reword a description but not add, remove, rename, re-type or unsandbox a
    tool."""
    def contract(h: Harness) -> list[tuple[str, str, str]]:
        import json

        return [(t.function.name, json.dumps(t.function.parameters, sort_keys=True), t.sandbox)
                for t in h.tools]

    before, after = contract(old), contract(new)
    if before == after:
        return None
    names_b, names_a = [c[0] for c in before], [c[0] for c in after]
    if names_b != names_a:
        return (f"tools: only descriptions may change; tool names {names_b} became {names_a}")
    for (name, schema_b, sandbox_b), (_, schema_a, sandbox_a) in zip(before, after):
        if sandbox_b != sandbox_a:
            return (f"tools: only descriptions may change; the sandbox of {name} changed "
                    f"({sandbox_b} -> {sandbox_a})")
    changed = [b[0] for b, a in zip(before, after) if b[1] != a[1]]
    return f"tools: only descriptions may change; the parameter schema of {', '.join(changed)} changed"


def candidate_from_changes(proposer: str, base: Asset, changes: dict[str, Any],
                           **fields: Any) -> Candidate:
    """A child of `base` with `changes` deep-merged into its fields; a validation failure
    becomes an invalid candidate (the reason names the field), never an exception."""
    from pydantic import ValidationError

    # Blocks merge key by key (so `decoding: {temperature: 0.2}` keeps the other knobs);
    # anything else replaces.
    data = merge_blocks(base.model_dump(mode="json"), changes)
    data["parent"] = base.hash
    try:
        asset = type(base).model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        return Candidate(asset=None, proposer=proposer, kind=base.kind,
                         error=f"{base.kind}.{where}: {err['msg']}", **fields)
    return Candidate(asset=asset, proposer=proposer, kind=base.kind, **fields)


def dedupe(cands: Sequence[Candidate]) -> list[Candidate]:
    """Keep the first of candidates with the same (kind, hash); later copies become invalid
    (recorded, so the audit shows the proposer repeated itself)."""
    seen: dict[tuple[str, str], str] = {}
    out = []
    for c in cands:
        if c.hash is not None:
            key = (c.kind, c.hash)
            if key in seen:
                c = c.model_copy(update={"asset": None, "error": f"duplicate of a candidate by {seen[key]}"})
            else:
                seen[key] = c.proposer
        out.append(c)
    return out


def stored_candidate(store: Any, p: Any) -> Candidate:
    """The Candidate of a stored proposal record `p` (its asset, or a skill library with its
    member skills, read back from `store`; an invalid one has none)."""
    if p.candidate is None:
        return Candidate(asset=None, proposer=p.proposer, kind=p.kind, error=p.error,
                         edits=p.edits)
    asset, skills = (store.get_library(p.candidate) if p.kind == "skill_library"
                     else (store.get_asset(p.kind, p.candidate), []))
    return Candidate(asset=asset, proposer=p.proposer, kind=p.kind, rationale=p.rationale,
                     predicted_effect=p.predicted_effect, skills=skills, edits=p.edits)
