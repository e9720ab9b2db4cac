"""bench/coevolution.py: the --small smoke run end to end (pipeline, not numbers), plus the
budget arithmetic and the null candidate it relies on.

The smoke run uses a tiny random Llama (tests/tiny_glue.py) as the policy through
`--model hf:DIR`, not the embedded SmolLM2: measured on this 2-core machine, `--small` on the
embedded model took 12.7 min (its 160-token arithmetic replies dominate), far over a CI
smoke's ~3 min. Even with the tiny model it took ~10 min on the loaded shared box (load
average ~7 on 2 cores; the HF per-token generation loop dominates), hence `slow`. Everything else is the real pipeline: build_parts, the RL stage, the demos
proposer, the gate, the store, evaluate, the RESULTS.md generator and the PNG plot.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import coevolution as bench  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _base(small: bool = True):
    return bench.base_config("arithmetic", small, Path("/tmp/unused"), None, ["demos"], "embedded")


def test_round_reserve_counts_rl_proposer_and_gate_costs():
    b = _base(small=False)  # steps 4 x 2 tasks x G 4; val_n 20; train_n 8 x 2; one proposer
    assert bench.round_reserve(b, "weight-only", 8) == (32, 0)
    assert bench.round_reserve(b, "ungated", 8) == (32 + 8, 0)
    assert bench.round_reserve(b, "gated", 8) == (32 + 8, 2 * 20)
    assert bench.round_reserve(b, "harness-only", 8) == (8 * 2 + 8, 2 * 20)
    assert bench.cost({"rollouts": 30.0, "proposer_calls": 2.0, "eval_rollouts": 99.0}, 8) == 46.0


def test_null_candidate_is_admissible_and_invisible_to_the_model():
    from coevo.propose.base import Incumbent, check_candidate
    from coevo.store import Store

    store = Store.open("sqlite://")
    from coevo.assets.io import load_seed_dir

    for a in load_seed_dir(REPO):
        store.put_asset(a)
    h = store.get_asset("harness", "reasoning")
    cand = bench.null_candidate(h, 3)
    assert cand.asset.hash != h.hash and check_candidate(cand, Incumbent(harness=h)) is None
    assert cand.asset.render_system() == h.render_system()
    assert cand.asset.demo_messages() == h.demo_messages()
    assert bench.null_candidate(h, 4).hash != cand.hash  # N comparisons, N distinct versions


def _table_rows(text: str, section: str) -> dict[str, list[str]]:
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in bench.MODE_ORDER:
            rows[cells[0]] = cells
    return rows


@pytest.mark.slow  # a long run: ~10 min on the loaded shared 2-core box (HF generation loop)
def test_small_run_writes_the_table_plot_and_null_check(tmp_path):
    import tiny_glue

    model = tiny_glue.save_tiny_model(tmp_path / "tiny")
    out, results = tmp_path / "out", tmp_path / "docs" / "RESULTS.md"
    rep = bench.main(["--small", "--model", f"hf:{model}", "--proposers", "demos",
                      "--out", str(out), "--results", str(results)])
    budget = rep["budget"]
    assert budget == 20 and [r["mode"] for r in rep["runs"]] == list(bench.MODE_ORDER)

    # Spend, recomputed from the store's own budget rows, is within the budget for every mode;
    # weight-only (no proposer, no gate) fits the most rounds.
    from coevo.store import Store

    store = Store.open(f"sqlite:///{out / 'bench.db'}")
    spent = {}
    for r in rep["runs"]:
        c = bench.cost(store.budget_totals(r["run"]), 8)
        assert c == r["cost"] and 0 < c <= budget, (r["mode"], c)
        spent[r["mode"]] = c
        assert r["rounds"] >= 1 and r["tests"][r["env"]]["n"] == 4
    by_mode = {r["mode"]: r for r in rep["runs"]}
    assert by_mode["weight-only"]["rounds"] == budget // 4  # 1 step x 2 tasks x G 2 per round
    assert store.budget_totals(by_mode["harness-only"]["run"]).get("proposer_calls", 0) >= 1
    assert not store.trajectories(by_mode["harness-only"]["run"], split="train", limit=1)[0].checkpoint

    text = results.read_text()
    env = rep["runs"][0]["env"]
    rows = _table_rows(text, env)
    assert set(rows) == set(bench.MODE_ORDER)
    for mode, cells in rows.items():
        assert re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", cells[1]), cells
        assert float(cells[1].split()[0]) == pytest.approx(by_mode[mode]["tests"][env]["mean"], abs=1e-3)
        spent_cell = cells[[i for i, c in enumerate(cells) if c == f"{spent[mode]:g}"][0]]
        assert float(spent_cell) <= budget

    png = results.parent / f"coevolution-{bench._slug(env)}.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and f"]({png.name})" in text

    null = text.split("## False-accept check", 1)[1]
    m = re.search(r"\| paired \| (\d+) \| (\d+) \|", null)
    assert m and int(m.group(1)) == 2 and int(m.group(2)) <= 2
    assert re.search(r"\| independent \| 2 \| \d+ \|", null)
    # Paired seeds on a null candidate: the same prompt and seed give the same sample.
    assert all(row["differing"] == 0 for row in rep["null"]["variants"]["paired"]["rows"])


class _FakeStore:
    """The few store reads run_mode makes, over budget rows the fake loop below writes."""

    def __init__(self):
        self.rows: dict[int, dict[str, float]] = {}

    def runs(self):
        return []

    def budget_totals(self, run, round=None):
        if round is not None:
            return dict(self.rows[round])
        out: dict[str, float] = {}
        for row in self.rows.values():
            for k, v in row.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def get_round(self, run, r):
        return type("Round", (), {"summary": {"val_score": 0.1 * r}})()


def test_gated_spends_the_remainder_on_rl_only_rounds(monkeypatch):
    """A gated round reserves a whole gate it rarely spends; once a full round no longer fits,
    the rest of the budget goes to rounds without proposers (module docstring: RL-only tail)."""
    import coevo.loop as loop

    b = _base(small=False)  # RL stage 32 rollouts; one proposer call = 8; gate worst case 40
    store, seen = _FakeStore(), []

    def fake_run(cfg, store_, parts, *, resume=None, progress=None):
        r = cfg.rounds - 1
        seen.append((len(parts.proposers), cfg.budgets.rollouts))
        gate = 10 if parts.proposers else 0  # the sequential gate stopped at the screen
        store_.rows[r] = {"rollouts": 32.0 + gate,
                          "proposer_calls": float(len(parts.proposers)), "eval_rollouts": 20.0}
        return type("Res", (), {"run": "R"})()

    monkeypatch.setattr(loop, "build_parts", lambda cfg: loop.Parts(env=None, backend=None,
                                                                    proposers=[object()]))
    monkeypatch.setattr(loop, "run_coevolution", fake_run)
    monkeypatch.setattr(bench, "final_tests", lambda *a: {})
    monkeypatch.setattr(bench, "proposal_counts", lambda *a: {})
    out = bench.run_mode(b, "gated", 0, 160, store, proposer_call_cost=8, monitor_n=4,
                         base_val=0.2)
    # Full rounds cost 32 + 8 + 10 = 50 each while 80 more (40 + 40) fit: 50, 100; then 60 is
    # left, under a full round's 80 but over an RL stage's 32: one RL-only round (132); 28 left.
    assert seen == [(1, 160 - 40 - 8), (1, 160 - 50 - 40 - 8), (0, None)]
    assert out["rounds"] == 3 and out["tail_rounds"] == 1 and out["cost"] == 132.0
    assert [x for x, _ in out["curve"]] == [0.0, 50.0, 100.0, 132.0]

    store.rows.clear(), seen.clear()
    out = bench.run_mode(b, "harness-only", 0, 160, store, proposer_call_cost=8, monitor_n=4,
                         base_val=0.2)
    assert out["tail_rounds"] == 0 and all(n == 1 for n, _ in seen)  # cannot train: no tail
