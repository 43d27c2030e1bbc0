"""Diagnostics: MSER-5 on a known warm-up, trend flag, Little's law, verdicts, and the
diagnostics as fit_envelope applies them to a study."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from capplan import diagnostics as dg
from capplan.envelope import fit_envelope
from capplan.io import manifest_dict, write_study


def test_mser5_finds_a_known_warmup():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.full(200, 10.0), 1.0 + 0.1 * rng.standard_normal(1800)])
    r = dg.mser5(x)
    assert r.index == 200 and r.batches == 40 and not r.in_second_half


def test_mser5_by_hand_small():
    # batches of 5: means [9, 1, 1, 1]; cutting the first batch leaves zero spread
    x = [9] * 5 + [1] * 15
    r = dg.mser5(x)
    assert r.index == 5 and r.statistic == 0.0
    # no warm-up in a flat series with noise
    r = dg.mser5(np.random.default_rng(1).standard_normal(1000))
    assert r.index < 500


def test_mser_flags_a_series_that_never_settles():
    x = np.linspace(0, 10, 1000) ** 2
    assert dg.mser5(x).in_second_half


def test_trend_test():
    rng = np.random.default_rng(2)
    flat = 100 + rng.standard_normal(20)
    assert not dg.trend_test(flat).trending
    rising = 100 + 5 * np.arange(20) + rng.standard_normal(20)
    t = dg.trend_test(rising)
    assert t.trending and t.p_value < 1e-6
    assert t.rel_increase == pytest.approx(95 / np.mean(rising), rel=0.05)
    # significant but tiny: not flagged (size matters too)
    tiny = 100 + 0.01 * np.arange(20)
    assert not dg.trend_test(tiny + 1e-4 * rng.standard_normal(20)).trending


def test_batch_means_weighted_by_hand():
    v = [1.0, 3.0, 5.0, 7.0]
    w = [1.0, 1.0, 2.0, 2.0]
    assert dg.batch_means(v, w, 2).tolist() == [2.0, 6.0]
    # NaN means (no TTFT in a unit) are skipped
    assert dg.batch_means([1.0, np.nan, 3.0], [1, 1, 1], 1).tolist() == [2.0]


def test_littles_law_by_hand():
    assert dg.littles_ratio(5.0, 10.0, 0.5) == 1.0
    assert dg.littles_ratio(4.0, 10.0, 0.5) == pytest.approx(0.8)
    assert math.isnan(dg.littles_ratio(1.0, 0.0, 1.0))


def _verdict(**kw):
    base = dict(run_id="r", n=1000, warmup_s=0.0, warmup_source="manifest",
                mser_second_half=False, measured_rps=10.0, nominal_rps=10.0,
                gen_lag_p99_ms=1.0, littles=1.0,
                trend_all=dg.TrendResult(0, 1, 0, False), trend_end=dg.TrendResult(0, 1, 0, False))
    base.update(kw)
    return dg.run_diagnostics(**base)


def test_verdicts():
    assert _verdict().usable
    v = _verdict(gen_lag_p99_ms=200.0)
    assert not v.usable and "coordinated omission" in v.reason
    v = _verdict(duplicates=3)
    assert not v.usable and "duplicated" in v.reason
    v = _verdict(mser_second_half=True)
    assert not v.usable and "MSER" in v.reason
    # an overloaded run is kept (it fails the SLO, which is the truth at that rate), flagged
    over = dg.TrendResult(1.0, 1e-9, 2.0, True)
    v = _verdict(warmup_source=dg.MSER_LATE_OVERLOADED + ": TTFT rises 200% of its mean",
                 trend_all=over, trend_end=over)
    assert v.usable and v.overloaded and v.too_short and "overloaded" in v.warnings
    v = _verdict(measured_rps=8.0)
    assert v.usable and "nominal" in v.warnings and v.rate_ratio == pytest.approx(0.8)
    v = _verdict(littles=1.5)
    assert v.usable and "Little" in v.warnings
    v = _verdict(n=5)
    assert not v.usable and "only 5 requests" in v.reason


def test_rate_not_carried_by_hand():
    # (measured − asked)·T / √(asked·T): (20 − 10)·15 / √150 = 12.25 SDs
    assert dg.rate_z(20.0, 10.0, 15.0) == pytest.approx(10 * 15 / math.sqrt(150))
    assert math.isnan(dg.rate_z(20.0, None, 15.0)) and math.isnan(dg.rate_z(20.0, 10.0, math.nan))
    v = _verdict(measured_rps=20.0, span_s=15.0, arrival="poisson")
    assert not v.usable and "did not send at the asked rate" in v.reason
    assert v.rate_z == pytest.approx(12.247, abs=1e-3)
    # +15 % over 15 s is 1.84 SDs: Poisson scatter of a short run, kept with the rate warning
    v = _verdict(measured_rps=11.5, span_s=15.0, arrival="poisson")
    assert v.usable and "nominal" in v.warnings
    # the same +15 % over 1000 s is 15 SDs: not scatter
    assert not _verdict(measured_rps=11.5, span_s=1000.0, arrival="constant").usable
    # a bursty process (gamma) scatters more than Poisson: warned, not excluded
    v = _verdict(measured_rps=20.0, span_s=15.0, arrival="gamma")
    assert v.usable and "nominal" in v.warnings
    # closed loop: no asked rate to miss
    assert _verdict(measured_rps=20.0, span_s=15.0, arrival="poisson", closed_loop=True).usable


def test_off_schedule_requests_by_the_tools_record():
    v = _verdict(off_schedule=51)  # 51 of 1000 = 5.1 % > 5 %
    assert not v.usable and "off the asked schedule" in v.reason and v.off_schedule == 51
    v = _verdict(off_schedule=50)  # 5 %: kept, warned
    assert v.usable and "off the asked schedule" in v.warnings
    # more off schedule than in the window (the burst fell in the cut warm-up): all of it
    assert not _verdict(n=40, off_schedule=82).usable


def test_a_run_off_its_asked_rate_is_left_out_of_the_fit(tmp_path):
    """A Poisson run asked for 10 req/s that sent 20 (a client that fell behind and caught up)
    fails the SLO; before, it sat at its asked level and dragged C_SLO below 10. It is left
    out with the reason, not kept as evidence, and the fit rests on the clean runs."""
    rng = np.random.default_rng(7)
    n = 1200
    good = 300 * np.exp(0.2 * rng.standard_normal(n))
    bad = 300 + 5 * np.arange(n)  # queue building at 20 req/s
    ev = pd.concat([_run_frame("a5", n // 2, 5.0, good[: n // 2]),
                    _run_frame("b10", n, 20.0, bad),
                    _run_frame("c10", n, 10.0, good)])
    runs = [{"run_id": "a5", "offered_rps": 5.0, "nominal_rps": 5.0, "arrival": "poisson"},
            {"run_id": "b10", "offered_rps": 10.0, "nominal_rps": 10.0, "arrival": "poisson"},
            {"run_id": "c10", "offered_rps": 10.0, "nominal_rps": 10.0, "arrival": "poisson",
             "repeat": 1}]
    path = write_study(tmp_path / "d", manifest_dict("rate", runs), ev)
    e = fit_envelope(path, "ttft_ms=1000,attainment=0.9", reps=50)
    r = e.runs.set_index("run_id")
    assert not r.loc["b10", "usable"] and "did not send at the asked rate" in r.loc["b10", "reason"]
    assert r.loc["a5", "usable"] and r.loc["c10", "usable"]
    assert any("b10 excluded" in x for x in e.notes)
    assert e.cslo.estimate >= 10.0  # both clean levels pass: C_SLO is at least the largest tested


def _run_frame(rid, n, rate, ttft_ms, *, seed=0, lag_ms=0.0):
    sched = (np.arange(n) / rate * 1e9).astype(np.int64)
    first = sched + (np.asarray(ttft_ms) * 1e6).astype(np.int64)
    return pd.DataFrame({
        "run_id": rid, "request_id": [f"{rid}-{i}" for i in range(n)], "scheduled_ns": sched,
        "sent_ns": sched + int(lag_ms * 1e6), "first_token_ns": first,
        "last_token_ns": first + 500_000_000, "input_tokens": 10, "output_tokens": 11,
        "status": "ok"})


def test_diagnostics_in_a_study(tmp_path):
    rng = np.random.default_rng(4)
    n, rate = 2000, 20.0
    # r0: warm-up for the first 20 s (400 requests) with 5× TTFT, then stationary
    warm = 300 * np.exp(0.2 * rng.standard_normal(n))
    warm[:400] *= 5
    # r1: overloaded, TTFT grows linearly (queue building up)
    over = 300 + 40 * np.arange(n) / rate
    # r2: stable
    stable = 300 * np.exp(0.2 * rng.standard_normal(n))
    ev = pd.concat([_run_frame("r0", n, rate, warm), _run_frame("r1", n, rate, over),
                    _run_frame("r2", n, rate, stable)])
    runs = [{"run_id": "r0", "offered_rps": rate}, {"run_id": "r1", "offered_rps": rate * 1.5,
                                                     "nominal_rps": rate * 1.5},
            {"run_id": "r2", "offered_rps": rate, "warmup_s": 3.0}]
    path = write_study(tmp_path / "d", manifest_dict("dg", runs), ev)
    e = fit_envelope(path, "ttft_ms=1000,attainment=0.9", reps=50)
    d = e.diagnostics.set_index("run_id")
    # MSER-5 on time-bin TTFT means finds the 20 s warm-up (bin width 100 s / 500 = 0.2 s)
    assert d.loc["r0", "warmup_source"] == "mser5"
    # (MSER may cut a little more of the stationary part, never less of the warm-up)
    w = d.loc["r0", "warmup_s"]
    assert 20.0 - 0.2 <= w <= 30.0
    sched_s = np.arange(n) / rate
    assert e.runs.set_index("run_id").loc["r0", "n"] == int(np.sum(sched_s >= w - 1e-9))
    # the manifest's warm-up wins when given
    assert d.loc["r2", "warmup_source"] == "manifest" and d.loc["r2", "warmup_s"] == 3.0
    assert e.runs.set_index("run_id").loc["r2", "n"] == n - 60
    # overload: flagged, kept, no MSER cut; measured rate 20 vs nominal 30 → warning
    assert d.loc["r1", "overloaded"] and d.loc["r1", "usable"]
    assert d.loc["r1", "too_short"]
    assert "nominal" in d.loc["r1", "warnings"]
    assert d.loc["r1", "warmup_s"] == 0.0
    # a stable run with all its events obeys Little's law; measured rate from the schedule
    assert d.loc["r2", "littles_ratio"] == pytest.approx(1.0, abs=0.02)
    assert d.loc["r2", "measured_rps"] == pytest.approx(rate, rel=1e-3)
    assert not d.loc["r2", "overloaded"] and d.loc["r2", "usable"]
    # warmup="none" keeps everything
    e2 = fit_envelope(path, "ttft_ms=1000,attainment=0.9", reps=50, warmup="none")
    assert (e2.runs["n"] == n).all()


def test_to_frame_has_one_row_per_run():
    f = dg.to_frame([_verdict(), _verdict(run_id="x")])
    assert list(f["run_id"]) == ["r", "x"] and "usable" in f.columns


def test_mser_ignores_the_unstable_last_batches():
    """A stationary series whose last two batch means happen to coincide: MSER's statistic
    there is ~0 (two batches, no spread), which used to put d* at m − 2 — "no steady state"
    for a stable run. At least MSER_MIN_TAIL batches must remain after d*."""
    rng = np.random.default_rng(4)
    x = 10 + rng.standard_normal(500)
    x[-10:] = x[:-10].mean()  # the last two batches of five: identical means
    r = dg.mser5(x)
    assert not r.in_second_half and r.index < 250
    # the unguarded search would have picked the last-but-one batch
    z = x.reshape(100, 5).mean(axis=1)
    stat = [np.sum((z[d:] - z[d:].mean()) ** 2) / (100 - d) ** 2 for d in range(99)]
    assert int(np.argmin(stat)) == 98
    # a series that never settles is still flagged, and a real warm-up still found
    assert dg.mser5(np.linspace(0, 10, 1000) ** 2).in_second_half
    assert dg.mser5(np.r_[np.full(100, 20.0), x[:400]]).index == 100


def test_short_runs_without_a_trend_are_never_excluded_for_their_warm_up(tmp_path):
    """Issue 32: on 60-s runs (300 requests) MSER-5's truncation point is noise and fell in the
    second half of light-load runs with nothing queueing; those runs were excluded as "no
    steady state". Now a run is excluded for lack of a steady state only when TTFT or
    attainment also drifts over it (here TTFT falls: the warm-up still decaying), and the reason
    names that trend; a run without a trend is used whole."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_envelope import sweep_events

    from capplan.io import manifest_dict, write_study
    from capplan.reduce import reduce_study

    ev, runs = sweep_events([2] * 30, 300, seed=6, phi=0.3, sigma=0.4)
    # one run whose warm-up decays over its whole length (TTFT 6× at the start, e-fold 30 s)
    ev = ev.copy()
    sel = ev["run_id"] == "r0"
    t_s = ev.loc[sel, "scheduled_ns"].to_numpy() / 1e9
    extra = (ev.loc[sel, "first_token_ns"] - ev.loc[sel, "scheduled_ns"]).to_numpy() \
        * 5.0 * np.exp(-t_s / 30.0)
    ev.loc[sel, "first_token_ns"] += extra.astype(np.int64)
    ev.loc[sel, "last_token_ns"] += extra.astype(np.int64)
    for r in runs:
        r.pop("warmup_s")  # no manifest warm-up: MSER-5 decides
    st = reduce_study(write_study(tmp_path / "s", manifest_dict("m", runs), ev),
                      "ttft_ms=2000,attainment=0.95")
    d = st.diagnostics.set_index("run_id")
    flat = d[d["warmup_source"] == dg.MSER_LATE_FLAT]
    assert len(flat) >= 1  # MSER-5 fell in the second half of flat runs (the old exclusion)
    assert flat["usable"].all()
    assert flat["warnings"].str.contains("neither TTFT nor attainment shows a trend over the run").all()
    assert not d.loc["r0", "usable"]
    assert d.loc["r0", "reason"].startswith(dg.NO_STEADY_STATE)
    assert "TTFT falls" in d.loc["r0", "reason"] and "Mann–Kendall" in d.loc["r0", "reason"]
    assert d.drop(index="r0")["usable"].all()  # no other run without a trend is excluded


def test_drift_mann_kendall_and_sens_slope_by_hand():
    """Ten batch means 1, 2, …, 10: all 45 pairs concordant, Kendall's τ = 1; Sen's slope 1 per
    batch, a change of 9 over the run, 9 / 5.5 = 164 % of the mean. Exact two-sided p of τ = 1
    with n = 10 (no ties): 2 / 10! = 5.5e-7."""
    d = dg.drift(np.arange(1.0, 11.0))
    assert d.tau == pytest.approx(1.0) and d.direction == "rises"
    assert d.change == pytest.approx(9.0 / 5.5)
    assert d.p_value == pytest.approx(2.0 / math.factorial(10))
    assert d.trending and "TTFT rises 164% of its mean" in d.sentence()
    # the same series reversed, as attainment in points: falls by 9 (> ATT_DRIFT)
    a = dg.drift(np.arange(10.0, 0.0, -1.0) / 10.0, "attainment")
    assert a.direction == "falls" and a.change == pytest.approx(-0.9) and a.trending
    # one outlier batch in a flat series is no trend for ranks (an OLS slope would see one
    # when it sits at an end): τ = 9 / 45 = 0.2, p ≈ 0.5
    y = np.ones(10)
    y[-1] = 50.0
    assert not dg.drift(y).trending
    # significant but small (5 % of the mean < TREND_REL): not a drift
    assert not dg.drift(100.0 + np.linspace(0.0, 5.0, 20)).trending


def _short_run(rate_rps, seed, ttft_ms=None):
    """One 60-s light-load run as per-request (TTFT ms, good) series: Poisson arrivals at
    ``rate_rps``, TTFT lognormal around 120 ms (one or no request over a 2-s limit)."""
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate_rps * 60.0)
    t = np.sort(rng.uniform(0.0, 60.0, n))
    y = 120.0 * np.exp(0.3 * rng.standard_normal(n)) if ttft_ms is None else ttft_ms(t, rng)
    return t, y, (y <= 2000.0).astype(float)


def test_late_warmup_verdict_keeps_trendless_short_runs_and_names_a_drift():
    """Issue 32's shape: 60-s runs of 200–500 requests at light load. Whatever MSER-5 says, a
    run without a trend is used whole; one whose TTFT drifts is excluded and the reason names
    the metric, its direction, its size and p."""
    for seed, rate in enumerate((3.4, 5.0, 6.7, 8.2)):
        t, y, g = _short_run(rate, seed)
        assert 150 < t.size < 550 and g.sum() >= t.size - 1
        src, excluded = dg.late_warmup_verdict(y, np.ones_like(y), g, np.ones_like(g), 0.95)
        assert (src, excluded) == (dg.MSER_LATE_FLAT, False)
    # TTFT rising from 120 to ~600 ms over the run (a queue building), still meeting the
    # 2-s limit: it passed only because it ended, so it is excluded with the trend named
    rise = lambda t, rng: (120.0 + 8.0 * t) * np.exp(0.3 * rng.standard_normal(t.size))  # noqa: E731
    t, y, g = _short_run(5.0, 11, rise)
    src, excluded = dg.late_warmup_verdict(y, np.ones_like(y), g, np.ones_like(g), 0.95)
    assert excluded and src.startswith("mser5: TTFT rises") and "Mann–Kendall" in src
    v = _verdict(warmup_source=src, mser_second_half=excluded)
    assert not v.usable and v.reason.startswith(dg.NO_STEADY_STATE)
    assert "TTFT rises" in v.reason and "p = " in v.reason
    # the same drift in a run that fails the target: an overloaded run, kept and flagged
    g_bad = g.copy()
    g_bad[t > 40.0] = 0.0
    src, excluded = dg.late_warmup_verdict(y, np.ones_like(y), g_bad, np.ones_like(g), 0.95)
    assert not excluded and src.startswith(dg.MSER_LATE_OVERLOADED)
    assert "overloaded, kept" in _verdict(warmup_source=src).warnings
    # attainment drifting with a flat TTFT (a decaying start-up failure): excluded, named
    g_warm = np.where(t < 20.0, (np.arange(t.size) % 2).astype(float), 1.0)
    src, excluded = dg.late_warmup_verdict(np.full(t.size, 120.0), np.ones(t.size), g_warm,
                                           np.ones(t.size), 0.5)
    assert excluded and src.startswith("mser5: attainment rises")


def test_trend_test_is_scipy_linregress_step_for_step():
    """``trend_test`` computes linregress(alternative="greater") without importing
    scipy.stats (0.35–0.6 s of `capplan envelope`'s start): slope and p-value equal to the
    library's, bit for bit, over random, trending, flat-with-noise and perfectly linear series."""
    from scipy.stats import linregress

    rng = np.random.default_rng(7)
    series = [rng.normal(size=n) for n in (4, 5, 12, 40)]
    series += [np.arange(20.0) * 0.3 + rng.normal(size=20), -np.arange(9.0), np.arange(6.0) * 2.0,
               1.0 + 1e-12 * rng.normal(size=10), rng.lognormal(size=30) * 50]
    for y in series:
        t = np.arange(y.size, dtype=np.float64)
        ref = linregress(t, y, alternative="greater")
        slope, p = dg._ols_slope_greater(t, y)
        assert (slope, p) == (float(ref.slope), float(ref.pvalue)), y
