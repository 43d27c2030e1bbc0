"""The per-sweep core of the envelope fit: the per-run points (``Points``), the stratified
bootstrap over levels with its weighted isotonic fits (``sweep``), the first down-crossing of the
target on the logit scale, C_SLO with its interval and status (``cslo_from``, ``CSLO``), and the
knee and max-goodput points. The recipe is in ``capplan.envelope``'s docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import isotonic_regression

from .. import bootstrap as boot
from ..present import json_value
from ..reduce import BlockStats

STATUS_BRACKETED = "bracketed"
STATUS_ABOVE = "≥ max tested"
STATUS_BELOW = "< min tested"
SEED_SWEEP = 1_000_003  # stream id of the sweep-level draws (independent of run streams)


@dataclass(frozen=True)
class CSLO:
    """C_SLO with its interval. ``estimate`` is NaN when status is "< min tested"; with
    "≥ max tested" it is the largest tested rate (a lower bound on the truth)."""

    estimate: float
    ci_low: float
    ci_high: float
    lower_bound: float
    status: str
    confidence: float
    unit: str = "req/s"
    closed_loop: bool = False
    suggested_rates: tuple[float, ...] = ()
    load_at_capacity: float = math.nan  # closed loop: the concurrency that achieves it
    #: the constraint whose crossing is C_SLO: "attainment", "error_rate" (SLO.max_error_rate)
    #: or "" when nothing binds inside the tested range (status "≥ max tested")
    binding: str = "attainment"

    def to_dict(self) -> dict:
        return {k: json_value(v) for k, v in self.__dict__.items()}



# ============================================================================ helpers

def _logit(p):
    return np.log(p) - np.log1p(-p)


def _count_dtype(n_units: int, max_unit: float):
    # float32 counts and sums are exact only below 2^24 (docs/statistics.md#block-bootstrap)
    return np.float32 if n_units * max(max_unit, 1.0) * 2 < 2**24 else np.float64


def replicate_counts(stats: BlockStats, run, *, reps: int, seed: int,
                     scheme: boot.Scheme) -> np.ndarray:
    """The (reps × units) count matrix of the run's replicates (``BlockStats.resample``),
    for matrix statistics."""
    R = stats.resample(run, scheme, reps=reps, seed=seed)
    return R.counts(_count_dtype(run.n_units, float(run.units["n"].max()) if run.n_units else 1.0))


def request_total_replicates(stats: BlockStats, run, R, C: np.ndarray | None = None
                             ) -> np.ndarray:
    """Each replicate's request total of the run (the denominator of its replicate
    attainment), cached per replicate set: SLO-independent. From the count matrix ``C`` of
    ``R`` where the caller has it (the same integers as ``R``'s block sums, for less work)."""
    key = ("n_rep", id(R))
    nr = stats._cache.get(key)
    if nr is None:
        n = np.asarray(run.units["n"], dtype=np.float64)
        nr = stats._cache[key] = boot.count_sums(C, n) if C is not None else R.sums(n)
    return nr


# ============================================================================ per-sweep core

@dataclass(frozen=True)
class Points:
    """Per-run inputs of the sweep fit (usable runs only)."""

    run_id: np.ndarray
    level: np.ndarray      # manifest load level (grouping key)
    x_rate: np.ndarray     # req/s at the level (measured offered rate)
    n: np.ndarray
    n_good: np.ndarray
    good_rep: np.ndarray   # (reps × runs)
    n_rep: np.ndarray      # (reps × runs)
    n_eff: np.ndarray
    #: SLO.max_error_rate: per-run error counts (offered requests not ``ok``) and their
    #: replicates (reps × runs), None when the SLO has no error-rate limit
    n_err: np.ndarray | None = None
    err_rep: np.ndarray | None = None
    #: per run, the variance (req/s)² of its realised rate about its asked one
    #: (``envelope._rate_var``); given, each replicate moves each level's x by that noise (``sweep``)
    rate_var: np.ndarray | None = None


def sweep(points: Points, target: float, confidence: float, seed: int, closed_loop: bool,
           max_error_rate: float | None = None, two_stage: bool = True):
    """Stratified (two-stage) bootstrap over levels, isotonic fits, crossings. With
    ``max_error_rate`` (and ``points.err_rep``) the error rate gets the same treatment as an
    increasing curve, and each replicate's C_SLO is the smaller of the two crossings.
    ``two_stage=False``: the repeats at a level are pooled replicate by replicate (their
    replicates already carry the between-run variation)."""
    rng = np.random.default_rng([int(seed), SEED_SWEEP])
    levels = np.unique(points.level)
    reps = points.good_rep.shape[0]
    m = levels.size
    use_err = max_error_rate is not None and points.err_rep is not None
    A = np.empty((reps, m))
    E = np.empty((reps, m)) if use_err else None
    err = np.full(m, math.nan)
    att = np.empty(m)
    x = np.empty(m)
    xr = np.empty(m)
    nl = np.empty(m)
    neff = np.empty(m)
    nruns = np.empty(m, dtype=np.int64)
    for j, lv in enumerate(levels):
        idx = np.nonzero(points.level == lv)[0]
        nruns[j] = idx.size
        att[j] = points.n_good[idx].sum() / points.n[idx].sum()
        x[j] = lv if closed_loop else np.nanmean(points.x_rate[idx])
        xr[j] = np.nanmean(points.x_rate[idx])
        nl[j] = points.n[idx].sum()
        neff[j] = points.n_eff[idx].sum()
        if use_err:
            err[j] = points.n_err[idx].sum() / points.n[idx].sum()
        if idx.size == 1 or not two_stage:
            A[:, j] = (points.good_rep[:, idx].sum(axis=1) / points.n_rep[:, idx].sum(axis=1))
            if use_err:
                E[:, j] = points.err_rep[:, idx].sum(axis=1) / points.n_rep[:, idx].sum(axis=1)
        else:  # two-stage: resample repeats, then each one's own block replicate
            pick = idx[rng.integers(idx.size, size=(reps, idx.size))]
            row = rng.integers(reps, size=(reps, idx.size))
            A[:, j] = (points.good_rep[row, pick].sum(axis=1)
                       / points.n_rep[row, pick].sum(axis=1))
            if use_err:  # the same repeats and replicates as the attainment
                E[:, j] = (points.err_rep[row, pick].sum(axis=1)
                           / points.n_rep[row, pick].sum(axis=1))
    order = np.argsort(x, kind="stable")
    levels, A, att, x, xr, nl, neff, err, nruns = (
        levels[order], A[:, order], att[order], x[order], xr[order], nl[order], neff[order],
        err[order], nruns[order])
    eps = 0.5 / (nl + 1.0)
    X = x
    if points.rate_var is not None and not closed_loop:
        X = x[None, :] + _x_noise(points, levels, rng, reps)
    fitted, F, w, est, rep = _fit_curve(att, A, nl, neff, x, target, eps, X)
    out = dict(levels=levels, x=x, x_rate=xr, att=att, A=A, fitted=fitted, F=F, n=nl,
               n_eff=neff, n_runs=nruns, w=w, err=err, err_fitted=np.full(m, math.nan), E=E,
               binding_est="attainment", err_binds=np.zeros(reps, dtype=bool))
    if use_err:
        # an increasing error-rate curve ≡ a decreasing ok-share curve 1 − E with target
        # 1 − max_error_rate: the first down-crossing of the latter is the first up-crossing
        # of the former (logit(1 − p) = −logit p, so the interpolation is the same)
        E = E[:, order]
        out["E"] = E
        ofit, OF, _, oest, orep = _fit_curve(1.0 - err, 1.0 - E, nl, neff, x,
                                             1.0 - max_error_rate, eps, X)
        out["err_fitted"] = 1.0 - ofit
        e_est = est[0] if est[1] >= 0 else -1.0
        o_est = oest[0] if oest[1] >= 0 else -1.0
        if o_est < e_est or (oest[1] == -1 and est[1] != -1):
            est, out["binding_est"] = oest, "error_rate"
        binds = orep[0] < rep[0]
        rep = tuple(np.where(binds, b, a) for a, b in zip(rep, orep))
        out["err_binds"] = binds
    if est[1] == 1:
        out["binding_est"] = ""
    out.update(est=(float(est[0]), int(est[1]), int(est[2])), rep_x=rep[0], rep_flag=rep[1],
               rep_i=rep[2])
    return out


def _x_noise(points: Points, levels: np.ndarray, rng: np.random.Generator,
             reps: int) -> np.ndarray:
    """(reps × levels) draws of the error of each level's x — the mean *measured* rate of its
    runs — as the position of the *asked* rate the truth is defined at: N(0, mean realised-rate
    variance of its runs / their number). A 60-s Poisson run realises its rate ± 4 %; with the
    level's x held fixed, the replicate crossings could not see that the bracketing levels'
    positions are themselves draws (docs/envelope.md, "Short runs from real clients")."""
    rv = np.asarray(points.rate_var, dtype=np.float64)
    sd = np.array([math.sqrt(max(float(np.mean(rv[points.level == lv])), 0.0)
                             / np.count_nonzero(points.level == lv)) for lv in levels])
    return rng.standard_normal((reps, levels.size)) * sd[None, :]


def _fit_curve(att, A, nl, neff, x, target, eps, X=None):
    """Weighted decreasing isotonic fit of a proportion curve (estimate and replicates) and the
    first down-crossings of ``target``: (fitted, F, weights, (x, flag, i), (xs, flags, is)).
    ``X``: the replicates' own level positions (reps × levels; default ``x``)."""
    reps = A.shape[0]
    var = np.nanvar(A, axis=0)
    pt = (att * nl + 0.5) / (nl + 1.0)
    floor = pt * (1 - pt) / np.maximum(neff, 1.0)
    w = 1.0 / np.maximum(var, floor)
    fitted = isotonic_regression(att, weights=w, increasing=False).x
    F = np.empty_like(A)
    for r in range(reps):
        F[r] = isotonic_regression(A[r], weights=w, increasing=False).x
    est_x, est_flag, est_i = _crossing(fitted[None, :], x, target, eps)
    rep = _crossing(F, x if X is None else X, target, eps)
    return fitted, F, w, (float(est_x[0]), int(est_flag[0]), int(est_i[0])), rep


def _crossing(F: np.ndarray, x: np.ndarray, target: float, eps: np.ndarray):
    """First down-crossing of ``target`` by each row of F, interpolated on the logit scale.
    Returns (x*, flag, i) with flag −1 (< min tested; x* = 0), 0 (bracketed), +1 (≥ max
    tested; x* = max x); i is the index of the last passing level (−1 if none). ``x``: the
    levels' positions, shared (levels,) or per row (rows × levels)."""
    X = np.broadcast_to(np.asarray(x, dtype=np.float64), F.shape)
    passing = F >= target
    fail_any = ~passing
    first_fail = np.where(fail_any.any(axis=1), fail_any.argmax(axis=1), F.shape[1])
    out = np.empty(F.shape[0])
    flag = np.zeros(F.shape[0], dtype=np.int64)
    below = first_fail == 0
    above = first_fail == F.shape[1]
    mid = ~below & ~above
    out[below] = 0.0
    flag[below] = -1
    out[above] = X[above, -1]
    flag[above] = 1
    if mid.any():
        i = first_fail[mid]
        rows = np.nonzero(mid)[0]
        f0 = np.clip(F[rows, i - 1], eps[i - 1], 1 - eps[i - 1])
        f1 = np.clip(F[rows, i], eps[i], 1 - eps[i])
        lt = _logit(min(max(target, 1e-12), 1 - 1e-12))
        l0, l1 = _logit(f0), _logit(f1)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(l0 > l1, (l0 - lt) / (l0 - l1), 1.0)
        frac = np.clip(np.nan_to_num(frac, nan=1.0), 0.0, 1.0)
        out[rows] = X[rows, i - 1] + frac * (X[rows, i] - X[rows, i - 1])
    return out, flag, first_fail - 1


def cslo_from(sw: dict, target: float, confidence: float, closed_loop: bool,
               goodput_rep: np.ndarray | None, goodput: np.ndarray | None,
               run_effect: bool = False):
    est_x, est_flag, est_i = sw["est"]
    x = sw["x"]
    rep_x, rep_flag, rep_i = sw["rep_x"], sw["rep_flag"], sw["rep_i"]
    notes = []
    if closed_loop:
        # capacity = achieved goodput at the highest passing concurrency
        reps = rep_x.size
        vals = np.where(rep_i >= 0, goodput_rep[np.arange(reps), np.maximum(rep_i, 0)], 0.0)
        est = float(goodput[est_i]) if est_i >= 0 else math.nan
        load = float(x[est_i]) if est_i >= 0 else math.nan
    else:
        vals = rep_x
        est = est_x if est_flag >= 0 else math.nan
        load = math.nan
    lo, hi = boot.percentile_ci(vals, confidence)
    lb = boot.lower_bound(vals, confidence)
    if run_effect and est == est:
        # the upper end is Efron's bias-corrected (BC) one: replicate crossings sit mostly
        # below the estimate near a steep crossing (one replica with repeats), which leaves the
        # percentile interval short above (9 of 100 intervals entirely below the truth), and
        # mostly above it on a gentle one (the demo protocol), which leaves it long (0 of 300
        # below the truth). The lower end and the lower bound, the planning side, stay the
        # percentile's, whose coverage was measured (docs/envelope.md, "Coverage"); BC there
        # lowered the one-replica bound's coverage from 0.96 to 0.83.
        hi = boot.bias_corrected_ci(vals, est, confidence)[1]
        if not (lo <= est <= hi and lb <= est):
            # the estimate is a plausible value by construction: an interval of replicate
            # crossings that excludes it (replicates skewed by a bound near 0 or 1) is widened
            notes.append(f"the bootstrap interval [{lo:.3g}, {hi:.3g}] excluded the estimate "
                         f"{est:.3g}; widened to contain it")
            lo, hi, lb = min(lo, est), max(hi, est), min(lb, est)
    if est_flag == 1:
        status = STATUS_ABOVE
        hi = est if not closed_loop else max(hi, est)
        notes.append("every tested level meets the SLO: C_SLO is at least the largest tested "
                     "level; test higher rates to bracket it")
        suggested = tuple(float(f"{x[-1] * f:.3g}") for f in (1.25, 1.5, 2.0))
    elif est_flag == -1:
        status = STATUS_BELOW
        lo, lb = 0.0, min(lb, 0.0) if lb == lb else 0.0
        notes.append("no tested level meets the SLO: C_SLO is below the smallest tested level")
        suggested = tuple(float(f"{x[0] * f:.3g}") for f in (0.25, 0.5, 0.75))
    else:
        status = STATUS_BRACKETED
        suggested = ()
        if not closed_loop:
            i = est_i + 1
            width = x[i] - x[i - 1]
            if width > max(0.1 * est, hi - lo):
                suggested = tuple(float(f"{v:.3g}") for v in np.linspace(x[i - 1], x[i], 5)[1:-1])
                notes.append(f"the bracket [{x[i - 1]:.3g}, {x[i]:.3g}] is wide: interpolation "
                             "error between tested rates is not in the CI; add rates "
                             + ", ".join(f"{v:g}" for v in suggested))
    if status == STATUS_BRACKETED and not closed_loop and "n_runs" in sw and not run_effect:
        i = est_i + 1
        single = [x[j] for j in (i - 1, i) if sw["n_runs"][j] < 2]
        if single:
            notes.append(
                "the rates bracketing C_SLO (" + ", ".join(f"{v:.3g}" for v in single)
                + ") have a single run each: near saturation runs differ far more than a "
                "within-run bootstrap can see, and a single run is usually optimistic (rare "
                "congestion episodes), so the interval and lower bound can be too high; "
                "repeat those rates (≥ 3 runs each) — see docs/envelope.md, 'Coverage'")
    frac_below = float(np.mean(rep_flag == -1))
    if status != STATUS_BELOW and frac_below > (1 - confidence) / 2:
        notes.append(f"{frac_below:.0%} of replicates fail already at the lowest tested level: "
                     "the lower end of the interval is censored at 0")
    binding = sw.get("binding_est", "attainment")
    if sw.get("E") is not None:
        share = float(np.mean(sw["err_binds"]))
        which = {"attainment": "the attainment target binds",
                 "error_rate": "the error-rate limit binds",
                 "": "neither constraint binds inside the tested range"}[binding]
        notes.append(f"{which} at the estimate; the error-rate limit binds in {share:.0%} of "
                     "bootstrap replicates")
    cs = CSLO(estimate=float(est), ci_low=float(lo), ci_high=float(hi), lower_bound=float(lb),
              status=status, confidence=confidence, closed_loop=closed_loop,
              suggested_rates=suggested, load_at_capacity=load, binding=binding)
    return cs, notes, vals


def knee_and_max(x, goodput, throughput, x_rate) -> tuple[dict, dict]:
    """Max-goodput point, and the saturation knee: the last level before goodput stops
    following load (marginal goodput ΔG/Δλ below one half of the marginal offered rate)."""
    mg = {"x": math.nan, "goodput_rps": math.nan}
    if goodput.size:
        j = int(np.nanargmax(goodput))
        mg = {"x": float(x[j]), "goodput_rps": float(goodput[j]), "offered_rps": float(x_rate[j])}
    knee = {"x": math.nan, "method": "first level where ΔG/Δλ < 0.5 (goodput vs offered rate)"}
    if goodput.size >= 2:
        dx = np.diff(x_rate)
        with np.errstate(invalid="ignore", divide="ignore"):
            slope = np.diff(goodput) / dx
        bad = np.nonzero(slope < 0.5)[0]
        if bad.size:
            knee.update({"x": float(x[bad[0]]), "goodput_rps": float(goodput[bad[0]]),
                         "throughput_rps": float(throughput[bad[0]])})
    return knee, mg
