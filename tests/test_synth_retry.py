"""Client retries (capplan.sim.retry + the engine's retry path): backoff with seeded jitter,
the retry budget and the retry amplification, by hand; failures whose lost requests are
retried; bad policies refused with the field named."""

from __future__ import annotations

import numpy as np
import pytest

from capplan.errors import SpecError
from capplan.sim.config import parse_config
from capplan.sim.control import Control, ControlSpec, FailureEvent
from capplan.sim.engine import ERROR, OK, REJECTED, ReplicaParams, simulate
from capplan.sim.retry import Retrier, RetryPolicy, parse_retry
from capplan.sim.service import ServiceModel
from capplan.sim.sweep import simulate_level

from conftest import fixed_service_raw

NS = 1_000_000_000


def test_backoff_exponential_capped_and_jittered_from_the_seed():
    p = RetryPolicy(backoff_s=0.5, multiplier=2.0, max_backoff_s=3.0, jitter="none")
    # 0.5, 1, 2, then capped at 3
    assert [p.backoff_ns(n, 0.7) for n in (1, 2, 3, 4)] == [500_000_000, NS, 2 * NS, 3 * NS]
    assert RetryPolicy(backoff_s=1.0, jitter="equal").backoff_ns(2, 0.5) == 1_500_000_000  # 1 + 1·0.5
    r = Retrier(RetryPolicy(backoff_s=1.0, multiplier=2.0, jitter="full", budget=None, seed=7))
    u = np.random.default_rng(7).random(2)
    assert r.decide(0, 0) == int(round(u[0] * 1.0 * NS))  # full jitter: uniform on [0, 1 s]
    assert r.decide(0, 1) == int(round(u[1] * 2.0 * NS))  # then on [0, 2 s]


def test_retry_count_and_budget_by_hand():
    r = Retrier(RetryPolicy(max_retries=2, backoff_s=1.0, jitter="none", budget=0.5,
                            budget_window_s=10.0, budget_min_retries=1))
    for k in range(10):
        r.first(k * NS)  # first attempts at 0 … 9 s
    # at 9.5 s the window (−0.5, 9.5] holds 10 first attempts: at most 1 + 0.5·10 = 6 retries
    got = [r.decide(9_500_000_000, 0) for _ in range(7)]
    assert got[:6] == [NS] * 6 and got[6] is None and r.refused_budget == 1
    assert r.decide(9_500_000_000, 2) is None and r.exhausted == 1  # max_retries reached
    # at 19 s the window (9, 19] holds the first attempt at 9 s only and the six retries:
    # 1 + 0.5·1 = 1.5 < 7 → refused
    assert r.decide(19 * NS, 0) is None and r.refused_budget == 2
    # at 19.5 s the retries of 9.5 s have left the window: 0 + 1 ≤ 1 + 0 → allowed
    assert r.decide(19_500_000_000, 0) == NS


def _rejecting(policy, n=30):
    """One replica that takes no request (queue limit 0): every attempt is rejected. Arrivals
    at 0, 1, …, n − 1 s."""
    params = ReplicaParams(max_batch=1, token_budget=4096, queue_limit=0,
                           service=ServiceModel((1,), (10.0,), 0.5))
    return simulate(n_replicas=1, params=params, timeout_s=100, end_s=n + 50,
                    sched_ns=(np.arange(n) * NS).astype(np.int64),
                    input_tokens=np.full(n, 100, np.int64), output_tokens=np.full(n, 10, np.int64),
                    control=Control(ControlSpec(initial=1, retry=policy)))


def test_retry_amplification_of_a_rejection_storm_by_hand():
    # no budget: every request is tried 1 + 3 times → 4 attempts per request
    res = _rejecting(RetryPolicy(max_retries=3, backoff_s=0.1, multiplier=1.0, jitter="none",
                                 budget=None))
    assert (res.status == REJECTED).all() and (res.retries == 3).all()
    assert res.stats["first_attempts"] == 30 and res.stats["retries_sent"] == 90
    assert res.stats["retry_amplification"] == 4.0 and res.stats["retries_exhausted"] == 30
    # a budget of 2 retries per 10 s (no share of first attempts): request 0 is retried at
    # 0.1 and 0.2 s, then refused; requests 1–9 find the window full; at 10 s the retry of 0 s
    # has left it (window (0, 10]) and request 10 is retried twice, likewise request 20:
    # 6 retries for 30 requests → 36 / 30 = 1.2
    res = _rejecting(RetryPolicy(max_retries=3, backoff_s=0.1, multiplier=1.0, jitter="none",
                                 budget=0.0, budget_window_s=10.0, budget_min_retries=2))
    assert res.retries.tolist() == [2 if k % 10 == 0 else 0 for k in range(30)]
    assert res.stats["retry_amplification"] == pytest.approx(36 / 30)
    assert res.stats["retries_refused_budget"] == 27 + 3  # first retries of 1–9, 11–19, 21–29; third of 0, 10, 20


def _failing(in_flight, retry=None):
    raw = fixed_service_raw(3, arrival="constant", timeout_s=300.0)
    cfg = parse_config(raw).with_(rates=(15.0,), duration_s=200.0, control=ControlSpec(
        initial=3, retry=retry, failures=(FailureEvent(at_s=100, count=1, in_flight=in_flight,
                                                      detect_s=2.0, replace=False),)))
    return simulate_level(cfg, 15.0)


def test_a_failure_retried_under_a_policy_by_hand():
    lost = _failing("lost")
    errors = int((lost.status == ERROR).sum())  # held by the dead replica or routed to it
    assert errors > 10 and lost.stats["retry_amplification"] == 1.0
    n = lost.stats["first_attempts"]
    # every lost attempt is retried once, 3 s after its client saw it — after the dead
    # replica's routes went (at 102 s), so the live replicas serve it: amplification (n + E)/n
    res = _failing("retried", RetryPolicy(max_retries=3, backoff_s=3.0, jitter="none", budget=None))
    assert (res.status == ERROR).sum() == 0 and res.stats["retries_sent"] == errors
    assert res.stats["retry_amplification"] == pytest.approx((n + errors) / n)
    assert (res.status[res.retries > 0] == OK).all()
    # a budget of 4 retries per 1,000 s: 4 lost requests come back, the others stay errors
    res = _failing("retried", RetryPolicy(backoff_s=3.0, jitter="none", budget=0.0,
                                          budget_window_s=1000.0, budget_min_retries=4))
    assert res.stats["retries_sent"] == 4 and (res.status == ERROR).sum() == errors - 4
    assert res.stats["retries_refused_budget"] == errors - 4
    # with full jitter on 0.5 s, requests the dead replica failed at once (routed to it before
    # its routes went at 102 s) are retried before 102 s and can land on it again: the black
    # hole eats retries too, and each counts
    res = _failing("retried", RetryPolicy(max_retries=3, backoff_s=0.5, budget=None, seed=3))
    again = res.retries >= 2
    assert again.sum() > 0 and res.stats["retries_sent"] > errors


def test_the_study_readme_states_the_retries(tmp_path):
    from capplan.sim.sweep import generate_study

    raw = fixed_service_raw(3, arrival="constant", timeout_s=300.0)
    cfg = parse_config(raw).with_(rates=(15.0,), duration_s=200.0, control=ControlSpec(
        initial=3, retry=RetryPolicy(backoff_s=3.0, jitter="none", budget=None),
        failures=(FailureEvent(at_s=100, count=1, in_flight="retried", detect_s=2.0,
                              replace=False),)))
    path, st = generate_study(cfg, tmp_path / "s", workers=1)
    n, amp = st[0]["retries_sent"], st[0]["retry_amplification"]
    assert n > 0 and f"r01 {n:,} retries, ×{amp:.4f} attempts per request" in \
        (path / "README.md").read_text()


def test_bad_policies_name_the_field():
    with pytest.raises(SpecError) as e:
        parse_retry({"max_retries": -1}, "failure.retry")
    assert e.value.field == "failure.retry.max_retries"
    with pytest.raises(SpecError) as e:
        parse_retry({"jitter": "fulll"}, "failure.retry")
    assert e.value.field == "failure.retry.jitter" and "full" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_retry({"backoff_s": 5, "max_backoff_s": 1}, "rollout.retry")
    assert e.value.field == "rollout.retry.max_backoff_s"
    with pytest.raises(SpecError) as e:
        parse_retry({"retries": 3}, "failure.retry")  # unknown key
    assert "max_retries" in str(e.value)
    with pytest.raises(SpecError, match="in_flight"):
        ControlSpec(initial=2, failures=(FailureEvent(at_s=1.0),), retry=RetryPolicy())
    p = parse_retry({"max_retries": 2, "backoff_s": "200ms", "budget": None}, "failure.retry")
    assert p.max_retries == 2 and p.backoff_s == 0.2 and p.budget is None
