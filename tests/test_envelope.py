"""C_SLO envelope: exact counts, hand-computed crossings, statuses, closed loop, summary
tables, refits from the block statistics, the SLO surface, figures and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from scipy import signal, special

from capplan.cli import main
from capplan.earlystop import n_min
from capplan.envelope import (STATUS_ABOVE, STATUS_BELOW, STATUS_BRACKETED, fit_envelope,
                              fit_from_stats, fit_summary_table)
from capplan.envelope.core import _crossing
from capplan.errors import SpecError
from capplan.io import manifest_dict, write_study
from capplan.reduce import reduce_study
from capplan.slo import SLO

NS = 1_000_000


def sweep_events(levels, n, *, seed=0, base_ms=300.0, slope=0.25, phi=0.9, sigma=0.5,
                 closed=False, lag_ms=None, prefix="r", tpot_base=20.0):
    """Small sweep: TTFT = base·exp(σ·AR(1) + slope·level) ms, constant arrivals."""
    rng = np.random.default_rng(seed)
    frames, runs = [], []
    for i, lv in enumerate(levels):
        rate = lv if not closed else 2.0 * lv
        sched = (np.arange(n) / rate * 1e9).astype(np.int64)
        z = signal.lfilter([1.0], [1.0, -phi], rng.standard_normal(n) * math.sqrt(1 - phi**2))
        ttft = base_ms * np.exp(sigma * z + slope * lv)
        tpot = tpot_base + lv + rng.gamma(2.0, 1.0, n)
        out = np.full(n, 21)
        first = sched + (ttft * NS).astype(np.int64)
        last = first + (tpot * 20 * NS).astype(np.int64)
        lag = np.zeros(n) if lag_ms is None or lag_ms.get(i) is None else np.full(n, lag_ms[i])
        rid = f"{prefix}{i}"
        frames.append(pd.DataFrame({
            "run_id": rid, "request_id": [f"{rid}-{j}" for j in range(n)],
            "scheduled_ns": sched, "sent_ns": sched + (lag * NS).astype(np.int64),
            "first_token_ns": first, "last_token_ns": last, "input_tokens": 100,
            "output_tokens": out, "status": "ok"}))
        key = "concurrency" if closed else "offered_rps"
        runs.append({"run_id": rid, key: int(lv) if closed else float(lv), "warmup_s": 0.0})
    return pd.concat(frames, ignore_index=True), runs


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    ev, runs = sweep_events([1, 2, 3, 4, 5, 6], 1500, seed=3)
    return write_study(tmp_path_factory.mktemp("env") / "s", manifest_dict("sw", runs), ev)


@pytest.fixture(scope="module")
def env(sweep):
    return fit_envelope(sweep, "ttft_ms=1000,tpot_ms=30,attainment=0.9", reps=200, seed=1)


# ------------------------------------------------------------------ exact counts

def test_failures_are_violations_in_the_offered_denominator(make_study):
    from conftest import ev

    rows = []
    for j in range(40):
        t = j * 100.0
        if j % 10 == 0:
            rows.append(ev("r1", scheduled_ms=t, ttft_ms=None, e2e_ms=None, status="rejected",
                           output_tokens=0))
        elif j % 10 == 1:
            rows.append(ev("r1", scheduled_ms=t, ttft_ms=500.0, e2e_ms=None, status="timeout"))
        elif j % 10 == 2:
            rows.append(ev("r1", scheduled_ms=t, ttft_ms=2500.0, e2e_ms=3000.0))
        else:
            rows.append(ev("r1", scheduled_ms=t, ttft_ms=100.0 + j, e2e_ms=900.0))
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 10.0, "warmup_s": 0.0}])
    e = fit_envelope(path, "ttft_ms=2000,attainment=0.5", reps=50)
    r = e.runs.iloc[0]
    # by hand: 40 offered; 4 rejected + 4 timeouts + 4 slow → 28 good
    assert r["n"] == 40 and r["n_good"] == 28
    assert r["attainment"] == pytest.approx(28 / 40)
    assert r["n_rejected"] == 4 and r["n_timeout"] == 4
    assert r["measured_rps"] == pytest.approx(10.0)
    assert r["goodput_rps"] == pytest.approx(10.0 * 28 / 40)
    assert r["throughput_rps"] == pytest.approx(10.0 * 32 / 40)
    # error rate = offered requests not ok (rejected, timeout, error, cancelled), as summarize
    from capplan import open_study
    from capplan.metrics import summarize

    assert r["n_errors"] == 8 and r["error_rate"] == pytest.approx(8 / 40)
    sm = summarize(open_study(path), "ttft_ms=2000,attainment=0.5").to_frame().set_index("run_id")
    assert r["error_rate"] == pytest.approx(sm.loc["r1", "error_rate"])


def test_grid_is_exact_at_the_reduction_slo_and_grid_points(sweep):
    slo = SLO.parse("ttft_ms=1000,tpot_ms=30,attainment=0.9")
    st = reduce_study(sweep, slo)
    h = st.grid_spec.half
    for r in st.runs:
        assert r.grid[:, h, h].sum() == r.n_good  # anchor cell = exact SQL predicate
    # a grid point (TTFT limit = 1000·1.1²) equals a fresh exact reduction at that limit
    lim = 1000 * 1.1**2
    st2 = reduce_study(sweep, slo.with_(ttft_ms=lim))
    for a, b in zip(st.runs, st2.runs):
        assert a.grid[:, h + 2, h].sum() == b.n_good
    # TPOT "no limit" column equals the TTFT-only SLO
    st3 = reduce_study(sweep, "ttft_ms=1000,attainment=0.9")
    for a, b in zip(st.runs, st3.runs):
        assert a.grid[:, h, -1].sum() == b.n_good


# ------------------------------------------------------------------ crossing, statuses

def test_crossing_on_logit_scale_by_hand():
    F = np.array([[0.99, 0.95, 0.80]])
    x = np.array([1.0, 2.0, 3.0])
    xs, flag, i = _crossing(F, x, 0.9, np.full(3, 1e-9))
    frac = (special.logit(0.95) - special.logit(0.9)) / (special.logit(0.95) - special.logit(0.8))
    assert xs[0] == pytest.approx(2.0 + frac)  # 2.4795…
    assert flag[0] == 0 and i[0] == 1
    xs, flag, _ = _crossing(np.array([[0.99, 0.98]]), np.array([1.0, 2.0]), 0.9, np.full(2, 1e-9))
    assert flag[0] == 1 and xs[0] == 2.0
    xs, flag, _ = _crossing(np.array([[0.5, 0.4]]), np.array([1.0, 2.0]), 0.9, np.full(2, 1e-9))
    assert flag[0] == -1 and xs[0] == 0.0


def test_summary_table_by_hand():
    df = pd.DataFrame({"offered_rps": [1, 2, 3, 4], "requests": [1000] * 4,
                       "good_requests": [999, 990, 950, 800]})
    e = fit_summary_table(df, 0.97, reps=400, seed=0)
    # monotone already, so the isotonic fit is the data; logit interpolation between 2 and 3
    frac = (special.logit(0.99) - special.logit(0.97)) / (special.logit(0.99) - special.logit(0.95))
    assert e.cslo.estimate == pytest.approx(2 + frac)  # 2.678…
    assert e.cslo.status == STATUS_BRACKETED
    assert e.iid_assumption and any("iid" in n for n in e.notes)
    assert e.cslo.ci_low < e.cslo.estimate < e.cslo.ci_high
    assert e.cslo.ci_low <= e.cslo.lower_bound <= e.cslo.estimate
    assert e.levels["fitted"].tolist() == pytest.approx([0.999, 0.99, 0.95, 0.8])


def test_isotonic_takes_the_first_down_crossing():
    # raw attainment dips below target at 2 and recovers at 3: decreasing fit pools them,
    # so C_SLO is below 3 (every lower rate must also pass)
    df = pd.DataFrame({"rate": [1, 2, 3, 4], "n": [2000] * 4, "good": [1990, 1700, 1820, 1000]})
    e = fit_summary_table(df, 0.9, reps=300)
    fit = e.levels["fitted"].to_numpy()
    assert np.all(np.diff(fit) <= 1e-12)
    assert fit[1] == pytest.approx(fit[2])
    assert 1.0 < e.cslo.estimate < 2.0


def test_statuses_when_not_bracketed():
    above = fit_summary_table(pd.DataFrame({"rate": [1, 2, 3], "n": [500] * 3,
                                            "good": [500, 499, 498]}), 0.95, reps=200)
    assert above.cslo.status == STATUS_ABOVE
    assert above.cslo.estimate == 3.0 and above.cslo.ci_high == 3.0
    assert above.cslo.suggested_rates == (3.75, 4.5, 6.0)
    below = fit_summary_table(pd.DataFrame({"rate": [2, 4], "n": [500] * 2,
                                            "good": [300, 100]}), 0.95, reps=200)
    assert below.cslo.status == STATUS_BELOW
    assert math.isnan(below.cslo.estimate)
    assert below.cslo.lower_bound == 0.0 and below.cslo.ci_low == 0.0
    assert below.cslo.suggested_rates == (0.5, 1.0, 1.5)
    # replicates are censored, and flagged: −1 below the lowest level, +1 above the highest
    assert np.all(below.crossing_replicates[below.crossing_flags == -1] == 0.0)
    assert np.mean(below.crossing_flags == -1) > 0.9
    assert np.all(above.crossing_replicates[above.crossing_flags == 1] == 3.0)
    d = below.to_dict()
    assert d["cslo"]["estimate"] is None and d["cslo.status"] == STATUS_BELOW
    json.dumps(d)  # JSON-ready: no NaN


def test_zero_failure_run_gets_clopper_pearson_floor():
    df = pd.DataFrame({"rate": [1, 2, 3], "n": [300, 300, 300], "good": [300, 280, 150]})
    e = fit_summary_table(df, 0.9, reps=300)
    r = e.runs.iloc[0]
    assert r["att_ci_high"] == 1.0
    assert r["att_ci_low"] == pytest.approx(0.025 ** (1 / 300))  # exact CP bound
    # the replicates of that level are not all 1.0: the interval cannot collapse
    assert e.level_replicates[:, 0].std() > 0


def test_wide_bracket_suggests_rates():
    df = pd.DataFrame({"rate": [1, 10], "n": [5000, 5000], "good": [4990, 2000]})
    e = fit_summary_table(df, 0.95, reps=200)
    assert e.cslo.status == STATUS_BRACKETED
    assert len(e.cslo.suggested_rates) == 3
    assert all(1 < v < 10 for v in e.cslo.suggested_rates)


def test_goodput_knee_and_max_goodput_by_hand():
    df = pd.DataFrame({"rate": [1, 2, 3, 4], "n": [1000] * 4, "good": [1000, 1000, 600, 300]})
    e = fit_summary_table(df, 0.9, reps=100)
    assert e.levels["goodput_rps"].tolist() == pytest.approx([1.0, 2.0, 1.8, 1.2])
    assert e.max_goodput["x"] == 2.0 and e.max_goodput["goodput_rps"] == pytest.approx(2.0)
    assert e.knee["x"] == 2.0  # ΔG/Δλ = 1, −0.2, −0.6: the first below 0.5 starts at 2


def test_summary_table_from_csv_and_cli(tmp_path, capsys):
    p = tmp_path / "t.csv"
    pd.DataFrame({"offered_rps": [1, 2, 3], "requests": [800] * 3,
                  "good_requests": [799, 760, 500]}).to_csv(p, index=False)
    e = fit_summary_table(p, "ttft_ms=1,attainment=0.93", reps=100)
    assert e.cslo.status == STATUS_BRACKETED
    out = tmp_path / "r.json"
    rc = main(["envelope", str(p), "--slo", "ttft_ms=1000,attainment=0.93", "--reps", "100",
               "--out", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["cslo"]["estimate"] == pytest.approx(e.cslo.estimate)
    with pytest.raises(SpecError):
        fit_summary_table(pd.DataFrame({"rate": [1], "n": [10], "good": [11]}), 0.9)


# ------------------------------------------------------------------ study fits

def test_envelope_from_study(env):
    c = env.cslo
    assert c.status == STATUS_BRACKETED and not c.closed_loop
    assert c.ci_low <= c.lower_bound <= c.estimate <= c.ci_high
    assert 1.0 < c.estimate < 6.0
    r = env.runs
    assert list(r["run_id"]) == [f"r{i}" for i in range(6)]
    assert (r["n"] == 1500).all() and r["usable"].all()
    assert (r["att_ci_low"] <= r["attainment"]).all() and (r["attainment"] <= r["att_ci_high"]).all()
    assert (r["design_effect"].dropna() > 1).all()  # AR(1) latents: positively correlated
    assert (r["n_eff"] <= r["n"]).all()
    for col in ("ttft_p99_ms", "ttft_p99_ci_low", "ttft_p99_ci_high", "tpot_p50_ms", "e2e_p99_ms",
                "fitted", "goodput_rps", "throughput_rps", "measured_rps", "early_stop_ok"):
        assert col in r.columns
    assert (r["ttft_p99_ci_low"] <= r["ttft_p99_ms"] * 1.01).all()
    # p99 point estimate within α of the exact quantile of the stored values
    assert np.all(np.diff(r["ttft_p50_ms"]) > 0)
    assert set(env.diagnostics["run_id"]) == set(r["run_id"])


def test_percentile_point_estimate_vs_exact(sweep, env):
    import duckdb

    con = duckdb.connect()
    q = con.execute("SELECT run_id, quantile_disc((first_token_ns - scheduled_ns) / 1e6, 0.99) "
                    "FROM read_parquet(?) GROUP BY 1 ORDER BY 1",
                    [str(sweep / "events" / "events.parquet")]).fetchall()
    exact = dict(q)
    # an interpolated reading lies in the bucket of the exact order statistic: within γ − 1
    # (≈ 2α = 1 %) of it
    for rid, v in zip(env.runs["run_id"], env.runs["ttft_p99_ms"]):
        assert v == pytest.approx(exact[rid], rel=0.0101)


def test_same_seed_same_numbers(sweep, env):
    again = fit_envelope(sweep, "ttft_ms=1000,tpot_ms=30,attainment=0.9", reps=200, seed=1)
    assert again.cslo == env.cslo
    pd.testing.assert_frame_equal(again.runs, env.runs)
    other = fit_envelope(sweep, "ttft_ms=1000,tpot_ms=30,attainment=0.9", reps=200, seed=2,
                         stats=env.stats)
    assert other.cslo.estimate == env.cslo.estimate  # the estimate does not depend on draws
    assert other.cslo.ci_low != env.cslo.ci_low


def test_refit_from_stats(env, sweep):
    same = env.refit()
    assert same.cslo == env.cslo
    t = env.refit(attainment=0.8)
    direct = fit_from_stats(env.stats, env.slo.with_(attainment=0.8), reps=200, seed=1)
    assert t.cslo == direct.cslo and t.target == 0.8
    assert t.cslo.estimate >= env.cslo.estimate  # a looser target never lowers capacity
    # a TTFT limit on the grid: the refit uses the exact counts of that limit
    lim = 1000 * 1.1**2
    rf = env.refit(slo=f"ttft_ms={lim},tpot_ms=30,attainment=0.9")
    fresh = fit_envelope(sweep, f"ttft_ms={lim},tpot_ms=30,attainment=0.9", reps=200, seed=1)
    assert rf.runs["n_good"].tolist() == fresh.runs["n_good"].tolist()
    # off-grid limits snap to the grid, and the result says so
    off = env.refit(slo="ttft_ms=1180,tpot_ms=30,attainment=0.9")
    assert off.slo.ttft_ms == pytest.approx(lim)
    assert any("snapped" in n for n in off.notes)
    # an E2E limit is not on the grid: the refit re-reduces from the study
    e2e = env.refit(slo="ttft_ms=1000,tpot_ms=30,e2e_ms=2500,attainment=0.9")
    assert e2e.slo.e2e_ms == 2500
    assert (e2e.runs["n_good"] <= env.runs["n_good"]).all()


def test_surface(env):
    s = env.surface(ttft_ms_grid=[500, 1000, 2000], tpot_ms_grid=[30, 60], reps=200)
    f = s.to_frame()
    assert len(f) == 6 and {"x_ms", "y_ms", "estimate", "lower_bound", "status"} <= set(f.columns)
    at = f[(f["x_ms"].round(6) == 1000.0) & (f["y_ms"].round(6) == 30.0)].iloc[0]
    # the surface is the within-run fit over the grid (docs/envelope.md, SLO surface)
    within = fit_from_stats(env.stats, env.slo, reps=50, method="within-run")
    assert at["estimate"] == pytest.approx(within.cslo.estimate)
    # looser TTFT limit → capacity does not fall (estimates; NaN = below min tested)
    for y in f["y_ms"].unique():
        v = f[f["y_ms"] == y].sort_values("x_ms")["estimate"].fillna(0).to_numpy()
        assert np.all(np.diff(v) >= -1e-9)
    assert isinstance(s.figure(), go.Figure)


def test_figures(env):
    fig = env.figure()
    assert isinstance(fig, go.Figure) and len(fig.data) >= 3
    g = env.goodput_figure()
    assert isinstance(g, go.Figure) and len(g.data) >= 2
    assert "C_SLO" in json.dumps(fig.to_plotly_json(), default=str)


def test_closed_loop(tmp_path):
    ev, runs = sweep_events([1, 2, 4, 8], 1200, seed=5, closed=True, slope=0.3, phi=0.5)
    path = write_study(tmp_path / "c", manifest_dict("cl", runs, load_model="closed"), ev)
    e = fit_envelope(path, "ttft_ms=1500,attainment=0.9", reps=150)
    c = e.cslo
    assert c.closed_loop and c.unit == "req/s"
    lv = e.levels
    passing = lv[lv["fitted"] >= 0.9]
    top = passing.iloc[-1]
    # capacity = achieved goodput rate at the highest passing concurrency
    assert c.load_at_capacity == top["x"]
    assert c.estimate == pytest.approx(top["goodput_rps"])
    assert c.lower_bound <= c.estimate
    assert "closed loop" in e.x_label or e.x_label == "concurrency"


def test_repeats_are_pooled_per_level(tmp_path):
    ev1, runs1 = sweep_events([1, 2, 3], 600, seed=1, prefix="a")
    ev2, runs2 = sweep_events([1, 2, 3], 600, seed=2, prefix="b")
    for r in runs2:
        r["repeat"] = 1
    path = write_study(tmp_path / "rep", manifest_dict("rp", runs1 + runs2),
                       pd.concat([ev1, ev2]))
    e = fit_envelope(path, "ttft_ms=600,attainment=0.9", reps=100)
    assert len(e.runs) == 6 and len(e.levels) == 3
    assert (e.levels["n"] == 1200).all()
    pooled = e.runs.groupby("load_level")["n_good"].sum() / 1200
    assert e.levels["attainment"].tolist() == pytest.approx(pooled.tolist())
    assert (e.levels["n_runs"] == 2).all()
    assert not any("single run" in n for n in e.notes)


def test_single_run_bracket_is_flagged(env):
    """Single runs at the rates bracketing C_SLO are usually optimistic near saturation
    (benchmarks/coverage_synth.py): the envelope says so and asks for repeats."""
    assert env.cslo.status == STATUS_BRACKETED and (env.levels["n_runs"] == 1).all()
    old = fit_from_stats(env.stats, env.slo, reps=50, method="within-run")
    assert any("single run each" in n and "≥ 3 runs" in n for n in old.notes)
    assert old.honesty.status == "optimistic"
    # the default interval models the run-to-run variation; the honesty says whether the
    # sweep could measure it, and otherwise which repeats to add
    assert not any("single run each" in n for n in env.notes)
    h = env.honesty
    assert h.status in ("honest", "unsupported")
    if h.status == "unsupported":
        assert all(r.repeats >= 2 for r in h.runs_to_add if "repeat" in r.why)  # 3 in all


def test_unusable_run_is_excluded_with_reason(tmp_path):
    ev, runs = sweep_events([1, 2, 3, 4], 800, seed=7, lag_ms={3: 400.0})
    path = write_study(tmp_path / "lag", manifest_dict("lg", runs), ev)
    e = fit_envelope(path, "ttft_ms=1000,attainment=0.9", reps=100)
    bad = e.runs.set_index("run_id").loc["r3"]
    assert not bad["usable"] and "generator lag" in bad["reason"]
    assert math.isnan(bad["fitted"])
    assert any("r3 excluded" in n for n in e.notes)
    assert len(e.levels) == 3


def test_early_stopping_check(make_study):
    from conftest import ev

    rows = [ev("r1", scheduled_ms=i * 50.0, ttft_ms=100.0) for i in range(100)]
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 20.0, "warmup_s": 0.0}])
    e = fit_envelope(path, "ttft_ms=2000,attainment=0.99", reps=50)
    r = e.runs.iloc[0]
    assert r["early_stop_n_min"] == n_min(0.99, 0, 0.99) == 459
    assert not r["early_stop_ok"]
    assert r["ci_floor"] == "clopper-pearson" and r["att_ci_high"] == 1.0


# ------------------------------------------------------------------ CLI

def test_cli_json_keys(sweep, tmp_path, capsys):
    out = tmp_path / "res.json"
    rc = main(["envelope", str(sweep), "--slo", "ttft_ms=1000,tpot_ms=30,attainment=0.9",
               "--reps", "100", "--seed", "3", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "C_SLO estimate" in text and "lower bound" in text and "diagnostics" in text
    d = json.loads(out.read_text())
    for k in ("estimate", "ci_low", "ci_high", "lower_bound", "status"):
        assert k in d["cslo"] and f"cslo.{k}" in d
    assert d["cslo"]["status"] == STATUS_BRACKETED
    assert d["cslo"]["ci_low"] <= d["cslo"]["estimate"] <= d["cslo"]["ci_high"]
    assert len(d["runs"]) == 6 and "attainment" in d["runs"][0]
    assert len(d["diagnostics"]) == 6 and "usable" in d["diagnostics"][0]
    assert d["settings"]["seed"] == 3
    rc = main(["envelope", str(sweep), "--slo", "ttft_ms=1000,tpot_ms=30,attainment=0.9",
               "--reps", "100", "--seed", "3", "--scheme", "stationary"])
    assert rc == 0


def test_cli_prints_envelope_to_text(sweep, capsys):
    """The CLI and a notebook print the same text: Envelope.to_text()."""
    slo = "ttft_ms=1000,tpot_ms=30,attainment=0.9"
    assert main(["envelope", str(sweep), "--slo", slo, "--reps", "50", "--seed", "2"]) == 0
    printed = capsys.readouterr().out
    env = fit_envelope(sweep, slo, reps=50, seed=2)
    assert printed == env.to_text() + "\n"
    head = env.to_text(tables=False)
    assert printed.startswith(head.split("\nnote:")[0]) and "diagnostics:" not in head
    lines = head.splitlines()
    # the honesty of the bound and the estimand come first (docs/envelope.md)
    assert lines[0].startswith(f"Lower bound: {env.honesty.status}")
    assert lines[1].startswith("Estimand: ")
    i = lines.index("SLO: " + env.slo.describe())
    assert lines[i + 2].startswith("C_SLO estimate:") and env.cslo.status in lines[i + 2]
    assert lines[i + 4].startswith("lower bound (95%, one-sided): ")
    assert [ln for ln in lines if ln.startswith("note: ")] == [f"note: {n}" for n in env.notes]


def test_cli_bad_input_exits_2(sweep, tmp_path, capsys):
    assert main(["envelope", str(sweep), "--slo", "ttft_ms=abc"]) == 2
    assert "ERROR" in capsys.readouterr().err
    assert main(["envelope", str(sweep), "--slo", "attainment=0.9"]) == 2
    assert main(["envelope", str(sweep), "--slo", "ttft_ms=1000", "--confidence", "3"]) == 2
    assert main(["envelope", str(tmp_path / "nope"), "--slo", "ttft_ms=1000"]) == 2


def test_duplicated_events_make_a_run_unusable(tmp_path):
    ev, runs = sweep_events([1, 2, 3], 400, seed=8)
    dup = ev[ev["run_id"] == "r1"].iloc[100:103]
    path = write_study(tmp_path / "dup", manifest_dict("d", runs), pd.concat([ev, dup]))
    e = fit_envelope(path, "ttft_ms=1000,attainment=0.9", reps=50)
    d = e.diagnostics.set_index("run_id")
    assert d.loc["r1", "duplicates"] == 3 and not d.loc["r1", "usable"]
    assert d.loc["r0", "duplicates"] == 0 and d.loc["r0", "usable"]


def test_summary_envelope_refits_target():
    df = pd.DataFrame({"rate": [1, 2, 3, 4], "n": [1000] * 4, "good": [999, 990, 950, 800]})
    e = fit_summary_table(df, 0.97, reps=200, seed=4)
    r = e.refit(attainment=0.9)
    assert r.target == 0.9 and r.cslo.estimate > e.cslo.estimate
    assert r.cslo == fit_summary_table(df, 0.9, reps=200, seed=4).cslo
    with pytest.raises(SpecError):
        e.refit(slo="ttft_ms=100")
    with pytest.raises(SpecError):
        e.surface()


def test_stats_from_series_in_memory():
    from capplan.reduce import stats_from_series

    rng = np.random.default_rng(0)
    runs = [{"run_id": f"r{i}", "load_level": lv, "good": (rng.random(3000) < p).astype(float)}
            for i, (lv, p) in enumerate([(1, 0.999), (2, 0.99), (3, 0.9)])]
    st = stats_from_series(runs, "ttft_ms=1,attainment=0.95", max_units=500)
    assert [r.n_units for r in st.runs] == [500, 500, 500]
    assert st.runs[1].n_good == int(runs[1]["good"].sum())
    e = fit_from_stats(st, st.slo, reps=100)
    assert e.cslo.status == STATUS_BRACKETED and 2 < e.cslo.estimate < 3


def _ar1_good(n, p, phi, seed):
    rng = np.random.default_rng(seed)
    z = signal.lfilter([1.0], [1.0, -phi], rng.standard_normal(n) * math.sqrt(1 - phi**2))
    return (z <= special.ndtri(p)).astype(float)


def test_degenerate_run_borrows_the_nearest_runs_design_effect():
    """A zero-failure run's N_eff uses the design effect of the nearest non-degenerate run by
    load level (ties → the lower level; donors need ≥ 5 of each outcome), not the sweep median
    that near-saturation runs dominate; its CI is Clopper–Pearson at that N_eff."""
    from capplan import bootstrap as B
    from capplan.reduce import stats_from_series

    runs = [
        {"run_id": "lo", "load_level": 1.0, "good": _ar1_good(4000, 0.97, 0.8, 1)},
        {"run_id": "perfect", "load_level": 2.0, "good": np.ones(600)},
        {"run_id": "one_fail", "load_level": 2.5, "good": np.r_[np.ones(1999), 0.0]},
        {"run_id": "hi", "load_level": 3.0, "good": _ar1_good(4000, 0.9, 0.99, 2)},
        {"run_id": "sat1", "load_level": 5.0, "good": _ar1_good(4000, 0.6, 0.995, 3)},
        {"run_id": "sat2", "load_level": 6.0, "good": _ar1_good(4000, 0.4, 0.995, 4)},
    ]
    st = stats_from_series(runs, "ttft_ms=1000,attainment=0.99")
    e = fit_from_stats(st, st.slo, reps=400, seed=0, block_len=60)
    r = e.runs.set_index("run_id")
    d_lo, d_hi = r.loc["lo", "design_effect"], r.loc["hi", "design_effect"]
    assert 1 < d_lo < 5 and d_hi > 20  # the donors really differ
    median = float(np.median(r["design_effect"].dropna()))
    assert median > 10  # what the old rule would have used
    # "perfect" (level 2) is equidistant from "lo" (1) and "hi" (3): the lower one wins;
    # "one_fail" (2.5) is nearer but has a single failure, so it does not lend its deff
    p = r.loc["perfect"]
    assert p["design_effect_used"] == pytest.approx(d_lo)
    assert p["design_effect_source"] == "nearest run lo"
    assert p["n_eff"] == pytest.approx(600 / d_lo)
    lo, hi = B.clopper_pearson(p["n_eff"], p["n_eff"], 0.95)
    assert p["att_ci_low"] == pytest.approx(lo) and p["att_ci_high"] == 1.0
    assert p["ci_floor"] == "clopper-pearson"
    # its replicates: Beta(N_eff, 1) — with N_eff ≈ 600/2 far fewer fall below 0.99 than
    # with the median-deff N_eff (600/median ≤ 60, where most would)
    j = list(e.levels["load_level"]).index(2.0)
    share_below = float(np.mean(e.level_replicates[:, j] < 0.99))
    assert share_below == pytest.approx(0.99 ** (600 / d_lo), abs=0.06)
    assert share_below < 0.99 ** (600 / median) - 0.3
    # a run with no successes at the top borrows from its nearest neighbour too
    runs2 = runs + [{"run_id": "dead", "load_level": 7.0, "good": np.zeros(800)}]
    st2 = stats_from_series(runs2, "ttft_ms=1000,attainment=0.99")
    r2 = fit_from_stats(st2, st2.slo, reps=100, seed=0, block_len=60).runs.set_index("run_id")
    assert r2.loc["dead", "design_effect_source"] == "nearest run sat2"
    assert r2.loc["dead", "n_eff"] == pytest.approx(800 / r2.loc["sat2", "design_effect"])


def test_max_error_rate_binds_before_latency():
    """Hand-built sweep: errors (offered requests not ok) rise faster than latency violations;
    with max_error_rate = 1 % C_SLO is the error-rate up-crossing (between 3 and 4 req/s,
    logit-interpolated on the isotonic error curve, here the data), not the attainment
    crossing (between 4 and 5); each replicate's crossing is the smaller of the two."""
    from capplan.reduce import stats_from_series

    n = 20000
    err = [0.0, 0.001, 0.004, 0.02, 0.08]      # error rate per level
    slow = [0.001, 0.001, 0.001, 0.005, 0.02]  # ok but too slow
    runs = []
    for i, (e_, s_) in enumerate(zip(err, slow)):
        ok = np.ones(n)
        ok[: int(e_ * n)] = 0.0
        good = ok.copy()
        good[int(e_ * n): int(e_ * n) + int(s_ * n)] = 0.0
        perm = np.random.default_rng(i).permutation(n)  # spread over the run
        runs.append({"run_id": f"r{i}", "load_level": float(i + 1), "good": good[perm],
                     "ok": ok[perm]})
    slo = "ttft_ms=1000,attainment=0.95,max_error_rate=0.01"
    st = stats_from_series(runs, slo)
    # the hand computation interpolates the runs' own attainment: the within-run method (the
    # run effect would move the attainment curve to the mean run, by design)
    e = fit_from_stats(st, slo, reps=300, seed=2, method="within-run")
    e0 = fit_from_stats(st, "ttft_ms=1000,attainment=0.95", reps=300, seed=2, method="within-run")
    r = e.runs.set_index("run_id")
    assert r["error_rate"].tolist() == pytest.approx(err)
    assert r["attainment"].tolist() == pytest.approx([1 - a - b for a, b in zip(err, slow)])
    # attainment alone: crossing between 4 and 5
    a4, a5 = 1 - err[3] - slow[3], 1 - err[4] - slow[4]
    x_att = 4 + (special.logit(a4) - special.logit(0.95)) / (special.logit(a4) - special.logit(a5))
    assert e0.cslo.estimate == pytest.approx(x_att) and e0.cslo.binding == "attainment"
    # with the error-rate limit: the first up-crossing of 0.01 between 3 and 4
    x_err = 3 + (special.logit(0.01) - special.logit(err[2])) / (
        special.logit(err[3]) - special.logit(err[2]))
    c = e.cslo
    assert c.estimate == pytest.approx(x_err) and 3 < c.estimate < 4
    assert c.binding == "error_rate" and c.status == STATUS_BRACKETED
    assert c.ci_low <= c.lower_bound <= c.estimate <= c.ci_high < 4.0
    assert any("error-rate limit binds" in s for s in e.notes)
    lv = e.levels
    assert lv["error_rate"].tolist() == pytest.approx(err)
    assert np.all(np.diff(lv["error_fitted"]) >= 0)
    assert (lv["error_ci_low"] <= lv["error_rate"] + 1e-12)[1:].all()
    # no errors at level 1: Beta(1, N_eff) replicates, so its interval does not collapse to 0
    assert 0 < lv["error_ci_high"].iloc[0] < 3e-3
    # attainment draws are unchanged by the error constraint; each replicate takes the min
    assert np.array_equal(e.level_replicates, e0.level_replicates)
    assert np.all(e.crossing_replicates <= e0.crossing_replicates + 1e-12)
    assert np.mean(e.crossing_replicates < e0.crossing_replicates) > 0.95
    # a loose limit does not bind: same C_SLO as without it
    loose = fit_from_stats(st, "ttft_ms=1000,attainment=0.95,max_error_rate=0.5", reps=300,
                           seed=2, method="within-run")
    assert loose.cslo.estimate == pytest.approx(e0.cslo.estimate)
    assert loose.cslo.binding == "attainment"
    assert np.array_equal(loose.crossing_replicates, e0.crossing_replicates)
