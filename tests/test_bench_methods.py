"""bench/methods.py's pieces that decide what a row measures: the `predicates` method's
rubric (prerequisites added to the seed rubric) and the table built from saved rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import methods  # noqa: E402

from coevo.assets.io import load_seed_dir  # noqa: E402
from coevo.rewards import paid_criteria, reward  # noqa: E402

SEEDS = {(a.kind, a.name): a for a in load_seed_dir(REPO)}


def test_predicates_method_makes_the_number_credit_depend_on_the_answer_line():
    over = methods.methods([])["predicates"]
    base = SEEDS["rubric", "reasoning"]
    r = methods.with_requires(base, over["requires"])
    assert {c.id: c.requires for c in r.criteria} == {
        "outcome": [], "answer_line": [], "numeric_answer": ["answer_line"]}
    assert r.parent == base.hash
    no_line = {"outcome": 0.0, "answer_line": 0.0, "numeric_answer": 1.0}
    assert paid_criteria(r, no_line)["numeric_answer"] == 0.0
    assert reward(r, 0.0, no_line) == 0.0 and reward(base, 0.0, no_line) == 0.5 / 3
    both = {"outcome": 1.0, "answer_line": 1.0, "numeric_answer": 1.0}
    assert reward(r, 1.0, both) == reward(base, 1.0, both) == 2.0
    # a rubric without those criteria is the same version
    fc = SEEDS["rubric", "function_calling"]
    assert methods.with_requires(fc, over["requires"]).hash == fc.hash


def test_report_pairs_each_method_with_default_within_seed(tmp_path, capsys):
    rows = [{"method": m, "seed": s, "val": None, "signal": sig, "seconds": 10.0,
             "tasks": {f"t{i}": float(i < k) for i in range(4)}}
            for m, s, k, sig in [("default", 0, 1, 0.5), ("default", 1, 2, 0.5),
                                 ("tempered", 0, 2, 0.75), ("tempered", 1, 3, 0.25)]]
    f = tmp_path / "m.json"
    f.write_text(json.dumps(rows))
    methods.main(["--report", str(f)])
    out = capsys.readouterr().out.splitlines()
    tempered = next(ln for ln in out if ln.startswith("tempered")).split()
    # val: mean of per-seed means (0.5, 0.75); vs default: +0.25 on each seed (one task of
    # four flips to a pass), its interval from resampling tasks within seeds
    assert tempered[1] == "0.625" and tempered[4] == "+0.250" and tempered[7] == "0.500"
    lo, hi = float(tempered[5].strip("[,")), float(tempered[6].strip("]"))
    assert 0.0 <= lo < 0.25 < hi <= 1.0


def test_teacher_demos_file_feeds_the_distill_teacher_and_bad_files_name_the_field(tmp_path):
    """--teacher-demos-file: the stored accepted demos become the distill teacher's extra
    demos as given; a demo that does not end with the assistant's answer is refused with one
    line naming the file and the field."""
    import pytest

    from coevo.errors import CoevoError

    demos = methods.demos_file(REPO / "bench" / "data" / "teacher-demos-arithmetic.json")
    assert [d["messages"][-1]["content"] for d in demos] == ["5 + 2 = 7\nAnswer: 7",
                                                             "4 * 6 = 24\nAnswer: 24"]
    teacher = methods.methods(demos)["distill"]["train"]["teacher"]
    assert teacher["demos"] == demos and teacher["weight"] == 0.1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"messages": [{"role": "user", "content": "Calculate 1 + 1."},
                                             {"role": "user", "content": "again"}]}]))
    with pytest.raises(CoevoError) as err:
        methods.demos_file(bad)
    msg = str(err.value)
    assert "\n" not in msg and str(bad) in msg and "messages" in msg and "assistant" in msg


def test_report_on_the_reward_metric_reads_the_rows_rewards(tmp_path, capsys):
    """--metric reward: the table is built from each row's per-task rubric rewards (what the
    bfcl-multi rows differ in, where every outcome is 0), paired with default within seed."""
    rows = [{"method": m, "seed": 0, "val": 0.0, "signal": 0.5, "seconds": 1.0,
             "tasks": {"a": 0.0, "b": 0.0}, "rewards": {"a": ra, "b": rb}}
            for m, ra, rb in [("default", 0.2, 0.4), ("gigpo", 0.3, 0.7)]]
    f = tmp_path / "m.json"
    f.write_text(json.dumps(rows))
    methods.main(["--report", str(f), "--metric", "reward"])
    gigpo = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gigpo")).split()
    assert gigpo[1] == "0.500" and gigpo[4] == "+0.200"
    methods.main(["--report", str(f)])  # the outcome: all ties
    gigpo = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gigpo")).split()
    assert gigpo[1] == "0.000" and gigpo[4] == "+0.000"
