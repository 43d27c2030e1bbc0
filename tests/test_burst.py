"""Production burstiness (capplan.burst; docs/plan.md, "Production burstiness"): the estimators
against a gamma renewal process whose gap CV and long-window dispersion are known by hand, the
burst factor by hand, and the refusal wording."""

import numpy as np
import pytest

from capplan import burst as B
from capplan.sim.arrivals import arrival_times_ns


def _gamma_times(cv: float, rate: float = 20.0, duration_s: float = 20_000.0, seed: int = 7) -> np.ndarray:
    return arrival_times_ns("gamma", rate, duration_s, np.random.default_rng(seed), cv=cv) / 1e9


@pytest.mark.parametrize("k", [0.25, 1.0, 4.0])
def test_gamma_gap_cv_and_dispersion(k):
    # gamma gaps of shape k: CV = 1/sqrt(k); a renewal process has D(w) → CV² = 1/k for windows
    # much longer than a gap (here 50 s ≈ 1000 gaps). 400 windows: D's relative standard error
    # ≈ sqrt(2/399)·(1 + …) ≈ 7 %, so 20 % is > 2.5 standard errors; the gap CV over 400 000
    # gaps is within 5 %.
    t = _gamma_times(cv=1 / np.sqrt(k))
    m = B.measure_times(t, 50.0, "test")
    assert m.gap_cv == pytest.approx(1 / np.sqrt(k), rel=0.05)
    assert m.dispersion == pytest.approx(1 / k, rel=0.20)


def test_per_second_series_matches_times():
    t = _gamma_times(cv=2.0, duration_s=5_000.0)
    per_s = B.counts_in_windows(t, 1.0)
    a = B.measure_per_second(per_s, 10, "series")
    b = B.measure_times(t, 10.0, "trace")
    assert a.dispersion == pytest.approx(b.dispersion, rel=1e-9)
    assert a.gap_cv is None


def test_counts_and_dispersion_by_hand():
    # arrivals at 0, 0.5, 1.2, 2.1, 2.2, 2.3, 3.9 → windows of 1 s: [2, 1, 3] (the last, partial, dropped)
    c = B.counts_in_windows(np.array([0, 0.5, 1.2, 2.1, 2.2, 2.3, 3.9]), 1.0)
    assert c.tolist() == [2, 1, 3]
    # 10 windows 1,3,1,3,…: mean 2, sample variance 10/9 → D = 5/9
    assert B.dispersion(np.array([1, 3] * 5)) == pytest.approx((10 / 9) / 2)
    assert np.isnan(B.dispersion(np.array([1, 3, 2])))  # under 10 windows: no estimate


def test_burst_factor_by_hand():
    # D_prod 4, D_sweep 1 (Poisson), μ = 100 per window, p = 0.99 (z = 2.3263479):
    # (1 + z·sqrt(4/100)) / (1 + z·sqrt(1/100)) = 1.46526957 / 1.23263479 = 1.18872969
    assert B.burst_factor(4.0, 1.0, 100.0, 0.99) == pytest.approx(1.18872969, rel=1e-7)
    assert B.burst_factor(0.5, 1.0, 100.0, 0.99) == 1.0  # smoother than tested: never below 1


def test_burst_factor_from_a_known_gamma_process():
    # measured on a gamma process with CV 2 (D → 4) at a peak of 20 req/s in 50-s windows (μ = 1000):
    # f → (1 + z·sqrt(4/1000)) / (1 + z·sqrt(1/1000)) = 1.14713 / 1.07357 = 1.06852
    m = B.measure_times(_gamma_times(cv=2.0), 50.0, "gamma CV 2")
    cmp = B.compare_burstiness(m, [1.0], "a Poisson sweep", peak_rps=20.0, quantile=0.99)
    assert cmp.factor == pytest.approx(1.06852, rel=0.02)
    assert not cmp.covered


def test_refusal_wording_and_cover():
    prod = B.BurstMeasure(4.0, 1.0, 2.0, "trace x")
    c = B.compare_burstiness(prod, [0.98, 1.03], "2 open-loop runs", peak_rps=100.0)
    assert c.sentence.startswith("not honest: production is burstier (D=4 at 1 s) than anything tested "
                                 "(max D=1.03, 2 open-loop runs)")
    ok = B.compare_burstiness(B.BurstMeasure(1.1, 1.0, None, "series"), [1.03], "2 runs", peak_rps=100.0)
    assert ok.covered  # within 10 % of the most dispersed run: sampling error, not burstier
    none = B.compare_burstiness(prod, [float("nan")], "no runs", peak_rps=100.0)
    assert none.sweep_max_dispersion == 1.0 and "Poisson assumed" in none.sweep_source


# ----------------------------------------------------------------------------- in the plan

from capplan.errors import SpecError  # noqa: E402
from capplan.plan import load_plan_spec, make_plan  # noqa: E402


def _spec(arrivals, peak=100.0, base_dir=None):
    d = {"demand": {"peak_rps": peak, "uncertainty": 0.0, "arrivals": arrivals},
         "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8},
         "failure": {"policy": "none", "zones": 1},
         "rollout": {"max_surge": 1, "max_unavailable": 0, "canary_groups": 0},
         "prices": {"usd_per_gpu_hour": 2.0}}
    return load_plan_spec(d, base_dir=base_dir)


def test_plan_sizes_with_the_burst_factor_and_refuses_to_call_it_honest():
    # D_prod 4 at 1 s, no study (Poisson assumed, D_sweep 1), λ_peak 100, u 0 → μ = 100,
    # f = 1.18872969 (test_burst_factor_by_hand); D = 118.873; ⌈118.873 / 25⌉ = 5 groups (4 without)
    plan = make_plan(_spec({"dispersion": 4.0}), capacity=25.0)
    assert plan.value("burst_factor") == pytest.approx(1.18872969, rel=1e-7)
    assert plan.value("demand_rps") == pytest.approx(118.872969, rel=1e-7)
    assert plan.value("traffic_groups") == 5
    assert make_plan(_spec({"dispersion": 1.0}), capacity=25.0).value("traffic_groups") == 4
    assert plan.burstier_than_tested and not plan.ok
    chk = next(c for c in plan.checks if c.key == "burstiness")
    assert chk.sentence.startswith("not honest: production is burstier (D=4 at 1 s) than anything tested (max D=1,")
    assert plan.summary.splitlines()[0].startswith("Production is burstier than the sweep — not honest")
    assert plan.item("burst_factor").inputs["sweep from"] == "Poisson assumed: no study given"
    assert plan.quarters[0].demand_rps == pytest.approx(118.872969, rel=1e-7)


def test_plan_within_the_sweep_is_not_refused():
    plan = make_plan(_spec({"dispersion": 1.05}), capacity=25.0)
    assert not plan.burstier_than_tested
    assert next(c for c in plan.checks if c.key == "burstiness").ok
    assert "Production is burstier" not in plan.summary


def test_plan_measures_a_per_second_series_relative_to_the_spec(tmp_path):
    t = _gamma_times(cv=2.0, rate=20.0, duration_s=4_000.0)
    per_s = B.counts_in_windows(t, 1.0)
    (tmp_path / "rate.csv").write_text("count\n" + "\n".join(map(str, per_s.tolist())) + "\n")
    plan = make_plan(_spec({"per_second": "rate.csv", "window_s": 10}, peak=20.0, base_dir=tmp_path),
                     capacity=5.0)
    want = B.measure_per_second(per_s, 10, "x").dispersion
    assert plan.burst.production.dispersion == pytest.approx(want)
    assert want > 2.5  # a CV-2 gamma process at 10-s windows (200 gaps): well above Poisson
    assert plan.burstier_than_tested


@pytest.mark.parametrize("arr, field", [({"dispersion": 4.0, "cv": 2.0}, "demand.arrivals"),
                                        ({}, "demand.arrivals"),
                                        ({"cv": -1}, "demand.arrivals.cv"),
                                        ({"cv": 2, "quantile": 1.2}, "demand.arrivals.quantile"),
                                        ({"cv": 2, "burst": 1}, "demand.arrivals")])
def test_bad_arrivals_name_the_field(arr, field):
    with pytest.raises(SpecError) as e:
        _spec(arr)
    assert (e.value.field or "").startswith(field)


def test_missing_column_names_file_and_field(tmp_path):
    (tmp_path / "r.csv").write_text("n\n1\n2\n")
    with pytest.raises(SpecError) as e:
        make_plan(_spec({"per_second": str(tmp_path / "r.csv")}), capacity=5.0)
    assert e.value.field == "demand.arrivals.column" and "r.csv" in str(e.value.file)


def _sweep_study(make_study, cvs):
    """An open-loop study with one 120-s run at 10 req/s per gap CV (1 = Poisson)."""
    from conftest import ev

    rows, runs = [], []
    for i, cv in enumerate(cvs):
        proc = "poisson" if cv == 1.0 else "gamma"
        t_ns = arrival_times_ns(proc, 10.0, 120.0, np.random.default_rng(100 + i), cv=cv)
        rid = f"r{i}"
        rows += [ev(rid, scheduled_ms=t / 1e6) for t in t_ns]
        runs.append({"run_id": rid, "offered_rps": 10.0, "duration_s": 120.0})
    return make_study(rows, runs)


def test_sweep_dispersion_read_from_the_study(make_study):
    study = _sweep_study(make_study, [1.0, 1.0])
    ds, src = B.sweep_dispersions(study, 1.0)
    # two Poisson runs, 120 one-second windows each: D within ±0.4 of 1 (SE ≈ sqrt(2/119) = 0.13)
    assert len(ds) == 2 and all(abs(d - 1.0) < 0.4 for d in ds)
    assert src == "2 open-loop tested runs at 1 s"
    plan = make_plan(_spec({"cv": 2.0}), capacity=25.0, burst_inputs=(B.production_from_spec({'cv': 2.0}), ds, src))
    assert plan.burstier_than_tested and "2 open-loop tested runs at 1 s" in plan.burst.sentence
    # a sweep that tested a CV-3 process (D(1 s) ≈ 5 at 10 req/s) covers a CV-2 production (D = 4)
    ds3, src3 = B.sweep_dispersions(_sweep_study(make_study, [1.0, 3.0]), 1.0)
    assert max(ds3) > 4.4
    assert not make_plan(_spec({"cv": 2.0}), capacity=25.0, burst_inputs=(B.production_from_spec({'cv': 2.0}), ds3, src3)).burstier_than_tested


def test_report_index_says_it_in_the_headline():
    from capplan.report_index import answer_section
    from capplan.plan.sensitivity import plan_record

    rec = plan_record(make_plan(_spec({"dispersion": 4.0}), capacity=25.0))
    html = answer_section(rec, None)
    head = html.split("\n")[1]
    assert head.startswith('<p class="warn" id="burstiness"><b>Production is burstier than the sweep</b>: '
                           "not honest: production is burstier (D=4 at 1 s)")
    assert "and a burst factor of 1.189" in html
    calm = answer_section(plan_record(make_plan(_spec({"dispersion": 1.0}), capacity=25.0)), None)
    assert 'id="burstiness"' not in calm and "burst factor of 1" in calm


def test_replans_keep_the_burst_factor(make_study):
    # re-plans at other capacities (sensitivity, no study passed) keep the study's sweep D (a
    # CV-3 run: D ≈ 9.8) rather than falling back to Poisson assumed (D = 1)
    from capplan.plan.sensitivity import sensitivity

    ds, src = B.sweep_dispersions(_sweep_study(make_study, [1.0, 3.0]), 1.0)
    arr = {"dispersion": 12.0}
    plan = make_plan(_spec(arr), capacity=25.0, burst_inputs=(B.production_from_spec(arr), ds, src))
    assert plan.burst_inputs[1] == [max(ds)] and plan.burst_inputs[2] == src
    assert plan.value("burst_factor") == pytest.approx(B.burst_factor(12.0, max(ds), 100.0, 0.99))
    again = make_plan(plan.spec, 30.0, burst_inputs=plan.burst_inputs)
    assert again.value("burst_factor") == plan.value("burst_factor")
    assert make_plan(plan.spec, 30.0).value("burst_factor") > plan.value("burst_factor") + 0.1  # Poisson assumed
    assert sensitivity(plan).plan_step.groups == plan.value("total_groups")


def test_cli_plan_with_a_production_trace(make_study, tmp_path, capsys):
    import json

    import yaml

    from capplan.cli import main

    study = _sweep_study(make_study, [1.0])
    t = _gamma_times(cv=2.0, rate=20.0, duration_s=300.0)
    (tmp_path / "prod.jsonl").write_text("".join(json.dumps({"timestamp": int(round(x * 1000)), "input_length": 100,
                                                             "output_length": 10}) + "\n" for x in t))
    spec = {"slo": "ttft_ms=2000,attainment=0.9", "failure": {"policy": "none"}, "prices": {"usd_per_gpu_hour": 2.0},
            "demand": {"peak_rps": 6.0, "arrivals": {"trace": "prod.jsonl", "window_s": 5}}}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(spec))
    args = ["plan", str(study), "--spec", str(tmp_path / "plan.yaml"), "--capacity-rps", "3", "--out",
            str(tmp_path / "out"), "--time", "2026-01-01T00:00:00+00:00"]
    rc = main(args)
    out = capsys.readouterr().out
    assert rc in (0, 1), out  # written; a failed check is the plan's verdict, not a usage error
    assert "Production is burstier than the sweep — not honest" in out and "1 open-loop tested run at 5 s" in out
    spec["demand"]["arrivals"]["trace"] = "missing.jsonl"
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(spec))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "demand.arrivals.trace" in err and "missing.jsonl" in err and "Traceback" not in err
