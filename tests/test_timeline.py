"""capplan.timeline on small studies: the per-window figures equal a pandas computation, the
per-event figures equal hand-computed values (and a pandas computation of the same
definitions), derived events, the CLI and the figure."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from capplan import contract as C
from capplan.cli import main
from capplan.sketch import histogram, quantile_from_counts
from capplan.timeline import analyse_timeline, decision_counts, replica_series, step_integral

S = C.NS_PER_S
MS = C.NS_PER_MS


def frame(sched_s, *, ttft_s, e2e_s=None, status=None, admitted_s=None, replica=None, run="r1"):
    """Event rows from arrays (seconds from the run's start; NaN = not stamped)."""
    n = len(sched_s)
    sched = np.round(np.asarray(sched_s) * S).astype(np.int64)

    def stamp(x):
        x = np.broadcast_to(np.asarray(x, float), (n,))
        return pd.array([None if math.isnan(v) else int(s + round(v * S)) for s, v in zip(sched, x)],
                        dtype="Int64")

    ttft = np.broadcast_to(np.asarray(ttft_s, float), (n,))
    e2e = ttft + 0.5 if e2e_s is None else np.broadcast_to(np.asarray(e2e_s, float), (n,))
    df = pd.DataFrame({
        "run_id": run, "request_id": [f"{run}-{i:06d}" for i in range(n)], "scheduled_ns": sched,
        "sent_ns": sched, "first_token_ns": stamp(ttft), "last_token_ns": stamp(e2e),
        "input_tokens": 100, "output_tokens": np.where(np.isnan(ttft), 0, 20),
        "status": "ok" if status is None else status})
    if admitted_s is not None:
        df["admitted_ns"] = stamp(admitted_s)
    if replica is not None:
        df["replica_group"] = replica
    return df


# ----------------------------------------------------------------------------- windows


def _random_study(make_study):
    rng = np.random.default_rng(7)
    n = 700
    sched = np.sort(rng.uniform(0, 60, n))
    status = rng.choice(["ok", "rejected", "timeout", "error"], n, p=[0.85, 0.05, 0.05, 0.05])
    ttft = np.where(status == "ok", rng.lognormal(np.log(0.8), 0.6, n), np.nan)
    wait = np.where(status == "ok", ttft * rng.uniform(0.1, 0.9, n), np.nan)
    df = frame(sched, ttft_s=ttft, e2e_s=ttft + 1.0, status=status, admitted_s=wait,
               replica=np.where(np.arange(n) % 2, "a", "b"))
    tl = [{"run_id": "r1", "t_ns": 20 * S, "event": "replica_failed", "replica": "b"},
          {"run_id": "r1", "t_ns": 25 * S, "event": "replica_added", "replica": "c"},
          {"run_id": "r1", "t_ns": int(31.5 * S), "event": "replica_ready", "replica": "c"}]
    path = make_study(df, runs=[{"run_id": "r1", "offered_rps": 11.7, "duration_s": 60}],
                      timeline=tl, workload={"client": {"timeout_s": 5.0}})
    return path, df


def test_windows_equal_a_pandas_computation(make_study):
    path, df = _random_study(make_study)
    tl = analyse_timeline(path, "ttft_ms=1500,attainment=0.9", window_s=2.0, derive=False)
    w = tl.to_frame()
    d = df.copy()
    d["win"] = d["scheduled_ns"] // (2 * S)
    ttft_ms = (d["first_token_ns"].astype(float) - d["scheduled_ns"]) / MS
    d["good"] = (d["status"] == "ok") & (ttft_ms <= 1500)
    g = d.groupby("win")
    exp = pd.DataFrame({"offered": g.size(), "good": g["good"].sum(),
                        "rejected": g["status"].apply(lambda s: (s == "rejected").sum()),
                        "timed_out": g["status"].apply(lambda s: (s == "timeout").sum()),
                        "errors": g["status"].apply(lambda s: (s == "error").sum())})
    got = w.set_index("window").loc[exp.index]
    for c in exp.columns:
        assert (got[c].to_numpy() == exp[c].to_numpy()).all(), c
    assert (got["admitted"] == exp["offered"] - exp["rejected"]).all()
    np.testing.assert_allclose(got["goodput_rps"], exp["good"] / 2.0)
    np.testing.assert_allclose(got["attainment"], exp["good"] / exp["offered"])
    assert (got["in_breach"] == (exp["good"] / exp["offered"] < 0.9)).all()
    # waiting: [scheduled, admitted) for served requests; a timeout without stamps waits its
    # client's 5 s; rejected and errors do not wait — brute force on a 1 ms grid
    s = d["scheduled_ns"].to_numpy()
    e = d["admitted_ns"].astype(float).to_numpy().copy()
    run_end = int(np.nanmax(d[["first_token_ns", "last_token_ns"]].astype(float).to_numpy()))
    to = d["status"].to_numpy() == "timeout"
    e[to] = np.minimum(s[to] + 5 * S, run_end)
    keep = ~np.isnan(e)
    s, e = s[keep], e[keep].astype(np.int64)
    grid = np.arange(0, 2 * S * len(w), MS)
    cnt = np.searchsorted(np.sort(s), grid, "right") - np.searchsorted(np.sort(e), grid, "right")
    area = np.bincount(grid // (2 * S), weights=cnt, minlength=len(w)) * MS / S
    np.testing.assert_allclose(w["waiting_area_req_s"], area[: len(w)], atol=2 * 0.001 * 5)
    np.testing.assert_allclose(w["waiting_mean"], w["waiting_area_req_s"] / 2.0)
    assert (w["waiting_peak"].to_numpy() == np.maximum.reduceat(cnt, np.arange(0, cnt.size, 2000))[: len(w)]).all()
    # replicas ready: a and b from the start, b failed at 20 s, c ready at 31.5 s
    rr = w.set_index("window")["replicas_ready"]
    assert rr[9] == 2 and rr[10] == 1 and rr[15] == 1.25 and rr[16] == 2
    prov = w.set_index("window")["replicas_provisioned"]
    assert (prov[12], prov[13]) == (1.5, 2)  # c provisioning from 25 s


def test_window_p99_follows_the_sample_rule_and_the_sketch(make_study):
    rng = np.random.default_rng(3)
    sched = np.r_[np.sort(rng.uniform(0, 4, 700)), np.sort(rng.uniform(4, 8, 600))]
    ttft = rng.lognormal(np.log(0.5), 0.5, sched.size)
    path = make_study(frame(sched, ttft_s=ttft), runs=[{"run_id": "r1", "offered_rps": 40.0}])
    w = analyse_timeline(path, "ttft_ms=2000", window_s=4.0).to_frame()
    assert w["ttft_n"].tolist()[:2] == [700, 600]
    assert math.isnan(w["ttft_p99_ms"][1])  # 600 < 662 (early stopping, t = 1): not shown
    k0, counts = histogram(ttft[:700] * 1000)
    assert w["ttft_p99_ms"][0] == pytest.approx(float(quantile_from_counts(counts, k0, 0.99)))
    srt = np.sort(ttft[:700] * 1000)
    assert srt[-9] * 0.99 <= w["ttft_p99_ms"][0] <= srt[-6] * 1.01


# ----------------------------------------------------------------------------- incidents


def _failure_study(make_study):
    """10 req/s exactly for 200 s, w = 1 s. Requests scheduled in [100, 120) wait 4.8 s and
    get their first token after 5 s (bad); all others wait 0.05 s, first token at 0.2 s."""
    sched = np.arange(2000) / 10.0
    bad = (sched >= 100) & (sched < 120)
    df = frame(sched, ttft_s=np.where(bad, 5.0, 0.2), admitted_s=np.where(bad, 4.8, 0.05),
               replica=np.where(np.arange(2000) % 2, "a", "b"))
    tl = [{"run_id": "r1", "t_ns": 100 * S, "event": "replica_failed", "replica": "b"},
          {"run_id": "r1", "t_ns": 100 * S, "event": "fault_injected", "group": "zone-b",
           "detail": "power cut"},
          {"run_id": "r1", "t_ns": 101 * S, "event": "replica_added", "replica": "c"},
          {"run_id": "r1", "t_ns": 119 * S, "event": "replica_ready", "replica": "c"}]
    return make_study(df, runs=[{"run_id": "r1", "offered_rps": 10.0, "duration_s": 200}],
                      timeline=tl), df


def test_failure_incident_by_hand(make_study):
    path, df = _failure_study(make_study)
    tl = analyse_timeline(path, "ttft_ms=1000,attainment=0.99", window_s=1.0, recover_windows=5,
                          pre_s=60, derive=False)
    assert len(tl.incidents) == 1
    r = tl.incidents.iloc[0]
    assert r["kind"] == "failure" and r["events"] == 4 and "zone-b" in r["what"]
    assert r["pre_goodput_rps"] == pytest.approx(10.0) and r["pre_attainment"] == 1.0
    assert r["pre_waiting"] == pytest.approx(0.5)
    assert r["time_to_breach_s"] == 0.0
    assert r["breach_s"] == pytest.approx(20.0) and r["time_to_recover_s"] == pytest.approx(20.0)
    assert r["recovered"] and r["breached"]
    assert r["queue_peak"] == 48 and r["queue_peak_t_s"] == pytest.approx(104.7)
    # back at the pre-event level (95th percentile of 1 waiting at window ends, + 1 = 2) in
    # window 124: 8 waiting at 124 s, 1 at 125 s → crossed 2 at 124 + 6/7 s
    drain_end = 124 + 6 / 7
    assert r["drain_s"] == pytest.approx(drain_end - 104.7)
    assert r["good_lost"] == pytest.approx(200.0)  # the 200 late requests, impact to 125 s
    assert r["ready_time_max_s"] == pytest.approx(18.0)
    # the same definitions computed with pandas from the raw rows
    d = df.assign(s=df["scheduled_ns"] / S, e=df["admitted_ns"].astype(float) / S)
    t = np.arange(100_000, 124_000) / 1000.0  # 1 ms grid up to window 124
    cnt = (d["s"].to_numpy()[None, :] <= t[:, None]).sum(1) - (d["e"].to_numpy()[None, :] <= t[:, None]).sum(1)
    last = d[(d["s"] >= 124) & (d["s"] < 125)]
    w124 = ((d["e"].clip(upper=125) - d["s"].clip(lower=124)).clip(lower=0)).sum()
    assert r["queue_area_req_s"] == pytest.approx(cnt.sum() / 1000 + 6 / 7 * w124, rel=2e-3)
    assert len(last) == 10
    good = (d["first_token_ns"].astype(float) - d["scheduled_ns"]) / MS <= 1000
    assert r["good_lost"] == 10 * 25 - good[(d["s"] >= 100) & (d["s"] < 125)].sum()


def test_good_requests_lost_count_from_t_minus_the_guard(make_study):
    """10 req/s for 200 s, every request served in 2.5 s (first token 0.2 s) — except those
    scheduled in [97.5, 100 s): in flight when the replica fails at 100 s, they are lost. The
    guard g is the p99 E2E, 2.5 s, in whole 1-s windows: 3 s. The baseline ends at t − g = 97 s
    (goodput 10/s, untouched) and the loss counts from the window holding 97 s: the 25 lost
    requests — counted from t, none would be, all sent before the event."""
    sched = np.arange(2000) / 10.0
    lost = (sched >= 97.5) & (sched < 100)
    df = frame(sched, ttft_s=np.where(lost, np.nan, 0.2), e2e_s=np.where(lost, np.nan, 2.5),
               status=np.where(lost, "error", "ok"), replica=np.where(np.arange(2000) % 2, "a", "b"))
    tl = [{"run_id": "r1", "t_ns": 100 * S, "event": "replica_failed", "replica": "b"}]
    path = make_study(df, runs=[{"run_id": "r1", "offered_rps": 10.0, "duration_s": 200}],
                      timeline=tl)
    r = analyse_timeline(path, "ttft_ms=1000,attainment=0.99", window_s=1.0, pre_s=60,
                         derive=False).incidents.iloc[0]
    assert r["pre_goodput_rps"] == pytest.approx(10.0)  # [37, 97): before the victims
    assert r["good_lost"] == pytest.approx(25.0)  # 5 in window 97, 10 in 98, 10 in 99
    assert not r["breached"]  # the windows from t on are all good: the loss is before t


def _scale_study(make_study):
    """10 req/s for 300 s on a, b, c; capacity 4 req/s per replica ⇒ 3 needed. The autoscaler
    asks for 5 at 100 s (d ready at 160 s, e at 190 s) and back to 3 at 250 s (d and e drain
    and are removed at 260 s). GPUs per replica: 4."""
    sched = np.arange(3000) / 10.0
    df = frame(sched, ttft_s=0.2, admitted_s=0.05, replica=np.array(["a", "b", "c"])[np.arange(3000) % 3])
    ev = lambda t, e, **k: {"run_id": "r1", "t_ns": int(t * S), "event": e, **k}  # noqa: E731
    tl = [ev(100, "scale_decision", desired=5, ready=3, signal="queue_work", signal_value=12.0,
             rate_rps=10.0, queue_work_s=3.0),
          ev(100, "replica_added", replica="d"), ev(100, "replica_added", replica="e"),
          ev(160, "replica_ready", replica="d"), ev(190, "replica_ready", replica="e"),
          ev(130, "scale_decision", desired=5, ready=3),  # no change: not an incident
          ev(250, "scale_decision", desired=3, ready=5), ev(250, "replica_draining", replica="d"),
          ev(250, "replica_draining", replica="e"), ev(260, "replica_removed", replica="d"),
          ev(260, "replica_removed", replica="e")]
    return make_study(df, runs=[{"run_id": "r1", "offered_rps": 10.0, "duration_s": 300}], timeline=tl,
                      system={"gpu": "H100", "gpus_per_replica": 4, "tp": 4, "pp": 1, "replicas": 3})


def test_scale_incidents_by_hand(make_study):
    tl = analyse_timeline(_scale_study(make_study), "ttft_ms=1000", window_s=1.0, capacity_rps=4.0,
                          rate_smooth_s=1.0)
    inc = tl.incidents
    assert inc["kind"].tolist() == ["scale out", "scale in"]
    a, b = inc.iloc[0], inc.iloc[1]
    assert (a["desired_from"], a["desired_to"], b["desired_from"], b["desired_to"]) == (3, 5, 5, 3)
    assert a["replicas_added"] == 2 and a["ready_time_mean_s"] == 75 and a["ready_time_max_s"] == 90
    # overshoot: 5 provisioned against 3 needed for 150 s, × 4 GPUs / 3600; then 2 extra
    # while draining for 10 s
    assert a["overshoot_gpu_h"] == pytest.approx(2 * 150 * 4 / 3600)
    assert b["overshoot_gpu_h"] == pytest.approx(2 * 10 * 4 / 3600)
    assert math.isnan(a["decision_delay_s"])  # the need never exceeded the ready replicas
    assert b["decision_delay_s"] == pytest.approx(250 - 160)  # 4 ready > 3 needed from 160 s
    assert not a["breached"]
    w = tl.to_frame().set_index("window")
    assert (w.loc[100, "replicas_provisioned"], w.loc[100, "replicas_ready"]) == (5, 3)
    assert w.loc[255, "replicas_ready"] == 3 and w.loc[255, "replicas_provisioned"] == 5
    s = tl.summary_frame().iloc[0]
    assert (s["scale_decisions"], s["reversals"]) == (2, 1)
    assert s["overshoot_gpu_h"] == pytest.approx((300 + 20) * 4 / 3600)
    assert "desired 3 → 5" in tl.to_text()


def test_decision_counts():
    assert decision_counts([3, 4, 4, 5, 4, 5, 5, 3], 3) == (5, 3)
    assert decision_counts([], 2) == (0, 0)


def test_step_integral_and_anonymous_replicas():
    t = np.array([0.0, 10.0, 15.0])
    v = np.array([2.0, 1.0, 3.0])
    assert step_integral(t, v, np.array([5.0, 12.0, 20.0])).tolist() == [10.0, 22.0, 40.0]
    ev = pd.DataFrame({"run_id": "r1", "t_s": [5.0, 6.0, 9.0, 9.0], "replica": [None] * 4,
                       "event": ["replica_failed", "replica_added", "replica_ready", "replica_draining"]})
    rs = replica_series("r1", ev, [], manifest_replicas=3)
    assert rs.t_s.tolist() == [0.0, 5.0, 6.0, 9.0]
    assert rs.ready.tolist() == [3, 2, 2, 2] and rs.provisioned.tolist() == [3, 2, 3, 3]


def test_events_derived_from_the_requests(make_study):
    # b serves until 50 s and its last requests fail; c first serves at 70 s
    sched = np.arange(1000) / 10.0
    rep = np.where(np.arange(1000) % 2, "a", "b")
    rep[(sched >= 50) & (rep == "b")] = "c"
    rep[(sched >= 50) & (sched < 70) & (rep == "c")] = "a"
    status = np.where((sched >= 49) & (sched < 50) & (rep == "b"), "error", "ok")
    ttft = np.where(status == "ok", 0.2, np.nan)
    df = frame(sched, ttft_s=ttft, status=status, replica=rep)
    path = make_study(df, runs=[{"run_id": "r1", "offered_rps": 10.0}])
    tl = analyse_timeline(path, "ttft_ms=1000", window_s=1.0)
    ev = tl.events
    assert ev["source"].tolist() == ["derived", "derived"]
    f = ev[ev["event"] == "replica_failed"].iloc[0]
    assert f["replica"] == "b" and f["t_s"] == pytest.approx(48.8 + 0.7)
    r = ev[ev["event"] == "replica_ready"].iloc[0]
    assert r["replica"] == "c" and r["t_s"] == pytest.approx(70.0 + 0.2)
    assert any("derived" in n for n in tl.notes)
    # a recorded event explains the silence: nothing derived for b
    tl2 = analyse_timeline(make_study(df, runs=[{"run_id": "r1", "offered_rps": 10.0}], timeline=[
        {"run_id": "r1", "t_ns": 49 * S, "event": "replica_failed", "replica": "b"}]), "ttft_ms=1000")
    assert tl2.events[tl2.events["replica"] == "b"]["source"].tolist() == ["recorded"]


# ----------------------------------------------------------------------------- surfaces


def test_cli_writes_tables_text_and_an_offline_figure(make_study, tmp_path, capsys):
    path, _ = _failure_study(make_study)
    out = tmp_path / "tl"
    rc = main(["timeline", str(path), "--slo", "ttft_ms=1000,attainment=0.99", "--window", "1s",
               "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "Incident 1 at 100.0 s — failure" in text and "good requests lost" in text
    names = sorted(p.name for p in out.iterdir())
    assert names == ["events.csv", "incidents.csv", "summary.csv", "timeline-r1.html", "timeline.txt",
                     "windows.csv"]
    html = (out / "timeline-r1.html").read_text()
    assert not re.search(r"<script[^>]+src=", html)  # plotly.js is inside: draws offline
    w = pd.read_csv(out / "windows.csv")
    assert len(w) == 201 and w["offered"].sum() == 2000


def test_cli_bad_input_exit_2(make_study, capsys):
    path, _ = _failure_study(make_study)
    assert main(["timeline", str(path)]) == 2  # no SLO anywhere
    assert "needs an SLO" in capsys.readouterr().err
    assert main(["timeline", str(path), "--slo", "ttft_ms=1000", "--window", "-1s"]) == 2
    assert main(["timeline", str(path), "--slo", "ttft_ms=1000", "--run", "r2"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--run" in err


def test_figure_marks_events_and_breaches(make_study):
    path, _ = _failure_study(make_study)
    tl = analyse_timeline(path, "ttft_ms=1000", window_s=1.0)
    fig = tl.figure()
    names = {t.name for t in fig.data}
    assert {"offered", "goodput (SLO-good)", "attainment", "ready", "replica failed",
            "fault injected"} <= names
    assert any(s.type == "rect" for s in fig.layout.shapes)


def test_a_study_without_system_events_says_so_first(make_study, capsys):
    """No timeline/ table and no silent replica: the text says plainly that there is no event
    and what would produce one, before the per-run lines; a study with events does not."""
    rng = np.random.default_rng(3)
    sched = np.sort(rng.uniform(0, 30, 150))
    path = make_study(frame(sched, ttft_s=0.3), runs=[{"run_id": "r1", "offered_rps": 5, "duration_s": 30}])
    tl = analyse_timeline(path, "ttft_ms=1000,attainment=0.99", window_s=1.0)
    assert len(tl.events) == 0 and tl.headline.startswith("No system events")
    assert "no timeline/ table" in tl.headline and "capplan twin run" in tl.headline
    text = tl.to_text()
    assert text.index("No system events") < text.index("Run r1:")
    assert "No system events" not in tl.to_text(headline=False)  # the page says it once, above
    assert main(["timeline", str(path), "--slo", "ttft_ms=1000,attainment=0.99"]) == 0
    assert "No system events" in capsys.readouterr().out
    path2, _ = _failure_study(make_study)
    tl2 = analyse_timeline(path2, "ttft_ms=1000,attainment=0.99", window_s=1.0, derive=False)
    assert len(tl2.events) and tl2.headline == "" and "No system events" not in tl2.to_text()
