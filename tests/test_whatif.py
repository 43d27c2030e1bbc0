"""The what-if panel: the pure re-plan (whatif_state) against make_plan directly, monotone
responses to each control, and the widget wiring headless (set a control, the table and the
figure change)."""

from __future__ import annotations

import pytest

from capplan import report as R
from capplan.whatif import (WhatIfModel, WhatIfPanel, WhatIfParams, model_settings,
                            plan_table, whatif_state)

REPS = 50


@pytest.fixture(scope="module")
def model() -> WhatIfModel:
    return WhatIfModel.build(R.demo_study_path(), reps=REPS, seed=0)


def _v(state, key: str) -> float:
    return float(state.table.set_index("key").loc[key, "value"])


def test_state_matches_make_plan_on_the_refit_envelope(model):
    from capplan.envelope import fit_envelope
    from capplan.plan import make_plan

    p = model.defaults().with_(peak_rps=11.0, ttft_ms=model.slo.ttft_ms)
    st = whatif_state(model, p)
    # the same plan the long way: a fresh fit at the same settings, then make_plan
    env = fit_envelope(model.study, p.slo(model.slo), reps=REPS, seed=0)
    spec = model.spec.with_(peak_rps=11.0, slo=p.slo(model.slo))
    plan = make_plan(spec, study=model.study, envelope=env, slo=p.slo(model.slo))
    assert _v(st, "total_gpus") == plan.value("total_gpus")
    assert _v(st, "cost_usd_per_month") == pytest.approx(plan.value("cost_usd_per_month"))
    assert _v(st, "cslo_lower_bound") == pytest.approx(env.cslo.lower_bound)
    assert _v(st, "peak_rps") == 11.0


def test_same_params_same_numbers(model):
    p = model.defaults()
    a, b = whatif_state(model, p), whatif_state(model, p)
    assert a.table.equals(b.table)


def test_each_control_moves_the_plan_the_right_way(model):
    p = model.defaults()
    base = whatif_state(model, p)
    more = whatif_state(model, p.with_(peak_rps=p.peak_rps * 2))
    assert _v(more, "total_groups") > _v(base, "total_groups")
    assert _v(whatif_state(model, p.with_(uncertainty=p.uncertainty + 0.5)), "demand_rps") == \
        pytest.approx(p.peak_rps * (1 + p.uncertainty + 0.5))
    pricier = whatif_state(model, p.with_(price_usd_per_gpu_hour=p.price_usd_per_gpu_hour * 2))
    assert _v(pricier, "total_gpus") == _v(base, "total_gpus")
    assert _v(pricier, "cost_usd_per_month") > _v(base, "cost_usd_per_month")
    none = whatif_state(model, p.with_(policy="none"))
    assert _v(none, "failure_reserve_groups") == 0
    assert _v(none, "total_groups") <= _v(base, "total_groups")
    # a looser TTFT limit can only raise C_SLO (more requests are good at every rate)
    grid = model.limit_choices("x", p.ttft_ms)
    looser = whatif_state(model, p.with_(ttft_ms=grid[grid.index(p.ttft_ms) + 4]))
    assert _v(looser, "cslo_estimate") >= _v(base, "cslo_estimate")
    est = whatif_state(model, p.with_(capacity_use="estimate"))
    assert _v(est, "capacity_rps_per_group") >= _v(base, "capacity_rps_per_group")


def test_bad_policy_is_a_spec_error(model):
    from capplan.errors import SpecError

    with pytest.raises(SpecError, match="failure policy"):
        whatif_state(model, model.defaults().with_(policy="pray"))


def test_panel_wiring_headless(model):
    panel = WhatIfPanel(model)
    assert all(c.continuous_update is False for c in panel.controls
               if hasattr(c, "continuous_update"))
    table0, fig0 = panel.table.value, panel.figure.to_dict()
    gpus0 = _v(panel.state, "total_gpus")
    panel.peak.value = panel.peak.value * 2
    assert panel.table.value != table0
    assert _v(panel.state, "peak_rps") == pytest.approx(panel.peak.value)
    assert _v(panel.state, "total_gpus") > gpus0
    assert f">{int(_v(panel.state, 'total_gpus'))}<" in panel.table.value.replace(",", "")
    waterfall = [t for t in panel.figure.data if t.type == "waterfall"][0]
    assert waterfall.y[-1] == _v(panel.state, "total_groups")
    assert panel.figure.to_dict() != fig0
    # an SLO slider re-fits: the attainment markers of the figure move
    runs0 = [t for t in panel.figure.data if t.name == "runs"][0].y
    panel.ttft.index = max(0, panel.ttft.index - 6)
    runs1 = [t for t in panel.figure.data if t.name == "runs"][0].y
    assert tuple(runs1) != tuple(runs0)
    assert "redrawn in" in panel.status.value


def test_panel_shows_an_error_instead_of_raising(model):
    panel = WhatIfPanel(model)
    before, start = panel.table.value, panel.ttft.index
    panel.ttft.index = 0  # strictest TTFT on the grid: even the lowest tested rate fails
    assert "no usable C_SLO" in panel.status.value and "ERROR" in panel.status.value
    assert panel.table.value == before  # the last good plan stays on screen
    panel.ttft.index = start  # and the panel recovers
    assert "ERROR" not in panel.status.value and "redrawn in" in panel.status.value


def test_model_settings_env_wins_and_blanks_mean_the_spec():
    s = model_settings({"CAPPLAN_STUDY": "/s", "CAPPLAN_REPS": "30", "OTHER": "x"},
                       study_path="/ignored", spec_path="", slo={}, seed=-1, reps=0,
                       confidence=0.0)
    assert s == {"study": "/s", "spec": None, "slo": None, "seed": None, "reps": 30,
                 "confidence": None}
    s = model_settings({}, study_path="/p", spec_path="/spec.yaml",
                       slo={"ttft_ms": 1000.0}, seed=3, reps=100, confidence=0.9)
    assert s == {"study": "/p", "spec": "/spec.yaml", "slo": {"ttft_ms": 1000.0}, "seed": 3,
                 "reps": 100, "confidence": 0.9}


def test_plan_table_rows(model):
    st = whatif_state(model, model.defaults())
    t = plan_table(st.plan, st.envelope)
    assert list(t.columns) == ["key", "quantity", "value", "unit", "shown"]
    assert {"cslo_estimate", "total_gpus", "cost_usd_per_month", "checks"} <= set(t["key"])
    assert isinstance(model.defaults(), WhatIfParams)
