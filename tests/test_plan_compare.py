"""Candidates (TP2 vs TP4): the cheapest per SLO-meeting request, and whether that is settled.
A TP change serves the same build, so those candidates are ``same_outputs`` (quality:
tests/test_candidates_quality.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from capplan.plan.candidates import Candidate, compare_candidates
from capplan.plan import load_plan_spec

MONTH_S = 730 * 3600


def spec(g, price=2.0):
    return load_plan_spec({
        "demand": {"peak_rps": 100.0, "mean_to_peak": 1.0},
        "capacity": {"good_fraction": 0.99},
        "replica_group": {"gpus_per_replica": g, "gpus_per_node": 8},
        "failure": {"policy": "none"},
        "rollout": {"max_surge": 1},
        "prices": {"usd_per_gpu_hour": price, "billing": "gpu"},
    })


def env(lb, lo, hi, status="bracketed"):
    return SimpleNamespace(cslo=SimpleNamespace(estimate=(lo + hi) / 2, ci_low=lo, ci_high=hi, lower_bound=lb,
                                                status=status, confidence=0.95, unit="req/s"), notes=())


def per_1k(gpus, price=2.0):
    return gpus * price * 730 / (100.0 * MONTH_S * 0.99) * 1000


def test_not_settled_when_intervals_overlap():
    # TP2: lb 10.5 → 10 groups × 2 = 20 GPUs; CI [10, 14] → 10 or 8 groups → 20 or 16 GPUs
    # TP4: lb 26 → 4 groups × 4 = 16 GPUs; CI [20, 32] → 5 or 4 groups → 20 or 16 GPUs
    cmp = compare_candidates([Candidate("TP2", spec(2), envelope=env(10.5, 10.0, 14.0)),
                              Candidate("TP4", spec(4), envelope=env(26.0, 20.0, 32.0), same_outputs=True)])
    df = cmp.to_frame().set_index("candidate")
    assert df.loc["TP2", "cost_usd_per_1k_good_requests"] == pytest.approx(per_1k(20))
    assert df.loc["TP4", "cost_usd_per_1k_good_requests"] == pytest.approx(per_1k(16))
    assert (df.loc["TP2", "cost_low_usd_per_1k"], df.loc["TP2", "cost_high_usd_per_1k"]) == \
        pytest.approx((per_1k(16), per_1k(20)))
    assert cmp.best == "TP4" and not cmp.settled
    assert bool(df.loc["TP2", "cost_interval_overlaps_best"])
    # per GPU: TP2 [5, 7], TP4 [5, 8] req/s
    assert bool(df.loc["TP2", "capacity_per_gpu_overlaps_best"])
    assert "NOT settled" in cmp.verdict and "TP2" in cmp.verdict and "capacity-per-GPU intervals overlap" in cmp.verdict


def test_settled_when_apart_and_failing_candidates_excluded():
    # TP2 CI [10, 12] → 10 or 9 groups → 20 or 18 GPUs; TP4 CI [25, 40] → 4 or 3 groups → 16 or 12 GPUs
    cheap_but_unbracketed = Candidate("H100-TP1", spec(1, price=0.5), envelope=env(5.0, 0.0, 9.0, status="< min tested"),
                                       same_outputs=True)
    cmp = compare_candidates([Candidate("TP2", spec(2), envelope=env(10.5, 10.0, 12.0)),
                              Candidate("TP4", spec(4), envelope=env(26.0, 25.0, 40.0), same_outputs=True),
                              cheap_but_unbracketed])
    df = cmp.to_frame().set_index("candidate")
    assert cmp.best == "TP4" and cmp.settled
    assert (df.loc["TP4", "cost_low_usd_per_1k"], df.loc["TP4", "cost_high_usd_per_1k"]) == \
        pytest.approx((per_1k(12), per_1k(16)))
    assert not df.loc["H100-TP1", "meets_slo"] and "bracketed" in df.loc["H100-TP1", "reason"]
    assert "settled" in cmp.verdict and "NOT" not in cmp.verdict
    assert len(cmp.figure().data[0].x) == 3


def test_capacity_numbers_and_unplannable_candidate():
    cmp = compare_candidates([Candidate("A", spec(2), capacity=12.5),
                              Candidate("B", spec(2), envelope=env(None, 0.0, 0.0, status="< min tested"),
                                        same_outputs=True)])
    df = cmp.to_frame().set_index("candidate")
    assert cmp.best == "A" and cmp.settled
    assert not df.loc["B", "meets_slo"] and "no usable C_SLO" in df.loc["B", "reason"]
    assert compare_candidates([Candidate("B", spec(2), envelope=env(None, 0, 0, "< min tested"))]).best is None
