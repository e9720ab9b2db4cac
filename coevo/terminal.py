"""Text that a model (or anyone but coevo) wrote, made safe to print on a terminal.

Proposal rationales, raw outputs, errors quoting them, asset diffs, gate reasons and task ids
reach the terminal through rich, where such text could act instead of being shown:

- control characters: ESC starts terminal sequences (`\\x1b[2J` clears the screen, OSC 8 hides
  a link behind innocent text, OSC 52 writes the clipboard); CR and backspace overwrite what
  was printed; C1 controls (U+0080-U+009F, e.g. U+009B, a one-byte CSI) do the same on some
  terminals; bidirectional overrides (U+202A-U+202E, U+2066-U+2069) reorder what is shown.
- rich markup: a string printed with markup on turns `[bold red]` or `[link=...]` into styles.

`safe` shows each such character as a visible escape (`\\x1b`, `\\u202e`), keeping newline and
tab; `plain` makes a rich `Text` of it (never parsed as markup); `escaped` also escapes markup,
for model text inside an f-string that is printed with markup on; `safe_json` writes JSON in
which each such character is a `\\u` escape (the same document, inert on a terminal).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rich.markup import escape
from rich.text import Text

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: Any) -> str:
    """`text` with terminal control characters shown as escapes (newline and tab kept).

    >>> safe("ok\\x1b[2J\\tdone\\u202e")
    'ok\\\\x1b[2J\\tdone\\\\u202e'
    """
    return _UNSAFE.sub(_visible, str(text))


def plain(text: Any, style: str = "") -> Text:
    """A rich Text of `safe(text)`: shown as written, never interpreted as markup."""
    return Text(safe(text), style=style)


def escaped(text: Any) -> str:
    """`safe(text)` with rich markup escaped, for an f-string printed with markup on.

    >>> escaped("[bold red]x\\x07")
    '\\\\[bold red]x\\\\x07'
    """
    return escape(safe(text))


def safe_json(data: Any) -> str:
    """`data` as indented JSON, UTF-8 kept, every character `safe` escapes as a `\\u` escape
    (json.dumps already escapes C0 controls; DEL, C1 and bidi controls it leaves raw).

    >>> print(safe_json({"a": "x\\x1b\\x9b\\u202e\\u00e9"}))
    {
      "a": "x\\u001b\\u009b\\u202e\u00e9"
    }
    """
    text = json.dumps(data, ensure_ascii=False, indent=2)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
