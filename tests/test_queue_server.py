"""The queueing replica (tests/realtools/queue_server.py) and its ground truth
(tests/realtools/queue_truth.py): the truth simulator against hand-computed cases, the server
against the model, and the two against each other on the same arrival times — the evidence
that the truth's C_SLO is the server's true capacity."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from tests.realtools import queue_truth as qt
from tests.realtools.client import open_loop, stream_request
from tests.realtools.params import SMALL, EngineParams, count_prompt_tokens
from tests.realtools.queue_server import start_in_thread, start_subprocess, stop_subprocess

P = EngineParams()
PROMPT64 = " ".join(["word"] * 64)


# --- the truth simulator, by hand ---------------------------------------------------------

def test_one_request_alone():
    tr = qt.simulate([0.0], 64, 32, P)
    assert tr.ttft_ms[0] == pytest.approx(30 + 0.5 * 64)            # prefill only
    assert tr.tpot_ms[0] == pytest.approx(20 + 2 * 1)                # batch of one
    assert tr.e2e_ms[0] == pytest.approx(62 + 31 * 22)


def test_second_simultaneous_request_waits_for_the_first_prefill():
    tr = qt.simulate([0.0, 0.0], 64, 3, P)
    assert tr.ttft_ms.tolist() == pytest.approx([62.0, 124.0])
    # request 0 decodes alone from 62: iterations end at 84 and 106 (its 2 decode tokens);
    # request 1 joins at 124 (lane idle again), alone: 146, 168
    assert (tr.last_token_s * 1e3).tolist() == pytest.approx([106.0, 168.0])


def test_join_waits_for_the_running_iteration_and_batch_step():
    # r0 first token 62, iterations [62,84) [84,106) [106,128) ...; r1 prefill ends at 124,
    # mid-iteration, so it joins at 128 where the step becomes 20 + 2*2 = 24 ms
    tr = qt.simulate([0.0, 0.0], 64, 32, P)
    last0 = 62 + 3 * 22 + 28 * 24                   # r0: 3 tokens alone, then 28 beside r1
    last1 = last0 + 3 * 22                          # r1: 28 beside r0, its last 3 alone
    assert (tr.last_token_s * 1e3).tolist() == pytest.approx([last0, last1])
    assert tr.tpot_ms[1] == pytest.approx((last1 - 124) / 31)   # 4 ms gap to the join counts


def test_slot_limit_makes_the_next_request_wait_for_a_slot():
    p = P.with_(slots=2)
    tr = qt.simulate([0.0, 0.0, 0.0], 64, 2, p)
    # r0: prefill [0,62), one decode token: iteration [62,84) -> done 84, slot back
    # r1: prefill [62,124), decode [124,146); r2 needs r0's slot: starts at max(124, 84) = 124
    assert (tr.prefill_start_s * 1e3).tolist() == pytest.approx([0.0, 62.0, 124.0])
    p1 = P.with_(slots=1)
    tr = qt.simulate([0.0, 0.0], 64, 2, p1)
    assert tr.prefill_start_s[1] * 1e3 == pytest.approx(84.0)       # waits for r0's last token


def test_decode_step_grows_with_the_batch():
    # eight requests, one slot each, long answers: once all joined the step is 20 + 2*8 = 36
    tr = qt.simulate(np.zeros(8), 10, 200, P)
    last = tr.last_token_s
    assert np.all(np.diff(np.sort(last)) >= 0)
    assert tr.tpot_ms[-1] == pytest.approx(36.0, abs=0.5)


def test_time_scale_and_token_rules():
    tr = qt.simulate([0.0], 64, 2, P.with_(time_scale=0.5))
    assert tr.ttft_ms[0] == pytest.approx(31.0) and tr.tpot_ms[0] == pytest.approx(11.0)
    assert count_prompt_tokens("a b  c\nd") == 4
    assert count_prompt_tokens("x" * 9, "chars4") == 3


def test_attainment_falls_with_rate_and_cslo_brackets():
    slo = qt.SLO(1000, 80, 0.95)
    lo = qt.run_attainment(3.0, slo, duration_s=20, runs=10, params=SMALL)
    hi = qt.run_attainment(8.0, slo, duration_s=20, runs=10, params=SMALL)
    assert lo.value > 0.99 > hi.value
    steady = qt.steady_attainment(3.0, slo, horizon_s=600, params=SMALL)
    assert steady.value > 0.99


# --- the server ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("qs") / "log.jsonl"
    url, proc = start_subprocess(SMALL, log_jsonl=str(log))
    yield url, log
    stop_subprocess(proc)


def test_streaming_request_has_max_tokens_chunks_and_usage(server):
    url, _ = server
    r = asyncio.run(stream_request(url, prompt=PROMPT64, max_tokens=7))
    assert r.status == "ok" and len(r.chunk_s) == 7
    assert r.usage == {"prompt_tokens": 64, "completion_tokens": 7, "total_tokens": 71}
    r = asyncio.run(stream_request(url, prompt="a b c", max_tokens=3, chat=False))
    assert len(r.chunk_s) == 3 and r.usage["prompt_tokens"] == 3


def test_non_streaming_models_and_health():
    import urllib.request

    url, stop = start_in_thread(EngineParams(time_scale=0.2))
    try:
        body = json.dumps({"model": "mock-llm", "messages": [{"role": "user", "content": "hi there"}],
                           "max_completion_tokens": 5}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        out = json.load(urllib.request.urlopen(req, timeout=10))
        assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
        assert out["choices"][0]["message"]["content"] == " tok" * 5
        assert json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"] == "mock-llm"
        assert json.load(urllib.request.urlopen(url + "/health"))["status"] == "ok"
    finally:
        stop()


def test_sequential_requests_match_the_model(server):
    url, _ = server

    async def seq():
        return [await stream_request(url, prompt=PROMPT64, max_tokens=16) for _ in range(5)]

    res = asyncio.run(seq())
    ttft = np.array([r.ttft_ms for r in res])
    tpot = np.array([r.tpot_ms for r in res])
    # the client's own send/parse adds a millisecond or two to TTFT (tens on a box at load 20):
    # never less than the model's prefill, a little more
    assert SMALL.prefill_ms(64) - 2 <= np.median(ttft) <= SMALL.prefill_ms(64) + 15
    assert np.median(tpot) == pytest.approx(SMALL.decode_step_ms(1), abs=1)


def test_open_loop_burst_agrees_with_the_truth_on_the_same_arrivals(server):
    url, log = server
    rng = np.random.default_rng(11)
    offsets = qt.poisson_arrivals(6.0, 8.0, rng)          # near the small replica's capacity
    log.write_text("")
    t0, res = asyncio.run(open_loop(url, offsets, prompt=PROMPT64, max_tokens=32))
    assert all(r.status == "ok" and len(r.chunk_s) == 32 for r in res)

    # client-measured TTFT against the truth replayed on the client's intended arrivals
    tr = qt.simulate(offsets, 64, 32, SMALL)
    ttft = np.array([r.ttft_ms for r in res])
    err = ttft - tr.ttft_ms
    assert np.median(np.abs(err)) < 15, err
    assert tr.ttft_ms.max() > 2 * SMALL.prefill_ms(64)      # the burst really queued
    tpot = np.array([r.tpot_ms for r in res])
    assert np.median(np.abs(tpot - tr.tpot_ms)) < 2

    # the server's own schedule against the truth replayed on the server's arrival stamps:
    # the same model, so the same times to rounding
    # the server logs a request after writing its last chunk: the client may be done first
    deadline = time.monotonic() + 10.0
    while len(log.read_text().splitlines()) < len(offsets) and time.monotonic() < deadline:
        time.sleep(0.05)
    rows = sorted((json.loads(x) for x in log.read_text().splitlines()), key=lambda r: r["arrival_s"])
    assert len(rows) == len(offsets)
    arr = np.array([r["arrival_s"] for r in rows])
    tr2 = qt.simulate(arr, [r["prompt_tokens"] for r in rows], [r["output_tokens"] for r in rows], SMALL)
    for key, mine in (("prefill_start_s", tr2.prefill_start_s), ("first_token_s", tr2.first_token_s),
                      ("last_token_s", tr2.last_token_s)):
        theirs = np.array([r[key] for r in rows])
        assert np.max(np.abs(theirs - mine)) < 1e-4, key
    # and the server wrote the tokens on time (the virtual clock was kept)
    lag = np.array([r["last_written_s"] - r["last_token_s"] for r in rows])
    assert np.median(lag) < 0.005
