"""The twin's steady-state C_SLO: the largest Poisson rate (at the measured mix) whose long-run
attainment meets the SLO, with a 95 % interval.

Each evaluation simulates one long run (``duration_s``, the first ``warmup_s`` left out) and
counts SLO-good requests with :func:`capplan.twin.replay.run_metrics` (the pipeline's
definitions). A crossing is found by bracketing and bisection at a fixed seed (common random
numbers: arrival gaps scale with the rate, so the curve being bisected is the same at every
step).

- **estimate**: the mean crossing over ``runs`` independent workloads at the fitted
  parameters (its Monte-Carlo standard error from their spread);
- **parameter effect**: for each of ``draws`` parameter draws (:meth:`Twin.draw`), the shift of
  the crossing on the *same* workload, read from the attainment at three rates around the
  estimate (logit-linear interpolation, as the envelope's crossing);
- **interval**: estimate ± 1.96 · sqrt(Monte-Carlo SE² + variance of the parameter effects).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import multiprocessing as mp
import numpy as np

from ..slo import SLO
from ..synth.config import ArrivalSpec
from ..synth.events import token_times
from ..synth.sweep import simulate_level
from .replay import Outcome, run_metrics

STEADY_DURATION_S = 1800.0  # at least this long …
STEADY_REQUESTS = 20_000  # … and long enough for this many requests at the first guess
STEADY_WARMUP_SHARE = 1 / 6  # of the run, left out
REL_TOL = 0.005
SEED_OFFSET = 2_000_003


@dataclass(frozen=True)
class SteadyCSLO:
    estimate: float
    ci_low: float
    ci_high: float
    draws: tuple[float, ...]
    duration_s: float
    warmup_s: float
    evaluations: int
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        f = lambda x: None if x is None or not math.isfinite(x) else round(float(x), 6)  # noqa: E731
        return {"estimate": f(self.estimate), "ci_low": f(self.ci_low), "ci_high": f(self.ci_high),
                "kind": "steady state: Poisson arrivals at the measured mix, long runs",
                "duration_s": self.duration_s, "warmup_s": self.warmup_s, "draws": len(self.draws),
                "notes": list(self.notes)}


def attainment(twin: "Twin", rate: float, slo: SLO, *, duration_s: float, warmup_s: float,
               seed_key: tuple[int, ...], seed: int = 0) -> float:
    cfg = twin.synth_config(rates=(rate,), duration_s=duration_s, warmup_s=warmup_s, seed=seed,
                            itl=slo.itl_ms is not None)
    cfg = replace(cfg, arrival=ArrivalSpec("poisson"))
    res = simulate_level(cfg, rate, duration_s=duration_s, seed_key=seed_key)
    need_itl = slo.itl_ms is not None
    n_recv, first, last, off, val = token_times(res, with_itl=need_itl)
    p99 = mx = None
    if need_itl:
        from .replay import _itl_stats

        p99, mx = _itl_stats(off, val, n_recv > 1)
    o = Outcome(res.sched_ns, first, last, n_recv, res.status.astype(np.int8), p99, mx)
    return run_metrics(o, slo, int(warmup_s * 1e9))["attainment"]


def crossing(twin: "Twin", slo: SLO, *, start: float, duration_s: float, warmup_s: float,
             seed_key: tuple[int, ...], bracket: tuple[float, float] | None = None,
             rel_tol: float = REL_TOL) -> tuple[float, int, str]:
    """(rate, evaluations, note) where the attainment crosses the target."""
    target = slo.attainment
    ok = lambda r: attainment(twin, r, slo, duration_s=duration_s, warmup_s=warmup_s,  # noqa: E731
                              seed_key=seed_key) >= target
    n = 0
    if bracket is not None:
        lo, hi = bracket
        n += 2
        lo_ok, hi_ok = ok(lo), ok(hi)
        if not lo_ok or hi_ok:
            bracket = None
    if bracket is None:
        r = max(start, 1e-3)
        n += 1
        if ok(r):
            lo, hi = r, None
            while hi is None:
                r *= 1.5
                n += 1
                if r > 1000 * start:
                    return math.inf, n, f"meets the SLO even at {r:g} req/s"
                if ok(r):
                    lo = r
                else:
                    hi = r
        else:
            lo, hi = None, r
            while lo is None:
                r /= 1.5
                n += 1
                if r < start / 1000:
                    return 0.0, n, f"misses the SLO even at {r:.3g} req/s (e.g. failures alone exceed 1 − target)"
                if ok(r):
                    lo = r
                else:
                    hi = r
    while (hi - lo) / hi > rel_tol:
        mid = 0.5 * (lo + hi)
        n += 1
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi), n, ""


def _logit(p):
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p) - np.log1p(-p)


def _interp_crossing(rates, att, target) -> float:
    """Crossing of ``target`` on a logit-linear fit through the attainments at ``rates``."""
    y = _logit(np.asarray(att, float))
    x = np.asarray(rates, float)
    if np.ptp(y) == 0:
        return float("nan")
    b, a = np.polyfit(x, y, 1)
    if b >= 0:
        return float("nan")
    return float((_logit(np.array([target]))[0] - a) / b)


def _job(args):
    kind, twin, slo, k, seed, c0, dur, warm = args
    if kind == "mc":  # a crossing at the fitted parameters, workload k
        c, n, note = crossing(twin, slo, start=c0, duration_s=dur, warmup_s=warm, seed_key=(SEED_OFFSET, int(seed), k),
                              bracket=(c0 / 1.2, c0 * 1.2))
        return c, n, note
    # "draw": attainments at three rates around c0 on workload 0 (common random numbers)
    tw = twin if k < 0 else twin.draw(np.random.default_rng([int(seed), SEED_OFFSET, k]))
    rates = [c0 * (1 + d) for d in (-0.04, 0.0, 0.04)]
    att = [attainment(tw, r, slo, duration_s=dur, warmup_s=warm, seed_key=(SEED_OFFSET, int(seed), 0))
           for r in rates]
    return _interp_crossing(rates, att, slo.attainment), 3, ""


def _map(jobs, workers):
    workers = max(1, min(int(workers or min(2, os.cpu_count() or 1)), len(jobs)))
    if workers == 1:
        return [_job(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_job, jobs))


def steady_cslo(twin: "Twin", slo: SLO | str, *, start: float | None = None, runs: int = 4, draws: int = 10,
                seed: int = 0, duration_s: float | None = None, warmup_s: float | None = None,
                workers: int | None = None) -> SteadyCSLO:
    """Steady-state C_SLO of ``twin`` with a 95 % interval (see the module docstring).
    ``start``: a first guess of the rate (e.g. the measured envelope's estimate); default the
    median measured rate. Runs last ``duration_s`` (default: the longer of 1800 s and 20,000
    requests at ``start``), the first ``warmup_s`` (default a sixth) left out. ``workers``
    processes (default up to 2); results do not depend on it."""
    s = SLO.parse(slo)
    if start is None:
        rates = [float(r["offered_rps"]) for r in twin.workload.per_run if r.get("offered_rps")]
        start = float(np.median(rates)) if rates else 1.0
    if duration_s is None:
        duration_s = max(STEADY_DURATION_S, STEADY_REQUESTS / max(start, 1e-3))
    if warmup_s is None:
        warmup_s = duration_s * STEADY_WARMUP_SHARE
    first = _map([("mc", twin, s, m, seed, start, duration_s, warmup_s) for m in range(max(1, runs))], workers)
    cs = np.array([c for c, _, _ in first], float)
    notes = sorted({note for _, _, note in first if note})
    n_tot = sum(n for _, n, _ in first)
    if not np.all(np.isfinite(cs)) or np.any(cs <= 0):
        est = float(np.median(cs))
        return SteadyCSLO(est, est, est, tuple(cs), duration_s, warmup_s, n_tot, tuple(notes))
    est = float(cs.mean())
    se_mc = float(cs.std(ddof=1) / np.sqrt(len(cs))) if len(cs) > 1 else 0.0
    effects: list[float] = []
    if draws > 0:
        out = _map([("draw", twin, s, k, seed, est, duration_s, warmup_s) for k in [-1] + list(range(draws))],
                   workers)
        ref = out[0][0]
        effects = [c - ref for c, _, _ in out[1:] if np.isfinite(c) and np.isfinite(ref)]
        n_tot += 3 * len(out)
    sd_par = float(np.std(effects, ddof=1)) if len(effects) > 1 else 0.0
    h = 1.959964 * float(np.hypot(se_mc, sd_par))
    if twin.workload.arrival.process != "poisson":
        notes.append(f"the measured arrivals look {twin.workload.arrival.process}"
                     + (f" (CV {twin.workload.arrival.cv:.2f})" if twin.workload.arrival.process == "gamma" else "")
                     + "; the steady-state C_SLO uses Poisson arrivals (the usual planning assumption)")
    notes.append(f"estimate = mean of {len(cs)} crossings on independent {duration_s:g}-s workloads (Monte-Carlo SE "
                 f"{se_mc:.3g} req/s); parameter uncertainty from {len(effects)} draws (SD {sd_par:.3g} req/s)")
    return SteadyCSLO(est, max(0.0, est - h), est + h, tuple(cs), duration_s, warmup_s, n_tot, tuple(notes))
