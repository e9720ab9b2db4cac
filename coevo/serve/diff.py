"""Side-by-side diffs of asset versions, per field, line by line, for the proposal page.

Rows come from difflib's opcodes over `field_texts` (the texts the gate's unified diff is made
of). A replaced block pairs its old and new lines row by row; the longer side's extra lines
get an empty cell opposite. An invalid proposal has no stored candidate version, only the
unified diff it was recorded with; `rows_from_unified` turns that into the same rows.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from coevo.assets.base import field_texts


@dataclass(frozen=True)
class Row:
    tag: str  # equal | delete | insert | replace | skip (elided unchanged lines)
    left_no: int | None
    left: str
    right_no: int | None
    right: str


@dataclass(frozen=True)
class FieldDiff:
    field: str
    rows: list[Row]
    added: int
    removed: int


def side_by_side(old: str, new: str, context: int | None = None) -> list[Row]:
    """Rows pairing `old` and `new` line by line. With `context`, runs of unchanged lines
    longer than 2 * context are cut to `context` lines either side of a change (a skip row).

    >>> [(r.tag, r.left, r.right) for r in side_by_side("a\\nb\\n", "a\\nc\\n")]
    [('equal', 'a', 'a'), ('replace', 'b', 'c')]
    """
    a, b = old.splitlines(), new.splitlines()
    rows: list[Row] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        n = max(i2 - i1, j2 - j1)
        for k in range(n):
            li, rj = i1 + k, j1 + k
            left = a[li] if li < i2 else None
            right = b[rj] if rj < j2 else None
            rows.append(Row(tag if tag == "equal" or (left is not None and right is not None)
                            else ("delete" if right is None else "insert"),
                            li + 1 if left is not None else None, left or "",
                            rj + 1 if right is not None else None, right or ""))
    return _elide(rows, context) if context is not None else rows


def _elide(rows: list[Row], context: int) -> list[Row]:
    out: list[Row] = []
    i = 0
    while i < len(rows):
        if rows[i].tag != "equal":
            out.append(rows[i])
            i += 1
            continue
        j = i
        while j < len(rows) and rows[j].tag == "equal":
            j += 1
        run = rows[i:j]
        keep_head = context if i > 0 else 0
        keep_tail = context if j < len(rows) else 0
        if len(run) > keep_head + keep_tail + 1:
            out.extend(run[:keep_head])
            out.append(Row("skip", None, f"{len(run) - keep_head - keep_tail} unchanged lines",
                           None, ""))
            out.extend(run[len(run) - keep_tail:] if keep_tail else [])
        else:
            out.extend(run)
        i = j
    return out


def field_diffs(old: dict[str, Any] | None, new: dict[str, Any] | None,
                context: int | None = 3) -> list[FieldDiff]:
    """Per changed field (sorted by name) of two asset contents; a missing side is empty."""
    a = field_texts(old) if old is not None else {}
    b = field_texts(new) if new is not None else {}
    out = []
    for f in sorted(a.keys() | b.keys()):
        if a.get(f) == b.get(f):
            continue
        rows = side_by_side(a.get(f, ""), b.get(f, ""), context)
        out.append(FieldDiff(f, rows, sum(r.right_no is not None and r.tag != "equal" for r in rows),
                             sum(r.left_no is not None and r.tag != "equal" for r in rows)))
    return out


def rows_from_unified(text: str) -> list[Row]:
    """Side-by-side rows of a stored unified diff (an invalid proposal's): hunk headers become
    skip rows; a run of '-' lines followed by '+' lines pairs up like a replace."""
    rows: list[Row] = []
    left_no = right_no = 0
    minus: list[str] = []
    plus: list[str] = []

    def flush() -> None:
        nonlocal left_no, right_no
        for k in range(max(len(minus), len(plus))):
            lt = minus[k] if k < len(minus) else None
            rt = plus[k] if k < len(plus) else None
            if lt is not None:
                left_no += 1
            if rt is not None:
                right_no += 1
            tag = "replace" if lt is not None and rt is not None else ("delete" if rt is None else "insert")
            rows.append(Row(tag, left_no if lt is not None else None, lt or "",
                            right_no if rt is not None else None, rt or ""))
        minus.clear()
        plus.clear()

    for line in text.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            flush()
            nums = [p for p in line.split() if p[:1] in "-+" and p[1:2].isdigit()]
            if len(nums) >= 2:
                left_no = int(nums[0][1:].split(",")[0]) - 1
                right_no = int(nums[1][1:].split(",")[0]) - 1
            rows.append(Row("skip", None, line, None, ""))
        elif line.startswith("-"):
            if plus:
                flush()
            minus.append(line[1:])
        elif line.startswith("+"):
            plus.append(line[1:])
        else:
            flush()
            left_no += 1
            right_no += 1
            rows.append(Row("equal", left_no, line[1:], right_no, line[1:]))
    flush()
    return rows
