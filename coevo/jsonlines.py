"""JSONL files a team brings (task files, production traces): one JSON object per line, each
validated into a pydantic model, every problem one AssetError `FILE:LINE: field: reason`.

Blank lines are skipped (a trailing newline, a spacer); line numbers are the file's own, so an
error points at the line an editor shows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from coevo.assets.io import asset_error_from_validation
from coevo.errors import AssetError

M = TypeVar("M", bound=BaseModel)


def read_objects(path: str | Path, noun: str) -> list[tuple[str, dict[str, Any]]]:
    """(`FILE:LINE`, the line's object) for every non-blank line; `noun` names what a line
    holds, for the error of a file without any."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AssetError(source, None, f"no such {noun} file") from None
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise AssetError(f"{source}:{line}", None, "not UTF-8 text") from None
    except OSError as e:
        raise AssetError(source, None, f"cannot read: {e.strerror}") from None
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise AssetError(where, None, f"invalid JSON at column {e.colno}: {e.msg}") from None
        if not isinstance(data, dict):
            raise AssetError(where, None, f"expected a JSON object, got {type(data).__name__}")
        out.append((where, data))
    if not out:
        raise AssetError(source, None, f"no {noun}s (the file has no non-blank line)")
    return out


def validate_line(cls: type[M], data: dict[str, Any], where: str) -> M:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise asset_error_from_validation(e, where, data, cls) from None


def check_unique_ids(ids: Sequence[tuple[str, str]]) -> None:
    """`ids` as (`FILE:LINE`, id) in file order: a repeated id names both lines."""
    first: dict[str, str] = {}
    for where, id_ in ids:
        if id_ in first:
            line = first[id_].rsplit(":", 1)[-1]
            raise AssetError(where, "id", f"{id_!r} is already the id of line {line}")
        first[id_] = where
