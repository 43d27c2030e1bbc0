"""capplan.plan.dynamics: the plan's checks simulated at the planned size (a synth config
stands in for the twin), their sentences and figures, and the budget searches."""

from __future__ import annotations

import re
import math

import pytest

from capplan.plan import load_plan_spec, make_plan
from capplan.plan.dynamics import SimSettings, simulate_plan, smallest_fleet, smallest_warm_floor
from capplan.sim.config import preset

FAST = SimSettings(window_s=10.0, settle_s=150.0)


@pytest.fixture(scope="module")
def plan():
    spec = load_plan_spec("templates/plan.yaml").with_(
        ready_time_s={"provision": 60.0, "weights": 30.0}, peak_rps=6.0, horizon_quarters=1)
    return make_plan(spec, capacity=2.8, gpus_per_group=4)


def test_checks_state_the_simulated_outcome(plan):
    dyn = simulate_plan(plan, preset("demo"), settings=FAST, budget_slo_minutes=5.0)
    keys = [c.key for c in dyn.checks]
    assert keys == ["failure", "rollout", "cold_start"]
    f = dyn.checks[0]
    N = int(plan.value("total_groups"))
    assert f.groups == N and f"of {N} groups" in f.sentence and "Q1 peak" in f.sentence
    # the routes of the lost zone stay for detect + removal (15 s): its requests fail
    assert f.good_lost > 0 and f.slo_minutes >= 0 and f.ok is True
    assert f.timeline.incidents.iloc[0]["kind"] == "failure"
    assert ("SLO broken for" in f.sentence) == (f.slo_minutes > 0 or f.good_lost > 0)
    text = dyn.to_text()
    assert text.count("[ok]") + text.count("[FAIL]") == 3 and "Notes:" in text
    df = dyn.to_frame()
    assert list(df["check"]) == keys and df["good_requests_lost"].iloc[0] == f.good_lost
    assert dyn.figure("failure").layout.title.text == f.sentence


def test_a_steep_burst_needs_a_warm_floor():
    # from 30 % of the peak to the peak at once, new groups ready after 180 s: one group
    # (what the autoscaler keeps at the mean) is overrun for minutes, a warm floor is not
    spec = load_plan_spec("templates/plan.yaml").with_(
        ready_time_s={"provision": 150.0, "weights": 30.0}, peak_rps=8.0, mean_to_peak=0.3,
        horizon_quarters=1)
    plan = make_plan(spec, capacity=2.8, gpus_per_group=4)
    s = smallest_warm_floor(plan, preset("demo"), budget_slo_minutes=0.5, burst_rps_per_s=math.inf,
                            settings=FAST)
    tried = dict(s.tried)
    assert s.chosen is not None and s.chosen >= 2 and tried[s.chosen] <= 0.5
    if s.chosen - 1 in tried:
        assert tried[s.chosen - 1] > 0.5
    assert tried[min(tried)] >= tried[max(tried)]
    assert "warm floor" in s.sentence and s.to_frame().shape[1] == 2


def test_smallest_fleet_for_a_failure_budget(plan):
    s = smallest_fleet(plan, preset("demo"), budget_slo_minutes=3.0, settings=FAST)
    lo, hi = int(plan.value("traffic_groups")), int(plan.value("total_groups"))
    assert s.chosen is None or lo <= s.chosen <= hi
    assert all(lo <= v <= hi for v, _ in s.tried)


def test_plan_cli_states_the_simulated_checks(tmp_path, capsys):
    import yaml

    from capplan.cli import main
    from capplan.sim.config import PRESETS

    system = tmp_path / "system.yaml"
    system.write_text(yaml.safe_dump(PRESETS["demo"]))
    out = tmp_path / "plan"
    assert main(["plan", "--capacity-rps", "2.8", "--spec", "templates/plan.yaml", "--out", str(out),
                 "--gpus-per-replica", "4", "--twin", str(system), "--quarter", "9"]) == 2
    assert "--quarter" in capsys.readouterr().err and not out.exists()
    assert main(["plan", "--capacity-rps", "2.8", "--spec", "templates/plan.yaml", "--out", str(out),
                 "--gpus-per-replica", "4", "--twin", str(system), "--quarter", "1"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"the plan's checks simulated at the (\d{4})?Q1 peak", text) and "losing zone a" in text
    assert (out / "plan-simulated.csv").is_file()


def test_a_day_under_the_autoscaler(plan):
    import tempfile
    from pathlib import Path

    from capplan.plan.dynamics import day_scenario

    with tempfile.TemporaryDirectory() as d:
        c = day_scenario(plan, preset("demo"), span_s=3 * 3600, settings=SimSettings(window_s=60.0),
                         tmp=Path(d))
    s = c.timeline.summary_frame().iloc[0]
    assert c.key == "day" and "3 h of a working day" in c.sentence
    assert f"{int(s['scale_decisions'])} scale decisions" in c.sentence
    assert s["replicas_max"] > s["replicas_min"]  # it followed the day
    assert c.control.summary_frame().iloc[0]["replicas_min"] == int(plan.value("total_groups"))


def test_client_retries_beside_good_requests_lost(plan):
    from capplan.sim.retry import RetryPolicy

    plain = simulate_plan(plan, preset("demo"), settings=FAST, checks=("failure",)).checks[0]
    assert plain.retries == 0 and plain.retry_amplification == 1.0
    assert "client retries" not in plain.sentence
    rt = RetryPolicy(max_retries=3, backoff_s=0.5, budget=0.2, seed=1)
    dyn = simulate_plan(plan, preset("demo"), settings=FAST.__class__(
        window_s=10.0, settle_s=150.0, retry=rt), checks=("failure",))
    f = dyn.checks[0]
    # the lost zone's requests come back as retries: attempts / original requests > 1, and the
    # sentence says so beside the good requests lost
    assert f.retries > 0 and f.retry_amplification > 1.0
    assert f"{f.retries:,} client retries: ×{f.retry_amplification:.4f}" in f.sentence
    assert any("clients retry up to 3×" in n for n in dyn.notes)
    df = dyn.to_frame()
    assert df["retries"].iloc[0] == f.retries
