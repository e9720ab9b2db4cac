"""The co-evolution table: weight-only vs harness-only vs ungated vs gated at an equal budget.

For every environment (a training/bench/<name>.yaml base config) and seed, each of the four
modes of coevo.loop.MODES runs from the same seed assets and a freshly loaded base model
(`build_parts`; the embedded loader reads its dequantized cache, ~1 s) until an equal total
budget is spent, then its final incumbent (assets + checkpoint) is evaluated once on the test
split (and on the extra test environments, e.g. bfcl:multiple for bfcl:simple_python).

Budget matching. The cost of a run is what the loop charges with `store.add_budget`: every
rollout (RL, harness-only train rollouts, gate arms) counts 1 and every proposer call counts
`proposer_call_cost` rollouts. The loop's own budgets are per round, so the bench drives the
total itself through the loop's resume path (`run_coevolution(resume=RUN)` may change only
`rounds` and `budgets`): it runs round r, reads the spend, and starts round r + 1 only when its
worst-case cost still fits in what is left. Worst case of a round: RL rollouts (steps x tasks x
G, fixed), harness-only train rollouts, one call per proposer and, in gated modes, 2 x val_n x
val_samples for one candidate; for the gate the round's `budgets.rollouts` is set to what is
left minus those reserves, so the loop rejects ("round budget exhausted") any candidate it
cannot afford and a round never overshoots. Modes therefore spend the budget differently
(weight-only: more RL steps; harness-only: more gate comparisons) and may leave a remainder
smaller than one round; the table reports what each actually spent.

RL-only tail. A gated round reserves a whole gate evaluation it rarely spends (the sequential
gate stops early), so with rounds alone gated runs ended with ~40% of the budget unused. When a
full round no longer fits but one RL stage does, a mode that trains (gated, ungated) spends
the rest on rounds without proposals (the same RL stage, `Parts.proposers` empty): leftover
budget buys weight updates, as it does for weight-only. Harness-only cannot train, so its
remainder stays unspent. Tail rounds are marked in the curve and counted in `tail_rounds`.

Departure from the loop: runs are configured with `final_test: false` and the bench evaluates
the test split itself after the last round (`coevo.evaluate.evaluate`, same split, seed and
checkpoint as the loop's final step), because the loop's final step would otherwise run after
every resumed round. Partial credit on the test split is re-derived from the stored test
trajectories with the environment's own verifier (`env.score`), whose `Score.details` the
trajectory rows do not keep (for BFCL: decodes, name_offered, name_correct, required_args,
args_correct).

Validation curve. When the loop's round summaries carry `val` ({"mean", "n"}) or `val_score`,
that is used; otherwise the bench scores the round-end incumbent on the first `monitor_n` val
tasks itself (greedy is not forced: the harness's decoding with a fixed seed), stored outside
the run and NOT charged to its budget (it informs no decision). RESULTS.md says which.

False-accept check. A null candidate changes only `demos[i].source` (metadata the runtime never
renders; checked here: same system message and demo messages, admissible by check_candidate).
It is gated with `coevo.gate.compare` (which calls `decide`) on real embedded-model rollouts,
N times with different gate seeds, in two variants: "paired" seeds (the gate's contract: both
arms sample with the same seeds, so the samples are identical and every pair is a tie) and
"independent" seeds (the candidate arm samples with other seeds: a revision that changes the
samples but not their distribution), which is the case the gate's alpha must cover.

    python bench/coevolution.py [--small] [--seeds 2] [--envs bfcl,arithmetic] [--budget N]
        [--out DIR] [--proposers demos,...] [--results docs/RESULTS.md]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from coevo.config import RunConfig  # noqa: E402
from coevo.errors import CoevoError  # noqa: E402

MODE_ORDER = ("weight-only", "harness-only", "ungated", "gated")
BENCH_CONFIGS = REPO / "training" / "bench"
EXTRA_TEST = {"bfcl:simple_python": ["bfcl:multiple"]}  # final test also on these envs
# Rough seconds per rollout on 2 cores (FACTS.md + the quickstart): RL rollouts include their
# share of the GRPO update; eval rollouts are generation only. Only for the up-front estimate.
SEC_RL = {"bfcl": 1.6, "rg": 1.5}
SEC_EVAL = {"bfcl": 0.9, "rg": 0.7}
SEC_PROPOSER = 30.0  # an LLM proposer call on the embedded model (a few hundred new tokens)
SMALL = {  # --small: the pipeline end to end, not the numbers
    "rl": {"stage": {"steps": 1, "tasks_per_step": 2, "samples": 2, "checkpoint_every": 1}},
    "splits": {"train_n": 2, "train_samples": 2, "val_n": 4, "test_n": 4},
    "gate": {"screen_size": 4, "chunk_size": 4, "n_boot": 200},
}


def _say(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False).print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}")


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def base_config(name: str, small: bool, out: Path, model: str | None,
                proposers: list[str], proposer_model: str) -> RunConfig:
    """training/bench/<name>.yaml (or a path), with --small sizes, --model and --proposers."""
    path = Path(name) if name.endswith(".yaml") else BENCH_CONFIGS / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in BENCH_CONFIGS.glob("*.yaml")))
        raise CoevoError(f"--envs: {name!r}: no {path} (known: {known})")
    data = RunConfig.load(path).model_dump(mode="json")
    if small:
        data = _merge(data, SMALL)
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


def cost(spent: dict[str, float], proposer_call_cost: int) -> float:
    """Rollout-equivalents of a budget_totals dict."""
    return spent.get("rollouts", 0.0) + proposer_call_cost * spent.get("proposer_calls", 0.0)


def round_reserve(cfg: RunConfig, mode: str, proposer_call_cost: int) -> tuple[int, int]:
    """(fixed cost of a round, worst-case cost of one gated candidate) for `mode`."""
    from coevo.loop import MODES

    m, st, sp = MODES[mode], cfg.rl.stage, cfg.splits
    fixed = st.steps * st.tasks_per_step * st.samples if m.train else 0
    if m.propose:
        fixed += proposer_call_cost * len(cfg.proposers)
        if not m.train:
            fixed += (sp.train_n or 16) * sp.train_samples
    gate = 2 * (sp.val_n or 40) * sp.val_samples if m.propose and m.gated else 0
    return fixed, gate


def rl_cost(cfg: RunConfig) -> int:
    """Rollouts of one RL stage (steps x tasks x G): the fixed cost of an RL-only round."""
    st = cfg.rl.stage
    return st.steps * st.tasks_per_step * st.samples


def _val_from_summary(summary: dict[str, Any]) -> float | None:
    v = summary.get("val")
    if isinstance(v, dict) and isinstance(v.get("mean"), (int, float)):
        return float(v["mean"])
    v = summary.get("val_score")
    return float(v) if isinstance(v, (int, float)) else None


def monitor(store: Any, env: Any, inc: Any, backend: Any, n: int) -> float | None:
    """The incumbent's mean outcome on the first n val tasks: outside the run, not charged.
    One fixed sampling seed for every mode, seed and round, so the points are comparable."""
    from coevo.evaluate import evaluate

    res = evaluate(store, env, inc.agent_assets(), backend, tasks=env.tasks("val", n),
                   split="val", seed=10_000, checkpoint=inc.checkpoint)
    return res.mean


def run_mode(base: RunConfig, mode: str, seed: int, budget: int, store: Any, *,
             proposer_call_cost: int, monitor_n: int, base_val: float | None) -> dict[str, Any]:
    """Rounds of `mode` until the next one could overshoot `budget`; then the test split.
    base_val: the base model's val score (None: taken from round 0, or monitored)."""
    from coevo.loop import MODES, build_parts, restore_incumbent, run_coevolution, seed_incumbent

    name = f"{base.name}-{mode}-s{seed}"
    # A bench stopped mid-run leaves that run in the store, unfinished and out of the ledger:
    # start over under a new name (the leftover stays auditable, never counted).
    taken = {r.name for r in store.runs()}
    k = 1
    while name in taken:
        name, k = f"{base.name}-{mode}-s{seed}-retry{k}", k + 1
    data = base.model_dump(mode="json")
    data.update(name=name, mode=mode, seed=seed)
    data["rl"]["stage"]["seed"] = seed
    data["rl"]["stage"]["checkpoint_dir"] = str(Path(data["rl"]["stage"]["checkpoint_dir"]) / name)
    t0 = time.perf_counter()
    parts = build_parts(RunConfig.from_mapping(data))
    fixed, gate = round_reserve(base, mode, proposer_call_cost)
    if fixed + gate > budget:
        raise CoevoError(f"--budget {budget}: one {mode} round of {base.name} needs up to "
                         f"{fixed + gate} rollout-equivalents")
    spent, rounds, curve, source = 0.0, 0, [(0.0, base_val)], "bench monitor (uncharged)"
    if base_val is None and not base.splits.track_val:
        base_val = monitor(store, parts.env, seed_incumbent(base, store), parts.backend, monitor_n)
        curve = [(0.0, base_val)]
    run_id, props = None, proposer_call_cost * len(base.proposers) * MODES[mode].propose
    rl_stage, tail = rl_cost(base) if MODES[mode].train else 0, 0
    while True:
        if spent + fixed + gate <= budget:
            round_parts = parts
        elif MODES[mode].propose and rl_stage and spent + rl_stage <= budget:
            round_parts, tail = replace(parts, proposers=[]), tail + 1  # the RL-only tail
        else:
            break
        # The loop rejects a candidate once the round's rollouts (RL / train rollouts and gate
        # arms; not proposer calls) reach budgets.rollouts; one candidate costs at most `gate`
        # more, so this cap keeps the whole round within what is left.
        cap = int(budget - spent - gate - props)
        data.update(rounds=rounds + 1,
                    budgets={"rollouts": max(cap, 1)} if gate and not tail else {})
        cfg = RunConfig.from_mapping(data)
        res = run_coevolution(cfg, store, parts=round_parts, resume=run_id,
                              progress=lambda m, n=name: _say(f"  {n}: {m}"))
        run_id = res.run
        summary = store.get_round(run_id, rounds).summary
        if rounds == 0 and isinstance(summary.get("val_start_score"), (int, float)):
            curve[0] = (0.0, float(summary["val_start_score"]))  # the loop's own round-0 score
        spent += cost(store.budget_totals(run_id, round=rounds), proposer_call_cost)
        val = _val_from_summary(summary)
        if val is not None:
            source = "loop round summaries (val_score: whole val split, uncharged eval_rollouts)"
        else:
            inc = restore_incumbent(store, summary["incumbent"])
            val = monitor(store, parts.env, inc, parts.backend, monitor_n)
        curve.append((spent, val))
        rounds += 1
        _say(f"  {name}: round {rounds - 1}{' (RL-only tail)' if tail else ''} done, "
             f"spent {spent:g}/{budget}, val {_f(val)}")
    final = final_tests(store, run_id, cfg, parts, seed)
    out = {"env": base.env, "config": base.name, "mode": mode, "seed": seed, "run": run_id,
           "rounds": rounds, "tail_rounds": tail, "curve": curve, "curve_source": source,
           "spent": store.budget_totals(run_id), "cost": cost(store.budget_totals(run_id),
                                                               proposer_call_cost),
           "proposals": proposal_counts(store, run_id), "tests": final,
           "seconds": time.perf_counter() - t0}
    del parts
    gc.collect()
    return out


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


# --- the false-accept check ------------------------------------------------------------------


def null_candidate(harness: Any, k: int) -> Any:
    """A harness child that differs only in demo provenance (`demos[i].source`), which the
    runtime never renders; raises CoevoError if that would not hold for this harness."""
    from coevo.propose.base import Candidate

    if not harness.demos:
        raise CoevoError(f"harness {harness.name}: the null candidate needs a demo to relabel")
    demos = [d.model_copy(update={"source": f"null-{k}:{d.source or ''}"}) for d in harness.demos]
    child = harness.child(demos=demos)
    if (child.render_system() != harness.render_system()
            or child.demo_messages() != harness.demo_messages()):
        raise CoevoError("null candidate: demo source changed what the model sees")
    return Candidate(asset=child, proposer="null", kind="harness")


def false_accepts(base: RunConfig, store: Any, n: int) -> dict[str, Any]:
    """Gate N null candidates per variant (paired / independent seeds) on the base model."""
    from coevo.evaluate import evaluate
    from coevo.gate import compare
    from coevo.loop import build_parts, seed_incumbent
    from coevo.propose.base import check_candidate

    data = base.model_dump(mode="json") | {"mode": "harness-only", "name": f"{base.name}-null"}
    cfg = RunConfig.from_mapping(data)
    parts = build_parts(cfg)
    inc = seed_incumbent(cfg, store)
    val = parts.env.tasks("val", cfg.splits.val_n)
    out: dict[str, Any] = {"env": base.env, "policy": cfg.gate.model_dump(), "n": n, "variants": {}}
    for variant, offset in (("paired", 0), ("independent", 7919)):
        rows = []
        for k in range(n):
            cand = null_candidate(inc.harness, k)
            why = check_candidate(cand, inc)
            if why:
                raise CoevoError(f"null candidate is not admissible: {why}")
            arms = {"incumbent": inc, "candidate": inc.with_candidate(cand)}

            def run_arm(arm, tasks, seeds, _k=k):
                s = 20_000 + 97 * _k + (offset if arm == "candidate" else 0)
                res = evaluate(store, parts.env, arms[arm].agent_assets(), parts.backend,
                               tasks=tasks, split="val", seed=s)
                by = {t.task_id: t for t in res.tasks}
                return [None if by[t.id].outcome is None else
                        {"outcome": by[t.id].outcome,
                         "partial": by[t.id].reward if 0 <= (by[t.id].reward or 0) <= 1 else None}
                        for t in tasks]

            pol = cfg.gate.model_copy(update={"seed": k})
            ev, d = compare(run_arm, val, pol, seed=k)
            differ = sum(1 for p in ev.pairs if p.status == "ok" and p.incumbent != p.candidate)
            rows.append({"accepted": d.accepted, "rollouts": d.rollouts, "pairs": len(ev.pairs),
                         "differing": differ, "reason": d.reason})
            _say(f"  null {variant} #{k}: {'ACCEPT' if d.accepted else 'reject'}, "
                 f"{differ}/{len(ev.pairs)} pairs differ, {d.rollouts} rollouts")
        acc = sum(r["accepted"] for r in rows)
        out["variants"][variant] = {"accepted": acc, "n": n, "rate": acc / n if n else None,
                                    "upper95": _cp_upper(acc, n), "rows": rows}
    parts = None  # free the model before the next env's (the closures are done with it)
    gc.collect()
    return out


def _cp_upper(k: int, n: int) -> float | None:
    """One-sided 95% Clopper-Pearson upper bound of a rate k/n."""
    if n == 0:
        return None
    from scipy import stats

    return 1.0 if k == n else float(stats.beta.ppf(0.95, k + 1, n - k))


def _f(x: float | None, d: int = 3) -> str:
    return "-" if x is None else f"{x:.{d}f}"


# --- docs/RESULTS.md and the plots ------------------------------------------------------------


def pooled(runs: list[dict[str, Any]], spec: str) -> tuple[float | None, list[float | None], Any]:
    """(seed-mean test score, per-seed scores, 95% t-interval over every seed's task results)."""
    from coevo.evaluate import t_interval

    tasks = [v for r in runs for v in r["tests"].get(spec, {}).get("tasks", {}).values()]
    per_seed = [r["tests"].get(spec, {}).get("mean") for r in runs]
    have = [x for x in per_seed if x is not None]
    return (sum(have) / len(have) if have else None), per_seed, t_interval(tasks)


def paired_diff(a: list[dict], b: list[dict], spec: str) -> tuple[float | None, Any, int]:
    """Mean of (a - b) over (seed, test task) pairs both scored, its 95% t-interval and n
    (t_interval clips to [0, 1], so the interval of the difference is computed here)."""
    import math

    from scipy import stats

    by_seed = {r["seed"]: r["tests"].get(spec, {}).get("tasks", {}) for r in b}
    d = [v - by_seed[r["seed"]][t] for r in a for t, v in r["tests"].get(spec, {}).get("tasks", {}).items()
         if t in by_seed.get(r["seed"], {})]
    if len(d) < 2:
        return (d[0] if d else None), (None, None), len(d)
    m = sum(d) / len(d)
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))
    h = float(stats.t.ppf(0.975, len(d) - 1)) * sd / math.sqrt(len(d))
    return m, (m - h, m + h), len(d)


def plot_curves(env: str, runs: list[dict[str, Any]], path: Path) -> Path:
    """Val score vs cumulative rollout-equivalents, one colour per mode, one line per seed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = dict(zip(MODE_ORDER, ("#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c")))
    for r in runs:
        pts = [(x, y) for x, y in r["curve"] if y is not None]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=colors[r["mode"]],
                    alpha=0.85, ls=("-", "--", ":", "-.")[r["seed"] % 4],
                    label=f"{r['mode']} (seed {r['seed']})")
    ax.set_xlabel("cumulative rollouts (proposer calls at their rollout cost)")
    ax.set_ylabel("val score (incumbent)")
    ax.set_title(env, fontsize="small")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def _slug(env: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in env.split("?")[0]).strip("-")


def write_results(rep: dict[str, Any], path: Path) -> Path:
    """Write docs/RESULTS.md (and one PNG per env next to it) from the bench's report dict."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pc = rep["proposer_call_cost"]
    lines = [
        "# Co-evolution benchmark: weight-only vs harness-only vs ungated vs gated",
        "", f"Generated by `bench/coevolution.py` on {rep['date']}; do not edit by hand. "
        f"Command: `{rep['command']}`" + (" (**--small smoke run: the numbers mean nothing**)" if rep["small"] else ""),
        "", f"- Machine: {rep['machine']}",
        f"- Wall time: {rep['seconds'] / 60:.1f} min (up-front estimate {rep['estimate_s'] / 60:.0f} min)",
        f"- Seeds: {rep['seeds']} (every seed's run is in the table); base model and seed assets as in each config below",
        f"- Budget: {rep['budget']} rollout-equivalents per (env, seed, mode): every rollout (RL, "
        f"harness-only train, gate arms) counts 1, every proposer call counts {pc}. A mode runs "
        "rounds while the next round's worst case still fits; after that, gated and ungated "
        "spend what is left on RL-only rounds (no proposals) while one RL stage fits, so a "
        "remainder smaller than a stage may be left; `spent` is what it actually used.",
        f"- Proposers: {', '.join(rep['proposers'])} (LLM proposers on `{rep['proposer_model']}`)",
        "- Test: the final incumbent (assets + checkpoint) once on the test split; 95% intervals "
        "are Student-t over every seed's per-task results pooled. Partial credit: the environment "
        "verifier's `Score.details` re-derived from the stored test answers.", ""]
    if rep.get("missing"):
        lines += ["**Not run** (out of time; the table holds only the runs that finished, "
                  "nothing was dropped): " + "; ".join(rep["missing"]) + ".", ""]
    for env in rep["configs"]:
        runs = [r for r in rep["runs"] if r["env"] == env]
        specs = list(dict.fromkeys(s for r in runs for s in r["tests"]))
        detail_keys = sorted({k for r in runs for k in r["tests"].get(env, {}).get("details", {})})
        lines += [f"## {env}", "", f"Base model val score: {_f(rep['base_val'].get(env))}", ""]
        head = ["mode", *(f"test {s.split('?')[0]} mean [95% CI]" for s in specs), "per seed",
                *detail_keys, "spent per seed", "val-tracking rollouts (uncharged)", "rounds", "accepted / rejected (budget) / invalid"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for mode in MODE_ORDER:
            mr = sorted((r for r in runs if r["mode"] == mode), key=lambda r: r["seed"])
            if not mr:
                continue
            cells = [mode]
            for s in specs:
                m, _, (lo, hi) = pooled(mr, s)
                cells.append(f"{_f(m)} [{_f(lo)}, {_f(hi)}]")
            cells.append(", ".join(_f(x) for x in pooled(mr, env)[1]))
            for k in detail_keys:
                v = [r["tests"][env]["details"].get(k) for r in mr if k in r["tests"].get(env, {}).get("details", {})]
                cells.append(_f(sum(v) / len(v)) if v else "-")
            pcount = [r["proposals"] for r in mr]
            cells += [", ".join(f"{r['cost']:g}" for r in mr),
                      ", ".join(f"{r['spent'].get('eval_rollouts', 0):g}" for r in mr),
                      ", ".join(str(r["rounds"]) + (f" ({r['tail_rounds']} RL-only)" if r.get("tail_rounds") else "")
                                for r in mr),
                      f"{sum(p['accepted'] for p in pcount)} / {sum(p['rejected'] for p in pcount)} "
                      f"({sum(p['budget'] for p in pcount)}) / {sum(p['invalid'] for p in pcount)}"]
            lines.append("| " + " | ".join(cells) + " |")
        png = plot_curves(env, runs, path.parent / f"coevolution-{_slug(env)}.png")
        src = sorted({r["curve_source"] for r in runs})
        lines += ["", f"![val score vs rollouts]({png.name})", "",
                  f"Val curve source: {', '.join(src)}; the first point of each line is the base "
                  "model at 0 rollouts.", ""]
        g, w = [r for r in runs if r["mode"] == "gated"], [r for r in runs if r["mode"] == "weight-only"]
        if g and w:
            d, (lo, hi), n = paired_diff(g, w, env)
            verdict = ("gated beats weight-only" if lo is not None and lo > 0 else
                       "weight-only beats gated" if hi is not None and hi < 0 else
                       "no difference resolved between gated and weight-only")
            lines += [f"**Gated - weight-only** on the test split: {_f(d)} (95% CI [{_f(lo)}, "
                      f"{_f(hi)}], {n} paired seed-task results): {verdict} at this budget.", ""]
    null = rep.get("null")
    lines += ["## False-accept check (null candidates)", ""]
    if null:
        lines += [f"Env {null['env']}, gate policy `{null['policy']['name']}` (alpha "
                  f"{null['policy']['alpha']}), base model on the val split; each null candidate "
                  "changes only `demos[i].source`, which the model never sees. `paired`: both arms "
                  "sample with the same seeds (the gate's contract); `independent`: the candidate "
                  "arm samples with other seeds (same distribution, different draws).", "",
                  "| variant | null candidates | accepted | accept rate | 95% upper bound | mean rollouts | pairs that differed |",
                  "|---|---|---|---|---|---|---|"]
        for name, v in null["variants"].items():
            rows = v["rows"]
            ro = sum(r["rollouts"] for r in rows) / len(rows) if rows else 0
            diff = f"{sum(r['differing'] for r in rows)}/{sum(r['pairs'] for r in rows)}"
            lines.append(f"| {name} | {v['n']} | {v['accepted']} | {_f(v['rate'])} | "
                         f"{_f(v['upper95'])} | {ro:.1f} | {diff} |")
        lines.append("")
    else:
        lines += ["Not run (--null-n 0).", ""]
    # Paths relative to the repository, so the page reads the same on any checkout.
    configs = json.dumps(rep["configs"], indent=1).replace(f"{REPO}/", "").replace(f'"{REPO}"', '"."')
    lines += ["## Configs", "", "```json", configs, "```", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# --- driver ------------------------------------------------------------------------------------


def estimate(bases: list[RunConfig], seeds: int, budget: int, pc: int, null_n: int) -> float:
    """Seconds the whole bench should take on a quiet 2-core machine (rough: SEC_* per rollout,
    SEC_PROPOSER per LLM proposer call, the loop's val tracking every round)."""
    from coevo.loop import MODES

    total = 0.0
    for b in bases:
        kind = b.env.split(":")[0]
        rl, ev = SEC_RL.get(kind, 1.5), SEC_EVAL.get(kind, 0.8)
        val = (b.splits.val_n or 40) * b.splits.val_samples
        llm = sum(p.name != "demos" for p in b.proposers) * SEC_PROPOSER
        tests = (1 + len(EXTRA_TEST.get(b.env, []))) * (b.splits.test_n or 100)
        for mode in MODE_ORDER:
            fixed, gate = round_reserve(b, mode, pc)
            rounds = max(1, int(budget // (fixed + gate)))
            st = b.rl.stage
            rl_n = rounds * st.steps * st.tasks_per_step * st.samples * MODES[mode].train
            other = rounds * (fixed + gate / 2 - pc * len(b.proposers) * MODES[mode].propose) - rl_n
            tail = 0
            if MODES[mode].train and MODES[mode].propose:  # the RL-only tail (module docstring)
                tail = max(0, int((budget - rounds * (fixed + gate / 2)) // rl_cost(b)))
            total += seeds * (rl_n * rl + max(other, 0) * ev + (rounds + tail + 1) * val * ev
                              + tail * rl_cost(b) * rl
                              + tests * ev + rounds * llm * MODES[mode].propose + 5)
    return total + 2 * null_n * 1.5 * (bases[-1].splits.val_n or 40) * SEC_EVAL.get(
        bases[-1].env.split(":")[0], 0.8)


_SET_BY_BENCH = {"name", "mode", "seed", "rounds", "budgets", "final_test"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="smoke run: 1 env, 1 seed, tiny sizes")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per env (default 2; small 1)")
    ap.add_argument("--envs", default=None, help="training/bench config names or .yaml paths "
                    "(default bfcl,arithmetic; small arithmetic)")
    ap.add_argument("--budget", type=int, default=None,
                    help="total rollout-equivalents per (env, seed) and mode (default 160; small 20)")
    ap.add_argument("--proposer-call-cost", type=int, default=8)
    ap.add_argument("--proposers", default=DEFAULT_PROPOSERS, help="comma list (default: %(default)s)")
    ap.add_argument("--proposer-model", default=DEFAULT_PROPOSER_MODEL,
                    help="backend spec or ProposerModel mapping in YAML (default: %(default)s)")
    ap.add_argument("--null-env", default="arithmetic",
                    help="--envs entry the false-accept check runs on (default: %(default)s)")
    ap.add_argument("--model", default=None, help="policy backend spec (default: the config's)")
    ap.add_argument("--monitor-n", type=int, default=None, help="val tasks of the bench monitor")
    ap.add_argument("--null-n", type=int, default=None, help="null candidates per variant")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--results", type=Path, default=REPO / "docs" / "RESULTS.md")
    ap.add_argument("--modes", default=",".join(MODE_ORDER),
                    help="modes to run, in this order (the table always lists all four)")
    ap.add_argument("--report-only", action="store_true",
                    help="write RESULTS.md from the runs already in --out's ledger; run nothing")
    a = ap.parse_args(argv)
    seeds = a.seeds or (1 if a.small else 2)
    budget = a.budget or (20 if a.small else 160)
    monitor_n = a.monitor_n or (4 if a.small else 20)
    null_n = a.null_n if a.null_n is not None else (2 if a.small else 10)
    envs = (a.envs or ("arithmetic" if a.small else "bfcl,arithmetic")).split(",")
    proposers = a.proposers.split(",")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = (a.out or REPO / "bench" / "out" / "coevolution" / stamp).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from coevo.store import Store

    store = Store.open(f"sqlite:///{out / 'bench.db'}")
    bases = [base_config(e, a.small, out, a.model, proposers, a.proposer_model) for e in envs]
    est = estimate(bases, seeds, budget, a.proposer_call_cost, null_n)
    _say(f"[bold]coevolution bench[/bold]: envs {', '.join(b.env for b in bases)}; {seeds} seed(s); "
         f"budget {budget} rollout-equivalents per mode (proposer call = {a.proposer_call_cost}); "
         f"proposers {', '.join(proposers)}; out {out}; estimate ~{est / 60:.0f} min")
    t0 = time.perf_counter()
    runs, base_vals, missing = [], {}, []
    order = a.modes.split(",")
    unknown = sorted(set(order) - set(MODE_ORDER))
    if unknown:
        raise CoevoError(f"--modes: unknown {', '.join(unknown)}; known: {', '.join(MODE_ORDER)}")
    order += [m for m in MODE_ORDER if m not in order]  # the rest still count as not run
    # Finished (env, seed, mode) runs are appended to runs.jsonl as they end, so a bench that
    # was stopped (or is re-run with more seeds into the same --out) redoes none of them.
    ledger = out / "runs.jsonl"
    done = {}
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            r = json.loads(line)
            done[(r["env"], r["seed"], r["mode"])] = r
    for b in bases:
        for seed in range(seeds):
            for mode in order:
                if (b.env, seed, mode) in done:
                    runs.append(done[(b.env, seed, mode)])
                    _say(f"[bold]{b.name}[/bold] seed {seed} mode {mode}: done before, reused")
                elif a.report_only:
                    missing.append(f"{b.env.split('?')[0]} seed {seed} {mode}")
                    continue
                else:
                    _say(f"[bold]{b.name}[/bold] seed {seed} mode {mode}")
                    runs.append(run_mode(b, mode, seed, budget, store,
                                         proposer_call_cost=a.proposer_call_cost,
                                         monitor_n=monitor_n, base_val=base_vals.get(b.env)))
                    with ledger.open("a") as f:
                        f.write(json.dumps(runs[-1], default=str) + "\n")
                if b.env not in base_vals:  # every mode starts from the same base: score it once
                    base_vals[b.env] = runs[-1]["curve"][0][1]
                    _say(f"{b.env}: base model val score {_f(base_vals[b.env])}")
    null_file = out / "null.json"
    if null_file.exists():
        null = json.loads(null_file.read_text())
    elif null_n and (not a.report_only or a.null_n is not None):  # --report-only --null-n N: just that
        null_base = next((b for b, e in zip(bases, envs) if e == a.null_env), bases[-1])
        null = false_accepts(null_base, store, null_n)
        null_file.write_text(json.dumps(null, default=str))
    else:
        null = None
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "command": "python bench/coevolution.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "small": a.small, "seeds": seeds, "budget": budget,
              "proposer_call_cost": a.proposer_call_cost, "proposers": proposers,
              "proposer_model": a.proposer_model, "monitor_n": monitor_n,
              "machine": machine(), "seconds": time.perf_counter() - t0, "estimate_s": est,
              "configs": {b.env: b.model_dump(mode="json", exclude=_SET_BY_BENCH) for b in bases},
              "base_val": base_vals, "runs": runs, "null": null, "out": str(out),
              "missing": missing}
    if a.report_only:  # the wall time is what the runs took, not this call
        report["seconds"] = sum(float(r.get("seconds") or 0.0) for r in runs)
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    path = write_results(report, a.results)
    _say(f"done in {report['seconds'] / 60:.1f} min (estimate {est / 60:.0f}); wrote {path}")
    return report


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
