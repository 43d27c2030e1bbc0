"""The engine's recorded /metrics: scrape files read, placed on the runs' clocks, and the KV
pressure per run (preemptions with counter resets, peak KV usage, running / waiting) computed by
hand from tests/fixtures/engine_metrics (docs/engine-metrics.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from capplan import contract as C
from capplan import engine_metrics as E
from capplan.cli import main
from capplan.errors import StudyError
from capplan.metrics import summarize
from capplan.study import open_study
from conftest import ev

FIX = Path(__file__).resolve().parent / "fixtures" / "engine_metrics"
VLLM = FIX / "vllm_scrapes.prom"
LLAMA = FIX / "llamacpp_scrapes.prom"
R1_START_S, R2_START_S = 1_700_000_000, 1_700_000_100


@pytest.fixture
def sweep(make_study):
    """r1: 5 warm-up requests (5–9 s) and 50 steady ones (10–59 s), 1 s each: last stamp 60 s.
    r2: 20 requests every 3 s from 0, 3 s each: last stamp 60 s. Wall-clock starts as the
    vLLM fixture's scrapes assume."""
    rows = [ev("r1", f"a{i}", scheduled_ms=i * 1000, ttft_ms=100, e2e_ms=1000) for i in range(5, 60)]
    rows += [ev("r2", f"b{i}", scheduled_ms=i * 3000, ttft_ms=3000 if i < 4 else 100, e2e_ms=3000)
             for i in range(20)]
    return make_study(rows, runs=[
        {"run_id": "r1", "offered_rps": 1.0, "warmup_s": 10, "epoch_start_ns": R1_START_S * C.NS_PER_S},
        {"run_id": "r2", "offered_rps": 0.33, "epoch_start_ns": R2_START_S * C.NS_PER_S}])


def test_vllm_fixture_parsed_counters_and_gauges_kept():
    f = E.read_scrapes(VLLM)
    assert f.format == "text" and len(f.scrapes) == 8
    assert f.scrapes[0].t_epoch_ns == 1_700_000_005 * C.NS_PER_S
    assert f.scrapes[-1].t_epoch_ns == 1_700_000_150_500_000_000  # exact, no float rounding
    # the histogram's 4 samples and the _created gauge are left out and counted
    assert f.skipped == 5
    names = {s[0] for s in f.scrapes[0].samples}
    assert names == {"vllm:num_preemptions", "vllm:kv_cache_usage_perc",
                     "vllm:num_requests_running", "vllm:num_requests_waiting"}
    assert ("vllm:num_preemptions", 'engine="0",model_name="tiny"', "counter", 3.0) in f.scrapes[0].samples


def test_counter_increase_handles_a_reset():
    # 5 → 9 (+4), restart: 2 (+2, counted from 0), 2 → 6 (+4)
    assert E.counter_increase([5, 9, 2, 6]) == 10
    assert E.counter_increase([0, 0, 0]) == 0
    assert math.isnan(E.counter_increase([7]))


def test_preemptions_and_kv_peak_by_hand(sweep, capsys):
    assert main(["telemetry", "engine", str(VLLM), "--into", str(sweep)]) == 0
    out = capsys.readouterr().out
    # 8 scrapes: 5 in r1's span (5–58 s), the one at 70 s in no run, 2 in r2's
    assert "8 scrapes read" in out and "r1: 5, r2: 2" in out and "1 scrape(s) fall in no run" in out
    assert "preemptions from vllm:num_preemptions" in out
    written = pd.read_parquet(sweep / C.ENGINE_METRICS_DIR / "vllm_scrapes.parquet")
    assert list(written.columns) == [c.name for c in C.ENGINE_METRIC_COLUMNS]
    assert sorted(written[written.run_id == "r1"].t_ns.unique()) == [
        s * C.NS_PER_S for s in (5, 15, 30, 45, 58)]

    t = summarize(open_study(sweep), "ttft_ms=2000,attainment=0.99").to_frame().set_index("run_id")
    r1, r2 = t.loc["r1"], t.loc["r2"]
    # r1's steady window is 10–60 s: scrapes at 15, 30, 45, 58 s (the one at 5 s is warm-up).
    # counter 5, 9, 2 (restart), 6 → (9 − 5) + 2 + (6 − 2) = 10 over 50 requests = 200 per 1k
    assert r1.engine_scrapes == 4 and r1.preemptions == 10 and r1.n_offered == 50
    assert r1.preemptions_per_1k == pytest.approx(200.0)
    assert r1.kv_usage_peak == pytest.approx(0.85)  # not the 0.10 of the warm-up scrape
    assert (r1.running_peak, r1.waiting_peak) == (16, 3)
    # r2: two engines, summed: (4 − 1) + (2 − 0) = 5 over 20 requests; KV peak the fuller
    # engine (0.60, vLLM's older gpu_cache_usage_perc); running 3 + 5 = 8 at the first scrape
    assert r2.preemptions == 5 and r2.preemptions_per_1k == pytest.approx(250.0)
    assert r2.kv_usage_peak == pytest.approx(0.60) and r2.running_peak == 8
    assert r2.attainment_offered == pytest.approx(16 / 20)
    assert r1.engine_note == "" and r2.engine_note == ""


def test_summarize_text_shows_preemptions_beside_attainment(sweep, capsys):
    main(["telemetry", "engine", str(VLLM), "--into", str(sweep)])
    capsys.readouterr()
    assert main(["summarize", str(sweep), "--slo", "ttft_ms=2000,attainment=0.99"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("Engine metrics (the engine's own /metrics"):].split("\n\n")[0].splitlines()
    assert block[1].split() == ["run_id", "offered_rps", "requests", "attain_offered", "scrapes",
                                "preemptions", "preempt_per_1k", "kv_peak", "running_peak",
                                "waiting_peak"]
    assert block[2].split() == ["r1", "1", "50", "1.0000", "4", "10", "200.0", "85.0%", "16", "3"]
    assert block[3].split() == ["r2", "0.33", "20", "0.8000", "2", "5", "250.0", "60.0%", "8", "0"]


def test_not_recorded_when_the_study_has_no_engine_metrics(sweep, capsys):
    t = summarize(open_study(sweep)).to_frame()
    assert t["preemptions"].isna().all() and t["kv_usage_peak"].isna().all()
    assert set(t["engine_note"]) == {"not recorded (no engine_metrics/ in the study)"}
    main(["summarize", str(sweep)])
    assert "Engine metrics: not recorded (no engine_metrics/ in the study)" in capsys.readouterr().out


def test_llama_server_fixture_parsed_and_placed(make_study, capsys):
    """The real llama-server's /metrics (recorded by record_llama.py): this build exports no
    preemption counter and no KV-usage gauge, so both read "not recorded"; requests waiting
    for a slot (requests_deferred) and in a slot (requests_processing) are read."""
    f = E.read_scrapes(LLAMA)
    assert f.format == "text" and len(f.scrapes) == 11 and f.skipped == 0
    first, peak = f.scrapes[0], f.scrapes[1]
    assert ("llamacpp:n_decode", "", "counter", 0.0) in first.samples
    assert ("llamacpp:requests_deferred", "", "gauge", 4.0) in peak.samples
    decodes = [v for s in f.scrapes for m, _, _, v in s.samples if m == "llamacpp:n_decode"]
    assert E.counter_increase(decodes) == decodes[-1] == 289
    t0 = f.scrapes[0].t_epoch_ns
    span_ms = (f.scrapes[-1].t_epoch_ns - t0) / 1e6
    rows = [ev("r1", f"q{i}", scheduled_ms=i * 100.0, ttft_ms=50, e2e_ms=span_ms - i * 100.0)
            for i in range(6)]
    study = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 10.0}])
    assert main(["telemetry", "engine", str(LLAMA), "--into", str(study),
                 "--run-start", f"r1={t0 // C.NS_PER_S}.{t0 % C.NS_PER_S:09d}"]) == 0
    out = capsys.readouterr().out
    assert "r1: 11" in out and "kv_usage not recorded" in out and "waiting from llamacpp:requests_deferred" in out
    r = summarize(open_study(study)).to_frame().iloc[0]
    assert r.engine_scrapes == 11 and r.waiting_peak == 4 and r.running_peak == 2
    assert math.isnan(r.preemptions) and math.isnan(r.kv_usage_peak)
    assert "preemptions not recorded" in r.engine_note and "kv_usage not recorded" in r.engine_note


def test_jsonl_and_aiperf_formats(tmp_path):
    text = VLLM.read_text().split("# scrape at 1700000015.0\n")[1].split("# scrape at")[0]
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps({"t": 1700000015.25, "text": text}) + "\n")
    f = E.read_scrapes(p)
    assert f.format == "jsonl" and f.scrapes[0].t_epoch_ns == 1_700_000_015_250_000_000
    assert ("vllm:kv_cache_usage_perc", 'engine="0",model_name="tiny"', "gauge", 0.40) in f.scrapes[0].samples
    # AIPerf's server_metrics_export.jsonl (its SlimRecord fields, written here by hand): family
    # names without _total, histogram samples with buckets
    a = tmp_path / "server_metrics_export.jsonl"
    a.write_text(json.dumps({
        "endpoint_url": "http://x/metrics", "timestamp_ns": 1_700_000_015_000_000_000,
        "endpoint_latency_ns": 1000,
        "metrics": {"vllm:num_preemptions": [{"labels": {"model_name": "m"}, "value": 4.0}],
                    "vllm:kv_cache_usage_perc": [{"labels": {"model_name": "m"}, "value": 0.5}],
                    "vllm:e2e_request_latency_seconds": [
                        {"labels": {"model_name": "m"}, "buckets": {"1.0": 3}, "sum": 2.0, "count": 3}]},
    }) + "\n")
    g = E.read_scrapes(a)
    assert g.format == "aiperf" and g.skipped == 1
    assert set(g.scrapes[0].samples) == {("vllm:num_preemptions", 'model_name="m"', "counter", 4.0),
                                         ("vllm:kv_cache_usage_perc", 'model_name="m"', "untyped", 0.5)}


@pytest.mark.parametrize("content, line, words", [
    ("vllm:x 1\n", 1, "starts with '# scrape at"),
    ("# scrape at 1700000000\nvllm:x 1\n# scrape at soon\nvllm:x 2\n", 3, "not a number"),
    ("# scrape at 1700000000\nvllm:x 1\nvllm:y{a=\"1\" 2\n", 3, "not Prometheus text format"),
    ("# scrape at 12.5\nvllm:x 1\n", 1, "not a wall-clock"),
    ('{"t": 1700000000, "text": "a 1\\n"}\n{"t": 1700000001, "text": \n', 2, "invalid JSON"),
    ('{"time": 1700000000}\n', 1, "'t' and 'text'"),
])
def test_bad_files_exit_2_naming_file_and_line(tmp_path, sweep, capsys, content, line, words):
    p = tmp_path / "bad.prom"
    p.write_text(content)
    with pytest.raises(StudyError) as exc:
        E.read_scrapes(p)
    assert f"line {line}:" in str(exc.value) and words in str(exc.value)
    assert main(["telemetry", "engine", str(p), "--into", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and f"line {line}:" in err and "Traceback" not in err


def test_missing_file_and_unplaceable_runs_exit_2(tmp_path, make_study, sweep, capsys):
    assert main(["telemetry", "engine", str(tmp_path / "none.prom"), "--into", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "engine metrics file not found" in err and "none.prom" in err
    # a study whose runs have no wall-clock start, and no --run-start
    plain = make_study([ev("r1", "q1")])
    assert main(["telemetry", "engine", str(VLLM), "--into", str(plain)]) == 2
    err = capsys.readouterr().err
    assert "have no epoch_start_ns" in err and "--run-start" in err and "study.yaml" in err
    assert main(["telemetry", "engine", str(VLLM), "--into", str(plain), "--run-start", "r1=soon"]) == 2
    assert "expected RUN=<epoch seconds>" in capsys.readouterr().err
    # scrapes of another sweep: none inside a run
    assert main(["telemetry", "engine", str(VLLM), "--into", str(plain),
                 "--run-start", "r1=1800000000"]) == 2
    assert "none of the 8 scrapes falls inside a run" in capsys.readouterr().err


def test_two_endpoints_are_two_series_not_one(sweep, tmp_path):
    """Two replicas export the same labels; their scrapes interleave in time. Read as one
    series the counter would seem to reset at every step; kept apart it rose 10 and 1."""
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text("".join(f"# scrape at {1_700_000_000 + t}\nvllm:num_preemptions_total {v}\n"
                         "vllm:num_requests_waiting 2\n" for t, v in ((20, 0), (40, 10))))
    b.write_text("".join(f"# scrape at {1_700_000_000 + t}\nvllm:num_preemptions_total {v}\n"
                         "vllm:num_requests_waiting 5\n" for t, v in ((25, 100), (45, 101))))
    assert main(["telemetry", "engine", str(a), str(b), "--into", str(sweep)]) == 0
    r1 = summarize(open_study(sweep)).to_frame().set_index("run_id").loc["r1"]
    assert r1.preemptions == 11 and r1.engine_scrapes == 4
    assert r1.waiting_peak == 5  # the highest scrape of either endpoint


def test_aiperf_import_records_the_runs_wall_clock_start():
    """AIPerf stamps requests in epoch ns: the run's clock 0 (its first credit) is kept as
    epoch_start_ns, which is what places the engine's scrapes on the run's clock."""
    from capplan.importers import import_paths

    src = FIX.parent / "aiperf" / "artifacts" / "rate_3.0" / "profile_export.jsonl"
    res = import_paths("aiperf", [src])
    first = min(json.loads(ln)["metadata"]["credit_issued_ns"]
                for ln in src.read_text().splitlines()
                if ln.strip() and json.loads(ln)["metadata"].get("benchmark_phase") != "warmup")
    assert res.manifest["runs"][0]["epoch_start_ns"] == first


def test_a_real_aiperf_server_metrics_export_placed_on_its_run(make_study, capsys):
    """AIPerf 0.13's own JSON lines of llama-server's /metrics (README.md beside the fixture):
    the run started at epoch 1796168025.909798993 s and its last stamp was 21.299266026 s, so
    11 of the 14 scrapes fall in it (the baseline before the run and the two after are out)."""
    src = FIX / "aiperf_server_metrics_export.jsonl"
    f = E.read_scrapes(src)
    assert f.format == "aiperf" and len(f.scrapes) == 14
    end_ns = 21_299_266_026
    rows = [ev("rate_2.0", "q0", scheduled_ms=0.0, ttft_ms=100, e2e_ms=200),
            ev("rate_2.0", "q1", scheduled_ms=end_ns / 1e6 - 1000, ttft_ms=100, e2e_ms=1000)]
    study = make_study(rows, runs=[{"run_id": "rate_2.0", "offered_rps": 3.0,
                                    "epoch_start_ns": 1_796_168_025_909_798_993}])
    assert main(["telemetry", "engine", str(src), "--into", str(study)]) == 0
    out = capsys.readouterr().out
    assert "14 scrapes read from 1 file(s) (aiperf); rate_2.0: 11" in out
    assert "3 scrape(s) fall in no run's span" in out
    r = summarize(open_study(study)).to_frame().iloc[0]
    # deferred 3, 5, 6, 9, 8, 13, 11, 10, 8, 6, 5 and processing 2 throughout the window
    assert r.engine_scrapes == 11 and r.waiting_peak == 13 and r.running_peak == 2
    m = E.read(study)
    decodes = m[m.metric == "llamacpp:n_decode"].sort_values("t_ns")["value"]
    assert E.counter_increase(decodes) == 566 - 39


def test_pressure_says_why_a_figure_is_not_recorded():
    rows = [("r1", 5, "vllm:num_preemptions", "", "counter", 3.0, "a"),
            ("r1", 5, "vllm:num_requests_waiting", "", "gauge", 2.0, "a"),
            ("r2", 1, "vllm:num_preemptions", "", "counter", 1.0, "a")]
    m = pd.DataFrame(rows, columns=["run_id", "t_ns", "metric", "labels", "kind", "value", "source"])
    p = E.pressure(m, {"r1": (0, 10), "r2": (2, 10), "r3": (0, 10)},
                   {"r1": 10, "r2": 10, "r3": 10}).set_index("run_id")
    assert p.loc["r1", "engine_scrapes"] == 1 and math.isnan(p.loc["r1", "preemptions"])
    assert "preemptions not recorded (one scrape in the steady window)" in p.loc["r1", "engine_note"]
    assert p.loc["r1", "waiting_peak"] == 2 and "kv_usage not recorded" in p.loc["r1", "engine_note"]
    assert p.loc["r2", "engine_note"] == "not recorded (no scrape in the steady window)"  # at 1 < 2
    assert p.loc["r3", "engine_note"] == "not recorded (no scrape in the steady window)"


def test_an_unreadable_engine_metrics_file_exits_2(sweep, capsys):
    bad = sweep / C.ENGINE_METRICS_DIR / "broken.parquet"
    bad.parent.mkdir()
    bad.write_bytes(b"not parquet")
    assert main(["summarize", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "broken.parquet" in err and "not readable parquet" in err and "Traceback" not in err
