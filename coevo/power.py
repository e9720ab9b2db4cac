"""Power of the validation gate: the minimum detectable effect (MDE) of a comparison on n val
tasks, and the n that detects a target effect, for the gate's own fixed-sample test.

The test (coevo/gate.py, `paired`): accept iff the one-sided exact sign test on per-task wins
vs losses has p <= alpha AND the one-sided (1 - alpha) bootstrap lower bound of the mean
per-task difference clears `min_delta`. The outcome model, per (task, sample) pair of arms
with the same seed:

    win (candidate 1, incumbent 0) with probability (psi + delta) / 2,
    loss (0, 1) with (psi - delta) / 2, tie otherwise,

so `delta` is the mean paired difference (candidate - incumbent success rate, for 0/1
outcomes) and `psi` the discordance rate, the share of pairs whose outcomes differ: for a
paired binary outcome the sign test (McNemar's exact test) sees only the discordant pairs, so
its power depends on psi as much as on delta (psi >= delta; psi is raised to delta when the
assumed value is smaller). With `samples` k > 1 a task's difference is the mean of its k
pairs and the task is a win when that mean is positive (the gate averages samples per task);
the k pairs of a task are taken as independent (no per-task random effect).

Power is exact for the sign-test half: the number of non-tied tasks D is Binomial(n, pw + pl)
and the wins among them Binomial(D, pw / (pw + pl)), against the exact critical values the
gate uses (coevo/gatestats.py, `critical_wins`). The bootstrap half is approximated by the
normal test it estimates (mean - z * sd / sqrt(n) > min_delta, sd the per-task difference's
standard deviation under the model), and the two are combined by the minimum: at min_delta 0
they are nearly the same event, so the minimum is close to the joint probability (the test
file checks it against the gate's `decide` on simulated pairs). What is left out: the
sequential gate's futility stops (coevo/sequential.py) reject a little of what the full
evaluation would accept (bench/gate_efficiency.py measures the loss); its curtailment never
accepts what the full evaluation would not, so the figures here are an upper bound.

Departure from the textbook McNemar sample size (Connor 1987): exact binomial power instead of
the normal approximation, which is optimistic at the small n a gate runs on.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from coevo.gatestats import critical_wins

DEFAULT_DISCORDANCE = 0.3  # measured: 33/110 pairs differed between two draws (docs/RESULTS.md)
DEFAULT_POWER = 0.8


def task_outcome_probs(delta: float, psi: float, samples: int = 1) -> tuple[float, float]:
    """(P(task win), P(task loss)) when each of a task's `samples` pairs is a win with
    probability (psi + delta) / 2 and a loss with (psi - delta) / 2 (psi raised to delta).

    >>> [round(p, 6) for p in task_outcome_probs(0.1, 0.3)]
    [0.2, 0.1]
    """
    psi = max(psi, abs(delta))
    a, b = (psi + delta) / 2, (psi - delta) / 2
    if samples == 1:
        return a, b
    k = samples
    w, l = np.meshgrid(np.arange(k + 1), np.arange(k + 1), indexing="ij")
    ok = w + l <= k
    w, l = w[ok], l[ok]
    t = k - w - l
    # the trinomial pmf of (wins, losses, ties) among the k pairs; xlogy: 0 * log 0 = 0
    logp = (special.gammaln(k + 1) - special.gammaln(w + 1) - special.gammaln(l + 1)
            - special.gammaln(t + 1) + special.xlogy(w, a) + special.xlogy(l, b)
            + special.xlogy(t, max(1.0 - a - b, 0.0)))
    p = np.exp(logp)
    return float(p[w > l].sum()), float(p[w < l].sum())


def sign_power(n: int, p_win: float, p_loss: float, alpha: float) -> float:
    """P(the exact one-sided sign test on n tasks has p <= alpha), tasks independent with
    these win / loss probabilities (ties the rest)."""
    if n < 1:
        return 0.0
    p_disc = p_win + p_loss
    if p_disc <= 0:
        return 0.0
    d = np.arange(n + 1)
    c = critical_wins(n, alpha)  # fewest wins out of d non-ties that pass
    pass_given_d = stats.binom.sf(c[d] - 1, d, p_win / p_disc)
    return float(np.clip((stats.binom.pmf(d, n, p_disc) * pass_given_d).sum(), 0.0, 1.0))


def power(n: int, delta: float, psi: float, alpha: float, samples: int = 1,
          min_delta: float = 0.0) -> float:
    """P(the gate's fixed-sample test accepts) on n tasks x `samples` when the candidate's true
    mean paired difference is `delta` (module docstring: exact sign test, normal bootstrap
    half, their minimum)."""
    pw, pl = task_outcome_probs(delta, psi, samples)
    sign = sign_power(n, pw, pl, alpha)
    sd = math.sqrt(max(max(psi, abs(delta)) - delta**2, 1e-12) / samples)
    z = stats.norm.ppf(1 - alpha)
    mean = float(stats.norm.sf(z - (delta - min_delta) * math.sqrt(n) / sd))
    return min(sign, mean)


def mde(n: int, psi: float, alpha: float, samples: int = 1, target: float = DEFAULT_POWER,
        min_delta: float = 0.0, tol: float = 1e-4) -> float | None:
    """The smallest mean paired difference the gate accepts with probability `target` on n
    tasks (None: not even +1, every pair a win, gets there: too few tasks at this alpha)."""
    if power(n, 1.0, psi, alpha, samples, min_delta) < target:
        return None
    lo, hi = max(min_delta, 0.0), 1.0
    while hi - lo > tol:  # power is increasing in delta
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if power(n, mid, psi, alpha, samples, min_delta) < target else (lo, mid)
    return hi


def tasks_for(effect: float, psi: float, alpha: float, samples: int = 1,
              target: float = DEFAULT_POWER, n_max: int = 10_000,
              min_delta: float = 0.0) -> int | None:
    """The fewest val tasks with power >= `target` at `effect` (None: none up to n_max).
    The exact test's power saw-tooths in n, so this is the first n that gets there, found by
    a scan (a bisection could miss it)."""
    for n in range(1, n_max + 1):
        if power(n, effect, psi, alpha, samples, min_delta) >= target:
            return n
    return None


def discordance(outcomes: dict[str, list[float]]) -> tuple[float, str] | None:
    """The discordance rate two independent draws of the same task would show, from a task's
    observed outcomes (task id -> outcomes, several samples or rounds), and how it was got.

    Tasks with >= 2 outcomes: the unbiased within-task estimate k / (k - 1) * (1 - sum_v
    p_v^2) (for 0/1 outcomes 2 p (1 - p) k / (k - 1)), averaged. Otherwise the pooled
    1 - sum_v pbar_v^2, which counts between-task variation as noise: an upper bound, so the
    MDE it gives is conservative. None when nothing is observed.

    >>> discordance({"a": [1.0, 0.0], "b": [1.0, 1.0]})[0]
    0.5
    """
    values = [v for vs in outcomes.values() for v in vs]
    if not values:
        return None
    repeated = {t: vs for t, vs in outcomes.items() if len(vs) >= 2}
    if len(repeated) >= max(2, len(outcomes) // 2):
        per = []
        for vs in repeated.values():
            k = len(vs)
            shares = np.unique(np.round(vs, 9), return_counts=True)[1] / k
            per.append(k / (k - 1) * (1.0 - float((shares**2).sum())))
        return float(np.mean(per)), (f"observed within-task variation: {len(repeated)} tasks "
                                      f"with 2+ outcomes, {len(values)} outcomes")
    shares = np.unique(np.round(values, 9), return_counts=True)[1] / len(values)
    return float(1.0 - (shares**2).sum()), (f"observed pooled outcomes ({len(values)} outcomes "
                                            f"of {len(outcomes)} tasks, too few repeats per task: "
                                            "an upper bound)")
