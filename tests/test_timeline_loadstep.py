"""A load step into overload and back is an incident (capplan.timeline, docs/timeline.md "Load
steps"): the step detected on the per-window arrival counts, and its breach, recovery after the
rate falls back and drain computed by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capplan import contract as C
from capplan.cli import main
from capplan.timeline import StepRule, analyse_timeline, load_steps

S = C.NS_PER_S


def _fifo_study(make_study, *, recorded=None):
    """Arrivals every 0.1 s (10 req/s) for [0, 100 s), every 0.05 s (20 req/s) for [100, 130 s),
    every 0.1 s again until 250 s; one FIFO server that serves a request in 62.5 ms (16 req/s),
    admitting it when it starts; first token 40 ms after admission, last at the service's end.

    By hand. Before the step nothing waits (0.1 s between arrivals > 62.5 ms). Step request i
    (at 100 + 0.05 i) starts at 100 + 0.0625 i: it waits 0.0125 i, and with the SLO's TTFT of
    1 s (wait ≤ 0.96 s) i ≤ 76 is good: the first bad one arrives at 103.85 s, so window 103
    breaks the SLO (3 of 20 bad): time to breach 3 s. The last step request (i = 599) ends at
    137.5 s; request j after the fall (at 130 + 0.1 j) starts at 137.5 + 0.0625 j and waits
    7.5 − 0.0375 j: good from j = 175 (147.5 s), so window 147 still breaks (5 bad) and window
    148 is the first of the good ones: recovered 18 s after the fall (48 s after the step; the
    breach lasted 148 − 103 = 45 s). The queue: 6 waiting at 149 s (191 arrived since the fall,
    185 started), none at 150 s; the pre-step level is 0 + 1, crossed at 149 + 5/6 s: back
    19.83 s after the fall. Good requests lost: every bad one, 523 + 175 = 698."""
    ns = np.r_[np.arange(0, 1000) * 100_000_000, 100 * S + np.arange(600) * 50_000_000,
               130 * S + np.arange(1200) * 100_000_000].astype(np.int64)
    service = 62_500_000
    start = np.empty_like(ns)
    free = 0
    for k, a in enumerate(ns):
        start[k] = max(a, free)
        free = start[k] + service
    n = ns.size
    df = pd.DataFrame({
        "run_id": "r1", "request_id": [f"q{i:05d}" for i in range(n)], "scheduled_ns": ns,
        "sent_ns": ns, "first_token_ns": start + 40_000_000, "last_token_ns": start + service,
        "admitted_ns": start, "input_tokens": 100, "output_tokens": 20, "status": "ok"})
    path = make_study(df, runs=[{"run_id": "r1", "offered_rps": 12.0, "duration_s": 250}],
                      timeline=recorded)
    return path, df


def test_load_step_breach_recovery_and_drain_by_hand(make_study):
    path, df = _fifo_study(make_study)
    tl = analyse_timeline(path, "ttft_ms=1000,attainment=0.99", window_s=1.0, recover_windows=5)
    ev = tl.events
    steps = ev[ev["event"] == "load_step"]
    assert steps["t_s"].tolist() == [100.0, 130.0] and (steps["source"] == "derived").all()
    assert steps["rate_before_rps"].astype(float).tolist() == pytest.approx([10.0, 20.0])
    assert steps["rate_rps"].astype(float).tolist() == pytest.approx([20.0, 10.0])
    assert len(tl.incidents) == 1  # the step down ends the step's incident
    r = tl.incidents.iloc[0]
    assert r["kind"] == "load step" and r["events"] == 2
    assert (r["rate_from_rps"], r["rate_to_rps"], r["fall_t_s"]) == pytest.approx((10, 20, 130))
    assert r["pre_attainment"] == 1.0 and r["pre_offered_rps"] == pytest.approx(10.0)
    assert r["time_to_breach_s"] == pytest.approx(3.0)
    assert r["breach_s"] == pytest.approx(45.0) and r["time_to_recover_s"] == pytest.approx(48.0)
    assert r["recover_after_fall_s"] == pytest.approx(18.0)
    assert r["drain_after_fall_s"] == pytest.approx(19 + 5 / 6)
    assert r["good_lost"] == pytest.approx(698.0)
    # the same count from the raw rows
    bad = ((df["first_token_ns"] - df["scheduled_ns"]) > 1000 * C.NS_PER_MS).sum()
    assert bad == 698
    text = tl.to_text()
    assert "load step" in text and "offered 10 → 20 req/s; it fell back at 130.0 s" in text
    assert "SLO recovered 18 s after the fall" in text and "19.8 s after it" in text
    assert any("load step(s) derived from the offered rate" in n for n in tl.notes)
    shown = tl.display_frame()
    assert shown.loc[0, "recovered after the fall (s)"] == pytest.approx(18.0)


def test_no_derive_and_a_recorded_step_derive_nothing(make_study):
    path, _ = _fifo_study(make_study)
    tl = analyse_timeline(path, "ttft_ms=1000", window_s=1.0, derive=False)
    assert tl.incidents.empty and not (tl.events["event"] == "load_step").any()
    rec = [{"run_id": "r1", "t_ns": 100 * S, "event": "load_step", "rate_before_rps": 10.0,
            "rate_rps": 20.0, "detail": "harness: step to 20 req/s"},
           {"run_id": "r1", "t_ns": 130 * S, "event": "load_step", "rate_before_rps": 20.0,
            "rate_rps": 10.0}]
    path2, _ = _fifo_study(make_study, recorded=rec)
    tl = analyse_timeline(path2, "ttft_ms=1000", window_s=1.0)
    steps = tl.events[tl.events["event"] == "load_step"]
    assert (steps["source"] == "recorded").all() and len(steps) == 2
    r = tl.incidents.iloc[0]
    assert r["kind"] == "load step" and r["recover_after_fall_s"] == pytest.approx(18.0)


def test_step_rule_on_counts_by_hand():
    """10 per 1-s window, 20 for windows 100–129, 10 after; spans of 10 s: m = 10 windows. At
    100: A = 100, B = 200, z = 100 / √300 = 5.77 (≥ 5, +100 %); at 101: A = 110, z = 90 / √310
    = 5.11, a candidate within m of 100 with the same sign, suppressed. Dispersion from
    successive differences: 2 · 10² / (2 · 249) / 11.2 < 1 → 1. A 5-s step (windows 100–104)
    keeps both its ends: opposite signs are not suppressed."""
    counts = np.r_[np.full(100, 10), np.full(30, 20), np.full(120, 10)]
    rule = StepRule(span_s=10, z_min=5.0, min_change=0.25)
    st = load_steps(counts, 1.0, rule)
    assert st["t_s"].tolist() == [100.0, 130.0]
    assert st["z"].tolist() == pytest.approx([100 / np.sqrt(300), -100 / np.sqrt(300)])
    assert st["dispersion"].tolist() == [1.0, 1.0]
    # a higher threshold than the jump's z finds nothing; so does a change below min_change
    assert load_steps(counts, 1.0, StepRule(span_s=10, z_min=6.0)).empty
    assert load_steps(counts, 1.0, StepRule(span_s=10, min_change=1.5)).empty
    short = np.r_[np.full(100, 10), np.full(5, 60), np.full(100, 10)]
    assert load_steps(short, 1.0, rule)["t_s"].tolist() == [100.0, 105.0]
    # the run's start and end (0 → 10 → 0) are no steps: boundaries need m windows of arrivals
    assert load_steps(np.r_[np.zeros(5), np.full(50, 10), np.zeros(5)], 1.0).empty


def test_poisson_counts_make_no_false_steps_and_find_a_real_one():
    """Poisson arrivals, the default rule (30-s spans, z ≥ 5): 1,000 constant-rate runs of 600
    1-s windows at 10 req/s give a false step in ≈ 0 of them (at most 540 boundaries ×
    P(|Z| ≥ 5) = 3.1e-4 per run); a 10 → 20 step (expected z = 300 / √900 = 10) is found in
    every run, within 3 windows of its time in ≥ 95 % of them (measured: 90 % within 1, 99 %
    within 3, at most 5 off)."""
    rng = np.random.default_rng(3)
    false = sum(len(load_steps(rng.poisson(10, 600), 1.0)) for _ in range(1000))
    assert false <= 2
    hits = []
    for _ in range(200):
        c = np.r_[rng.poisson(10, 300), rng.poisson(20, 300)]
        st = load_steps(c, 1.0)
        assert len(st) == 1
        hits.append(st["t_s"].iloc[0])
    off = np.abs(np.asarray(hits) - 300)
    assert np.mean(off <= 3) >= 0.95 and off.max() <= 8


def test_bursty_counts_raise_the_bar():
    """Gamma arrivals with CV 2 have per-window counts of dispersion ≈ 4: the rule scales z by
    √D, so a constant-rate bursty run makes few false steps where a Poisson z would make many."""
    rng = np.random.default_rng(5)
    false_scaled = false_poisson = 0
    for _ in range(100):
        gaps = rng.gamma(0.25, 0.4, 8000)  # mean 0.1 s, CV 2
        t = np.cumsum(gaps)
        c = np.bincount(t[t < 600].astype(int), minlength=600)
        false_scaled += len(load_steps(c, 1.0))
        false_poisson += _poisson_steps(c)
    assert false_scaled <= 3 and false_poisson > 10 * max(false_scaled, 1)


def _poisson_steps(c):
    """The same rule without the dispersion correction (D = 1)."""
    m, c = 30, np.asarray(c, float)
    cs = np.r_[0.0, np.cumsum(c)]
    k = np.arange(m, c.size - m + 1)
    a, b = cs[k] - cs[k - m], cs[k + m] - cs[k]
    z = (b - a) / np.sqrt(a + b)
    hit = (np.abs(z) >= 5) & (np.abs(b - a) / np.maximum(np.minimum(a, b), 1) >= 0.25)
    return int(hit.sum())


def test_cli_step_options(make_study, capsys):
    path, _ = _fifo_study(make_study)
    rc = main(["timeline", str(path), "--slo", "ttft_ms=1000", "--step-z", "5", "--step-span", "10s"])
    out = capsys.readouterr().out
    assert rc == 0 and "load step" in out and "SLO recovered 18 s after the fall" in out
    rc = main(["timeline", str(path), "--slo", "ttft_ms=1000", "--step-z", "-1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--step-z" in err and "Traceback" not in err


def test_a_demand_step_in_the_simulator_against_the_fluid_model(tmp_path):
    """One replica with deterministic service (fixed 128/64-token requests, batch ≤ 16) completes
    C requests a second when saturated; constant arrivals at 0.6 C step to 1.5 C over
    [120, 180 s). Fluid model: the queue grows at 0.5 C for 60 s to Q = 30 C (≈ 208); a request
    arriving x s into the step waits 0.5 x s, so with a TTFT limit of 5 s the SLO breaks
    10 s in; after the fall the queue drains at 0.4 C: empty 75 s later, and a request arriving
    y s after the fall waits 30 − 0.4 y s, good from y = 62.5 s — recovery at the window after,
    63 s (the prefill adds a few hundred ms)."""
    from conftest import fixed_service_raw

    from capplan.sim.config import parse_config
    from capplan.sim.demand import steps
    from capplan.sim.engine import OK
    from capplan.sim.events import token_times
    from capplan.sim.sweep import generate_study, simulate_level

    cfg = parse_config(fixed_service_raw(1, arrival="constant", timeout_s=300.0))
    res = simulate_level(cfg.with_(rates=(40.0,)), 40.0, duration_s=120.0)
    _, _, last, _, _ = token_times(res, False)
    done = last[res.status == OK]
    C = float(((done > 60 * S) & (done < 120 * S)).sum() / 60.0)
    dem = steps(0.6 * C, [(120.0, 1.5 * C), (180.0, 0.6 * C)])
    path, _ = generate_study(cfg.with_(rates=(dem.peak_rps,), duration_s=400.0, demand=dem),
                             tmp_path / "step", workers=1)
    tl = analyse_timeline(path, "ttft_ms=5000,attainment=0.99", window_s=1.0)
    assert tl.events[tl.events["event"] == "load_step"]["t_s"].tolist() == [120.0, 180.0]
    r = tl.incidents.iloc[0]
    assert r["kind"] == "load step" and r["fall_t_s"] == 180.0
    assert abs(r["queue_peak"] / (30 * C) - 1) < 0.05
    assert r["time_to_breach_s"] == pytest.approx(10.0, abs=1.0)
    assert 63.0 <= r["recover_after_fall_s"] <= 65.0
    assert abs(r["drain_after_fall_s"] / 75.0 - 1) < 0.03
