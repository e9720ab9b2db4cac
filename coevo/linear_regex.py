"""Regexes that proposals may write, matched in linear time: RE2 (PyPI `google-re2`).

A pattern in a field a proposer can edit (a rubric's `regex` criterion, a harness's
`answer_extraction`) runs on model output inside coevo, in every episode and in the gate.
Python's `re` backtracks: `^(a|a)*$` takes 1.7 s on 24 characters and doubles with each
character more. RE2 compiles a pattern to an automaton and matches in time linear in the text,
so no pattern can stall an episode.

What RE2 does not do, so a pattern using it is refused where the asset is validated, with the
field named: backreferences (`\\1`), lookaround (`(?=`, `(?<!`), possessive and atomic groups,
the verbose flag. Python's end-of-string `\\Z` is RE2's `\\z` and is translated (the seed
rubrics use it). Differences that stay: `\\w`, `\\d`, `\\s` and `\\b` are ASCII-only, and `$`
without the `m` flag matches only at the very end (Python's also before a final newline).
"""

from __future__ import annotations

import functools
from typing import Any

import re2

Pattern = Any  # re2's compiled pattern type (re2._Regexp) is private


def to_re2(pattern: str) -> str:
    """`pattern` with Python-only spellings that RE2 has under another name rewritten
    (`\\Z` -> `\\z`); escaped backslashes are left alone.

    >>> to_re2(r"answer\\s*\\Z"), to_re2(r"a\\\\Z")
    ('answer\\\\s*\\\\z', 'a\\\\\\\\Z')
    """
    out, i = [], 0
    while i < len(pattern):
        pair = pattern[i:i + 2]
        if pair.startswith("\\") and len(pair) == 2:
            out.append("\\z" if pair == "\\Z" else pair)
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str, ignore_case: bool = False) -> Pattern:
    """The RE2 pattern; ValueError with RE2's reason when it cannot be compiled.

    >>> compile_pattern(r"Answer:\\s*(\\d+)").search("Answer: 42").group(1)
    '42'
    >>> compile_pattern(r"(a)\\1")
    Traceback (most recent call last):
    ...
    ValueError: RE2 cannot compile it: invalid escape sequence: \\1 (no backreferences or lookaround)
    """
    options = re2.Options()
    options.log_errors = False  # RE2 would print every rejected pattern to stderr
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(to_re2(pattern), options=options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise ValueError(f"RE2 cannot compile it: {why} (no backreferences or lookaround)") from None


def search(pattern: str, text: str, ignore_case: bool = False) -> bool:
    """Whether `pattern` occurs in `text`, in linear time.

    >>> search(r"^(a|a)*$", "a" * 5000 + "b")
    False
    """
    return compile_pattern(pattern, ignore_case).search(text) is not None
