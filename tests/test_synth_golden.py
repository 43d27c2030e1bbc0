"""The simulator's output is pinned: for each of a dozen short configs (plain, overload with
rejections, KV pressure and preemption, separate prefill lanes, closed loop, faults, prefix cache
with affinity routing and a flush, vtc / priority disciplines with deadline-slack admission,
disaggregated prefill/decode, failures lost and retried, a rollout, an autoscaler, client
retries) the events, power and timeline tables and the run statistics hash to the value the
engine gave before its split into hooks (issue 29). A change to any simulated number fails
here; a deliberate one updates the hash and says why in the commit."""

from __future__ import annotations

import copy
import hashlib
import json

import pyarrow as pa
import pytest

from capplan.sim.autoscale import AutoscalerSpec
from capplan.sim.config import PRESETS, parse_config
from capplan.sim.control import ControlSpec, FailureEvent, RolloutEvent
from capplan.sim.demand import oscillation
from capplan.sim.retry import RetryPolicy
from capplan.sim.sweep import plan_runs, run_tables

from conftest import fixed_service_raw


def _small(**over) -> dict:
    raw = copy.deepcopy(PRESETS["small"])
    raw["sweep"] = {"load_model": "open", "rates": [6.0], "duration_s": 40.0, "warmup_s": 0.0}
    raw.update(over)
    return raw


def _configs():
    c = {}
    c["plain"] = parse_config(_small())
    demo = copy.deepcopy(PRESETS["demo"])
    demo["sweep"] = {"load_model": "open", "rates": [6.0], "duration_s": 40.0, "warmup_s": 0.0}
    c["demo_itl_power"] = parse_config(demo)
    c["overload_rejects"] = parse_config(_small(sweep={"load_model": "open", "rates": [20.0], "duration_s": 30.0}))
    kv = _small()
    kv["replica"] = {**kv["replica"], "kv_blocks": 700, "max_model_len": 8192}
    c["kv_preemption"] = parse_config(kv)
    sep = _small()
    sep["replica"] = {**sep["replica"], "prefill": "separate", "prefill_lanes": 1, "prefill_jitter_cv": 0.3}
    sep["sweep"] = {"load_model": "open", "rates": [9.0], "duration_s": 40.0}
    c["separate_prefill"] = parse_config(sep)
    c["closed_loop"] = parse_config(_small(sweep={"load_model": "closed", "concurrency": [12], "duration_s": 30.0},
                                           client={"timeout_s": 30.0, "think_s": 0.5}))
    c["faults"] = parse_config(_small(faults={"error_share": 0.05, "stall_share": 0.03}))
    px = _small(prefix_cache={"blocks": 300, "router": "prefix_affinity", "flushes": [{"at_s": 20}]})
    px["system"] = {**px["system"], "replicas": 2}
    px["workload"] = {**px["workload"], "prefixes": {"kind": "system", "groups": 6, "tokens": 1200,
                                                     "share": 0.8, "zipf": 1.0}}
    px["sweep"] = {"load_model": "open", "rates": [10.0], "duration_s": 40.0, "warmup_s": 0.0}
    c["prefix_cache"] = parse_config(px)
    c["vtc_admission"] = parse_config(_small(
        sweep={"load_model": "open", "rates": [9.0], "duration_s": 40.0},
        scheduling={"policy": "vtc", "weights": {"acme": 2.0}},
        admission={"ttft_ms": 1500, "defer": ["globex"]}))
    c["priority_admission"] = parse_config(_small(
        sweep={"load_model": "open", "rates": [9.0], "duration_s": 40.0},
        scheduling={"policy": "priority", "priorities": {"globex": 1}, "aging_s": 5.0},
        admission={"ttft_ms": 2000, "margin_ms": 100}))
    pd = _small(disaggregation={"prefill": {"replicas": 2}, "decode": {"replicas": 1}})
    pd["sweep"] = {"load_model": "open", "rates": [5.0], "duration_s": 40.0}
    c["disaggregated"] = parse_config(pd)
    fx = parse_config(fixed_service_raw(3, arrival="poisson", timeout_s=60.0))
    c["failure_lost"] = fx.with_(rates=(15.0,), duration_s=60.0, control=ControlSpec(
        initial=3, failures=(FailureEvent(at_s=20, count=1, in_flight="lost", replace=True),)))
    c["failure_resent"] = fx.with_(rates=(15.0,), duration_s=60.0, control=ControlSpec(
        initial=3, failures=(FailureEvent(at_s=20, count=1, in_flight="retried", retry_delay_s=0.5,
                                         replace=False),)))
    c["retries"] = fx.with_(rates=(15.0,), duration_s=60.0, control=ControlSpec(
        initial=3, retry=RetryPolicy(max_retries=3, backoff_s=0.5, budget=None, seed=3),
        failures=(FailureEvent(at_s=20, count=1, in_flight="retried", detect_s=2.0, replace=False),)))
    c["rollout"] = fx.with_(rates=(12.0,), duration_s=120.0, control=ControlSpec(
        initial=3, rollout=RolloutEvent(at_s=20, max_surge=1, max_unavailable=0, ready_s=10)))
    C = 6.9
    dem = oscillation(1.0 * C, 3.5 * C, 60.0, 240.0, start_s=30)
    a = AutoscalerSpec(capacity_rps=C, ready_s=20, safety=1.1, drain_target_s=20, eval_period_s=5,
                       rate_window_s=10, warm_floor=1, max_replicas=8)
    c["autoscale"] = parse_config(fixed_service_raw(2, arrival="poisson", timeout_s=60.0)).with_(
        rates=(dem.peak_rps,), duration_s=240.0, demand=dem, control=ControlSpec(initial=2, autoscaler=a))
    return c


CONFIGS = _configs()

#: recorded from the engine before its split (commit "golden hashes of the simulator")
GOLDEN = {
    'autoscale': '45a0c5e12f767d0cfa1ec0098528a0c7051f28c4016f4d09abbe5f0f4140392d',
    'closed_loop': 'ce3a61ea47c25dd7b54f39733b0f3164d86e67f73ead7e3b76e7378d6728d649',
    'demo_itl_power': '0fa7f18733877d7ef3a9e381e48251af883b45e8787266fb0d5b259e256e8fac',
    'disaggregated': '5868f767329672922b1f6d13af1458d826549ed0e6a007d44689ef5e15fb46d3',
    'failure_lost': 'f36ec7745359b249636eeb9cad89fbd95e00d7191b9f51ad6a5f1ba3402c1e48',
    'failure_resent': '4326b39cca9b266ab3586721424ba11b6f403c5e83b5f6b138ed21949b840ee4',
    'faults': '4a0b73d31d33c67f79a50935adb0e5722cea405b54fecbaacedc44d89d8b202d',
    'kv_preemption': '53bb572448a16845f0ef8b4c27419103fecc750e87d0edff40905c6ade34d2cc',
    'overload_rejects': '7bf40ac9afa52a48b011d3f3f02ba621f7ee19d1984b4e57f99c0234342499a4',
    'plain': 'c370b5846f6a537f84c662531ddc84eb03e7ac13f9272cb3900827a43de47347',
    'prefix_cache': 'defee334f8ccc5d90ede0442996034d483d32d47b8963c5a4bfc73cca1e01554',
    'priority_admission': '3846a1dac6c1a058c48b50164aacdf2876c360c5b2849a582dcdc9c02e5b19d8',
    'retries': '0c91e172dfdfc0216b0b8ae1218c7dbf145cfbe6954fb7c39e1b19cba1d7f003',
    'rollout': '06c847bc85b1edd87dcce742eea827e784ee13206d71dcc1379f0006ebdb0b08',
    'separate_prefill': 'b94a591642532a9f335ec002040cb34ef656d9508aa4138a82e3a57e2874a12e',
    'vtc_admission': '3638199db40304ed0375f167eb2c6efe1f0fc47c3bf083d7ec2f05f396553156',
}


def _table_bytes(t: pa.Table | None) -> bytes:
    if t is None:
        return b"none"
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def run_hash(cfg) -> str:
    """sha256 over the first run's events, power and timeline tables and its statistics."""
    ev, pw, stats = run_tables(cfg, plan_runs(cfg)[0])
    h = hashlib.sha256()
    h.update(_table_bytes(ev))
    h.update(_table_bytes(pw))
    st = dict(stats)
    h.update(_table_bytes(st.pop("timeline", None)))
    h.update(json.dumps(st, sort_keys=True, default=repr).encode())
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_same_seed_same_events(name):
    assert run_hash(CONFIGS[name]) == GOLDEN[name]


if __name__ == "__main__":  # print the hashes (to record them after a deliberate change)
    for k in sorted(CONFIGS):
        print(f"    {k!r}: {run_hash(CONFIGS[k])!r},")


@pytest.mark.parametrize("name", ["autoscale", "rollout"])
def test_no_request_is_routed_to_a_replica_before_it_is_ready(name, monkeypatch):
    """An added replica joins the router's list only when it is ready: the router's list was
    once the fleet's own list object, so a replica the control added took requests at once."""
    from capplan.sim.run import Run

    chosen = []
    route = Run.route

    def spy(self, rid, t):
        R = route(self, rid, t)
        if R is not None:
            chosen.append(R.routable)
        return R

    monkeypatch.setattr(Run, "route", spy)
    cfg = CONFIGS[name]
    run_tables(cfg, plan_runs(cfg)[0])
    assert chosen and all(chosen), f"{chosen.count(False)} of {len(chosen)} requests went to a replica not yet ready"
