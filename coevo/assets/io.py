"""Asset files: loading, dumping, and turning every kind of bad input into one AssetError.

File layout (what `load_seed_dir` reads and `asset_path` writes)::

    harnesses/NAME.yaml          Harness
    skills/NAME/SKILL.md         Skill (Agent Skills format: YAML front matter + Markdown body)
    rubrics/NAME.yaml            Rubric
    skill_libraries/NAME.yaml    SkillLibrary

The kind is decided by the caller (`kind=`), else by the file name (SKILL.md is a skill), else by
the parent folder. YAML files carry no `kind:` key: a file that moved folders or a key that
disagrees with its folder would be two sources of truth for one fact.

Errors: YAML syntax errors (with line and column), duplicate keys (PyYAML silently keeps the
last one, which would hide a human edit), non-mapping documents and pydantic validation errors
all become `coevo.errors.AssetError(path, dotted.field, reason)`. A pydantic error is reported
at its first location, with union tags (pydantic's `criteria.0.regex.params`) removed so the
path is the one a person sees in the file (`criteria.0.params`).

Dumped YAML is meant to be edited by hand: field order as declared, multi-line strings in block
style (`|`), no `null` lines for unset optional fields. Comments in hand-written seed files do
not survive a load/dump round trip (the content does, hash for hash).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from coevo.assets.base import ASSET_TYPES, LINEAGE_FIELDS, Asset
from coevo.checks import python_criteria_problems
from coevo.errors import AssetError

# Folder name -> kind, for YAML assets (skills are recognised by their SKILL.md file name).
FOLDER_KINDS = {"harnesses": "harness", "rubrics": "rubric", "skill_libraries": "skill_library"}
KIND_FOLDERS = {kind: folder for folder, kind in FOLDER_KINDS.items()} | {"skill": "skills"}
SKILL_FILE = "SKILL.md"


# ---------------------------------------------------------------------------------------------
# YAML in


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        if key in out:
            raise _DuplicateKey(str(key), key_node.start_mark.line + 1)
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int):
        self.key, self.line = key, line


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def parse_yaml(text: str, source: str, line_offset: int = 0) -> dict[str, Any]:
    """Parse a YAML mapping; any problem -> AssetError naming `source` (and line, key).

    `line_offset` shifts reported line numbers (front matter starts below the `---` line).
    """
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as e:
        raise AssetError(source, e.key, f"duplicate key (line {e.line + line_offset})") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1 + line_offset}, column {mark.column + 1}" if mark else ""
        problem = e.problem or e.context or "invalid YAML"
        raise AssetError(source, None, f"YAML syntax error{where}: {problem}") from None
    except yaml.YAMLError as e:  # e.g. a reader error: a control character in the text
        raise AssetError(source, None, f"YAML error: {e}") from None
    except RecursionError:  # pathologically nested flow collections
        raise AssetError(source, None, "YAML error: nesting too deep") from None
    if not isinstance(data, dict):
        got = "an empty document" if data is None else f"a {type(data).__name__}"
        raise AssetError(source, None, f"expected a mapping of fields, got {got}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise AssetError(source, str(bad[0]), "keys must be strings")
    return data


# ---------------------------------------------------------------------------------------------
# pydantic errors -> AssetError


# pattern -> what it means, for "String should match pattern '^[a-z0-9]+...'" errors. Modules
# that declare a pattern register its meaning here.
PATTERN_HINTS: dict[str, str] = {}


def _clean_msg(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def _field_path(loc: tuple, data: Any, err_type: str) -> list[str]:
    """pydantic's loc, minus the union tags and type names that do not appear in the file.

    Walks the input alongside the location: a key present in the input is kept; a string that
    is not (a discriminator tag such as 'regex', or 'function-after[...]') is dropped, unless it
    is the last element of a 'missing' error (the field the user left out).
    """
    parts: list[str] = []
    node: Any = data
    for i, el in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and el in node:
            parts.append(str(el))
            node = node[el]
        elif isinstance(node, list) and isinstance(el, int) and 0 <= el < len(node):
            parts.append(str(el))
            node = node[el]
        elif isinstance(node, dict) and last and err_type == "missing":
            parts.append(str(el))
        # else: a tag or type name pydantic inserted; not part of the file's structure
    if err_type in ("union_tag_invalid", "union_tag_not_found"):
        parts.append("kind")  # every discriminated union in coevo's assets is tagged by `kind`
    return parts


def _model_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """Best effort: the pydantic model that owns the last element of pydantic's raw `loc`
    (tags included, so a discriminated union member can be picked by its tag)."""
    current: Any = cls
    for el in loc[:-1]:
        if isinstance(el, int):
            continue  # list index: the item type was already unwrapped
        if typing.get_origin(current) in (typing.Union, types.UnionType):
            current = next((m for m in typing.get_args(current) if _tag(m) == el), None)
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(el)
        if field is None:
            return None
        current = _unwrap(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _tag(member: Any) -> Any:
    field = getattr(member, "model_fields", {}).get("kind")
    args = typing.get_args(field.annotation) if field is not None else ()
    return args[0] if len(args) == 1 else None


def _unwrap(tp: Any) -> Any:
    """list[X] -> X, X | None -> X, Annotated[X, ...] -> X; unions of models stay unions."""
    for _ in range(5):
        origin = typing.get_origin(tp)
        if origin is typing.Annotated or origin in (list, tuple, set, frozenset):
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp
    return tp


def asset_error_from_validation(
    err: ValidationError, source: str, data: Any, cls: type[BaseModel] | None = None
) -> AssetError:
    """The first error of a ValidationError (an unknown key before the rest) as
    `AssetError(source, dotted.path, reason)`."""
    errors = err.errors(include_url=False)
    # An unknown key first: a misspelt key also reports the real one as missing
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    parts = _field_path(tuple(first["loc"]), data, first["type"])
    reason = _clean_msg(first["msg"])
    if first["type"] == "extra_forbidden":
        owner = _model_at(cls, tuple(first["loc"])) if cls is not None else None
        allowed = ""
        if owner is not None:
            # a class can keep fields that are not file keys (a skill's body) out of the list
            hidden = getattr(owner, "non_file_fields", frozenset())
            allowed = " (allowed: " + ", ".join(f for f in owner.model_fields if f not in hidden) + ")"
        reason = f"unknown key{allowed}"
    elif first["type"] == "missing":
        reason = "required field is missing"
    elif first["type"] == "string_pattern_mismatch":
        pattern = (first.get("ctx") or {}).get("pattern", "")
        hint = PATTERN_HINTS.get(pattern, f"match the pattern {pattern}")
        reason = f"{first.get('input')!r} is not valid: must be {hint}"
    elif first["type"].endswith(("_type", "_parsing")):
        reason += f" (got {type(first.get('input')).__name__})"
    if len(errors) > 1:
        reason += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return AssetError(source, ".".join(parts) or None, reason)


def validate_asset(cls: type[Asset], data: dict[str, Any], source: str) -> Asset:
    """`cls.model_validate(data)` with every failure converted to AssetError."""
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise asset_error_from_validation(e, source, data, cls) from None
    except RecursionError:
        raise AssetError(source, None, "value nested too deeply") from None


# ---------------------------------------------------------------------------------------------
# YAML out


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as `|` blocks, so prompts read and diff like the text they are."""


def _represent_str(dumper: yaml.SafeDumper, value: str):
    if "\n" in value:
        # PyYAML falls back to a quoted style by itself when a block cannot hold the string
        # exactly (trailing spaces, special characters), so this never loses content.
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_BlockDumper.add_representer(str, _represent_str)


def to_yaml(data: dict[str, Any]) -> str:
    return yaml.dump(
        data, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100, indent=2
    )


def file_data(asset: Asset) -> dict[str, Any]:
    """What goes into an asset's file: all fields in declared order, unset optionals left out.

    Dropping `None` is lossless because every optional field of every asset defaults to None
    (values inside free-form JSON, e.g. a schema's `"default": null`, are kept). Sub-fields an
    asset leaves out of its hashed content at their defaults (a harness's unconstrained
    `decoding.constrain`) are left out of the file too.
    """
    data = asset.model_dump(mode="json", exclude_none=True)
    content = asset.content()
    for key in [k for k in data if k not in content and k not in LINEAGE_FIELDS]:
        data.pop(key)  # a whole block left out of the content at its default
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(content.get(key), dict):
            for sub in [k for k in value if k not in content[key]]:
                value.pop(sub)
    return data


def format_asset(asset: Asset) -> str:
    """The asset's file text (YAML, or SKILL.md for a skill): what a person or proposer edits."""
    to_markdown = getattr(asset, "to_markdown", None)
    if callable(to_markdown):
        return to_markdown()
    return to_yaml(file_data(asset))


# ---------------------------------------------------------------------------------------------
# Files


def kind_for_path(path: str | Path) -> str | None:
    p = Path(path)
    if p.name == SKILL_FILE:
        return "skill"
    return FOLDER_KINDS.get(p.parent.name)


def parse_asset(text: str, source: str, kind: str | None = None) -> Asset:
    """Build an asset from file text; `source` names it in errors and, without `kind`,
    decides the kind by the layout rule above."""
    kind = kind or kind_for_path(source)
    if kind is None:
        raise AssetError(
            source,
            None,
            "cannot tell the asset kind: put the file under harnesses/, rubrics/ or "
            "skill_libraries/, name it SKILL.md, or pass kind=",
        )
    if kind not in ASSET_TYPES:
        known = ", ".join(sorted(k for k in ASSET_TYPES if k in KIND_FOLDERS))
        raise AssetError(source, None, f"unknown asset kind {kind!r}; known: {known}")
    cls = ASSET_TYPES[kind]
    from_markdown = getattr(cls, "from_markdown", None)
    if callable(from_markdown):
        return from_markdown(text, source)
    data = parse_yaml(text, source)
    inline = getattr(cls, "inline_files", None)
    if callable(inline):  # files an asset file refers to (a harness's demo pool)
        data = inline(data, source)
    asset = validate_asset(cls, data, source)
    # Files are where a person adds a rubric: a python check it names must be registered
    # (coevo.checks). Stored versions are not re-checked on load, so audits still read them.
    problems = python_criteria_problems(asset)
    if problems:
        raise AssetError(source, *problems[0])
    return asset


def load_asset(path: str | Path, kind: str | None = None) -> Asset:
    """Read one asset file (see the layout in the module docstring)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AssetError(source, None, "no such file") from None
    except IsADirectoryError:
        raise AssetError(source, None, "is a folder, not an asset file") from None
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise AssetError(source, None, f"not UTF-8 text (line {line}, byte {e.start})") from None
    except OSError as e:
        raise AssetError(source, None, f"cannot read: {e.strerror}") from None
    return parse_asset(text, source, kind)


def asset_path(root: str | Path, asset: Asset) -> Path:
    """Where `asset` lives under a seed-style folder `root`."""
    folder = Path(root) / KIND_FOLDERS[asset.kind]
    if asset.kind == "skill":
        return folder / asset.name / SKILL_FILE
    return folder / f"{asset.name}.yaml"


def dump_asset(asset: Asset, path: str | Path) -> Path:
    """Write `asset` as its human-editable file (creating folders); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(format_asset(asset), encoding="utf-8")
    return p


def load_seed_dir(root: str | Path, library_name: str = "seed") -> list[Asset]:
    """All assets under `root`: harnesses, skills, rubrics, skill libraries (sorted by name
    within each kind), then one SkillLibrary `library_name` holding every skill found (unless
    skill_libraries/ has a file of that name).

    The library is what `coevo init` makes the incumbent's skill library; skills come before
    it so a store can insert members first. Names must be unique per kind.
    """
    root = Path(root)
    if not root.is_dir():
        raise AssetError(str(root), None, "seed folder does not exist")
    assets: list[Asset] = []
    for pattern in ("harnesses/*.yaml", "skills/*/" + SKILL_FILE, "rubrics/*.yaml",
                    "skill_libraries/*.yaml"):
        found = [load_asset(p) for p in sorted(root.glob(pattern))]
        _check_unique(found, root / pattern.split("/")[0])
        assets.extend(found)
    skills = [a for a in assets if a.kind == "skill"]
    has_file = any(a.kind == "skill_library" and a.name == library_name for a in assets)
    if skills and not has_file:
        assets.append(ASSET_TYPES["skill_library"].from_skills(library_name, skills))
    return assets


def _check_unique(assets: Iterable[Asset], where: Path) -> None:
    seen: set[str] = set()
    for a in assets:
        if a.name in seen:
            raise AssetError(str(where), "name", f"two {a.kind} files are named {a.name!r}")
        seen.add(a.name)
