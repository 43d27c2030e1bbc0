"""The index's next steps and the per-quarter sensitivity band, against hand-computed cases:
fleet steps dated from a fixed growth and from a forecast, the band of every quarter with its
knife-edge flag, the runs before signing, the failure check that broke the SLO when simulated,
and why ``capplan design`` proposes no run."""

from __future__ import annotations

import datetime as dt
import json
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from capplan.plan.fleet_steps import carried_rps, fleet_steps
from capplan.plan.forecast import Forecast
from capplan.next_steps import next_steps, runs_before_signing, what_to_test
from capplan.plan import CapacityInfo, load_plan_spec, make_plan
from capplan.report_index import IndexInputs, checks_section, index_html
from capplan.plan.sensitivity import plan_record, sensitivity
from test_report import demo_report  # noqa: F401  (shared fixture)

#: no reserves (policy none, no burst, no floor): N = ⌈D / C⌉ per quarter
BASE = {"start": "2026-04-01",
        "demand": {"peak_rps": 100.0, "horizon_quarters": 4, "growth_per_quarter": 0.1, "uncertainty": 0.0},
        "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8},
        "failure": {"policy": "none"}, "rollout": {"max_surge": 1},
        "autoscaling": {"burst_growth_rps_per_s": 0.0, "warm_floor_groups": 0},
        "prices": {"usd_per_gpu_hour": 2.0}}
HONEST = {"status": "honest", "sentence": "the lower bound includes the run-to-run variation measured near "
                                          "the crossing (6 runs)", "estimand": "runs like these",
          "reasons": [], "runs_to_add": []}


def _cap(lb=30.0, est=30.5, ci=(29.0, 31.0), honesty=HONEST) -> CapacityInfo:
    return CapacityInfo(rps_per_group=lb, source="study C_SLO lower bound", estimate=est, ci_low=ci[0],
                        ci_high=ci[1], lower_bound=lb, confidence=0.95, status="bracketed", study_replicas=1,
                        basis="tested mix", honesty=dict(honesty))


def _record(plan):
    return json.loads(json.dumps(plan_record(plan)))  # as the index reads it back


def test_fleet_steps_from_fixed_growth_hand_computed():
    """Peaks 100, 110, 121, 133.1 req/s at C = 30: ⌈D/30⌉ = 4, 4, 5, 5 groups. 4 groups carry
    4 × 30 = 120 req/s, which 2026Q4's 121 passes; with demand planned per quarter that is the
    quarter's first day, 1 Oct 2026. 4 groups of 4 GPUs fill 2 nodes of 8, 5 groups need 3."""
    plan = make_plan(load_plan_spec(BASE), capacity=30.0)
    assert [q.groups for q in plan.quarters] == [4, 4, 5, 5]
    assert carried_rps(plan, 4) == pytest.approx(120.0, rel=1e-8)
    steps = fleet_steps(plan)
    assert [(s.kind, s.quarter, s.by) for s in steps] == [
        ("start", "2026Q2", dt.date(2026, 4, 1)), ("add", "2026Q4", dt.date(2026, 10, 1))]
    add = steps[1]
    assert (add.nodes_from, add.nodes_to, add.billed_to - add.billed_from) == (2, 3, 8)
    text = add.sentence()
    assert text.startswith("Add 1 node (8 billed GPUs) before 1 Oct 2026: 5 replica groups = 20 GPUs on 3 nodes")
    assert "121 req/s passes the 120 req/s that 4 groups carry" in text
    assert steps[0].sentence().startswith("Have 4 replica groups = 16 GPUs on 2 nodes (16 billed GPUs) serving "
                                          "by 1 Apr 2026")


def test_fleet_step_on_a_node_already_paid_and_a_release():
    """5 → 6 groups of 4 GPUs stay on 3 nodes of 8 (a group joins the half-empty node); a
    falling demand releases groups from the quarter's first day."""
    spec = load_plan_spec({**BASE, "demand": {**BASE["demand"], "peak_rps": 150.0, "growth_per_quarter": 0.15}})
    plan = make_plan(spec, capacity=30.0)  # 150, 172.5, 198.4, 228.1 → 5, 6, 7, 8 groups
    assert [q.groups for q in plan.quarters] == [5, 6, 7, 8]
    steps = fleet_steps(plan)
    assert steps[1].sentence().startswith("Start 1 more replica group (4 GPUs) on the 3 nodes already paid for, "
                                          "before 1 Jul 2026")
    down = make_plan(load_plan_spec({**BASE, "demand": {**BASE["demand"], "growth_per_quarter": -0.2}}),
                     capacity=30.0)  # 100, 80, 64, 51.2 → 4, 3, 3, 2
    rel = [s for s in fleet_steps(down) if s.kind == "release"]
    assert [(s.quarter, s.by) for s in rel] == [("2026Q3", dt.date(2026, 7, 1)), ("2027Q1", dt.date(2027, 1, 1))]
    assert rel[0].sentence().startswith("From 1 Jul 2026 1 replica group (its nodes stay) can be released")


def _ramp_forecast(tmp_path):
    """Two quarters of daily steps: 2027Q1 flat at 100 req/s; in 2027Q2 (91 days) the upper
    peak so far rises linearly from 100 to 130 (day k: 100 + 30·k/90)."""
    q1 = pd.date_range("2027-01-01", "2027-03-31", freq="D")
    q2 = pd.date_range("2027-04-01", "2027-06-30", freq="D")
    so_far = np.concatenate([np.full(len(q1), 100.0), 100.0 + 30.0 * np.arange(len(q2)) / (len(q2) - 1)])
    idx = q1.append(q2)
    bands = pd.DataFrame({"point": so_far, "lower": so_far, "upper": so_far, "peak_so_far_upper": so_far}, index=idx)
    hist = pd.Series([90.0] * 10, index=pd.date_range("2026-12-01", periods=10, freq="D"))
    return Forecast(labels=("2027Q1", "2027Q2"), mean=(95.0, 120.0), lower=(90.0, 110.0), upper=(100.0, 130.0),
                    point=(100.0, 130.0), interval=0.95, model="hand-made", freq="D", seasonal_periods=None,
                    trend_per_step=0.0, season=(), level=90.0, mean_to_peak=0.6, reps=1, seed=0, history=hist,
                    bands=bands)


def test_fleet_step_dated_inside_the_quarter_by_the_forecast(tmp_path):
    """C = 30, no reserves: 2027Q1 plans 100 req/s on 4 groups (carrying 120), 2027Q2 plans 130
    on 5. The peak so far passes 120 on the first day k with 100 + 30·k/90 > 120, k > 60:
    k = 61 days after 1 Apr 2027 is 1 Jun 2027."""
    (tmp_path / "d.csv").write_text("t,rps\n", encoding="utf-8")
    spec = load_plan_spec({k: v for k, v in BASE.items() if k != "start"} | {
        "demand": {"history": str(tmp_path / "d.csv"), "horizon_quarters": 2, "uncertainty": 0.0}})
    plan = make_plan(spec, capacity=30.0, forecast=_ramp_forecast(tmp_path))
    assert [q.groups for q in plan.quarters] == [4, 5]
    add = fleet_steps(plan)[1]
    assert add.by == dt.date(2027, 6, 1)
    assert "in the day from 1 Jun 2027" in add.sentence() and "before 1 Jun 2027" in add.sentence()


def test_forecast_peak_so_far_ends_at_the_quarters_planned_peak():
    """The band the fleet steps read agrees with the quarter's planned peak at its last step
    (the same quantile of the same simulated paths) and never falls inside a quarter."""
    from capplan.plan.forecast import forecast_peaks

    t = pd.date_range("2025-01-01", periods=400, freq="D", tz="UTC")
    hist = pd.Series(50 + 0.05 * np.arange(400) + 3 * np.sin(np.arange(400) * 2 * np.pi / 7), index=t)
    fc = forecast_peaks(hist, horizon_quarters=2, reps=200, seed=1)
    b = fc.bands
    idx = b.index.tz_localize(None)
    for label, upper in zip(fc.labels, fc.upper):
        p = pd.Period(label, "Q")
        v = b["peak_so_far_upper"].to_numpy()[(idx >= p.start_time) & (idx <= p.end_time)]
        assert v[-1] == pytest.approx(upper) and (np.diff(v) >= -1e-9).all()


def test_sensitivity_band_of_every_quarter_hand_computed():
    """No reserves, so a quarter with demand D on N groups keeps them for C in [D/N, D/(N−1)):
    2026Q2 [25, 33.33), 2026Q3 [27.5, 36.67), 2026Q4 [24.2, 30.25), 2027Q1 [26.62, 33.28).
    The interval 29–31 reaches past 2026Q4's top (30.25): knife-edge there only; on the
    estimate 30.5, 2026Q4 needs ⌈121/30.5⌉ = 4 groups instead of 5."""
    plan = make_plan(load_plan_spec(BASE), capacity=_cap())
    s = sensitivity(plan)
    got = [(q.quarter, q.groups, q.low_system, q.high_system) for q in s.quarters]
    want = [("2026Q2", 4, 25.0, 100 / 3), ("2026Q3", 4, 27.5, 110 / 3), ("2026Q4", 5, 24.2, 30.25),
            ("2027Q1", 5, 26.62, 33.275)]
    for (ql, g, lo, hi), (wl, wg, wlo, whi) in zip(got, want):
        assert (ql, g) == (wl, wg) and lo == pytest.approx(wlo, rel=1e-8) and hi == pytest.approx(whi, rel=1e-8)
    assert [q.knife_edge for q in s.quarters] == [False, False, True, False]
    assert [q.other_groups for q in s.quarters] == [4, 4, 4, 5]
    assert [q.groups_below for q in s.quarters] == [5, 5, 6, 6]
    # the first quarter's band is the headline band
    assert (s.low_system, s.high_system) == (s.quarters[0].low_system, s.quarters[0].high_system)
    assert "2026Q4 (5 groups) holds for C_SLO 24.2–30.25 — knife-edge" in s.to_text()
    frame = s.quarters_frame()
    assert frame["knife_edge"].tolist() == [False, False, True, False]
    # the index shows every quarter's band in the quarter table
    html = index_html(IndexInputs("s", "h", (), (), ()), _record(plan), None, None)
    rows = dict(re.findall(r'<tr data-quarter="([^"]+)">.*?data-col="band"[^>]*>(.*?)</td>', html, re.S))
    assert rows["2026Q2"] == "25–33.33" and rows["2026Q4"].startswith("24.2–30.25") and "knife-edge" in rows["2026Q4"]
    assert len(rows) == 4


def test_runs_before_signing_when_narrowing_could_save_or_short():
    plan = make_plan(load_plan_spec(BASE), capacity=_cap())
    rec = _record(plan)
    params = {"study": "/s/demo study", "SLO": "ttft_ms=2000,attainment=0.99"}
    steps = runs_before_signing(rec, None, params)
    assert len(steps) == 1 and steps[0].by == dt.date(2026, 10, 1)  # the quarter it affects
    assert "2026Q4: 4 instead of 5" in steps[0].text and "optional" in steps[0].text
    assert steps[0].command == "capplan design '/s/demo study' --slo ttft_ms=2000,attainment=0.99"
    # the interval's low end 27 is below 2026Q3's band (27.5): a capacity there needs 5 groups
    short = runs_before_signing(_record(make_plan(load_plan_spec(BASE), capacity=_cap(est=30.0, ci=(27.0, 30.2)))),
                                None, params)
    assert [s.by for s in short] == [dt.date(2026, 7, 1)]
    assert "2026Q3 keeps 4 groups only for C_SLO ≥ 27.5 req/s" in short[0].text and "would need 5 groups" in short[0].text
    # neither: no run is needed, and the words say why
    calm = runs_before_signing(_record(make_plan(load_plan_spec(BASE), capacity=_cap(lb=28.0, est=28.5,
                                                                                       ci=(27.8, 29.0)))), None, params)
    assert len(calm) == 1 and calm[0].text.startswith("None needed: the lower bound is honest")
    assert calm[0].by == dt.date(2026, 4, 1)
    # planned on the estimate 30.5: on the lower bound 30, 2026Q4 needs ⌈121/30⌉ = 5 groups, not 4
    est = CapacityInfo(rps_per_group=30.5, source="study C_SLO estimate", estimate=30.5, ci_low=29.0, ci_high=31.0,
                       lower_bound=30.0, confidence=0.95, study_replicas=1, honesty=dict(HONEST))
    on_est = runs_before_signing(_record(make_plan(load_plan_spec(BASE), capacity=est)), None, params)
    assert on_est[0].text.startswith("The plan stands on the estimate, which makes no lower-bound claim: on the "
                                     "lower bound (30 req/s) it would need more replica groups in 2026Q4 "
                                     "(5 instead of 4)")
    # an unsupported bound: the runs its verdict names, before the plan's first day
    bad = dict(HONEST, status="unsupported", sentence="one run per rate",
               runs_to_add=[{"rate_rps": 30.0, "repeats": 3, "duration_s": 600.0, "why": "repeat"}])
    must = runs_before_signing(_record(make_plan(load_plan_spec(BASE), capacity=_cap(honesty=bad))), None, params)
    assert must[0].by == dt.date(2026, 4, 1) and "3 × 30 req/s for 600 s" in must[0].text


SIMULATED = [{"check": "failure", "what": "losing zone a (3 of 8 groups) at the 2027Q1 peak (8 req/s)",
              "slo_minutes_caused": "0.3333333", "good_requests_lost": "144", "breach_s": "20.0",
              "sentence": "losing zone a …: SLO broken for 20 s"},
             {"check": "rollout", "what": "a rolling update", "slo_minutes_caused": "0.0",
              "good_requests_lost": "0", "breach_s": "0", "sentence": "a rolling update: the SLO held"}]


def test_read_dynamics_reads_what_the_timelines_page_writes(tmp_path):
    from capplan.report_index import read_dynamics

    assert read_dynamics(tmp_path) == []  # no twin, no simulation
    (tmp_path / "timeline").mkdir()
    pd.DataFrame(SIMULATED).to_csv(tmp_path / "timeline" / "plan-simulated.csv", index=False)
    rows = read_dynamics(tmp_path)
    assert [r["check"] for r in rows] == ["failure", "rollout"] and rows[0]["good_requests_lost"] == "144"


def test_failure_check_says_the_simulation_broke_the_slo():
    """A failure check that holds on paper but whose simulation on the twin broke the SLO for
    20 s (144 good requests lost) never reads plain "holds": it says what happened, linked to
    the timelines page; a simulated check that held says so too."""
    spec = load_plan_spec({**BASE, "failure": {"policy": "zone", "zones": ["a", "b", "c"]}})
    rec = _record(make_plan(spec, capacity=_cap()))
    assert {c["key"]: c["ok"] for c in rec["checks"]}["failure"] is True
    pages = ("08-timelines.html",)
    html = checks_section(rec, SIMULATED, pages)
    row = re.search(r'<tr class="simfail" data-check="failure">(.*?)</tr>', html, re.S).group(1)
    assert "<td>holds on paper; broke the SLO when simulated</td>" in row
    assert "broke the SLO for 20 s (0.333 SLO-minutes caused), 144 good requests lost" in row
    assert 'href="08-timelines.html#The-plan,-simulated"' in row
    assert re.search(r'data-check="rollout"><td>holds</td>.*?the SLO held', html, re.S)
    # the checks table lists the broken one first among those that hold
    assert html.index('data-check="failure"') < html.index('data-check="traffic"')
    # without a simulation the check just holds
    assert '<tr class="ok" data-check="failure"><td>holds</td>' in checks_section(rec, [], ())
    # and the next steps ask for the failure-domain test with the command
    params = {"study": "/s", "SLO": "ttft_ms=2000", "plan spec": "/p.yaml", "twin": "/t.yaml"}
    tests = what_to_test(rec, None, params, SIMULATED, None, pages)
    assert len(tests) == 1 and tests[0].text.startswith("Test the failure-domain case")
    assert "144 good requests lost" in tests[0].text and tests[0].by == dt.date(2026, 4, 1)
    assert tests[0].command == "capplan plan /s --spec /p.yaml --out plan-simulated --twin /t.yaml --slo-minutes-budget B"
    # the whole index: the warning by the answer, and no plain "holds" for the failure check
    html = index_html(IndexInputs("s", "h", (("08-timelines.html", "Timelines"),), (), tuple(params.items())),
                      rec, None, None, dynamics=SIMULATED)
    assert "Holds on paper, not when simulated" in html
    assert '<tr class="ok" data-check="failure">' not in html


def test_what_to_test_follows_the_studys_results():
    rec = _record(make_plan(load_plan_spec(BASE), capacity=_cap()))
    assert what_to_test(rec, None, {}) == []  # nothing in the results calls for a test
    mix = [{"basis": "target mix (reweighted, peak_hour)", "rps_per_group": 27.0, "status": "honest", "groups": 5,
            "gpus": 20, "delta_cost_usd_per_month": 1234.0, "production_lower": True, "used_basis": "tested mix"}]
    t = what_to_test(rec, None, {}, None, mix, ("07-mix.html",))
    assert len(t) == 1 and t[0].text.startswith("Test the production mix: on the target mix (reweighted, peak_hour), "
                                                "27 req/s per group (honest), the first quarter would need 5 replica "
                                                "groups = 20 GPUs instead of 4")
    assert "+$1,234 per month" in t[0].text and t[0].link == "07-mix.html"
    settling = dict(HONEST, estimand="the largest offered rate …; runs near the crossing were still settling at "
                                     "their end, so the steady-state capacity … is likely lower")
    rec2 = _record(make_plan(load_plan_spec(BASE), capacity=_cap(honesty=settling)))
    env = {"runs": [{"usable": True, "duration_s": 299.7}, {"usable": True, "duration_s": 300.2}]}
    t = what_to_test(rec2, env, {})
    assert len(t) == 1 and "runs of 600 s or more" in t[0].text
    # "no run … was still settling" is not a reason
    assert what_to_test(_record(make_plan(load_plan_spec(BASE), capacity=_cap(honesty=dict(
        HONEST, estimand="no run near the crossing was still settling at its end")))), env, {}) == []


def test_next_steps_block_is_dated_and_ordered():
    plan = make_plan(load_plan_spec(BASE), capacity=_cap())
    rec = _record(plan)
    steps = next_steps(rec, None, {"study": "/s", "SLO": "ttft_ms=2000"})
    assert [s.kind for s in steps] == ["capacity", "capacity", "runs"]
    assert all(s.by is not None for s in steps)
    html = index_html(IndexInputs("s", "h", (), (), (("study", "/s"), ("SLO", "ttft_ms=2000"))), rec, None, None)
    block = re.search(r'<div id="next-steps">(.*?)</div>', html, re.S).group(1)
    assert block.index('data-kind="capacity"') < block.index('data-kind="runs"')
    assert re.findall(r'<li data-by="([0-9-]+)">', block) == ["2026-04-01", "2026-10-01", "2026-10-01"]
    assert html.index('id="next-steps"') < html.index('id="how-sure"')  # it ends the answer


def test_design_says_why_it_proposes_no_run():
    from capplan.design import _why_none

    env = SimpleNamespace(honesty=SimpleNamespace(status="honest", honest=True),
                          run_effect=SimpleNamespace(tau=1.05))
    text = _why_none(env, 0.0899, [(5.0, 0.164), (5.4, 0.134), (5.3, 0.113)], 600.0)
    assert text.startswith("no run is proposed: the bound is honest, so no run is needed before planning on it")
    assert "0.164 req/s at 5 req/s, 0.134 req/s at 5.4 req/s, 0.113 req/s at 5.3 req/s, against 0.0899 req/s now" in text
    assert "τ = 1.05" in text


def test_demo_index_ends_its_answer_with_dated_next_steps(demo_report):  # noqa: F811
    """The demo report's index: the answer ends with the next steps, each dated; the capacity
    steps are the plan's fleet steps (one per change of groups, on the quarter's first day with
    the demo's fixed growth); every quarter of the table carries its band."""
    import html as H

    index = (demo_report / "index.html").read_text(encoding="utf-8")
    rec = json.loads((demo_report / "data" / "plan.json").read_text(encoding="utf-8"))
    answer = re.search(r'<section id="answer">(.*?)</section>', index, re.S).group(1)
    block = re.search(r'<div id="next-steps">(.*?)</div>', answer, re.S).group(1)
    dates = re.findall(r'<li data-by="([0-9]{4}-[0-9]{2}-[0-9]{2})">', block)
    assert dates and block.count("<li ") == len(dates)  # every step dated
    for li, d in re.findall(r'(<li data-by="([0-9-]+)">.*?</li>)', block, re.S):
        day = dt.date.fromisoformat(d)
        said = f"{day.day} {day:%b %Y}"
        # each step says its date once: in the badge, or in its own words ("before 1 Apr 2027")
        assert (li.count(said) == 1) and (f'<span class="due">by {said}</span>' in li or said in li)
    for kind in ("capacity", "runs"):
        assert f'data-kind="{kind}"' in block
    qs = rec["quarters"]
    want = [("start", qs[0]["quarter"], qs[0]["start"])] + [
        ("add" if b["groups"] > a["groups"] else "release", b["quarter"], b["start"])
        for a, b in zip(qs, qs[1:]) if b["groups"] != a["groups"]]
    assert [(s["kind"], s["quarter"], s["by"]) for s in rec["fleet_steps"]] == want
    words = re.sub(r"<[^>]+>", "", block)  # glossary links out
    for s in rec["fleet_steps"]:
        assert H.escape(s["sentence"]) in words
    bands = re.findall(r'<td class="num" data-col="band"', answer)
    assert len(bands) == len(qs) == len(rec["sensitivity"]["quarters"])
