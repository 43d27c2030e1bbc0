"""Serving-policy scenarios on the simulator and the twin: what a 90 % prefix-cache hit rate buys
against the prefill time it saves, a cache flush's transient, fair queuing under a flooding
tenant, deadline-slack admission at 1.5× capacity, and the scenario parts (YAML → study)."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from capplan.cache import cache_timeline
from capplan.errors import SpecError
from capplan.sim.config import PRESETS, parse_config
from capplan.sim.prefix import PrefixCacheSpec
from capplan.sim.sweep import generate_study
from capplan.twin import compare_policies, config_cslo, fit_twin, parse_scenario, run_scenario
from capplan.twin.cachesim import cache_sweep
from capplan.validate import validate_path
from tests.test_twin_fit import small_cfg

SLO = "ttft_ms=2000,tpot_ms=200,attainment=0.99"


def _long_system_prompts(arrival="poisson"):
    # one replica, colocated (chunked) prefill at 0.1 ms per token, decode 20–30 ms per step;
    # 90 % of requests start with the same 3,000-token system prompt, then 500 tokens of their own
    return parse_config({
        "name": "cache", "system": {"replicas": 1},
        "replica": {"max_batch": 64, "token_budget": 4096, "kv_blocks": 40000, "queue_limit": None,
                    "service_model": {"decode_step_ms": {1: 20.0, 64: 30.0}, "prefill_ms_per_token": 0.1}},
        "client": {"timeout_s": 120},
        "workload": {"arrival": {"process": arrival}, "lengths": {"kind": "fixed", "input": 500, "output": 50},
                     "prefixes": {"kind": "system", "groups": 1, "tokens": 3000, "share": 0.9}},
        "sweep": {"rates": [1.0], "duration_s": 300}})


@pytest.mark.slow
def test_ninety_percent_hits_raise_cslo_as_the_saved_prefill_predicts():
    sw = cache_sweep(_long_system_prompts(), "ttft_ms=30000,attainment=0.99",
                     {"no cache": {}, "cache": {"prefix_cache": {"blocks": 10_000}}},
                     runs=2, duration_s=600, workers=1, rel_tol=0.01)
    r = sw.rows.set_index("setting")
    assert r.loc["cache", "request_hit_rate"] == pytest.approx(0.9, abs=0.02)
    # prompt tokens computed per request: 0.9 × 3,500 + 0.1 × 500 = 3,200 without the cache; with it the
    # prompted requests compute their own 500 tokens and the 8 prefix tokens short of a whole block:
    # 0.9 × 508 + 0.1 × 500 = 507.2 — prefill 320 → 50.7 ms per request, beside 49 × 30 / 64 = 23 ms of
    # decoding at full batch
    assert r.loc["no cache", "mean_computed_tokens"] == pytest.approx(3200, rel=0.01)
    assert r.loc["cache", "mean_computed_tokens"] == pytest.approx(507.2, rel=0.01)
    dec = 49 * 30 / 64
    assert r.loc["cache", "predicted_gain"] == pytest.approx((320 + dec) / (50.72 + dec), rel=0.02)
    assert r.loc["cache", "gain"] == pytest.approx(r.loc["cache", "predicted_gain"], rel=0.10)
    assert r.loc["cache", "gain"] > 4



def test_flush_transient_against_the_same_run_without_it(tmp_path):
    # 30 equally popular 3,000-token system prompts (90 % of requests) at 6 req/s on the replica
    # above, the cache holding all of them; the same requests with and without a flush at 60 s.
    # By hand: a hit saves the prefix's whole blocks, 3,000 // 16 × 16 = 2,992 tokens; after the
    # flush every group's prompt is recomputed once (a few twice, when a second request of the
    # group is admitted while the first is still being prefilled; one or two not at all, when a
    # request still being prefilled at the flush puts its group back): about 30 extra misses, 9 s of
    # extra prefill work at 0.1 ms per token, arriving within a few seconds — a queue that breaks
    # the 2-s TTFT limit for one window, after which the run is the unflushed run again.
    base = _long_system_prompts()
    base = base.with_(rates=(6.0,), duration_s=120.0, warmup_s=10.0,
                      prefixes=type(base.prefixes)(kind="system", groups=30, tokens=3000, share=0.9))
    slo = "ttft_ms=2000,attainment=0.99"
    out = {}
    for name, flushes in (("plain", ()), ("flush", ((60.0, None),))):
        cfg = base.with_(prefix_cache=PrefixCacheSpec(blocks=20_000, flushes=flushes))
        path, _ = generate_study(cfg, tmp_path / name, workers=1)
        ev = pd.read_parquet(path / "events").sort_values("request_id").reset_index(drop=True)
        ev["miss"] = ev["prefix_group"].notna() & (ev["computed_input_tokens"] == ev["input_tokens"])
        out[name] = ev, cache_timeline(path, slo, window_s=10.0).set_index("t_s")
    (a, ta), (b, tb) = out["plain"], out["flush"]
    done = a["last_token_ns"] < 60e9  # the flush changes nothing before it
    assert done.sum() > 300 and a[done].equals(b[done])
    groups = b.loc[(b["scheduled_ns"] >= 60e9), "prefix_group"].nunique()
    extra = int(b["miss"].sum() - a["miss"].sum())
    assert groups == 30 and groups - 2 <= extra <= groups + 3  # each group recomputed about once
    assert b["computed_input_tokens"].sum() - a["computed_input_tokens"].sum() == extra * 2992
    # the transient: the window of the flush loses half its hits and most of its SLO …
    assert tb.loc[60.0, "request_hit_rate"] < ta.loc[60.0, "request_hit_rate"] - 0.3
    assert tb.loc[60.0, "attainment"] < 0.5 and ta.loc[60.0, "attainment"] == 1.0
    # … and 20 s later the flushed run is back where the unflushed one is
    later = tb.index >= 80.0
    assert (tb.loc[later, "attainment"] == 1.0).all()
    assert (tb.loc[later, "request_hit_rate"] - ta.loc[later, "request_hit_rate"]).abs().max() < 0.05

def test_fair_queuing_keeps_the_light_tenant_at_its_target():
    raw = copy.deepcopy(PRESETS["small"])
    raw["replica"]["queue_limit"] = None
    raw["client"]["timeout_s"] = 120
    raw["workload"]["tenants"] = [{"name": "heavy", "share": 0.85}, {"name": "light", "share": 0.15}]
    cfg = parse_config(raw)
    # the heavy tenant floods: 11 req/s offered, twice this replica's C_SLO (≈ 5.5 req/s);
    # the light tenant's 1.65 req/s is well within its fair share
    pc = compare_policies(cfg, SLO, rate=11.0, duration_s=400, policies={"FIFO": {}, "VTC": {"scheduling": {"policy": "vtc"}}})
    t = pc.detail.set_index(["policy", "tenant"])
    assert t.loc[("VTC", "light"), "attainment"] >= 0.99
    assert t.loc[("FIFO", "light"), "attainment"] < 0.5
    p = pc.rows.set_index("policy")
    assert p.loc["VTC", "goodput_rps"] > p.loc["FIFO", "goodput_rps"]
    # compare's fairness numbers: under VTC each tenant gets its max-min fair share of the service
    assert p.loc["VTC", "jain_index"] > p.loc["FIFO", "jain_index"]
    assert abs(p.loc["VTC", "fair_share_deviation"]) < abs(p.loc["FIFO", "fair_share_deviation"])
    assert "light" in pc.to_text()


def test_deadline_slack_admission_raises_goodput_over_capacity():
    raw = copy.deepcopy(PRESETS["small"])
    raw["replica"]["queue_limit"] = None
    raw["client"]["timeout_s"] = 120
    cfg = parse_config(raw)
    cap = config_cslo(cfg, SLO, start=5.0, runs=2, duration_s=300, workers=1, rel_tol=0.02).estimate
    pc = compare_policies(cfg, SLO, rate=1.5 * cap, duration_s=400, policies={
        "none": {}, "deadline slack": {"admission": {"policy": "deadline_slack", "ttft_ms": 2000, "margin_ms": 500}}})
    p = pc.rows.set_index("policy")
    assert p.loc["none", "goodput_rps"] < 0.2 * cap  # the queue grows: almost nobody meets TTFT
    assert p.loc["deadline slack", "goodput_rps"] > 0.8 * cap  # refusing early keeps the rest good
    assert p.loc["deadline slack", "rejected_share"] > 0.15


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    path, _ = generate_study(small_cfg(), tmp_path_factory.mktemp("pol") / "s", workers=1)
    return fit_twin(path, reps=30)


def test_scenario_parts_parse_and_name_fields():
    with pytest.raises(SpecError) as e:
        parse_scenario({"prefix_cache": {"blocks": 10, "router": "sticky"}})
    assert e.value.field == "prefix_cache.router"
    with pytest.raises(SpecError) as e:
        parse_scenario({"scheduling": {"policy": "lottery"}})
    assert e.value.field == "scheduling.policy"
    with pytest.raises(SpecError, match="needs a decode pool"):
        parse_scenario({"disaggregation": {"prefill": {"replicas": 2}}})
    with pytest.raises(SpecError) as e:
        parse_scenario({"prefixes": {"kind": "system", "share": 1.5}})
    assert e.value.field == "prefixes.share"


def test_cache_flush_scenario_shows_the_transient(twin, tmp_path):
    sc = parse_scenario({"name": "flush", "workload": {"rate_rps": 2.0},
                         "prefixes": {"kind": "system", "groups": 30, "tokens": 1500, "share": 0.9},
                         "prefix_cache": {"tokens": 2_000_000, "flushes": [{"at_s": 150}]},
                         "run": {"duration_s": 300, "warmup_s": 30, "seed": 3}})
    path, stats, ctx = run_scenario(twin, sc, tmp_path / "out", workers=1)
    problems, _ = validate_path(path)
    assert not problems.errors
    tl = cache_timeline(path, SLO, window_s=10.0)
    before = tl[(tl["t_s"] >= 90) & (tl["t_s"] < 150)]
    after = tl[(tl["t_s"] >= 150) & (tl["t_s"] < 160)]
    late = tl[tl["t_s"] >= 240]
    assert after["request_hit_rate"].mean() < before["request_hit_rate"].mean() - 0.3  # the cache is cold …
    assert late["request_hit_rate"].mean() > before["request_hit_rate"].mean() - 0.1  # … and warm again
    import yaml
    man = yaml.safe_load((path / "study.yaml").read_text())
    assert man["workload"]["prefix_cache"]["flushes"] == [{"at_s": 150.0, "replica": None}]
    assert "prefix cache" in man["scenario"]["summary"]


def test_disaggregated_and_policy_scenarios_write_studies(twin, tmp_path):
    sc = parse_scenario({"name": "pd", "workload": {"rate_rps": 2.0},
                         "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
                         "scheduling": {"policy": "vtc"},
                         "admission": {"ttft_ms": 2000, "margin_ms": 200},
                         "run": {"duration_s": 60, "warmup_s": 10}})
    ctx = sc.apply(twin)
    assert ctx.config.disagg is not None and ctx.config.policy.discipline == "vtc"
    assert ctx.config.policy.admission == "deadline_slack"
    path, stats, _ = run_scenario(twin, sc, tmp_path / "pd", workers=1)
    ev = pd.read_parquet(path / "events")
    assert set(ev["replica_group"].dropna()) <= {"prefill-0", "decode-0"}
    assert (ev["status"] == "ok").mean() > 0.9
