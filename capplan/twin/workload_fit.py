"""What the clients sent, estimated from the events: the joint (input, output) length
distribution per tenant, the tenant mix, and the arrival process with its burstiness.

Lengths are kept empirical — quantile tables of each marginal joined by a Gaussian copula
(:meth:`capplan.sim.lengths.LengthDist.empirical`) — so that the twin replays the measured
mix without assuming a shape. Output lengths come from completed requests: a request cut by a
timeout tells only that its answer was longer than what it received. Runs with load-related
failures are left out of the output lengths when enough clean runs exist (long answers time
out first at high load, which would bias the mix toward short ones).
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri
from scipy.stats import rankdata

from ..sim.config import ArrivalSpec, Tenant
from ..sim.lengths import LengthDist
from .data import OK, REJECTED, TIMEOUT, CANCELLED, RunArrays, StudyData
from .limits_fit import stall_masks
from .params import Workload

LEVELS = tuple(sorted({0.0, 0.001, 0.005, 0.995, 0.999, 1.0} | {round(i / 50, 4) for i in range(51)}))
MIN_TENANT_REQUESTS = 100
CLEAN_FAILURE_SHARE = 0.01  # load-related failures a run may have and still give output lengths
MIN_CLEAN_COMPLETED = 200  # completed requests the clean runs must hold to be the length pool


def empirical_lengths(inp: np.ndarray, out: np.ndarray) -> LengthDist:
    lv = np.asarray(LEVELS)
    iq = np.quantile(inp.astype(float), lv)
    oq = np.quantile(out.astype(float), lv)
    if len(inp) > 2 and np.ptp(inp) > 0 and np.ptp(out) > 0:
        zi = ndtri((rankdata(inp) - 0.5) / len(inp))
        zo = ndtri((rankdata(out) - 0.5) / len(out))
        rho = float(np.clip(np.corrcoef(zi, zo)[0, 1], -0.99, 0.99))
    else:
        rho = 0.0
    return LengthDist.empirical(lv, np.maximum(iq, 1.0), np.maximum(oq, 1.0), rho)


def arrival_stats(sched: np.ndarray) -> dict:
    """CV of the gaps between scheduled sends, and the dispersion index (variance / mean) of
    the counts per second."""
    if len(sched) < 3:
        return {"cv": float("nan"), "dispersion": float("nan")}
    g = np.diff(np.sort(sched)).astype(float)
    cv = float(np.std(g) / np.mean(g)) if np.mean(g) > 0 else float("nan")
    span = (sched.max() - sched.min()) / 1e9
    if span >= 10:
        c = np.bincount(((sched - sched.min()) // 1_000_000_000).astype(np.int64))[:int(span)]
        disp = float(np.var(c) / np.mean(c)) if np.mean(c) > 0 else float("nan")
    else:
        disp = float("nan")
    return {"cv": cv, "dispersion": disp}


def length_pool(data: StudyData, wait_s: float) -> tuple[list[RunArrays], str]:
    """The runs whose completed requests give the length tables, and a note when the pool had
    to include runs with load-related failures. Runs where at most 1 % of the requests timed
    out, were rejected or cancelled (stalls, which the server causes whatever the load, do not
    count; ``wait_s``: a lower bound of the client timeout, see ``stall_masks``) — when they
    hold at least 200 completed requests; else every run."""
    stalls = stall_masks(data, wait_s)
    clean = []
    for run in data.runs:
        load_fail = (((run.status == TIMEOUT) | (run.status == REJECTED) | (run.status == CANCELLED))
                     & ~stalls[run.run_id])
        if run.n and load_fail.mean() <= CLEAN_FAILURE_SHARE:
            clean.append(run)
    if sum(int((r.status == OK).sum()) for r in clean) >= MIN_CLEAN_COMPLETED:
        return clean, ""
    note = ("output lengths come from completed requests of every run, including runs where requests "
            "timed out or were rejected: long answers may be under-represented") if len(clean) < len(data.runs) else ""
    return list(data.runs), note


def lengths_of(runs, tenant: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Input and output tokens of the completed requests of ``runs`` (of one tenant index)."""
    i_, o_ = [], []
    for r in runs:
        m = (r.status == OK) & (r.out >= 1) & (r.inp >= 1)
        if tenant is not None:
            m &= r.tenant == tenant
        i_.append(r.inp[m])
        o_.append(r.out[m])
    return (np.concatenate(i_) if i_ else np.zeros(0, np.int64),
            np.concatenate(o_) if o_ else np.zeros(0, np.int64))


def fit_workload(data: StudyData, wait_s: float) -> tuple[Workload, list[str]]:
    notes: list[str] = []
    per_run = []
    cvs, weights = [], []
    for run in data.runs:
        st = arrival_stats(run.sched[run.in_window])
        per_run.append({"run_id": run.run_id, "offered_rps": run.offered_rps, "concurrency": run.concurrency,
                        "measured_rps": round(run.measured_rate_rps(), 6) if run.n >= 2 else None,
                        "duration_s": run.duration_s, "warmup_s": run.warmup_ns / 1e9, "requests": run.n,
                        "gap_cv": round(st["cv"], 4) if np.isfinite(st["cv"]) else None,
                        "dispersion": round(st["dispersion"], 4) if np.isfinite(st["dispersion"]) else None})
        if data.load_model == "open" and run.n >= 50 and np.isfinite(st["cv"]):
            cvs.append(st["cv"])
            weights.append(run.n)
    # arrival process
    if cvs:
        cv = float(np.median(cvs))
        if cv < 0.15:
            arrival = ArrivalSpec("constant")
        elif 0.85 <= cv <= 1.15:
            arrival = ArrivalSpec("poisson")
        else:
            arrival = ArrivalSpec("gamma", cv=round(cv, 4))
        arr_how = (f"median over {len(cvs)} runs of the coefficient of variation of the gaps between scheduled "
                   f"sends: {cv:.3f} (1 = Poisson, 0 = constant, > 1 bursty)")
    else:
        arrival = ArrivalSpec("poisson")
        arr_how = "no open-loop run with ≥ 50 requests: Poisson assumed (default)"
        notes.append("arrival process: " + arr_how)
    # lengths
    pool, pool_note = length_pool(data, wait_s)
    if pool_note:
        notes.append(pool_note)
    inp, out = lengths_of(pool)
    if len(inp) == 0:
        inp, out = lengths_of(data.runs)
    if len(inp) == 0:
        notes.append("no completed request: the length distribution is the synth default (lognormal, median "
                     "800 input / 160 output tokens) — give a study with completed requests")
        lengths = LengthDist()
    else:
        lengths = empirical_lengths(inp, out)
    tenants = []
    if data.tenants:
        n_all = np.concatenate([r.tenant for r in data.runs])
        shares = np.bincount(n_all[n_all >= 0], minlength=len(data.tenants)).astype(float)
        shares /= max(shares.sum(), 1.0)
        for k, name in enumerate(data.tenants):
            ti, to = lengths_of(pool, k)
            own = empirical_lengths(ti, to) if len(ti) >= MIN_TENANT_REQUESTS else None
            if own is None:
                notes.append(f"tenant {name}: fewer than {MIN_TENANT_REQUESTS} completed requests, so it uses the "
                             "pooled length distribution")
            tenants.append(Tenant(name, round(float(shares[k]), 6), data.slo_class_of.get(name), own))
        tenants = [t for t in tenants if t.share > 0]
    how = (f"{arr_how}; lengths: quantile tables of input and output tokens of {len(inp):,} completed requests "
           "joined by a Gaussian copula (rho = correlation of normal scores)"
           + (f"; tenants by their share of offered requests" if tenants else ""))
    return Workload(arrival=arrival, lengths=lengths, tenants=tuple(tenants), per_run=tuple(per_run), how=how), notes
