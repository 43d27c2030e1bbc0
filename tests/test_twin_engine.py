"""Engine extensions the twin needs: a separate prefill resource and per-request faults.
The simulator must keep its books exactly as in the mixed mode (same invariants as
tests/test_synth_properties.py), and mixed-mode output must not change."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from capplan.synth.engine import ClosedLoop, ReplicaParams, simulate
from capplan.synth.events import events_arrow
from capplan.synth.service import ServiceModel


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
    from capplan.synth.config import PRESETS, parse_config
    from capplan.synth.lengths import LengthDist
    from capplan.synth.sweep import simulate_level

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
