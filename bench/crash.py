"""Random SIGKILLs of a tiny co-evolution run, resumed: kills survived, rows lost, rows
duplicated, decisions changed.

The run is tests/test_resume.py's: a 2-layer random Llama trained by the real RL stage, a
scripted policy whose reply depends on the system prompt, the scripted proposer, the real gate,
evaluate() and SQLite store, 2 rounds and a final test. It runs once uninterrupted (the
reference); then N kills in chains of K: a chain starts the run in a fresh store, SIGKILLs it at
a seeded random moment, resumes it and kills the resume, K times, then resumes it to the end.
Every table is compared with the reference as test_resume.snapshot() sees it (generated ids
mapped to what they identify; timestamps, paths and measured seconds left out):

- rows lost: reference rows missing at the end (per table, counted as multisets),
- rows duplicated: rows beyond the reference's,
- decisions changed: (round, proposal, status, accepted, policy, reason) tuples that differ,
- kills survived: kills in chains that resumed to the end with nothing lost, duplicated or
  changed.

Moments (test_resume.random_moments): a chain's first kill falls in the start-up (imports, model
building, run creation), the others 20-100% of the time the reference held the run's lease after
the resume took it, so on a loaded machine too the kills land in the loop's work. Run from the
repository root:
    python bench/crash.py [--kills 20] [--chain 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import test_resume  # noqa: E402  (tests/: the run, its kill loop and the snapshot)


def compare(want: dict[str, list[str]], got: dict[str, list[str]]) -> tuple[int, int]:
    """(rows lost, rows duplicated) over every table, rows compared as multisets."""
    lost = dup = 0
    for table in want.keys() | got.keys():
        w, g = Counter(want.get(table, [])), Counter(got.get(table, []))
        lost += sum((w - g).values())
        dup += sum((g - w).values())
    return lost, dup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs in all")
    ap.add_argument("--chain", type=int, default=5, help="kills of one run (and its resumes)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="coevo-crash-") as tmp:
        ref = Path(tmp, "ref")
        ref.mkdir()
        url = f"sqlite:///{ref / 'ref.db'}"
        wall, startup, work = test_resume.timed_run(ref, url)
        want, want_dec = test_resume.snapshot(url, ref), test_resume.decisions(url)
        print(f"reference: {wall:.1f} s ({startup:.1f} s to take the lease, held {work:.1f} s), "
              f"{sum(map(len, want.values()))} rows, "
              f"{len(want_dec)} decisions", flush=True)
        kills = survived = lost = dup = changed = failed = 0
        for chain in range(10 * args.kills):
            if kills >= args.kills:
                break
            tmp_c = Path(tmp, f"c{chain}")
            tmp_c.mkdir()
            url = f"sqlite:///{tmp_c / 'c.db'}"
            k = min(args.chain, args.kills - kills)
            moments = test_resume.random_moments(rng.randrange(1 << 30), k + 6, startup, work)
            done = len(test_resume.kill_chain(tmp_c, url, moments, kills=k))
            kills += done
            if done == 0:
                print("no moment fell inside the run: the machine is much faster now than "
                      "during the reference run", flush=True)
                break
            try:
                resumed = test_resume._run(tmp_c, url) == 0
            except AssertionError as e:  # the resume itself failed: print why
                print(f"chain {chain}: the resume failed: {str(e).splitlines()[-1]}", flush=True)
                resumed = False
            if not resumed:
                failed += 1
                continue
            lo, du = compare(want, test_resume.snapshot(url, tmp_c))
            ch = len(set(want_dec) ^ set(test_resume.decisions(url)))
            lost, dup, changed = lost + lo, dup + du, changed + ch
            survived += done if (lo, du, ch) == (0, 0, 0) else 0
            print(f"chain {chain}: {done} kills, lost {lo}, duplicated {du}, "
                  f"decisions changed {ch}", flush=True)
    print(f"kills survived: {survived}/{kills}; rows lost: {lost}; rows duplicated: {dup}; "
          f"decisions changed: {changed}; chains that did not resume: {failed} "
          f"(load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
