"""The what-if panel: the pure re-plan (whatif_state) against make_plan directly, monotone
responses to each control, and the widget wiring headless (set a control, the table and the
figure change)."""

from __future__ import annotations

import pytest

from capplan import report as R
from capplan.whatif import (NoCapacity, WhatIfModel, WhatIfPanel, WhatIfParams, slider_range,
                            model_settings, plan_table, whatif_state)

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
    # a looser TTFT limit can only raise C_SLO (more requests are good at every rate): on the
    # reduction's grid both come from the same statistics
    grid = [float(v) for v in model.envelope.stats.grid_spec.limits("x")]
    looser = whatif_state(model, p.with_(ttft_ms=grid[grid.index(p.ttft_ms) + 4]))
    assert _v(looser, "cslo_estimate") >= _v(base, "cslo_estimate")
    est = whatif_state(model, p.with_(capacity_use="estimate"))
    assert _v(est, "capacity_rps_per_group") >= _v(base, "capacity_rps_per_group")


def test_bad_policy_is_a_spec_error(model):
    from capplan.errors import SpecError

    with pytest.raises(SpecError, match="failure policy"):
        whatif_state(model, model.defaults().with_(policy="pray"))


def _runs_y(panel):
    return [t for t in panel.figure.data if str(t.name).startswith("runs")][0].y


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
    # the quarters view is dated and follows the plan
    q0 = panel.state.quarters.iloc[0]
    assert f'data-quarter="{q0.quarter}"' in panel.quarters.value and f"{q0.start:%d %b %Y}" in panel.quarters.value
    # an SLO slider re-fits: the attainment markers of the figure move
    runs0 = _runs_y(panel)
    panel.ttft.value = 1500.0
    assert tuple(_runs_y(panel)) != tuple(runs0)
    assert "redrawn in" in panel.status.value
    # the honesty of the bound the plan stands on, as the report's index says it
    assert f"lower bound: {panel.state.envelope.honesty.status}" in panel.status.value
    # the legend names the estimate, the interval and the lower bound
    names = " | ".join(str(t.name) for t in panel.figure.data)
    assert "C_SLO estimate" in names and "C_SLO lower bound" in names and "interval" in names


def test_round_limits_are_choosable_and_exact(model):
    """TTFT 1 000 and 1 500 ms are slider positions; off the reduction's grid the envelope is
    fitted exactly at that limit (the number `capplan report --slo ttft_ms=1500` gives)."""
    from capplan.envelope import fit_envelope

    p = model.defaults()
    ttft = model.limit_choices("x", p.ttft_ms)
    tpot = model.limit_choices("y", p.tpot_ms)
    assert {1000.0, 1500.0, 2000.0} <= set(ttft) and all(float(v).is_integer() for v in ttft)
    assert {50.0, 100.0, 150.0} <= set(tpot)
    st = whatif_state(model, p.with_(ttft_ms=1500.0))
    direct = fit_envelope(model.study, p.slo(model.slo).with_(ttft_ms=1500.0), reps=REPS, seed=0)
    assert _v(st, "cslo_lower_bound") == pytest.approx(direct.cslo.lower_bound, rel=1e-12)
    assert st.envelope.slo.ttft_ms == 1500.0
    # round slider steps for the other controls, the default among them
    for value, lo_f in ((8.0, 0.1), (2.5, 0.25), (11.0, 0.1)):
        lo, hi, step = slider_range(value, lo_f, 3.0)
        assert abs(value / step - round(value / step)) < 1e-9 and step in (0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5)


def test_impossible_limit_hides_the_plan_and_says_what_to_change(model):
    panel = WhatIfPanel(model)
    start = panel.ttft.value
    panel.ttft.value = min(panel.ttft.options, key=lambda o: o[1])[1]  # 600 ms: no tested rate meets it
    assert panel.state is None and panel.stale
    assert panel.table.value == "" and panel.quarters.value == ""  # no stale plan on screen
    assert panel.chart not in panel.widget.children
    msg = panel.status.value
    assert "No plan at these settings" in msg and "loosen the TTFT limit to 1,000 ms or more" in msg
    for cli_words in ("--capacity-rps", "capacity.use", "field:", "Traceback"):
        assert cli_words not in msg
    with pytest.raises(NoCapacity, match="lower request rates"):
        whatif_state(model, panel.params())
    panel.ttft.value = start  # and the panel recovers
    assert "redrawn in" in panel.status.value and 'data-key="total_gpus"' in panel.table.value
    assert panel.chart in panel.widget.children


def test_no_reserve_never_costs_more_than_a_reserve(model):
    """Fewer groups on the same billed nodes: the energy is that of the GPUs in groups, so no
    reserve cannot cost more than N + k (it did when idle billed GPUs were charged busy power)."""
    p = model.defaults()
    none = whatif_state(model, p.with_(policy="none"))
    nk = whatif_state(model, p.with_(policy="n_plus_k"))
    assert _v(none, "total_groups") < _v(nk, "total_groups")
    assert _v(none, "cost_usd_per_month") <= _v(nk, "cost_usd_per_month")


def test_save_scenario_round_trips(model, tmp_path, monkeypatch):
    """Save scenario writes a spec that load_plan_spec reads back, and `make_plan` on it with the
    study gives the plan on screen; the workbook is the finance export of that plan."""
    import openpyxl

    from capplan.plan import load_plan_spec, make_plan

    monkeypatch.setenv("CAPPLAN_SCENARIO_DIR", str(tmp_path))
    panel = WhatIfPanel(model)
    panel.peak.value = 12.0
    panel.policy.value = "node"
    folder = panel._on_save()
    assert folder is not None and 'download="plan.yaml"' in panel.saved.value
    assert 'download="plan.xlsx"' in panel.saved.value
    spec = load_plan_spec(folder / "plan.yaml")
    assert spec.demand.total_peak_rps == pytest.approx(12.0) and spec.failure.policy == "node"
    again = make_plan(spec, study=model.study, slo=spec.slo)
    assert again.value("total_gpus") == panel.state.plan.value("total_gpus")
    assert again.value("cost_usd_per_month") == pytest.approx(panel.state.plan.value("cost_usd_per_month"))
    wb = openpyxl.load_workbook(folder / "export" / "plan.xlsx")
    assert "Summary" in wb.sheetnames


def test_disk_cache_serves_a_second_model(tmp_path):
    """The second build reads the cached statistics (no events) and gives the same numbers."""
    a = WhatIfModel.build(R.demo_study_path(), reps=20, seed=0, cache=tmp_path)
    assert list(tmp_path.glob("whatif-*.pkl"))
    b = WhatIfModel.build(R.demo_study_path(), reps=20, seed=0, cache=tmp_path)
    assert b.envelope.cslo.to_dict() == a.envelope.cslo.to_dict()
    sa, sb = whatif_state(a, a.defaults()), whatif_state(b, b.defaults())
    assert sa.table.equals(sb.table)


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


def test_a_typed_limit_applies_and_says_its_range(model):
    """Typing 1500 in the TTFT box (applied on Enter or when the box loses focus) moves the
    slider and re-plans at 1 500 ms; a value off the slider's positions is added and fitted
    exactly; one outside the range is refused in words, the plan staying on screen."""
    panel = WhatIfPanel(model)
    lo, hi = min(v for _, v in panel.ttft.options), max(v for _, v in panel.ttft.options)
    hint = panel.widget.children[0].children[0].children[1].children[1].value
    assert f"{lo:,.0f}–{hi:,.0f} ms" in hint and "Enter" in hint
    panel.ttft_typed.value = 1500.0
    assert panel.ttft.value == 1500.0 and panel.state.envelope.slo.ttft_ms == 1500.0
    want = whatif_state(model, model.defaults().with_(ttft_ms=1500.0))
    assert _v(panel.state, "cslo_lower_bound") == _v(want, "cslo_lower_bound")
    assert "TTFT ≤ 1500 ms" in panel.status.value
    panel.ttft_typed.value = 1750.0  # not a slider position: added, and fitted at exactly 1 750 ms
    assert panel.ttft.value == 1750.0 and 1750.0 in [v for _, v in panel.ttft.options]
    assert panel.state.envelope.slo.ttft_ms == 1750.0
    before = panel.table.value
    panel.ttft_typed.value = lo / 10  # outside the range: said, not applied
    assert panel.ttft.value == 1750.0 and panel.ttft_typed.value == 1750.0
    assert "outside the range" in panel.status.value and f"{lo:,.0f}–{hi:,.0f} ms" in panel.status.value
    assert panel.table.value == before
    panel.ttft.value = 2000.0  # the slider moves the box too
    assert panel.ttft_typed.value == 2000.0


def test_widgets_added_below_stay_under_the_chart(model):
    import ipywidgets as W

    panel = WhatIfPanel(model)
    extra = W.HTML("below")
    panel.add_below(extra)
    assert panel.widget.children[-1] is extra and panel.widget.children[-2] is panel.chart
    panel.ttft.value = min(v for _, v in panel.ttft.options)  # no plan: the chart goes, extra stays
    assert panel.chart not in panel.widget.children and panel.widget.children[-1] is extra
    panel.ttft.value = 2000.0
    assert panel.widget.children[-2:] == (panel.chart, extra)
