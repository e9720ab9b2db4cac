"""The numbers behind the validation gate: paired bootstrap, exact sign test, Holm, and the
predictive probabilities the sequential gate uses to stop for futility.

- `bootstrap_bounds`: percentile bootstrap over task indices of the mean paired difference
  (Efron & Tibshirani 1993, ch. 13). Departure from the textbook: the resampled task indices are
  a fixed, seeded matrix per (n, n_boot, seed), so every resample mean is a
  non-decreasing function of every difference. That makes the bounds monotone in the data,
  which is what lets the sequential gate curtail exactly ("even if every remaining task were a
  loss, the lower bound would still clear"). BCa would correct small-sample skew but breaks
  that monotonicity; the exact sign test carries the error control, so percentile suffices.
- `sign_test_p`: one-sided exact binomial test on wins vs losses, ties dropped (Dixon & Mood
  1946). On binary outcomes this is McNemar's exact test on the discordant pairs.
- `holm`: Holm (1979) step-down adjustment; controls the family-wise error rate across the
  candidates of one round under any dependence.
- `predictive_sign_pass` / `predictive_mean_clears`: Bayesian predictive probability that the
  fixed-sample test would pass once the remaining tasks are evaluated (Spiegelhalter, Freedman
  & Blackburn 1986, "predictive power"). The gate only uses them to *stop and reject* early
  (futility), which can never add a false acceptance; see coevo/gate.py.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from scipy import special, stats


def sign_test_p(wins: int, losses: int) -> float:
    """P(Bin(wins + losses, 1/2) >= wins): the one-sided exact sign-test p-value.

    >>> round(sign_test_p(9, 1), 4)
    0.0107
    >>> sign_test_p(0, 0)
    1.0
    """
    n = wins + losses
    if n == 0:
        return 1.0
    return float(stats.binom.sf(wins - 1, n, 0.5))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order, capped at 1.

    >>> holm([0.01, 0.04, 0.03, 0.005])
    [0.03, 0.06, 0.06, 0.02]
    """
    p = np.asarray(list(p_values), dtype=float)
    m = len(p)
    if m == 0:
        return []
    if np.any((p < 0) | (p > 1) | np.isnan(p)):
        raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    scaled = p[order] * (m - np.arange(m))
    # Step-down: an adjusted p-value may never be smaller than the one before it in the order.
    adjusted_sorted = np.minimum(np.maximum.accumulate(scaled), 1.0)
    out = np.empty(m)
    out[order] = adjusted_sorted
    return [round(float(x), 12) for x in out]


@functools.lru_cache(maxsize=8)
def _resample_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) task indices; row b picks the tasks of the b-th resample. Seeded by
    (seed, n) only, so the same n always resamples the same positions."""
    rng = np.random.default_rng([seed, n])
    idx = rng.integers(0, n, size=(n_boot, n), dtype=np.int32)
    idx.flags.writeable = False  # cached and shared: nobody may edit it
    return idx


def bootstrap_bounds(diffs: np.ndarray, alpha: float, n_boot: int, seed: int) -> tuple[float, float]:
    """One-sided (1 - alpha) lower and upper percentile-bootstrap bounds of mean(diffs).

    `diffs` (n,) are per-task paired differences in a fixed order (the gate sorts by task id,
    so the result does not depend on the order pairs were recorded in). Together the two
    bounds form a two-sided (1 - 2 alpha) interval.
    """
    x = np.asarray(diffs, dtype=float)
    n = len(x)
    if n == 0:
        return (float("nan"), float("nan"))
    if n == 1 or np.all(x == x[0]):
        return (float(x[0]), float(x[0]))
    means = x[_resample_indices(n, n_boot, seed)].mean(axis=1)  # (n_boot,)
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


def _dm_logpmf(counts: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Dirichlet-multinomial log pmf; counts (m, K) of integers summing to r, prior (K,).

    Each per-category term depends on one count only, so it is tabulated once for 0..r and
    indexed (the sequential gate evaluates this on ~r^2/2 outcomes at every look)."""
    r = int(counts[0].sum())
    a0 = prior.sum()
    k = np.arange(r + 1)
    out = special.gammaln(a0) - special.gammaln(r + a0) + special.gammaln(r + 1)
    total = np.full(len(counts), out)
    for j, a in enumerate(prior):
        table = special.gammaln(k + a) - special.gammaln(a) - special.gammaln(k + 1)
        total += table[counts[:, j]]
    return total


def predictive_sign_pass(wins: int, losses: int, ties: int, remaining: int, alpha: float) -> float:
    """Predictive probability that the sign test passes (p <= alpha) after `remaining` more tasks.

    Each remaining task is a win, loss or tie (a dropped pair acts as a tie: it changes
    nothing) with probabilities drawn from the Jeffreys Dirichlet(1/2, 1/2, 1/2) posterior of
    the counts seen so far; the remaining counts are then Dirichlet-multinomial. Summed
    exactly over the (remaining + 1)^2 / 2 outcomes; past 600 remaining tasks a normal
    approximation of the final wins - losses replaces the sum (speed, not validity: this only
    feeds the futility heuristic).
    """
    if remaining <= 0:
        return 1.0 if sign_test_p(wins, losses) <= alpha else 0.0
    prior = np.array([wins + 0.5, losses + 0.5, ties + 0.5])
    if remaining > 600:
        share = prior / prior.sum()
        n_final = wins + losses + remaining * (share[0] + share[1])
        mean = wins - losses + remaining * (share[0] - share[1])
        # multinomial variance of (W - L) over the remaining tasks, plus posterior uncertainty
        var = remaining * ((share[0] + share[1]) - (share[0] - share[1]) ** 2)
        var += remaining**2 * (share[0] * (1 - share[0]) + share[1] * (1 - share[1]) + 2 * share[0] * share[1]) / (prior.sum() + 1)
        needed = stats.norm.ppf(1 - alpha) * np.sqrt(max(n_final, 1.0))
        return float(stats.norm.sf((needed - mean) / np.sqrt(max(var, 1e-12))))
    w_r, l_r = np.meshgrid(np.arange(remaining + 1), np.arange(remaining + 1), indexing="ij")
    valid = w_r + l_r <= remaining
    w_r, l_r = w_r[valid], l_r[valid]
    counts = np.stack([w_r, l_r, remaining - w_r - l_r], axis=-1)
    prob = np.exp(_dm_logpmf(counts, prior))
    final_w, final_n = wins + w_r, wins + losses + w_r + l_r
    passes = final_w >= critical_wins(wins + losses + remaining, alpha)[final_n]
    return float(np.clip(prob[passes].sum(), 0.0, 1.0))


def critical_wins(n_max: int, alpha: float) -> np.ndarray:
    """c[N] = fewest wins out of N non-ties with sign_test_p(c, N - c) <= alpha (N + 1 if none),
    so the grid above needs one comparison per outcome instead of one binomial tail each
    (coevo/power.py's exact power uses it too).

    >>> int(critical_wins(10, 0.05)[10])
    9
    """
    n = np.arange(n_max + 1)
    c = stats.binom.ppf(1 - alpha, n, 0.5) + 1  # P(X >= c) <= alpha  <=>  P(X <= c - 1) >= 1 - alpha
    c = np.where(n == 0, 1, c).astype(int)
    # guard against ppf rounding: step c up where its tail still exceeds alpha
    bad = stats.binom.sf(c - 1, n, 0.5) > alpha
    return np.where(bad, c + 1, c)


def predictive_mean_clears(diffs: np.ndarray, remaining: int, z: float, min_delta: float) -> float:
    """Predictive probability that, after `remaining` more tasks, mean - z * se > min_delta.

    Normal approximation: the remaining tasks' sum has mean r * dbar and variance
    r * s^2 (sampling) + r^2 * s^2 / k (uncertainty about dbar). s^2 gets one pseudo-task of
    variance 1/4 so that an all-ties start is not taken as certainty. Used for futility only.
    """
    x = np.asarray(diffs, dtype=float)
    k = len(x)
    n = k + remaining
    if n == 0:
        return 0.0
    if k == 0:
        return 0.5
    dbar = float(x.mean())
    s2 = (float(((x - dbar) ** 2).sum()) + 0.25) / k
    threshold = min_delta + z * np.sqrt(s2 / n)
    mean_final = dbar  # E[(k dbar + r dbar) / n]
    var_final = (remaining * s2 + remaining**2 * s2 / k) / n**2
    if var_final <= 0:
        return 1.0 if mean_final > threshold else 0.0
    return float(stats.norm.sf((threshold - mean_final) / np.sqrt(var_final)))
