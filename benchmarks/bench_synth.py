"""Benchmark: `capplan synth` simulated requests per second of wall time (issue 3).

Target: ≥ 20,000 simulated requests/s on 2 cores with 200-token outputs, so the benchmark-size
study (preset ``bench``: 12 offered rates × 1 M requests, 4 replicas, fixed 512/200 lengths,
Poisson arrivals from light load to 2× overload, no itl_ns lists) builds in ≤ 10 minutes.

Measures, each in a fresh child process (so peak RSS is that step's own ``ru_maxrss``; the CPU
seconds beside the wall time are that step's own too — compare those on a busy shared box):

  study     generate_study(bench preset) end to end: simulate + build tables + write parquet,
            runs spread over --workers processes (the figure the target is about)
  sim-1core simulate_level only, one process, one rate near capacity (the engine alone)
  itl       generate_study of a 2-rate slice (12 and 24 req/s, max(requests-per-run / 10, 50 k)
            requests each) WITH per-token itl_ns lists (cost of the lists)

    python benchmarks/bench_synth.py                            # full size: 12 × 1 M requests
    python benchmarks/bench_synth.py --requests-per-run 100000  # quick check (1.2 M requests)
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RPS = 20_000.0


def _child(kind: str, n: int, workers: int, out: str) -> dict:
    from capplan.sim.config import preset
    from capplan.sim.sweep import generate_study, simulate_level

    cfg = preset("bench").with_(requests_per_run=n)
    cpu0 = _cpu_s()
    t = time.perf_counter()
    if kind == "study":
        _, stats = generate_study(cfg, out, workers=workers)
        reqs = sum(s["requests"] for s in stats)
    elif kind == "sim-1core":
        res = simulate_level(cfg, 20.0, seed_key=(0,))
        reqs = len(res.sched_ns)
    elif kind == "itl":
        cfg = cfg.with_(rates=(12.0, 24.0), itl=True)
        _, stats = generate_study(cfg, out, workers=workers)
        reqs = sum(s["requests"] for s in stats)
    else:
        raise ValueError(kind)
    wall = time.perf_counter() - t
    cpu = _cpu_s() - cpu0
    kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    disk = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file()) if Path(out).exists() else 0
    return {"kind": kind, "requests": reqs, "wall_s": wall, "cpu_s": cpu, "rss_mb": kb / 1024,
            "disk_mb": disk / 2**20}


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and its finished children (the workers):
    on a shared box the wall time carries everyone's load, the CPU time much less of it."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests-per-run", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], help="steps to skip: study sim-1core itl")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, n, workers, out = a.child
        print(json.dumps(_child(kind, int(n), int(workers), out)))
        return
    rows = []
    for kind in ("study", "sim-1core", "itl"):
        if kind in a.skip:
            continue
        n = a.requests_per_run if kind != "itl" else max(a.requests_per_run // 10, 50_000)
        with tempfile.TemporaryDirectory(prefix="bench-synth-") as tmp:
            out = str(Path(tmp) / "study")
            p = subprocess.run([sys.executable, __file__, "--child", kind, str(n), str(a.workers), out],
                               capture_output=True, text=True, check=True)
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            shutil.rmtree(out, ignore_errors=True)
    print(f"capplan synth benchmark — target {TARGET_RPS:,.0f} simulated requests/s (200-token outputs), "
          f"workers={a.workers}")
    print(f"{'step':<10} {'requests':>12} {'wall s':>8} {'req/s':>10} {'vs target':>9} {'peak RSS MB':>11} {'disk MB':>8}"
          f" {'12 M-row ETA':>12} {'cpu s':>7} {'req/cpu-s':>10}")
    for r in rows:
        rps = r["requests"] / r["wall_s"]
        eta = 12e6 / rps
        print(f"{r['kind']:<10} {r['requests']:>12,} {r['wall_s']:>8.1f} {rps:>10,.0f} {rps / TARGET_RPS:>8.2f}x "
              f"{r['rss_mb']:>11,.0f} {r['disk_mb']:>8.1f} {eta / 60:>10.1f} m {r['cpu_s']:>7.1f} "
              f"{r['requests'] / r['cpu_s']:>10,.0f}")


if __name__ == "__main__":
    main()
