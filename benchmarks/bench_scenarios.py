"""Serving-policy scenarios at full size: the figures of docs/scenarios.md (issue 17).

    python benchmarks/bench_scenarios.py [--only cache flush pd pd-demo policies speed] [--workers 2] [--json out.json]

- ``cache``: the measured hit rate against the generating cache's own count (system prompts,
  sessions, the Mooncake trace's hash ids); a 90 % hit rate on 3,000-token system prompts —
  C_SLO gain against the gain the saved prefill time predicts (Poisson and constant arrivals,
  colocated prefill and one separate prefill lane);
  hit rate and C_SLO over cache sizes; least-work vs prefix-affinity routing on 4 replicas.
- ``flush``: a flush's transient — the same requests with and without a flush, five seeds: the
  extra misses and prefill work, the flush window's hit rate and attainment, how long until the
  flushed run is the unflushed one again.
- ``pd`` (and ``pd-demo``): the analytic prefill:decode sweep (deterministic service; every split of 8 one-GPU
  replicas against min(5 p, 8 d)); the colocated vs disaggregated ranking at a loose and a tight
  TTFT limit; a sweep on the default Llama-2-70B / H100 service model.
- ``policies``: one tenant flooding at 2× capacity — FIFO, VTC fair queuing, priority with aging
  — and deadline-slack admission at 1.5× capacity with margins 0–800 ms.
- ``speed``: simulated requests per second of the engine with each hook against the plain
  engine (same requests, same process: a ratio).

Figures are deterministic (seeded); the box is shared, so timings come with the load average.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capplan.cache import cache_effect, cache_timeline  # noqa: E402
from capplan.plan.candidates import compare_candidates, sweep_candidates
from capplan.plan import load_plan_spec  # noqa: E402
from capplan.sim.config import PRESETS, parse_config  # noqa: E402
from capplan.sim.disagg import parse_pool  # noqa: E402
from capplan.sim.policy import PolicySpec  # noqa: E402
from capplan.sim.prefix import PrefixCacheSpec, PrefixWorkload  # noqa: E402
from capplan.sim.sweep import generate_study, simulate_level  # noqa: E402
from capplan.twin.cachesim import cache_sweep  # noqa: E402
from capplan.twin.capacity import config_cslo  # noqa: E402
from capplan.twin.fairsim import compare_policies  # noqa: E402
from capplan.twin.pd import pd_sweep  # noqa: E402

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
MOONCAKE = TRACES / "mooncake_conversation_trace.jsonl"


def table(rows: list[dict], cols: list[str]) -> str:
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def flat(arrival="poisson", mode="mixed"):
    return {"name": "cache", "system": {"replicas": 1},
            "replica": {"max_batch": 64, "token_budget": 4096, "kv_blocks": 40000, "queue_limit": None,
                        "prefill": mode, **({"prefill_lanes": 1} if mode == "separate" else {}),
                        "service_model": {"decode_step_ms": {1: 20.0, 64: 30.0}, "prefill_ms_per_token": 0.1}},
            "client": {"timeout_s": 120},
            "workload": {"arrival": {"process": arrival}, "lengths": {"kind": "fixed", "input": 500, "output": 50},
                         "prefixes": {"kind": "system", "groups": 1, "tokens": 3000, "share": 0.9}},
            "sweep": {"rates": [1.0], "duration_s": 300}}


def bench_cache(workers: int) -> dict:
    out: dict = {}
    # 1. measured hit rate = the generating cache's count
    rows = []
    cases = {"system prompts (6, Zipf 1)": {"prefixes": {"kind": "system", "groups": 6, "tokens": 1200, "share": 0.8,
                                                          "zipf": 1.0}, "cache": {"blocks": 300}},
             "sessions (8 open, 5 turns)": {"prefixes": {"kind": "sessions", "active": 8, "turns": 5, "tokens": 300},
                                            "cache": {"blocks": 3000}}}
    if MOONCAKE.is_file():
        cases["Mooncake hash ids"] = {"trace": True, "cache": {"blocks": 60_000}}
    for name, c in cases.items():
        raw = copy.deepcopy(PRESETS["small"])
        raw["sweep"] = {"load_model": "open", "rates": [2.0, 4.0], "duration_s": 300.0, "warmup_s": 0.0}
        if c.get("trace"):
            raw["replica"].update({"kv_blocks": 60_000, "max_model_len": 200_000, "token_budget": 8192})
            raw["workload"] = {"arrival": {"process": "replay", "path": str(MOONCAKE)}}
            raw["client"]["timeout_s"] = 900
            raw["sweep"]["rates"] = [0.3, 0.6]
        else:
            raw["workload"]["prefixes"] = c["prefixes"]
        raw["prefix_cache"] = c["cache"]
        with tempfile.TemporaryDirectory() as d:
            path, stats = generate_study(parse_config(raw), Path(d) / "s", workers=workers)
            eff = cache_effect(path, "ttft_ms=2000,attainment=0.99", warmup="none").runs.set_index("run_id")
            for st in stats:
                r = eff.loc[st["run_id"]]
                rows.append({"workload": name, "run": st["run_id"], "rate": st["level"],
                             "engine hits / lookups": f"{st['prefix_hits']} / {st['prefix_lookups']}",
                             "measured hits / known": f"{r['hits']} / {r['known']}",
                             "request hit rate": float(r["request_hit_rate"]),
                             "token hit rate": float(r["token_hit_rate"]),
                             "equal": bool(r["hits"] == st["prefix_hits"] and r["known"] == st["prefix_lookups"])})
    out["hit_rate_equals_count"] = rows
    print("\n### Measured hit rate vs the generating cache's count\n")
    print(table(rows, ["workload", "run", "rate", "engine hits / lookups", "measured hits / known", "request hit rate",
                       "token hit rate", "equal"]))
    # 2. 90 % hit on long system prompts: gain vs prediction
    rows = []
    for mode, arrival in (("mixed", "poisson"), ("mixed", "constant"), ("separate", "poisson"), ("separate", "constant")):
        for slo in ("ttft_ms=30000,attainment=0.99", "ttft_ms=5000,attainment=0.99"):
            sw = cache_sweep(parse_config(flat(arrival, mode)), slo,
                             {"no cache": {}, "cache": {"prefix_cache": {"blocks": 10_000}}},
                             runs=4, duration_s=900, workers=workers, rel_tol=0.005)
            r = sw.rows.set_index("setting")
            rows.append({"prefill": "colocated" if mode == "mixed" else "one separate lane", "arrivals": arrival,
                         "SLO": slo, "hit rate": float(r.loc["cache", "request_hit_rate"]),
                         "C_SLO no cache": float(r.loc["no cache", "cslo_rps"]),
                         "C_SLO cache": float(r.loc["cache", "cslo_rps"]),
                         "CI cache": f"[{r.loc['cache', 'cslo_ci_low_rps']:.3g}, {r.loc['cache', 'cslo_ci_high_rps']:.3g}]",
                         "gain": float(r.loc["cache", "gain"]), "predicted gain": float(r.loc["cache", "predicted_gain"]),
                         "error": float(r.loc["cache", "gain"] / r.loc["cache", "predicted_gain"] - 1)})
    out["gain_vs_prediction"] = rows
    print("\n### 90 % hits on 3,000-token system prompts: C_SLO gain vs the saved prefill time\n")
    print(table(rows, ["prefill", "arrivals", "SLO", "hit rate", "C_SLO no cache", "C_SLO cache", "CI cache", "gain",
                       "predicted gain", "error"]))
    # 3. cache size sweep (8 system prompts of 2,000 tokens, Zipf 1): hit rate and C_SLO
    raw = flat()
    raw["workload"]["prefixes"] = {"kind": "system", "groups": 8, "tokens": 2000, "share": 0.9, "zipf": 1.0}
    settings = {"no cache": {}}
    for blocks in (125, 250, 500, 1000):
        settings[f"{blocks} blocks ({blocks * 16 // 2000} prompts)"] = {"prefix_cache": {"blocks": blocks}}
    sw = cache_sweep(parse_config(raw), "ttft_ms=30000,attainment=0.99", settings, runs=2, duration_s=900,
                     workers=workers)
    out["cache_size"] = sw.rows.to_dict("records")
    print("\n### Cache size: 8 system prompts of 2,000 tokens (Zipf 1)\n")
    print(table(out["cache_size"], ["setting", "request_hit_rate", "token_hit_rate", "mean_computed_tokens",
                                    "cslo_rps", "predicted_cslo_rps", "gain", "predicted_gain"]))
    # 4. routers
    rows = []
    for router in ("least_work", "prefix_affinity"):
        r = copy.deepcopy(PRESETS["small"])
        r["system"]["replicas"] = 4
        r["workload"]["prefixes"] = {"kind": "system", "groups": 8, "tokens": 2000, "share": 1.0}
        r["prefix_cache"] = {"blocks": 300, "router": router}
        cfg = parse_config(r)
        res = simulate_level(cfg, 8.0, duration_s=600, seed_key=(0,))
        c = config_cslo(cfg, "ttft_ms=2000,tpot_ms=200,attainment=0.99", start=8.0, runs=2, duration_s=900,
                        workers=workers)
        rows.append({"router": router, "hit rate at 8 req/s": res.stats["prefix_hits"] / res.stats["prefix_lookups"],
                     "C_SLO": c.estimate, "CI": f"[{c.ci_low:.3g}, {c.ci_high:.3g}]"})
    out["routers"] = rows
    print("\n### Router on 4 replicas, 8 system prompts, cache for two of them per replica\n")
    print(table(rows, ["router", "hit rate at 8 req/s", "C_SLO", "CI"]))
    return out


def bench_flush(workers: int) -> dict:
    """A flush's transient: the same requests with and without a flush at 300 s, five seeds."""
    out: dict = {}
    raw = flat()
    raw["workload"]["prefixes"] = {"kind": "system", "groups": 30, "tokens": 3000, "share": 0.9}
    raw["sweep"] = {"rates": [6.0], "duration_s": 600, "warmup_s": 60}
    slo, at_s, win = "ttft_ms=2000,attainment=0.99", 300.0, 10.0
    rows, windows = [], None
    for seed in range(5):
        got = {}
        for name, flushes in (("plain", []), ("flush", [{"at_s": at_s}])):
            r = copy.deepcopy(raw)
            r["seed"], r["prefix_cache"] = seed, {"blocks": 20_000, "flushes": flushes}
            with tempfile.TemporaryDirectory() as d:
                path, _ = generate_study(parse_config(r), Path(d) / "s", workers=1)
                tl = cache_timeline(path, slo, window_s=win).set_index("t_s")
                ev = pd.read_parquet(path / "events").sort_values("request_id").reset_index(drop=True)
            ev["t_s"] = ev["scheduled_ns"] / 1e9
            ev["ttft_ms"] = (ev["first_token_ns"] - ev["scheduled_ns"]) / 1e6
            ev["miss"] = ev["prefix_group"].notna() & (ev["computed_input_tokens"] == ev["input_tokens"])
            ev["late"] = ~(ev["ttft_ms"] <= 2000)  # no first token counts as late
            got[name] = ev, tl
        (a, ta), (b, tb) = got["plain"], got["flush"]
        after = b["t_s"] >= at_s
        extra_tok = int(b["computed_input_tokens"].sum() - a["computed_input_tokens"].sum())
        differ = (tb["attainment"] < ta["attainment"]) | ((tb["request_hit_rate"] - ta["request_hit_rate"]).abs() >= 0.05)
        differ = differ[differ.index >= at_s]
        changed = b["late"] != a["late"]
        rows.append({
            "seed": seed, "groups after": int(b.loc[after, "prefix_group"].nunique()),
            "extra misses": int(b["miss"].sum() - a["miss"].sum()), "extra prompt tokens": extra_tok,
            "extra prefill s": extra_tok * 0.1 / 1000,
            "hit rate in flush window (plain)": f"{tb.loc[at_s, 'request_hit_rate']:.3f} "
                                                f"({ta.loc[at_s, 'request_hit_rate']:.3f})",
            "attainment in flush window (plain)": f"{tb.loc[at_s, 'attainment']:.3f} ({ta.loc[at_s, 'attainment']:.3f})",
            "max TTFT after flush (plain), s": f"{b.loc[after, 'ttft_ms'].max() / 1e3:.2f} "
                                               f"({a.loc[after, 'ttft_ms'].max() / 1e3:.2f})",
            "extra late first tokens": int(b["late"].sum() - a["late"].sum()),
            "last changed SLO outcome, s after": float(b.loc[changed, "t_s"].max() - at_s) if changed.any() else 0.0,
            "windows differing": int(differ.sum()),
            "same as plain from, s after": float(differ[differ].index.max() + win - at_s) if differ.any() else 0.0})
        if seed == 0:
            windows = pd.concat([tb[["requests", "request_hit_rate", "attainment"]],
                                 ta[["request_hit_rate", "attainment"]].add_suffix(" (plain)")], axis=1)
            windows = windows[(windows.index >= at_s - 30) & (windows.index < at_s + 60)].reset_index()
    out["flush_windows"] = windows.to_dict("records")
    out["flush"] = rows
    print("\n### A flush at 300 s (30 system prompts of 3,000 tokens, 6 req/s; seed 0, 10-s windows)\n")
    print(table(out["flush_windows"], list(windows.columns)))
    print("\n### The flush's transient against the same requests without it, five seeds\n")
    print(table(rows, list(rows[0])))
    return out


def pd_raw(arrival="constant", inp=2000):
    return {"name": "pd", "system": {"replicas": 8, "gpus_per_replica": 1},
            "replica": {"max_batch": 64, "token_budget": 4096, "kv_blocks": 40000, "queue_limit": None,
                        "service_model": {"decode_step_ms": {1: 20.0, 256: 20.0}, "prefill_ms_per_token": 0.1}},
            "client": {"timeout_s": 120},
            "workload": {"arrival": {"process": arrival}, "lengths": {"kind": "fixed", "input": inp, "output": 401}},
            "sweep": {"rates": [2.0], "duration_s": 60}}


def bench_pd(workers: int) -> dict:
    out: dict = {}
    cfg = parse_config(pd_raw())
    pre = parse_pool({"replicas": 1, "usd_per_gpu_hour": 2.0}, "prefill", cfg.replica)
    dec = parse_pool({"replicas": 1, "usd_per_gpu_hour": 2.0}, "decode", cfg.replica)
    sw = pd_sweep(cfg, "ttft_ms=1000,tpot_ms=25,attainment=0.99", prefill=pre, decode=dec, total_replicas=8,
                  runs=2, duration_s=600, workers=workers, rel_tol=0.005)
    rows = sw.rows.to_dict("records")
    for r in rows:
        if r["kind"] == "disaggregated":
            r["analytic"] = float(min(5 * r["prefill_replicas"], 8 * r["decode_replicas"]))
            r["error"] = r["cslo_rps"] / r["analytic"] - 1
    out["analytic"] = rows
    print(f"\n### Prefill:decode sweep against the analytic capacities (best: {sw.best})\n")
    print(table(rows, ["configuration", "analytic", "cslo_rps", "error", "cslo_per_gpu_rps", "cost_usd_per_1k_good",
                       "binding_pool", "backlog_prefill", "backlog_decode"]))
    spec = load_plan_spec({"demand": {"peak_rps": 100.0, "mean_to_peak": 1.0}, "capacity": {"good_fraction": 0.99},
                           "replica_group": {"gpus_per_replica": 1, "gpus_per_node": 8}, "failure": {"policy": "none"},
                           "rollout": {"max_surge": 1}, "prices": {"usd_per_gpu_hour": 2.0, "billing": "gpu"}})
    cfg = parse_config(pd_raw("poisson", 2500))
    rows = []
    for ttft in (10_000, 2000, 1000, 400):
        sw = pd_sweep(cfg, f"ttft_ms={ttft},tpot_ms=30,attainment=0.99", prefill=pre, decode=dec,
                      ratios=[(4, 4), (5, 3)], runs=2, duration_s=600, workers=workers, rel_tol=0.01)
        cmp = compare_candidates(sweep_candidates(sw, spec))
        r = sw.rows.set_index("configuration")
        rows.append({"TTFT limit (ms)": ttft, "4:4": float(r.loc["4:4", "cslo_rps"]),
                     "5:3": float(r.loc["5:3", "cslo_rps"]), "colocated ×8": float(r.loc["colocated ×8", "cslo_rps"]),
                     "best": cmp.best, "settled": cmp.settled})
    out["flip"] = rows
    print("\n### Colocated vs disaggregated by TTFT limit (TPOT 30 ms, Poisson, 2,500-token prompts)\n")
    print(table(rows, ["TTFT limit (ms)", "4:4", "5:3", "colocated ×8", "best", "settled"]))
    return out


def bench_pd_demo(workers: int) -> dict:
    out: dict = {}
    # the default service model (Llama-2-70B on H100, TP4) and the demo's workload, 8 replicas
    demo = copy.deepcopy(PRESETS["demo"])
    demo["system"]["replicas"] = 8
    demo.pop("power", None)
    cfg = parse_config(demo)
    g = cfg.system["gpus_per_replica"]  # TP4: a replica of either pool is 4 GPUs, as colocated
    pre = parse_pool({"replicas": 1, "usd_per_gpu_hour": 2.5}, "prefill", cfg.replica, base_gpus=g)
    dec = parse_pool({"replicas": 1, "usd_per_gpu_hour": 2.5}, "decode", cfg.replica, base_gpus=g)
    sw = pd_sweep(cfg, "ttft_ms=2000,tpot_ms=100,attainment=0.99", prefill=pre, decode=dec, total_replicas=8,
                  runs=2, duration_s=900, workers=workers)
    out["demo"] = sw.rows.to_dict("records")
    print(f"\n### Demo workload on Llama-2-70B / H100 TP4, 8 replicas (32 GPUs) — best {sw.best}\n")
    print(table(out["demo"], ["configuration", "cslo_rps", "cslo_ci_low_rps", "cslo_ci_high_rps", "cslo_per_gpu_rps",
                              "cost_usd_per_1k_good", "binding_pool"]))
    return out


def bench_policies(workers: int) -> dict:
    out: dict = {}
    slo = "ttft_ms=2000,tpot_ms=200,attainment=0.99"
    raw = copy.deepcopy(PRESETS["small"])
    raw["replica"]["queue_limit"] = None
    raw["client"]["timeout_s"] = 120
    raw["workload"]["tenants"] = [{"name": "heavy", "share": 0.85}, {"name": "light", "share": 0.15}]
    cfg = parse_config(raw)
    cap = config_cslo(cfg, slo, start=5.0, runs=4, duration_s=900, workers=workers)
    out["capacity"] = {"estimate": cap.estimate, "ci": [cap.ci_low, cap.ci_high]}
    print(f"\nC_SLO of the replica: {cap.estimate:.3g} req/s [{cap.ci_low:.3g}, {cap.ci_high:.3g}]")
    pc = compare_policies(cfg, slo, rate=2 * cap.estimate, duration_s=1200, policies={
        "FIFO": {}, "VTC fair queuing": {"scheduling": {"policy": "vtc"}},
        "priority, aging 30 s": {"scheduling": {"policy": "priority", "priorities": {"light": 0, "heavy": 1},
                                                "aging_s": 30}},
        "priority, aging 300 s": {"scheduling": {"policy": "priority", "priorities": {"light": 0, "heavy": 1},
                                                 "aging_s": 300}}})
    rows = []
    for r in pc.rows.to_dict("records"):
        t = pc.detail[pc.detail["policy"] == r["policy"]].set_index("tenant")
        rows.append({**r, "light attainment": float(t.loc["light", "attainment"]),
                     "heavy attainment": float(t.loc["heavy", "attainment"]),
                     "light share / fair": f"{t.loc['light', 'service_share']:.3f} / {t.loc['light', 'fair_share']:.3f}"})
    out["flooding"] = rows
    print(f"\n### One tenant flooding at {2 * cap.estimate:.3g} req/s (2× C_SLO; light tenant 15 %)\n")
    print(table(rows, ["policy", "goodput_rps", "light attainment", "heavy attainment", "light share / fair",
                       "jain_index", "fair_share_deviation", "timeout_share"]))
    pols = {"no admission": {}}
    for m in (0, 300, 500, 800):
        pols[f"deadline slack, margin {m} ms"] = {"admission": {"policy": "deadline_slack", "ttft_ms": 2000, "margin_ms": m}}
    pc = compare_policies(replace(cfg, tenants=()), slo, rate=1.5 * cap.estimate, duration_s=1200, policies=pols)
    out["admission"] = pc.rows.to_dict("records")
    print(f"\n### Deadline-slack admission at {1.5 * cap.estimate:.3g} req/s (1.5× C_SLO)\n")
    print(table(out["admission"], ["policy", "goodput_rps", "attainment", "rejected_share", "timeout_share"]))
    return out


def bench_speed() -> dict:
    raw = copy.deepcopy(PRESETS["demo"])
    raw.pop("power", None)
    base = parse_config(raw)
    cases = {"plain engine": base,
             "prefix cache (system prompts)": replace(base, prefixes=PrefixWorkload("system", groups=8, tokens=1000,
                                                                                     share=0.9),
                                                      prefix_cache=PrefixCacheSpec(blocks=5000)),
             "VTC fair queuing": replace(base, policy=PolicySpec("vtc")),
             "deadline-slack admission": replace(base, policy=PolicySpec(admission="deadline_slack", ttft_ms=2000))}
    rows = []
    t_plain = None
    for name, cfg in cases.items():
        best = np.inf
        for _ in range(3):
            t0 = time.process_time()
            res = simulate_level(cfg, 5.5, duration_s=1200, seed_key=(0,))
            best = min(best, time.process_time() - t0)
        n = len(res.sched_ns)
        t_plain = best if t_plain is None else t_plain
        rows.append({"engine": name, "requests": n, "CPU s": best, "requests per CPU s": n / best,
                     "vs plain": best / t_plain})
    print("\n### Engine speed (demo preset at 5.5 req/s for 1,200 s; best of 3, CPU seconds)\n")
    print(table(rows, ["engine", "requests", "CPU s", "requests per CPU s", "vs plain"]))
    return {"speed": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=["cache", "flush", "pd", "pd-demo", "policies", "speed"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t0 = time.time()
    print(f"load average at start: {os.getloadavg()}")
    res = {}
    for part, fn in (("cache", bench_cache), ("flush", bench_flush), ("pd", bench_pd), ("pd-demo", bench_pd_demo),
                     ("policies", bench_policies)):
        if part in a.only:
            res[part] = fn(a.workers)
    if "speed" in a.only:
        res["speed"] = bench_speed()
    print(f"\ntotal {time.time() - t0:.0f} s; load average at end: {os.getloadavg()}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
