"""The autoscaler policy (capplan.sim.autoscale): the R_desired formula step by step, the
other signals, hysteresis, stabilisation, step limit and cooldown."""

from __future__ import annotations

import math

import numpy as np

import pytest

from capplan.errors import SpecError
from capplan.sim.autoscale import (AutoscalerPolicy, AutoscalerSpec, Signals, raw_desired,
                                     work_weights)
from capplan.sim.service import ServiceModel


def _sig(lam, q, w=1.0):
    """Signals at λ requests of work w per second with q work left."""
    return Signals(rate_rps=lam, work_rate=lam * w, queue_work=q)


def test_queue_work_formula_step_by_step():
    # work of 1000 prefill-equivalent tokens a request at C: C = 2500 tokens/s
    spec = AutoscalerSpec(capacity_rps=2.5, safety=1.2, drain_target_s=60.0, stabilisation_s=0,
                          request_work=1000.0)
    pol = AutoscalerPolicy(spec, initial=2)
    seq = [(4.0, 0.0), (4.0, 30e3), (6.0, 120e3), (3.0, 0.0), (3.0, 0.0), (0.5, 0.0)]
    got = []
    for i, (lam, q) in enumerate(seq):
        d = pol.decide(15.0 * i, _sig(lam, q, 1000.0), ready=pol.desired)
        got.append(d.desired)
        assert d.capacity_work == 2500.0
        assert d.raw == max(1, math.ceil((1.2 * lam * 1000 + q / 60.0) / 2500 - 1e-9))
    # (1.2·4000)/2500 = 1.92 → 2; (4800 + 500)/2500 = 2.12 → 3; (7200 + 2000)/2500 = 3.68 → 4;
    # 3600/2500 → 2; 600/2500 → 1
    assert got == [2, 3, 4, 2, 2, 1]


def test_request_work_calibrates_on_the_first_window_then_stays():
    spec = AutoscalerSpec(capacity_rps=2.0, safety=1.0, rate_window_s=30.0, stabilisation_s=0)
    pol = AutoscalerPolicy(spec, initial=1)
    # no arrival yet: the queue-work signal keeps the ready count (nothing to calibrate on)
    assert pol.decide(15.0, Signals(0.0, 0.0, 500.0), ready=3).raw == 3
    # 30 s: 60 arrivals of 45,000 tokens in the window → 750 tokens a request, C = 1500 tokens/s
    d = pol.decide(30.0, Signals(2.0, 1500.0, 0.0, window_arrivals=60, window_work=45_000.0), 1)
    assert pol.request_work == 750.0 and d.capacity_work == 1500.0 and d.raw == 1
    # after the first window the calibration stays: thrice the work per request asks thrice
    d = pol.decide(45.0, Signals(2.0, 4500.0, 0.0, window_arrivals=60, window_work=135_000.0), 1)
    assert pol.request_work == 750.0 and d.raw == 3


def test_other_signals_and_multi_signal():
    spec = AutoscalerSpec(capacity_rps=2.0, signals=("queue_work", "ttft_p99", "kv_use", "goodput"),
                          ttft_target_ms=1000, kv_target=0.8, goodput_target=0.99)
    q = dict(rate_rps=2.0, work_rate=2.0, queue_work=0.0)
    sig = Signals(**q, ttft_p99_ms=2500.0, kv_use=0.4, good_share=0.95)
    assert raw_desired(spec, sig, ready=2, request_work=1.0) == (5, "ttft_p99", 2500.0)  # 2 · 2.5
    sig = Signals(**q, ttft_p99_ms=500.0, kv_use=0.96, good_share=0.995)
    assert raw_desired(spec, sig, ready=4, request_work=1.0)[:2] == (5, "kv_use")  # ⌈4 · 1.2⌉
    sig = Signals(**q, ttft_p99_ms=500.0, kv_use=0.1, good_share=0.5)
    assert raw_desired(spec, sig, ready=3, request_work=1.0)[:2] == (6, "goodput")  # ⌈3 · 0.99/0.5⌉


def test_hysteresis_stabilisation_steps_and_cooldown():
    spec = AutoscalerSpec(capacity_rps=1.0, tolerance=0.2, stabilisation_s=60, max_step=2,
                          cooldown_s=30, warm_floor=2, max_replicas=8, request_work=1.0)
    pol = AutoscalerPolicy(spec, initial=5)
    d = lambda t, lam: pol.decide(t, _sig(lam, 0.0), ready=pol.desired)  # noqa: E731
    assert d(0, 3.9).desired == 4          # raw 4 ≤ 5 · (1 − 0.2): scale in
    assert d(60, 12.0).desired == 6        # raw 8 (max replicas) but +2 per decision
    assert d(70, 12.0).desired == 8
    assert d(80, 7.0).desired == 8         # raw 7 > 8 · 0.8: hysteresis keeps 8
    assert d(90, 1.0).desired == 8         # raw 2 but cooldown (last change at 70 s)
    assert d(110, 1.0).desired == 8        # stabilisation: 8 was asked within 60 s
    assert d(141, 1.0).desired == 6        # the window holds 2s only: −2 per decision
    assert d(175, 1.0).desired == 4 and d(210, 1.0).desired == 2
    assert d(250, 0.1).desired == 2        # warm floor


def test_bad_spec():
    with pytest.raises(SpecError, match="signal"):
        AutoscalerSpec(capacity_rps=1.0, signals=("cpu",))
    with pytest.raises(SpecError, match="capacity_rps"):
        AutoscalerSpec(capacity_rps=0.0)
    with pytest.raises(SpecError, match="request_work"):
        AutoscalerSpec(capacity_rps=1.0, request_work=0.0)
    with pytest.raises(SpecError, match="decode_token_weight"):
        AutoscalerSpec(capacity_rps=1.0, decode_token_weight=-1.0)


def test_work_weights_from_the_service_model():
    sm = ServiceModel(decode_batch=(1, 16), decode_step_ms=(20.0, 32.0), prefill_ms_per_token=0.1)
    # at a full batch of 16 an answer token costs 32/16 = 2 ms, a prompt token 0.1 ms: 20 tokens
    assert work_weights(sm, 16) == (1.0, pytest.approx(20.0))
    assert work_weights(sm, 16, 7.5) == (1.0, 7.5)  # given
    # prompts that cost nothing (a twin fitted where they slowed nothing): answer tokens only
    assert work_weights(ServiceModel((1,), (20.0,), 0.0), 16) == (0.0, 1.0)


def _decisions(res):
    return {round(t / 1e9, 3): c for t, e, _, c in res.timeline if e == "scale_decision"}


def test_work_units_on_a_mix_shift_by_hand():
    """One replica, batch 1: a decode step 10 ms, a prompt token 0.5 ms (+5 ms a prefill), so
    an answer token weighs 10/0.5 = 20 prefill-equivalent tokens. Arrivals every 0.6 s with
    50-token answers; prompts of 100 tokens (work 100 + 20·50 = 1100, served in 555 ms) until
    request 101, then of 1000 tokens (work 2000, served in 1005 ms: a queue grows)."""
    from capplan.sim.control import Control, ControlSpec
    from capplan.sim.engine import ReplicaParams, simulate

    n = 160
    i = np.arange(n)
    inp = np.where(i >= 102, 1000, 100).astype(np.int64)
    out = np.full(n, 50, np.int64)
    params = ReplicaParams(max_batch=1, token_budget=4096,
                           service=ServiceModel((1,), (10.0,), 0.5, 5.0))
    spec = AutoscalerSpec(capacity_rps=1.75, safety=1.0, drain_target_s=60, eval_period_s=15,
                          rate_window_s=30, stabilisation_s=0, max_replicas=1)
    res = simulate(n_replicas=1, params=params, timeout_s=1000, end_s=100,
                   sched_ns=(i * 600_000_000).astype(np.int64), input_tokens=inp,
                   output_tokens=out, control=Control(ControlSpec(initial=1, autoscaler=spec)))
    d = _decisions(res)
    # request work calibrated on the first 30 s (all short): 1100 → C = 1.75 · 1100 = 1925 /s
    assert "1,925.0 prefill-equivalent tokens/s, a prompt token = 1, an answer token = 20" \
        in d[90.0]["detail"]
    # t = 90: the window (60, 90] holds requests 101 (short) and 102–149 (long; 150 arrives
    # at 90.0, after the decision): λ_w = (1100 + 48 · 2000) / 30 = 3236.67 tokens/s
    assert d[90.0]["work_rate_replicas"] == pytest.approx(97_100 / 30 / 1925, rel=1e-12)
    # long request k starts at 61.2 + 1.005 (k − 102): 130 at 89.34, first token 89.855, 14
    # decode steps done by 90.0 → 15 of 50 tokens out, 35 · 20 = 700 left; 131–149 wait
    # whole: 19 · 2000 = 38,000 → Q_work = 38,700
    assert d[90.0]["signal_value"] == pytest.approx(38_700.0)
    assert d[90.0]["queue_work_s"] == pytest.approx(38_700 / 1925)
    work = (97_100 / 30 + 38_700 / 60) / 1925  # 2.0165 → asks 3 (clamped to max_replicas 1)
    assert math.ceil(work) == 3 and "(asked 3)" in d[90.0]["detail"]
    # t = 75: window (45, 75] holds 26 short (76–101) and 23 long (102–124); request 115
    # started 74.265, first token 74.78, 22 steps by 75.0 → 27 left (540); 116–124 wait
    assert d[75.0]["work_rate_replicas"] == pytest.approx((26 * 1100 + 23 * 2000) / 30 / 1925)
    assert d[75.0]["signal_value"] == pytest.approx(540 + 9 * 2000)
    # the request-rate version (λ in req/s, waiting prompt + answer tokens in requests of the
    # run's mean size so far, C in req/s) under-asks at 90 s: 49/30 req/s, 19 · 1050 tokens
    # waiting, mean (102 · 150 + 48 · 1050) / 150 = 438 tokens → 45.55 requests
    lam, q_req = 49 / 30, 19 * 1050 / ((102 * 150 + 48 * 1050) / 150)
    assert d[90.0]["rate_rps"] == pytest.approx(lam)
    assert math.ceil((lam + q_req / 60) / 1.75) == 2  # 1.367 → 2 against 3
    # and a stationary mix asks the same in both units: at 30 s, 49 short requests in (0, 30]
    assert d[30.0]["work_rate_replicas"] == pytest.approx(d[30.0]["rate_rps"] / 1.75)
