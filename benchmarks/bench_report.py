"""Benchmark: render the demo report, and the what-if redraw latency.

    python benchmarks/bench_report.py [--repeats 2] [--reps N] [--jobs N] [--baseline STUDY]
                                      [--redraws 20] [--skip-report]

1. ``capplan report`` with no arguments (the bundled demo study, the default output folder),
   exactly as the Quickstart runs it, in a fresh child process each time (interpreter start,
   kernels, papermill, nbconvert, export) from an unrelated empty temp directory; checks that
   it prints the path of the index it wrote. Target: ≤ 60 s on 2 cores. Prints wall seconds
   per repeat and per notebook, and the size written (pages, saved notebooks, data).
   ``--baseline STUDY`` (``demo``: the bundled study itself) adds the comparison notebook.
2. The what-if panel on the demo study: the one-off model build (envelope fit), then
   ``whatif_state`` for a sequence of slider positions (peak, SLO limit, attainment, policy,
   price, uncertainty) — the work one slider change triggers — and a headless
   ``WhatIfPanel`` change (state + table HTML + FigureWidget update). Target: well under 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _mb(paths) -> float:
    return sum(p.stat().st_size for p in paths if p.is_file()) / 1e6


def bench_report(repeats: int, reps: int | None, jobs: int | None,
                 baseline: str | None = None) -> list[float]:
    walls = []
    for i in range(repeats):
        with tempfile.TemporaryDirectory(prefix="capplan-bench-report-") as tmp:
            cmd = [sys.executable, "-m", "capplan", "report"]
            if reps is not None:
                cmd += ["--reps", str(reps)]
            if jobs is not None:
                cmd += ["--jobs", str(jobs)]
            if baseline:
                from capplan.report import demo_study_path

                cmd += ["--baseline", str(demo_study_path() if baseline == "demo" else
                                          Path(baseline).resolve())]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                sys.exit(f"capplan report failed ({proc.returncode}):\n{proc.stderr}")
            printed = proc.stdout.strip().removeprefix("report: ")
            index = Path(printed)
            if not (proc.stdout.startswith("report: ") and index.is_file()
                    and index.parent.parent == Path(tmp).resolve() / "reports"):
                sys.exit(f"capplan report did not print the index under {tmp}/reports: "
                         f"{proc.stdout!r}")
            out = index.parent
            per_nb = [ln for ln in proc.stderr.splitlines() if ": done in " in ln]
            meta = json.loads((out / "report.json").read_text(encoding="utf-8"))
            size_mb = _mb(out.rglob("*"))
            sizes = (f"pages {_mb(out.glob('*.html')):.1f} MB, notebooks "
                     f"{_mb((out / 'notebooks').rglob('*')):.1f} MB, data "
                     f"{_mb((out / 'data').rglob('*')):.1f} MB")
        walls.append(wall)
        print(f"report run {i + 1}: {wall:.1f} s wall (reps {meta['reps']}, jobs "
              f"{jobs or len(meta['pages'])}, {len(meta['pages'])} notebooks, "
              f"{size_mb:.1f} MB written: {sizes}) -> reports/{out.name}/index.html")
        for ln in per_nb:
            print("   ", ln.strip())
    return walls


def bench_whatif(redraws: int, reps: int | None) -> tuple[float, list[float], list[float]]:
    from capplan.whatif import WhatIfModel, WhatIfPanel, whatif_state

    t0 = time.perf_counter()
    model = WhatIfModel.build(reps=reps)
    build_s = time.perf_counter() - t0
    p0 = model.defaults()
    grid = model.limit_choices("x", p0.ttft_ms) or [p0.ttft_ms]
    i0 = grid.index(p0.ttft_ms)
    moves = [
        dict(peak_rps=p0.peak_rps * 1.5), dict(peak_rps=p0.peak_rps * 0.7),
        dict(ttft_ms=grid[min(i0 + 2, len(grid) - 1)]), dict(ttft_ms=grid[max(i0 - 2, 0)]),
        dict(attainment=0.95), dict(policy="node"), dict(policy="none"),
        dict(price_usd_per_gpu_hour=p0.price_usd_per_gpu_hour * 1.3),
        dict(uncertainty=p0.uncertainty + 0.3), dict(capacity_use="estimate"),
    ]
    whatif_state(model, p0)  # first call warms caches (facts at the starting SLO)
    state_s = []
    for k in range(redraws):
        p = p0.with_(**moves[k % len(moves)])
        t = time.perf_counter()
        whatif_state(model, p)
        state_s.append(time.perf_counter() - t)
    panel = WhatIfPanel(model)
    panel_s = []
    for k in range(redraws):
        t = time.perf_counter()
        panel.peak.value = p0.peak_rps + (k % 5 + 1) * panel.peak.step
        panel_s.append(time.perf_counter() - t)
    return build_s, state_s, panel_s


def _q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="report renders (fresh processes)")
    ap.add_argument("--reps", type=int, default=None,
                    help="bootstrap replicates [default: the spec's, as capplan report]")
    ap.add_argument("--jobs", type=int, default=None,
                    help="notebooks run at once [default: capplan report's, all of them]")
    ap.add_argument("--baseline", default=None,
                    help="add the comparison against this study ('demo': the bundled one)")
    ap.add_argument("--redraws", type=int, default=20, help="what-if changes timed")
    ap.add_argument("--skip-report", action="store_true")
    args = ap.parse_args()
    print(f"cpus: {os.cpu_count()}, load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if not args.skip_report:
        walls = bench_report(args.repeats, args.reps, args.jobs, args.baseline)
        verdict = "OK" if min(walls) <= 60 else "OVER TARGET"
        print(f"report: best {min(walls):.1f} s, median {statistics.median(walls):.1f} s "
              f"(target ≤ 60 s: {verdict})")
    build_s, state_s, panel_s = bench_whatif(args.redraws, args.reps)
    print(f"what-if: model build (envelope fit, once) {build_s:.2f} s")
    print(f"what-if: whatif_state per change: median {statistics.median(state_s) * 1e3:.0f} ms, "
          f"p90 {_q(state_s, 0.9) * 1e3:.0f} ms, max {max(state_s) * 1e3:.0f} ms "
          f"({len(state_s)} changes)")
    print(f"what-if: panel redraw per slider change (state + table + FigureWidget): median "
          f"{statistics.median(panel_s) * 1e3:.0f} ms, p90 {_q(panel_s, 0.9) * 1e3:.0f} ms, "
          f"max {max(panel_s) * 1e3:.0f} ms (target well under 1 s)")


if __name__ == "__main__":
    main()
