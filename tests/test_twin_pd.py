"""Disaggregated prefill and decode: token times by hand, the P:D sweep against the analytic
capacities, and the colocated vs disaggregated ranking flipping with the TTFT limit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capplan.plan.candidates import compare_candidates, sweep_candidates
from capplan.plan import load_plan_spec
from capplan.sim.config import parse_config
from capplan.sim.disagg import DisaggSpec, KVTransfer, parse_pool, simulate_disagg
from capplan.sim.events import token_times
from capplan.sim.sweep import generate_study
from capplan.twin.pd import pd_sweep
from capplan.validate import validate_path


def _raw(arrival="constant", inp=2000):
    # deterministic service: decode step 20 ms at any batch, prefill 0.1 ms per token
    return {"name": "pd", "system": {"replicas": 8, "gpus_per_replica": 1},
            "replica": {"max_batch": 64, "token_budget": 4096, "kv_blocks": 40000, "queue_limit": None,
                        "service_model": {"decode_step_ms": {1: 20.0, 256: 20.0}, "prefill_ms_per_token": 0.1}},
            "client": {"timeout_s": 120},
            "workload": {"arrival": {"process": arrival}, "lengths": {"kind": "fixed", "input": inp, "output": 401}},
            "sweep": {"rates": [2.0], "duration_s": 60}}


def _pools(cfg):
    return (parse_pool({"replicas": 1, "usd_per_gpu_hour": 2.0}, "prefill", cfg.replica),
            parse_pool({"replicas": 1, "usd_per_gpu_hour": 2.0}, "decode", cfg.replica))


def test_token_times_by_hand():
    cfg = parse_config(_raw())
    pre, dec = _pools(cfg)
    spec = DisaggSpec(pre, dec, KVTransfer(bandwidth_gb_s=50.0, kv_bytes_per_token=500_000, latency_ms=1.0))
    res = simulate_disagg(spec, sched_ns=np.array([0, 10_000_000_000]), input_tokens=np.array([2000, 1000]),
                          output_tokens=np.array([5, 1]), tenant=None, timeout_s=60, end_s=100)
    n, first, last, off, val = token_times(res)
    assert list(res.status) == [0, 0] and list(n) == [5, 1]
    assert first[0] == 200_000_000  # prefill: 2000 × 0.1 ms
    xfer = 1_000_000 + 2000 * 500_000 / 50e9 * 1e9  # 1 ms + 20 ms
    # the decode replica's first iteration computes one token: 20 ms step + 0.1 ms, on whole µs
    assert val[0] == pytest.approx(xfer + 20_100_000)
    assert list(val[1:4]) == [20_000_000] * 3  # then one decode step per token
    assert first[1] == last[1] == 10_000_000_000 + 100_000_000  # one token: the prefill pool only
    assert res.replica_names == ("prefill-0", "decode-0")


def test_disaggregated_study_is_an_ordinary_study(tmp_path):
    raw = _raw()
    raw["disaggregation"] = {"prefill": {"replicas": 2}, "decode": {"replicas": 1}}
    path, stats = generate_study(parse_config(raw), tmp_path / "s", workers=1)
    problems, _ = validate_path(path)
    assert not problems.errors
    ev = pd.read_parquet(path / "events")
    assert set(ev["replica_group"]) == {"decode-0"}  # every request ends on the decode pool
    assert (ev["status"] == "ok").all() and (ev["output_tokens"] == 401).all()


@pytest.mark.slow
def test_sweep_finds_the_analytic_best_ratio():
    # 8 one-GPU replicas; constant arrivals, 2000-token prompts (200 ms on a prefill lane: 5 req/s
    # per prefill replica) and 401-token answers (400 decode steps of 20 ms in batches of 64:
    # 8 req/s per decode replica). Capacity of p:d = min(5 p, 8 d): best 5:3 at 24 req/s (decode).
    cfg = parse_config(_raw())
    pre, dec = _pools(cfg)
    sw = pd_sweep(cfg, "ttft_ms=1000,tpot_ms=25,attainment=0.99", prefill=pre, decode=dec, total_replicas=8,
                  runs=1, duration_s=200, workers=1, colocated=False, rel_tol=0.01)
    rows = sw.rows.set_index("configuration")
    for p in range(1, 8):
        assert rows.loc[f"{p}:{8 - p}", "cslo_rps"] == pytest.approx(min(5 * p, 8 * (8 - p)), rel=0.05)
    assert sw.best == "5:3"
    assert rows.loc["5:3", "cslo_rps"] == pytest.approx(24.0, rel=0.05)
    assert rows.loc["5:3", "cslo_per_gpu_rps"] == pytest.approx(3.0, rel=0.05)
    assert (rows.loc["4:4", "binding_pool"], rows.loc["5:3", "binding_pool"], rows.loc["6:2", "binding_pool"]) == \
        ("prefill", "decode", "decode")
    per_1k = 16 * 1.0 / (rows.loc["5:3", "cslo_rps"] * 3600 * 0.99) * 1000  # 8 GPUs × $2 per hour
    assert rows.loc["5:3", "cost_usd_per_1k_good"] == pytest.approx(per_1k)
    assert "5:3" in sw.to_text() and len(sw.display_frame()) == 7


@pytest.mark.slow
def test_ranking_flips_with_the_ttft_limit():
    # Poisson arrivals, 2500-token prompts, TPOT limit 30 ms. Colocated, every prefill stalls the
    # decodes of its replica (TPOT binds near 9 req/s whatever the TTFT limit); disaggregated, TPOT
    # is clean but TTFT waits in the 5 prefill replicas' queues: with a loose TTFT limit the 5:3
    # split serves ~20 req/s, with a tight one (400 ms, prefill alone 250 ms) ~6 req/s.
    cfg = parse_config(_raw("poisson", 2500))
    pre, dec = _pools(cfg)
    spec = load_plan_spec({"demand": {"peak_rps": 100.0, "mean_to_peak": 1.0}, "capacity": {"good_fraction": 0.99},
                           "replica_group": {"gpus_per_replica": 1, "gpus_per_node": 8}, "failure": {"policy": "none"},
                           "rollout": {"max_surge": 1}, "prices": {"usd_per_gpu_hour": 2.0, "billing": "gpu"}})
    best = {}
    for name, ttft in (("loose", 10_000), ("tight", 400)):
        sw = pd_sweep(cfg, f"ttft_ms={ttft},tpot_ms=30,attainment=0.99", prefill=pre, decode=dec, ratios=[(5, 3)],
                      runs=2, duration_s=300, workers=1, rel_tol=0.01)
        cmp = compare_candidates(sweep_candidates(sw, spec))
        best[name] = cmp.best
        assert cmp.settled, cmp.verdict
    assert best == {"loose": "5:3", "tight": "colocated ×8"}


def test_simulated_candidates_priced_per_unit_and_not_settled_when_overlapping():
    from capplan.plan.candidates import simulated_candidate

    spec = load_plan_spec({"demand": {"peak_rps": 100.0, "mean_to_peak": 1.0}, "capacity": {"good_fraction": 0.99},
                           "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8}, "failure": {"policy": "none"},
                           "rollout": {"max_surge": 1}, "prices": {"usd_per_gpu_hour": 2.0, "billing": "gpu"}})
    # a 3:5 unit of 4-GPU replicas: 32 GPUs, prefill GPUs at $3, decode GPUs at $2 → $2.375 per GPU-hour
    unit = simulated_candidate("3:5", spec, estimate=40.0, ci_low=38.0, ci_high=42.0, gpus_per_group=32,
                               usd_per_gpu_hour=(12 * 3.0 + 20 * 2.0) / 32)
    colo = simulated_candidate("colocated ×8", spec, estimate=36.0, ci_low=33.0, ci_high=39.0, gpus_per_group=32)
    cmp = compare_candidates([unit, colo])
    df = cmp.to_frame().set_index("candidate")
    assert df.loc["3:5", "gpus_per_group"] == 32 and df.loc["3:5", "capacity_rps_per_group"] == 38.0
    groups = -(-100 // 38)  # planned at the lower end of the interval
    per_1k = groups * 32 * 2.375 / (100 * 3600 * 0.99) * 1000
    assert df.loc["3:5", "cost_usd_per_1k_good_requests"] == pytest.approx(per_1k)
    # 3 units × 32 GPUs × $2.375 = $228 per hour against 4 colocated groups × 32 × $2 = $256 …
    assert cmp.best == "3:5"
    # … but at the top of its interval (39 req/s) the colocated system needs 3 groups ($192): overlap
    assert not cmp.settled and "NOT settled" in cmp.verdict
