"""Property test: whatever the limits and load, the simulator keeps its books."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from capplan.sim.engine import ClosedLoop, ReplicaParams, simulate
from capplan.sim.events import events_arrow
from capplan.sim.service import ServiceModel


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 250),
    rate=st.floats(0.5, 60.0),
    replicas=st.integers(1, 3),
    max_batch=st.integers(1, 32),
    budget_extra=st.integers(0, 600),
    kv_blocks=st.integers(70, 2000),
    block_size=st.sampled_from([1, 4, 16]),
    watermark=st.sampled_from([0.0, 0.01, 0.1]),
    queue_limit=st.one_of(st.none(), st.integers(0, 30)),
    timeout_s=st.floats(0.5, 60.0),
    drain_s=st.floats(0.0, 30.0),
    closed=st.booleans(),
)
def test_engine_invariants(seed, n, rate, replicas, max_batch, budget_extra, kv_blocks, block_size, watermark,
                           queue_limit, timeout_s, drain_s, closed):
    rng = np.random.default_rng(seed)
    max_len = min(1024, int(kv_blocks * (1 - watermark)) * block_size)
    sm = ServiceModel((1, 8, 32), (20.0, 24.0, 40.0), 0.05, 1.0)
    p = ReplicaParams(max_batch=max_batch, token_budget=max_batch + budget_extra, kv_blocks=kv_blocks,
                      block_size=block_size, kv_watermark=watermark, max_model_len=max_len,
                      queue_limit=queue_limit, service=sm)

    def lengths(k):
        i = rng.integers(1, max(2, max_len // 2), k)
        o = rng.integers(1, max(2, max_len // 2), k)
        return i, o

    end_s = (n / rate) + drain_s
    if closed:
        def draw(k):
            i, o = lengths(k)
            return i, o, np.zeros(k, np.int64)
        dur = n / rate
        res = simulate(closed=ClosedLoop(max(1, n // 20), dur, think_s=0.01), draw=draw, n_replicas=replicas,
                       params=p, timeout_s=timeout_s, end_s=dur + drain_s)
    else:
        t = np.sort(rng.uniform(0, n / rate, n))
        sched = np.round(t * 1e9).astype(np.int64)
        i, o = lengths(n)
        res = simulate(sched_ns=sched, input_tokens=i, output_tokens=o, n_replicas=replicas, params=p,
                       timeout_s=timeout_s, end_s=n / rate + drain_s)
    assert res.stats["kv_blocks_in_use_at_end"] == 0
    d = events_arrow(res, "r", with_itl=True).to_pandas()
    d["target"] = res.target_output
    assert set(d.status) <= {"ok", "timeout", "rejected", "error", "cancelled"}
    ok = d[d.status == "ok"]
    assert (ok.output_tokens == ok.target).all()
    assert (d.output_tokens <= d.target).all()
    has = d[d.output_tokens > 0]
    assert (has.first_token_ns > has.scheduled_ns).all()
    assert (has.itl_ns.map(len) == has.output_tokens - 1).all()
    assert (has.itl_ns.map(lambda x: int(np.sum(x))) == has.last_token_ns - has.first_token_ns).all()
    assert (has.itl_ns.map(lambda x: len(x) == 0 or min(x) > 0)).all()
    # a timed-out request received nothing after its deadline
    to = has[has.status == "timeout"]
    assert (to.last_token_ns <= to.scheduled_ns + int(round(timeout_s * 1e9))).all()
    # ok requests finished within the client timeout
    assert (ok.last_token_ns - ok.scheduled_ns <= int(round(timeout_s * 1e9))).all()
    assert d.first_token_ns.isna().eq(d.output_tokens == 0).all()
    end_ns = int(round(end_s * 1e9))
    assert (has.last_token_ns <= end_ns).all()  # nothing is received after the run's end
    canc = d[d.status == "cancelled"]  # unfinished at the end, client deadline not yet passed
    assert (canc.scheduled_ns + int(round(timeout_s * 1e9)) > end_ns).all()
    assert ((d.status != "rejected") | d.admitted_ns.isna()).all()
