"""The autoscaler policy (capplan.synth.autoscale): the R_desired formula step by step, the
other signals, hysteresis, stabilisation, step limit and cooldown."""

from __future__ import annotations

import math

import pytest

from capplan.errors import SpecError
from capplan.synth.autoscale import AutoscalerPolicy, AutoscalerSpec, Signals, raw_desired


def test_queue_work_formula_step_by_step():
    spec = AutoscalerSpec(capacity_rps=2.5, safety=1.2, drain_target_s=60.0, stabilisation_s=0)
    pol = AutoscalerPolicy(spec, initial=2)
    seq = [(4.0, 0.0), (4.0, 30.0), (6.0, 120.0), (3.0, 0.0), (3.0, 0.0), (0.5, 0.0)]
    got = []
    for i, (lam, q) in enumerate(seq):
        d = pol.decide(15.0 * i, Signals(rate_rps=lam, queue=q), ready=pol.desired)
        got.append(d.desired)
        assert d.raw == max(1, math.ceil((1.2 * lam + q / 60.0) / 2.5 - 1e-9))
    # (1.2·4)/2.5 = 1.92 → 2; (4.8 + 0.5)/2.5 = 2.12 → 3; (7.2 + 2)/2.5 = 3.68 → 4; 3.6/2.5 → 2;
    # 0.6/2.5 → 1
    assert got == [2, 3, 4, 2, 2, 1]


def test_other_signals_and_multi_signal():
    spec = AutoscalerSpec(capacity_rps=2.0, signals=("queue_work", "ttft_p99", "kv_use", "goodput"),
                          ttft_target_ms=1000, kv_target=0.8, goodput_target=0.99)
    sig = Signals(rate_rps=2.0, queue=0.0, ttft_p99_ms=2500.0, kv_use=0.4, good_share=0.95)
    assert raw_desired(spec, sig, ready=2) == (5, "ttft_p99", 2500.0)  # 2 · 2.5
    sig = Signals(rate_rps=2.0, queue=0.0, ttft_p99_ms=500.0, kv_use=0.96, good_share=0.995)
    assert raw_desired(spec, sig, ready=4)[:2] == (5, "kv_use")  # ⌈4 · 1.2⌉
    sig = Signals(rate_rps=2.0, queue=0.0, ttft_p99_ms=500.0, kv_use=0.1, good_share=0.5)
    assert raw_desired(spec, sig, ready=3)[:2] == (6, "goodput")  # ⌈3 · 0.99/0.5⌉


def test_hysteresis_stabilisation_steps_and_cooldown():
    spec = AutoscalerSpec(capacity_rps=1.0, tolerance=0.2, stabilisation_s=60, max_step=2,
                          cooldown_s=30, warm_floor=2, max_replicas=8)
    pol = AutoscalerPolicy(spec, initial=5)
    d = lambda t, lam: pol.decide(t, Signals(rate_rps=lam, queue=0.0), ready=pol.desired)  # noqa: E731
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
