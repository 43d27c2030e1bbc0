"""A small vectorised baseline/candidate pair generator for the compare tests (and its own
sanity tests). A *trace* is the offered workload (arrival times, token lengths, tenants); a
*server* turns a trace into per-request outcomes with its own noise seed. Two studies replay
the same trace rows when they share the trace; TTFT depends on the trace (prompt length and
recent arrivals), so a paired comparison cancels that part of the noise.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from capplan.io import manifest_dict, write_study

SLO_TEXT = "ttft_ms=600,attainment=0.9"  # the generated baseline (≈ 0.94) is within it
LONG_INPUT = 4096  # prompts at or above this are "long"


def make_trace(n: int = 4000, rate_rps: float = 20.0, seed: int = 0, *, long_frac: float = 0.2,
               tenants=("a", "b", "c"), arrival: str = "poisson", run_id: str = "r1") -> dict:
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate_rps, n)
    else:
        gaps = np.full(n, 1.0 / rate_rps)
    t_s = np.cumsum(gaps) - gaps[0]
    long = rng.random(n) < long_frac
    inp = np.where(long, rng.integers(LONG_INPUT, 8192, n), rng.integers(32, 1024, n))
    return {
        "run_id": np.full(n, run_id, dtype=object),
        "request_id": np.array([f"{run_id}-{i}" for i in range(n)], dtype=object),
        "t_s": t_s,
        "scheduled_ns": np.round(t_s * 1e9).astype(np.int64),
        "input_tokens": inp.astype(np.int64),
        "output_tokens": rng.integers(16, 512, n).astype(np.int64),
        "tenant": rng.choice(np.array(tenants, dtype=object), n),
        "slo_class": rng.choice(np.array(["interactive", "batch"], dtype=object), n, p=[0.7, 0.3]),
        "rate_rps": rate_rps, "arrival": arrival,
    }


def serve(trace: dict, seed: int, *, long_slow: float = 1.0, short_slow: float = 1.0,
          speed: float = 1.0, error_rate: float = 0.0005, reject_rate: float = 0.0,
          noise_sd: float = 0.3) -> dict:
    """Per-request outcomes. TTFT = (40 + 0.06·input) ms × congestion^1.5 × lognormal noise,
    × ``long_slow`` for long prompts (``short_slow`` for the others), × ``speed`` everywhere; congestion = arrivals in the last
    2 s over the mean (a property of the trace)."""
    rng = np.random.default_rng(seed)
    t = trace["t_s"]
    n = t.size
    rate = trace["rate_rps"]
    cnt = np.arange(n) - np.searchsorted(t, t - 2.0) + 1
    cong = np.clip(cnt / (2.0 * rate), 0.3, 3.0)
    inp = trace["input_tokens"]
    ttft_ms = (40.0 + 0.06 * inp) * cong ** 1.5 * np.exp(rng.normal(0.0, noise_sd, n)) * speed
    ttft_ms = ttft_ms * np.where(inp >= LONG_INPUT, long_slow, short_slow)
    tpot_ms = 15.0 * np.sqrt(cong) * np.exp(rng.normal(0.0, 0.15, n)) * speed
    u = rng.random(n)
    status = np.where(u < reject_rate, "rejected",
                      np.where(u < reject_rate + error_rate, "error", "ok")).astype(object)
    ok = status == "ok"
    sched = trace["scheduled_ns"]
    first = sched + np.round(ttft_ms * 1e6).astype(np.int64)
    out = np.where(ok, trace["output_tokens"], 0)
    last = first + np.round(tpot_ms * 1e6 * np.maximum(out - 1, 0)).astype(np.int64)
    return {"status": status, "first_token_ns": np.where(ok, first, 0),
            "last_token_ns": np.where(ok, last, 0), "output_tokens": out, "ok": ok}


def events_table(trace: dict, outcome: dict, *, drop: int = 0) -> pa.Table:
    ok = outcome["ok"]
    keep = slice(0, trace["t_s"].size - drop)
    cols = {
        "run_id": pa.array(trace["run_id"][keep], pa.string()),
        "request_id": pa.array(trace["request_id"][keep], pa.string()),
        "scheduled_ns": pa.array(trace["scheduled_ns"][keep], pa.int64()),
        "sent_ns": pa.array(trace["scheduled_ns"][keep], pa.int64()),
        "first_token_ns": pa.array(outcome["first_token_ns"][keep], pa.int64(), mask=~ok[keep]),
        "last_token_ns": pa.array(outcome["last_token_ns"][keep], pa.int64(), mask=~ok[keep]),
        "input_tokens": pa.array(trace["input_tokens"][keep], pa.int64()),
        "output_tokens": pa.array(outcome["output_tokens"][keep], pa.int64()),
        "status": pa.array(outcome["status"][keep], pa.string()),
        "tenant": pa.array(trace["tenant"][keep], pa.string()),
        "slo_class": pa.array(trace["slo_class"][keep], pa.string()),
    }
    return pa.table(cols)


def write_pair_study(dest, traces: list[dict], outcomes: list[dict], *, name: str = "s",
                     gpus: int = 1, drop: int = 0, label_arrival: bool = True, **manifest_extra):
    runs = [{"run_id": str(tr["run_id"][0]), "offered_rps": float(tr["rate_rps"]),
             "arrival": tr["arrival"] if label_arrival else "unknown"} for tr in traces]
    tables = [events_table(tr, o, drop=drop) for tr, o in zip(traces, outcomes)]
    table = pa.concat_tables(tables)
    system = {"gpu": "H100", "gpus_per_replica": gpus, "tp": gpus, "pp": 1, "replicas": 1}
    manifest = manifest_dict(name, runs, system=system, **manifest_extra)
    return write_study(dest, manifest, table)


def make_pair(tmp_path, *, seed: int = 0, n: int = 4000, rate_rps: float = 20.0,
              same_trace: bool = True, cand: dict | None = None, base: dict | None = None,
              trace_kw: dict | None = None, cand_trace_kw: dict | None = None,
              tag: str = "", drop: int = 0):
    """(baseline path, candidate path). Baseline server seed 2·seed+1, candidate 2·seed+2;
    the candidate replays the same trace rows unless ``same_trace`` is False."""
    tb = make_trace(n, rate_rps, seed=10_000 + seed, **(trace_kw or {}))
    if same_trace and cand_trace_kw is None:
        tc = tb
    else:
        tc = make_trace(n, rate_rps, seed=20_000 + seed, **{**(trace_kw or {}),
                                                           **(cand_trace_kw or {})})
    ob = serve(tb, 2 * seed + 1, **(base or {}))
    oc = serve(tc, 2 * seed + 2, **(cand or {}))
    pb = write_pair_study(tmp_path / f"base{tag}{seed}", [tb], [ob], name="baseline")
    pc = write_pair_study(tmp_path / f"cand{tag}{seed}", [tc], [oc], name="candidate", drop=drop)
    return pb, pc


# ---------------------------------------------------------------- the generator's own checks

def test_trace_is_reproducible_and_seed_dependent():
    a, b, c = make_trace(500, seed=1), make_trace(500, seed=1), make_trace(500, seed=2)
    assert np.array_equal(a["scheduled_ns"], b["scheduled_ns"])
    assert not np.array_equal(a["scheduled_ns"], c["scheduled_ns"])
    rate = (a["t_s"].size - 1) / a["t_s"][-1]
    assert abs(rate / 20.0 - 1) < 0.15


def test_long_slowdown_touches_only_long_prompts():
    tr = make_trace(2000, seed=3)
    a, b = serve(tr, 5), serve(tr, 5, long_slow=2.0)
    long = tr["input_tokens"] >= LONG_INPUT
    ok = a["ok"] & b["ok"]
    ta = (a["first_token_ns"] - tr["scheduled_ns"])[ok]
    tb = (b["first_token_ns"] - tr["scheduled_ns"])[ok]
    assert np.allclose(tb[long[ok]], 2 * ta[long[ok]], rtol=1e-6, atol=2)
    assert np.array_equal(tb[~long[ok]], ta[~long[ok]])
