"""docs/RESULTS.md of bench/coevolution.py, its plots, its intervals and the data it is built from.

The page is regenerable: `write_data` keeps the report (per-task test outcomes of every run,
curves, spend, proposal counts, the null check, configs) as a small JSON in bench/data/, and
`python bench/coevolution.py --report-only` rebuilds the page from it (`load_data`).

Intervals. A run's test score is one seed's; the seeds are the replication unit, tasks are
nested in them. 95% intervals are a hierarchical (cluster) percentile bootstrap: resample the
seeds with replacement, then the tasks within each drawn seed, and average per-seed means
(`cluster_bootstrap`). With two seeds the seed level has two clusters, and the interval says
how little two seeds can tell: it spans the seeds' spread plus their task noise (a Student-t
interval over pooled seed x task results treated every task as independent and was far too
narrow when the seeds disagreed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

MODE_ORDER = ("weight-only", "harness-only", "ungated", "gated")
# The peer methods (coevo/modes/): run only when `--modes` names them; rows after the four.
PEER_MODES = ("fst", "bettertogether", "skillopt", "bettertogether-gate")
# A bench label that is a loop mode with config overrides: bettertogether's p -> w -> p order
# with the gated mode's paired gate at its p stages (gate before RL).
VARIANTS = {"bettertogether-gate": ("bettertogether", {"bettertogether": {"select": "gate"}})}
ALL_MODES = MODE_ORDER + PEER_MODES
GATED_MODES = ("gated", *VARIANTS)  # the modes whose revisions pass the paired gate
REPO = Path(__file__).resolve().parent.parent


def cluster_bootstrap(groups: Sequence[Sequence[float]], n_boot: int = 4000, seed: int = 0,
                      level: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """(mean of the group means, lower, upper): percentile bootstrap resampling groups, then
    items within each drawn group.

    >>> cluster_bootstrap([[1.0, 1.0], [0.0, 0.0]])[0]
    0.5
    >>> cluster_bootstrap([[0.5, 0.5]])
    (0.5, 0.5, 0.5)
    """
    gs = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not gs:
        return None, None, None
    mean = float(np.mean([g.mean() for g in gs]))
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(gs), size=(n_boot, len(gs)))  # (B, seeds)
    stats = np.empty(n_boot)
    for b in range(n_boot):
        stats[b] = np.mean([gs[i][rng.integers(0, len(gs[i]), len(gs[i]))].mean() for i in pick[b]])
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return mean, float(lo), float(hi)


def per_seed(runs: list[dict[str, Any]], spec: str) -> list[list[float]]:
    """Each run's (seed's) per-task test outcomes on `spec`."""
    return [list(r["tests"].get(spec, {}).get("tasks", {}).values()) for r in runs]


def seed_groups(runs: list[dict[str, Any]], env: str) -> dict[int, dict[str, float]]:
    """Per seed, the seed incumbent's per-task test outcomes (`splits.seed_test`, round 0 of
    each run: every mode of a seed starts from the same seed assets and base model, so the
    first run of the seed that scored it stands for all)."""
    out: dict[int, dict[str, float]] = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        st = (r.get("seed_test") or {}).get(env)
        if st and st.get("tasks") and r["seed"] not in out:
            out[r["seed"]] = st["tasks"]
    return out


def paired_vs(a: list[dict], by_seed: dict[int, dict[str, float]], spec: str) -> list[list[float]]:
    """Per seed, the differences between a's test outcomes and `by_seed`'s on shared tasks."""
    out = []
    for r in a:
        other = by_seed.get(r["seed"])
        if other is not None:
            mine = r["tests"].get(spec, {}).get("tasks", {})
            out.append([v - other[t] for t, v in mine.items() if t in other])
    return out


def verdict(lo: float | None, hi: float | None, a: str, b: str) -> str:
    """What a paired interval says: a side wins only when the interval excludes 0."""
    if lo is not None and lo > 0:
        return f"{a} beats {b}"
    if hi is not None and hi < 0:
        return f"{b} beats {a}"
    return "not resolved (the interval holds 0)"


def _paired_section(env: str, runs: list[dict]) -> list[str]:
    """Gated (and each gated variant: GATED_MODES) against every other mode, and every mode
    against the seed incumbent when the runs scored it: the differences on the test split,
    paired per seed and task."""
    by_mode = {m: sorted((r for r in runs if r["mode"] == m), key=lambda r: r["seed"])
               for m in ALL_MODES}
    rows = []
    for g in GATED_MODES:  # gated, and each gated variant, against every other mode
        if not by_mode[g]:
            continue
        for m in ALL_MODES:
            if m not in (g, *GATED_MODES[:GATED_MODES.index(g)]) and by_mode[m]:
                other = {r["seed"]: r["tests"].get(env, {}).get("tasks", {}) for r in by_mode[m]}
                rows.append((g, m, paired_vs(by_mode[g], other, env)))
    seeds = seed_groups(runs, env)
    if seeds:
        rows += [(m, "seed incumbent", paired_vs(by_mode[m], seeds, env))
                 for m in ALL_MODES if by_mode[m]]
    if not rows:
        return []
    lines = ["Paired differences on the test split (per seed, the same tasks and sampling "
             "seeds; 95% cluster bootstrap over seeds, then tasks):", "",
             "| comparison | difference [95% CI] | seeds x tasks | verdict |", "|---|---|---|---|"]
    for a, b, groups in rows:
        d, lo, hi = cluster_bootstrap(groups)
        lines.append(f"| {a} - {b} | {_f(d)} [{_f(lo)}, {_f(hi)}] | {len(groups)} x "
                     f"{min(map(len, groups), default=0)} | {verdict(lo, hi, a, b)} |")
    return lines + [""]


def proposer_rows(runs: list[dict]) -> list[tuple]:
    """Per (mode, proposer), pooled over the runs (seeds) that stored `proposer_stats`:
    proposals, invalid, gated, accepted, mean accepted delta, mean gated delta (means weighted
    by each run's counts)."""
    acc: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        for s in r.get("proposer_stats") or []:
            a = acc.setdefault((r["mode"], s["proposer"]), [0, 0, 0, 0, 0.0, 0.0])
            for i, k in enumerate(("proposals", "invalid", "gated", "accepted")):
                a[i] += s[k]
            a[4] += (s["accepted_delta"] or 0.0) * s["accepted"]
            a[5] += (s["gated_delta"] or 0.0) * s["gated"]
    order = {m: i for i, m in enumerate(ALL_MODES)}
    return [(m, p, n, inv, g, ok, a_sum / ok if ok else None, g_sum / g if g else None)
            for (m, p), (n, inv, g, ok, a_sum, g_sum) in sorted(
                acc.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1]))]


def _proposer_section(runs: list[dict]) -> list[str]:
    rows = proposer_rows(runs)
    if not rows:
        return []
    lines = ["Per proposer, summed over seeds (`coevo proposals stats`; gated: compared with "
             "the incumbent by the paired gate, or by a peer mode's val-mean rule; deltas: "
             "candidate - incumbent on val, per paired task; fst's against its parent member's "
             "stored val scores, measured before the round's RL stage for the seed member, so "
             "they include the RL gain):", "",
             "| mode | proposer | proposals | invalid | valid rate | gated | accepted | "
             "accept rate | mean accepted delta | mean gated delta |", "|" + "---|" * 10]
    for m, p, n, inv, g, ok, ad, gd in rows:
        lines.append(f"| {m} | {p} | {n} | {inv} | {_f((n - inv) / n if n else None, 2)} | {g} | "
                     f"{ok} | {_f(ok / g if g else None, 2)} | {_f(ad)} | {_f(gd)} |")
    return lines + [""]


def _f(x: float | None, d: int = 3) -> str:
    return "-" if x is None else f"{x:.{d}f}"


def _slug(env: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in env.split("?")[0]).strip("-")


def plot_curves(env: str, runs: list[dict[str, Any]], path: Path) -> Path:
    """Val score vs cumulative model tokens, one colour per mode, one line per seed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = dict(zip(ALL_MODES, ("#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c", "#d62728",
                                  "#8c564b", "#e377c2", "#17becf")))
    for r in runs:
        pts = [(x, y) for x, y in r["curve"] if y is not None]
        if pts:
            ax.plot([x / 1000 for x, _ in pts], [y for _, y in pts], marker="o",
                    color=colors[r["mode"]], alpha=0.85, ls=("-", "--", ":", "-.")[r["seed"] % 4],
                    label=f"{r['mode']} (seed {r['seed']})")
    ax.set_xlabel("cumulative model tokens spent (thousands: prefilled + generated + trained)")
    ax.set_ylabel("val score (incumbent)")
    ax.set_title(env, fontsize="small")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def write_data(rep: dict[str, Any], path: Path) -> Path:
    """The report as a small JSON (what --report-only rebuilds the page from)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Key order kept as it is (no sort_keys): the page shows the configs in their own order.
    path.write_text(json.dumps(rep, indent=1, default=str) + "\n")
    return path


def _reused_from(rep: dict) -> str:
    """Where a bench's reused runs came from: its --out ledger, and the --reuse data files."""
    files = sorted({r["reused_from"] for r in rep["runs"] if r.get("reused_from")})
    from_files = sum(1 for r in rep["runs"] if r.get("reused_from"))
    return " and ".join((["the --out ledger of an earlier one"] if rep["reused"] > from_files else [])
                        + [f"`{f}` (--reuse: run in another --out on the same budget and config)"
                           for f in files])


def load_data(path: Path) -> dict[str, Any]:
    from coevo.errors import CoevoError

    if not Path(path).is_file():
        raise CoevoError(f"--report-only: no data file {path} (a full run writes it)")
    return json.loads(Path(path).read_text())


def _mode_row(env: str, mode: str, mr: list[dict], specs: list[str], detail_keys: list[str]) -> str:
    cells = [mode]
    for s in specs:
        m, lo, hi = cluster_bootstrap(per_seed(mr, s))
        cells.append(f"{_f(m)} [{_f(lo)}, {_f(hi)}]")
    cells.append(", ".join(_f(r["tests"].get(env, {}).get("mean")) for r in mr))
    for k in detail_keys:
        v = [r["tests"][env]["details"][k] for r in mr if k in r["tests"].get(env, {}).get("details", {})]
        cells.append(_f(sum(v) / len(v)) if v else "-")
    p = [r["proposals"] for r in mr]
    cells += [", ".join(f"{r['cost'] / 1000:.1f}k" for r in mr),
              ", ".join(str(r["rounds"]) + (f" ({r['tail_rounds']} RL-only)" if r.get("tail_rounds") else "")
                        for r in mr),
              f"{sum(x.get('accepted', 0) for x in p)} / {sum(x.get('rejected', 0) for x in p)} "
              f"({sum(x.get('budget', 0) for x in p)}) / {sum(x.get('invalid', 0) for x in p)}"]
    return "| " + " | ".join(cells) + " |"


def _spend_rows(runs: list[dict]) -> list[str]:
    lines = ["| mode | seed | tokens | train tokens | rollouts | proposer calls | seconds | val-curve rollouts (uncharged) |",
             "|---|---|---|---|---|---|---|---|"]
    for mode in ALL_MODES:
        for r in sorted((r for r in runs if r["mode"] == mode), key=lambda r: r["seed"]):
            s = r["spent"]
            lines.append(f"| {mode} | {r['seed']} | {s.get('tokens', 0):.0f} | {s.get('train_tokens', 0):.0f} | "
                         f"{s.get('rollouts', 0):.0f} | {s.get('proposer_calls', 0):.0f} | "
                         f"{s.get('seconds', 0):.0f} | {s.get('eval_rollouts', 0):.0f} |")
    return lines


TITLE = "Co-evolution benchmark: weight-only vs harness-only vs ungated vs gated"


def dataset_name(rep: dict[str, Any]) -> str:
    """A data set's name: the --envs it ran (stored as `name`; older data: from its command)."""
    if rep.get("name"):
        return rep["name"]
    words = rep.get("command", "").split()
    return words[words.index("--envs") + 1] if "--envs" in words[:-1] else "bfcl,arithmetic"


def write_results(reps: dict[str, Any] | list[dict[str, Any]], path: Path) -> Path:
    """Write docs/RESULTS.md (and one PNG per env next to it) from the bench's report dict,
    or from several (one section per data set, each with its own header and configs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    reps = [reps] if isinstance(reps, dict) else list(reps)
    if len(reps) == 1:
        lines = [f"# {TITLE}", "", *_dataset(reps[0], path.parent, "##", "")]
    else:
        files = " ".join(f"--data {r.get('data', '?')}" for r in reps)
        lines = [f"# {TITLE}", "", f"{len(reps)} data sets of `bench/coevolution.py`, each "
                 "with its own command, machine, budget and configs (rebuild the page with "
                 f"`python bench/coevolution.py --report-only {files}`); do not edit by hand.", ""]
        for rep in reps:
            name = dataset_name(rep)
            lines += [f"## Data set `{name}`", "",
                      *_dataset(rep, path.parent, "###", _slug(name.replace(",", "-")) + "-")]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _dataset(rep: dict[str, Any], folder: Path, h: str, tag: str) -> list[str]:
    """One data set's part of the page: its header, per env the table (headings `h`), plot
    (`coevolution-<tag><env>.png` in `folder`), spend and paired differences, the null check
    and the configs."""
    lines = [
        f"Generated by `bench/coevolution.py` on {rep['date']} from `{rep.get('data', 'bench/data/coevolution.json')}` "
        f"(rebuild with `--report-only`); do not edit by hand. Command: `{rep['command']}`"
        + (" (**--small smoke run: the numbers mean nothing**)" if rep["small"] else ""),
        "", f"- Machine: {rep['machine']}",
        f"- Wall time: {rep['seconds'] / 60:.1f} min"
        + (f" for this invocation, which reused {rep['reused']} finished runs from "
           + _reused_from(rep) if rep.get("reused") else "")
        + f"; the {len(rep['runs'])} runs' own times sum to "
        f"{sum(r.get('seconds') or 0 for r in rep['runs']) / 60:.1f} min. Seconds are wall clock "
        "on the machine as it was (other work ran beside some runs): compare tokens, not seconds",
        f"- Seeds: {rep['seeds']} per env"
        + (f" of the {rep['seeds_declared']} the command declares"
           if rep.get("seeds_declared", rep["seeds"]) != rep["seeds"] else "")
        + "; every mode of a seed starts from the same seed asset "
        "versions, pinned by hash from the seed files when the run is created, and a freshly "
        "loaded base model",
        f"- Budget per (env, seed, mode): " + ", ".join(f"{v:g} model tokens on {k.split('?')[0]}"
                                                       for k, v in rep["budget"].items())
        + (f" ({rep['budget_units']:g} seed-incumbent val episodes' worth, fixed per env before "
           "any mode ran)" if rep.get("budget_units") else "") + ". One unit for every mode: "
        "prefilled + generated tokens of every episode (RL, harness-only train rollouts, gate "
        "arms) and of every LLM proposer call, plus the tokens RL updates trained on (a "
        "proposer that calls no model, such as demos, costs nothing). A mode runs rounds while "
        "its next round fits (the gate plans only the val tasks the rest can pay for); then "
        "gated and ungated spend the rest on RL-only rounds while an RL stage fits. The val "
        "curve's evaluations are not charged. `spent` is what each run used.",
        f"- Proposers: {', '.join(rep['proposers'])} (LLM proposers on `{rep['proposer_model']}`)",
        "- Test: the final incumbent (assets + checkpoint) once on the test split. **95% intervals: "
        "hierarchical (cluster) bootstrap over seeds and tasks** (resample seeds, then tasks "
        "within each seed; mean of per-seed means). Partial credit: the environment verifier's "
        "`Score.details` re-derived from the stored test answers. BFCL's test mean is BFCL "
        "accuracy: the answer decoded as BFCL's own decoder does; `lenient_correct` is the "
        "same checker on the harness's more lenient parse.", ""]
    if rep.get("missing"):
        lines += ["**Not run yet** (left out by `--run-seeds`, for a later invocation to add "
                  "with `--reuse`; the table holds only the runs that finished, nothing was "
                  "dropped): " + "; ".join(rep["missing"]) + ".", ""]
    for env in rep["configs"]:
        runs = [r for r in rep["runs"] if r["env"] == env]
        specs = list(dict.fromkeys(s for r in runs for s in r["tests"]))
        detail_keys = sorted({k for r in runs for k in r["tests"].get(env, {}).get("details", {})})
        lines += [f"{h} {env}", "", f"Base model val score: {_f(rep['base_val'].get(env))}", ""]
        head = ["mode", *(f"test {s.split('?')[0]} mean [95% CI]" for s in specs), "per seed",
                *detail_keys, "spent per seed (tokens)", "rounds", "accepted / rejected (budget) / invalid"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        seeds = seed_groups(runs, env)
        if seeds:  # the untrained seed incumbent on the same test tasks (splits.seed_test)
            m, lo, hi = cluster_bootstrap(list(map(list, (t.values() for t in seeds.values()))))
            cells = ["seed incumbent (round 0)", *(f"{_f(m)} [{_f(lo)}, {_f(hi)}]" if s == env
                                                   else "-" for s in specs),
                     ", ".join(_f(sum(t.values()) / len(t)) for t in seeds.values())]
            lines.append("| " + " | ".join(cells + ["-"] * (len(head) - len(cells))) + " |")
        for mode in ALL_MODES:
            mr = sorted((r for r in runs if r["mode"] == mode), key=lambda r: r["seed"])
            if mr:
                lines.append(_mode_row(env, mode, mr, specs, detail_keys))
        png = plot_curves(env, runs, folder / f"coevolution-{tag}{_slug(env)}.png")
        lines += ["", f"![val score vs tokens]({png.name})", "",
                  "Val curve: the loop's round summaries (whole val split, uncharged); the first "
                  "point of each line is the seed incumbent at 0 tokens.", "", "Spend:", "",
                  *_spend_rows(runs), ""]
        lines += _paired_section(env, runs) + _proposer_section(runs)
    lines += _null_section(rep.get("null"), h)
    # Paths relative to the repository, so the page reads the same on any checkout.
    configs = json.dumps(rep["configs"], indent=1).replace(f"{REPO}/", "").replace(f'"{REPO}"', '"."')
    return lines + [f"{h} Configs", "", "```json", configs, "```", ""]


def _null_section(null: dict[str, Any] | None, h: str = "##") -> list[str]:
    lines = [f"{h} False-accept check (null candidates)", ""]
    if not null:
        return lines + ["Not run (--null-n 0).", ""]
    pol = null["policy"]
    return lines + [
        f"Env {null['env']}, gate policy `{pol['name']}` (alpha {pol['alpha']}). **Simulated "
        f"from stored real per-task outcomes**: the base model under the seed incumbent was "
        f"rolled out {null['draws']} times on each of the {null['tasks']} val tasks (real "
        "episodes, distinct seeds); each null candidate was then gated by the real sequential "
        "gate, its two arms drawing every task's outcome as two different stored draws (same "
        "distribution, different samples). A check with both arms on the same seeds is not "
        "reported: identical prompts and seeds give identical samples, so it cannot fail.", "",
        "| null candidates | accepted | accept rate | 95% upper bound | mean rollouts | pairs that differed |",
        "|---|---|---|---|---|---|",
        f"| {null['n']} | {null['accepted']} | {_f(null['rate'])} | {_f(null['upper95'])} | "
        f"{null['mean_rollouts']:.1f} | {null['differing']}/{null['pairs']} |", ""]
