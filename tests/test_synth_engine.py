"""The replica simulator: invariants, attainment vs rate, KV waiting/timeouts, preemption,
queue limit, unfinished requests, closed loop, router."""

from __future__ import annotations

import numpy as np
import pytest

from capplan.sim.config import parse_config, PRESETS
from capplan.sim.engine import ClosedLoop, ReplicaParams, simulate
from capplan.sim.events import events_arrow
from capplan.sim.service import ServiceModel
from capplan.sim.sweep import simulate_level

SM = ServiceModel((1, 64), (30.0, 50.0), 0.1, 0.0)


def _cfg(**patch):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS["small"].items()}
    for k, v in patch.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return parse_config(raw)


def _frame(res):
    t = events_arrow(res, "r", tenants=("a", "b"), with_itl=True).to_pandas()
    t["target"] = res.target_output
    return t


def _check_invariants(res):
    d = _frame(res)
    assert res.stats["kv_blocks_in_use_at_end"] == 0
    ok = d[d.status == "ok"]
    assert (ok.output_tokens == ok.target).all()
    has = d[d.output_tokens > 0]
    assert (has.first_token_ns > has.scheduled_ns).all() and (has.last_token_ns >= has.first_token_ns).all()
    itl_sum = has.itl_ns.map(lambda x: int(np.sum(x)))
    assert (itl_sum == has.last_token_ns - has.first_token_ns).all()
    assert (has.itl_ns.map(len) == has.output_tokens - 1).all()
    assert (has.itl_ns.map(lambda x: len(x) == 0 or min(x) > 0)).all()
    none = d[d.output_tokens == 0]
    assert none.first_token_ns.isna().all() and none.itl_ns.isna().all()
    assert (d.output_tokens <= d.target).all()
    adm = d.dropna(subset=["admitted_ns"])
    assert (adm.admitted_ns >= adm.scheduled_ns).all()
    return d


def _attainment(d, warm_ns=10e9, ttft_ms=2000, tpot_ms=100):
    w = d[d.scheduled_ns >= warm_ns]
    ttft = (w.first_token_ns - w.scheduled_ns) / 1e6
    tpot = (w.last_token_ns - w.first_token_ns) / 1e6 / (w.output_tokens - 1)
    good = (w.status == "ok") & (ttft <= ttft_ms) & ((w.output_tokens < 2) | (tpot <= tpot_ms))
    return float(good.mean())


def test_attainment_falls_as_rate_rises_and_overload_times_out():
    cfg = _cfg()
    att, timeouts = [], []
    for i, rate in enumerate((1.0, 4.0, 8.0, 14.0)):
        res = simulate_level(cfg, rate, seed_key=(i,))
        d = _check_invariants(res)
        att.append(_attainment(d))
        timeouts.append(int((d.status == "timeout").sum()))
    assert att[0] > 0.99 and att[-1] < 0.2
    assert all(a >= b - 0.01 for a, b in zip(att, att[1:])), att
    assert timeouts[0] == 0 and timeouts[-1] > 50


def _fixed_open(n, rate, inp, out, seed=0):
    rng = np.random.default_rng(seed)
    t = np.round(np.cumsum(rng.exponential(1 / rate, n)) * 1e9).astype(np.int64)
    return t - t[0], np.full(n, inp, np.int64), np.full(n, out, np.int64)


def test_kv_capacity_limit_makes_requests_wait_and_time_out():
    sched, i, o = _fixed_open(300, 3.0, 400, 300)
    big = ReplicaParams(max_batch=64, token_budget=1024, kv_blocks=20000, max_model_len=4096, service=SM)
    small = ReplicaParams(max_batch=64, token_budget=1024, kv_blocks=300, max_model_len=4096, service=SM)
    kw = dict(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=1, timeout_s=30.0, end_s=200.0)
    r_big = simulate(params=big, **kw)
    r_small = simulate(params=small, **kw)
    d_big, d_small = _check_invariants(r_big), _check_invariants(r_small)
    q_big = (d_big.admitted_ns - d_big.scheduled_ns) / 1e6
    q_small = (d_small.admitted_ns - d_small.scheduled_ns) / 1e6
    # 300 blocks × 16 = 4800 tokens: about 6 sequences of 700 tokens fit at once
    assert q_big.quantile(0.9) < 200 and q_small.median() > 1000
    assert (d_big.status == "ok").all()
    assert (d_small.status == "timeout").sum() > 20


def test_preemption_by_recompute_when_kv_overflows():
    # prompts are admitted on prompt blocks alone; long outputs then overflow the cache
    sched, i, o = _fixed_open(120, 4.0, 64, 600)
    p = ReplicaParams(max_batch=64, token_budget=512, kv_blocks=400, max_model_len=2048, kv_watermark=0.0, service=SM)
    res = simulate(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=1, params=p,
                   timeout_s=600.0, end_s=2000.0)
    assert res.stats["preemptions"] > 0
    d = _check_invariants(res)
    assert (d.status == "ok").all()
    # a preempted request's stream shows the recompute stall: one gap far above a decode step
    multi = np.bincount(res.stint_rid, minlength=len(d)) > 1
    assert multi.any()
    gaps = d.itl_ns[multi].map(lambda x: max(x) / 1e6)
    assert (gaps > 200).all()


def test_queue_limit_rejects_and_too_long_requests_error():
    sched, i, o = _fixed_open(400, 40.0, 500, 200)
    o[5] = 5000  # longer than max_model_len
    p = ReplicaParams(max_batch=16, token_budget=512, kv_blocks=4000, max_model_len=4096, queue_limit=20, service=SM)
    res = simulate(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=2, params=p,
                   timeout_s=60.0, end_s=200.0)
    d = _check_invariants(res)
    assert d.status.iloc[5] == "error" and d.first_token_ns.isna().iloc[5]
    rej = d[d.status == "rejected"]
    assert len(rej) > 50 and rej.first_token_ns.isna().all() and rej.replica_group.isna().all()
    assert res.stats["max_queue"] <= 20
    # the router spreads load over both replicas
    counts = d.replica_group.value_counts()
    assert set(counts.index) == {"replica-0", "replica-1"} and counts.min() > 0.4 * counts.max()


def test_unfinished_requests_at_end_are_kept_and_labelled():
    sched, i, o = _fixed_open(200, 8.0, 500, 400)
    p = ReplicaParams(max_batch=16, token_budget=512, kv_blocks=4000, max_model_len=4096, service=SM)
    dur = sched[-1] / 1e9 + 1e-3
    res = simulate(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=1, params=p,
                   timeout_s=120.0, end_s=dur + 5.0)
    d = _check_invariants(res)
    assert len(d) == 200  # nothing dropped
    canc = d[d.status == "cancelled"]
    assert len(canc) > 10
    assert (canc.last_token_ns.dropna() <= (dur + 5.0) * 1e9).all()
    assert (canc.output_tokens < canc.target).all()
    assert set(d.status) <= {"ok", "cancelled", "timeout"}
    assert (canc.finish_reason == "abort").all()


def test_closed_loop_keeps_concurrency():
    rng = np.random.default_rng(5)

    def draw(n):
        return (rng.integers(100, 800, n), rng.integers(20, 200, n), np.zeros(n, np.int64))

    p = ReplicaParams(max_batch=64, token_budget=1024, kv_blocks=8000, max_model_len=4096, service=SM)
    res = simulate(closed=ClosedLoop(8, 60.0), draw=draw, n_replicas=1, params=p, timeout_s=30.0, end_s=90.0)
    d = _check_invariants(res)
    assert (d.status == "ok").all() and len(d) > 100
    # at every send time at most 8 requests are in flight (sent and not yet finished)
    s = d.scheduled_ns.to_numpy()
    e = d.last_token_ns.to_numpy()
    inflight = [(np.sum((s <= t) & (e > t))) for t in s[::7]]
    assert max(inflight) <= 8 and max(inflight) == 8
    assert s.max() < 60e9


def test_gamma_bursts_hurt_attainment_at_the_same_rate():
    base = _cfg(sweep={"rates": [5.0], "duration_s": 120.0})
    bursty = _cfg(sweep={"rates": [5.0], "duration_s": 120.0}, workload={"arrival": {"process": "gamma", "cv": 3.0}})
    a = np.mean([_attainment(_frame(simulate_level(base, 5.0, seed_key=(k,)))) for k in range(3)])
    b = np.mean([_attainment(_frame(simulate_level(bursty, 5.0, seed_key=(k,)))) for k in range(3)])
    assert b < a - 0.05, (a, b)


def test_single_sequence_replica_is_an_md1_queue():
    """max_batch 1 and fixed lengths make each request a deterministic service D with FIFO
    queueing: the mean wait must match Pollaczek–Khinchine, W = ρD / (2(1 − ρ))."""
    sm = ServiceModel((1, 2), (20.0, 20.0), 0.1, 0.0)
    inp, out = 200, 11
    D = (20.0 + 0.1 * inp + (out - 1) * 20.0) / 1e3  # s
    rho = 0.7
    n = 40_000
    sched, i, o = _fixed_open(n, rho / D, inp, out, seed=3)
    p = ReplicaParams(max_batch=1, token_budget=512, kv_blocks=1000, max_model_len=1024, queue_limit=None,
                      service=sm)
    res = simulate(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=1, params=p,
                   timeout_s=1e6, end_s=1e7)
    d = _frame(res)
    assert (d.status == "ok").all()
    wait = ((d.admitted_ns - d.scheduled_ns) / 1e9).to_numpy()
    w_theory = rho * D / (2 * (1 - rho))
    assert abs(wait[1000:].mean() - w_theory) / w_theory < 0.08, (wait.mean(), w_theory)
    e2e = ((d.last_token_ns - d.admitted_ns) / 1e9).to_numpy()
    assert np.allclose(e2e, D, atol=2e-6)  # service is exactly D (µs-rounded steps)
    ttft = ((d.first_token_ns - d.admitted_ns) / 1e6).to_numpy()
    assert np.allclose(ttft, 20.0 + 0.1 * inp, atol=1e-3)


def test_closed_loop_obeys_littles_law():
    rng = np.random.default_rng(9)

    def draw(n):
        return (rng.integers(100, 900, n), rng.integers(20, 300, n), np.zeros(n, np.int64))

    p = ReplicaParams(max_batch=64, token_budget=1024, kv_blocks=8000, max_model_len=4096, service=SM)
    users = 12
    res = simulate(closed=ClosedLoop(users, 300.0), draw=draw, n_replicas=2, params=p, timeout_s=60.0, end_s=400.0)
    d = _frame(res)
    w = d[(d.scheduled_ns >= 30e9) & (d.scheduled_ns < 270e9)]
    throughput = len(w) / 240.0
    e2e = ((w.last_token_ns - w.scheduled_ns) / 1e9).mean()
    assert abs(throughput * e2e - users) / users < 0.05, throughput * e2e


def test_power_samples_integrate_busy_time_and_match_md1_utilisation():
    from capplan.sim.events import power_arrow

    sm = ServiceModel((1, 2), (20.0, 20.0), 0.1, 0.0)
    inp, out = 200, 11
    D = (20.0 + 0.1 * inp + (out - 1) * 20.0) / 1e3
    rho = 0.5
    sched, i, o = _fixed_open(20_000, rho / D, inp, out, seed=4)
    p = ReplicaParams(max_batch=1, token_budget=512, kv_blocks=1000, max_model_len=1024, queue_limit=None, service=sm)
    res = simulate(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=1, params=p, timeout_s=1e6, end_s=1e7)
    horizon = float(np.ceil((res.seg_t0[0][-1] + res.seg_k[0][-1] * res.seg_step[0][-1]) / 1e9))
    pw = power_arrow(res, "r", gpus_per_replica=2, idle_w=100.0, busy_w=600.0, horizon_s=horizon,
                     token_budget=512).to_pandas()
    g0 = pw[pw.gpu_index == 0]
    assert len(pw) == 2 * len(g0) == 2 * int(horizon)
    busy_s = float((res.seg_k[0] * res.seg_step[0]).sum()) / 1e9
    assert g0.gpu_util_pct.sum() / 100.0 == pytest.approx(busy_s, rel=1e-6)
    assert g0.gpu_util_pct.mean() / 100.0 == pytest.approx(rho, abs=0.02)  # M/D/1: utilisation = ρ
    assert ((g0.power_w >= 100.0) & (g0.power_w <= 600.0)).all()
    assert np.all(np.diff(g0.energy_mj.to_numpy()) > 0)
    assert g0.energy_mj.iloc[-1] == pytest.approx(g0.power_w.sum() * 1000.0, rel=1e-6)


def test_saturated_throughput_equals_batch_over_service_iterations():
    """Flat step time s and free prefill: a request occupies exactly `out` iterations, so a
    saturated replica completes max_batch / (out · s) requests per second."""
    sm = ServiceModel((1, 2), (20.0, 20.0), 0.0, 0.0)
    B, out = 8, 50
    sched, i, o = _fixed_open(3000, 12.0, 100, out, seed=6)
    p = ReplicaParams(max_batch=B, token_budget=512, kv_blocks=5000, max_model_len=1024, queue_limit=None, service=sm)
    res = simulate(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=1, params=p, timeout_s=1e6, end_s=1e6)
    d = _frame(res)
    done = np.sort(d.last_token_ns.to_numpy()) / 1e9
    x = np.sum((done >= 50) & (done < 150)) / 100.0
    assert x == pytest.approx(B / (out * 0.020), rel=0.01)
    itl = np.concatenate(d.itl_ns.to_list())
    assert np.all(itl == 20_000_000)  # every gap is one flat iteration
