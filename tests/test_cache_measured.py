"""The measured prefix-cache effect: hit rates, prefill tokens/s and the hit / miss split by
hand; the contract columns and the cache condition; compare's refusal."""

from __future__ import annotations

import math

import pytest

from capplan.cache import cache_effect, cache_timeline, check_cache_conditions
from capplan.errors import StudyError
from capplan.study import open_study
from capplan.validate import validate_path
from conftest import ev

SLO = "ttft_ms=500,attainment=0.9"


def _rows():
    """Run r1: 10 requests, 1 per second. Even ones hit (600 of 1000 prompt tokens cached),
    odd ones miss; hits get TTFT 100 ms, misses 100 ms except two at 900 ms (violations); one
    miss times out without a token."""
    rows = []
    for i in range(10):
        hit = i % 2 == 0
        ttft = 100.0 if hit or i in (1, 5) else 900.0
        st = "ok"
        if i == 9:
            st, ttft = "timeout", None
        rows.append(ev("r1", f"a{i}", scheduled_ms=1000.0 * i, ttft_ms=ttft, e2e_ms=None if ttft is None else 2000.0,
                       input_tokens=1000, output_tokens=0 if ttft is None else 10, status=st,
                       computed_input_tokens=400 if hit else 1000,
                       prefix_group="sys-a" if hit else None, session_id=f"s{i % 3}"))
    return rows


def test_hit_rates_tokens_and_split_by_hand(make_study):
    p = make_study(_rows(), runs=[{"run_id": "r1", "offered_rps": 1.0, "cache_condition": "production_warm"}])
    eff = cache_effect(p, SLO, warmup="none")
    r = eff.runs.iloc[0]
    assert (r["requests"], r["known"], r["hits"], r["unknown"]) == (10, 10, 5, 0)
    assert r["request_hit_rate"] == pytest.approx(0.5)
    # tokens: 5 × 400 + 5 × 1000 computed of 10 × 1000
    assert r["token_hit_rate"] == pytest.approx(1 - 7000 / 10000)
    # prefill tok/s over the 9-s window (0 … 9 s): the timed-out request never got a first token
    assert r["logical_prefill_tok_s"] == pytest.approx(9 * 1000 / 9.0)
    assert r["computed_prefill_tok_s"] == pytest.approx((5 * 400 + 4 * 1000) / 9.0)
    # hits: 5 of 5 good; misses: i = 1, 5 good, 3 and 7 too slow, 9 timed out → 2 / 5
    assert r["attainment_hit"] == pytest.approx(1.0)
    assert r["attainment_miss"] == pytest.approx(0.4)
    assert r["cache_condition"] == "production_warm"
    assert math.isnan(r["ttft_hit_p99_ms"])  # 5 requests: below the sample-size rule
    split = eff.split.set_index("cache")
    assert split.loc["miss", "good"] == 2 and split.loc["miss", "requests"] == 5
    b = eff.buckets
    assert b.loc[b["input_bucket"] == "512–2048", "hits"].item() == 5
    assert "r1" in eff.to_text() and len(eff.display_frame()) == 1


def test_ttft_percentiles_of_hits_and_misses(make_study):
    rows = []
    for i in range(200):
        hit = i % 2 == 0
        rows.append(ev("r1", f"b{i}", scheduled_ms=10.0 * i, ttft_ms=50.0 + (i % 7) if hit else 400.0 + (i % 11),
                       input_tokens=3000, computed_input_tokens=1000 if hit else 3000))
    eff = cache_effect(make_study(rows), SLO, warmup="none")
    r = eff.runs.iloc[0]
    hits = sorted(50.0 + (i % 7) for i in range(0, 200, 2))
    assert r["ttft_hit_p50_ms"] == pytest.approx(hits[49], rel=0.01)
    assert r["ttft_miss_p50_ms"] == pytest.approx(405.0, rel=0.01)


def test_unknown_rows_counted_out_loud(make_study):
    rows = _rows()
    for r in rows[:4]:
        r["computed_input_tokens"] = None
    eff = cache_effect(make_study(rows), SLO, warmup="none")
    r = eff.runs.iloc[0]
    assert (r["requests"], r["known"], r["hits"], r["unknown"]) == (10, 6, 3, 4)
    assert any("4 requests have no computed_input_tokens" in n for n in eff.notes)


def test_no_column_is_a_clear_error(make_study):
    p = make_study([ev("r1", "x", input_tokens=10)])
    with pytest.raises(StudyError, match="computed_input_tokens"):
        cache_effect(p, SLO)


def test_contract_columns_and_condition_validated(make_study):
    p = make_study(_rows(), runs=[{"run_id": "r1", "offered_rps": 1.0, "cache_condition": "production_warm"}])
    s = open_study(p)
    assert s.has("prefix_group") and s.has("session_id")
    assert s.manifest.run("r1").cache_condition == "production_warm"
    bad = _rows()
    bad[0]["computed_input_tokens"] = 2000
    problems, _ = validate_path(make_study(bad))
    assert any(pr.code == "computed_above_input" for pr in problems.errors)
    q = make_study(_rows(), runs=[{"run_id": "r1", "offered_rps": 1.0, "cache_condition": "warm"}])
    with pytest.raises(StudyError, match="cache_condition"):
        open_study(q)


def test_compare_refuses_different_conditions(make_study):
    a = open_study(make_study(_rows(), runs=[{"run_id": "r1", "offered_rps": 1.0, "cache_condition": "cold_model"}]))
    b = open_study(make_study(_rows(), runs=[{"run_id": "r1", "offered_rps": 1.0,
                                               "cache_condition": "production_warm"}]))
    with pytest.raises(StudyError, match="different prefix-cache conditions") as ei:
        check_cache_conditions(a.manifest, b.manifest, [("r1", "r1")])
    assert "--allow-cache-mismatch" in ei.value.format()
    notes = check_cache_conditions(a.manifest, b.manifest, [("r1", "r1")], allow=True)
    assert "allowed" in notes[0]
    assert check_cache_conditions(a.manifest, a.manifest, [("r1", "r1")]) == []


def test_hit_rate_over_time(make_study):
    tl = cache_timeline(make_study(_rows()), SLO, window_s=5.0)
    assert list(tl["requests"]) == [5, 5]
    assert tl["request_hit_rate"].iloc[0] == pytest.approx(3 / 5)  # i = 0, 2, 4


def test_aiperf_import_fills_cache_and_sessions(tmp_path):
    import json
    import shutil
    from pathlib import Path

    from capplan.importers import import_paths

    src = Path(__file__).parent / "fixtures" / "aiperf" / "artifacts" / "rate_3.0"
    dst = tmp_path / "rate_3.0"
    shutil.copytree(src, dst)
    lines = (dst / "profile_export.jsonl").read_text().splitlines()
    out, want = [], []
    for i, line in enumerate(lines):
        r = json.loads(line)
        r["metadata"]["turn_index"] = i % 2
        r["metadata"]["conversation_id"] = f"conv-{i // 2}"
        isl = (r.get("metrics") or {}).get("input_sequence_length", {}).get("value")
        if "error" not in r and isl is not None:
            r["metrics"]["usage_prompt_cache_read_tokens"] = {"value": 16 if i % 2 else 0, "unit": "tokens"}
            want.append(isl - (16 if i % 2 else 0))
        out.append(json.dumps(r))
    (dst / "profile_export.jsonl").write_text("\n".join(out) + "\n")
    res = import_paths("aiperf", [str(dst)])
    ev = res.events.to_pandas()
    got = ev["computed_input_tokens"].dropna().astype(int).tolist()
    assert sorted(got) == sorted(want) and len(got) == len(want)
    assert ev["session_id"].notna().all() and ev["session_id"].str.startswith("conv-").all()


def test_cli_compare_refuses_and_import_labels(make_study, tmp_path):
    from capplan.cli import main

    a = make_study(_rows(), runs=[{"run_id": "r1", "offered_rps": 1.0, "cache_condition": "cold_model"}])
    b = make_study(_rows(), runs=[{"run_id": "r1", "offered_rps": 1.0, "cache_condition": "production_warm"}])
    assert main(["compare", str(a), str(b), "--slo", SLO]) == 2
    assert main(["cache", str(a), "--slo", SLO, "--warmup", "none", "--window", "5",
                 "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "runs.csv").is_file() and (tmp_path / "c" / "timeline.csv").is_file()
