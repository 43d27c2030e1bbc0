"""Plan line items against hand-computed cases (docs/plan.md has the formulas)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from capplan.errors import SpecError
from capplan.plan import (failure_loss, load_plan_spec, make_plan, nodes_for, size, zone_spread)


def spec_of(**over):
    """A plan spec dict with neutral defaults: no reserve rules unless a test asks."""
    d = {
        "demand": {"peak_rps": 100.0, "uncertainty": 0.0},
        "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8},
        "failure": {"policy": "none", "zones": 1},
        "rollout": {"max_surge": 1, "max_unavailable": 0, "canary_groups": 0},
        "prices": {"usd_per_gpu_hour": 2.0},
    }
    for key, val in over.items():
        sec, _, f = key.partition("__")
        if f:
            d.setdefault(sec, {})[f] = val
        else:
            d[sec] = val
    return load_plan_spec(d)


def test_traffic_groups_ceil_with_uncertainty():
    plan = make_plan(spec_of(demand__peak_rps=100.0, demand__uncertainty=0.2), capacity=30.0)
    # D = 100 × 1.2 = 120; ⌈120/30⌉ = 4 exactly (no float noise making it 5)
    assert plan.value("demand_rps") == pytest.approx(120.0)
    assert plan.value("traffic_groups") == 4
    assert plan.value("total_groups") == 4
    it = plan.item("traffic_groups")
    assert it.formula == "⌈D / C⌉" and it.inputs == {"D": pytest.approx(120.0), "C": 30.0}
    # 380 / 47.5 = 8 exactly in decimal; float division must not round up to 9
    assert make_plan(spec_of(demand__peak_rps=380.0), capacity=47.5).value("traffic_groups") == 8


def test_zone_loss_with_uneven_spread():
    # D = 320, C = 50 → R_traffic 7; 3 zones: N=11 spreads 4,4,3; losing zone a (4) leaves
    # 7 × 50 = 350 ≥ 320. N=10 (4,3,3) leaves 6 × 50 = 300 < 320.
    plan = make_plan(spec_of(demand__peak_rps=320.0, failure={"policy": "zone", "zones": ["a", "b", "c"]}),
                     capacity=50.0)
    assert plan.value("traffic_groups") == 7
    assert plan.value("failure_reserve_groups") == 4
    assert plan.value("total_groups") == 11
    assert zone_spread(11, 3) == (4, 4, 3)
    # 2 groups of 4 GPUs per 8-GPU node: zones need 2 + 2 + 2 nodes
    assert plan.value("nodes") == 6
    assert plan.value("total_gpus") == 44
    failure = [c for c in plan.checks if c.key == "failure"][0]
    assert failure.ok
    assert failure.sentence.startswith("after losing zone a (4 of 11 groups), capacity 350 req/s ≥ planned demand 320 req/s")
    # an SLO given: the sentence says under which SLO
    plan2 = make_plan(spec_of(demand__peak_rps=320.0, failure={"policy": "zone", "zones": 3},
                              slo="ttft_ms=2000,attainment=0.99"), capacity=50.0)
    s = [c for c in plan2.checks if c.key == "failure"][0].sentence
    assert s.endswith("at 0.99 of requests with TTFT ≤ 2000 ms")


def test_zone_loss_even_case_matches_hand_count():
    # D = 380, C = 50: R = 8; N = 12 (4,4,4) loses 4 → 400 ≥ 380; N = 11 loses 4 → 350 < 380
    plan = make_plan(spec_of(demand__peak_rps=380.0, failure={"policy": "zone", "zones": 3}), capacity=50.0)
    assert (plan.value("traffic_groups"), plan.value("total_groups")) == (8, 12)


def test_node_loss_groups_sharing_nodes_spread_evenly():
    # g = 4 on 8-GPU nodes (2 per node). D = 100, C = 30 → R = 4.
    # N = 5: 3 nodes, at most ⌈5/3⌉ = 2 groups per node → lose 2 → 90 < 100.
    # N = 6: 3 nodes × 2 → lose 2 → 120 ≥ 100.
    plan = make_plan(spec_of(failure={"policy": "node", "zones": 1}), capacity=30.0)
    assert plan.value("traffic_groups") == 4
    assert plan.value("failure_reserve_groups") == 2
    assert plan.value("nodes") == 3
    assert failure_loss(5, plan.spec.failure, 4, 8) == 2
    # one GPU groups on 8-GPU nodes: 10 groups → 2 nodes → 5 per node (even spread, not 8 + 2)
    spec1 = spec_of(failure={"policy": "node", "zones": 1})
    assert failure_loss(10, spec1.failure, 1, 8) == 5


def test_group_spanning_two_nodes_is_lost_with_either():
    # g = 16 (TP8 × PP2) on 8-GPU nodes: each group holds 2 nodes of its own; losing a node
    # loses exactly that group. D = 100, C = 30 → R = 4, N = 5, nodes = 10, GPUs = 80.
    spec = spec_of(replica_group={"tp": 8, "pp": 2, "gpus_per_node": 8}, failure={"policy": "node", "zones": 1})
    plan = make_plan(spec, capacity=30.0)
    assert plan.value("gpus_per_group") == 16
    assert plan.value("failure_reserve_groups") == 1
    assert plan.value("total_groups") == 5
    assert plan.value("nodes") == 10
    assert plan.value("total_gpus") == 80
    assert plan.value("billed_gpus") == 80
    c = [c for c in plan.checks if c.key == "failure"][0]
    assert c.sentence.startswith("after losing one node (1 of 5 groups), capacity 120 req/s ≥ planned demand 100 req/s")
    # a 12-GPU group also spans two 8-GPU nodes (4 GPUs of the second idle, stated in a note)
    plan12 = make_plan(spec_of(replica_group={"gpus_per_replica": 12, "gpus_per_node": 8}), capacity=30.0)
    assert plan12.value("nodes") == 2 * plan12.value("total_groups")
    assert any("spans 2 nodes" in n and "4 GPUs" in n for n in plan12.notes)
    assert nodes_for(3, 12, 8) == 6


def test_n_plus_k():
    plan = make_plan(spec_of(failure={"policy": "n_plus_k", "k": 2, "zones": 1}), capacity=30.0)
    assert plan.value("failure_reserve_groups") == 2
    assert plan.value("total_groups") == 6


@pytest.mark.parametrize("rollout, r, overlap", [
    ({"max_surge": 2, "max_unavailable": 0, "canary_groups": 1}, 0, 0),  # surge covers the canary
    ({"max_surge": 0, "max_unavailable": 2, "canary_groups": 0}, 2, 2),  # 2 groups down at once
    ({"max_surge": 0, "max_unavailable": 1, "canary_groups": 3}, 3, 3),  # canaries not counted on
    ({"max_surge": 1, "max_unavailable": 1, "canary_groups": 3}, 2, 2),  # one canary surged
])
def test_rollout_surge_vs_unavailable(rollout, r, overlap):
    # D = 100, C = 30, N+1 → N_failure = 5; the worst step takes r groups: (N − 1 − r)·30 ≥ 100
    plan = make_plan(spec_of(failure={"policy": "n_plus_k", "k": 1, "zones": 1}, rollout=rollout), capacity=30.0)
    assert plan.item("rollout_overlap_groups").inputs["r"] == r
    assert plan.value("rollout_overlap_groups") == overlap
    assert plan.value("total_groups") == 5 + overlap
    assert plan.value("rollout_surge_gpus") == rollout["max_surge"] * 4
    roll = [c for c in plan.checks if c.key == "rollout"][0]
    assert roll.ok and f"({r} group{'' if r == 1 else 's'} out of service" in roll.sentence


def test_cold_start_reserve_and_warm_floor():
    # T = 60 + 20 + 40 = 120 s; b = 0.5 req/s per s → b·T = 60 req/s; C = 30 → ⌈2⌉ = 2 groups
    auto = {"ready_time_s": {"provision": 60, "weights": 20, "compile": 40},
            "burst_growth_rps_per_s": 0.5, "warm_floor_groups": 9}
    plan = make_plan(spec_of(failure={"policy": "n_plus_k", "k": 1, "zones": 1}, autoscaling=auto), capacity=30.0)
    assert plan.value("ready_time_s") == 120
    assert plan.item("ready_time_s").inputs == {"provision_s": 60, "weights_s": 20, "compile_s": 40}
    assert plan.value("cold_start_reserve_groups") == 2  # N = 7: (7 − 1)·30 = 180 ≥ 160
    assert plan.value("warm_floor_topup_groups") == 2  # warm floor 9 > 7
    assert plan.value("total_groups") == 9
    cold = [c for c in plan.checks if c.key == "cold_start"][0]
    assert cold.ok and "demand can grow by 60 req/s to 160 req/s" in cold.sentence


def test_cold_start_grows_with_the_largest_zone():
    # zone policy, 2 zones, D = 100, C = 50: N_failure = 4 (lose 2, keep 100).
    # b·T = 50 → seed ⌈50/50⌉ = 1, but N = 5 loses 3 and keeps 100 < 150; N = 6 keeps 150.
    auto = {"ready_time_s": {"provision": 100}, "burst_growth_rps_per_s": 0.5}
    plan = make_plan(spec_of(failure={"policy": "zone", "zones": 2}, autoscaling=auto), capacity=50.0)
    assert plan.value("failure_reserve_groups") == 2
    assert plan.item("cold_start_reserve_groups").inputs["⌈b·T/C⌉"] == 1
    assert plan.value("cold_start_reserve_groups") == 2
    assert all(c.ok for c in plan.checks)


def test_totals_utilisation_headroom():
    plan = make_plan(spec_of(demand__peak_rps=100.0, demand__uncertainty=0.2,
                             failure={"policy": "n_plus_k", "k": 1, "zones": 1}), capacity=30.0)
    # D = 120 → R = 4, N = 5; capacity 150; utilisation 100/150; headroom 50
    assert plan.value("total_groups") == 5
    assert plan.value("capacity_total_rps") == pytest.approx(150.0)
    assert plan.value("utilisation_at_peak_pct") == pytest.approx(100.0 * 100 / 150)
    assert plan.value("headroom_at_peak_rps") == pytest.approx(50.0)
    items = plan.items
    assert sum(plan.value(k) for k in ("traffic_groups", "failure_reserve_groups", "rollout_overlap_groups",
                                        "cold_start_reserve_groups", "warm_floor_topup_groups")) == 5
    assert all(it.formula and it.unit for it in items)


def test_costs_hand_computed():
    # 12 groups × 4 GPUs = 48 GPUs on 6 nodes (zone policy, D = 380, C = 50)
    spec = spec_of(demand={"peak_rps": 380.0, "mean_to_peak": 0.5, "output_tokens_per_request": 200},
                   failure={"policy": "zone", "zones": 3}, capacity={"good_fraction": 0.9},
                   prices={"usd_per_gpu_hour": 2.0, "overhead_pct": 10, "usd_per_kwh": 0.1, "pue": 1.5,
                           "gpu_power_w": 500})
    plan = make_plan(spec, capacity=50.0)
    assert plan.value("billed_gpus") == 48
    gpu = 48 * 2.0 * 730 * 1.1
    assert plan.value("gpu_cost_usd_per_month") == pytest.approx(gpu)
    assert plan.value("fleet_power_kw") == pytest.approx(500 * 48 * 1.5 / 1000)
    energy = 36.0 * 730 * 0.1
    assert plan.value("energy_cost_usd_per_month") == pytest.approx(energy)
    month = gpu + energy
    assert plan.value("cost_usd_per_month") == pytest.approx(month)
    assert plan.value("cost_usd_per_quarter") == pytest.approx(3 * month)
    good = 380 * 0.5 * 730 * 3600 * 0.9
    assert plan.value("good_requests_per_month") == pytest.approx(good)
    assert plan.value("cost_usd_per_1k_good_requests") == pytest.approx(month / good * 1000)
    assert plan.value("cost_usd_per_1m_good_output_tokens") == pytest.approx(month / (good * 200) * 1e6)
    assert plan.item("gpu_cost_usd_per_month").inputs["billed_gpus"] == 48


def test_billing_whole_nodes_vs_gpus():
    # 5 groups of 4 GPUs (N+1, D = 100, C = 30) need 3 nodes: 24 GPUs paid by node, 20 by GPU
    base = dict(failure={"policy": "n_plus_k", "k": 1, "zones": 1})
    by_node = make_plan(spec_of(**base), capacity=30.0)
    by_gpu = make_plan(spec_of(**base, prices={"usd_per_gpu_hour": 2.0, "billing": "gpu"}), capacity=30.0)
    assert (by_node.value("billed_gpus"), by_gpu.value("billed_gpus")) == (24, 20)
    assert by_gpu.value("cost_usd_per_month") == pytest.approx(20 * 2.0 * 730)


def test_good_fraction_defaults_to_slo_attainment_without_a_study():
    plan = make_plan(spec_of(slo="ttft_ms=2000,attainment=0.95"), capacity=30.0)
    assert plan.value("good_fraction") == 0.95
    assert "attainment" in plan.item("good_fraction").formula
    # nothing silently dropped: the token cost is missing and a note says why
    with pytest.raises(KeyError):
        plan.item("cost_usd_per_1m_good_output_tokens")
    assert any("1 M SLO-meeting output tokens not computed" in n for n in plan.notes)


def test_peak_classes_sum_and_growth_by_quarter():
    spec = spec_of(demand={"peak_rps": {"interactive": 60.0, "batch": 40.0}, "horizon_quarters": 3,
                           "growth_per_quarter": 0.5})
    plan = make_plan(spec, capacity=30.0)
    assert plan.value("peak_rps") == 100.0
    assert "interactive 60 + batch 40" in plan.item("peak_rps").formula
    assert [q.peak_rps for q in plan.quarters] == pytest.approx([100.0, 150.0, 225.0])
    assert [q.groups for q in plan.quarters] == [4, 5, 8]
    assert plan.quarters[1].cost_usd_per_quarter == pytest.approx(3 * 3 * 8 * 2.0 * 730)  # 5 groups → 3 nodes


def test_with_changes_and_validates():
    spec = spec_of(demand={"peak_rps": {"interactive": 60.0, "batch": 40.0}})
    s2 = spec.with_(peak_rps=200.0, policy="n_plus_k", price_usd_per_gpu_hour=3.0, k=2)
    assert dict(s2.demand.peak_rps) == {"interactive": 120.0, "batch": 80.0}
    assert (s2.failure.policy, s2.failure.k, s2.prices.usd_per_gpu_hour) == ("n_plus_k", 2, 3.0)
    assert spec.demand.total_peak_rps == 100.0  # the original is unchanged
    with pytest.raises(SpecError, match="demand.peak_rps must be > 0"):
        spec.with_(peak_rps=-5)
    with pytest.raises(SpecError, match="unknown plan parameter 'peak'"):
        spec.with_(peak=5)
    with pytest.raises(SpecError, match="unknown failure.policy 'rack'"):
        spec.with_(policy="rack")
    # capacity number via with_ switches the source to number
    assert make_plan(spec.with_(capacity_rps_per_group=25.0)).capacity.rps_per_group == 25.0


def test_make_plan_is_fast_with_a_capacity_number():
    spec = spec_of(failure={"policy": "zone", "zones": 3}, demand={"peak_rps": 5000.0, "horizon_quarters": 4,
                                                                     "growth_per_quarter": 0.1})
    make_plan(spec, capacity=7.0)
    t0 = time.perf_counter()
    for _ in range(20):
        make_plan(spec, capacity=7.0)
    assert (time.perf_counter() - t0) / 20 < 0.02


def fake_envelope(**kw):
    c = dict(estimate=60.0, ci_low=50.0, ci_high=70.0, lower_bound=52.0, status="ok", confidence=0.95,
             unit="req/s")
    c.update(kw)
    return SimpleNamespace(cslo=SimpleNamespace(**c))


def test_capacity_from_envelope_lower_bound_or_estimate():
    plan = make_plan(spec_of(), envelope=fake_envelope())
    assert plan.capacity.rps_per_group == 52.0
    assert plan.item("capacity_rps_per_group").inputs["ci_low"] == 50.0
    assert "lower bound" in plan.capacity.source
    df = plan.capacity.to_frame()
    assert df.loc[df.quantity == "C_SLO 95% interval, high end (study system)", "value"].item() == 70.0
    est = make_plan(spec_of(capacity={"use": "estimate"}), envelope=fake_envelope())
    assert est.capacity.rps_per_group == 60.0
    bad = make_plan(spec_of(), envelope=fake_envelope(status="below_range"))
    assert not [c for c in bad.checks if c.key == "capacity_status"][0].ok
    with pytest.raises(SpecError, match="no usable C_SLO lower bound"):
        make_plan(spec_of(), envelope=fake_envelope(lower_bound=None, status="not bracketed"))


def test_surge_larger_than_fleet_is_an_error():
    with pytest.raises(SpecError, match=r"rollout.max_surge \(9\) is larger than the planned fleet \(4 groups\)"):
        make_plan(spec_of(rollout={"max_surge": 9}), capacity=30.0)


def test_size_function_matches_items():
    spec = spec_of(failure={"policy": "zone", "zones": 3})
    s = size(320.0, 50.0, spec, 4)
    assert (s.need_traffic, s.n_failure, s.total, s.loss_failure, s.zone_groups) == (7, 11, 11, 4, (4, 4, 3))


def test_plan_frames_and_figure():
    plan = make_plan(spec_of(), capacity=30.0)
    df = plan.to_frame()
    assert list(df.columns) == ["item", "value", "unit", "formula", "inputs", "key"]
    assert df.set_index("key").loc["traffic_groups", "inputs"] == "D = 100; C = 30"
    assert plan.checks_frame()["ok"].all()
    fig = plan.figure()
    assert list(fig.data[0].y) == [4, 0, 0, 0, 0, 4]
    assert "4 replica groups" in plan.summary
