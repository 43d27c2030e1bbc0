"""The per-run table of the envelope fit: each run's attainment with its interval, design
effect (borrowed from a donor run when the run is degenerate), N_eff and early-stopping check
(``run_table``); the SLO-independent percentiles with the p99 interval (``run_percentiles``);
and the grouping of asked rates into load levels (``group_levels``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .. import bootstrap as boot
from .. import honesty as hon
from .. import sketch
from ..contract import PERCENTILES, ci_cols, pct_col
from ..diagnostics import NO_STEADY_STATE  # the exclusion's reason prefix
from ..earlystop import n_min
from ..reduce import BlockStats
from ..slo import SLO
from .core import SEED_SWEEP, replicate_counts, request_total_replicates

#: runs asked at rates closer than this (relative) are one load level: a design that asks for
#: 3 × 10.0871 and 3 × 10.1189 req/s asked for six repeats, and a client cannot tell such rates
#: apart (a 60-s Poisson run realises its rate ± 4 %). 1 %: rates that round to the same three
#: significant digits (``honesty.askable``) join; the demo's 5.4 and 5.5 (1.8 %, one SD of a
#: 600-s run's realised rate) stay apart. docs/envelope.md, "Levels and repeats".
LEVEL_TOL_REL = 0.01
P_CI = 0.99  # the percentile that gets a bootstrap CI in the per-run table


def run_table(stats: BlockStats, slo: SLO, good_units, *, reps, seed, scheme: boot.Scheme,
               confidence, method: str = "within-run"):
    """Per-run attainment (+ CI, design effect, N_eff, early stopping) and percentiles.

    With ``method="run-effect"``: a run with no failures borrows a design effect only from a
    run at a *lower* load (``_borrowed_deff``), and a run excluded only because its warm-up
    search found no steady state stays in the fit when it fails the target (it is evidence
    against capacity above its rate; ``kept_as_evidence``)."""
    diag = stats.diagnostics.set_index("run_id")
    rows, good_rep, n_rep = [], [], []
    per = []
    with_err = slo.max_error_rate is not None
    err_raw, err_rep = {}, []
    kept = set()
    for r, gu in zip(stats.runs, good_units):
        usable = bool(diag.loc[r.run_id, "usable"]) if r.run_id in diag.index else False
        n = r.n
        k = float(np.sum(gu))
        if (method == "run-effect" and not usable and n and k / n < slo.attainment
                and all(x.startswith(NO_STEADY_STATE)
                        for x in str(diag.loc[r.run_id, "reason"]).split("; "))):
            usable = True  # a failing run without steady state still bounds capacity above
            kept.add(r.run_id)
        if r.n_units == 0 or n == 0:
            per.append((r, usable and False, n, k, None, None, math.nan))
            continue
        a = k / n
        if scheme.independent:  # requests independent: request-level resampling ≡ binomial
            rng_i = np.random.default_rng([int(seed), int(r.run_idx)])
            gr = rng_i.binomial(n, a, size=reps).astype(np.float64)
            nr_ = np.full(reps, float(n))
        else:
            R = stats.resample(r, scheme, reps=reps, seed=seed)
            gr = R.sums(gu)
            nr_ = request_total_replicates(stats, r, R)
        att_rep = gr / nr_
        deff = boot.design_effect(float(np.var(att_rep)), a, n)
        per.append((r, usable, n, k, gr, nr_, deff))
        if with_err:
            bad_u = r.units["n"] - r.units["n_ok"]
            if scheme.independent:  # own stream: the attainment draws above are unchanged
                rng_e = np.random.default_rng([int(seed), SEED_SWEEP + 4, int(r.run_idx)])
                err_raw[r.run_id] = rng_e.binomial(n, bad_u.sum() / n, size=reps) / n
            else:  # replicate error *rates*, so they pair with whatever denominators follow
                err_raw[r.run_id] = R.sums(bad_u) / nr_
    donors = _deff_donors(per)
    below_only = method == "run-effect"
    rng = np.random.default_rng([int(seed), SEED_SWEEP + 1])
    rng_err = np.random.default_rng([int(seed), SEED_SWEEP + 4])
    for r, usable, n, k, gr, nr_, deff in per:
        a = k / n if n else math.nan
        degenerate = gr is not None and (k == 0 or k == n)
        if deff == deff:
            d_used, d_src = deff, "own"
        else:
            d_used, d_src = _borrowed_deff(r.load_level, donors, below_only=below_only)
        neff = boot.n_effective(n, d_used) if n else 0.0
        if gr is not None:
            if degenerate:  # Clopper–Pearson floor at N_eff (docs/statistics.md#degenerate-runs)
                keff = a * neff
                lo, hi = boot.clopper_pearson(keff, neff, confidence)
                draws = (rng.beta(max(neff, 1.0), 1.0, size=reps) if k == n
                         else rng.beta(1.0, max(neff, 1.0), size=reps))
                gr = draws * n
                nr_ = np.full(reps, float(n))
            else:
                lo, hi = boot.percentile_ci(gr / nr_, confidence)
        else:
            lo = hi = math.nan
        n_err = float(n - r.units["n_ok"].sum()) if r.n_units else 0.0
        if with_err:
            er = err_raw.get(r.run_id)
            if er is not None and gr is not None and (n_err == 0 or n_err == n):
                # no errors (or only errors): nothing to resample; Beta floor at N_eff,
                # scaled to the run's own replicate denominators
                ne = max(neff, 1.0)
                d = rng_err.beta(1.0, ne, size=reps) if n_err == 0 else rng_err.beta(ne, 1.0,
                                                                                      size=reps)
                er = d
            err_rep.append(er * nr_ if er is not None else np.full(reps, math.nan))
        bad_eff = int(round((n - k) * neff / n)) if n else 0
        need = n_min(slo.attainment, bad_eff, 0.99) if n else 0
        row = {
            "run_id": r.run_id, "load_level": r.load_level, "offered_rps": r.offered_rps,
            "concurrency": r.concurrency, "repeat": r.repeat,
            "measured_rps": r.measured_rps,
            "n": n, "n_good": int(k), "n_ok": int(r.units["n_ok"].sum()) if r.n_units else 0,
            "attainment": a, "att_ci_low": lo, "att_ci_high": hi,
            "n_errors": int(n_err), "error_rate": n_err / n if n else math.nan,
            "ci_floor": "clopper-pearson" if degenerate else "",
            "design_effect": deff, "design_effect_used": max(d_used, 1.0) if n else math.nan,
            "design_effect_source": d_src if n else "", "n_eff": neff,
            "early_stop_ok": bool(neff >= need), "early_stop_n_min": need,
            "block_len": 1.0 if scheme.independent else scheme.pw_length(r.block_len),
            "block_len_good": (scheme.pw_length(r.block_len_good) if r.block_len_good
                               is not None and not scheme.independent else math.nan),
            "block_len_latency": (scheme.pw_length(r.block_len_latency) if
                                  r.block_len_latency is not None and not scheme.independent
                                  else math.nan),
            "block_metric": r.block_metric,
            "unit_size": r.unit_size, "warmup_s": r.warmup_s,
            "duration_s": r.warmup_s + r.span_s if r.span_s == r.span_s else math.nan,
            "usable": usable,
            "reason": ("" if r.run_id in kept else str(diag.loc[r.run_id, "reason"]))
            if r.run_id in diag.index else "no data",
            "warnings": "; ".join(w for w in (
                str(diag.loc[r.run_id, "warnings"]) if r.run_id in diag.index else "",
                "no steady state (MSER-5) but it fails the target: kept as evidence against "
                "capacity above its rate" if r.run_id in kept else "") if w),
            "kept_as_evidence": r.run_id in kept,
        }
        for st in ("rejected", "timeout", "error", "cancelled"):
            row[f"n_{st}"] = int(r.units[f"st_{st}"].sum()) if r.n_units else 0
        rows.append(row)
        if gr is not None:
            good_rep.append(gr)
            n_rep.append(nr_)
        else:
            good_rep.append(np.full(reps, math.nan))
            n_rep.append(np.full(reps, math.nan))
    E = (np.column_stack(err_rep) if err_rep else np.zeros((reps, 0))) if with_err else None
    return pd.DataFrame(rows), np.column_stack(good_rep) if good_rep else np.zeros((reps, 0)), \
        np.column_stack(n_rep) if n_rep else np.zeros((reps, 0)), E


#: a run lends its design effect to a degenerate run only with at least this many of its
#: rarer outcome: with one event the block-bootstrap design effect is exactly 1 whatever the
#: clustering (the event's draw count is ~Poisson(1)), and with a few isolated events ≈ 1.
MIN_DONOR_EVENTS = 5


def _deff_donors(per) -> list[tuple[float, float, str]]:
    """(load level, design effect, run_id) of the runs whose design effect can be lent to a
    degenerate run, in order of preference: usable runs with ≥ MIN_DONOR_EVENTS of each
    outcome; else usable non-degenerate runs; else any non-degenerate run."""
    def pick(cond):
        return [(float(r.load_level), float(d), r.run_id) for r, u, n, k, gr, nr_, d in per
                if d == d and cond(u, n, k)]

    for cond in (lambda u, n, k: u and min(k, n - k) >= MIN_DONOR_EVENTS,
                 lambda u, n, k: u, lambda u, n, k: True):
        ok = pick(cond)
        if ok:
            return ok
    return []


def _borrowed_deff(level: float, donors, below_only: bool = False) -> tuple[float, str]:
    """Design effect for a run with no failures (or no successes), whose own bootstrap
    variance is zero: that of the nearest non-degenerate run by load level, ties to the
    lower level (the run most like it in load, not a sweep-wide median dominated by
    near-saturation runs). With no donor at all, 1 (iid), said in the source.

    ``below_only`` (the run-effect method): only a run at a lower or equal load may lend.
    Stated prior: violations where none were seen cluster no more than at the nearest load
    below with violations (congestion episodes grow with load); with no such run, requests
    are taken as independent — the run's own data (n requests, none failed) then give the
    Clopper–Pearson bound at n. Lending the design effect of an overloaded run above (≈ 45)
    to a light-load run left it N_eff ≈ 6 and an attainment interval [0.54, 1] that its data
    do not justify (docs/statistics.md#degenerate-runs)."""
    lv = float(level)
    if below_only:
        donors = [d for d in donors if d[0] <= lv]
        if not donors:
            return 1.0, "none below: iid (no lower-load run with both outcomes)"
    if not donors:
        return 1.0, "none: iid (no run with both outcomes)"
    best = min(donors, key=lambda t: (abs(t[0] - lv), t[0]))
    return max(best[1], 1.0), f"nearest run {best[2]}"


def run_percentiles(stats: BlockStats, *, reps, seed, scheme: boot.Scheme, confidence):
    """SLO-independent per-run percentiles (+ p99 CI), cached on the stats."""
    key = ("pct", reps, seed, scheme, confidence)
    if key in stats._cache:
        return stats._cache[key]
    rows = []
    for r in stats.runs:
        row = {"run_id": r.run_id}
        C = (replicate_counts(stats, r, reps=reps, seed=seed, scheme=scheme)
             if r.n_units and r.tail else None)
        if C is not None:  # the attainments' denominators, while the matrix is at hand
            request_total_replicates(stats, r, stats.resample(r, scheme, reps=reps, seed=seed), C)
        for m in ("ttft", "tpot", "itl", "e2e"):
            for p in PERCENTILES:
                row[pct_col(m, p)] = r.percentile(m, p, stats.alpha)
            lo = hi = math.nan
            tail = r.tail.get(m)
            if tail is not None and r.n_units:
                k0, h, below = tail
                q = boot.quantile_replicates(C, h, k0, P_CI, stats.alpha,
                                             below=below)
                lo, hi = boot.percentile_ci(q, confidence)
            ci_lo, ci_hi = ci_cols(pct_col(m, P_CI, unit=""))
            row[ci_lo], row[ci_hi] = lo, hi
        lag = r.hist.get("gen_lag_ms")
        row["gen_lag_p99_ms"] = (float(sketch.quantile_from_counts(lag[1], lag[0], 0.99, stats.alpha))
                                 if lag else math.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    stats._cache[key] = df
    return df


def group_levels(asked, tol_rel: float = LEVEL_TOL_REL, span_s=None) -> np.ndarray:
    """The load level of each run: runs whose asked rates lie within a tolerance of their
    neighbour (single linkage on the sorted distinct rates) share one level, placed at the
    run-weighted mean of their asked rates. The tolerance is ``tol_rel``, or — given the runs'
    measured lengths ``span_s`` — one standard deviation of the rate a Poisson run of that
    length realises (1/√(λ·T) relative) when that is larger: a 60-s run at 10 req/s lands ± 4 %
    from its asked rate, so runs asked 2–3 % apart cannot be told apart by the data and, as
    separate one-run levels, gave intervals too narrow (the simulated short-run loop's lower
    bound covered 0.77). A level spans at most two such tolerances from its lowest rate (± one
    SD about its middle): without that cap, rates each one SD apart chained into one level —
    a real GuideLLM loop's 13-s runs asked from 6.4 to 10 req/s became one "level" of 8 runs
    with attainments from 0 to 1, and its bracket was gone. Levels are *what was asked*; the
    fit's x is each level's mean *measured* rate."""
    a = np.asarray(asked, dtype=np.float64)
    out = a.copy()
    u = np.unique(a[np.isfinite(a)])
    if u.size < 2:
        return out
    span = None
    if span_s is not None:
        sp = np.asarray(span_s, dtype=np.float64)
        ok = np.isfinite(sp) & (sp > 0)
        span = float(np.median(sp[ok])) if ok.any() else None
    def tol(rate: float) -> float:
        return tol_rel if span is None else max(tol_rel, hon.rate_noise_rel(rate, span))
    start = 0
    for i in range(1, u.size + 1):
        if i == u.size or u[i] > u[i - 1] * (1.0 + tol(u[i - 1])) \
                or u[i] > u[start] * (1.0 + 2.0 * tol(u[start])):
            grp = u[start:i]
            if grp.size > 1:
                sel = np.isin(a, grp)
                out[sel] = float(np.mean(a[sel]))
            start = i
    return out
