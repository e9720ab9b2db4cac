"""Skills in the Agent Skills format, and the skill library (a versioned set of skills).

A skill is a folder `skills/NAME/` holding `SKILL.md`: YAML front matter + a Markdown body
(https://agentskills.io/specification). From the specification: `name` (lowercase letters,
digits and single hyphens, at most 64 characters, equal to the folder name), `description`
(non-empty, at most 1024 characters), optional `license`, `compatibility` (at most 500) and
`metadata` (a string -> string map).

Departures: coevo keeps its own lifecycle fields as top-level front-matter keys, `state`
(active | hidden | retired) and `targets` (the rubric criterion ids the skill aims to improve),
plus `parent` (lineage) when the skill was derived from another version. The spec's reference
validator (`skills-ref validate`) rejects unknown top-level keys, so a strict external Agent
Skills client would need these moved under `metadata`. `allowed-tools` (experimental in the
spec) is not supported: harness tools are granted by the harness, not by skills.

Progressive disclosure (the spec's name+description first, body on activation) is done by the
runtime: it ranks skills by name+description and renders the bodies of the ones it activates.

A `SkillLibrary` stores member references (name, content hash, state), sorted by name, so the
library's hash does not depend on the order skills were added, and a changed skill (new hash)
is a new library version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from coevo.assets.base import Asset, LimitedText, Text
from coevo.assets.harness import ASSET_NAME
from coevo.assets.io import PATTERN_HINTS, SKILL_FILE, parse_yaml, to_yaml, validate_asset
from coevo.assets.rubric import CRITERION_ID  # what `targets` refer to
from coevo.errors import AssetError, NotFound

# Agent Skills name rule: lowercase alphanumerics separated by single hyphens.
SKILL_NAME = r"^[a-z0-9]+(?:-[a-z0-9]+)*$"
SkillState = Literal["active", "hidden", "retired"]
PATTERN_HINTS[SKILL_NAME] = "lowercase letters, digits and single hyphens, not starting or ending with a hyphen"
_FENCE = re.compile(r"^---[ \t]*$", re.MULTILINE)


class Skill(Asset):
    kind = "skill"
    # name is the skill's identity (and its folder); license/compatibility/metadata are
    # authorship facts, not behaviour a proposer should rewrite.
    editable_fields = frozenset({"description", "body", "state", "targets"})
    non_file_fields: ClassVar[frozenset[str]] = frozenset({"body"})  # the body is the Markdown

    name: str = Field(min_length=1, max_length=64, pattern=SKILL_NAME)
    description: Text
    license: str | None = None
    compatibility: str | None = Field(None, max_length=500)
    metadata: dict[str, str] | None = None
    state: SkillState = "active"
    targets: list[str] = Field(default_factory=list)
    body: LimitedText(50_000) = ""  # the SKILL.md text after the front matter

    @field_validator("description")
    @classmethod
    def _description_size(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty")
        if len(v) > 1024:
            raise ValueError(f"has {len(v)} characters; at most 1024 are allowed")
        return v

    @field_validator("targets")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        for t in v:
            if not re.match(CRITERION_ID, t):
                raise ValueError(f"{t!r} is not a criterion id (lowercase slug)")
        if len(set(v)) != len(v):
            raise ValueError("lists a criterion twice")
        return sorted(v)  # a set: order must not change the hash

    # -- Markdown -------------------------------------------------------------------------

    @classmethod
    def from_markdown(cls, text: str, source: str = SKILL_FILE) -> "Skill":
        """Parse SKILL.md text. `source` names the file in errors; when it is a path ending in
        SKILL.md, the skill's name must equal its folder's name (the spec's rule)."""
        text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
        first, _, rest = text.partition("\n")
        if first.rstrip() != "---":
            raise AssetError(source, None, "SKILL.md must start with a '---' line (YAML front matter)")
        close = _FENCE.search(rest)
        if close is None:
            raise AssetError(source, None, "front matter is not closed by a '---' line")
        front = parse_yaml(rest[: close.start()], source, line_offset=1)
        if "body" in front:
            raise AssetError(source, "body", "unknown key: the body is the Markdown after the front matter")
        skill = validate_asset(cls, {**front, "body": rest[close.end() :]}, source)
        path = Path(source)
        if path.name == SKILL_FILE and path.parent.name and path.parent.name != skill.name:
            raise AssetError(
                source, "name", f"{skill.name!r} must equal its folder name {path.parent.name!r}"
            )
        return skill  # type: ignore[return-value]

    def front_matter(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude_none=True, exclude={"body"})
        if not data.get("targets"):
            data.pop("targets", None)  # an empty list is the default: keep the file short
        return data

    def to_markdown(self) -> str:
        """SKILL.md text; `Skill.from_markdown(s.to_markdown())` has the same hash as `s`."""
        head = "---\n" + to_yaml(self.front_matter()) + "---\n"
        return head + ("\n" + self.body + "\n" if self.body else "")

    def render(self) -> str:
        """How an activated skill appears in the system message."""
        text = f"## Skill: {self.name}\n{self.description}"
        return text + ("\n\n" + self.body if self.body else "")


class SkillRef(BaseModel):
    """A library member: which skill, which version of it, and its lifecycle state."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=64, pattern=SKILL_NAME)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    state: SkillState = "active"

    @classmethod
    def of(cls, skill: Skill) -> "SkillRef":
        return cls(name=skill.name, hash=skill.hash, state=skill.state)


class SkillLibrary(Asset):
    kind = "skill_library"
    editable_fields = frozenset({"skills"})

    name: str = Field(min_length=1, max_length=64, pattern=ASSET_NAME)
    skills: list[SkillRef] = Field(default_factory=list)

    @field_validator("skills")
    @classmethod
    def _sorted_unique(cls, v: list[SkillRef]) -> list[SkillRef]:
        names = [r.name for r in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"skill {dup[0]!r} appears twice; a library holds one version per name")
        return sorted(v, key=lambda r: r.name)

    @classmethod
    def from_skills(cls, name: str, skills: Iterable[Skill], parent: str | None = None) -> "SkillLibrary":
        return cls(name=name, skills=[SkillRef.of(s) for s in skills], parent=parent)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.skills]

    def active(self) -> list[SkillRef]:
        """Members the runtime may activate (hidden and retired skills are kept for lineage and
        possible revival, but never shown to the agent)."""
        return [r for r in self.skills if r.state == "active"]

    def with_skill(self, skill: Skill) -> "SkillLibrary":
        """A child version with `skill` added, or replacing the member of the same name."""
        refs = [r for r in self.skills if r.name != skill.name] + [SkillRef.of(skill)]
        return self.child(skills=refs)  # type: ignore[return-value]

    def without(self, name: str) -> "SkillLibrary":
        """A child version without the skill `name` (NotFound if it is not a member)."""
        if name not in self.names:
            raise NotFound(f"skill {name!r} is not in library {self.name!r}; members: {', '.join(self.names) or '(none)'}")
        return self.child(skills=[r for r in self.skills if r.name != name])  # type: ignore[return-value]

    def resolve(self, skills: Iterable[Skill], only_active: bool = True) -> list[Skill]:
        """The member Skill objects, in library order, picked from `skills` by content hash.

        Raises NotFound naming the first member whose exact version is not among `skills`:
        running with a different version of a skill than the library records would make the
        trajectory's recorded skill-library hash a lie.
        """
        by_hash = {s.hash: s for s in skills}
        refs = self.active() if only_active else self.skills
        out = []
        for ref in refs:
            if ref.hash not in by_hash:
                raise NotFound(f"library {self.name!r} needs skill {ref.name!r} version {ref.hash[:12]}")
            skill = by_hash[ref.hash]
            if skill.state != ref.state:  # same hash, so only a hand-edited library gets here
                raise NotFound(f"library {self.name!r} records {ref.name!r} as {ref.state}, the skill says {skill.state}")
            out.append(skill)
        return out
