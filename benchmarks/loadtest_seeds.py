"""`capplan loadtest` over many seeds against a target whose true capacity is known, and the
fixed grid it is measured against.

Targets:
* ``synth`` — the synth model tests/fixtures/synth_small_sweep.yaml (one replica, 300-s runs),
  SLO ttft_ms=2000,tpot_ms=100,attainment=0.99, true C_SLO of that protocol 2.589 ± 0.010 req/s
  (benchmarks/coverage_synth.py, design small); coarse sweep 1, 2, 3, 4 req/s; budget 60 min.
* ``aiperf`` — real AIPerf 0.13 (the peer venv of scripts/peer_tools.sh) against the project's
  queueing server (tests/realtools, the suite's "small" replica 4× faster), SLO
  ttft_ms=75,tpot_ms=20,attainment=0.95, 15-s runs, coarse 8…24 req/s, budget 20 min, 3 min a
  round; the truth from tests/realtools/queue_truth.py (mean attainment of 15-s runs from idle).

Per seed: does the load test end honest (and within the tolerance), is the final lower bound
≤ the truth, how many load-test minutes did it use. The fixed grid: the coarse rates, each
repeated k = 1, 2, … times (what a fixed sweep tool runs); its cost is the minutes of the first
k whose fit is honest, with the same seed.

    python benchmarks/loadtest_seeds.py --target synth --seeds 10 --out /tmp/lt_synth.json
    python benchmarks/loadtest_seeds.py --target synth --seeds 10 --grid-seeds 0 --budget-minutes 90
    python benchmarks/loadtest_seeds.py --target aiperf --seeds 3 --grid-seeds 1 --out /tmp/lt_aiperf.json

Measured results: docs/loadtest.md, "Measured".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from capplan.twin import load_system  # noqa: E402
from capplan.envelope import fit_envelope  # noqa: E402
from capplan.errors import CapplanError  # noqa: E402
from capplan.loadtest import InterruptedLoadtest, Spec, SynthTarget, run_loadtest  # noqa: E402

SYNTH = {"model": ROOT / "tests/fixtures/synth_small_sweep.yaml",
         "slo": "ttft_ms=2000,tpot_ms=100,attainment=0.99", "truth": (2.589, 0.010),
         "rates": (1.0, 2.0, 3.0, 4.0), "duration_s": 300.0, "budget": 60.0, "round": 20.0}
AIPERF = {"slo": "ttft_ms=75,tpot_ms=20,attainment=0.95", "rates": (8.0, 12.0, 16.0, 20.0, 24.0),
          "duration_s": 15.0, "budget": 20.0, "round": 3.0}


def _grid_synth(seed: int, kmax: int, reps: int) -> dict:
    """First k (repeats of every coarse rate) whose fit is honest; simulated on the model."""
    from capplan.design import model_config
    from capplan.sim.sweep import generate_study

    model = load_system(SYNTH["model"])
    for k in range(1, kmax + 1):
        cfg = model_config(model, rates=SYNTH["rates"], duration_s=SYNTH["duration_s"],
                           warmup_s=0.0, repeats=k, seed=seed)
        with tempfile.TemporaryDirectory(prefix="lt_grid_") as tmp:
            generate_study(cfg, Path(tmp) / "s", workers=1)
            env = fit_envelope(Path(tmp) / "s", SYNTH["slo"], reps=reps, seed=seed)
        if env.honesty is not None and env.honesty.honest:
            return {"k": k, "minutes": k * len(SYNTH["rates"]) * SYNTH["duration_s"] / 60.0,
                    "lower_bound": env.cslo.lower_bound}
    return {"k": None, "minutes": kmax * len(SYNTH["rates"]) * SYNTH["duration_s"] / 60.0}


def _grid_tool(url, venv, seed: int, kmax: int, reps: int, work: Path) -> dict:
    """The same grid run with AIPerf: k rounds of one run per coarse rate, fitted after each."""
    from capplan.loadtest import RunRecord, ToolTarget
    from tests.realtools.loop import workload

    w = workload(prompt_tokens=64, output_tokens=32, tokenizer=str(venv / "tokenizer"),
                 grace_s=10.0)
    t = ToolTarget("aiperf", url=url, model="mock-llm", workload=w,
                   tokenizer=str(venv / "tokenizer"), path_prefix=(str(venv / "bin"),))
    study = str(work / "study")
    runs = [{"rate_rps": r, "repeats": 1, "duration_s": AIPERF["duration_s"], "warmup_s": 0.0}
            for r in AIPERF["rates"]]
    for k in range(1, kmax + 1):
        planned = t.plan(runs, seed_base=1000 * k + 100_000 * seed, out_dir=f"grid/k{k}",
                         study=study)
        recs = [RunRecord(k, i, *p[:5], "grid", p[5]) for i, p in enumerate(planned)]
        for r in recs:
            t.execute(r, str(work))
        t.import_runs(recs, study, str(work))
        env = fit_envelope(study, AIPERF["slo"], reps=reps, seed=seed)
        if env.honesty is not None and env.honesty.honest:
            return {"k": k, "minutes": k * len(runs) * AIPERF["duration_s"] / 60.0,
                    "lower_bound": env.cslo.lower_bound}
    return {"k": None, "minutes": kmax * len(runs) * AIPERF["duration_s"] / 60.0}


def one(target, spec: Spec) -> dict:
    with tempfile.TemporaryDirectory(prefix="lt_seed_") as tmp:
        t0 = time.perf_counter()
        try:
            res = run_loadtest(target, spec, Path(tmp) / "lt")
        except InterruptedLoadtest:
            raise  # Ctrl-C ends the benchmark, not only this seed
        except CapplanError as exc:
            return {"error": exc.format()[:2000], "wall_s": time.perf_counter() - t0}
    f = res.final
    return {"stop": res.stop, "honest": res.honest, "minutes": round(res.minutes, 3),
            "requests": res.requests, "rounds": len(res.rounds) - 1, "runs": len(res.runs),
            "estimate": f.estimate if f else math.nan, "lower_bound": f.lower_bound if f else math.nan,
            "gap_rel": f.gap_rel if f else math.nan, "wall_s": res.wall_s}


def summarize(rows: list[dict], truth: float) -> dict:
    ok = [r for r in rows if "error" not in r]
    mean = lambda v: float(sum(v) / len(v)) if v else math.nan  # noqa: E731
    grid = [r for r in ok if r.get("grid") and r["grid"].get("k")]
    return {"seeds": len(rows), "errors": len(rows) - len(ok),
            "ends_honest": sum(r["honest"] for r in ok),
            "stops_honest_within_tolerance": sum(r["stop"] == "honest" for r in ok),
            "lower_bound_le_truth": sum(r["lower_bound"] <= truth for r in ok),
            "mean_minutes": mean([r["minutes"] for r in ok]),
            "mean_wall_min": mean([r["wall_s"] / 60 for r in ok]),
            "mean_lower_bound": mean([r["lower_bound"] for r in ok]),
            "mean_estimate": mean([r["estimate"] for r in ok]),
            "grid_seeds": len(grid),
            "grid_mean_minutes": mean([r["grid"]["minutes"] for r in grid]),
            "minutes_share_of_grid": (mean([r["minutes"] / r["grid"]["minutes"] for r in grid])
                                      if grid else None)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("synth", "aiperf"), default="synth")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--grid-seeds", type=int, default=None,
                    help="seeds that also run the fixed grid (default: all for synth, 1 for aiperf)")
    ap.add_argument("--grid-kmax", type=int, default=4)
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="the load test's budget (default: 60 for synth, 20 for aiperf)")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--truth-runs", type=int, default=300)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = []
    if a.target == "synth":
        truth, se = SYNTH["truth"]
        model = load_system(SYNTH["model"])
        grid_n = a.seeds if a.grid_seeds is None else a.grid_seeds
        for i in range(a.seeds):
            seed = a.first_seed + i
            spec = Spec(slo=SYNTH["slo"], coarse_rates=SYNTH["rates"],
                        duration_s=SYNTH["duration_s"],
                        budget_minutes=a.budget_minutes or SYNTH["budget"],
                        round_minutes=SYNTH["round"], seed=seed, reps=a.reps)
            r = one(SynthTarget(model, name="synth_small_sweep", seed=seed), spec)
            if i < grid_n:
                r["grid"] = _grid_synth(seed, a.grid_kmax, a.reps)
            r["seed"] = seed
            rows.append(r)
            print(json.dumps(r), flush=True)
    else:
        from tests.realtools import queue_truth as qt
        from tests.realtools.params import SMALL
        from tests.realtools.queue_server import start_subprocess, stop_subprocess

        venv = Path(os.environ.get("CAPPLAN_PEERS_VENV")
                    or Path.home() / ".cache/capplan/peers/aiperf-0.13.0_guidellm-0.8.1")
        params = SMALL.with_(time_scale=0.25)
        kv = dict(x.split("=") for x in AIPERF["slo"].split(","))
        slo = qt.SLO(float(kv["ttft_ms"]), float(kv["tpot_ms"]), float(kv["attainment"]))
        _, tr = qt.true_cslo(slo, params=params, duration_s=AIPERF["duration_s"],
                             runs=a.truth_runs, horizon_s=600.0, lo_rps=1.0, hi_rps=60.0,
                             tol_rps=0.05)
        truth, se = tr.rate_rps, tr.se_rps
        print(f"truth: {tr.to_text()}", flush=True)
        grid_n = 1 if a.grid_seeds is None else a.grid_seeds
        from capplan.loadtest import ToolTarget
        from tests.realtools.loop import workload

        url, proc = start_subprocess(params, extra_args=("--fixed-prompt-tokens", "64"))
        try:
            for i in range(a.seeds):
                seed = a.first_seed + i
                w = workload(prompt_tokens=64, output_tokens=32,
                             tokenizer=str(venv / "tokenizer"), grace_s=10.0)
                target = ToolTarget("aiperf", url=url, model="mock-llm", workload=w,
                                    tokenizer=str(venv / "tokenizer"),
                                    path_prefix=(str(venv / "bin"),))
                spec = Spec(slo=AIPERF["slo"], coarse_rates=AIPERF["rates"],
                            duration_s=AIPERF["duration_s"],
                            budget_minutes=a.budget_minutes or AIPERF["budget"],
                            round_minutes=AIPERF["round"], max_rounds=4, seed=seed, reps=a.reps)
                r = one(target, spec)
                if i < grid_n:
                    with tempfile.TemporaryDirectory(prefix="lt_grid_") as tmp:
                        try:
                            r["grid"] = _grid_tool(url, venv, seed, a.grid_kmax, a.reps, Path(tmp))
                        except CapplanError as exc:
                            r["grid"] = {"error": exc.format()[:1000]}
                r["seed"] = seed
                r["load_avg"] = os.getloadavg()[0]
                rows.append(r)
                print(json.dumps(r), flush=True)
        finally:
            stop_subprocess(proc)
    s = summarize(rows, truth)
    s.update(truth_rps=truth, truth_se=se, target=a.target)
    print(json.dumps(s, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"summary": s, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
