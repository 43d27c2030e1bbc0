"""The twin fitted to a server it did not generate (issue 26): the queueing replica of
tests/realtools (32 slots held from prefill start to last token, ONE prefill lane at
30 + 0.5·prompt ms, decode steps of 20 + 2·batch ms), its study written by the replica's
independent simulation (tests/realtools/truth_study.py: exact stamps, no admission stamps —
what a load tool records), never by capplan.sim. Real AIPerf runs against the served replica
are in benchmarks/twin_realtools.py (docs/twin.md has the table)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capplan.twin import fit_twin
from capplan.twin.data import load_study
from capplan.twin.slots_fit import lanes_from_data, slots_from_data, slots_from_engine, slots_from_manifest
from capplan.twin.timeline import _grid, build_timeline, step_tolerance_ns
from tests.realtools.params import EngineParams
from tests.realtools.truth_study import truth_events, uniform_prompts, write_truth_study

RATES = (4.0, 8.0, 10.0, 12.0, 14.0)
PROMPTS = uniform_prompts(16, 112)


@pytest.fixture(scope="module")
def replica_study(tmp_path_factory):
    return write_truth_study(tmp_path_factory.mktemp("replica") / "s", RATES, duration_s=40.0,
                             prompt_tokens=PROMPTS, seed=3)


@pytest.fixture(scope="module")
def replica_twin(replica_study):
    return fit_twin(replica_study, reps=40)


def test_replica_slots_lane_and_service_curve_recovered(replica_twin):
    tw = replica_twin
    p = EngineParams()
    assert tw.source["method"].startswith("server path")
    assert tw.value("max_batch") == p.slots and tw.param("max_batch").source == "estimated"
    assert "a slot limit of 32 held them back" in tw.param("max_batch").how
    assert tw.value("prefill_mode") == "separate"
    assert tw.value("prefill_lanes") == 1 and "one prefill at a time" in tw.param("prefill_lanes").how
    assert tw.value("prefill_ms_per_token") == pytest.approx(p.prefill_ms_per_token, rel=0.02)
    assert tw.value("prefill_overhead_ms") == pytest.approx(p.prefill_base_ms, rel=0.02)
    for n in (1, 4, 16, 32):
        assert tw.service.step_ms(n) == pytest.approx(p.decode_step_ms(n), rel=0.01), n
    # exact stamps: no noise around the curve
    assert tw.value("decode_noise_cv") < 0.01


def test_slots_seen_hand_case(make_study):
    """By hand: 3 sequences decode from 100 to 1000 ms while a 4th request (arrived at 1 ms,
    first token at 1100 ms) queues from 1 ms + quick (3 × the 10 % quantile of TTFT = 300 ms)."""
    ms = 1_000_000
    rows = []
    for i in range(3):
        rows.append(dict(run_id="r1", request_id=f"a{i}", scheduled_ns=0, first_token_ns=100 * ms,
                         last_token_ns=1000 * ms, input_tokens=10, output_tokens=10, status="ok"))
    rows.append(dict(run_id="r1", request_id="w", scheduled_ns=1 * ms, first_token_ns=1100 * ms,
                     last_token_ns=2000 * ms, input_tokens=10, output_tokens=10, status="ok"))
    path = make_study(rows)
    seen = slots_from_data(load_study(path))
    # queued 301 → 1100 ms: 0.699 s with 3 decoding, 0.1 s with none; 0.8 s is too little to judge
    assert seen.value is None and "too little" in seen.how
    assert dict(seen.hist) == pytest.approx({3: 0.699, 0: 0.1})


def test_engine_config_then_manifest_then_a_stated_default(tmp_path):
    """At light load no slot limit binds: the engine's own configuration names it, else
    study.yaml, else the default with a note — never silently."""
    light = (2.0, 3.0)
    a = fit_twin(write_truth_study(tmp_path / "a", light, duration_s=30.0,
                                   system={"engine_config": {"args": "llama-server -m m.gguf -np 16 -c 32768"}}), reps=20)
    assert a.value("max_batch") == 16 and a.param("max_batch").source == "engine config"
    assert "llama.cpp -np 16" in a.param("max_batch").how and "do not show it binding" in a.param("max_batch").how
    b = fit_twin(write_truth_study(tmp_path / "b", light, duration_s=30.0, system={"max_batch": 24}), reps=20)
    assert b.value("max_batch") == 24 and b.param("max_batch").source == "manifest"
    c = fit_twin(write_truth_study(tmp_path / "c", light, duration_s=30.0), reps=20)
    assert c.value("max_batch") == 256 and c.param("max_batch").source in ("default", "lower bound")
    assert any("max batch:" in n and "set your engine's limit" in n for n in c.notes)
    # where the data show the limit binding they win, and a different configured value is said
    d = fit_twin(write_truth_study(tmp_path / "d", (10.0, 14.0), duration_s=30.0,
                                   system={"engine_config": {"max_num_seqs": 64}}), reps=20)
    assert d.value("max_batch") == 32 and d.param("max_batch").source == "estimated"
    assert any("the twin trusts the data" in n and "64" in n for n in d.notes)
    assert slots_from_engine({"engine_config": {"max_num_seqs": 48}})[0] == 48
    assert slots_from_engine({"engine_metrics": {"total_slots": 8}})[0] == 8
    assert slots_from_engine({"engine_config": {"args": ["vllm", "serve", "--max-num-seqs=64"]}})[0] == 64
    assert slots_from_engine({"engine_config": {"max_num_seqs": "lots"}}) is None
    assert slots_from_manifest({"slots": 12})[0] == 12


def test_lanes_tell_one_lane_from_several(replica_study):
    """With the true prefill line the single lane's computations never overlap; a line twice as
    long makes them overlap (as several lanes would)."""
    d = load_study(replica_study)
    one = lanes_from_data(d, lambda p: 30 + 0.5 * p)
    assert one.value == 1 and one.overlap_share == 0.0 and one.pairs >= 30
    many = lanes_from_data(d, lambda p: 2.5 * (30 + 0.5 * p))
    assert many.value >= 2


def test_grouping_never_merges_two_tokens_of_a_stream():
    t = np.array([0, 10, 20, 30], np.int64)
    rid = np.array([1, 1, 2, 2])
    T, cid = _grid(t, 100, rid)  # all within the tolerance, but each stream twice
    assert cid.tolist() == [0, 1, 1, 2]
    assert step_tolerance_ns(np.array([1, 1, 1]), np.array([0, 10_000_000, 20_000_000])) == 2_000_000
    assert step_tolerance_ns(np.array([1, 1]), np.array([0, 100_000])) == 200_000  # the floor


def test_stamps_spread_over_a_millisecond_still_show_the_grid(tmp_path):
    """A server that writes one iteration's tokens over ≈ 1 ms (llama.cpp on a CPU): with a
    fixed 200 µs the grid falls apart; the tolerance scaled to the step keeps it, and the
    decode curve and noise term come out right."""
    p = EngineParams(slots=16)
    ev = pd.concat([truth_events(f"r{k}", r, 30.0, p, seed=5, prompt_tokens=PROMPTS) for k, r in enumerate((6.0, 9.0))],
                   ignore_index=True)
    rng = np.random.default_rng(0)
    stamps = [np.cumsum(np.r_[f, g]) for f, g in zip(ev["first_token_ns"], ev["itl_ns"])]
    jit = [s + rng.integers(0, 1_000_000, len(s)) for s in stamps]
    jit = [np.maximum.accumulate(s) for s in jit]
    ev["first_token_ns"] = [int(s[0]) for s in jit]
    ev["last_token_ns"] = [int(s[-1]) for s in jit]
    ev["itl_ns"] = [np.diff(s).tolist() for s in jit]
    from capplan.io import manifest_dict, write_study

    runs = [{"run_id": "r0", "offered_rps": 6.0}, {"run_id": "r1", "offered_rps": 9.0}]
    path = write_study(tmp_path / "j", manifest_dict("jittered", runs), ev)
    d = load_study(path)
    fixed = build_timeline(d, tol_ns=200_000)
    scaled = build_timeline(d)
    assert fixed.coherence_decode < 0.6  # iterations split into several grid points
    assert scaled.sharing > 0.95 and scaled.coherence_decode > 0.9 and scaled.tol_ms[0] > 1.0
    tw = fit_twin(path, reps=20)
    assert tw.source["method"].startswith("server path") and "grouped within" in tw.source["method"]
    for n in (2, 8):
        assert tw.service.step_ms(n) == pytest.approx(p.decode_step_ms(n), rel=0.05), n
    # uniform jitter of 1 ms on both ends of a step: SD = 1 ms / √6 ≈ 0.41 ms over 24–36 ms steps
    assert 0.005 < tw.value("decode_noise_cv") < 0.03


@pytest.mark.slow
def test_check_on_the_replica_catches_a_slower_decode_and_reports_the_users_envelope(replica_study, replica_twin):
    """The fitted twin agrees with the replica (its lane now starts a prompt the moment it frees,
    as the replica's does); one whose decode is 30 % slower disagrees; the check's measured
    C_SLO is the one `capplan envelope` gives."""
    from capplan.envelope import fit_envelope

    slo = "ttft_ms=1000,tpot_ms=80,attainment=0.95"
    fitted = replica_twin.check(replica_study, slo, replays=4, reps=50, steady=False)
    assert fitted.verdict == "agrees", fitted.where
    slow = replica_twin.scaled(decode=1.3).check(replica_study, slo, replays=4, reps=50, steady=False)
    assert slow.verdict == "disagrees"
    env = fit_envelope(replica_study, slo, reps=50, seed=0)
    assert slow.cslo["measured"]["estimate"] == pytest.approx(env.cslo.estimate)
    assert "capplan envelope" in slow.cslo["measured"]["kind"]
    # a slower curve is a bias, not noise: exact stamps scatter nothing around it, so the check
    # blames the twin's TPOT, not contention
    assert slow.cslo["decode_noise"]["cv"] < 0.01
    assert any(w.startswith("TPOT p50") for w in slow.where)
    assert not any(w.startswith("contention") for w in slow.where)


@pytest.mark.slow
def test_check_names_contention_with_the_dispersion_it_measured(tmp_path):
    """Contention by hand: the replica's clock is stretched at random moments (a busy CPU
    stalls every stream at once, ≈ 10 stalls a second of 15 ms on average), so steps vary far
    beyond the batch curve. The fit reports the noise; the check measures it against the twin's
    curve and, where it disagrees, names contention with that dispersion."""
    from capplan.io import manifest_dict, write_study

    rng = np.random.default_rng(7)
    frames, runs = [], []
    for k, r in enumerate((6.0, 10.0, 13.0)):
        ev = truth_events(f"r{k}", r, 30.0, EngineParams(), seed=11, prompt_tokens=PROMPTS)
        horizon = int(60e9)
        at = np.sort(rng.integers(0, horizon, rng.poisson(10 * 60)))
        extra = np.cumsum(rng.exponential(15e6, len(at))).astype(np.int64)

        def warp(t):
            i = np.searchsorted(at, t, side="right")
            return t + np.where(i > 0, extra[np.maximum(i - 1, 0)], 0)

        stamps = [warp(np.cumsum(np.r_[f, g])) for f, g in zip(ev["first_token_ns"], ev["itl_ns"])]
        ev["first_token_ns"] = [int(s[0]) for s in stamps]
        ev["last_token_ns"] = [int(s[-1]) for s in stamps]
        ev["itl_ns"] = [np.diff(s).tolist() for s in stamps]
        frames.append(ev)
        runs.append({"run_id": f"r{k}", "offered_rps": r, "duration_s": 30.0, "warmup_s": 0.0})
    path = write_study(tmp_path / "busy", manifest_dict("busy", runs), pd.concat(frames, ignore_index=True))
    tw = fit_twin(path, reps=20)
    assert tw.value("decode_noise_cv") > 0.1
    chk = tw.check(path, "ttft_ms=1000,tpot_ms=80,attainment=0.95", replays=4, reps=50, steady=False)
    noise = chk.cslo["decode_noise"]
    assert noise["cv"] > 0.1 and set(noise["by_run"]) == {"r0", "r1", "r2"}
    assert any(n.startswith("decode noise:") and f"CV {noise['cv']:.3f}" in n for n in chk.notes)
    if chk.verdict == "disagrees":
        assert any(w.startswith("contention") and f"CV {noise['cv']:.2f}" in w for w in chk.where)


@pytest.mark.parametrize("lanes", [1, 3, None])
def test_lanes_recovered_where_they_are_known(lanes, tmp_path):
    """A simulated server with separate prefill on a known number of lanes (capplan.sim):
    prompts complete every prefill / lanes while they queue; without a lane limit no prompt
    waits for another and none is claimed."""
    from capplan.sim.sweep import generate_study
    from tests.test_twin_fit import small_cfg

    cfg = small_cfg(replica={"prefill": "separate", "prefill_lanes": lanes,
                             "service_model": {"decode_step_ms": {1: 20.0, 64: 40.0}, "prefill_ms_per_token": 0.3,
                                               "prefill_overhead_ms": 30.0}},
                    sweep={"rates": [2.0, 6.0, 10.0, 14.0], "duration_s": 40.0})
    path, _ = generate_study(cfg, tmp_path / "s", workers=1)
    tw = fit_twin(path, reps=20)
    assert tw.value("prefill_mode") == "separate"
    assert tw.value("prefill_lanes") == lanes


def test_chunked_replica_server_is_its_truth(tmp_path):
    """The chunked-prefill variant of the replica (no lane: prompts computed inside the decode
    iterations) serves what its truth simulates, on the server's own arrival stamps."""
    import asyncio
    import json
    import time

    from tests.realtools import queue_truth as qt
    from tests.realtools.client import open_loop
    from tests.realtools.queue_server import start_subprocess, stop_subprocess

    p = EngineParams(slots=4, prefill_lane="chunked", time_scale=0.5)
    # by hand: alone, one iteration computes the prompt with a batch of one: 22 + 30 + 0.5 · 64
    tr = qt.simulate([0.0], 64, 3, EngineParams(prefill_lane="chunked"))
    assert (tr.token_times_s(0) * 1e3).tolist() == pytest.approx([84.0, 106.0, 128.0])
    log = tmp_path / "log.jsonl"
    url, proc = start_subprocess(p, log_jsonl=str(log))
    try:
        offsets = qt.poisson_arrivals(8.0, 4.0, np.random.default_rng(3))
        _, res = asyncio.run(open_loop(url, offsets, prompt=" ".join(["word"] * 64), max_tokens=12))
        assert all(r.status == "ok" and len(r.chunk_s) == 12 for r in res)
        deadline = time.monotonic() + 10.0
        while len(log.read_text().splitlines()) < len(offsets) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop_subprocess(proc)
    rows = sorted((json.loads(x) for x in log.read_text().splitlines()), key=lambda r: r["arrival_s"])
    arr = np.array([r["arrival_s"] for r in rows])
    tr = qt.simulate(arr, [r["prompt_tokens"] for r in rows], [r["output_tokens"] for r in rows], p)
    for key, mine in (("prefill_start_s", tr.prefill_start_s), ("first_token_s", tr.first_token_s),
                      ("last_token_s", tr.last_token_s)):
        theirs = np.array([r[key] for r in rows])
        assert np.max(np.abs(theirs - mine)) < 1e-4, key
    assert tr.ttft_ms.max() > 2 * (p.decode_step_ms(1) + p.chunk_ms(64))  # requests queued


@pytest.mark.slow
def test_chunked_replica_identified_and_agreed_with(tmp_path):
    """Prompts chunked into the decode iterations: the twin sees mixed prefill (no lanes), the
    prefill line from the iterations that computed prompts (no admission stamps needed), the
    decode curve, and agrees with the runs."""
    from tests.realtools.params import CHUNKED

    path = write_truth_study(tmp_path / "c", (1.0, 2.0, 3.0, 4.0, 5.0, 6.0), duration_s=40.0, params=CHUNKED,
                             prompt_tokens=PROMPTS, seed=2)
    tw = fit_twin(path, reps=30)
    assert tw.value("prefill_mode") == "mixed" and tw.value("prefill_lanes") is None
    assert "chunks inside the decode iterations" in tw.param("prefill_lanes").how
    assert tw.value("prefill_ms_per_token") == pytest.approx(0.5, rel=0.02)
    assert tw.value("prefill_overhead_ms") == pytest.approx(30.0, rel=0.02)
    for n in (1, 4, 16):
        assert tw.service.step_ms(n) == pytest.approx(CHUNKED.decode_step_ms(n), rel=0.01)
    chk = tw.check(path, "ttft_ms=1000,tpot_ms=80,attainment=0.95", replays=4, reps=50, steady=False)
    assert chk.verdict == "agrees", chk.where
    assert tw.scaled(decode=1.3).check(path, "ttft_ms=1000,tpot_ms=80,attainment=0.95", replays=4, reps=50,
                                       steady=False).verdict == "disagrees"
