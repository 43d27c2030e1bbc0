"""The fleet what-if (capplan.whatif_fleet): the pure re-plan against make_plan, each control
moving the plan the right way, the simulated burst, and the widgets driven headless."""

from __future__ import annotations

import math

import pytest

from capplan.plan import load_plan_spec, make_plan
from capplan.plan.dynamics import SimSettings
from capplan.sim.config import preset
from capplan.whatif_fleet import (FleetParams, FleetWhatIfPanel, fleet_defaults, fleet_state,
                                  scaled_parts)


@pytest.fixture(scope="module")
def spec():
    return load_plan_spec("templates/plan.yaml").with_(horizon_quarters=1)


def _v(state, key):
    return float(state.table.set_index("key").loc[key, "value"])


def test_state_is_make_plan_with_the_controls(spec):
    p = fleet_defaults(spec)
    assert p.ready_time_s == spec.autoscaling.ready_s
    st = fleet_state(spec, 2.8, p.with_(ready_time_s=600.0, burst_growth_rps_per_s=0.02),
                     gpus_per_group=4)
    plan = make_plan(spec.with_(ready_time_s=scaled_parts(spec.autoscaling.ready_time_s, 600.0),
                                burst_growth_rps_per_s=0.02), capacity=2.8, gpus_per_group=4)
    assert _v(st, "cold_start_reserve_groups") == plan.value("cold_start_reserve_groups")
    assert _v(st, "ready_time_s") == pytest.approx(600.0)
    # parts keep their shares
    parts = scaled_parts((("provision", 100.0), ("weights", 300.0)), 200.0)
    assert parts == {"provision": 50.0, "weights": 150.0}


def test_each_control_moves_the_plan(spec):
    p = fleet_defaults(spec).with_(burst_growth_rps_per_s=0.01)
    base = fleet_state(spec, 2.8, p, gpus_per_group=4)
    slower = fleet_state(spec, 2.8, p.with_(ready_time_s=p.ready_time_s * 4), gpus_per_group=4)
    assert _v(slower, "cold_start_reserve_groups") >= _v(base, "cold_start_reserve_groups")
    assert _v(slower, "total_groups") > _v(base, "total_groups")
    floor = fleet_state(spec, 2.8, p.with_(warm_floor_groups=40), gpus_per_group=4)
    assert _v(floor, "total_groups") == 40 and _v(floor, "warm_floor_topup_groups") > 0
    slow = fleet_state(spec, 2.8, p.with_(burst_growth_rps_per_s=0.001), gpus_per_group=4)
    at_once = fleet_state(spec, 2.8, p.with_(burst_growth_rps_per_s=math.inf), gpus_per_group=4)
    # at once: the jump from the mean (0.6 × 8) to the peak (8 req/s) within one ready time
    assert _v(at_once, "cold_start_reserve_groups") == math.ceil(8 * 0.4 / 2.8)
    assert _v(at_once, "cold_start_reserve_groups") > _v(slow, "cold_start_reserve_groups")


def test_burst_simulated_on_a_twin(spec):
    s = spec.with_(ready_time_s={"provision": 120.0}, peak_rps=8.0, mean_to_peak=0.3)
    fast = SimSettings(settle_s=120.0)
    p = FleetParams(120.0, 0, math.inf)
    cold = fleet_state(s, 2.8, p, gpus_per_group=4, system=preset("demo"), settings=fast)
    warm = fleet_state(s, 2.8, p.with_(warm_floor_groups=4), gpus_per_group=4,
                       system=preset("demo"), settings=fast)
    assert _v(cold, "burst_slo_minutes") > _v(warm, "burst_slo_minutes")
    # the burst only (offered, goodput, groups ready): the groups by reason are table rows here
    assert len(cold.figure.data) == 3 and not [t for t in cold.figure.data if t.type == "waterfall"]


def test_panel_headless(spec):
    pytest.importorskip("ipywidgets")
    panel = FleetWhatIfPanel(spec, 2.8, gpus_per_group=4)
    before = panel.table.value
    total = _v(panel.state, "total_groups")
    panel.floor.value = int(total) + 5
    assert panel.table.value != before and _v(panel.state, "total_groups") == total + 5
    panel.ready.value = 1200.0
    panel.burst.value = 0.05
    assert _v(panel.state, "cold_start_reserve_groups") > 0
    assert "redrawn" in panel.status.value
    # without a twin no chart: the main panel's chart already draws the groups by reason (it
    # was drawn twice on the page), and this table gives them row by row
    assert panel.figure is None and panel.plot is None
    keys = set(panel.state.table["key"])
    assert {"traffic_groups", "failure_reserve_groups", "rollout_overlap_groups", "cold_start_reserve_groups",
            "warm_floor_topup_groups", "total_groups"} <= keys
    parts = sum(_v(panel.state, k) for k in ("traffic_groups", "failure_reserve_groups", "rollout_overlap_groups",
                                             "cold_start_reserve_groups", "warm_floor_topup_groups"))
    assert parts == _v(panel.state, "total_groups")


def test_fleet_table_numbers_read_like_the_report():
    """A cost of 85,632.4 USD/month shows as 85,632, never 8.56e+04."""
    import pandas as pd

    from capplan import whatif_fleet as F

    class _Item:
        def __init__(self, name, value, unit):
            self.name, self.value, self.unit = name, value, unit

    class _Plan:
        items = {"cost_usd_per_month": _Item("cost", 85632.4, "USD/month"), "total_gpus": _Item("GPUs", 32, "")}

        def item(self, k):
            return self.items[k]

    tab = F.fleet_table(_Plan())
    assert isinstance(tab, pd.DataFrame)
    shown = dict(zip(tab["key"], tab["shown"]))
    assert shown["cost_usd_per_month"] == "85,632" and shown["total_gpus"] == "32"
