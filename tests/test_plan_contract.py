"""The capacity contract and the chargeback (docs/plan.md, "Capacity contract", "Chargeback"),
against hand-computed cases: cents split by largest remainder, three tenants' monthly cost by
token share summing to the total, the study's workload read from its events, and the contract
in the plan's text, the export and the report index."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from capplan.export import export_plan
from capplan.plan import CapacityInfo, load_plan_spec, make_plan
from capplan.plan.contract import StudyWorkload, split_cents, study_workload
from capplan.report_index import IndexInputs, index_html
from capplan.plan.sensitivity import plan_record
from capplan.study import open_study
from conftest import ev

#: 100 req/s at C = 30 → ⌈100/30⌉ = 4 groups of 4 GPUs = 2 nodes of 8: 16 GPUs × $2 × 730 h
BASE = {"start": "2026-04-01", "slo": "ttft_ms=2000,attainment=0.99",
        "demand": {"peak_rps": 100.0, "horizon_quarters": 1, "uncertainty": 0.0},
        "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8},
        "failure": {"policy": "none"}, "rollout": {"max_surge": 1},
        "autoscaling": {"burst_growth_rps_per_s": 0.0, "warm_floor_groups": 0},
        "prices": {"usd_per_gpu_hour": 2.0, "overhead_pct": 0}}
#: tenant a: 600 in + 200 out, b: 300 + 100, c: 100 + 0 → weights 800 : 400 : 100 of 1 300
USAGE = ((("a",), 6, 600.0, 200.0), (("b",), 3, 300.0, 100.0), (("c",), 1, 100.0, 0.0))
SUMMARY = {"mean": 100.0, "p50": 100.0, "p90": 100.0, "p99": 100.0, "max": 100.0}


def _plan(usage=USAGE):
    cap = CapacityInfo(rps_per_group=30.0, source="study C_SLO lower bound", estimate=31.0, ci_low=29.0,
                       ci_high=33.0, lower_bound=30.0, confidence=0.95, study_name="s")
    plan = make_plan(load_plan_spec(BASE), capacity=cap)
    w = StudyWorkload("s", 10, SUMMARY, SUMMARY, "input_tokens", "runs' arrival: poisson", "production_warm",
                      ("tenant",), usage)
    return dataclasses.replace(plan, workload=w)


def test_split_cents_largest_remainder_hand_computed():
    # $100 in thirds: 3 333.33… cents each, the one cent left goes to the first (ties: earlier row)
    assert split_cents(100.0, [1, 1, 1]) == [33.34, 33.33, 33.33]
    # 10 000 cents × 1/6, 2/6, 3/6 = 1 666.67, 3 333.33, 5 000: the cent goes to the largest remainder (.67)
    assert split_cents(100.0, [1, 2, 3]) == [16.67, 33.33, 50.0]
    with pytest.raises(ValueError):
        split_cents(1.0, [0, 0])


def test_chargeback_three_tenants_sums_to_the_total_hand_computed():
    """Monthly cost 16 GPUs × $2 × 730 h = $23 360 = 2 336 000 cents; by 8/13, 4/13, 1/13:
    1 437 538.46, 718 769.23, 179 692.31 → floors sum to 2 335 999, the last cent to a (.46):
    $14 375.39 + $7 187.69 + $1 796.92 = $23 360.00. GPU-hours: 16 × 730 = 11 680 × share."""
    plan = _plan()
    assert plan.value("cost_usd_per_month") == pytest.approx(23360.0)
    cb = plan.chargeback()
    assert [r[0] for r in cb.rows] == [("a",), ("b",), ("c",)]
    assert [r[-1] for r in cb.rows] == [14375.39, 7187.69, 1796.92]
    assert round(sum(r[-1] for r in cb.rows), 2) == 23360.00
    assert [r[5] for r in cb.rows] == pytest.approx([11680 * 8 / 13, 11680 * 4 / 13, 11680 / 13])
    assert "input tokens (input_tokens) + 1 × output tokens" in cb.weight
    # decode tokens weighted 2×: 1 000 : 500 : 100 of 1 600 = 62.5 %, 31.25 %, 6.25 % — exact
    assert [r[-1] for r in plan.chargeback(output_weight=2.0).rows] == [14600.0, 7300.0, 1460.0]


def test_chargeback_without_tenants_is_one_row_said_so():
    cb = _plan(usage=()).chargeback()
    assert len(cb.rows) == 1 and cb.rows[0][-1] == pytest.approx(23360.0)
    assert "name no tenant or slo_class" in cb.weight


def test_study_workload_reads_lengths_tenants_and_labels(make_study):
    rows = [ev("r1", input_tokens=i, output_tokens=o, tenant=t, slo_class=c)
            for i, o, t, c in [(100, 10, "a", "chat"), (200, 20, "a", "chat"), (300, 30, "b", "batch"),
                               (1000, 5, "b", "chat")]]
    st = open_study(make_study(rows, runs=[{"run_id": "r1", "offered_rps": 1.0, "arrival": "gamma",
                                            "cache_condition": "warm_model_cold_kv"}]))
    w = study_workload(st)
    ins = [100, 200, 300, 1000]
    assert w.n_requests == 4 and w.input_tokens["mean"] == 400.0
    assert w.input_tokens["p90"] == pytest.approx(np.percentile(ins, 90))  # type 7
    assert w.output_tokens["max"] == 30.0
    assert w.by == ("tenant", "slo_class") and "gamma" in w.arrival and w.cache_condition == "warm_model_cold_kv"
    assert w.usage == ((("a", "chat"), 2, 300.0, 30.0), (("b", "batch"), 1, 300.0, 30.0),
                       (("b", "chat"), 1, 1000.0, 5.0))


def test_contract_in_text_export_and_index(tmp_path):
    plan = _plan()
    c = plan.contract()
    assert [x.name for x in c.clauses] == ["workload", "tail SLO", "goodput", "headroom", "overload response"]
    d = {x.name: x for x in c.clauses}
    assert "production_warm" in d["workload"].text and "runs[].cache_condition" in d["workload"].source
    assert d["tail SLO"].text.startswith("0.99 of requests with TTFT ≤ 2000 ms")
    # 100 req/s all month (no mean_to_peak: 1) × 730 h × 3 600 s × 0.99 = 260 172 000
    assert "30 req/s per replica group" in d["goodput"].text and "260,172,000 SLO-meeting" in d["goodput"].text
    assert "headroom at peak 20 req/s" in d["headroom"].text  # 4 × 30 − 100
    assert "planned demand 100 req/s" in d["headroom"].text and "4 traffic groups (120 req/s at C)" in d["headroom"].text
    assert "queue cap: not stated" in d["overload response"].text
    assert plan.to_text().startswith("Capacity contract:\n  workload:")
    out = export_plan(plan, tmp_path / "x", time="2026-01-01T00:00:00+00:00")
    contract = pd.read_csv(out / "contract.csv", encoding="utf-8-sig")
    assert contract["Clause"].tolist()[0] == "workload" and len(contract) == 5
    charge = pd.read_csv(out / "chargeback.csv", encoding="utf-8-sig")
    assert charge["Cost per month (USD)"].tolist() == [14375.39, 7187.69, 1796.92, 23360.0]
    assert charge["Tenant"].tolist()[-1] == "total" and "weight: tokens processed" in charge["Note"].iloc[-1]
    html = index_html(IndexInputs("s", "h", (), (), ()), json.loads(json.dumps(plan_record(plan))), None, None)
    block = html[html.index('<section id="contract">'):]
    block = block[:block.index("</section>")]
    for name in ("workload", "tail SLO", "goodput", "headroom", "overload response"):
        assert f"<th>{name}</th>" in block
    assert html.index('id="answer"') < html.index('id="contract"') < html.index('id="how-sure"')
