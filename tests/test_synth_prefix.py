"""Prefix caching in the simulator: synth studies with prefix groups and sessions, the measured
hit rate against the generating cache's own count, the hit / miss split by hand, LRU by hand,
routers, flushes, Mooncake hash ids."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capplan.cache import cache_effect, cache_timeline
from capplan.sim.config import PRESETS, parse_config
from capplan.sim.prefix import PrefixCache, PrefixCacheSpec, Prefixes
from capplan.sim.sweep import generate_study, simulate_level
from capplan.validate import validate_path

SLO = "ttft_ms=1500,tpot_ms=100,attainment=0.99"
MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces" / \
    "mooncake_conversation_trace.jsonl"


def _cfg(**over):
    raw = copy.deepcopy(PRESETS["small"])
    raw["sweep"] = {"load_model": "open", "rates": [2.0, 6.0], "duration_s": 60.0, "warmup_s": 0.0}
    raw["workload"]["prefixes"] = {"kind": "system", "groups": 6, "tokens": 1200, "share": 0.8, "zipf": 1.0}
    raw["prefix_cache"] = {"blocks": 300}
    for k, v in over.items():
        raw[k] = v
    return parse_config(raw)


def test_measured_hit_rate_equals_the_cache_count(tmp_path):
    cfg = _cfg()
    path, stats = generate_study(cfg, tmp_path / "s", workers=1)
    problems, _ = validate_path(path)
    assert not problems.errors
    eff = cache_effect(path, SLO, warmup="none").runs.set_index("run_id")
    for st in stats:
        r = eff.loc[st["run_id"]]
        assert st["prefix_hits"] > 0 and st["prefix_evicted_blocks"] > 0  # the cache is too small for all six
        assert r["known"] == st["prefix_lookups"]
        assert r["hits"] == st["prefix_hits"]
        assert r["request_hit_rate"] == pytest.approx(st["prefix_hits"] / st["prefix_lookups"], abs=0)
    ev = pd.read_parquet(path / "events")
    assert set(ev["prefix_group"].dropna()) <= {f"system-{i}" for i in range(6)}
    assert ev["prefix_group"].notna().mean() == pytest.approx(0.8, abs=0.06)
    # grouped prompts are 1,200 tokens longer; a hit saves whole 16-token blocks of the prefix
    hit = ev["computed_input_tokens"] < ev["input_tokens"]
    saved = (ev["input_tokens"] - ev["computed_input_tokens"])[hit]
    assert (saved == 1200 // 16 * 16).all()


def test_attainment_split_by_hit_and_miss_by_hand(tmp_path):
    path, _ = generate_study(_cfg(), tmp_path / "s", workers=1)
    eff = cache_effect(path, SLO, warmup="none")
    ev = pd.read_parquet(path / "events")
    ok = ev["status"].eq("ok") & ev["first_token_ns"].notna()
    ttft = (ev["first_token_ns"] - ev["scheduled_ns"]) / 1e6
    tpot = (ev["last_token_ns"] - ev["first_token_ns"]) / 1e6 / (ev["output_tokens"] - 1)
    good = ok & (ttft <= 1500) & (tpot.isna() | (ev["output_tokens"] <= 1) | (tpot <= 100))
    ev["good"] = good
    ev["cache"] = np.where(ev["computed_input_tokens"].isna(), "unknown",
                           np.where(ev["computed_input_tokens"] < ev["input_tokens"], "hit", "miss"))
    hand = ev.groupby(["run_id", "cache"])["good"].agg(["sum", "count"])
    split = eff.split.set_index(["run_id", "cache"])
    for (run, c), row in hand.iterrows():
        assert split.loc[(run, c), "good"] == row["sum"] and split.loc[(run, c), "requests"] == row["count"]
    r = eff.runs.set_index("run_id").loc["r02"]
    assert r["attainment_hit"] == pytest.approx(hand.loc[("r02", "hit"), "sum"] / hand.loc[("r02", "hit"), "count"])


def _px(chunks: list[list[tuple[int, int]]]) -> Prefixes:
    off, ids, tok = [0], [], []
    for c in chunks:
        ids += [x for x, _ in c]
        tok += [t for _, t in c]
        off.append(len(ids))
    n = len(chunks)
    z = np.full(n, -1, np.int64)
    return Prefixes(np.asarray(off), np.asarray(ids), np.asarray(tok), z, np.zeros(n, np.int64), z, z)


def test_lru_by_hand():
    # capacity 10 blocks of 16 tokens; chunks A (64 tok = 4 blocks), B (4 blocks), C (4 blocks)
    A, B, C = (1, 64), (2, 64), (3, 64)
    px = _px([[A], [B], [A, B], [C], [B], [A]])
    pc = PrefixCache(PrefixCacheSpec(blocks=10), px, 16, 1)
    assert pc.lookup(0, 0, 0, 100, True) == 0
    pc.prefilled(0, 0, 1)  # A cached (4 blocks)
    assert pc.lookup(0, 1, 2, 100, True) == 0
    pc.prefilled(0, 1, 3)  # B cached (8 blocks), LRU order A, B
    assert pc.lookup(0, 2, 4, 200, True) == 128  # A then B: both hit, touched (A, B)
    pc.prefilled(0, 3, 5)  # C (12 blocks > 10): evicts A, the least recently used
    assert pc.lookup(0, 4, 6, 100, True) == 64  # B still there
    assert pc.lookup(0, 5, 7, 100, True) == 0  # A evicted
    assert (pc.lookups, pc.hits, pc.hit_tokens, pc.evicted_blocks) == (5, 2, 192, 4)
    # at most the prompt less one token is a hit (a server always computes the last one)
    assert pc.lookup(0, 4, 8, 64, True) == 63


def test_flush_logged_and_seen_in_the_hit_rate(tmp_path):
    # 20 equally popular system prompts, all fit; at 3 req/s no request waits long, so the
    # windows (by scheduled time) see the cache as it was when they were sent
    cfg = _cfg(prefix_cache={"blocks": 5000, "flushes": [{"at_s": 30}]})
    cfg = cfg.with_(rates=(3.0,), prefixes=type(cfg.prefixes)(kind="system", groups=20, tokens=1200, share=0.8))
    res = simulate_level(cfg, 3.0, seed_key=(0,))
    assert res.timeline == [(30_000_000_000, "cache_flush", 0, {"detail": "prefix cache flushed"})]
    path, _ = generate_study(cfg, tmp_path / "s", workers=1)
    tl = cache_timeline(path, SLO, window_s=5.0)
    before = tl[(tl["t_s"] >= 15) & (tl["t_s"] < 30)]["request_hit_rate"].mean()
    after = tl[tl["t_s"] == 30]["request_hit_rate"].item()
    assert after < before - 0.05  # cold cache right after the flush …
    assert tl[tl["t_s"] >= 45]["request_hit_rate"].mean() > after  # … warm again later


def test_prefix_affinity_beats_least_work_on_a_small_cache():
    raw = copy.deepcopy(PRESETS["small"])
    raw["system"]["replicas"] = 4
    raw["workload"]["prefixes"] = {"kind": "system", "groups": 8, "tokens": 2000, "share": 1.0}
    base = dict(raw)
    rates = []
    for router in ("least_work", "prefix_affinity"):
        r = copy.deepcopy(base)
        r["prefix_cache"] = {"blocks": 300, "router": router}  # room for two of the eight prompts
        res = simulate_level(parse_config(r), 8.0, seed_key=(0,))
        rates.append(res.stats["prefix_hits"] / res.stats["prefix_lookups"])
    assert rates[1] > rates[0] + 0.2


def test_sessions_reuse_their_history(tmp_path):
    cfg = _cfg(prefix_cache={"blocks": 100_000})
    cfg = cfg.with_(prefixes=type(cfg.prefixes)(kind="sessions", active=6, turns=5, tokens=0), rates=(2.0,))
    path, stats = generate_study(cfg, tmp_path / "s", workers=1)
    ev = pd.read_parquet(path / "events")
    assert ev["session_id"].nunique() < len(ev) / 2
    first = ~ev["session_id"].duplicated()
    hit = ev["computed_input_tokens"] < ev["input_tokens"]
    assert not hit[first].any()  # a first turn has no history to reuse
    assert hit[~first].mean() > 0.8


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="public Mooncake trace not found at ../shared/data/traces")
def test_mooncake_hash_ids_replayed():
    raw = copy.deepcopy(PRESETS["small"])
    raw["replica"].update({"kv_blocks": 40_000, "max_model_len": 200_000, "token_budget": 8192})
    raw["workload"] = {"arrival": {"process": "replay", "path": str(MOONCAKE)}}
    raw["client"]["timeout_s"] = 900
    raw["prefix_cache"] = {"blocks": 10_000_000}
    cfg = parse_config(raw)
    res = simulate_level(cfg, 0.4, duration_s=300.0, seed_key=(0,))
    # the same 120 rows with an unbounded cache, inserted at arrival: the ideal hit count
    from capplan.sim.arrivals import load_trace, replay_rows
    tr = load_trace(MOONCAKE)
    _, rows, _ = replay_rows(tr, 0.4, 300.0)
    seen, ideal = set(), 0
    for r in rows:
        h = tr.hash_ids[r]
        ideal += bool(h) and h[0] in seen
        seen.update(h)
    st = res.stats
    assert st["prefix_lookups"] == len(rows)
    assert 0.9 * ideal <= st["prefix_hits"] <= ideal  # prompts cached when prefilled, not when sent


def test_same_config_same_bytes(tmp_path):
    cfg = _cfg(scheduling={"policy": "vtc"})
    a, _ = generate_study(cfg, tmp_path / "a", workers=1)
    b, _ = generate_study(cfg, tmp_path / "b", workers=2)
    h = lambda p: hashlib.sha256((p / "events" / "r02.parquet").read_bytes()).hexdigest()  # noqa: E731
    assert h(a) == h(b)


def test_flush_is_a_timeline_incident(tmp_path):
    from capplan.timeline import analyse_timeline

    raw = copy.deepcopy(PRESETS["small"])
    raw["sweep"] = {"load_model": "open", "rates": [3.0], "duration_s": 120.0, "warmup_s": 10.0}
    raw["workload"]["prefixes"] = {"kind": "system", "groups": 20, "tokens": 2500, "share": 0.9}
    raw["prefix_cache"] = {"blocks": 5000, "flushes": [{"at_s": 60}]}
    path, _ = generate_study(parse_config(raw), tmp_path / "s", workers=1)
    tl = pd.read_parquet(path / "timeline")
    assert list(tl["event"]) == ["cache_flush"] and tl["t_ns"].item() == 60_000_000_000
    assert tl["replica"].item() == "replica-0"
    t = analyse_timeline(path, SLO, window_s=5.0)
    inc = t.incidents_frame()
    assert list(inc["kind"]) == ["cache flush"] and inc["t_s"].item() == pytest.approx(60.0)


def test_prefixes_recovered_from_a_study(tmp_path):
    from capplan.cache import prefix_workload
    from capplan.twin import parse_scenario

    cfg = _cfg(prefix_cache={"blocks": 100_000})
    path, _ = generate_study(cfg.with_(rates=(4.0,), duration_s=300.0), tmp_path / "s", workers=1)
    pw, notes = prefix_workload(path)
    assert pw.kind == "system" and pw.groups == 6
    assert pw.share == pytest.approx(0.8, abs=0.03)
    assert pw.tokens == 1200 // 16 * 16  # what a hit saves: the prefix's whole blocks
    assert pw.zipf == pytest.approx(1.0, abs=0.35)
    sc = parse_scenario({"prefixes": {"from_study": str(path)}})
    assert sc.parts[0].spec == pw
    cfg2 = cfg.with_(prefixes=type(cfg.prefixes)(kind="sessions", active=6, turns=5, tokens=0), rates=(2.0,),
                     duration_s=600.0)
    path2, _ = generate_study(cfg2, tmp_path / "t", workers=1)
    pw2, _ = prefix_workload(path2)
    assert pw2.kind == "sessions" and pw2.turns == pytest.approx(5, rel=0.25) and pw2.active == pytest.approx(6, abs=3)
