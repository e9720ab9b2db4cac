"""bench/coevolution.py: the --small smoke run end to end (pipeline, not numbers), the budget
planning in model tokens, the seed-aware intervals, the null check, and the page rebuilt from
its data JSON.

The smoke run uses a tiny random Llama (tests/tiny_glue.py) as the policy through
`--model hf:DIR`, not the embedded SmolLM2: measured on this 2-core machine, `--small` on the
embedded model took 12.7 min (its 160-token arithmetic replies dominate), far over a CI
smoke's ~3 min. Even with the tiny model it took ~10 min on the loaded shared box (load
average ~7 on 2 cores; the HF per-token generation loop dominates), hence `slow`. Everything
else is the real pipeline: build_parts, the RL stage, the demos proposer, the gate, the store,
evaluate, the null check, the RESULTS.md generator and the PNG plot.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import coevolution as bench  # noqa: E402
import coevolution_budget as budget  # noqa: E402
import coevolution_null as null  # noqa: E402
import coevolution_report as report  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _base(small: bool = True):
    return bench.base_config("arithmetic", small, Path("/tmp/unused"), None, ["demos"], "embedded")


# --- the budget, in model tokens -------------------------------------------------------------


def test_rounds_are_planned_in_model_tokens():
    b = _base(small=False)  # RL: 4 steps x 2 tasks x G 4 = 32 rollouts; val_n 20, screen 10
    r = budget.Rates(eval=500, rl=1000, call=2500)
    assert budget.cost({"tokens": 30.0, "train_tokens": 12.0, "rollouts": 99.0}) == 42.0
    # weight-only: the RL stage, 32 x 1000 tokens
    assert budget.plan_round(b, "weight-only", r, 32_000) == budget.Plan(False, None, 32_000)
    assert budget.plan_round(b, "weight-only", r, 31_999) is None
    # gated: RL + a screen (2 x 10 x 500) fits; the loop's rollouts cover the RL stage and as
    # many gate episodes as the rest pays for. demos calls no model: no call is reserved.
    assert budget.plan_round(b, "gated", r, 50_000) == budget.Plan(False, 32 + 36, 50_000)
    # not even a screen after the RL stage: an RL-only round
    assert budget.plan_round(b, "gated", r, 40_000) == budget.Plan(True, None, 32_000)
    # harness-only: 16 train rollouts + a screen, no RL; nothing cheaper to fall back on
    assert budget.plan_round(b, "harness-only", r, 18_000) == budget.Plan(False, 16 + 20, 18_000)
    assert budget.plan_round(b, "harness-only", r, 17_999) is None
    llm = bench.base_config("arithmetic", False, Path("/tmp/unused"), None,
                            ["demos", "harness", "skills", "rubrics"], "embedded")
    assert budget.proposer_calls(llm) == 4  # harness 1, skills 2 (distil, refine), rubrics 1
    assert budget.plan_round(llm, "ungated", r, 42_000) == budget.Plan(False, None, 42_000)


class _FakeStore:
    """The store reads run_mode makes, over the budget rows the fake loop below writes."""

    def __init__(self):
        self.rows: dict[int, dict[str, float]] = {}

    def runs(self):
        return []

    def trajectories(self, *a, **kw):
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


def test_every_mode_spends_its_budget(monkeypatch):
    """Gated rounds while RL + a screen fit, then RL-only rounds while an RL stage fits; the
    rest is less than the cheapest round. Harness-only runs while train rollouts + a screen
    fit (its gate plans down to what is left)."""
    import coevo.loop as loop

    b = _base(small=False)
    rates = budget.Rates(eval=500, rl=1000, call=2500)
    store, seen = _FakeStore(), []

    def fake_run(cfg, store_, parts, *, resume=None, progress=None):
        r = cfg.rounds - 1
        seen.append((len(parts.proposers), cfg.budgets.rollouts))
        rl = 32_000.0 if parts.proposers is not None and cfg.mode != "harness-only" else 0.0
        gate = 10 * 500.0 if parts.proposers else 0.0  # the sequential gate stopped at the screen
        train = 16 * 500.0 if cfg.mode == "harness-only" else 0.0
        store_.rows[r] = {"tokens": rl / 2 + gate + train, "train_tokens": rl / 2}
        return type("Res", (), {"run": "R"})()

    monkeypatch.setattr(loop, "build_parts", lambda cfg: loop.Parts(env=None, backend=None,
                                                                    proposers=[object()]))
    monkeypatch.setattr(loop, "run_coevolution", fake_run)
    monkeypatch.setattr(bench, "final_tests", lambda *a: {})
    monkeypatch.setattr(bench, "proposal_counts", lambda *a: {})
    monkeypatch.setattr(bench, "proposer_docs", lambda *a: [])
    out = bench.run_mode(b, "gated", 0, 160_000, store, rates=rates, base_val=0.2)
    # full rounds of 37k while 42k fit: 37, 74, 111, 148 (12k left: under an RL stage's 32k)
    assert [n for n, _ in seen] == [1, 1, 1, 1] and out["tail_rounds"] == 0
    assert out["cost"] == 148_000 and [x for x, _ in out["curve"]] == [0, 37e3, 74e3, 111e3, 148e3]
    assert seen[0][1] == 32 + (160_000 - 32_000) // 500
    store.rows.clear(), seen.clear()
    out = bench.run_mode(b, "gated", 0, 100_000, store, rates=rates, base_val=0.2)
    # 37k, 74k; 26k left: no RL stage (32k) fits either
    assert out["rounds"] == 2 and out["cost"] == 74_000
    store.rows.clear(), seen.clear()
    out = bench.run_mode(b, "gated", 0, 110_000, store, rates=rates, base_val=0.2)
    # 37k, 74k; 36k left: RL + screen needs 42k, an RL stage 32k fits: one RL-only round
    assert [n for n, _ in seen] == [1, 1, 0] and out["tail_rounds"] == 1 and out["cost"] == 106_000
    store.rows.clear(), seen.clear()
    out = bench.run_mode(b, "harness-only", 0, 40_000, store, rates=rates, base_val=0.2)
    # 13k a round while train rollouts + a screen (18k) fit: 13, 26; 14k left
    assert out["rounds"] == 2 and out["tail_rounds"] == 0 and out["cost"] == 26_000
    assert [c for _, c in seen] == [16 + (40_000 - 8_000) // 500, 16 + (27_000 - 8_000) // 500]


def test_a_variant_label_runs_its_loop_mode_with_its_settings(monkeypatch):
    """`bettertogether-gate`: the loop's bettertogether mode with `select: gate`, planned as
    bettertogether's stages (p, then w), and reported under its own label."""
    import coevo.loop as loop

    b = _base(small=False)
    rates = budget.Rates(eval=500, rl=1000, call=2500)
    store, seen = _FakeStore(), []

    def fake_run(cfg, store_, parts, *, resume=None, progress=None):
        seen.append((cfg.name, cfg.mode, cfg.bettertogether.select, cfg.rounds))
        store_.rows[cfg.rounds - 1] = {"tokens": 10_000.0}
        return type("Res", (), {"run": "R"})()

    monkeypatch.setattr(loop, "build_parts", lambda cfg: loop.Parts(env=None, backend=None,
                                                                    proposers=[object()]))
    monkeypatch.setattr(loop, "run_coevolution", fake_run)
    for f in ("final_tests", "proposal_counts", "proposer_docs"):
        monkeypatch.setattr(bench, f, lambda *a: {})
    out = bench.run_mode(b, "bettertogether-gate", 0, 50_000, store, rates=rates, base_val=0.2)
    # planned as bettertogether's p (28k), w (32k), p (28k) rounds: 3 fit in 50k at 10k each
    assert out["mode"] == "bettertogether-gate" and out["rounds"] == 3
    assert {(m, s) for _, m, s, _ in seen} == {("bettertogether", "gate")}
    assert seen[0][0] == f"{b.name}-bettertogether-gate-s0"
    assert bench.variant(b, "gated") == (b, "gated")
    assert b.bettertogether.select == "mean"  # the base config is not changed


def _fake_runs(monkeypatch) -> list[tuple[int, str]]:
    """bench.main with calibration and run_mode faked: the (seed, mode) pairs it runs."""
    ran = []

    def fake_run_mode(b, mode, seed, budget_, store, *, rates, base_val):
        ran.append((seed, mode))
        return {"env": b.env, "seed": seed, "mode": mode, "run": f"R{seed}", "seed_test": {}}

    monkeypatch.setattr(bench, "calibration", lambda b, store: (0.2, budget.Rates(500, 1000, 2500)))
    monkeypatch.setattr(bench, "run_mode", fake_run_mode)
    return ran


def test_run_seeds_runs_only_the_seeds_named_and_reuses_the_ledger(tmp_path, monkeypatch):
    """--run-seeds: two processes sharing one --out can run different seeds; a seed outside the
    list is reused from the ledger when done there and left out otherwise. --name names the
    data set on the page (a second data set of the same --envs)."""
    from coevo.errors import CoevoError

    out = tmp_path / "out"
    out.mkdir()
    done = {"env": _base(small=False).env, "seed": 0, "mode": "gated", "run": "R0", "seed_test": {}}
    (out / "runs.jsonl").write_text(json.dumps(done) + "\n")
    ran = _fake_runs(monkeypatch)
    monkeypatch.setattr(bench, "proposer_docs", lambda *a: [])
    monkeypatch.setattr(bench, "write_data", lambda report, path: None)
    monkeypatch.setattr(bench, "write_results", lambda report, path: path)
    args = ["--envs", "arithmetic", "--seeds", "3", "--modes", "gated", "--only", "--null-n", "0",
            "--out", str(out), "--results", str(tmp_path / "R.md"), "--data", str(tmp_path / "d.json")]
    rep = bench.main(args + ["--run-seeds", "2", "--name", "arithmetic-two-seeds"])
    assert rep["name"] == "arithmetic-two-seeds"  # the page's data set name, not --envs
    assert ran == [(2, "gated")]  # seed 1 is neither done nor named: left out
    assert [(r["seed"], r["run"]) for r in rep["runs"]] == [(0, "R0"), (2, "R2")]
    assert rep["seeds"] == 2  # the page's "Seeds: N per env" counts the seeds it has
    env = _base(small=False).env
    assert rep["missing"] == [f"{env} seed 1 gated"] and rep["seeds_declared"] == 3
    ledger = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [(r["seed"], r["mode"]) for r in ledger] == [(0, "gated"), (2, "gated")]
    ran.clear()
    rep = bench.main(args)  # all seeds: 0 and 2 from the ledger, 1 runs now
    assert ran == [(1, "gated")] and [r["seed"] for r in rep["runs"]] == [0, 1, 2]
    assert rep["name"] == "arithmetic" and rep["seeds"] == 3 and rep["missing"] == []
    ran.clear()  # none: the data set rebuilt from the ledger, nothing run
    rep = bench.main(args + ["--seeds", "4", "--run-seeds", "none"])
    assert ran == [] and [r["seed"] for r in rep["runs"]] == [0, 1, 2]
    assert rep["missing"] == [f"{env} seed 3 gated"] and rep["seeds_declared"] == 4
    for bad in ("3", "x", ","):
        with pytest.raises(CoevoError, match="--run-seeds"):
            bench.main(args + ["--run-seeds", bad])


def test_one_calibration_per_out_and_config(tmp_path, monkeypatch):
    """Invocations sharing an --out (--run-seeds parts, a rebuild) plan on the rates of one
    calibration, so every run of the data set has the same budget; another config calibrates
    again."""
    calls = []

    def fake_calibration(b, store):
        calls.append(b.env)
        return 0.25, budget.Rates(500 + 100 * len(calls), 1000, 2500)  # differs per call

    ran = _fake_runs(monkeypatch)
    monkeypatch.setattr(bench, "calibration", fake_calibration)
    monkeypatch.setattr(bench, "proposer_docs", lambda *a: [])
    monkeypatch.setattr(bench, "write_data", lambda report, path: None)
    monkeypatch.setattr(bench, "write_results", lambda report, path: path)
    args = ["--envs", "arithmetic", "--seeds", "2", "--modes", "gated", "--only", "--null-n", "0",
            "--out", str(tmp_path / "out"), "--results", str(tmp_path / "R.md"),
            "--data", str(tmp_path / "d.json")]
    first = bench.main(args + ["--run-seeds", "0"])
    second = bench.main(args + ["--run-seeds", "1"])
    assert ran == [(0, "gated"), (1, "gated")] and len(calls) == 1
    assert first["budget"] == second["budget"] == {second["runs"][0]["env"]: 320 * 600}
    assert second["base_val"] == {second["runs"][0]["env"]: 0.25}
    third = bench.main(args + ["--run-seeds", "none", "--proposers", "harness"])
    assert len(calls) == 2 and list(third["budget"].values()) == [320 * 700]


def test_reuse_takes_a_data_files_runs_on_its_budget_and_config_only(tmp_path, monkeypatch):
    """--reuse: a data set whose --out is gone is extended with another seed. The file's runs
    count as done (not run again, their stored proposer stats kept: their store is not this
    one), the new seed runs, and the page says where the reused runs came from; a file written
    on another budget or config is refused with one line naming the field."""
    from coevo.errors import CoevoError

    ran, docs_read = [], []

    def fake_run_mode(b, mode, seed, budget_, store, *, rates, base_val):
        ran.append((seed, mode, budget_))
        return {"env": b.env, "seed": seed, "mode": mode, "run": f"R{seed}", "seed_test": {},
                "proposer_stats": [{"proposer": "demos", "proposals": seed + 1}]}

    monkeypatch.setattr(bench, "calibration", lambda b, store: (0.2, budget.Rates(500, 1000, 2500)))
    monkeypatch.setattr(bench, "run_mode", fake_run_mode)
    monkeypatch.setattr(bench, "proposer_docs", lambda store, run: docs_read.append(run) or [])
    monkeypatch.setattr(bench, "write_results", lambda report, path: path)

    def args(out, data, *more):
        return ["--envs", "arithmetic", "--seeds", "2", "--modes", "gated", "--only",
                "--null-n", "0", "--out", str(tmp_path / out), "--results", str(tmp_path / "R.md"),
                "--data", str(tmp_path / data), *more]

    bench.main(args("first", "d1.json", "--run-seeds", "0"))  # a first bench: seed 0
    assert ran == [(0, "gated", 160_000)]
    ran.clear()
    rep = bench.main(args("second", "d2.json", "--reuse", str(tmp_path / "d1.json")))
    assert ran == [(1, "gated", 160_000)]  # seed 0 came from the file, seed 1 ran here
    assert [(r["seed"], r["run"], r.get("reused_from")) for r in rep["runs"]] == [
        (0, "R0", "d1.json"), (1, "R1", None)]
    assert rep["runs"][0]["proposer_stats"] == [{"proposer": "demos", "proposals": 1}]
    assert docs_read == [] and rep["reused"] == 1
    assert report._reused_from(rep).startswith("`d1.json` (--reuse")  # the page's wall-time line
    with pytest.raises(CoevoError, match=r"--reuse d1.json: budget.rg:.* is 160000, this bench's is 50000"):
        bench.main(args("third", "d3.json", "--budget", "100", "--reuse", str(tmp_path / "d1.json")))
    with pytest.raises(CoevoError, match=r"--reuse d1.json: configs.*differs.*proposers"):
        bench.main(args("third", "d3.json", "--proposers", "harness", "--reuse",
                        str(tmp_path / "d1.json")))
    with pytest.raises(CoevoError, match="--reuse: no data file"):
        bench.main(args("third", "d3.json", "--reuse", str(tmp_path / "none.json")))


def test_a_run_finished_in_the_store_but_not_the_ledger_is_recovered_not_rerun(tmp_path, monkeypatch):
    """The bench died after a run's final tests but before its ledger line (it happened: an
    import failed while the stats were read, after 100 minutes of BFCL). The rerun rebuilds the
    record from the store, test outcomes per task included, instead of running it again; a
    run that stopped before its final tests is run again under a new name, as before."""
    from coevo.store import Store

    out = tmp_path / "out"
    out.mkdir()
    b = bench.base_config("arithmetic", False, out, None, ["demos"], "embedded")
    store = Store.open(f"sqlite:///{out / 'bench.db'}")

    def finished_run(name, final):
        run = store.create_run(name, mode="weight-only", status="done")
        start = store.create_evaluation(split="test", env=b.env, run=run.id)
        store.add_results(start, [{"task_id": "t1", "outcome": 0.0}, {"task_id": "t2", "outcome": 0.0}])
        store.start_round(run.id, 0)
        store.finish_round(run.id, 0, summary={"val_start_score": 0.1, "val_score": 0.3,
                                               "evaluations": {"test_start": start}})
        if final:
            ev = store.create_evaluation(split="test", env=b.env, run=run.id)
            store.add_results(ev, [{"task_id": "t1", "outcome": 1.0}, {"task_id": "t2", "outcome": 0.0}],
                              summary={"mean": 0.5, "ci_low": 0.0, "ci_high": 1.0, "n_tasks": 2,
                                       "criteria": {}, "n_infra_failures": 0})
        return run.id

    done_id = finished_run(f"{b.name}-weight-only-s0", final=True)
    finished_run(f"{b.name}-weight-only-s1", final=False)
    ran = _fake_runs(monkeypatch)
    monkeypatch.setattr(bench, "write_results", lambda report, path: path)
    rep = bench.main(["--envs", "arithmetic", "--seeds", "2", "--modes", "weight-only", "--only",
                      "--proposers", "demos", "--null-n", "0", "--out", str(out),
                      "--results", str(tmp_path / "R.md"), "--data", str(tmp_path / "d.json")])
    assert ran == [(1, "weight-only")]  # seed 1 never reached its final tests: run again
    got = rep["runs"][0]
    assert (got["run"], got["rounds"], got["tail_rounds"]) == (done_id, 1, 0)
    assert got["tests"][b.env]["tasks"] == {"t1": 1.0, "t2": 0.0}
    # the seed incumbent's per-task outcomes come from the evaluation's results, as the final
    # test's do (this store keeps no trajectories for them)
    assert got["seed_test"][b.env]["tasks"] == {"t1": 0.0, "t2": 0.0}
    assert got["tests"][b.env]["mean"] == 0.5 and got["proposals"]["accepted"] == 0
    assert got["curve"] == [[0.0, 0.1], [0.0, 0.3]]  # (tokens spent, val) per round
    ledger = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [(r["seed"], r["run"]) for r in ledger] == [(0, done_id), (1, "R1")]


# --- intervals, null check, the page ---------------------------------------------------------


def test_intervals_carry_the_seed_variance():
    """Two seeds that disagree (0.237 and 0.530 over 80 test tasks each): the pooled Student-t
    interval over seed x task results, [0.28, 0.49], excluded both seeds' own scores; the
    cluster bootstrap over seeds and tasks covers them."""
    from coevo.evaluate import t_interval

    s0 = [1.0] * 19 + [0.0] * 61  # 0.2375
    s1 = [1.0] * 42 + [0.0] * 38  # 0.525
    lo_t, hi_t = t_interval(s0 + s1)
    assert lo_t > 0.2375 and hi_t < 0.525  # the old interval
    mean, lo, hi = report.cluster_bootstrap([s0, s1])
    assert mean == pytest.approx((0.2375 + 0.525) / 2)
    assert lo < 0.2375 and hi > 0.525
    same = report.cluster_bootstrap([s0, s0])  # seeds that agree: only task noise remains
    assert same[2] - same[1] < hi - lo


def test_null_check_draws_independent_samples_at_n_200():
    """Every task's stored outcomes hold both successes and failures: two different draws
    differ on some tasks, so the check can fail; at n = 200 the accept rate stays near alpha
    (the gate's guarantee) and its 95% upper bound is informative."""
    import random

    from coevo.gate import GatePolicy

    rnd = random.Random(0)
    tasks = {f"t{i}": [[float(rnd.random() < 0.3), None] for _ in range(8)] for i in range(20)}
    res = null.simulate({"env": "toy", "draws": 8, "tasks": tasks}, GatePolicy(n_boot=200), 200)
    assert res["n"] == 200 and res["differing"] > 0
    assert res["rate"] <= 0.05 and res["upper95"] < 0.07
    assert res["upper95"] == pytest.approx(null.cp_upper(res["accepted"], 200))


def _report(tmp_path) -> dict:
    runs = []
    for mode in report.MODE_ORDER:
        for seed in (0, 1):
            tasks = {f"t{i}": float((i + seed + len(mode)) % 3 == 0) for i in range(12)}
            runs.append({"env": "toy:env", "config": "toy", "mode": mode, "seed": seed, "run": "x",
                         "rounds": 2, "tail_rounds": 0, "curve": [[0, 0.1], [500, 0.2]],
                         "spent": {"tokens": 400.0, "train_tokens": 100.0, "rollouts": 8.0},
                         "cost": 500.0, "proposals": {"accepted": 1, "rejected": 0, "budget": 0,
                                                      "invalid": 1},
                         "tests": {"toy:env": {"mean": sum(tasks.values()) / 12, "n": 12,
                                               "tasks": tasks, "details": {"answered": 0.5}}},
                         "seconds": 1.0})
    return {"date": "2026-12-03 00:00 UTC", "command": "python bench/coevolution.py", "small": False,
            "seeds": 2, "budget": {"toy:env": 500}, "budget_units": 10, "proposers": ["demos"],
            "proposer_model": "embedded", "machine": "m", "seconds": 60.0, "estimate_s": 60.0,
            "configs": {"toy:env": {"env": "toy:env", "model": {"backend": "embedded"},
                                    "gate": {"name": "paired", "alpha": 0.05}}},
            "base_val": {"toy:env": 0.1},
            "runs": runs, "null": None, "data": "bench/data/coevolution.json"}


def test_report_only_rebuilds_the_page_from_the_data_json(tmp_path):
    rep = _report(tmp_path)
    data, page = tmp_path / "data" / "coevolution.json", tmp_path / "docs" / "RESULTS.md"
    report.write_data(rep, data)
    first = report.write_results(rep, page).read_text()
    page.unlink()
    bench.main(["--report-only", "--data", str(data), "--results", str(page)])
    assert page.read_text() == first  # the page is a function of the data file
    rows = _table_rows(first, "toy:env")
    gated = [r for r in rep["runs"] if r["mode"] == "gated"]
    mean, lo, hi = report.cluster_bootstrap(report.per_seed(gated, "toy:env"))
    assert rows["gated"][1] == f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"
    assert "hierarchical (cluster) bootstrap over seeds and tasks" in first
    assert "500 model tokens on toy:env (10 seed-incumbent val episodes' worth" in first
    with pytest.raises(bench.CoevoError, match="no data file"):
        bench.main(["--report-only", "--data", str(tmp_path / "none.json"), "--results", str(page)])


def test_page_says_which_declared_runs_are_not_run_yet(tmp_path):
    """A data set built in parts (--run-seeds) says on its page how many seeds the command
    declares and which (env, seed, mode) runs it does not hold yet."""
    rep = _report(tmp_path)
    text = report.write_results(rep, tmp_path / "RESULTS.md").read_text()
    assert "Not run yet" not in text and f"- Seeds: {rep['seeds']} per env;" in text
    rep |= {"seeds_declared": rep["seeds"] + 1, "missing": ["toy:env seed 2 gated"]}
    text = report.write_results(rep, tmp_path / "RESULTS.md").read_text()
    assert f"- Seeds: {rep['seeds']} per env of the {rep['seeds'] + 1} the command declares;" in text
    assert "**Not run yet** (left out by `--run-seeds`" in text and ": toy:env seed 2 gated." in text


def test_page_pairs_gated_with_every_mode_and_every_mode_with_the_seed_incumbent(tmp_path):
    """With the seed incumbent's test outcomes (splits.seed_test) the table gets its row and
    every mode a paired difference against it; gated is paired with every other mode. The
    verdict names a winner only when the interval excludes 0."""
    rep = _report(tmp_path)
    for r in rep["runs"]:
        r["seed_test"] = {"toy:env": {"mean": 0.0, "tasks": {f"t{i}": 0.0 for i in range(12)}}}
        if r["mode"] == "gated":  # solves every task: beats the seed at both seeds
            r["tests"]["toy:env"]["tasks"] = {f"t{i}": 1.0 for i in range(12)}
    rep["runs"][0]["seed_test"] = None  # seed 0 of weight-only did not score it: another run did
    text = report.write_results(rep, tmp_path / "RESULTS.md").read_text()
    seed_row = next(line for line in text.splitlines() if line.startswith("| seed incumbent"))
    assert "| 0.000 [0.000, 0.000] | 0.000, 0.000 |" in seed_row
    rows = {c[0]: c for c in (
        [x.strip() for x in line.strip("|").split("|")] for line in text.splitlines()
        if line.startswith("| ") and " - " in line.split("|")[1])}
    assert rows["gated - seed incumbent"][1:] == [
        "1.000 [1.000, 1.000]", "2 x 12", "gated beats seed incumbent"]
    ho = [r for r in rep["runs"] if r["mode"] == "harness-only"]
    want = report.cluster_bootstrap([[v - 1.0 for v in r["tests"]["toy:env"]["tasks"].values()]
                                     for r in ho])
    assert rows["gated - harness-only"][1:3] == [
        f"{-want[0]:.3f} [{-want[2]:.3f}, {-want[1]:.3f}]", "2 x 12"]
    assert rows["gated - harness-only"][3] == "gated beats harness-only"
    assert set(rows) == {"gated - weight-only", "gated - harness-only", "gated - ungated",
                         *(f"{m} - seed incumbent" for m in report.MODE_ORDER)}
    # A gated variant (bettertogether-gate) is paired with every mode too, gated once.
    for r in [r for r in rep["runs"] if r["mode"] == "gated"]:
        rep["runs"].append({**r, "mode": "bettertogether-gate", "tests": {"toy:env": {
            **r["tests"]["toy:env"], "tasks": {f"t{i}": float(i % 2) for i in range(12)}}}})
    text = report.write_results(rep, tmp_path / "RESULTS.md").read_text()
    rows = {c[0]: c for c in (
        [x.strip() for x in line.strip("|").split("|")] for line in text.splitlines()
        if line.startswith("| ") and " - " in line.split("|")[1])}
    wo = {r["seed"]: r["tests"]["toy:env"]["tasks"] for r in rep["runs"] if r["mode"] == "weight-only"}
    want = report.cluster_bootstrap([[float(i % 2) - wo[s][f"t{i}"] for i in range(12)]
                                     for s in (0, 1)])
    assert rows["bettertogether-gate - weight-only"][1] == (
        f"{want[0]:.3f} [{want[1]:.3f}, {want[2]:.3f}]")
    assert "gated - bettertogether-gate" in rows and "bettertogether-gate - gated" not in rows
    assert report.verdict(-0.1, 0.2, "a", "b").startswith("not resolved")
    assert report.verdict(-0.3, -0.1, "a", "b") == "b beats a"


def test_page_sums_each_modes_proposer_stats_over_seeds(tmp_path):
    rep = _report(tmp_path)
    stat = {"proposer": "demos", "proposals": 3, "invalid": 1, "gated": 2}
    for r in rep["runs"]:
        if r["mode"] == "gated":  # seed 0: 1 of 2 accepted (+0.2), seed 1: 2 of 2 (+0.1, +0.3)
            r["proposer_stats"] = [{**stat, "accepted": 1, "accepted_delta": 0.2, "gated_delta": 0.05}
                                   if r["seed"] == 0 else
                                   {**stat, "accepted": 2, "accepted_delta": 0.2, "gated_delta": 0.2}]
    text = report.write_results(rep, tmp_path / "RESULTS.md").read_text()
    [row] = [ln for ln in text.splitlines() if ln.startswith("| gated | demos |")]
    assert row == "| gated | demos | 6 | 2 | 0.67 | 4 | 3 | 0.75 | 0.200 | 0.125 |"
    assert not [ln for ln in text.splitlines() if ln.startswith("| weight-only | demos")]


def test_report_only_puts_several_data_sets_on_one_page(tmp_path):
    a, b = _report(tmp_path), _report(tmp_path)
    b["name"] = "toy-rl"
    b["runs"] = [r for r in b["runs"] if r["seed"] == 0]
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for rep, f in zip((a, b), files):
        report.write_data(rep, f)
    page = tmp_path / "docs" / "RESULTS.md"
    bench.main(["--report-only", "--data", str(files[0]), "--data", str(files[1]),
                "--results", str(page)])
    text = page.read_text()
    assert text.count("## Data set `") == 2 and "## Data set `toy-rl`" in text
    assert "## Data set `bfcl,arithmetic`" in text  # older data: the command's default envs
    first, second = text.split("## Data set `toy-rl`")
    assert first.count("### toy:env") == second.count("### toy:env") == 1
    assert "| 2 x 12 |" in first and "| 1 x 12 |" in second  # each section its own runs
    pngs = sorted(p.name for p in page.parent.glob("*.png"))
    assert pngs == ["coevolution-bfcl-arithmetic-toy-env.png", "coevolution-toy-rl-toy-env.png"]
    with pytest.raises(bench.CoevoError, match="a run writes one data file"):
        bench.main(["--data", str(files[0]), "--data", str(files[1]), "--out", str(tmp_path / "o")])


def test_null_candidate_is_admissible_and_invisible_to_the_model(tmp_path):
    from coevo.assets.io import load_seed_dir
    from coevo.propose.base import Incumbent, check_candidate
    from coevo.store import Store

    store = Store.open(f"sqlite:///{tmp_path / 'null.db'}")
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
        if line.startswith("| ") and cells[0] in bench.MODE_ORDER and not cells[1].isdigit():
            rows[cells[0]] = cells
    return rows


@pytest.mark.slow  # a long run: ~10 min on the loaded shared 2-core box (HF generation loop)
def test_small_run_writes_the_table_plot_data_and_null_check(tmp_path):
    import tiny_glue

    model = tiny_glue.save_tiny_model(tmp_path / "tiny")
    out, results = tmp_path / "out", tmp_path / "docs" / "RESULTS.md"
    rep = bench.main(["--small", "--model", f"hf:{model}", "--proposers", "demos",
                      "--out", str(out), "--results", str(results)])
    [limit] = rep["budget"].values()  # 100 seed-incumbent val episodes' worth of tokens
    assert [r["mode"] for r in rep["runs"]] == list(bench.MODE_ORDER)

    # Spend, recomputed from the store's own budget rows, in one unit for every mode; every
    # mode stopped only when its next round no longer fit (the rest is under a round's cost).
    from coevo.store import Store

    store = Store.open(f"sqlite:///{out / 'bench.db'}")
    for r in rep["runs"]:
        spent = store.budget_totals(r["run"])
        assert budget.cost(spent) == r["cost"] > 0 and "proposer_calls" not in spent  # demos
        assert r["rounds"] >= 1 and r["tests"][r["env"]]["n"] == 4
        assert r["cost"] <= limit * 1.1, (r["mode"], r["cost"])  # estimates, not exact costs
    by_mode = {r["mode"]: r for r in rep["runs"]}
    from coevo.proposer_stats import proposer_stats

    for r in rep["runs"]:  # per proposer, as `coevo proposals stats --run` reads the store
        assert r["proposer_stats"] == [s.doc() for s in proposer_stats(store, r["run"])]
        assert sum(s["proposals"] for s in r["proposer_stats"]) == len(store.proposals(r["run"]))
    assert not store.trajectories(by_mode["harness-only"]["run"], split="train", limit=1)[0].checkpoint
    # every run of the seed starts from the same seed versions (pinned from the seed files)
    seeds = {tuple(sorted(store.get_run(r["run"]).config["seed"].items())) for r in rep["runs"]}
    assert len(seeds) == 1

    text = results.read_text()
    env = rep["runs"][0]["env"]
    rows = _table_rows(text, env)
    assert set(rows) == set(bench.MODE_ORDER)
    for mode, cells in rows.items():
        assert re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", cells[1]), cells
        assert float(cells[1].split()[0]) == pytest.approx(by_mode[mode]["tests"][env]["mean"], abs=1e-3)
    png = results.parent / f"coevolution-{bench._slug(env)}.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and f"]({png.name})" in text

    n = rep["null"]
    assert n["n"] == 200 and n["draws"] == 4 and "Simulated from stored real per-task outcomes" in text
    assert re.search(r"\| 200 \| \d+ \| \d\.\d{3} \| \d\.\d{3} \|", text)
    # the page rebuilds from the data file the run wrote
    again = tmp_path / "again.md"
    bench.main(["--report-only", "--data", str(out / "coevolution.json"), "--results", str(again)])
    assert again.read_text() == text
