"""Per-request and per-run metrics against values computed by hand on tiny studies."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from capplan.contract import pct_col
from capplan.errors import StudyError
from capplan.metrics import (
    Window, breakdown, ecdf, insufficient_text, measured_rate_rps, request_frame, request_view,
    summarize,
)
from capplan.study import open_study
from conftest import ev

MS = 1_000_000


def hand_rows():
    """Run r1 (offered 10 rps, warm-up 1 s). Times in ms since the run's start."""
    return [
        ev("r1", "w0", scheduled_ms=500, ttft_ms=50, e2e_ms=60, output_tokens=2),  # warm-up
        # ok: ttft 200 (190 from sent), tpot (2100-1200)/9 = 100, e2e 1100
        ev("r1", "q1", scheduled_ms=1000, sent_ms=1010, ttft_ms=200, e2e_ms=1100, output_tokens=10,
           computed_input_tokens=20, itl_ns=[100 * MS] * 9),
        # ok: ttft 300, tpot (1600-1400)/4 = 50, e2e 500; itl p99 = 30+0.97*10 = 39.7, max 40
        ev("r1", "q2", scheduled_ms=1100, ttft_ms=300, e2e_ms=500, output_tokens=5,
           itl_ns=[10 * MS, 20 * MS, 30 * MS, 40 * MS]),
        # timed out after its first token: counted as started / first token, not completed
        ev("r1", "q3", scheduled_ms=1200, ttft_ms=300, e2e_ms=None, output_tokens=3, status="timeout"),
        ev("r1", "q4", scheduled_ms=1300, ttft_ms=None, e2e_ms=None, output_tokens=0, status="rejected"),
        # unfinished at the end of the run: never sent
        ev("r1", "q5", scheduled_ms=1400, ttft_ms=None, e2e_ms=None, output_tokens=0,
           status="cancelled", sent_ns=None),
        # ok with one output token: TPOT undefined (NULL), e2e 100
        ev("r1", "q6", scheduled_ms=1500, ttft_ms=100, e2e_ms=100, output_tokens=1),
        ev("r1", "q7", scheduled_ms=1600, ttft_ms=None, e2e_ms=None, output_tokens=0, status="error"),
    ]


@pytest.fixture
def hand_study(make_study):
    rows = hand_rows()
    for r in rows:
        if r["request_id"] == "q5":
            r["sent_ns"] = None
    return open_study(make_study(rows, runs=[{"run_id": "r1", "offered_rps": 10.0,
                                              "duration_s": 2.0, "warmup_s": 1.0}]))


def test_request_metrics_by_hand(hand_study):
    df = request_frame(hand_study, "r1").set_index("request_id")
    assert df.loc["q1", "ttft_ms"] == 200.0
    assert df.loc["q1", "ttft_sent_ms"] == 190.0
    assert df.loc["q1", "gen_lag_ms"] == 10.0
    assert df.loc["q1", "tpot_ms"] == 100.0
    assert df.loc["q1", "e2e_ms"] == 1100.0
    assert df.loc["q2", "tpot_ms"] == 50.0
    assert df.loc["q2", "itl_p99_ms"] == pytest.approx(39.7)
    assert df.loc["q2", "itl_max_ms"] == 40.0
    assert pd.isna(df.loc["q6", "tpot_ms"])  # one output token
    assert df.loc["q1", "computed_input_tokens"] == 20
    assert df.loc["q2", "computed_input_tokens"] == 100  # falls back to logical tokens
    assert not df.loc["w0", "in_window"] and df.loc["q1", "in_window"]
    assert list(df.index) == ["w0", "q1", "q2", "q3", "q4", "q5", "q6", "q7"]  # scheduled order


def test_funnel_rates_and_throughput_by_hand(hand_study):
    s = summarize(hand_study).run("r1")
    assert (s.n_offered, s.n_admitted, s.n_started, s.n_first_token, s.n_completed) == (7, 6, 4, 4, 3)
    assert (s.n_ok, s.n_rejected, s.n_timeout, s.n_error, s.n_cancelled) == (3, 1, 1, 1, 1)
    assert s.n_excluded_warmup == 1
    # measured offered rate: (7 − 1) / (1.6 s − 1.0 s) = 10 req/s
    assert s.measured_offered_rps == pytest.approx(10.0)
    assert s.rate_ratio == pytest.approx(1.0)
    # elapsed: first scheduled in window (1.0 s) to the last stamp (q1's last token, 2.1 s)
    assert s.elapsed_s == pytest.approx(1.1)
    assert s.achieved_rps == pytest.approx(3 / 1.1)
    assert s.output_tok_s == pytest.approx((10 + 5 + 1) / 1.1)
    assert s.total_tok_s == pytest.approx((300 + 16) / 1.1)
    assert s.total_computed_tok_s == pytest.approx((20 + 100 + 100 + 16) / 1.1)


def test_attainment_and_goodput_over_offered_and_admitted(hand_study):
    # TTFT ≤ 250 and TPOT ≤ 80: q1 fails TPOT (100), q2 fails TTFT (300), q6 passes (no TPOT).
    s = summarize(hand_study, "ttft_ms=250,tpot_ms=80,attainment=0.5").run("r1")
    assert s.n_good == 1
    assert s.n_violations == 6  # timeout, rejected, cancelled (unfinished), error included
    assert s.attainment_offered == pytest.approx(1 / 7)
    assert s.attainment_admitted == pytest.approx(1 / 6)
    assert s.goodput_rps == pytest.approx(1 / 1.1)
    assert s.error_rate == pytest.approx(4 / 7)
    assert not s.meets_slo
    s2 = summarize(hand_study, "ttft_ms=250,attainment=0.25").run("r1")
    assert s2.n_good == 2 and s2.attainment_offered == pytest.approx(2 / 7)
    assert bool(s2.meets_slo)
    s3 = summarize(hand_study, "ttft_ms=250,attainment=0.25,max_error_rate=0.5").run("r1")
    assert not s3.meets_slo  # attainment passes, error rate 4/7 > 0.5 does not


def test_ttft_from_sent_and_itl_limit(hand_study):
    # From sent, q1 has TTFT 190: passes a 195 ms limit that it fails from scheduled (200).
    assert summarize(hand_study, "ttft_ms=195").run("r1").n_good == 1  # only q6
    assert summarize(hand_study, "ttft_ms=195,ttft_from=sent").run("r1").n_good == 2
    # ITL p99 ≤ 39 ms: q2's p99 is 39.7 → bad; q1 (100 ms gaps) bad; q6 has no gaps → good.
    assert summarize(hand_study, "itl_ms=39").run("r1").n_good == 1
    # ITL max ≤ 100: q1 (max 100) and q2 (max 40) and q6 pass.
    assert summarize(hand_study, "itl_ms=100,itl_stat=max").run("r1").n_good == 3


def test_warmup_override(hand_study):
    assert summarize(hand_study, warmup_s=0).run("r1").n_offered == 8
    assert summarize(hand_study, warmup_s={"r1": 1.25}).run("r1").n_offered == 4  # q4..q7
    assert summarize(hand_study).run("r1").warmup_s == 1.0


def test_percentiles_type7_and_insufficient_samples(make_study):
    # 100 ok requests with TTFT 1..100 ms: type 7 p50 = 50.5, p90 = 1 + 0.9·99 = 90.1.
    rows = [ev("r2", f"q{i}", scheduled_ms=10 * i, ttft_ms=i + 1, e2e_ms=2 * (i + 1),
               output_tokens=1) for i in range(100)]
    st = open_study(make_study(rows, runs=[{"run_id": "r2", "offered_rps": 100.0}]))
    res = summarize(st)
    r = res.run("r2")
    assert r.ttft_n == 100
    assert r.ttft_p50_ms == pytest.approx(50.5)
    assert r.ttft_p90_ms == pytest.approx(90.1)
    assert r.e2e_p90_ms == pytest.approx(180.2)
    # p95 needs 130 samples (early stopping, t = 1): not printed, NaN in the frame
    assert math.isnan(r.ttft_p95_ms) and math.isnan(r.ttft_p99_ms) and math.isnan(r.ttft_p99_9_ms)
    text = res.to_text()
    assert "insufficient samples (N = 100, need 130)" in text
    assert "insufficient samples (N = 100, need 662)" in text
    assert "50.5" in text and "90.1" in text
    assert "p99.9" in r.notes and "need 130, 662, 6,636" in r.notes
    assert insufficient_text(100, 0.95) == "insufficient samples (N = 100, need 130)"
    # tpot: every request has one output token → no samples at all
    assert r.tpot_n == 0
    assert "insufficient samples (N = 0, need 11)" in res.display_frame("latency").iloc[0]["tpot_p50_ms"]


def test_pooled_itl_percentiles(make_study):
    # 20 requests × 10 gaps: gaps are 1..200 ms pooled; p50 = 100.5, p90 = 1 + 0.9·199 = 180.1
    rows = []
    for i in range(20):
        gaps = [(i * 10 + k + 1) * MS for k in range(10)]
        rows.append(ev("r1", f"q{i}", scheduled_ms=100 * i, ttft_ms=10, e2e_ms=2000,
                       output_tokens=11, itl_ns=gaps))
    st = open_study(make_study(rows))
    r = summarize(st).run("r1")
    assert r.itl_n == 200
    assert r.itl_p50_ms == pytest.approx(100.5)
    assert r.itl_p90_ms == pytest.approx(180.1)
    assert r.itl_p95_ms == pytest.approx(190.05)  # N = 200 ≥ 130: printed
    assert math.isnan(r.itl_p99_ms)  # needs 662


def test_manifest_runs_without_window_events_and_order(make_study):
    rows = [ev("b", "x", scheduled_ms=0), ev("a", "y", scheduled_ms=0)]
    st = open_study(make_study(rows, runs=[{"run_id": "b", "offered_rps": 1.0},
                                           {"run_id": "a", "offered_rps": 2.0, "warmup_s": 5}]))
    df = summarize(st, "ttft_ms=1000").to_frame()
    assert list(df.run_id) == ["b", "a"]  # manifest order
    a = df.set_index("run_id").loc["a"]
    assert a.n_offered == 0 and a.n_excluded_warmup == 1
    assert "no requests scheduled in the steady window" in a.notes
    assert pd.isna(a.attainment_offered) and pd.isna(a.meets_slo)


def test_events_of_unknown_run_are_not_dropped_silently(make_study):
    rows = [ev("r1", "a"), ev("ghost", "b")]
    st = open_study(make_study(rows, runs=[{"run_id": "r1", "offered_rps": 1.0}]))
    with pytest.raises(StudyError, match="1 events have a run_id that is not in study.yaml") as ei:
        summarize(st)
    assert "'ghost'" in ei.value.format()


def test_closed_loop_summary(make_study):
    rows = [ev("c8", f"q{i}", scheduled_ms=100 * i) for i in range(5)]
    st = open_study(make_study(rows, runs=[{"run_id": "c8", "concurrency": 8}], load_model="closed"))
    res = summarize(st)
    r = res.run("c8")
    assert r.concurrency == 8 and r.load_level == 8.0
    assert pd.isna(r.rate_ratio)
    assert r.measured_offered_rps == pytest.approx(4 / 0.4)
    assert "concurrency" in res.display_frame("funnel").columns


def test_summary_is_frozen_and_deterministic(hand_study):
    a = summarize(hand_study, "ttft_ms=250")
    b = summarize(hand_study, "ttft_ms=250")
    pd.testing.assert_frame_equal(a.to_frame(), b.to_frame())
    assert a.to_text() == b.to_text()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.slo = None  # type: ignore[misc]
    f = a.to_frame()
    f.loc[0, "n_offered"] = -1
    assert a.run("r1").n_offered == 7  # to_frame returns a copy


def test_breakdown_by_tenant_and_length_bucket(make_study):
    rows = [
        ev("r1", "a1", scheduled_ms=0, ttft_ms=100, input_tokens=100, tenant="acme"),
        ev("r1", "a2", scheduled_ms=10, ttft_ms=300, input_tokens=2000, tenant="acme"),
        ev("r1", "b1", scheduled_ms=20, ttft_ms=100, input_tokens=5000, tenant="bolt"),
        ev("r1", "b2", scheduled_ms=30, ttft_ms=None, e2e_ms=None, output_tokens=0,
           input_tokens=300, status="rejected", tenant="bolt"),
    ]
    st = open_study(make_study(rows))
    t = breakdown(st, "tenant", slo="ttft_ms=200").set_index("tenant")
    assert t.loc["acme", "n_offered"] == 2 and t.loc["acme", "n_good"] == 1
    assert t.loc["bolt", "attainment_offered"] == 0.5
    assert t.loc["acme", "ttft_p50_ms"] == 200.0  # type 7 median of 100 and 300
    b = breakdown(st, "input_tokens", edges=[256, 1024, 4096]).set_index("input_tokens_bucket")
    assert b["n_offered"].to_dict() == {"<256": 1, "256–1024": 1, "1024–4096": 1, "≥4096": 1}
    with pytest.raises(ValueError, match="choose one of"):
        breakdown(st, "request_id")


def test_ecdf_and_rate_helper():
    e = ecdf([3.0, None, 1.0, 2.0, float("inf")])
    assert list(e.value) == [1.0, 2.0, 3.0]
    assert list(e.cdf) == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert measured_rate_rps(11, 0, 5 * 10**9) == 2.0
    assert math.isnan(measured_rate_rps(1, 0, 0))


def test_request_view_keeps_its_contract(hand_study):
    name = request_view(hand_study, Window.of(hand_study))
    cols = [d[0] for d in hand_study.sql(f"SELECT * FROM {name} LIMIT 0").description]
    for c in ("ttft_ms", "ttft_sent_ms", "tpot_ms", "itl_p99_ms", "itl_max_ms", "e2e_ms",
              "gen_lag_ms", "queue_ms", "t_s", "in_window", "load_level", "offered_rps"):
        assert c in cols
    with pytest.raises(StudyError, match="not in study.yaml"):
        request_frame(hand_study, "nope")


def test_percentiles_match_numpy_type7_on_random_data(make_study):
    """Cross-check of the stated definition: numpy's 'linear' method is Hyndman & Fan type 7."""
    import numpy as np

    rng = np.random.default_rng(3)
    n = 7000  # ≥ 6,636: even p99.9 is printed
    sched = np.cumsum(rng.exponential(1e7, n)).astype("int64")
    ttft = rng.lognormal(np.log(2e8), 0.7, n).astype("int64")
    out = rng.integers(2, 300, n)
    tpot = rng.lognormal(np.log(3e7), 0.3, n)
    last = sched + ttft + (tpot * (out - 1)).astype("int64")
    df = pd.DataFrame({"run_id": "r1", "request_id": [f"q{i}" for i in range(n)],
                       "scheduled_ns": sched, "first_token_ns": sched + ttft, "last_token_ns": last,
                       "input_tokens": 100, "output_tokens": out, "status": "ok"})
    r = summarize(open_study(make_study(df, runs=[{"run_id": "r1", "offered_rps": 100.0}]))).run("r1")
    ttft_ms = ttft / 1e6
    tpot_ms = (last - sched - ttft) / 1e6 / (out - 1)
    for p in (0.5, 0.9, 0.95, 0.99, 0.999):
        assert r[pct_col("ttft", p)] == pytest.approx(np.quantile(ttft_ms, p, method="linear"), rel=1e-12)
        assert r[pct_col("tpot", p)] == pytest.approx(np.quantile(tpot_ms, p, method="linear"), rel=1e-9)
    assert r.notes == ""
    # measured offered rate is the interarrival estimator (N − 1) / span
    assert r.measured_offered_rps == pytest.approx((n - 1) / ((sched[-1] - sched[0]) / 1e9))
