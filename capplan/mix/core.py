"""Array arithmetic of the mix machinery, free of studies and files (docs/mix.md).

*Reweighting one run.* A run's requests fall in cells c (length buckets, tenant, class) with
n_c requests, k_c of them SLO-good. Its attainment at a target mix with shares w_c is the
post-stratified estimate  A_w = Σ_c w_c · k_c / n_c.  Inside the bootstrap every replicate
recomputes each cell's ratio from the *same* block draw (``R.sums`` of the per-(unit, cell)
counts) and reweights it, so the interval carries the cells' sampling error and their
dependence in time, and the composition of a replicate (how many long prompts it happened to
draw) does not add noise the estimator does not have.

A cell with no failures (or no successes) in a run has nothing to resample; as for a whole
run in the envelope (docs/statistics.md#degenerate-runs) its replicate ratios are drawn from
Beta(N_eff, 1) (or Beta(1, N_eff)), N_eff = n_c / design effect of the run, so a small perfect
cell cannot make the interval collapse.

*Effective sample size.* With request weights v_i = w_c(i) / (n_c / n), Kish's
ESS = (Σ v)² / Σ v² = 1 / Σ_c (w_c² / n_c): what the reweighted estimate is worth in iid
requests (n when the target equals the tested mix; small when a target cell with a large share
has few tested requests). Divided by the run's design effect it is the N_eff the isotonic fit
weighs the run with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RunReweight:
    """One run's reweighted attainment and its bootstrap replicates."""

    point: float
    replicates: np.ndarray  # (reps,)
    ess: float               # Kish effective sample size of the reweighting (requests)
    n: float                 # requests of the run in the target's cells
    degenerate_cells: int    # cells whose replicates came from the Beta floor
    empty_draws: int         # (replicate, cell) pairs that drew no request of the cell


def kish_ess(w, n_c) -> float:
    """1 / Σ_c (w_c² / n_c) over cells with w_c > 0 (weights summing to 1 there)."""
    w = np.asarray(w, float)
    n_c = np.asarray(n_c, float)
    a = w > 0
    if not a.any():
        return 0.0
    if np.any(n_c[a] <= 0):
        return 0.0
    wa = w[a] / w[a].sum()
    return float(1.0 / np.sum(wa ** 2 / n_c[a]))


def reweight_run(R, n_uc: np.ndarray, good_uc: np.ndarray, w: np.ndarray, *, deff: float = 1.0,
                 rng: np.random.Generator) -> RunReweight:
    """Reweight one run. ``R``: the run's replicates (anything with ``sums(values)`` →
    (reps × k), e.g. ``bootstrap.Resample``); ``n_uc``/``good_uc``: (units × cells) counts;
    ``w``: (cells,) target shares (zero for cells outside the target). Every cell with w > 0
    must have requests in the run (the caller refuses the mix otherwise)."""
    w = np.asarray(w, float)
    a = np.flatnonzero(w > 0)
    wa = w[a] / w[a].sum()
    n_c = n_uc[:, a].sum(axis=0)
    k_c = good_uc[:, a].sum(axis=0)
    if np.any(n_c <= 0):
        raise ValueError("reweight_run: a target cell has no requests in this run")
    p_c = k_c / n_c
    point = float(wa @ p_c)
    N = np.asarray(R.sums(n_uc[:, a]), float).reshape(-1, a.size)
    K = np.asarray(R.sums(good_uc[:, a]), float).reshape(-1, a.size)
    empty = N <= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(empty, p_c[None, :], K / np.where(empty, 1.0, N))
    reps = ratio.shape[0]
    degenerate = (k_c == 0) | (k_c == n_c)
    d = max(float(deff) if deff == deff else 1.0, 1.0)
    for j in np.flatnonzero(degenerate):
        ne = max(n_c[j] / d, 1.0)
        ratio[:, j] = rng.beta(ne, 1.0, size=reps) if k_c[j] == n_c[j] else rng.beta(1.0, ne, size=reps)
    return RunReweight(point=point, replicates=ratio @ wa, ess=kish_ess(wa, n_c), n=float(n_c.sum()),
                       degenerate_cells=int(degenerate.sum()), empty_draws=int(empty.sum()))


# ----------------------------------------------------------------------------- joint crossings


@dataclass(frozen=True)
class JointCrossing:
    """C_SLO when several curves must all hold (SLO classes): per replicate the smallest of
    the curves' crossings — one joint bootstrap, because every curve's replicate r comes from
    the same block draw of every run (and the same picks of repeats)."""

    estimate: float
    ci_low: float
    ci_high: float
    lower_bound: float
    flag: int                 # −1 below the tested range, 0 bracketed, +1 above
    binding: str              # the curve whose crossing is the estimate ("" when none binds)
    binding_share: dict       # curve → share of replicates in which it binds
    replicates: np.ndarray    # joint replicate values (censored as the envelope's)
    flags: np.ndarray


def joint_crossing(names, estimates, est_flags, replicates, rep_flags, *, x_max: float,
                   confidence: float) -> JointCrossing:
    """Combine per-curve crossings: estimates/flags (one per curve) and replicates/flags
    ((curves × reps), censored at 0 below and at ``x_max`` above, as the envelope's)."""
    from ..bootstrap import lower_bound, percentile_ci

    est = np.array([x if f >= 0 else 0.0 for x, f in zip(estimates, est_flags)], float)
    est = np.where(np.asarray(est_flags) == 1, x_max, est)
    V = np.asarray(replicates, float)
    Fl = np.asarray(rep_flags, int)
    j = np.argmin(V, axis=0)
    vals = V[j, np.arange(V.shape[1])]
    flags = np.where((Fl == -1).any(axis=0), -1, np.where((Fl == 1).all(axis=0), 1, 0))
    ef = np.asarray(est_flags, int)
    if (ef == -1).any():
        flag, e, bind = -1, math.nan, names[int(np.flatnonzero(ef == -1)[0])]
    elif (ef == 1).all():
        flag, e, bind = 1, float(x_max), ""
    else:
        i = int(np.argmin(est))
        flag, e, bind = 0, float(est[i]), names[i]
    lo, hi = percentile_ci(vals, confidence)
    lb = lower_bound(vals, confidence)
    if flag == 1:
        hi = e
    if flag == -1:
        lo, lb = 0.0, 0.0
    share = {n: float(np.mean((j == i) & (flags != 1))) for i, n in enumerate(names)}
    return JointCrossing(estimate=e, ci_low=float(lo), ci_high=float(hi), lower_bound=float(lb), flag=flag,
                         binding=bind, binding_share=share, replicates=vals, flags=flags)

