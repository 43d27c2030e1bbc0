"""Dated plans (spec start:, default the next calendar quarter), the sensitivity band against
a hand-computed case, and the entry points of `import capplan`."""

from __future__ import annotations

import datetime as dt
import math
import subprocess
import sys

import pytest

from capplan.errors import SpecError
from capplan.plan.periods import add_months, next_quarter_start, parse_start, quarters
from capplan.plan import load_plan_spec, make_plan
from capplan.plan.sensitivity import plan_record, sensitivity

BASE = {"demand": {"peak_rps": 100.0, "horizon_quarters": 4, "growth_per_quarter": 0.1},
        "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8},
        "failure": {"policy": "none"}, "rollout": {"max_surge": 1},
        "prices": {"usd_per_gpu_hour": 2.0}}


def test_quarter_dates():
    assert next_quarter_start(dt.date(2026, 1, 1)) == dt.date(2026, 4, 1)
    assert next_quarter_start(dt.date(2026, 11, 30)) == dt.date(2027, 1, 1)
    assert parse_start("2026-Q3") == dt.date(2026, 7, 1) and parse_start("2026q4") == dt.date(2026, 10, 1)
    assert parse_start(dt.date(2026, 2, 15)) == dt.date(2026, 2, 15)
    assert add_months(dt.date(2026, 1, 31), 1) == dt.date(2026, 2, 28)
    qs = quarters(dt.date(2026, 10, 1), 2)
    assert [(q.label, q.start, q.end) for q in qs] == [
        ("2026Q4", dt.date(2026, 10, 1), dt.date(2026, 12, 31)), ("2027Q1", dt.date(2027, 1, 1), dt.date(2027, 3, 31))]
    odd = quarters(dt.date(2026, 2, 15), 1)[0]
    assert odd.label == "Q1 (from 15 Feb 2026)" and odd.end == dt.date(2026, 5, 14)
    with pytest.raises(SpecError, match="start must be a date"):
        parse_start("next spring")


def test_plan_is_dated_from_start_or_the_next_quarter():
    plan = make_plan(load_plan_spec({**BASE, "start": "2026-04-01"}), capacity=30.0)
    assert [q.label for q in plan.quarters] == ["2026Q2", "2026Q3", "2026Q4", "2027Q1"]
    assert plan.quarters[0].start == dt.date(2026, 4, 1) and plan.quarters[-1].end == dt.date(2027, 3, 31)
    assert not [n for n in plan.notes if "the plan starts on" in n]
    auto = make_plan(load_plan_spec(BASE), capacity=30.0, as_of="2026-05-20T10:00:00+00:00")
    assert auto.quarters[0].label == "2026Q3"  # the calendar quarter after the reference day
    assert any("the plan starts on 2026-07-01" in n for n in auto.notes)  # a default said out loud
    # months and years add up to the quarters
    months, years = plan.months_frame(), plan.years_frame()
    assert len(months) == 12 and months["month"].iloc[0] == "2026-04"
    assert years["cost_usd"].iloc[0] == pytest.approx(sum(q.cost_usd_per_quarter for q in plan.quarters))
    q = plan.quarters_frame()
    assert (q["cost_usd_per_year"] == 12 * q["cost_usd_per_month"]).all()
    assert q["demand_rps"].tolist() == pytest.approx([100.0, 110.0, 121.0, 133.1])
    # the spec round-trips its start; a start with a demand history is refused
    assert load_plan_spec(plan.spec.to_dict()).start == dt.date(2026, 4, 1)
    with pytest.raises(SpecError, match="start is for a fixed peak"):
        load_plan_spec({**BASE, "start": "2026-04-01",
                        "demand": {"history": "d.csv", "horizon_quarters": 1}})
    # plurals in words
    one = make_plan(load_plan_spec({**BASE, "demand": {"peak_rps": 10.0}}), capacity=30.0)
    sentences = one.summary + " ".join(c.sentence for c in one.checks) + " ".join(t for _, t in one.about())
    assert "1 replica group of 4 GPUs" in one.summary and "on 1 node " in one.summary
    assert "1 groups" not in sentences and "group(s)" not in sentences


def test_sensitivity_band_hand_computed():
    """D = 100 req/s, no reserves: N = ⌈100/C⌉. At C = 30: N = 4, and 4 groups suffice for any
    C ≥ 25 (= 100/4) while C ≥ 33.33 (= 100/3) needs only 3: the band is [25, 33.33)."""
    plan = make_plan(load_plan_spec(BASE), capacity=30.0)
    s = sensitivity(plan)
    assert plan.value("total_groups") == 4
    assert s.low_rps_per_group == pytest.approx(25.0, rel=1e-8)
    assert s.high_rps_per_group == pytest.approx(100 / 3, rel=1e-8)
    assert (s.up.groups, s.down.groups) == (5, 3)
    assert s.margin_below == pytest.approx(1 - 25 / 30) and s.margin_above == pytest.approx(100 / 90 - 1)
    # 4 groups of 4 GPUs on 2 nodes; 5 groups take 3 nodes (billed by node)
    assert (s.plan_step.billed_gpus, s.up.billed_gpus, s.down.billed_gpus) == (16, 24, 16)
    assert s.up.cost_usd_per_month == pytest.approx(24 * 2.0 * 730)
    assert "stays the same for any C_SLO from 25 to 33.33" in s.to_text()
    # a warm floor above the traffic need: no capacity gives fewer groups
    floor = make_plan(load_plan_spec({**BASE, "autoscaling": {"warm_floor_groups": 6}}), capacity=30.0)
    f = sensitivity(floor)
    assert math.isinf(f.high_rps_per_group) and f.down is None
    assert "No higher capacity gives fewer groups" in f.to_text()
    rec = plan_record(plan, s)
    assert rec["sensitivity"]["high_system"] == pytest.approx(100 / 3) and rec["quarters"][0]["start"]


def test_import_capplan_is_cheap_and_lists_its_entry_points():
    code = ("import sys, capplan; heavy = [m for m in ('plotly', 'scipy', 'capplan.envelope', 'capplan.plan', "
            "'ipywidgets') if m in sys.modules]; print(heavy); "
            "print(all(n in dir(capplan) for n in ('fit_envelope', 'make_plan', 'load_plan_spec', "
            "'export_plan', 'demo_study_path', 'WhatIfPanel', 'render_report'))); "
            "import pydoc; print('make_plan' in pydoc.render_doc(capplan))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["[]", "True", "True"]
    import capplan

    assert capplan.make_plan.__module__ == "capplan.plan.make" and capplan.demo_study_path().is_dir()
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        capplan.nope  # noqa: B018
