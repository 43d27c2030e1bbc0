"""Log-bucket latency histograms: keys, merging, and quantile reading
(docs/statistics.md#log-bucket-histograms).

A value x > 0 falls in bucket ``k = ceil(ln x / ln γ)`` with ``γ = (1+α)/(1−α)``, i.e. bucket k
covers ``(γ^(k−1), γ^k]``. The representative value ``2γ^k/(1+γ)`` is within relative error α of
every value in the bucket (DDSketch, Masson, Rim & Lee 2019). Counts are integers, so per-block
histograms merge exactly and in any order — which is what a bootstrap needs (a t-digest's merge
is order-dependent).

Quantiles are read from the cumulative counts with **log-uniform interpolation inside the
bucket**: a rank that lands a fraction f into bucket k reads ``γ^(k−1+f)``. Without it, bootstrap
quantiles snap to bucket values and the replicate spread inflates
(docs/statistics.md#log-bucket-histograms).

The SQL form of the key is ``reduce.sql.key_sql``, with the same clamp (``MIN_VALUE``) and
epsilon (``KEY_EPS``), so that the reduction and numpy agree.
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_ALPHA = 0.005
#: values below this (ms) share the lowest bucket (ln of 0 or a negative is undefined)
MIN_VALUE = 1e-3
#: keys are ceil(ln x / ln γ − KEY_EPS): a value exactly on a bucket edge γ^k (up to rounding
#: of ln) lands in bucket k in numpy and SQL alike
KEY_EPS = 1e-9


def gamma_of(alpha: float = DEFAULT_ALPHA) -> float:
    """γ = (1+α)/(1−α) for relative accuracy α."""
    if not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return (1.0 + alpha) / (1.0 - alpha)


def keys(x, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """Bucket key ceil(ln x / ln γ) of each value (values below MIN_VALUE are clamped)."""
    return keys_of_log(log_clamped(x), alpha).astype(np.int64)


def log_clamped(x, out: np.ndarray | None = None) -> np.ndarray:
    """ln of each value clamped at MIN_VALUE, as float64 (NaN stays NaN): the one logarithm
    a value's key and its grid code share (``reduce.count.request_codes``). ``out``: a float64
    array of x's shape to write into."""
    x = np.asarray(x, dtype=np.float64)
    if out is None and x.ndim == 0:
        return np.log(np.maximum(x, MIN_VALUE))
    out = np.maximum(x, MIN_VALUE, out=out)
    return np.log(out, out=out)


def keys_of_log(lnx: np.ndarray, alpha: float = DEFAULT_ALPHA,
                out: np.ndarray | None = None) -> np.ndarray:
    """The keys of ``keys`` from ``log_clamped`` values, as float64 (NaN where the value is
    missing): ⌈ln x / ln γ − KEY_EPS⌉, the operations of ``keys`` in its order. ``out``: as
    in ``log_clamped``."""
    k = np.divide(lnx, math.log(gamma_of(alpha)), out=out)
    k = np.subtract(k, KEY_EPS, out=k if isinstance(k, np.ndarray) else None)
    return np.ceil(k, out=k) if isinstance(k, np.ndarray) else np.ceil(k)


def bucket_value(k, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """Representative value 2γ^k/(1+γ) of bucket k (relative error ≤ α)."""
    g = gamma_of(alpha)
    return 2.0 * np.power(g, np.asarray(k, dtype=np.float64)) / (1.0 + g)


def histogram(x, alpha: float = DEFAULT_ALPHA) -> tuple[int, np.ndarray]:
    """Dense histogram of the values: (first key, counts). NaNs are ignored."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return 0, np.zeros(0, dtype=np.int64)
    k = keys(x, alpha)
    k0 = int(k.min())
    return k0, np.bincount(k - k0).astype(np.int64)


def quantile_from_counts(counts, k0: int, p, alpha: float = DEFAULT_ALPHA,
                         below: np.ndarray | float | None = None) -> np.ndarray:
    """Quantile(s) p read from histogram(s) with log-uniform in-bucket interpolation.

    ``counts`` is (..., bins) for consecutive keys starting at ``k0``; leading axes are
    independent histograms (e.g. bootstrap replicates). ``below`` is the count of values under
    bucket k0 that the histogram does not hold (tail-only histograms); a rank that falls there
    reads NaN. Rank is p·N (inverse-CDF definition, Hyndman & Fan type 1 before interpolation).
    Returns an array of shape (..., len(p)) or (...) for a scalar p.
    """
    counts = np.asarray(counts, dtype=np.float64)
    scalar = np.ndim(p) == 0
    ps = np.atleast_1d(np.asarray(p, dtype=np.float64))
    lead = counts.shape[:-1]
    c2 = counts.reshape(-1, counts.shape[-1])
    below_arr = np.zeros(c2.shape[0]) if below is None else np.broadcast_to(
        np.asarray(below, dtype=np.float64), lead).reshape(-1)
    cum = np.cumsum(c2, axis=1)
    total = cum[:, -1] + below_arr if c2.shape[1] else below_arr
    ln_g = math.log(gamma_of(alpha))
    out = np.full((c2.shape[0], ps.size), np.nan)
    for j, pj in enumerate(ps):
        rank = pj * total - below_arr  # rank inside the held buckets
        # first bucket whose cumulative count reaches the rank (rank > 0 ⇒ strictly positive)
        idx = (cum < rank[:, None]).sum(axis=1)
        idx = np.minimum(idx, c2.shape[1] - 1)
        rows = np.arange(c2.shape[0])
        prev = np.where(idx > 0, cum[rows, np.maximum(idx - 1, 0)], 0.0)
        cnt = c2[rows, idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            f = np.clip(np.where(cnt > 0, (rank - prev) / cnt, 1.0), 0.0, 1.0)
        val = np.exp((k0 + idx - 1 + f) * ln_g)
        val[(rank <= 0) & (below_arr > 0)] = np.nan
        val[total <= 0] = np.nan
        out[:, j] = val
    out = out.reshape(*lead, ps.size)
    return out[..., 0] if scalar else out
