"""Proposal-editable regexes: Python's backtracking `re` vs RE2 (coevo/linear_regex.py) on the
catastrophic pattern `^(a|a)*$` against "a" * n + "b" (no match: the worst case).

    python bench/regex_speed.py [--re-up-to 22] [--re2-n 5000 100000 1000000]

Prints seconds per search: `re` doubles with each character, RE2 grows linearly with n.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coevo.linear_regex import compile_pattern  # noqa: E402

PATTERN = r"^(a|a)*$"


def seconds(search, text: str) -> float:
    t0 = time.perf_counter()
    assert search(text) is None
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--re-up-to", type=int, default=22, help="longest input for `re` (chars)")
    ap.add_argument("--re2-n", type=int, nargs="+", default=[24, 5000, 100_000, 1_000_000])
    args = ap.parse_args()
    slow, fast = re.compile(PATTERN), compile_pattern(PATTERN)
    print(f"pattern {PATTERN!r}, text 'a' * n + 'b'")
    for n in range(16, args.re_up_to + 1, 2):
        print(f"re   n={n:>9,}: {seconds(slow.search, 'a' * n + 'b'):10.4f} s")
    for n in args.re2_n:
        print(f"RE2  n={n:>9,}: {seconds(fast.search, 'a' * n + 'b'):10.6f} s")


if __name__ == "__main__":
    main()
