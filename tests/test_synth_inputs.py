"""Synth inputs: arrival processes, joint lengths, trace replay, service-time model, config errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capplan.errors import SpecError
from capplan.sim import arrivals as A
from capplan.sim.config import parse_config, PRESETS
from capplan.sim.lengths import LengthDist
from capplan.sim.service import DEFAULT_SERVICE_MODEL, ServiceModel, fit_service_model

TRACES = Path(__file__).resolve().parents[2] / "shared/data/traces"


def _need(name: str) -> Path:
    p = TRACES / name
    if not p.is_file():
        pytest.skip(f"public trace {p} is absent (CI keeps ../shared/data/traces beside the checkout)")
    return p


@pytest.mark.parametrize("process,cv", [("constant", 0.0), ("poisson", 1.0), ("gamma", 2.0), ("gamma", 0.5)])
def test_arrival_rate_and_dispersion(process, cv):
    rng = np.random.default_rng(11)
    rate, dur = 50.0, 600.0
    t = A.arrival_times_ns(process, rate, dur, rng, cv=cv if cv > 0 else 1.0)
    assert t[0] == 0 and np.all(np.diff(t) >= 0) and t[-1] < dur * 1e9
    gaps = np.diff(t) / 1e9
    assert abs(len(t) / dur - rate) / rate < 0.03
    assert abs(gaps.mean() - 1 / rate) * rate < 0.03
    got_cv = gaps.std() / gaps.mean()
    if process == "constant":
        assert got_cv < 1e-6
    else:
        assert abs(got_cv - cv) / cv < 0.06, got_cv


def test_arrivals_reject_bad_rate():
    with pytest.raises(SpecError):
        A.arrival_times_ns("poisson", 0.0, 10.0, np.random.default_rng(0))
    with pytest.raises(SpecError):
        A.arrival_times_ns("gamma", 1.0, 10.0, np.random.default_rng(0), cv=0.0)


def test_lengths_are_joint_correlated_and_capped():
    d = LengthDist.from_dict({"input": {"median": 800, "sigma": 0.8, "min": 16, "max": 4000},
                              "output": {"median": 150, "sigma": 0.6, "min": 2, "max": 600}, "rho": 0.6})
    i, o = d.sample(50_000, np.random.default_rng(2))
    assert i.min() >= 16 and i.max() <= 4000 and o.min() >= 2 and o.max() <= 600
    assert abs(np.median(i) - 800) / 800 < 0.03 and abs(np.median(o) - 150) / 150 < 0.03
    r = np.corrcoef(np.log(i), np.log(o))[0, 1]
    assert 0.5 < r < 0.65  # clipping shrinks it a little
    i0, o0 = LengthDist.from_dict({"rho": 0.0}).sample(50_000, np.random.default_rng(2))
    assert abs(np.corrcoef(np.log(i0), np.log(o0))[0, 1]) < 0.03
    fi, fo = LengthDist.from_dict({"kind": "fixed", "input": 512, "output": 200}).sample(5, np.random.default_rng(0))
    assert fi.tolist() == [512] * 5 and fo.tolist() == [200] * 5


def _write_azure(path: Path, rows: list[tuple[str, int, int]]) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(f"{t},{a},{b}" for t, a, b in rows)
    path.write_text(text)  # no trailing newline, like the public file


def test_replay_small_azure_file_keeps_rows_and_hits_rate(tmp_path):
    rows = [("2023-11-16 18:17:03.9799600", 4808, 10), ("2023-11-16 18:17:04.0319600", 3180, 8),
            ("2023-11-16 18:17:05.0000001", 100, 200), ("2023-11-16 18:17:07.9799600", 50, 1)]
    p = tmp_path / "az.csv"
    _write_azure(p, rows)
    tr = A.load_trace(p)
    assert tr.n == 4 and tr.input_tokens.tolist() == [4808, 3180, 100, 50]
    assert tr.t_s[1] == pytest.approx(0.052, abs=1e-9)  # 7-decimal timestamps keep 100-ns precision
    # 4 rows over 4 s at 1 req/s: the whole trace, clock unchanged (row 4 would come one mean gap later)
    sched, i, o = A.replay_schedule(tr, rate_rps=1.0, duration_s=4.0)
    assert list(zip(i, o)) == [(r[1], r[2]) for r in rows]
    period = tr.span_s + 1 / tr.mean_rate_rps
    assert np.allclose(sched / 1e9, tr.t_s * 4.0 / period, atol=1e-9)
    # 6 rows in 2 s: the trace wraps; rows and their joint lengths repeat in order
    sched, i, o = A.replay_schedule(tr, rate_rps=3.0, duration_s=2.0)
    assert len(sched) == 6 and i.tolist() == [4808, 3180, 100, 50, 4808, 3180]
    assert sched[-1] < 2e9 and np.all(np.diff(sched) >= 0)


def test_replay_rejects_bad_trace(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nnot-a-time,1,2\n2023-11-16 18:17:04.0,3,4")
    with pytest.raises(SpecError) as e:
        A.load_trace(p)
    assert "TIMESTAMP" in e.value.format()
    with pytest.raises(SpecError):
        A.load_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize("name", ["AzureLLMInferenceTrace2023_code.csv", "AzureLLMInferenceTrace2023_conv.csv",
                                  "mooncake_conversation_trace.jsonl"])
def test_replay_public_trace_keeps_rows_and_rate(name):
    tr = A.load_trace(_need(name))
    n_expect = {"AzureLLMInferenceTrace2023_code.csv": 8819, "AzureLLMInferenceTrace2023_conv.csv": 19366,
                "mooncake_conversation_trace.jsonl": 12031}[name]
    assert tr.n == n_expect  # the last Azure line has no trailing newline: still read
    target = 40.0
    period = tr.n / target  # the whole trace once
    sched, i, o = A.replay_schedule(tr, target, period)
    assert len(sched) == tr.n and len(sched) / period == pytest.approx(target)
    # each replayed row keeps its own joint (input, output) pair, in trace order
    assert np.array_equal(i, tr.input_tokens) and np.array_equal(o, tr.output_tokens)
    # the burst shape is kept: the trace clock is only rescaled
    raw = tr.t_s / (tr.span_s + 1 / tr.mean_rate_rps)
    assert np.allclose(sched / 1e9 / period, raw, atol=1e-6)
    # two periods: the trace wraps and rows repeat
    s2, i2, _ = A.replay_schedule(tr, target, 2 * period)
    assert len(s2) == 2 * tr.n and np.all(np.diff(s2) >= 0) and np.array_equal(i2[tr.n:], tr.input_tokens)
    # any window, any start row: exactly round(rate × duration) rows, the target rate
    for start, dur in ((0, 60.0), (1234, 25.0), (tr.n - 3, 200.0)):
        s3, i3, o3 = A.replay_schedule(tr, 7.0, dur, start_row=start)
        assert len(s3) == round(7.0 * dur) and s3[-1] < dur * 1e9 and np.all(np.diff(s3) >= 0)
        rows = (start + np.arange(len(s3))) % tr.n
        assert np.array_equal(i3, tr.input_tokens[rows]) and np.array_equal(o3, np.maximum(tr.output_tokens[rows], 1))


def test_default_service_model_matches_refit_of_public_profile():
    m = fit_service_model(_need("splitwise_sim_perf_model.csv"), "llama2-70b", "h100-80gb", 4)
    assert m.decode_step_ms == DEFAULT_SERVICE_MODEL.decode_step_ms
    assert m.prefill_ms_per_token == pytest.approx(DEFAULT_SERVICE_MODEL.prefill_ms_per_token, rel=1e-6)
    assert 0.09 < m.prefill_ms_per_token < 0.13  # ≈ 0.11 ms/token
    assert m.step_ms(1) == pytest.approx(29.4, abs=0.5) and m.step_ms(64) == pytest.approx(52.0, abs=0.5)


def test_fit_service_model_on_own_csv_and_errors(tmp_path):
    rows = ["model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"]
    for b, step in ((1, 20.0), (8, 22.0), (32, 30.0)):
        for ps in (256, 1024):
            rows.append(f"m,g,{ps},{b},128,{step + 0.2 * ps * b:.4f},{step},2")
    p = tmp_path / "prof.csv"
    p.write_text("\n".join(rows) + "\n")
    m = fit_service_model(p, "m", "g", 2)
    assert m.decode_batch == (1, 8, 32) and m.prefill_ms_per_token == pytest.approx(0.2, rel=1e-6)
    with pytest.raises(SpecError) as e:
        fit_service_model(p, "m", "g", 8)
    assert "available" in e.value.format() and "m/g/TP2" in e.value.format()


def test_service_model_interpolates_and_extrapolates():
    m = ServiceModel((1, 64), (30.0, 50.0), 0.1, 5.0)
    assert m.step_ms(32.5) == pytest.approx(40.0)
    assert m.step_ms(128) == pytest.approx(50.0 + 64 * 20 / 63)
    assert m.iteration_ms(1, 0) == pytest.approx(30.0) and m.iteration_ms(1, 100) == pytest.approx(45.0)


@pytest.mark.parametrize("patch,field", [
    ({"replica": {"max_batch": 0}}, "replica.max_batch"),
    ({"replica": {"max_bath": 4}}, "replica.max_bath"),
    ({"sweep": {"rates": []}}, "sweep.rates"),
    ({"workload": {"arrival": {"process": "weibull"}}}, "workload.arrival.process"),
    ({"workload": {"arrival": {"process": "replay"}}}, "workload.arrival.path"),
    ({"replica": {"max_model_len": 100000}}, "replica.max_model_len"),
    ({"sweep": {"rates": [1], "duration_s": 10, "warmup_s": 20}}, "sweep.warmup_s"),
    ({"sweep": {"rates": [1, 50], "duration_s": None, "requests_per_run": 100, "warmup_s": 5}}, "sweep.warmup_s"),
    ({"sweep": {"rates": [1], "duration_s": 10, "requests_per_run": 100}}, "sweep"),
    ({"sweep": {"load_model": "closed", "concurrency": [0]}}, "sweep.concurrency[0]"),
    ({"workload": {"tenants": [{"name": "a"}, {"name": "a"}]}}, "workload.tenants"),
    ({"power": {"idle_w": 500, "busy_w": 100}}, "power.busy_w"),
    ({"sweep": {"rates": [1, -2]}}, "sweep.rates[1]"),
])
def test_bad_config_names_the_field(patch, field):
    raw = {**PRESETS["small"]}
    for k, v in patch.items():
        raw[k] = {**raw.get(k, {}), **v}
    with pytest.raises(SpecError) as e:
        parse_config(raw)
    assert e.value.field == field
