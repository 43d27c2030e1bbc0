"""Engine extensions the twin needs: a separate prefill resource and per-request faults.
The simulator must keep its books exactly as in the mixed mode (same invariants as
tests/test_synth_properties.py), and mixed-mode output must not change."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from capplan.sim.engine import ClosedLoop, ReplicaParams, simulate
from capplan.sim.events import events_arrow
from capplan.sim.service import ServiceModel


def _books(res, timeout_s, end_s):
    """tests/test_synth_engine's invariants, plus the client deadline and the end of the run."""
    from tests.test_synth_engine import _check_invariants

    d = _check_invariants(res)
    has = d[d.output_tokens > 0]
    to = has[has.status == "timeout"]
    assert (to.last_token_ns <= to.scheduled_ns + int(round(timeout_s * 1e9))).all()
    ok = d[d.status == "ok"]
    assert (ok.last_token_ns - ok.scheduled_ns <= int(round(timeout_s * 1e9))).all()
    assert (has.last_token_ns <= int(round(end_s * 1e9))).all()
    return d


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 200),
    rate=st.floats(0.5, 60.0),
    replicas=st.integers(1, 3),
    max_batch=st.integers(1, 32),
    kv_blocks=st.integers(70, 2000),
    block_size=st.sampled_from([1, 4, 16]),
    lanes=st.one_of(st.none(), st.integers(1, 4)),
    queue_limit=st.one_of(st.none(), st.integers(0, 30)),
    timeout_s=st.floats(0.5, 60.0),
    drain_s=st.floats(0.0, 30.0),
    closed=st.booleans(),
    jitter=st.booleans(),
)
def test_separate_prefill_keeps_the_books(seed, n, rate, replicas, max_batch, kv_blocks, block_size, lanes,
                                          queue_limit, timeout_s, drain_s, closed, jitter):
    rng = np.random.default_rng(seed)
    max_len = min(1024, int(kv_blocks * 0.99) * block_size)
    sm = ServiceModel((1, 8, 32), (20.0, 24.0, 40.0), 0.05, 3.0)
    p = ReplicaParams(max_batch=max_batch, token_budget=max_batch + 64, kv_blocks=kv_blocks, block_size=block_size,
                      max_model_len=max_len, queue_limit=queue_limit, service=sm, prefill="separate",
                      prefill_lanes=lanes)

    def lengths(k):
        return rng.integers(1, max(2, max_len // 2), k), rng.integers(1, max(2, max_len // 2), k)

    dur = n / rate
    if closed:
        def draw(k):
            i, o = lengths(k)
            return i, o, np.zeros(k, np.int64)
        res = simulate(closed=ClosedLoop(max(1, n // 20), dur, think_s=0.01), draw=draw, n_replicas=replicas,
                       params=p, timeout_s=timeout_s, end_s=dur + drain_s)
    else:
        sched = np.round(np.sort(rng.uniform(0, dur, n)) * 1e9).astype(np.int64)
        i, o = lengths(n)
        scale = rng.lognormal(0.0, 0.5, n) if jitter else None
        res = simulate(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=replicas, params=p,
                       timeout_s=timeout_s, end_s=dur + drain_s, prefill_scale=scale)
    _books(res, timeout_s, dur + drain_s)


def test_separate_prefill_does_not_slow_decodes_and_mixed_does():
    """A prompt computed on its own lane leaves the running decodes at the decode step; inside
    the batch it stalls them by its prefill time."""
    rng = np.random.default_rng(3)
    n = 300
    sched = np.round(np.sort(rng.uniform(0, 30, n)) * 1e9).astype(np.int64)
    inp, out = np.full(n, 400), np.full(n, 50)
    sm = ServiceModel((1, 64), (10.0, 10.0), 0.1, 20.0)  # prefill 60 ms, decode 10 ms flat
    res = {}
    for mode in ("mixed", "separate"):
        p = ReplicaParams(max_batch=64, token_budget=1024, kv_blocks=5000, queue_limit=None, service=sm,
                          prefill=mode)
        r = simulate(sched_ns=sched, input_tokens=inp, output_tokens=out, n_replicas=1, params=p, timeout_s=60,
                     end_s=90)
        res[mode] = _books(r, 60, 90)
    tp = {m: ((d.last_token_ns - d.first_token_ns) / 1e6 / 49).median() for m, d in res.items()}
    ttft = {m: ((d.first_token_ns - d.scheduled_ns) / 1e6).min() for m, d in res.items()}
    assert 10.0 <= tp["separate"] < 10.5           # only the wait for the next boundary
    assert tp["mixed"] > tp["separate"] + 3.0       # others' prefills stall the batch
    assert abs(ttft["separate"] - 60.0) < 1e-6      # overhead + 400 × 0.1 ms on an idle lane


def test_one_prefill_lane_queues_prompts():
    sched = np.zeros(3, np.int64)
    sm = ServiceModel((1,), (5.0,), 0.0, 100.0)
    p = ReplicaParams(max_batch=8, token_budget=64, kv_blocks=1000, max_model_len=1024, queue_limit=None, service=sm,
                      prefill="separate", prefill_lanes=1)
    r = simulate(sched_ns=sched, input_tokens=np.full(3, 10), output_tokens=np.full(3, 1), n_replicas=1,
                 params=p, timeout_s=10, end_s=10)
    d = events_arrow(r, "r").to_pandas()
    assert list((d.first_token_ns // 1_000_000).sort_values()) == [100, 200, 300]
    r2 = simulate(sched_ns=sched, input_tokens=np.full(3, 10), output_tokens=np.full(3, 1), n_replicas=1,
                  params=p, timeout_s=10, end_s=10, prefill_scale=np.array([2.0, 0.5, 1.0]))
    d2 = events_arrow(r2, "r").to_pandas()
    assert list(d2.first_token_ns // 1_000_000) == [200, 250, 350]  # lane times × the factors, one lane


def test_faults_fail_requests_whatever_the_load():
    sched = np.arange(6, dtype=np.int64) * 1_000_000_000
    fault = np.array([0, 1, 2, 0, 2, 0])
    p = ReplicaParams(max_batch=8, token_budget=64, kv_blocks=1000, max_model_len=1024, queue_limit=None,
                      service=ServiceModel((1,), (5.0,), 0.01, 0.0))
    r = simulate(sched_ns=sched, input_tokens=np.full(6, 10), output_tokens=np.full(6, 4), n_replicas=1,
                 params=p, timeout_s=2.0, end_s=5.5, fault=fault)
    d = events_arrow(r, "r").to_pandas()
    assert list(d.status) == ["ok", "error", "timeout", "ok", "cancelled", "ok"]
    assert d.loc[[1, 2, 4], "replica_group"].isna().all() and d.loc[[1, 2, 4], "output_tokens"].eq(0).all()


def test_config_reads_the_twin_extensions_and_keeps_old_bytes(tmp_path):
    """replica.prefill / prefill_lanes, faults and empirical lengths parse, run and are
    checked; a config without them draws exactly what it drew before (no extra stream)."""
    import pytest

    from capplan.errors import SpecError
    from capplan.sim.config import PRESETS, parse_config
    from capplan.sim.lengths import LengthDist
    from capplan.sim.sweep import simulate_level

    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS["small"].items()}
    base = parse_config(raw)
    a = simulate_level(base, 3.0, seed_key=(0,))
    raw2 = dict(raw, replica={**raw["replica"], "prefill": "separate", "prefill_lanes": 2},
                faults={"error_share": 0.1, "stall_share": 0.05},
                workload={**raw["workload"], "lengths": {"kind": "empirical", "levels": [0, 0.5, 1],
                                                         "input": [100, 400, 900], "output": [10, 50, 200],
                                                         "rho": 0.5}})
    cfg = parse_config(raw2)
    assert cfg.replica.prefill == "separate" and cfg.replica.prefill_lanes == 2
    r = simulate_level(cfg, 3.0, seed_key=(0,))
    np.testing.assert_array_equal(r.sched_ns, a.sched_ns)  # the arrival stream is untouched
    st = np.bincount(r.status, minlength=6) / len(r.status)
    assert 0.05 < st[3] < 0.16 and 0.01 < st[2] + st[4] < 0.12
    d = LengthDist.from_dict(raw2["workload"]["lengths"])
    i, o = d.sample(20000, np.random.default_rng(1))
    assert abs(np.median(i) - 400) < 15 and abs(np.median(o) - 50) < 3 and i.min() >= 100 and o.max() <= 200
    assert np.corrcoef(np.argsort(np.argsort(i)), np.argsort(np.argsort(o)))[0, 1] > 0.3
    for patch, field in (({"replica": {**raw["replica"], "prefill": "split"}}, "replica.prefill"),
                         ({"faults": {"error_share": 0.7, "stall_share": 0.4}}, "faults"),
                         ({"faults": {"oops": 1}}, "faults.oops")):
        with pytest.raises(SpecError) as e:
            parse_config(dict(raw, **patch))
        assert e.value.field == field
    with pytest.raises(SpecError, match="increase from 0 to 1"):
        LengthDist.from_dict({"kind": "empirical", "levels": [0, 0.7, 0.5], "input": [1, 2, 3], "output": [1, 2, 3]})


def _one_lane(rate_rps, n, *, poisson=False, lanes=1, seed=0):
    """One replica, separate prefill, 550-token prompts at 0.1 ms a token = 55 ms on a lane,
    50-token answers decoding at 20–30 ms a step (boundaries that never line up with a lane)."""
    if poisson:
        gaps = np.random.default_rng(seed).exponential(1e9 / rate_rps, n)
        sched = np.round(np.cumsum(gaps) - gaps[0]).astype(np.int64)
    else:
        sched = np.round(np.arange(n) * (1e9 / rate_rps)).astype(np.int64)
    sm = ServiceModel((1, 64), (20.0, 30.0), 0.1, 0.0)
    p = ReplicaParams(max_batch=64, token_budget=4096, kv_blocks=40000, queue_limit=None, service=sm,
                      prefill="separate", prefill_lanes=lanes)
    end_s = sched[-1] / 1e9 + 120
    r = simulate(sched_ns=sched, input_tokens=np.full(n, 550), output_tokens=np.full(n, 50), n_replicas=1,
                 params=p, timeout_s=600, end_s=end_s)
    return _books(r, 600, end_s)


def test_a_prefill_lane_takes_the_next_prompt_as_soon_as_it_frees():
    """A lane is a server of its own: it never waits for a decode-iteration boundary.
    At 17 req/s (one every 58.8 ms) a 55-ms lane is free when each prompt arrives: every TTFT
    is 55 ms and the lane keeps up (before: admission at the next boundary, 14.55 prompts/s,
    and a queue that grew all run)."""
    d = _one_lane(17.0, 1700)
    ttft_ms = (d.first_token_ns - d.scheduled_ns) / 1e6
    assert (d.status == "ok").all() and np.allclose(ttft_ms, 55.0)
    # saturated: one every 40 ms; prompt i starts when prompt i − 1 is done, at 55 i ms, so its
    # first token is at 55 (i + 1) ms and its TTFT 55 (i + 1) − 40 i = 55 + 15 i ms: 1000 / 55 = 18.18/s
    d = _one_lane(25.0, 200)
    i = np.arange(200)
    assert np.array_equal(d.first_token_ns.to_numpy() - d.scheduled_ns.to_numpy(), (55 + 15 * i) * 1_000_000)
    assert np.array_equal(d.admitted_ns.to_numpy(), 55 * i * 1_000_000)


def test_prefill_lanes_never_overlap_more_prompts_than_they_have():
    """Under Poisson arrivals, with lane starts back-dated between boundaries, prompts on lanes
    at any time ≤ lanes, and each starts at its arrival or when a lane frees."""
    for lanes in (1, 2):
        d = _one_lane(17.0 * lanes, 1500, poisson=True, lanes=lanes, seed=lanes).sort_values("admitted_ns")
        a, f, s = (d[c].to_numpy() for c in ("admitted_ns", "first_token_ns", "scheduled_ns"))
        assert np.all(f - a == 55_000_000)
        ev = np.r_[np.c_[a, np.ones_like(a)], np.c_[f, -np.ones_like(f)]]
        ev = ev[np.lexsort((ev[:, 1], ev[:, 0]))]  # a finish before a start at the same time
        assert np.cumsum(ev[:, 1]).max() == lanes
        # a prompt waits only while every lane is busy: it starts at its arrival or at a finish
        finishes = set(f.tolist())
        assert all(x == y or x in finishes for x, y in zip(a, s))


@pytest.mark.slow
def test_a_binding_prefill_lane_gives_the_cache_gain_the_saved_prefill_predicts():
    """docs/scenarios.md: with one resource binding, the cache's C_SLO gain is what the prefill
    time saved predicts. One separate lane, constant arrivals, 90 % of prompts sharing a
    3,000-token system prompt, a loose TTFT limit: the lane binds (decoding at full batch needs
    49 × 30 / 64 = 23 ms a request, the lane 320 ms without the cache and 50.7 with it), so the
    gain is 3,200 / 507.2 = ×6.31 by hand — within 5 % (before lanes admitted at once it was ×5.0)."""
    from capplan.sim.config import parse_config
    from capplan.sim.prefix import PrefixCacheSpec
    from capplan.twin.cachesim import cache_sweep

    cfg = parse_config({
        "name": "cache", "system": {"replicas": 1},
        "replica": {"max_batch": 64, "token_budget": 4096, "kv_blocks": 40000, "queue_limit": None,
                    "prefill": "separate", "prefill_lanes": 1,
                    "service_model": {"decode_step_ms": {1: 20.0, 64: 30.0}, "prefill_ms_per_token": 0.1}},
        "client": {"timeout_s": 120},
        "workload": {"arrival": {"process": "constant"}, "lengths": {"kind": "fixed", "input": 500, "output": 50},
                     "prefixes": {"kind": "system", "groups": 1, "tokens": 3000, "share": 0.9}},
        "sweep": {"rates": [1.0], "duration_s": 300}})
    sw = cache_sweep(cfg, "ttft_ms=30000,attainment=0.99",
                     {"no cache": {}, "cache": {"prefix_cache": {"blocks": 10_000}}},
                     runs=2, duration_s=600, workers=1, rel_tol=0.01)
    r = sw.rows.set_index("setting")
    assert r.loc["cache", "predicted_gain"] == pytest.approx(3200 / 507.2, rel=0.02)
    assert r.loc["cache", "gain"] == pytest.approx(r.loc["cache", "predicted_gain"], rel=0.05)
    # and the lane's own bound, 1 000 / 50.72 = 19.7 req/s with the cache
    assert r.loc["cache", "cslo_rps"] == pytest.approx(1000 / 50.72, rel=0.05)
