"""The bootstrap draws of a comparison.

Each run is resampled on its own (stratified circular block bootstrap, ``bootstrap.Circular``
on the run's time units), once per run; a paired comparison uses the *same* draws for both
sides, which share the time grid (``reduce.time_units_for``). The block is the reduction's
block-length rule (docs/statistics.md#block-length), the larger of the two sides, in units.
When a load level was run several times (repeats), the replicate first draws that level's runs
with replacement, then blocks inside them (two-stage), so the spread between runs is in the
interval. A run tested once has its within-run deviation widened by ``sd_factor`` instead —
every run of an independent comparison, the saturated ones of a paired one (docs/compare.md
§3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import bootstrap as boot
from .. import sketch

@dataclass(frozen=True)
class Draws:
    """Bootstrap replicates of one side (or of both, when paired).

    ``resamples[p]`` resamples pair p's sub-blocks ``offsets[p]:offsets[p+1]``;
    ``weights`` (reps × pairs) is how often each run is drawn in a replicate (1 without
    repeats); ``sd_factor[p]`` widens a run's within-run deviation (1 = as resampled)."""

    resamples: tuple[boot.Resample, ...]
    offsets: np.ndarray
    weights: np.ndarray
    sd_factor: np.ndarray

    @property
    def reps(self) -> int:
        return int(self.weights.shape[0])

    def point(self, X: np.ndarray, runs) -> np.ndarray:
        """Σ over the units of ``runs`` of per-unit values X ((units,) or (units × k))."""
        return sum((X[self.offsets[p]:self.offsets[p + 1]].sum(axis=0) for p in runs),
                   np.zeros(X.shape[1:]))

    def replicates(self, X: np.ndarray, runs) -> np.ndarray:
        """Replicate sums over ``runs`` ((reps,) or (reps × k)): per run the block-resampled
        sum, its deviation from the run's own sum widened by ``sd_factor`` (clipped at 0: a
        count stays a count), times how often the run is drawn."""
        out = np.zeros((self.reps,) + X.shape[1:])
        for p in runs:
            x = X[self.offsets[p]:self.offsets[p + 1]]
            s = x.sum(axis=0)
            r = self.resamples[p].sums(x)
            f = self.sd_factor[p]
            if f != 1.0:
                r = np.maximum(s + f * (r - s), 0.0)
            w = self.weights[:, p]
            out += r * (w[:, None] if r.ndim == 2 else w)
        return out


def draws(n_units: list[int], block_units: list[float], levels: list[float], reps: int,
          seed: int, stream: int, sd_factor: np.ndarray) -> Draws:
    """The replicates of one side: ``stream`` 0 for the baseline (and a paired candidate),
    1 for an independent candidate. Pair p's blocks come from ``default_rng([seed, stream,
    p])``; the repeat draws from ``default_rng([seed, stream, 2³¹ − 1])``: same seed, same
    replicates."""
    scheme = boot.Circular()
    res = []
    for p, (n, L) in enumerate(zip(n_units, block_units)):
        rng = np.random.default_rng([int(seed), int(stream), p])
        res.append(scheme.resample(int(n), float(L), reps, rng))
    offsets = np.concatenate([[0], np.cumsum(n_units)]).astype(np.int64)
    weights = np.ones((reps, len(res)))
    groups: dict[float, list[int]] = {}
    for p, lv in enumerate(levels):
        groups.setdefault(round(float(lv), 9), []).append(p)
    rng = np.random.default_rng([int(seed), int(stream), 2 ** 31 - 1])
    for members in groups.values():
        m = len(members)
        if m < 2:
            continue
        pick = rng.integers(m, size=(reps, m))
        counts = np.zeros((reps, m))
        np.add.at(counts, (np.repeat(np.arange(reps), m), pick.ravel()), 1.0)
        weights[:, members] = counts
    return Draws(tuple(res), offsets, weights, np.asarray(sd_factor, dtype=np.float64))


def repeated(levels: list[float]) -> np.ndarray:
    """Per pair: whether its load level was run more than once (two-stage resampling)."""
    lv = np.round(np.asarray(levels, dtype=np.float64), 9)
    _, inv, cnt = np.unique(lv, return_inverse=True, return_counts=True)
    return cnt[inv] > 1


def quantile(d: Draws, runs, units, keys_, counts, p: float, n_units: int
             ) -> tuple[float, np.ndarray]:
    """Point and replicate p-quantile over ``runs`` from histogram rows (global unit, log-bucket
    key, count). Only buckets above the point estimate's (1 − 10(1 − p)) quantile are held
    densely; the rest is a per-unit 'below' count (a replicate whose rank falls there is then
    recomputed densely)."""
    sel = np.zeros(units.size, dtype=bool)
    for r in runs:
        sel |= (units >= d.offsets[r]) & (units < d.offsets[r + 1])
    units, keys_, counts = units[sel], keys_[sel], counts[sel]
    if counts.size == 0 or counts.sum() == 0:
        return float("nan"), np.full(d.reps, np.nan)
    k_lo, k_hi = int(keys_.min()), int(keys_.max())
    full = np.bincount(keys_ - k_lo, weights=counts, minlength=k_hi - k_lo + 1)
    point = float(sketch.quantile_from_counts(full, k_lo, p))
    p_cut = max(0.0, 1.0 - 10.0 * (1.0 - p))
    cut_val = float(sketch.quantile_from_counts(full, k_lo, p_cut)) if p_cut > 0 else 0.0
    k_cut = max(k_lo, int(sketch.keys(cut_val)) - 1) if p_cut > 0 else k_lo
    reps = np.full(d.reps, np.nan)
    for attempt in (k_cut, k_lo):
        keep = keys_ >= attempt
        H = np.zeros((n_units, k_hi - attempt + 1))
        np.add.at(H, (units[keep], keys_[keep] - attempt), counts[keep])
        below = np.bincount(units[~keep], weights=counts[~keep], minlength=n_units)
        Hr = d.replicates(H, runs)
        br = d.replicates(below, runs)
        reps = sketch.quantile_from_counts(Hr, attempt, p,
                                           below=br if attempt > k_lo else None)
        if not (np.isnan(reps) & (Hr.sum(axis=1) + br > 0)).any():
            break
    return point, reps
