"""Forecast on a synthetic history with known trend and weekly season; plans per quarter."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from capplan.cli import main
from capplan.errors import SpecError
from capplan.plan.forecast import forecast_peaks, forecast_peaks_from_file, history_series, read_history
from capplan.plan import load_plan_spec, make_plan

SLOPE = 0.5  # req/s per day
SEASON = np.array([12.0, 6.0, 0.0, -4.0, -8.0, -6.0, 0.0])  # Monday..Sunday, sums to 0
SIGMA = 2.0
DAYS = pd.date_range("2025-01-01", periods=364, freq="D", tz="UTC")


def truth(index: pd.DatetimeIndex, noise_rng=None):
    d = ((index - DAYS[0]) / pd.Timedelta(days=1)).to_numpy()
    y = 100.0 + SLOPE * d + SEASON[index.day_of_week]
    if noise_rng is not None:
        y = y + noise_rng.normal(0.0, SIGMA, len(index))
    return y


@pytest.fixture(scope="module")
def history():
    return history_series(DAYS, truth(DAYS, np.random.default_rng(7)))


@pytest.fixture(scope="module")
def fc(history):
    return forecast_peaks(history, horizon_quarters=2, interval=0.95, reps=400, seed=3)


def test_recovers_trend_and_season(fc):
    assert fc.freq == "D" and fc.seasonal_periods == 7
    assert fc.trend_per_step == pytest.approx(SLOPE, abs=0.05)
    last7 = DAYS[-7:]
    got = np.array(fc.season) - np.mean(fc.season)
    want = SEASON[last7.day_of_week]
    assert np.max(np.abs(got - want)) < 2.0
    # level at the end ≈ the trend line there
    assert fc.level == pytest.approx(100.0 + SLOPE * 363, abs=4.0)


def test_interval_contains_the_truth(fc):
    assert fc.labels == ("2026Q1", "2026Q2")  # history ends 2025-12-30: next calendar quarters
    future = pd.date_range("2025-12-31", "2026-06-30", freq="D", tz="UTC")
    for seed in (11, 12, 13):
        y = truth(future, np.random.default_rng(seed))
        for q, lo, hi in zip(fc.labels, fc.lower, fc.upper):
            p = pd.Period(q, "Q")
            sel = (future.tz_localize(None) >= p.start_time) & (future.tz_localize(None) <= p.end_time)
            assert lo <= y[sel].max() <= hi, (q, lo, y[sel].max(), hi)
    # noise-free quarter peaks sit inside too, and the upper bound exceeds the point forecast
    for q, lo, hi, pt in zip(fc.labels, fc.lower, fc.upper, fc.point):
        assert hi > pt and lo < hi
    # 2026Q2's peak is a Monday near the end of June: 100 + 0.5 × 545 + 12 ≈ 384.5
    assert fc.point[1] == pytest.approx(100 + SLOPE * 545 + 12.0, abs=5.0)
    assert fc.to_frame()["peak_upper_rps"].tolist() == list(fc.upper)


def test_figure_has_history_band_and_plan(fc):
    fig = fc.figure()
    names = [t.name for t in fig.data]
    assert "history (peak per step)" in names and "95% interval" in names and "planned peak (upper bound)" in names


def test_plan_per_quarter_uses_the_upper_bound(fc):
    spec = load_plan_spec({"demand": {"history": "unused.csv", "uncertainty": 0.0, "horizon_quarters": 2},
                           "replica_group": {"gpus_per_replica": 1}, "failure": {"policy": "none"},
                           "prices": {"usd_per_gpu_hour": 1.0}})
    plan = make_plan(spec, capacity=10.0, forecast=fc)
    assert [q.label for q in plan.quarters] == ["2026Q1", "2026Q2"]
    assert [q.peak_rps for q in plan.quarters] == list(fc.upper)
    assert plan.quarters_frame()["forecast_lower_rps"].tolist() == list(fc.lower)
    assert [q.groups for q in plan.quarters] == [int(np.ceil(u / 10.0)) for u in fc.upper]
    assert plan.value("peak_rps") == fc.upper[0]
    assert "upper bound of the 95% forecast interval" in plan.item("peak_rps").formula
    assert plan.value("mean_offered_rps") == pytest.approx(fc.upper[0] * fc.mean_to_peak)


def test_history_file_plan_via_cli(tmp_path, history, capsys):
    # a CSV of hourly rates (the forecast takes the daily peak), epoch seconds
    hours = pd.date_range(DAYS[0], periods=24 * 120, freq="h")
    rng = np.random.default_rng(5)
    daily = truth(hours.floor("D"), None)
    rate = daily * (0.6 + 0.4 * np.sin(np.pi * (hours.hour.to_numpy() / 23.0))) + rng.normal(0, 1, len(hours))
    pd.DataFrame({"ts": hours.as_unit("s").asi8, "rate": rate}).to_csv(tmp_path / "demand.csv", index=False)
    spec = {"demand": {"history": "demand.csv", "history_time_column": "ts", "history_rate_column": "rate",
                       "horizon_quarters": 1, "uncertainty": 0.1},
            "replica_group": {"gpus_per_replica": 1}, "failure": {"policy": "none"},
            "prices": {"usd_per_gpu_hour": 1.0}}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    rc = main(["plan", "--capacity-rps", "20", "--spec", str(tmp_path / "plan.yaml"), "--out", str(tmp_path / "o"),
               "--time", "2026-01-01T00:00:00+00:00"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    q = pd.read_csv(tmp_path / "o" / "cost_by_quarter.csv", encoding="utf-8-sig")
    assert q["Quarter"].tolist() == ["2025Q3"]  # 120 days from 2025-01-01 end in Q2
    s = read_history(tmp_path / "demand.csv", time_column="ts", rate_column="rate")
    assert s.index[0] == DAYS[0]
    fc = forecast_peaks_from_file(tmp_path / "demand.csv", time_column="ts", rate_column="rate",
                                  horizon_quarters=1)
    assert q["Peak demand (req/s)"].iloc[0] == pytest.approx(fc.upper[0], abs=5e-5)  # CSV: 0.0001 req/s
    assert 0.3 < fc.mean_to_peak < 0.9  # hourly shape: mean well below the peak


@pytest.mark.parametrize("frame, field, words", [
    (pd.DataFrame({"t": ["2025-01-01"] * 3, "rps": [1, 2, 3]}), "demand.history", "at least 10"),
    (pd.DataFrame({"when": pd.date_range("2025-01-01", periods=20).astype(str), "rps": 1.0}),
     "demand.history_time_column", "no column 't'"),
    (pd.DataFrame({"t": pd.date_range("2025-01-01", periods=20).astype(str), "rps": [1.0] * 19 + [-2.0]}),
     "demand.history_rate_column", "negative rate (row 20: -2)"),
    (pd.DataFrame({"t": pd.date_range("2025-01-01", periods=20).astype(str), "rps": ["x"] + [1.0] * 19}),
     "demand.history_rate_column", "non-numeric rate (row 1: 'x')"),
    (pd.DataFrame({"t": ["not a date"] * 20, "rps": 1.0}), "demand.history_time_column", "cannot be read"),
])
def test_bad_history(tmp_path, frame, field, words):
    p = tmp_path / "d.csv"
    frame.to_csv(p, index=False)
    with pytest.raises(SpecError) as exc:
        read_history(p)
    assert exc.value.field == field and words in str(exc.value) and exc.value.fix


def test_bad_history_through_cli(tmp_path, capsys):
    spec = {"demand": {"history": "missing.csv"}, "replica_group": {"gpus_per_replica": 1},
            "prices": {"usd_per_gpu_hour": 1.0}}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    rc = main(["plan", "--capacity-rps", "20", "--spec", str(tmp_path / "plan.yaml"), "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "demand history file not found" in err and "missing.csv" in err


def test_monthly_history_with_yearly_season():
    # 3 years of monthly peaks: trend 2 req/s per month, yearly sine of amplitude 10
    m = pd.date_range("2022-01-01", periods=36, freq="MS")
    k = np.arange(36)
    y = 100 + 2 * k + 10 * np.sin(2 * np.pi * k / 12) + np.random.default_rng(0).normal(0, 1, 36)
    fc = forecast_peaks(history_series(m, y), horizon_quarters=4, reps=200)
    assert (fc.freq, fc.seasonal_periods) == ("MS", 12)
    assert fc.labels == ("2025Q1", "2025Q2", "2025Q3", "2025Q4")
    assert fc.trend_per_step == pytest.approx(2.0, abs=0.3)
    # 2025Q1 peak: March 2025 (k = 38) → 100 + 76 + 10·sin(2π·38/12) = 176 + 8.66 = 184.7
    assert fc.point[0] == pytest.approx(184.7, abs=3.0)
    assert all(lo <= p <= hi for lo, p, hi in zip(fc.lower, fc.point, fc.upper))
