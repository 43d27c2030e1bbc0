"""How many samples a percentile claim needs (MLPerf early stopping,
docs/statistics.md#sample-size-rules).

One-sided binomial rule: with N requests of which t exceed the target, the run supports
"p-th percentile ≤ target" at confidence c iff P[Binomial(N, 1−p) ≤ t] ≤ 1 − c.
The rule assumes independent requests: apply it to N_eff = N / design effect.
The binomial CDF is ``scipy.special.bdtr``, not ``scipy.stats.binom``: importing
``scipy.stats`` takes 0.35–0.6 s of ``capplan envelope``'s start (benchmarks/README.md).
"""

from __future__ import annotations

import math
from functools import lru_cache


@lru_cache(maxsize=4096)
def n_min(p: float, t: int = 0, confidence: float = 0.99) -> int:
    """Smallest N for which t requests over the target still support the p-quantile claim."""
    from scipy.special import bdtr
    if not (0.0 < p < 1.0):
        raise ValueError(f"percentile p must be in (0, 1), got {p}")
    if t < 0:
        raise ValueError("t must be ≥ 0")
    alpha = 1.0 - confidence
    q = 1.0 - p
    if t == 0:
        return math.ceil(math.log(alpha) / math.log(p))
    lo = t + 1
    hi = max(lo, 2 * math.ceil((t + 1) / q))
    while bdtr(t, hi, q) > alpha:
        hi *= 2
    while lo < hi:  # cdf(t; N, q) decreases in N
        mid = (lo + hi) // 2
        if bdtr(t, mid, q) <= alpha:
            hi = mid
        else:
            lo = mid + 1
    return lo


def enough_samples(n_eff: float, p: float, confidence: float = 0.99) -> bool:
    """Whether a percentile p may be printed at all: N_eff ≥ n_min(p, t=1)."""
    return n_eff >= n_min(p, 1, confidence)


def insufficient_message(n_eff: float, p: float, confidence: float = 0.99) -> str:
    return f"insufficient samples (N_eff = {n_eff:,.0f}, need {n_min(p, 1, confidence):,})"
