"""Replaying measured runs through a twin, and the per-run numbers both are compared on.

A replay keeps a run's *actual* schedule (the time each request reached the server) and its
prompt lengths; answers that completed keep their length; requests that did not complete get an
answer length drawn from the twin's output distribution above what they received (what a new
run of the same requests could have asked). Requests the server failed whatever the load
(errors, stalls: :func:`capplan.twin.limits_fit.stalled`) keep their measured outcome, since
the twin does not model why they failed.

Measured and simulated runs are compared on identical arithmetic: both become an ``Outcome``
and are scored by the simulated side's one outcome rule (``capplan.sim.evaluate``:
``good_mask``, ``run_metrics`` — the numbers ``capplan summarize`` and the envelope report for
a run), which this module re-exports for its callers.
"""

from __future__ import annotations

import numpy as np

from ..slo import SLO
from ..sim.engine import simulate
from ..sim.evaluate import Outcome, itl_stats
from ..sim.events import token_times
from ..sim.sweep import lognormal_factors
from .data import CANCELLED, ERROR, OK, RunArrays

__all__ = ["METRIC_LABELS", "measured_outcome", "carried", "run_end_ns", "draw_targets", "replay_run"]

METRIC_LABELS = {
    "attainment": "SLO attainment", "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p99_ms": "TTFT p99 (ms)",
    "tpot_p50_ms": "TPOT p50 (ms)", "tpot_p99_ms": "TPOT p99 (ms)", "achieved_rps": "throughput (req/s)",
    "share_rejected": "share rejected", "share_timed_out": "share timed out or unfinished",
}


def measured_outcome(run: RunArrays, need_itl: bool = False) -> Outcome:
    p99 = mx = None
    if need_itl and run.itl_has is not None:
        p99, mx = itl_stats(run.itl_off, run.itl_val, run.itl_has)
    return Outcome(run.sched, run.first, run.last, run.out, run.status, p99, mx)


def carried(run: RunArrays, stall: np.ndarray) -> np.ndarray:
    """Requests whose measured outcome a replay keeps: errors and stalls."""
    return (run.status == ERROR) | stall


def run_end_ns(run: RunArrays, timeout_s: float, stall: np.ndarray | None = None) -> int:
    """When a replay stops: where the run was cut (it has unfinished requests that are not
    stalls), else the arrival window + the client timeout."""
    cut = (run.status == CANCELLED)
    if stall is not None:
        cut &= ~stall
    last_event = int(max(run.last.max(initial=0), run.first.max(initial=0), run.arrive.max(initial=0)))
    if cut.any():
        return last_event + 1
    window = max(int(round((run.duration_s or 0.0) * 1e9)), int(run.arrive.max(initial=0)) + 1)
    return window + int(round(timeout_s * 1e9))


def draw_targets(run: RunArrays, twin: "Twin", rng: np.random.Generator, tenant_names: tuple[str, ...] = ()) -> np.ndarray:
    """Answer lengths for the replay: completed requests keep theirs; the others draw from the
    twin's output distribution (their tenant's, else the pooled one) above what they got."""
    target = run.out.copy()
    need = run.status != OK
    if need.any():
        wl = twin.workload
        own = {t.name: t.lengths for t in wl.tenants if t.lengths is not None}
        idx = np.flatnonzero(need)
        u = rng.random(len(idx))
        ten = run.tenant[idx]
        for k in np.unique(ten):
            sel = ten == k
            name = tenant_names[k] if 0 <= k < len(tenant_names) else None
            dist = own.get(name, wl.lengths)
            target[idx[sel]] = _conditional_output(dist, run.out[idx[sel]].astype(float), u[sel])
    return np.maximum(target, 1)


def _conditional_output(dist, got: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Output lengths from ``dist``'s marginal, conditional on being above ``got``."""
    if dist.kind == "empirical":
        lv = np.asarray(dist.levels)
        q = np.asarray(dist.output_q)
    elif dist.kind == "fixed":
        return np.maximum(np.full(len(got), int(dist.output.median)), got + 1).astype(np.int64)
    else:
        from scipy.special import ndtri

        lv = np.linspace(0.0005, 0.9995, 400)
        q = np.clip(np.exp(np.log(dist.output.median) + dist.output.sigma * ndtri(lv)), dist.output.min,
                    dist.output.max)
    f_got = np.interp(got + 0.5, q, lv, left=0.0, right=1.0)
    uu = f_got + u * (1.0 - f_got)
    return np.maximum(np.rint(np.interp(uu, lv, q)), got + 1).astype(np.int64)


def replay_run(run: RunArrays, twin: "Twin", slo: SLO, *, keep: np.ndarray, rng: np.random.Generator,
               end_ns: int, tenant_names: tuple[str, ...] = ()) -> Outcome:
    """One replay of ``run`` through ``twin`` (already drawn)."""
    need_itl = slo.itl_ms is not None
    sim = ~keep
    idx = np.flatnonzero(sim)
    order = idx[np.argsort(run.arrive[idx], kind="stable")]
    target = draw_targets(run, twin, rng, tenant_names)
    arrive = np.maximum(run.arrive[order], 0)
    params = twin.replica_params()
    scale = (lognormal_factors(rng, len(order), params.prefill_jitter_cv)
             if params.prefill == "separate" and params.prefill_jitter_cv > 0 else None)
    res = simulate(n_replicas=twin.replicas, params=params, timeout_s=twin.timeout_s,
                   end_s=end_ns / 1e9, sched_ns=arrive, input_tokens=np.maximum(run.inp[order], 1),
                   output_tokens=np.maximum(target[order], 1),
                   tenant=np.zeros(len(order), np.int64), prefill_scale=scale)
    n_recv, first, last, off, val = token_times(res, with_itl=need_itl)
    # the engine's clock is the arrival; the client's clock starts at the schedule
    F = run.first.copy()
    L = run.last.copy()
    O = run.out.copy()
    S = run.status.copy()
    F[order] = first
    L[order] = last
    O[order] = n_recv
    S[order] = res.status
    p99 = mx = None
    if need_itl:
        p99 = np.full(run.n, np.nan)
        mx = np.full(run.n, np.nan)
        has = n_recv > 1
        sp, sm = itl_stats(off, val, has)
        p99[order], mx[order] = sp, sm
    return Outcome(run.sched, F, L, O, S, p99, mx)
