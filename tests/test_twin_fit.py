"""Fitting a twin: estimators against known generating values, the client path, fallbacks said
out loud, and twin.yaml (round trip, edits, bad input)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from capplan.errors import SpecError, StudyError
from capplan.sim.config import PRESETS, parse_config
from capplan.sim.sweep import generate_study
from capplan.twin import fit_twin, load_twin, twin_to_yaml, write_twin
from capplan.twin.data import load_study
from capplan.twin.limits_fit import nice_in, stalled
from capplan.twin.service_fit import hat_basis, knots_for
from capplan.twin.timeline import DECODE, PREFILL, build_timeline

SERVICE = {"decode_step_ms": {1: 20.0, 16: 24.0, 64: 40.0}, "prefill_ms_per_token": 0.08, "prefill_overhead_ms": 3.0}


def small_cfg(**patch):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS["small"].items()}
    raw["replica"] = {**raw["replica"], "service_model": SERVICE, "token_budget": 512}
    raw["sweep"] = {"load_model": "open", "rates": [1.0, 4.0, 8.0, 14.0], "duration_s": 60.0, "warmup_s": 5.0}
    raw["power"] = None
    for k, v in patch.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return parse_config(raw)


@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    path, _ = generate_study(small_cfg(), tmp_path_factory.mktemp("twin") / "small", workers=1)
    return path


@pytest.fixture(scope="module")
def small_twin(small_study):
    return fit_twin(small_study, reps=50)


def test_timeline_rebuilds_iterations_exactly(small_study):
    """Decode-only iterations last exactly the decode step of their batch; prefill iterations
    exactly step + overhead + ms/token × prompt tokens (µs rounding aside)."""
    from capplan.sim.service import ServiceModel

    sm = ServiceModel.from_dict(SERVICE)
    tl = build_timeline(load_study(small_study))
    assert tl.coherence > 0.99 and tl.sharing > 0.99 and tl.first_on_grid > 0.99
    d = tl.kind == DECODE
    assert d.sum() > 500
    np.testing.assert_allclose(tl.dur_ns[d] / 1e6, sm.step_ms(tl.n_dec[d]), atol=2e-3)
    p = (tl.kind == PREFILL) & (tl.prefill_tokens + tl.n_dec <= 512)
    assert p.sum() > 20
    want = sm.step_ms(tl.n_dec[p] + tl.n_first[p]) + 3.0 + 0.08 * tl.prefill_tokens[p]
    np.testing.assert_allclose(tl.dur_ns[p] / 1e6, want, atol=2e-3)


def test_fit_recovers_generating_service_and_limits(small_twin):
    tw = small_twin
    assert tw.source["method"].startswith("server path")
    assert tw.value("prefill_mode") == "mixed"
    assert tw.value("prefill_ms_per_token") == pytest.approx(0.08, rel=0.01)
    assert tw.value("prefill_overhead_ms") == pytest.approx(3.0, abs=0.05)
    for n, ms in ((1, 20.0), (16, 24.0), (32, 24.0 + 16 * 16 / 48)):
        assert tw.service.step_ms(n) == pytest.approx(ms, rel=0.01)
    assert tw.value("token_budget") == 512
    assert tw.value("client_timeout_s") == 30.0
    assert tw.replicas == 1
    # the 95 % interval of an exact (noise-free) parameter is tight around it
    lo, hi = tw.param("prefill_ms_per_token").ci95
    assert lo <= 0.0801 and hi >= 0.0799 and hi - lo < 1e-3
    assert {t.name for t in tw.workload.tenants} == {"acme", "globex"}
    assert tw.workload.arrival.process == "poisson"


def test_max_batch_and_kv_capacity_when_they_bind(tmp_path):
    """A tiny KV cache makes requests wait with room in the batch: the fit brackets its size;
    a small batch that fills up is read as the batch limit."""
    cfg = small_cfg(replica={"kv_blocks": 700, "max_batch": 12, "max_model_len": 4096},
                    workload={"arrival": {"process": "poisson"},
                              "lengths": {"kind": "lognormal", "input": {"median": 500, "sigma": 0.5, "min": 16,
                                                                         "max": 2048},
                                          "output": {"median": 100, "sigma": 0.5, "min": 2, "max": 512}, "rho": 0.3}},
                    sweep={"rates": [2.0, 6.0, 10.0]})
    path, _ = generate_study(cfg, tmp_path / "kv", workers=1)
    tw = fit_twin(path, reps=30)
    true_tokens = (700 - int(0.01 * 700)) * 16
    kv = tw.param("kv_capacity_tokens")
    assert kv.source == "estimated"
    assert kv.value == pytest.approx(true_tokens, rel=0.1)
    assert tw.value("max_batch") == 12 and tw.param("max_batch").source == "estimated"


def test_client_path_without_server_stamps_says_what_falls_back(small_study, tmp_path):
    """Only client timings: decode and prefill come from regressions on TTFT/TPOT, and every
    parameter that needs server stamps is a stated default, named in the notes and twin.yaml."""
    import pyarrow.parquet as pq

    from capplan.io import write_study

    st = load_study(small_study)
    tables = {p.name: pq.read_table(p).drop_columns(["itl_ns", "admitted_ns", "prefill_start_ns",
                                                      "replica_group", "server_received_ns"])
              for p in (Path(small_study) / "events").glob("*.parquet")}
    man = yaml.safe_load((Path(small_study) / "study.yaml").read_text())
    man["workload"] = {}
    path = write_study(tmp_path / "client", man, tables)
    tw = fit_twin(path, reps=30)
    assert tw.source["method"].startswith("client path")
    notes = " ".join(tw.notes)
    assert "missing itl_ns, admitted_ns" in notes
    for key in ("kv_capacity_tokens", "token_budget"):
        assert tw.param(key).source == "default", key
    # the batch never filled up (the generating 64 sequences are far above what ran): the most
    # seen decoding together is a lower bound, the twin uses the stated default, and says so
    mb = tw.param("max_batch")
    assert mb.source in ("lower bound", "default") and mb.value == 256
    assert "no fixed limit held them back" in mb.how or "too little" in mb.how
    assert "max batch:" in notes and "set your engine's limit" in notes
    text = twin_to_yaml(tw)
    assert "source: default" in text and "missing itl_ns" in text
    # decode at light load is still close to the generating 20 ms; the prompt shares the batch
    assert tw.service.step_ms(1) == pytest.approx(20.0, rel=0.1)
    assert tw.value("prefill_mode") == "mixed"
    assert st.has("itl_ns")


def test_study_without_token_times_is_refused_with_a_clear_message(make_study):
    from tests.conftest import ev

    rows = [ev(scheduled_ms=i * 100.0, ttft_ms=None, e2e_ms=None, status="error", output_tokens=0) for i in range(20)]
    path = make_study(rows)
    with pytest.raises(StudyError) as e:
        fit_twin(path)
    msg = e.value.format()
    assert "first_token_ns" in msg and "fix:" in msg


def test_twin_yaml_round_trip_edits_and_errors(small_twin, tmp_path):
    p = tmp_path / "twin.yaml"
    write_twin(small_twin, p)
    back = load_twin(p)
    assert twin_to_yaml(back) == twin_to_yaml(small_twin)
    assert back.edited == ()
    raw = yaml.safe_load(p.read_text())
    raw["parameters"]["max_batch"]["value"] = 32
    raw["decode_step_ms"]["points"][1]["value"] = 26.0
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    ed = load_twin(p)
    assert ed.value("max_batch") == 32 and ed.replica_params().max_batch == 32
    assert set(ed.edited) == {"max_batch", "decode_step_ms[1]"}
    assert ed.service.step_ms(1) == 26.0
    raw["parameters"]["queue_limit"]["value"] = "many"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(SpecError) as e:
        load_twin(p)
    assert e.value.field == "parameters.queue_limit.value" and e.value.file == str(p)
    raw["parameters"]["queue_limit"]["value"] = None
    raw["parameters"]["bogus"] = {"value": 1}
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(SpecError, match="unknown parameter"):
        load_twin(p)


def test_same_study_and_seed_give_the_same_twin_file(small_study, small_twin):
    assert twin_to_yaml(fit_twin(small_study, reps=50)) == twin_to_yaml(small_twin)


def test_stall_is_an_overtaken_request_not_a_queue():
    """Request 1 never got a token while request 2, sent after it, was served at once: a stall.
    Request 4 waited behind a busy server and timed out: not a stall."""
    from capplan.twin.data import CANCELLED, OK, TIMEOUT, RunArrays

    ms = 1_000_000
    sched = np.array([0, 100, 200, 300, 400]) * ms
    first = np.array([40, -1, 240, 5000, -1]) * ms
    first[first < 0] = -1
    status = np.array([OK, TIMEOUT, OK, OK, CANCELLED], np.int8)
    run = RunArrays("r", 1.0, None, 1.0, 0, sched, sched, first, first + 10 * ms, np.full(5, 10), np.full(5, 3),
                  status, np.full(5, -1), np.full(5, -1), np.full(5, -1), None, None, None)
    st = stalled(run, wait_s=1.0, quick_ns=60 * ms)
    assert st.tolist() == [False, True, False, False, False]
    assert not stalled(run, 1.0, 60 * ms, single_queue=False).any()


def test_nice_value_and_knots():
    assert nice_in(59.98, 60.07) == 60
    assert nice_in(1.87, 2.3) == 2
    assert nice_in(0.123, 0.124) == pytest.approx(0.123, abs=1e-3)
    k = knots_for(np.arange(1, 100), np.full(99, 50))
    assert k.tolist() == [1, 2, 4, 8, 16, 32, 64, 99]
    B = hat_basis(np.array([1, 3, 99]), k)
    assert B.sum(axis=1).tolist() == [1.0, 1.0, 1.0] and B[1, 1] == 0.5
