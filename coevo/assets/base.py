"""What every revisable asset (harness, skill, skill library, rubric) shares.

An asset version is immutable data: a pydantic model (extra="forbid") whose identity is the
sha256 of its canonical JSON. The parent hash is lineage, not content, so it is left out of the
hash: storing the same content twice (e.g. a proposal that reverts to an ancestor) resolves to
the one existing version.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

# Fields that describe where a version came from rather than what it is.
LINEAGE_FIELDS = frozenset({"parent"})


def canonical_json(data: Any) -> str:
    """Key-sorted, whitespace-free JSON: the same content always gives the same bytes.

    >>> canonical_json({"b": 1, "a": [1, 2]})
    '{"a":[1,2],"b":1}'
    """
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def normalize_text(value: str) -> str:
    """LF line ends, no trailing whitespace on any line, no blank lines at either end.

    Free text in assets (prompts, skill bodies, demo messages) goes through this so invisible
    differences (CRLF, trailing spaces, a final blank line) do not make a new version, and the
    YAML dumper can always write the text as a `|` block (trailing spaces force quoted style).
    Indentation of the first line is kept: it can matter (code in a skill body).

    >>> normalize_text("\\n\\nUse tools.  \\r\\n  Be brief.\\t\\n\\n")
    'Use tools.\\n  Be brief.'
    """
    lines = [ln.rstrip() for ln in value.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


# The longest free text an asset field may hold unless the field sets its own, smaller limit
# (system_prompt 20,000; a skill body 50,000): a prompt or skill past this is a mistake, and
# every version is stored, hashed and sent to proposers whole.
TEXT_MAX = 100_000


def LimitedText(max_length: int, min_length: int = 0) -> Any:  # noqa: N802 (a type)
    """A str field holding free text, normalised as above, of `min_length` to `max_length`
    characters. (A `Field(max_length=...)` on an annotated type with a validator is silently
    dropped by pydantic, so the limit lives in the type.)"""
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length),
                     AfterValidator(normalize_text)]


Text = LimitedText(TEXT_MAX)


# kind -> class, filled by subclasses; the store rebuilds stored versions through it.
ASSET_TYPES: dict[str, type["Asset"]] = {}


class Asset(BaseModel):
    """Base class of versioned assets. Subclasses set `kind` and `editable_fields`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            ASSET_TYPES[cls.kind] = cls

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    kind: ClassVar[str] = "asset"
    # The fields a proposer may change (dotted paths allowed for nested ones). Everything else
    # in a proposal's diff makes the proposal invalid.
    editable_fields: ClassVar[frozenset[str]] = frozenset()

    name: str
    parent: str | None = None  # content hash of the version this one was derived from

    def content(self) -> dict[str, Any]:
        """The hashed part: everything but lineage, as JSON-compatible data."""
        return self.model_dump(mode="json", exclude=set(LINEAGE_FIELDS))

    def canonical(self) -> str:
        return canonical_json(self.content())

    @property
    def hash(self) -> str:
        # kind is part of the identity: a skill and a rubric with equal fields differ.
        return sha256_hex(f"{self.kind}\n{self.canonical()}")

    def child(self, **changes: Any) -> "Asset":
        """A new version with `changes` applied and this version as its parent (validated)."""
        data = self.model_dump(mode="python")
        data.update(changes)
        data["parent"] = self.hash
        return type(self).model_validate(data)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted-path view of nested dicts; lists stay whole (a list field diffs as one text)."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value if value.endswith("\n") or not value else value + "\n"
    if value is None:
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def field_texts(content: dict[str, Any]) -> dict[str, str]:
    """Every leaf field of an asset's content as the text its diff compares: strings as written,
    anything else (lists, numbers, booleans) as indented JSON. The reviewer's side-by-side diff
    and line blame (coevo/serve/) work on these texts, line by line.

    >>> field_texts({"system_prompt": "Be brief.", "workflow": {"max_turns": 2}})
    {'system_prompt': 'Be brief.\\n', 'workflow.max_turns': '2\\n'}
    """
    return {key: _as_text(value) for key, value in _flatten(content).items()}


def changed_fields(old: Asset | dict, new: Asset | dict) -> list[str]:
    """Dotted paths of leaf fields whose values differ (lineage excluded)."""
    a = _flatten(old.content() if isinstance(old, Asset) else old)
    b = _flatten(new.content() if isinstance(new, Asset) else new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k, _MISSING) != b.get(k, _MISSING))


_MISSING = object()


def diff(old: Asset, new: Asset, context: int = 3) -> dict[str, str]:
    """Field-level unified diff: {dotted field path: unified diff text} for each changed field."""
    a, b = _flatten(old.content()), _flatten(new.content())
    out: dict[str, str] = {}
    for key in changed_fields(old, new):
        lines = difflib.unified_diff(
            _as_text(a.get(key)).splitlines(keepends=True),
            _as_text(b.get(key)).splitlines(keepends=True),
            fromfile=f"{old.hash[:12]}:{key}",
            tofile=f"{new.hash[:12]}:{key}",
            n=context,
        )
        out[key] = "".join(lines)
    return out


def format_diff(old: Asset, new: Asset) -> str:
    """All field diffs as one text, in field order (what `coevo harness diff` prints)."""
    parts = diff(old, new)
    return "".join(parts[k] for k in sorted(parts)) or "(no changes)\n"


def is_editable(cls: type[Asset], path: str) -> bool:
    """Whether a proposer may change the field at dotted `path`: the path is an editable field
    or lies inside one (`decoding` whitelists `decoding.temperature`)."""
    return any(path == f or path.startswith(f + ".") for f in cls.editable_fields)


def forbidden_changes(old: Asset, new: Asset) -> list[str]:
    """Changed fields a proposer may not touch (empty list = the revision is admissible).

    A different kind is reported as the pseudo-field `kind`.
    """
    if old.kind != new.kind:
        return ["kind"]
    return [p for p in changed_fields(old, new) if not is_editable(type(old), p)]
