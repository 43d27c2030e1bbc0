"""Reweighting to a target mix: hand-computed C_SLO, refusals, the command
(docs/mix.md, "Reweighting")."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from capplan.cli import main
from capplan.errors import SpecError
from capplan.mix import Buckets, target_from_table
from capplan.mix.reweight import fit_mix

from conftest import ev

SHORT = (150, 148, 140)  # good of 150 short prompts (input 500) per run at 1, 2, 3 req/s
LONG = (48, 40, 25)      # good of 50 long prompts (input 5000)
SLO = "ttft_ms=500,attainment=0.9"


def _logit(p):
    return math.log(p / (1 - p))


def _crossing(x0, x1, a0, a1, t):
    return x0 + (_logit(a0) - _logit(t)) / (_logit(a0) - _logit(a1)) * (x1 - x0)


def _study(make_study):
    rows, runs = [], []
    for j, rate in enumerate((1.0, 2.0, 3.0)):
        rid = f"r{j + 1}"
        runs.append({"run_id": rid, "offered_rps": rate, "warmup_s": 0.0})
        long_idx = [i for i in range(200) if i % 4 == 3]
        bad_l = set(long_idx[k * 50 // max(1, 50 - LONG[j])] for k in range(50 - LONG[j]))
        short_idx = [i for i in range(200) if i % 4 != 3]
        bad_s = set(short_idx[k * 150 // max(1, 150 - SHORT[j])] for k in range(150 - SHORT[j]))
        for i in range(200):
            long = i % 4 == 3
            bad = i in (bad_l if long else bad_s)
            rows.append(ev(rid, scheduled_ms=i * 1000.0 / rate, ttft_ms=900.0 if bad else 100.0,
                           input_tokens=5000 if long else 500))
    return make_study(rows, runs=runs)


def _target(long_share, edges=(1024,)):
    lo = [0.0] + list(edges)
    hi = list(edges) + [None]
    shares = [1 - long_share] + [0.0] * (len(edges) - 1) + [long_share]
    return target_from_table(pd.DataFrame({"input_min": lo, "input_max": hi, "share": shares}))


def test_reweighted_cslo_by_hand(make_study):
    path = _study(make_study)
    # the within-run machinery: each run's own attainment, as counted (the arithmetic by hand)
    m = fit_mix(path, SLO, _target(0.5), reps=200, seed=0, min_cell_requests=10, method="within-run")
    # tested mix (75 % short): 198/200, 188/200, 165/200 → crosses 0.9 between 2 and 3 req/s
    assert m.base.cslo.estimate == pytest.approx(_crossing(2, 3, 0.94, 0.825, 0.9), rel=1e-6)
    # target 50/50: ½·k_s/150 + ½·k_l/50 per run
    att = [0.5 * s / 150 + 0.5 * k / 50 for s, k in zip(SHORT, LONG)]
    assert list(m.runs["attainment"]) == pytest.approx(att)
    assert m.cslo.estimate == pytest.approx(_crossing(1, 2, att[0], att[1], 0.9), rel=1e-6)
    assert m.cslo.estimate < m.base.cslo.estimate
    # Kish ESS per run: 1 / (0.25/150 + 0.25/50) = 150 of 200 requests
    assert list(m.runs["ess"]) == pytest.approx([150.0] * 3)
    assert m.ess_share == pytest.approx(0.75)
    cells = m.cells.set_index("label")
    assert cells.loc["input ≥1024", "tested_share"] == pytest.approx(0.25)
    assert cells.loc["input ≥1024", "target_share"] == pytest.approx(0.5)
    assert m.cslo.lower_bound <= m.cslo.estimate
    # the target equal to the tested mix gives the tested C_SLO back
    same = fit_mix(path, SLO, _target(0.25), reps=200, seed=0, min_cell_requests=10, method="within-run")
    assert same.cslo.estimate == pytest.approx(m.base.cslo.estimate, rel=1e-9)
    assert m.envelope.honesty.status == "optimistic"  # within-run: never an honest bound


def test_day_and_peak_hour_fitted_on_one_reduction(make_study, tmp_path):
    """fit_periods (what capplan mix and the report's mix page call): the day's mix of a
    timestamped trace and its peak hour's, each reweighted, on one reduction of the study."""
    from capplan.mix.reweight import fit_periods

    path = _study(make_study)
    t0 = pd.Timestamp("2026-03-02T09:00:00Z")
    # hour 9: 6 short + 0 long; hour 10 (the peak): 4 short + 4 long → day 10:4 … peak 50/50
    rows = [(s, 500) for s in range(0, 3600, 600)] + [(3600 + 60 * k, 500 if k % 2 else 5000) for k in range(8)]
    trace = tmp_path / "trace.parquet"
    pd.DataFrame({"timestamp": [t0 + pd.Timedelta(seconds=s) for s, _ in rows],
                  "input_tokens": [i for _, i in rows]}).to_parquet(trace)
    fits, notes = fit_periods(path, SLO, trace, Buckets(input_edges=(1024,)), reps=200, seed=0,
                              min_cell_requests=10, method="within-run")
    assert list(fits) == ["day", "peak_hour"] and notes == ()
    assert fits["peak_hour"].base.stats is fits["day"].base.stats  # one reduction
    att = [0.5 * s / 150 + 0.5 * k / 50 for s, k in zip(SHORT, LONG)]  # the peak hour: 50/50
    assert list(fits["peak_hour"].runs["attainment"]) == pytest.approx(att)
    assert fits["peak_hour"].cslo.estimate == pytest.approx(_crossing(1, 2, att[0], att[1], 0.9), rel=1e-6)
    day = [(10 * s / 150 + 4 * k / 50) / 14 for s, k in zip(SHORT, LONG)]  # 10 short : 4 long
    assert list(fits["day"].runs["attainment"]) == pytest.approx(day)


def test_reweighted_fit_has_the_headline_run_effect_and_verdict(make_study):
    """By default both fits carry the headline envelope's between-run variation: at the tested
    mix the reweighted fit is the headline envelope (same τ, same crossing), and its lower bound
    has an honesty verdict — here unsupported (one run per rate), so a plan must refuse it."""
    from capplan.envelope import fit_envelope

    path = _study(make_study)
    head = fit_envelope(path, SLO, reps=200, seed=0)
    same = fit_mix(path, SLO, _target(0.25), reps=200, seed=0, min_cell_requests=10)
    assert same.base.cslo.estimate == pytest.approx(head.cslo.estimate, rel=1e-9)
    assert same.cslo.estimate == pytest.approx(head.cslo.estimate, rel=1e-6)
    assert same.envelope.run_effect.tau == pytest.approx(head.run_effect.tau)
    m = fit_mix(path, SLO, _target(0.5), reps=200, seed=0, min_cell_requests=10)
    assert m.envelope.method == "run-effect" and m.envelope.run_effect is not None
    assert m.envelope.honesty.status == "unsupported"
    assert any("one run at each rate" in r for r in m.envelope.honesty.reasons)
    # the mean run is worse than the typical one: the estimate moves down, not up
    raw = fit_mix(path, SLO, _target(0.5), reps=200, seed=0, min_cell_requests=10, method="within-run")
    assert m.cslo.estimate <= raw.cslo.estimate + 1e-9
    assert any("unsupported" in n for n in m.notes)


def test_a_target_bucket_absent_from_the_study_is_refused_by_name(make_study):
    path = _study(make_study)
    tg = _target(0.1, edges=(1024, 16000))  # ≥ 16 000 tokens: never tested
    with pytest.raises(SpecError) as e:
        fit_mix(path, SLO, tg, reps=50, min_cell_requests=10)
    msg = str(e.value)
    assert "input ≥16000 (target share 10.0%): no tested request" in msg
    assert "--drop-untested" in e.value.fix
    # too few: 150 long requests in the study, 200 asked
    with pytest.raises(SpecError, match=r"input ≥1024 \(target share 50.0%\): 150 tested requests \(need 200\)"):
        fit_mix(path, SLO, _target(0.5), reps=50, min_cell_requests=200)
    # dropped on request, said aloud
    m = fit_mix(path, SLO, tg, reps=50, min_cell_requests=10, drop_untested=True)
    assert any("dropped 10.0% of the target mix" in n for n in m.notes)


def test_mix_command(make_study, tmp_path, capsys):
    path = _study(make_study)
    trace = tmp_path / "prod.parquet"
    t0 = pd.Timestamp("2026-03-02T09:00:00Z")
    pd.DataFrame({"timestamp": [t0 + pd.Timedelta(minutes=m) for m in range(0, 180, 3)],
                  "input_tokens": [5000 if m % 2 else 20000 if m % 10 == 4 else 400 for m in range(60)],
                  "output_tokens": 10}).to_parquet(trace)
    out = tmp_path / "mix.json"
    rc = main(["mix", str(path), "--slo", SLO, "--target", str(trace), "--input-edges", "1024",
               "--reps", "100", "--min-cell-requests", "10", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "C_SLO at the target mix" in text and "peak hour" in text and "effective sample size" in text
    assert out.is_file()
    rc = main(["mix", str(path), "--slo", SLO, "--target", str(trace), "--input-edges", "1024,16000",
               "--reps", "50", "--min-cell-requests", "10"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no or too few tested requests: input ≥16000" in err and "no tested request" in err


def test_mix_panel_state_and_widgets(make_study):
    from capplan.mix.panel import MixModel, MixPanel, mix_state

    path = _study(make_study)
    spec = {"demand": {"peak_rps": 6.0}, "replica_group": {"gpus_per_node": 8},
            "failure": {"policy": "none"}, "prices": {"usd_per_gpu_hour": 2.0},
            "capacity": {"reps": 100, "accept_optimistic": True}}  # one run per rate
    model = MixModel.build(path, spec, SLO, target=_target(0.5))
    p = model.defaults()
    assert p.plan_on == "target" and dict(p.shares) == {"input <1024": 0.5, "input ≥1024": 0.5}
    s = mix_state(model, p)
    t = s.table.set_index("key")["value"]
    assert t["target_cslo"] == pytest.approx(model.mixfit.cslo.estimate)
    assert s.plan.capacity.rps_per_group == pytest.approx(model.mixfit.cslo.lower_bound)
    # moving the long share back to the tested 25 % gives the tested C_SLO
    s2 = mix_state(model, p.with_(shares=(("input <1024", 0.75), ("input ≥1024", 0.25))))
    assert s2.mix.cslo.estimate == pytest.approx(model.mixfit.base.cslo.estimate, rel=1e-9)
    panel = MixPanel(model)
    panel.plan_on.value = "tested"
    # "tested" plans on the headline envelope, as the plan page does
    assert panel.state.plan.capacity.rps_per_group == pytest.approx(model.envelope.cslo.lower_bound)
    assert model.envelope.method == "run-effect"
    assert "data-key=\"target_cslo\"" in panel.table.value
