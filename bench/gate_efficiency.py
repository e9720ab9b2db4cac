"""Sequential gate vs full evaluation: rollouts used (ratio) and agreement of the decisions, and
for families of 3 candidates a round (decided together, Holm) the family-wise false-accept rate
and the power.

Simulated paired outcomes: each task has a latent difficulty b ~ N(0, sigma^2) shared by both
arms (that is what pairs them); the incumbent solves it with probability expit(mu + b), the
candidate with expit(mu + delta + b), each draw independent given b. mu and delta are
calibrated so the incumbent's mean success is `base` and the candidate's is base + effect.

Real paired outcomes: `--real FILE.json` holds either a list of PairedOutcome dicts (one
comparison) or {"comparisons": [{"name": ..., "pairs": [...]}, ...]}. Each comparison is
replayed `--orders` times in different task orders (the sequential gate's order is seeded).

    python bench/gate_efficiency.py [--reps 200] [--tasks 200] [--real pairs.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy import optimize, special, stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coevo.gate import Evidence, GatePolicy, PairedOutcome  # noqa: E402
from coevo.sequential import compare, compare_family  # noqa: E402

_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(80)  # E[f(Z)], Z ~ N(0, 1)


def _mean_success(mu: float, sigma: float) -> float:
    return float(np.sum(_WEIGHTS * special.expit(mu + sigma * _NODES)) / np.sqrt(2 * np.pi))


def calibrate(base: float, effect: float, sigma: float) -> tuple[float, float]:
    """(mu, delta) with E[expit(mu + sigma Z)] = base and E[expit(mu + delta + sigma Z)] = base + effect."""
    mu = optimize.brentq(lambda m: _mean_success(m, sigma) - base, -20, 20)
    delta = optimize.brentq(lambda d: _mean_success(mu + d, sigma) - (base + effect), -20, 20)
    return mu, delta


def simulate(rng: np.random.Generator, n_tasks: int, base: float = 0.4, effect: float = 0.0,
             sigma: float = 2.5, infra_rate: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Binary outcomes (n_tasks,) for incumbent and candidate; NaN marks an infra failure."""
    mu, delta = calibrate(base, effect, sigma)
    b = rng.normal(0.0, sigma, n_tasks)
    inc = (rng.random(n_tasks) < special.expit(mu + b)).astype(float)
    cand = (rng.random(n_tasks) < special.expit(mu + delta + b)).astype(float)
    if infra_rate:
        inc[rng.random(n_tasks) < infra_rate] = np.nan
        cand[rng.random(n_tasks) < infra_rate] = np.nan
    return inc, cand


def table_run_arm(scores: dict[str, tuple[float | None, float | None]]):
    """A run_arm that replays stored paired scores (index 0 incumbent, 1 candidate)."""

    def run_arm(arm, tasks, seeds):
        i = 0 if arm == "incumbent" else 1
        return [scores[t][i] for t in tasks]

    return run_arm


def _from_arrays(inc: np.ndarray, cand: np.ndarray) -> dict[str, tuple[float | None, float | None]]:
    f = lambda x: None if np.isnan(x) else float(x)  # noqa: E731
    return {f"t{i:04d}": (f(a), f(b)) for i, (a, b) in enumerate(zip(inc, cand))}


def run_pair(scores: dict, policy: GatePolicy) -> tuple[bool, int, bool, int]:
    """(full accepted, full rollouts, sequential accepted, sequential rollouts)."""
    tasks = sorted(scores)
    _, full = compare(table_run_arm(scores), tasks, policy, sequential=False)
    _, seq = compare(table_run_arm(scores), tasks, policy, sequential=True)
    return full.accepted, full.rollouts, seq.accepted, seq.rollouts


def summarize(name: str, rows: list[tuple[bool, int, bool, int]]) -> dict:
    a = np.array(rows, dtype=float)
    return {
        "mix": name, "n": len(rows), "full_accept": a[:, 0].mean(), "seq_accept": a[:, 2].mean(),
        "agree": (a[:, 0] == a[:, 2]).mean(), "ratio": a[:, 3].sum() / a[:, 1].sum(),
    }


def simulated(reps: int, n_tasks: int, policy: GatePolicy, seed: int = 0, base: float = 0.4,
              sigma: float = 2.5, effects=(0.0, 0.05, 0.10, -0.10)) -> list[dict]:
    out, all_rows = [], []
    for effect in effects:
        rng = np.random.default_rng([seed, int(round(effect * 1000)) + 1000])
        rows = []
        for r in range(reps):
            inc, cand = simulate(rng, n_tasks, base, effect, sigma)
            rows.append(run_pair(_from_arrays(inc, cand), policy.model_copy(update={"seed": r})))
        out.append(summarize(f"{effect * 100:+.0f}pp", rows))
        all_rows += rows
    out.append(summarize("mix (all)", all_rows))
    return out


def simulate_family(rng: np.random.Generator, n_tasks: int, base: float, effects: Sequence[float],
                    sigma: float = 2.5) -> tuple[np.ndarray, list[np.ndarray]]:
    """One round: the incumbent's outcomes and one candidate's per effect, on the same tasks
    (shared difficulty b), each candidate drawn independently given b."""
    b = rng.normal(0.0, sigma, n_tasks)
    mu, _ = calibrate(base, 0.0, sigma)
    inc = (rng.random(n_tasks) < special.expit(mu + b)).astype(float)
    cands = []
    for effect in effects:
        _, delta = calibrate(base, effect, sigma)
        cands.append((rng.random(n_tasks) < special.expit(mu + delta + b)).astype(float))
    return inc, cands


def family(reps: int, n_tasks: int, policy: GatePolicy, effects: Sequence[float], seed: int = 0,
           base: float = 0.4, sigma: float = 2.5) -> dict:
    """Rounds of len(effects) candidates against one incumbent, decided as one family
    (sequential compare at the family's levels, then Holm: coevo.sequential.compare_family),
    and the same rounds fully evaluated. Family-wise false accepts: rounds accepting at least
    one candidate with effect <= 0; power: accepts of the candidates with effect > 0."""
    rng = np.random.default_rng([seed, len(effects), int(round(1000 * max(effects))) + 1000])
    good = [k for k, e in enumerate(effects) if e > 0]
    rows = []
    for r in range(reps):
        inc, cands = simulate_family(rng, n_tasks, base, effects, sigma)
        arms = [table_run_arm(_from_arrays(inc, c)) for c in cands]
        tasks = sorted(_from_arrays(inc, cands[0]))
        pol = policy.model_copy(update={"seed": r})
        seq = [d for _, d in compare_family(arms, tasks, pol)]
        full = [d for _, d in compare_family(arms, tasks, pol, sequential=False)]
        rows.append({"seq": [d.accepted for d in seq], "full": [d.accepted for d in full],
                     "seq_rollouts": sum(d.rollouts for d in seq),
                     "full_rollouts": sum(d.rollouts for d in full)})

    def fw(key: str) -> float:
        return float(np.mean([any(a for k, a in enumerate(x[key]) if k not in good) for x in rows]))

    def power(key: str) -> float | None:
        return float(np.mean([x[key][k] for x in rows for k in good])) if good else None

    return {"effects": list(effects), "reps": reps, "fwer_seq": fw("seq"), "fwer_full": fw("full"),
            "power_seq": power("seq"), "power_full": power("full"),
            "agree": float(np.mean([x["seq"] == x["full"] for x in rows])),
            # sequential accepts the full evaluation + Holm would not make (must be 0)
            "seq_only": sum(a and not b for x in rows for a, b in zip(x["seq"], x["full"])),
            "ratio": sum(x["seq_rollouts"] for x in rows) / sum(x["full_rollouts"] for x in rows)}


def real(path: Path, orders: int, policy: GatePolicy) -> list[dict]:
    data = json.loads(path.read_text())
    comps = data["comparisons"] if isinstance(data, dict) else [{"name": path.stem, "pairs": data}]
    out, every = [], []
    for c in comps:
        ev = Evidence(pairs=[PairedOutcome.model_validate(p) for p in c["pairs"]])
        samples = 1 + max(p.sample for p in ev.pairs)
        by_key = {(p.task_id, p.sample): p for p in ev.pairs}

        def run_arm(arm, tasks, seeds, _k=by_key, _s=samples):
            res, seen = [], {}
            for t in tasks:  # tasks repeat once per sample, in sample order
                s = seen.get(t, 0)
                seen[t] = s + 1
                p = _k.get((t, s))
                v = None if p is None or p.status != "ok" else (p.incumbent if arm == "incumbent" else p.candidate)
                res.append(v)
            return res

        tasks = sorted({p.task_id for p in ev.pairs})
        rows = []
        for r in range(orders):
            pol = policy.model_copy(update={"seed": r})
            _, full = compare(run_arm, tasks, pol, samples=samples, sequential=False)
            _, seq = compare(run_arm, tasks, pol, samples=samples, sequential=True)
            rows.append((full.accepted, full.rollouts, seq.accepted, seq.rollouts))
        out.append(summarize(f"real:{c.get('name', '?')}", rows))
        every += rows
    if len(comps) > 1:
        out.append(summarize("real (all)", every))
    return out


def print_table(rows: list[dict]) -> None:
    print(f"{'mix':<16}{'n':>6}{'full acc':>10}{'seq acc':>10}{'agree':>8}{'rollouts seq/full':>20}")
    for r in rows:
        print(f"{r['mix']:<16}{r['n']:>6}{r['full_accept']:>10.3f}{r['seq_accept']:>10.3f}{r['agree']:>8.3f}{r['ratio']:>20.3f}")


def print_family(rows: list[dict]) -> None:
    print(f"{'effects':<16}{'FWER seq':>10}{'FWER full':>11}{'power seq':>11}{'power full':>12}{'agree':>8}{'rollouts seq/full':>20}")
    for r in rows:
        name = ",".join(f"{e * 100:+.0f}pp" if e else "0" for e in r["effects"])
        pw = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        up = stats.beta.ppf(0.95, r["fwer_seq"] * r["reps"] + 1, r["reps"] * (1 - r["fwer_seq"]))
        print(f"{name:<16}{r['fwer_seq']:>10.3f}{r['fwer_full']:>11.3f}{pw(r['power_seq']):>11}"
              f"{pw(r['power_full']):>12}{r['agree']:>8.3f}{r['ratio']:>20.3f}"
              f"   [FWER seq <= {up:.3f}]")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--null-reps", type=int, default=1000, help="rounds of the all-null family")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--base", type=float, default=0.4)
    ap.add_argument("--sigma", type=float, default=2.5)
    ap.add_argument("--real", type=Path)
    ap.add_argument("--orders", type=int, default=50)
    ap.add_argument("--policy", default="paired")
    ap.add_argument("--futility", type=float, default=None)
    args = ap.parse_args(argv)
    policy = GatePolicy(name=args.policy, n_boot=1000)
    if args.futility is not None:
        policy = policy.model_copy(update={"futility": args.futility})
    t0 = time.time()
    rows = simulated(args.reps, args.tasks, policy, base=args.base, sigma=args.sigma)
    if args.real:
        rows += real(args.real, args.orders, policy)
    print(f"policy {policy.name}, alpha {policy.alpha}, screen {policy.screen_size} (margin "
          f"{policy.screen_reject_margin}), chunk {policy.chunk_size}, futility {policy.futility}; "
          f"{args.tasks} tasks, base {args.base}, sigma {args.sigma}")
    print_table(rows)
    fams = [family(args.null_reps if max(effects) == 0 else args.reps, args.tasks, policy,
                   effects, base=args.base, sigma=args.sigma)
            for effects in ((0.0, 0.0, 0.0), (0.10, 0.0, 0.0), (0.15, 0.0, 0.0))]
    print(f"\nfamilies of 3 candidates a round (sequential at the family's levels, then Holm), "
          f"{args.null_reps} rounds of nulls, {args.reps} of the others; FWER: rounds accepting "
          "a candidate with effect <= 0 [one-sided 95% Clopper-Pearson upper bound]")
    print_family(fams)
    print(f"({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
