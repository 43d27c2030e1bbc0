"""Benchmark: timelines (issue 15).

  timeline  `capplan.timeline.analyse_timeline` of a 1 M-request run (1-s windows) against a
            pandas baseline computing the same per-window counts and waiting series from the
            parquet (what a notebook would do without capplan). Target: ≤ 5 s.
  day       a 24-hour simulated day with autoscaling at the demo's scale: the demo preset's
            (or --twin's) replicas (Llama2-70B on 4×H100, C_SLO ≈ 2.8 req/s per replica), a day's demand
            shape (a trace's when --trace is given, else a two-peak diurnal curve) scaled to a
            peak of --peak req/s, the R_desired autoscaler (ready time 330 s, the template
            plan's parts), simulated and written as a study (`generate_study`), then analysed
            (`analyse_timeline`, 60-s windows). Target: ≤ 60 s on 2 cores.

Each measurement runs in a fresh child process (wall seconds and peak RSS of that child).
The 1 M-request study is built once under benchmarks/_data/ (git-ignored).

    python benchmarks/bench_timeline.py                     # both
    python benchmarks/bench_timeline.py --skip day
    python benchmarks/bench_timeline.py --trace PATH/AzureLLMInferenceTrace2023_conv.csv
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "_data"
SLO_TEXT = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
C_DEMO = 2.8  # req/s per replica: the demo study's C_SLO (≈ 5.6 for its 2 replicas) per replica


def build_million(dest: Path) -> Path:
    """1 M requests on 4 replicas at 20 req/s (≈ 14 h), one replica lost every 4 hours and
    replaced after 330 s (the timeline has events to measure)."""
    from capplan import contract as C
    from capplan.sim.config import preset
    from capplan.sim.control import ControlSpec, FailureEvent
    from capplan.sim.sweep import generate_study

    if (dest / C.MANIFEST_NAME).is_file():
        return dest
    cfg = preset("bench")
    fails = tuple(FailureEvent(at_s=h * 3600.0, count=1, ready_s=330.0, detect_s=10.0,
                              route_removal_s=5.0) for h in (2, 6, 10))
    cfg = cfg.with_(rates=(20.0,), requests_per_run=1_000_000,
                    control=ControlSpec(initial=cfg.replicas, failures=fails))
    generate_study(cfg, dest, workers=1)
    return dest


def child_timeline(path: str) -> dict:
    from capplan.timeline import analyse_timeline

    t = time.perf_counter()
    tl = analyse_timeline(path, SLO_TEXT, window_s=1.0, capacity_rps=C_DEMO * 2)
    dt = time.perf_counter() - t
    w = tl.to_frame()
    return {"seconds": dt, "windows": len(w), "requests": int(w["offered"].sum()),
            "good": int(w["good"].sum()), "incidents": len(tl.incidents),
            "waiting_area": float(w["waiting_area_req_s"].sum())}


def child_pandas(path: str) -> dict:
    """The same per-window counts and waiting area with pandas + numpy."""
    import glob

    import numpy as np
    import pandas as pd

    t = time.perf_counter()
    files = sorted(glob.glob(os.path.join(path, "events", "*.parquet")))
    df = pd.concat([pd.read_parquet(f, columns=["scheduled_ns", "first_token_ns", "last_token_ns",
                                                "output_tokens", "status", "admitted_ns"])
                    for f in files])
    ttft = (df["first_token_ns"] - df["scheduled_ns"]) / 1e6
    tpot = (df["last_token_ns"] - df["first_token_ns"]) / 1e6 / (df["output_tokens"] - 1)
    good = (df["status"] == "ok") & (ttft <= 2000) & ((df["output_tokens"] < 2) | (tpot <= 100))
    win = df["scheduled_ns"] // 1_000_000_000
    g = pd.DataFrame({"win": win, "good": good, "st": df["status"]}).groupby("win")
    counts = g.agg(offered=("good", "size"), good=("good", "sum"))
    by_status = pd.crosstab(win, df["status"])
    s = df["scheduled_ns"].to_numpy()
    e = df["admitted_ns"].fillna(-1).to_numpy().astype(np.int64)
    keep = e >= 0
    s, e = np.sort(s[keep]), np.sort(e[keep])
    edges = np.arange(0, int(e.max()) + 2_000_000_000, 1_000_000_000)
    def below(v):
        cum = np.r_[0, np.cumsum(v / 1e9)]
        k = np.searchsorted(v, edges)
        return cum[k] + edges / 1e9 * (v.size - k)
    area = np.diff(below(e) - below(s))
    dt = time.perf_counter() - t
    return {"seconds": dt, "windows": int(len(counts)), "requests": int(counts["offered"].sum()),
            "good": int(counts["good"].sum()), "statuses": int(by_status.shape[1]),
            "waiting_area": float(area.sum())}


def child_day(trace: str, peak: float, out: str, twin: str = "") -> dict:
    from capplan.sim.arrivals import load_trace
    from capplan.sim.autoscale import AutoscalerSpec
    from capplan.sim.config import preset
    from capplan.sim.control import ControlSpec
    from capplan.sim.demand import diurnal, from_trace
    from capplan.sim.sweep import generate_study
    from capplan.timeline import analyse_timeline

    day = 86_400.0
    prof = from_trace(load_trace(trace), span_s=day, peak_rps=peak) if trace else diurnal(day, peak)
    start = max(1, math.ceil(prof.rate(0.0) * 1.1 / C_DEMO))
    a = AutoscalerSpec(capacity_rps=C_DEMO, ready_s=330.0, safety=1.1, drain_target_s=60.0,
                       eval_period_s=15.0, rate_window_s=60.0, stabilisation_s=300.0, tolerance=0.1,
                       warm_floor=1, max_replicas=32)
    if twin:  # a twin file (capplan twin fit), e.g. of the demo study
        from capplan.twin import load_twin

        base = load_twin(twin).synth_config()
    else:
        base = preset("demo")
    cfg = base.with_(rates=(peak,), duration_s=day, warmup_s=0.0, repeats=1, power=None,
                     itl=False, replicas=start, demand=prof, requests_per_run=None,
                     control=ControlSpec(initial=start, autoscaler=a))
    t = time.perf_counter()
    path, st = generate_study(cfg, out, workers=1)
    t_sim = time.perf_counter() - t
    t2 = time.perf_counter()
    tl = analyse_timeline(path, SLO_TEXT, window_s=60.0, capacity_rps=C_DEMO)
    t_an = time.perf_counter() - t2
    s = tl.summary_frame().iloc[0]
    return {"seconds": t_sim + t_an, "simulate_write_s": t_sim, "analyse_s": t_an,
            "requests": int(st[0]["requests"]), "scale_decisions": int(s["scale_decisions"]),
            "reversals": int(s["reversals"]), "replicas_max": float(s["replicas_max"]),
            "attainment": float(s["attainment"]), "slo_minutes_broken": float(s["slo_minutes_broken"]),
            "overshoot_gpu_h": float(s["overshoot_gpu_h"]),
            "shape": ("trace " + Path(trace).name if trace else "diurnal (built in)")
            + (f", twin {Path(twin).name}" if twin else ", demo preset")}


def run_child(args: list[str]) -> dict:
    """A fresh process per measurement; it reports its own peak RSS."""
    p = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs="*", default=None)
    ap.add_argument("--skip", nargs="*", default=[], choices=["timeline", "day"])
    ap.add_argument("--trace", default="", help="an Azure CSV or Mooncake JSONL trace for the day's shape")
    ap.add_argument("--peak", type=float, default=10.0, help="the day's peak, req/s")
    ap.add_argument("--twin", default="", help="simulate the day on this twin (default: the demo preset)")
    a = ap.parse_args()
    if a.child is not None:
        kind, *rest = a.child
        out = {"timeline": lambda: child_timeline(rest[0]), "pandas": lambda: child_pandas(rest[0]),
               "day": lambda: child_day(rest[0], float(rest[1]), rest[2], rest[3] if len(rest) > 3 else "")}[kind]()
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return
    print(f"load average at start: {os.getloadavg()}")
    if "timeline" not in a.skip:
        path = build_million(DATA / "timeline-1m")
        cap = run_child(["timeline", str(path)])
        base = run_child(["pandas", str(path)])
        print(f"timeline of a {cap['requests']:,}-request run ({cap['windows']:,} 1-s windows, "
              f"{cap['incidents']} incidents): {cap['seconds']:.2f} s (target ≤ 5 s: "
              f"{5 / cap['seconds']:.2f}× under), peak RSS {cap['peak_rss_mb']:.0f} MB")
        print(f"pandas baseline (per-window counts and waiting area only): {base['seconds']:.2f} s, "
              f"{base['peak_rss_mb']:.0f} MB; capplan / pandas = {cap['seconds'] / base['seconds']:.2f}")
        print(f"  cross-check: good {cap['good']:,} vs {base['good']:,}; waiting area "
              f"{cap['waiting_area']:,.0f} vs {base['waiting_area']:,.0f} request-seconds")
    if "day" not in a.skip:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            day = run_child(["day", a.trace, str(a.peak), str(Path(d) / "day"), a.twin])
        print(f"24-hour day ({day['shape']}, peak {a.peak:g} req/s, {day['requests']:,} requests, "
              f"autoscaled to at most {day['replicas_max']:.0f} replicas, {day['scale_decisions']} "
              f"decisions, {day['reversals']} reversals): {day['seconds']:.1f} s (simulate + write "
              f"{day['simulate_write_s']:.1f} s, analyse {day['analyse_s']:.1f} s; target ≤ 60 s: "
              f"{60 / day['seconds']:.2f}× under), peak RSS {day['peak_rss_mb']:.0f} MB")
        print(f"  attainment {day['attainment']:.4f}, SLO-minutes broken {day['slo_minutes_broken']:.1f}, "
              f"overshoot {day['overshoot_gpu_h']:.1f} GPU-hours")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
