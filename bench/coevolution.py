"""The co-evolution table: weight-only vs harness-only vs ungated vs gated at an equal budget.

For every environment (a training/bench/<name>.yaml base config) and seed, each of the four
modes of coevo.loop.MODES runs from the same seed assets (pinned by hash from the seed files
when each run is created) and a freshly loaded base model (`build_parts`; the embedded loader
reads its dequantized cache, ~1 s) until an equal total budget of model tokens is spent, then
its final incumbent (assets + checkpoint) is evaluated once on the test split (and on the extra
test environments, e.g. bfcl:multiple for bfcl:simple_python). The budget is given in units of
one seed-incumbent val episode's tokens (`--budget`, default 320) and fixed in tokens per env
before any mode runs, or in tokens directly (`--budget-tokens`).

Budget matching: bench/coevolution_budget.py (one unit for every mode: prefilled + generated +
trained tokens, as the loop charges them; the rounds a mode can afford are planned from the
costs it has measured). Before an env's runs its seed incumbent is evaluated once on the val
split (uncharged): the base model's val score and the first cost estimates.

Departure from the loop: runs are configured with `final_test: false` and the bench evaluates
the test split itself after the last round (`coevo.evaluate.evaluate`, same split, seed and
checkpoint as the loop's final step), because the loop's final step would otherwise run after
every resumed round. Partial credit on the test split is re-derived from the stored test
trajectories with the environment's own verifier (`env.score`), whose `Score.details` the
trajectory rows do not keep (for BFCL: decodes, name_offered, name_correct, required_args,
args_correct, bfcl_decodes, lenient_correct).

Validation curve: the loop's round summaries (`val_score`: the whole val split, uncharged).

False-accept check: bench/coevolution_null.py (N >= 200 null candidates, simulated from stored
real per-task outcomes). The page and its intervals: bench/coevolution_report.py; the data it is
built from is kept in bench/data/ and `--report-only` rebuilds the page from it.
How the stored data names its files and folders: bench/coevolution_paths.py.

    python bench/coevolution.py [--small] [--seeds 2] [--envs bfcl,arithmetic] [--budget UNITS]
        [--out DIR] [--proposers demos,...] [--results docs/RESULTS.md] [--data JSON]
    python bench/coevolution.py --report-only [--data bench/data/coevolution.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from coevolution_budget import Rates, calibrate, cost, measured, plan_round, trains  # noqa: E402
from coevolution_null import collect, null_candidate, simulate  # noqa: E402,F401 (null_candidate: tests)
from coevolution_paths import checkout_of, data_name, portable, stored_command  # noqa: E402,F401 (checkout_of: tests)
from coevolution_report import MODE_ORDER, PEER_MODES, VARIANTS, _f, _slug, load_data, write_data, write_results  # noqa: E402,F401

from coevo.blocks import merge_blocks  # noqa: E402
from coevo.config import RunConfig  # noqa: E402
from coevo.errors import CoevoError  # noqa: E402

BENCH_CONFIGS = REPO / "training" / "bench"
DATA = REPO / "bench" / "data" / "coevolution.json"
EXTRA_TEST = {"bfcl:simple_python": ["bfcl:multiple"]}  # final test also on these envs
# Rough wall seconds per budget unit (one seed-incumbent val episode's tokens) on a quiet 2-core
# machine, the val curve, tests and proposer latency included: the previous full run took 95 min
# for 2,560 rollout-equivalents, about 2 of these units each. For the up-front estimate only.
SEC_PER_UNIT = {"bfcl": 1.2, "rg": 1.0}
CALL_GUESS = 2500  # tokens of an LLM proposer call before one is measured (prompt + 320 out)
SMALL = {  # --small: the pipeline end to end, not the numbers
    "rl": {"stage": {"steps": 2, "tasks_per_step": 2, "samples": 2, "checkpoint_every": 2}},
    "splits": {"train_n": 2, "train_samples": 2, "val_n": 4, "test_n": 4},
    "gate": {"screen_size": 4, "chunk_size": 4, "n_boot": 200},
}


def _say(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False).print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}")


def base_config(name: str, small: bool, out: Path, model: str | None,
                proposers: list[str], proposer_model: str) -> RunConfig:
    """training/bench/<name>.yaml (or a path), with --small sizes, --model and --proposers."""
    path = Path(name) if name.endswith(".yaml") else BENCH_CONFIGS / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in BENCH_CONFIGS.glob("*.yaml")))
        raise CoevoError(f"--envs: {name!r}: no {path} (known: {known})")
    data = RunConfig.load(path).model_dump(mode="json")
    if small:
        data = merge_blocks(data, SMALL)
    if model:
        data["model"] = {"backend": model, "options": {}}
    seed_dir = data["assets"].get("seed_dir")
    if seed_dir and not Path(seed_dir).is_absolute():  # relative to the repository, not the cwd
        data["assets"]["seed_dir"] = str((REPO / seed_dir).resolve())
    own = {p["name"]: p for p in data["proposers"]}
    import yaml  # --proposer-model is a backend spec or a ProposerModel mapping in YAML

    pm = yaml.safe_load(proposer_model) if proposer_model.lstrip().startswith("{") else proposer_model
    data["proposers"] = [own.get(n) or {"name": n, "options": {} if n == "demos"
                                        else {"model": pm}} for n in proposers]
    data["rl"]["stage"]["checkpoint_dir"] = str(out / "checkpoints" / path.stem)
    data.update(final_test=False, budgets={}, name=path.stem)
    return RunConfig.from_mapping(data, str(path))


# The proposers of the table: every built-in one except the test stand-in `scripted` and
# `gepa`, whose reflective search runs max_metric_calls (16) episodes of its own plus several
# reflection calls per round: at this budget one gepa round would cost more than a whole run.
# The proposer model's 320 new tokens fit the JSON answers the embedded model writes.
DEFAULT_PROPOSERS = "demos,harness,skills,rubrics"
DEFAULT_PROPOSER_MODEL = "{backend: embedded, max_tokens: 320}"


# --- one mode, budget-matched ----------------------------------------------------------------


def calibration(base: RunConfig, store: Any) -> tuple[float | None, Rates]:
    """The seed incumbent on the val split (outside any run, uncharged): the base model's val
    score and the cost rates a run plans its first round with."""
    from coevo.evaluate import evaluate
    from coevo.loop import build_parts, seed_incumbent

    cfg = RunConfig.from_mapping(base.model_dump(mode="json") | {"mode": "harness-only"})
    parts = build_parts(cfg)
    res = evaluate(store, parts.env, seed_incumbent(cfg, store).agent_assets(), parts.backend,
                   tasks=parts.env.tasks("val", cfg.splits.val_n), split="val",
                   samples=cfg.splits.val_samples, seed=10_000, judge=parts.judge or parts.backend)
    del parts
    gc.collect()
    return res.mean, calibrate(res, CALL_GUESS)


def calibrated(base: RunConfig, store: Any, out: Path) -> tuple[float | None, Rates]:
    """`calibration`, once per --out and config: kept in `calibration.json` there, so every
    invocation sharing an --out (--run-seeds parts, a rebuild) plans on the same rates and
    gives its runs the same budget, and a rebuild does not evaluate the val split again."""
    path = out / "calibration.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    config = json.dumps(base.model_dump(mode="json", exclude=_SET_BY_BENCH), sort_keys=True)
    if (k := kept.get(base.env)) and k["config"] == config:
        return k["base_val"], Rates(**k["rates"])
    base_val, rates = calibration(base, store)
    kept[base.env] = {"config": config, "base_val": base_val, "rates": asdict(rates)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept, indent=1))
    tmp.replace(path)  # a bench killed while writing leaves the old file whole
    return base_val, rates


def variant(base: RunConfig, label: str) -> tuple[RunConfig, str]:
    """A --modes label as (the config it runs, the loop mode): a loop mode as it is, or a
    VARIANTS label's loop mode with its settings merged into the config's blocks."""
    loop_mode, overrides = VARIANTS.get(label, (label, {}))
    data = base.model_dump(mode="json")
    for key, value in overrides.items():
        data[key] = {**(data.get(key) or {}), **value}
    return RunConfig.from_mapping(data), loop_mode


def run_mode(base: RunConfig, mode: str, seed: int, budget: float, store: Any, *,
             rates: Rates, base_val: float | None) -> dict[str, Any]:
    """Rounds of `mode` while the next one fits in `budget` tokens; then the test split."""
    from coevo.loop import build_parts, run_coevolution

    name = f"{base.name}-{mode}-s{seed}"
    # A bench stopped mid-run leaves that run in the store, unfinished and out of the ledger:
    # start over under a new name (the leftover stays auditable, never counted).
    taken = {r.name for r in store.runs()}
    k = 1
    while name in taken:
        name, k = f"{base.name}-{mode}-s{seed}-retry{k}", k + 1
    base, loop_mode = variant(base, mode)  # what rounds are planned with
    data = base.model_dump(mode="json")
    data.update(name=name, mode=loop_mode, seed=seed)
    data["rl"]["stage"]["seed"] = seed
    data["rl"]["stage"]["checkpoint_dir"] = str(Path(data["rl"]["stage"]["checkpoint_dir"]) / name)
    t0 = time.perf_counter()
    parts = build_parts(RunConfig.from_mapping(data))
    if plan_round(base, loop_mode, rates, budget) is None:
        raise CoevoError(f"--budget {budget:g}: not even one {mode} round of {base.name} fits "
                         f"(costs per unit: {rates})")
    spent, rounds, tail, curve = 0.0, 0, 0, [(0.0, base_val)]
    run_id = None
    while (plan := plan_round(base, loop_mode, rates, budget - spent, rounds)) is not None:
        if tail and not plan.tail:  # once RL-only, the rest of the run stays RL-only
            plan = replace(plan, tail=True, rollouts=None)
        tail += plan.tail
        data.update(rounds=rounds + 1,
                    budgets={"rollouts": max(plan.rollouts, 1)} if plan.rollouts else {})
        cfg = RunConfig.from_mapping(data)
        res = run_coevolution(cfg, store, parts=replace(parts, proposers=[]) if plan.tail else parts,
                              resume=run_id, progress=lambda m, n=name: _say(f"  {n}: {m}"))
        run_id = res.run
        summary = store.get_round(run_id, rounds).summary
        if rounds == 0 and isinstance(summary.get("val_start_score"), (int, float)):
            curve[0] = (0.0, float(summary["val_start_score"]))  # the loop's own round-0 score
        spent += cost(store.budget_totals(run_id, round=rounds))
        rates = rates.update(measured(store, run_id, rounds, trains(base, loop_mode, rounds)))
        curve.append((spent, summary.get("val_score")))
        rounds += 1
        _say(f"  {name}: round {rounds - 1}{' (RL-only tail)' if plan.tail else ''} done, "
             f"spent {spent:.0f}/{budget:g} tokens, val {_f(summary.get('val_score'))}")
    final = final_tests(store, run_id, cfg, parts, seed)
    del parts
    gc.collect()
    return record(store, base, mode, seed, run_id, tail, curve, final, time.perf_counter() - t0)


def record(store: Any, base: RunConfig, mode: str, seed: int, run_id: str, tail: int,
           curve: list, tests: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A finished run as the ledger and the page keep it."""
    totals = store.budget_totals(run_id)
    return {"env": base.env, "config": base.name, "mode": mode, "seed": seed, "run": run_id,
            "rounds": len(curve) - 1, "tail_rounds": tail, "curve": curve, "spent": totals,
            "cost": cost(totals), "proposals": proposal_counts(store, run_id),
            "proposer_stats": proposer_docs(store, run_id), "tests": tests,
            "seed_test": seed_test(store, run_id, base.env), "seconds": seconds}


def recovered(store: Any, base: RunConfig, mode: str, seed: int,
              base_val: float | None) -> dict[str, Any] | None:
    """The ledger record of a run of (mode, seed) that finished in the store, final tests
    included, but never reached the ledger (the bench died after its last test: 100 minutes of
    BFCL not redone), rebuilt from what the store holds; None when there is no such run. A run
    stopped earlier is not finished: it is started over under a new name, as before."""
    from coevo.envs.registry import make_env
    from coevo.evaluate import task_outcomes

    specs = [base.env, *EXTRA_TEST.get(base.env, [])]
    name = f"{base.name}-{mode}-s{seed}"
    names = {name} | {f"{name}-retry{k}" for k in range(1, 10)}
    for run in reversed([r for r in store.runs() if r.name in names]):
        rounds = [r for r in store.rounds(run.id) if r.status == "done"]
        start = ((rounds[0].summary.get("evaluations") or {}).get("test_start") if rounds else None)
        last_round_end = max((r.ended_at for r in rounds if r.ended_at), default=None)
        evals = [store.get_evaluation(e) for e in store.evaluation_ids(run.id, "test") if e != start]
        final = {e.env: e for e in evals if last_round_end and e.created_at >= last_round_end}
        if not rounds or set(final) != set(specs):
            continue
        tests = {}
        for spec in specs:
            ev, sm = final[spec], final[spec].summary
            tests[spec] = {"mean": sm.get("mean"), "ci": [sm.get("ci_low"), sm.get("ci_high")],
                           "n": sm.get("n_tasks"), "tasks": task_outcomes(ev),
                           "criteria": sm.get("criteria", {}),
                           "details": test_details(store, make_env(spec), ev.id),
                           "evaluation": ev.id, "infra_failures": sm.get("n_infra_failures")}
        curve, spent = [(0.0, rounds[0].summary.get("val_start_score", base_val))], 0.0
        for r in rounds:
            spent += cost(store.budget_totals(run.id, round=r.index))
            curve.append((spent, r.summary.get("val_score")))
        # RL-only tail rounds (gated, ungated) are the ones run without proposers
        tail = (sum(1 for r in rounds if not store.proposals(run.id, round=r.index))
                if variant(base, mode)[1] in ("gated", "ungated") else 0)
        seconds = (max(e.created_at for e in final.values()) - run.created_at).total_seconds()
        return record(store, base, mode, seed, run.id, tail, curve, tests, seconds)
    return None


def final_tests(store: Any, run_id: str, cfg: RunConfig, parts: Any, seed: int) -> dict[str, Any]:
    """The last incumbent on the test split of the run's env and of its EXTRA_TEST envs, once."""
    from coevo.envs.registry import make_env
    from coevo.evaluate import evaluate
    from coevo.loop import restore_incumbent

    last = max(r.index for r in store.rounds(run_id) if r.status == "done")
    inc = restore_incumbent(store, store.get_round(run_id, last).summary["incumbent"])
    out = {}
    for spec in [cfg.env, *EXTRA_TEST.get(cfg.env, [])]:
        env = parts.env if spec == cfg.env else make_env(spec)
        res = evaluate(store, env, inc.agent_assets(), parts.backend,
                       tasks=env.tasks("test", cfg.splits.test_n), split="test",
                       samples=cfg.splits.test_samples, seed=seed, checkpoint=inc.checkpoint,
                       run=run_id)
        out[spec] = {"mean": res.mean, "ci": [res.ci_low, res.ci_high], "n": res.n_tasks,
                     "tasks": {t.task_id: t.outcome for t in res.tasks if t.outcome is not None},
                     "criteria": res.criteria, "details": test_details(store, env, res.evaluation),
                     "evaluation": res.evaluation, "infra_failures": res.n_infra_failures}
        _say(f"  final {spec}: {res.line()}")
    return out


def seed_test(store: Any, run_id: str, env: str) -> dict[str, Any] | None:
    """The seed incumbent (seed assets, base model) on the test split, as round 0 scored it
    when the config has `splits.seed_test`: the same test tasks and sampling seeds as the
    final test, so the two pair per task. Per task the mean outcome of its scored episodes."""
    from coevo.evaluate import task_outcomes

    ev = (store.get_round(run_id, 0).summary.get("evaluations") or {}).get("test_start")
    if not ev:
        return None
    tasks = task_outcomes(store.get_evaluation(ev))
    return {env: {"mean": sum(tasks.values()) / len(tasks) if tasks else None, "tasks": tasks,
                  "evaluation": ev}}


def test_details(store: Any, env: Any, evaluation: str) -> dict[str, float]:
    """Mean Score.details (the env's partial credit) over the evaluation's scored episodes,
    re-scored from the stored answers by the environment's own verifier."""
    from coevo.envs.base import Response

    tasks = {t.id: t for t in env.tasks("test")}
    sums: dict[str, list[float]] = {}
    for tr in store.trajectories(evaluation=evaluation):
        if tr.infra_failed or tr.outcome is None or not tr.turns or tr.task_id not in tasks:
            continue
        last = tr.turns[-1]
        resp = Response(text=tr.answer or "", tool_calls=list(last.tool_calls),
                        all_tool_calls=[list(t.tool_calls) for t in tr.turns],
                        parse_error=last.parse_error)
        task = tasks[tr.task_id]
        for k, v in env.score(task, env.start(task), resp).details.items():
            sums.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sorted(sums.items())}


def proposal_counts(store: Any, run_id: str) -> dict[str, int]:
    """accepted / rejected / invalid, and how many rejections were the budget's, not the gate's."""
    out = {"accepted": 0, "rejected": 0, "invalid": 0, "pending": 0, "budget": 0}
    for p in store.proposals(run_id):
        out[p.status] = out.get(p.status, 0) + 1
        if p.status == "rejected" and any(d.policy == "budget" for d in store.decisions(p.id)):
            out["budget"] += 1
    return out


def proposer_docs(store: Any, run_id: str) -> list[dict[str, Any]]:
    """Per proposer: proposals, invalid, gated (compared by the gate or a peer mode's val-mean
    rule), accepted and mean deltas (`coevo proposals stats`, coevo/proposer_stats.py)."""
    from coevo.proposer_stats import proposer_stats

    return [s.doc() for s in proposer_stats(store, run_id)]


# --- driver ------------------------------------------------------------------------------------


def estimate(bases: list[RunConfig], seeds: int, units: float) -> float:
    """Seconds the whole bench should take on a quiet 2-core machine (rough: SEC_PER_UNIT)."""
    return sum(seeds * len(MODE_ORDER) * units * SEC_PER_UNIT.get(b.env.split(":")[0], 2.0)
               for b in bases)


_SET_BY_BENCH = {"name", "mode", "seed", "rounds", "budgets", "final_test"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="smoke run: 1 env, 1 seed, tiny sizes")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per env (default 2; small 1)")
    ap.add_argument("--run-seeds", default=None,
                    help="comma list of the seeds this invocation may run (default: all of "
                         "--seeds), or none; the others are taken from --out's ledger or --reuse "
                         "when done there, else left out and listed on the page as not run: two "
                         "processes sharing one --out can run different seeds")
    ap.add_argument("--envs", default=None, help="training/bench config names or .yaml paths "
                    "(default bfcl,arithmetic; small arithmetic)")
    ap.add_argument("--budget", type=float, default=None, help="per (env, seed) and mode, in "
                    "seed-incumbent val episodes' worth of model tokens, fixed per env before any "
                    "mode runs (default 320; small 100)")
    ap.add_argument("--budget-tokens", type=float, default=None,
                    help="the budget in model tokens instead, the same for every env")
    ap.add_argument("--proposers", default=DEFAULT_PROPOSERS, help="comma list (default: %(default)s)")
    ap.add_argument("--proposer-model", default=DEFAULT_PROPOSER_MODEL,
                    help="backend spec or ProposerModel mapping in YAML (default: %(default)s)")
    ap.add_argument("--null-env", default="arithmetic",
                    help="--envs entry the false-accept check runs on (default: %(default)s)")
    ap.add_argument("--model", default=None, help="policy backend spec (default: the config's)")
    ap.add_argument("--null-n", type=int, default=200, help="null candidates (default: %(default)s)")
    ap.add_argument("--null-draws", type=int, default=None,
                    help="real samples of each val task the null check draws from (default 8; small 4)")
    ap.add_argument("--name", default=None,
                    help="the data set's name on the page (default: --envs)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--results", type=Path, default=REPO / "docs" / "RESULTS.md")
    ap.add_argument("--data", type=Path, action="append", default=None,
                    help=f"the page's data JSON (default {DATA.relative_to(REPO)}; --small: in "
                         "--out); with --report-only it may be given again: one page, a section "
                         "per data set")
    ap.add_argument("--modes", default=",".join(MODE_ORDER),
                    help="modes to run first, in this order; the four co-evolution modes "
                         "always run after them (the table compares them); opt-in peer "
                         f"methods: {', '.join(PEER_MODES)}")
    ap.add_argument("--only", action="store_true",
                    help="run only the --modes given (the page then has only their rows and "
                         "their pairings with the seed incumbent)")
    ap.add_argument("--reuse", type=Path, action="append", default=None,
                    help="a data file an earlier bench wrote (may be given again): its finished "
                         "runs count as done, as the --out ledger's do, when it has the same "
                         "budget and config for the env; for a data set whose --out is gone")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild RESULTS.md from --data; run nothing")
    a = ap.parse_args(argv)
    if a.report_only:
        data = a.data or [DATA]
        reports = [load_data(d) for d in data]
        for rep, d in zip(reports, data):
            stored = str(rep.get("data", ""))
            if stored.startswith("<") or Path(stored).is_absolute():  # an --out path: not
                rep["data"] = data_name(Path(d))  # rerunnable, so name the file read
        path = write_results(reports, a.results)
        _say(f"rebuilt {path} from {', '.join(map(str, data))}")
        return reports[0] if len(reports) == 1 else reports
    if a.data and len(a.data) > 1:
        raise CoevoError("--data: a run writes one data file (several only with --report-only)")
    seeds = a.seeds or (1 if a.small else 2)
    allowed = set(range(seeds)) if a.run_seeds is None else _seed_list(a.run_seeds, seeds)
    units = a.budget or (100 if a.small else 320)
    draws = a.null_draws or (4 if a.small else 8)
    envs = (a.envs or ("arithmetic" if a.small else "bfcl,arithmetic")).split(",")
    proposers = a.proposers.split(",")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = (a.out or REPO / "bench" / "out" / "coevolution" / stamp).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_path = a.data[0] if a.data else (out / "coevolution.json" if a.small else DATA)
    from coevo.store import Store

    store = Store.open(f"sqlite:///{out / 'bench.db'}")
    bases = [base_config(e, a.small, out, a.model, proposers, a.proposer_model) for e in envs]
    order = a.modes.split(",")
    unknown = sorted(set(order) - set(MODE_ORDER) - set(PEER_MODES))
    if unknown:
        raise CoevoError(f"--modes: unknown {', '.join(unknown)}; known: "
                         f"{', '.join(MODE_ORDER + PEER_MODES)}")
    if not a.only:
        order += [m for m in MODE_ORDER if m not in order]  # the table needs all four
    est = estimate(bases, seeds, units) * len(order) / len(MODE_ORDER)
    _say(f"[bold]coevolution bench[/bold]: envs {', '.join(b.env for b in bases)}; {seeds} seed(s); "
         f"budget {a.budget_tokens or units:g} {'tokens' if a.budget_tokens else 'val-episode units'}"
         f" per mode; proposers {', '.join(proposers)}; out {out}; estimate ~{est / 60:.0f} min")
    t0 = time.perf_counter()
    # Finished (env, seed, mode) runs are appended to runs.jsonl as they end, so a bench that
    # was stopped (or is re-run with more seeds into the same --out) redoes none of them.
    ledger = out / "runs.jsonl"
    done = {}
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            r = json.loads(line)
            done[(r["env"], r["seed"], r["mode"])] = r
    runs, base_vals, rates, budgets, reused, missing = [], {}, {}, {}, 0, []
    for b in bases:
        base_vals[b.env], rates[b.env] = calibrated(b, store, out)
        # The budget is fixed per env here, before any mode runs: every mode gets the same.
        budgets[b.env] = a.budget_tokens or round(units * rates[b.env].eval)
        _say(f"{b.env}: seed incumbent val score {_f(base_vals[b.env])}; first estimates "
             f"{rates[b.env]}; budget {budgets[b.env]:g} model tokens per mode")
        for path in a.reuse or []:
            for r in reusable(path, b, budgets[b.env], out):
                done.setdefault((b.env, r["seed"], r["mode"]), r)
        for seed in range(seeds):
            for mode in order:
                if (b.env, seed, mode) in done:
                    r = done[(b.env, seed, mode)]
                    if "reused_from" not in r:  # else its store is another bench's: kept as is
                        if "seed_test" not in r:  # a ledger written before runs kept it
                            r["seed_test"] = seed_test(store, r["run"], b.env)
                        r["proposer_stats"] = proposer_docs(store, r["run"])  # from the store
                    runs.append(r)
                    reused += 1
                    _say(f"[bold]{b.name}[/bold] seed {seed} mode {mode}: done before, reused")
                    continue
                if seed not in allowed:
                    _say(f"[bold]{b.name}[/bold] seed {seed} mode {mode}: not in --run-seeds, left out")
                    missing.append(f"{b.env} seed {seed} {mode}")
                    continue
                if (r := recovered(store, b, mode, seed, base_vals[b.env])) is not None:
                    _say(f"[bold]{b.name}[/bold] seed {seed} mode {mode}: finished in the "
                         f"store (run {r['run']}) but not in the ledger: recovered")
                    runs.append(r)
                else:
                    _say(f"[bold]{b.name}[/bold] seed {seed} mode {mode}")
                    runs.append(run_mode(b, mode, seed, budgets[b.env], store, rates=rates[b.env],
                                         base_val=base_vals[b.env]))
                with ledger.open("a") as f:
                    f.write(json.dumps(runs[-1], default=str) + "\n")
    null = None
    if a.null_n:
        null_base = next((b for b, e in zip(bases, envs) if e == a.null_env), bases[-1])
        outcomes_file = out / "null_outcomes.json"
        if not outcomes_file.exists():
            outcomes_file.write_text(json.dumps(collect(null_base, store, draws)))
        outcomes = json.loads(outcomes_file.read_text())
        null = simulate(outcomes, null_base.gate, a.null_n) | {"outcomes": outcomes["tasks"]}
        _say(f"null check: {null['accepted']}/{null['n']} accepted (95% upper bound {_f(null['upper95'])})")
    report = {"name": a.name or ",".join(envs),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "command": stored_command(argv if argv is not None else sys.argv[1:]),
              "small": a.small, "seeds": len({r["seed"] for r in runs}) or seeds,  # present ones
              "seeds_declared": seeds,
              "budget": budgets,
              "budget_units": None if a.budget_tokens else units,
              "proposers": proposers, "proposer_model": a.proposer_model,
              "machine": machine(), "seconds": time.perf_counter() - t0, "estimate_s": est,
              "reused": reused,
              "configs": {b.env: b.model_dump(mode="json", exclude=_SET_BY_BENCH) for b in bases},
              "base_val": base_vals, "runs": runs, "missing": missing, "null": null,
              "data": data_name(data_path)}
    report = portable(report, out)
    write_data(report, data_path)
    path = write_results(report, a.results)
    _say(f"done in {report['seconds'] / 60:.1f} min (estimate {est / 60:.0f}); wrote {path} and {data_path}")
    return report


def reusable(path: Path, base: RunConfig, budget: float, out: Path) -> list[dict[str, Any]]:
    """The finished runs of `base.env` in the data file at `path` (an earlier bench's), each
    marked `reused_from`, after checking that they ran on this budget and this config: a data
    set extended with more seeds stays one budget and one config."""
    if not Path(path).is_file():
        raise CoevoError(f"--reuse: no data file {path}")
    data = load_data(path)
    name = data_name(Path(path))
    theirs_budget = (data.get("budget") or {}).get(base.env)
    if theirs_budget != budget:
        raise CoevoError(f"--reuse {name}: budget.{base.env} is {theirs_budget}, "
                         f"this bench's is {budget:g}")
    ours = portable({"c": base.model_dump(mode="json", exclude=_SET_BY_BENCH)}, out)["c"]
    theirs = (data.get("configs") or {}).get(base.env)
    if theirs != ours:
        keys = sorted(k for k in set(ours) | set(theirs or {}) if (theirs or {}).get(k) != ours.get(k))
        raise CoevoError(f"--reuse {name}: configs.{base.env} differs from this bench's config "
                         f"in {', '.join(keys) or 'every key'}")
    return [{**r, "reused_from": r.get("reused_from", name)}
            for r in data.get("runs", []) if r.get("env") == base.env]


def _seed_list(text: str, seeds: int) -> set[int]:
    """--run-seeds as a set of seeds, each one of range(seeds); `none`: run no seed (the data
    set is rebuilt from the ledger and --reuse files; its page lists the runs not yet done)."""
    if text.strip() == "none":
        return set()
    try:
        out = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise CoevoError(f"--run-seeds: expected a comma list of integers, got {text!r}") from None
    if not out or not out <= set(range(seeds)):
        raise CoevoError(f"--run-seeds: {text!r} must name seeds among 0..{seeds - 1} (--seeds {seeds})")
    return out


def machine() -> str:
    import torch

    return (f"{platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), Python {platform.python_version()}")


if __name__ == "__main__":
    try:
        main()
    except CoevoError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
