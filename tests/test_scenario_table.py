"""ScenarioTable, the one result of the cache, prefill:decode and policy sweeps: each sweep's text,
display frame and JSON against hand-written rows (no simulation), missing values as the mark, and
the sweeps file building its scenarios through the parts registry (the same configurations the
sweeps built by hand before, and the same field names in errors)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest

from capplan.errors import SpecError
from capplan.present import MISSING
from capplan.slo import SLO
from capplan.sim import disagg as D
from capplan.sim import policy as PO
from capplan.sim import prefix as PX
from capplan.twin import ScenarioTable
from capplan.twin.cachesim import CACHE_LAYOUT
from capplan.twin.fairsim import POLICIES_LAYOUT
from capplan.twin.parts import on_config, policy_scenario
from capplan.twin.pd import PD_LAYOUT
from capplan.twin.sweepfile import parse_sweeps
from capplan.twin.table import render
from tests.test_twin_fit import small_cfg

S = SLO.parse("ttft_ms=2000,attainment=0.99")


def _pd(cost=0.32671, low=13.7):
    rows = pd.DataFrame([
        {"configuration": "3:5", "kind": "disaggregated", "prefill_replicas": 3, "decode_replicas": 5, "gpus": 8,
         "cslo_rps": 24.0, "cslo_ci_low_rps": 23.5, "cslo_ci_high_rps": 24.4, "cslo_per_gpu_rps": 3.0,
         "cost_usd_per_1k_good": cost, "binding_pool": "decode"},
        {"configuration": "colocated ×2", "kind": "colocated", "prefill_replicas": None, "decode_replicas": None,
         "gpus": 8, "cslo_rps": math.nan, "cslo_ci_low_rps": math.nan, "cslo_ci_high_rps": math.nan,
         "cslo_per_gpu_rps": math.nan, "cost_usd_per_1k_good": math.nan, "binding_pool": MISSING}])
    return ScenarioTable("pd", S, rows, PD_LAYOUT, best="3:5", notes=("a note",))


def test_pd_text_by_hand_and_missing_values_as_the_mark():
    t = _pd()
    assert t.to_text().splitlines() == [
        f"Prefill:decode sweep (SLO {S}); best: 3:5",
        "             3:5: C_SLO 24 req/s [23.5, 24.4] on 8 GPUs = 3 per GPU, $0.3267 per 1 000 good requests; "
        "binding: decode",
        # no C_SLO: the mark; no cost: the clause left out (a price was not given), not "$—"
        "    colocated ×2: C_SLO — req/s [—, —] on 8 GPUs = — per GPU; binding: —",
        "  note: a note"]
    d = t.display_frame()
    assert list(d.columns)[:6] == ["Configuration", "Prefill replicas", "Decode replicas", "GPUs", "C_SLO (req/s)",
                                   "95 % interval"]
    assert list(d["95 % interval"]) == ["23.5–24.4", MISSING]  # a template of missing values is the mark
    assert d["C_SLO (req/s)"].iloc[0] == 24.0  # numbers stay numbers for the report's styler
    doc = json.loads(t.to_json())
    assert doc["best"] == "3:5" and doc["rows"][1]["cslo_rps"] is None and doc["detail"] is None
    assert doc["title"].endswith("best: 3:5") and doc["kind"] == "pd"
    assert t.to_frame() is not t.rows and t.to_frame().equals(t.rows)


def test_cache_and_policy_lines_match_the_old_fstrings():
    r = {"setting": "cached", "request_hit_rate": 0.9079, "token_hit_rate": 0.6741, "mean_computed_tokens": 652.6,
         "cslo_rps": 7.2, "cslo_ci_low_rps": 7.0, "cslo_ci_high_rps": 7.4, "gain": 2.5352, "predicted_gain": 1.8311}
    old = (f"  {r['setting']:>20}: hit rate {r['request_hit_rate']:.1%} of requests, "
           f"{r['token_hit_rate']:.1%} of prompt tokens; {r['mean_computed_tokens']:,.0f} prompt tokens "
           f"computed per request; C_SLO {r['cslo_rps']:.3g} req/s [{r['cslo_ci_low_rps']:.3g}, "
           f"{r['cslo_ci_high_rps']:.3g}] (×{r['gain']:.2f}; predicted ×{r['predicted_gain']:.2f})")
    t = ScenarioTable("cache", S, pd.DataFrame([r]), CACHE_LAYOUT)
    assert t.to_text().splitlines()[1] == old
    p = {"policy": "FIFO", "goodput_rps": 7.321, "attainment": 0.9634, "rejected_share": 0.0,
         "timeout_share": 0.0013, "jain_index": 1.0, "fair_share_deviation": 0.0}
    ten = [{"policy": "FIFO", "tenant": "acme", "offered": 1437, "good": 1384, "attainment": 0.9631,
            "ttft_p99_ms": math.nan, "service_share": 0.59, "fair_share": 0.59}]
    t = ScenarioTable("policies", S, pd.DataFrame([p]), POLICIES_LAYOUT, detail=pd.DataFrame(ten), rate_rps=8.0)
    lines = t.to_text().splitlines()
    assert lines[0] == f"Policies at 8 req/s (SLO {S})"
    assert lines[1] == (" " * 20 + "FIFO: goodput 7.32 req/s, attainment 0.963, rejected 0.0%, timed out 0.1%; "
                        "Jain 1.000, largest deviation +0.000")
    assert lines[2] == " " * 26 + "acme: attainment 0.963 of 1,437 offered; service share 0.590 (fair 0.590)"
    assert t.display_frame("detail")["TTFT p99 (ms)"].isna().all()  # raw: the styler prints the mark
    with pytest.raises(ValueError, match="no 'detail' frame"):
        _pd().display_frame("detail")


def test_a_missing_name_pads_like_a_value():
    assert render("[{x:>5}]", {"x": None}) == f"[    {MISSING}]"
    assert render("{x:.1%} {y:,}", {"x": math.nan, "y": pd.NA}) == f"{MISSING} {MISSING}"


def test_policy_scenarios_build_the_configurations_the_sweeps_built_by_hand():
    cfg = small_cfg()
    px = {"kind": "system", "groups": 2, "tokens": 1500, "share": 0.9}
    got = on_config(cfg, policy_scenario("cached", {"prefixes": px, "prefix_cache": {"tokens": 50000}})).config
    by_hand = replace(cfg, prefixes=PX.parse_workload(px, "p"),
                      prefix_cache=PX.parse_cache({"tokens": 50000}, "c", block_size=cfg.replica.block_size))
    assert got == by_hand
    sched, adm = {"policy": "vtc"}, {"ttft_ms": 2000, "margin_ms": 500}
    got = on_config(cfg, policy_scenario("p", {"scheduling": sched, "admission": adm})).config
    assert got == replace(cfg, policy=PO.parse_policy(sched, adm))
    assert on_config(cfg, policy_scenario("FIFO", {})).config == cfg
    raw = {"prefill": {"replicas": 3}, "decode": {"replicas": 5}, "kv_transfer": {}, "lanes": 1}
    sw = parse_sweeps({"pd": {"ratios": [[3, 5]], **raw}})
    from capplan.twin.scenario import Scenario

    spec = on_config(cfg, Scenario("pd", "", (sw.pd["pools"],))).config.disagg
    assert spec == D.parse_disagg(raw, "pd", cfg.replica, base_gpus=int(cfg.system["gpus_per_replica"]),
                                  base_gpu=str(cfg.system["gpu"]))


def test_sweeps_file_errors_name_the_same_fields():
    cases = [({"cache": {"settings": {"x": {"prefixes": {"kind": "system", "share": 1.5}}}}},
              "cache.settings.x.prefixes.share"),
             ({"cache": {"settings": {"x": {"prefix_cache": {"blocks": 10, "router": "sticky"}}}}},
              "cache.settings.x.prefix_cache.router"),
             ({"cache": {"settings": {"x": {"scheduling": {}}}}}, "cache.settings.x.scheduling"),
             ({"policies": {"rate_rps": 2, "policies": {"P": {"scheduling": {"policy": "lottery"}}}}},
              "policies.policies.P.scheduling.policy"),
             ({"policies": {"rate_rps": 2, "policies": {"P": {"admission": {"margin_ms": -1}}}}},
              "policies.policies.P.admission.margin_ms")]
    for raw, fld in cases:
        with pytest.raises(SpecError) as e:
            parse_sweeps(raw)
        assert e.value.field == fld, (raw, e.value.field)


def test_a_sweep_refuses_a_part_that_needs_the_twin():
    from capplan.twin import parse_scenario

    with pytest.raises(SpecError, match="needs a twin"):
        policy_scenario("bigger", parse_scenario({"system": {"replicas": 4}}))
    with pytest.raises(SpecError) as e:
        policy_scenario("bigger", {"system": {"replicas": 4}}, "settings.bigger")
    assert e.value.field == "settings.bigger.system"
