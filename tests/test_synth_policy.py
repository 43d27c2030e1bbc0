"""Queue disciplines and admission by hand: priority with aging, the Virtual Token Counter (its
charges, weights and the lift of a returning tenant), deadline-slack admit / defer / reject."""

from __future__ import annotations

import copy

import pandas as pd

from capplan.sim.config import PRESETS, parse_config
from capplan.sim.engine import OK, REJECTED
from capplan.sim.policy import ADMIT, DEFER, REJECT, Policy, PolicySpec
from capplan.sim.sweep import simulate_level

S = 1_000_000_000  # ns per second
MS = 1_000_000


def _policy(spec, tenants, ten, sched_s, inp=None):
    n = len(ten)
    return Policy(spec, tenants=tenants, classes=(None,) * len(tenants), ten=list(ten),
                  sched=[int(s * S) for s in sched_s], inp=list(inp or [1000] * n),
                  step_ns=lambda b: 20 * MS, prefill_ns=lambda k: 0.1 * MS * k, n_replicas=1)


def _drain(q):
    out = []
    while q:
        out.append(q.popleft())
    return out


def test_priority_with_aging_by_hand():
    # levels: a 0, b 1; aging 10 s: key = level × 10 s + arrival
    pol = _policy(PolicySpec("priority", priorities=(("a", 0), ("b", 1)), aging_s=10.0), ("a", "b"),
                  ten=[1, 0, 0, 1, 0], sched_s=[0.0, 5.0, 12.0, 1.0, 30.0])
    q = pol.queue(0)
    for rid in range(4):
        q.append(rid)
    # keys: rid0 (b, 0 s) 10 s; rid1 (a, 5 s) 5 s; rid2 (a, 12 s) 12 s; rid3 (b, 1 s) 11 s
    assert q.ahead(4) == 4  # a at 30 s: key 30 s, behind all four
    q.appendleft(4)  # a preempted request goes back to the front whatever its key
    assert q[0] == 4 and len(q) == 5
    # b's requests waited long enough to overtake a's request from 12 s
    assert _drain(q) == [4, 1, 0, 3, 2]


def test_virtual_token_counter_by_hand():
    # prefill weight 1, decode weight 2; tenant y's weight 2 (its charges count half)
    pol = _policy(PolicySpec("vtc", prefill_weight=1.0, decode_weight=2.0, weights=(("y", 2.0),)), ("x", "y"),
                  ten=[0, 0, 1, 1, 0], sched_s=[0, 1, 2, 3, 4])
    q = pol.queue(0)
    for rid in (0, 1, 2):
        q.append(rid)
    assert pol.backlog == [2, 1]
    # counters 0 and 0: the lower tenant index first
    assert q.popleft() == 0
    pol.admitted(0, 0, 0, computed=100)  # x: 100
    assert q.popleft() == 2  # y (0) is behind x (100)
    pol.admitted(0, 2, 0, computed=300)  # y: 300 / 2 = 150
    pol.tokens(2, 10)  # y: + 2 × 10 / 2 = 160
    assert pol.counter == [100.0, 160.0]
    # y's next request would wait for the queued requests of tenants whose counter is at most
    # y's (x's one request, 100 ≤ 160) and y's own (none)
    assert q.ahead(3) == 1
    assert q.popleft() == 1
    pol.admitted(0, 1, 0, computed=500)  # x: 600
    pol.tokens(1, 50)  # x: 700
    assert pol.counter == [700.0, 160.0] and pol.backlog == [0, 0]
    # y idles while x is served; y returns with 160 < x's 700 — no one else backlogged, no lift
    q.append(3)
    assert pol.counter[1] == 160.0
    # x returns while y is backlogged at 160: x keeps its own, larger counter (a lift only raises)
    q.append(4)
    assert pol.counter[0] == 700.0
    assert _drain(q) == [3, 4]
    # a tenant that idled below the backlogged ones is lifted to the smallest backlogged counter
    pol.counter = [10.0, 160.0]
    q.append(2)  # y backlogged at 160
    q.append(0)  # x comes back at 10: lifted to 160, so its idle time banks no credit
    assert pol.counter == [160.0, 160.0]


def test_virtual_token_counter_ahead_counts_the_tenants_served_first():
    pol = _policy(PolicySpec("vtc"), ("x", "y"), ten=[0, 0, 1, 1], sched_s=[0, 1, 2, 3])
    q = pol.queue(0)
    for rid in (0, 1, 2):
        q.append(rid)
    pol.counter = [50.0, 10.0]
    # y's next request (counter 10): only y's own queued request goes first; x (50) waits
    assert q.ahead(3) == 1
    pol.counter = [5.0, 10.0]
    assert q.ahead(3) == 3


def test_deadline_slack_admit_defer_reject_by_hand():
    # D = 2,000 ms, margin 100 ms, route 0; a 1,000-token prompt: prefill 100 ms; first token 20 ms:
    # B_queue = 2,000 − 100 − 100 − 20 = 1,780 ms. Admissions every 100 ms → the expected wait is
    # 100 ms per request ahead: 17 ahead (1,700 ms) admit, 18 (1,800 ms) refuse.
    spec = PolicySpec(admission="deadline_slack", ttft_ms=2000.0, margin_ms=100.0, defer=("batch",))
    n = 40
    pol = _policy(spec, ("web", "batch"), ten=[0] * 38 + [0, 1], sched_s=[0] * n)
    for k in range(32):
        pol.admitted(0, 0, k * 100 * MS, computed=1000)
    q = pol.queue(0)
    for rid in range(17):
        q.append(rid)
    assert pol.decide(38, 0, 0, q, 10, 1000, 0) == ADMIT
    q.append(17)
    assert pol.decide(38, 0, 0, q, 10, 1000, 0) == REJECT  # web is not deferrable
    assert pol.decide(39, 0, 0, q, 10, 1000, 1) == DEFER  # batch is
    q.append(39)  # the deferred request queues behind every other one …
    q.append(18)
    assert _drain(q)[-1] == 39  # … and is served when nothing else waits
    # a shorter prompt has more budget: 200 tokens → prefill 20 ms, B_queue 1,860 ms ≥ 1,800
    q2 = pol.queue(0)
    for rid in range(18):
        q2.append(rid)
    assert pol.decide(38, 0, 0, q2, 10, 200, 0) == ADMIT
    assert pol.counts == {"admitted": 2, "deferred": 1, "rejected": 1}


def test_deferred_tenant_served_later_not_rejected():
    # one replica at 1.5× its capacity; admission rejects web's late requests and defers batch's
    raw = copy.deepcopy(PRESETS["small"])
    raw["replica"]["queue_limit"] = None
    raw["client"]["timeout_s"] = 60
    raw["workload"]["tenants"] = [{"name": "web", "share": 0.7}, {"name": "batch", "share": 0.3}]
    cfg = parse_config(raw)
    spec = PolicySpec(admission="deadline_slack", ttft_ms=2000.0, margin_ms=300.0, defer=("batch",))
    res = simulate_level(cfg.with_(policy=spec), 8.0, duration_s=200.0, seed_key=(0,))
    st = res.stats
    df = pd.DataFrame({"tenant": res.tenant, "status": res.status})
    web, batch = df[df["tenant"] == 0], df[df["tenant"] == 1]
    assert st["policy_deferred"] > 0 and st["policy_rejected"] == (df["status"] == REJECTED).sum()
    assert (web["status"] == REJECTED).mean() > 0.05
    assert (batch["status"] == REJECTED).sum() == 0  # deferred, never rejected
    # deferred requests wait behind web's: most of batch's complete, later
    assert (batch["status"] == OK).mean() > 0.5


def test_every_registered_discipline_keeps_the_queue_contract():
    """The registry's classes share the base's tiers: a preempted request first, a deferred
    one last, the rest in the discipline's order; len, truth, iteration and clear agree."""
    from capplan.sim.policy import ADMISSIONS, DISCIPLINES, Discipline

    assert set(DISCIPLINES) == {"fifo", "vtc", "priority"} and set(ADMISSIONS) == {"none", "deadline_slack"}
    for name, cls in DISCIPLINES.items():
        assert issubclass(cls, Discipline)
        pol = _policy(PolicySpec(name), ("x", "y"), ten=[0, 1, 0, 1, 0], sched_s=[0, 1, 2, 3, 4])
        q = pol.queue(0)
        assert type(q) is cls and not q and len(q) == 0
        for rid in (0, 1, 2):
            q.append(rid)
        pol.deferring = True  # what a DEFER decision leaves for the next append
        q.append(3)
        q.appendleft(4)
        assert len(q) == 5 and sorted(q) == [0, 1, 2, 3, 4] and q[0] == 4
        order = _drain(q)
        assert order[0] == 4 and order[-1] == 3 and sorted(order[1:4]) == [0, 1, 2], name
        q.append(0)
        q.clear()
        assert not q and list(q) == [] and pol.backlog == [0, 0]
