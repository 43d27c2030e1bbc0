"""Agent / RAG fan-out (capplan.fanout, docs/fanout.md): root capacity = per-call capacity / k
for a fixed fan-out, the tail amplification p^k and the per-call attainment a root target needs,
the sequential-depth split of a root's E2E limit, the KV held while tools run, and a fan-out
measured from a tiny event table — all by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from capplan.cli import main
from capplan.errors import StudyError
from capplan.fanout import (fanout_capacity, given_fanout, measure_fanout, parse_fanout,
                            root_capacity)

from conftest import ev

ROOT = Path(__file__).resolve().parents[1]


def test_fixed_fanout_root_capacity_is_per_call_over_k():
    """k = 4 parallel calls, per-call C = 12 req/s at attainment 0.99: 12 / 4 = 3 roots/s; a
    root is good with 0.99⁴ = 0.960596 there, and a 0.99 root target needs calls good with
    0.99^(1/4) = 0.997491."""
    fan = given_fanout(4)
    r = root_capacity(12.0, fan, root_target=0.99, call_attainment=0.99)
    assert r.root_rps == pytest.approx(3.0) and r.root_rps_calls == pytest.approx(3.0)
    assert r.binding == "calls" and r.mean_calls == 4
    assert r.root_attainment_at_capacity == pytest.approx(0.99 ** 4) == pytest.approx(0.96059601)
    assert r.call_attainment_needed == pytest.approx(0.99 ** 0.25) == pytest.approx(0.9974906)
    assert not r.honest and "NOT HONEST" in r.to_text()
    # at the needed per-call attainment the roots meet the target exactly
    ok = root_capacity(10.0, fan, root_target=0.99, call_attainment=0.99 ** 0.25)
    assert ok.honest and ok.root_attainment_at_capacity == pytest.approx(0.99)
    assert ok.root_rps == pytest.approx(2.5)
    f = ok.to_frame().set_index("name")
    assert f.loc["root capacity", "value"] == pytest.approx(2.5)


def test_amplification_over_a_distribution_by_hand():
    """Half the roots make 1 call, 30 % make 4, 20 % make 8: E[k] = 0.5 + 1.2 + 1.6 = 3.3;
    at p = 0.99 the roots are good with 0.5·0.99 + 0.3·0.99⁴ + 0.2·0.99⁸ = 0.495 + 0.288179 + 0.184549 = 0.967728."""
    fan = given_fanout(parse_fanout("1:0.5,4:0.3,8:0.2"))
    assert fan.mean_calls == pytest.approx(3.3)
    a = 0.5 * 0.99 + 0.3 * 0.99 ** 4 + 0.2 * 0.99 ** 8
    assert fan.root_attainment(0.99) == pytest.approx(a) == pytest.approx(0.967728, abs=1e-6)
    p = fan.call_attainment_needed(0.95)
    assert 0.5 * p + 0.3 * p ** 4 + 0.2 * p ** 8 == pytest.approx(0.95, abs=1e-12)
    r = root_capacity(12.0, fan, root_target=0.95, call_attainment=0.99)
    assert r.root_rps == pytest.approx(12 / 3.3) and r.honest  # 0.99 > p ≈ 0.9843
    d = r.distribution()
    assert d["share"].tolist() == pytest.approx([0.5, 0.3, 0.2])
    assert d["root_attainment_at_capacity"].tolist() == pytest.approx([0.99, 0.99 ** 4, 0.99 ** 8])


def test_kv_held_for_tools_by_hand():
    """4 calls in 2 steps of 2, 3 s of tool between them, 4,000 tokens per held call: each root
    holds 2 sequences × 3 s = 6 sequence-seconds, 24,000 token-seconds. At 3 roots/s (12 / 4):
    18 sequences, 72,000 tokens held (Little's law); with 100,000 KV tokens the KV bound is
    100,000 / 24,000 = 4.17 roots/s (calls bind); with 60,000 it is 2.5 (KV binds)."""
    fan = given_fanout(4, depth=2, tool_s=3.0, context_tokens=4000)
    r = root_capacity(12.0, fan, root_target=0.99, call_attainment=0.99, kv_tokens=100_000)
    assert r.held_sequences == pytest.approx(18.0) and r.held_kv_tokens == pytest.approx(72_000)
    assert r.root_rps_kv == pytest.approx(100_000 / 24_000) and r.binding == "calls"
    assert any("72%" in n for n in r.notes)
    r = root_capacity(12.0, fan, root_target=0.99, call_attainment=0.99, kv_tokens=60_000)
    assert r.root_rps == pytest.approx(2.5) and r.binding == "KV held for tools"


def _agent_events():
    """Root A: step 0 one call [0, 1 s]; a 2-s tool; step 1 three calls from 3 s, last tokens at
    4, 4.5 and 5 s; a 1-s tool; step 2 one call [6, 7 s]. Root B: one call without agent_root
    [10, 10.5 s]. Root C: two parallel calls from 20 s, done at 21 and 22 s. 100 + 10 tokens each.
    By hand: A has k = 5 in 3 steps (widest 3), tools 2 + 1 = 3 s, held 1·2 + 3·1 = 5
    sequence-s and 110·2 + 330·1 = 550 token-s, latency 7 s; B k = 1, 0.5 s; C k = 2, 2 s."""
    rows = []

    def call(t0, t1, root=None, depth=None):
        extra = {} if root is None else {"agent_root": root, "branch_depth": depth}
        rows.append(ev(scheduled_ms=t0 * 1000, ttft_ms=100, e2e_ms=(t1 - t0) * 1000, **extra))

    call(0, 1, "A", 0)
    for end in (4.0, 4.5, 5.0):
        call(3, end, "A", 1)
    call(6, 7, "A", 2)
    call(10, 10.5)
    call(20, 21, "C", 0)
    call(20, 22, "C", 0)
    df = pd.DataFrame(rows)
    df["branch_depth"] = df["branch_depth"].astype("Int64")
    return df


def test_fanout_measured_from_a_tiny_event_table(make_study):
    path = make_study(_agent_events(), runs=[{"run_id": "r1", "offered_rps": 1.0}])
    fan = measure_fanout(path, "e2e_ms=1200")
    r = fan.roots.set_index("root")
    assert r.loc["r1/A", ["calls", "depths", "width_max"]].tolist() == [5, 3, 3]
    assert r.loc["r1/A", ["tool_s", "held_seq_s", "held_token_s", "latency_s"]].tolist() == \
        pytest.approx([3.0, 5.0, 550.0, 7.0])
    single = [k for k in r.index if k.startswith("r1/~")]
    assert len(single) == 1 and r.loc[single[0], "calls"] == 1
    assert r.loc[single[0], "latency_s"] == pytest.approx(0.5)
    assert r.loc["r1/C", ["calls", "depths", "tool_s", "latency_s"]].tolist() == \
        pytest.approx([2, 1, 0.0, 2.0])
    assert fan.mean_calls == pytest.approx(8 / 3)
    # E2E ≤ 1.2 s: A's step-1 calls of 1.5 and 2 s fail, C's 2-s call fails: 5 of 8 calls good,
    # only B's root is good
    assert fan.call_good == pytest.approx(5 / 8)
    assert not r.loc["r1/A", "good"] and not r.loc["r1/C", "good"] and r.loc[single[0], "good"]
    res = root_capacity(8.0, fan, root_target=0.99, call_attainment=0.99)
    assert res.root_rps == pytest.approx(8 / (8 / 3)) == pytest.approx(3.0)
    assert res.measured_root_attainment == pytest.approx(1 / 3)
    p = 5 / 8
    assert fan.root_attainment(p) == pytest.approx((p ** 5 + p + p ** 2) / 3)
    # Little's law at 3 roots/s: 5/3 sequence-s and 550/3 token-s per root on average
    assert res.held_sequences == pytest.approx(5.0) and res.held_kv_tokens == pytest.approx(550.0)
    need = fan.call_attainment_needed(0.99)
    assert (need ** 5 + need + need ** 2) / 3 == pytest.approx(0.99, abs=1e-12)


def test_root_e2e_limit_split_over_sequential_steps(make_study):
    """Root E2E limit 10 s; the roots' tool time [3, 0, 0] s has a 99th percentile of 2.94 s
    (type 7); the deepest root has 3 steps: each call within (10,000 − 2,940) / 3 = 2,353.3 ms.
    Then every call meets E2E (the longest is 2 s) and all three roots are good."""
    path = make_study(_agent_events(), runs=[{"run_id": "r1", "offered_rps": 1.0}])
    r = fanout_capacity(path, "e2e_ms=60000,attainment=0.99", root_e2e_ms=10_000,
                        capacity_rps=8.0)
    assert r.call_e2e_ms == pytest.approx((10_000 - 2940) / 3)
    assert r.measured_call_attainment == 1.0 and r.measured_root_attainment == 1.0
    assert "each call within 2,353 ms" in r.to_text()
    with pytest.raises(Exception, match="does not cover its tools"):
        fanout_capacity(path, "e2e_ms=60000", root_e2e_ms=2000, capacity_rps=8.0)


def test_a_study_without_agent_roots_is_refused(make_study):
    path = make_study([ev(scheduled_ms=0), ev(scheduled_ms=100)],
                      runs=[{"run_id": "r1", "offered_rps": 1.0}])
    with pytest.raises(StudyError, match="agent_root"):
        measure_fanout(path)


@pytest.mark.slow
def test_root_capacity_from_the_envelope_refitted_at_the_needed_attainment():
    """On the demo study: the per-call C_SLO lower bound re-fitted at 0.99^(1/4), over 4."""
    from capplan.envelope import fit_envelope

    slo = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
    env = fit_envelope(ROOT / "data" / "sample", slo, reps=30)
    r = fanout_capacity(ROOT / "data" / "sample", slo, fanout=given_fanout(4), envelope=env)
    at = env.refit(attainment=0.99 ** 0.25).cslo.lower_bound
    assert r.per_call_rps == pytest.approx(at) and r.root_rps == pytest.approx(at / 4)
    assert r.call_attainment == pytest.approx(0.99 ** 0.25) and r.honest
    assert at < env.cslo.lower_bound  # a stricter per-call target holds at a lower rate


def test_cli(make_study, capsys):
    rc = main(["fanout", "--slo", "ttft_ms=2000,attainment=0.99", "--fanout", "4",
               "--capacity-rps", "12"])
    out = capsys.readouterr().out
    assert rc == 0 and "Root capacity: 3 roots/s (calls bind)" in out and "0.997491" in out
    path = make_study(_agent_events(), runs=[{"run_id": "r1", "offered_rps": 1.0}])
    rc = main(["fanout", str(path), "--slo", "e2e_ms=1200,attainment=0.99", "--capacity-rps", "8"])
    out = capsys.readouterr().out
    assert rc == 0 and "roots good 0.3333" in out and "3 roots/s" in out
    for bad in (["--fanout", "x", "--capacity-rps", "1"], ["--fanout", "4"],
                ["--fanout", "2", "--depth", "3", "--capacity-rps", "1"]):
        rc = main(["fanout", "--slo", "ttft_ms=2000", *bad])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and err.strip(), bad


def test_validate_refuses_a_negative_branch_depth(make_study, capsys):
    df = _agent_events()
    df.loc[2, "branch_depth"] = -1
    path = make_study(df, runs=[{"run_id": "r1", "offered_rps": 1.0}])
    rc = main(["validate", str(path)])
    err = capsys.readouterr()
    text = err.out + err.err
    assert rc == 2 and "branch_depth is negative" in text and "Traceback" not in text
