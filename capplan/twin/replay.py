"""Replaying measured runs through a twin, and the per-run numbers both are compared on.

A replay keeps a run's *actual* schedule (the time each request reached the server) and its
prompt lengths; answers that completed keep their length; requests that did not complete get an
answer length drawn from the twin's output distribution above what they received (what a new
run of the same requests could have asked). Requests the server failed whatever the load
(errors, stalls: :func:`capplan.twin.limits_fit.stalled`) keep their measured outcome, since
the twin does not model why they failed.

:func:`run_metrics` computes, from per-request arrays, the numbers ``capplan summarize`` and the
envelope report for a run (same definitions: steady window = scheduled at or after the
warm-up; percentiles type 7 over completed requests; throughput = completed requests / time
from the first scheduled request to the last event), so measured and simulated runs are
compared on identical arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..slo import SLO, good_array
from ..synth.engine import simulate
from ..synth.events import token_times
from ..synth.sweep import lognormal_factors
from .data import CANCELLED, ERROR, OK, REJECTED, TIMEOUT, RunArrays

METRICS = ("attainment", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "achieved_rps",
           "share_rejected", "share_timed_out")
METRIC_LABELS = {
    "attainment": "SLO attainment", "ttft_p50_ms": "TTFT p50 (ms)", "ttft_p99_ms": "TTFT p99 (ms)",
    "tpot_p50_ms": "TPOT p50 (ms)", "tpot_p99_ms": "TPOT p99 (ms)", "achieved_rps": "throughput (req/s)",
    "share_rejected": "share rejected", "share_timed_out": "share timed out or unfinished",
}


@dataclass(frozen=True, eq=False)
class Outcome:
    """Per-request outcome of one run (measured or simulated), in the run's order."""

    sched: np.ndarray
    first: np.ndarray
    last: np.ndarray
    out: np.ndarray
    status: np.ndarray
    itl_p99_ms: np.ndarray | None = None
    itl_max_ms: np.ndarray | None = None


def measured_outcome(run: RunArrays, need_itl: bool = False) -> Outcome:
    p99 = mx = None
    if need_itl and run.itl_has is not None:
        p99, mx = itl_stats(run.itl_off, run.itl_val, run.itl_has)
    return Outcome(run.sched, run.first, run.last, run.out, run.status, p99, mx)


def itl_stats(off: np.ndarray, val: np.ndarray, has: np.ndarray):
    n = len(off) - 1
    p99 = np.full(n, np.nan)
    mx = np.full(n, np.nan)
    for i in np.flatnonzero(has & (np.diff(off) > 0)):
        g = val[off[i]:off[i + 1]] / 1e6
        p99[i] = np.quantile(g, 0.99)
        mx[i] = g.max()
    return p99, mx


def good_mask(o: Outcome, slo: SLO, sent_ns: np.ndarray | None = None) -> np.ndarray:
    """capplan.metrics.good_predicate on arrays (both from ``capplan.slo.good_terms``), the
    metrics as ``request_view`` defines them; a missing stamp (−1) is NULL. ``sent_ns``: the
    client's send stamps for ``ttft_from = sent`` (None or −1: unknown, TTFT from scheduled
    as the SQL's coalesce)."""
    known = lambda x: np.where(x >= 0, x, np.nan).astype(np.float64)  # noqa: E731
    first, last = known(o.first), known(o.last)
    sched = o.sched.astype(np.float64)
    sent = sched if sent_ns is None else np.where(sent_ns >= 0, sent_ns, o.sched).astype(np.float64)
    nan = np.full(len(sched), np.nan)

    def metric(col: str) -> np.ndarray:
        if col == "ttft_ms":
            return (first - sched) / 1e6
        if col == "ttft_sent_ms":
            return (first - sent) / 1e6
        if col == "tpot_ms":
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(o.out > 1, (last - first) / 1e6 / np.maximum(o.out - 1, 1), np.nan)
        if col == "e2e_ms":
            return (last - sched) / 1e6
        v = o.itl_p99_ms if col == "itl_p99_ms" else o.itl_max_ms
        return nan if v is None else v

    return good_array(slo, (o.status == OK) & (o.first >= 0), metric)


def run_metrics(o: Outcome, slo: SLO, warmup_ns: int) -> dict:
    w = o.sched >= warmup_ns
    n = int(w.sum())
    st = o.status[w]
    ok = (st == OK) & (o.first[w] >= 0)
    out = {"n": n}
    if n == 0:
        return {**out, **{m: float("nan") for m in METRICS}, "n_good": 0}
    good = good_mask(o, slo)[w]
    out["n_good"] = int(good.sum())
    out["attainment"] = float(good.mean())
    ttft = ((o.first[w] - o.sched[w]) / 1e6)[ok]
    okm = ok & (o.out[w] > 1) & (o.last[w] >= 0)
    tpot = ((o.last[w] - o.first[w]) / 1e6 / np.maximum(o.out[w] - 1, 1))[okm]
    for name, v in (("ttft", ttft), ("tpot", tpot)):
        q = np.quantile(v, [0.5, 0.99]) if len(v) else [np.nan, np.nan]
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = float(q[0]), float(q[1])
    ends = np.max(np.c_[o.sched[w], o.first[w], o.last[w]], axis=1)
    elapsed = (ends.max() - o.sched[w].min()) / 1e9
    completed = int((ok & (o.last[w] >= 0)).sum())
    out["achieved_rps"] = completed / elapsed if elapsed > 0 else float("nan")
    out["share_rejected"] = float(np.mean(st == REJECTED))
    out["share_timed_out"] = float(np.mean((st == TIMEOUT) | (st == CANCELLED)))
    return out


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
