"""The planner's loop with real load tools, many times: real AIPerf 0.13 / GuideLLM 0.8.1 (the
venv of scripts/peer_tools.sh) against the project's queueing server (tests/realtools), whose
capacity is known from an independent simulation (tests/realtools/queue_truth.py).

Each loop (tests/realtools/loop.py → capplan.loadtest): a coarse sweep, then rounds of `capplan design` whose printed
commands run verbatim and are imported with `--into`, until the bound is honest or the rounds
run out. Reported over the loops: rounds and load-test minutes to "honest", the final lower
bound against the truth (≤ truth in how many), and the two-sided interval's coverage, with
Clopper–Pearson intervals.

    python benchmarks/loop_realtools.py --tool aiperf --loops 10             # ~10 min a loop
    python benchmarks/loop_realtools.py --tool guidellm --loops 10
    python benchmarks/loop_realtools.py --from-json out.json                  # re-summarise

Measured results: docs/design.md, "The loop with a real client".
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

from tests.realtools import queue_truth as qt  # noqa: E402
from tests.realtools.loop import LoopError, as_dict, loop  # noqa: E402
from tests.realtools.params import SMALL, REFERENCE  # noqa: E402
from tests.realtools.queue_server import start_subprocess, stop_subprocess  # noqa: E402

CONFIGS = {
    # server, SLO, run length (s), coarse rates, design budget per round (min)
    # the suite's loops (tests/test_loop_realtools.py): the small replica 4× faster for AIPerf,
    # 2× for GuideLLM (above ≈ 16 req/s its sends lag > 50 ms at p99 on 2 cores)
    "small": (SMALL.with_(time_scale=0.25), qt.SLO(75.0, 20.0, 0.95), 15.0,
              (8.0, 12.0, 16.0, 20.0, 24.0), 3.0),
    "small-half": (SMALL.with_(time_scale=0.5), qt.SLO(150.0, 40.0, 0.95), 15.0,
                   (5.0, 7.0, 9.0, 11.0, 13.0), 3.0),
    "reference": (REFERENCE, qt.SLO(1000.0, 80.0, 0.95), 60.0,
                  (4.0, 6.0, 8.0, 10.0, 12.0, 14.0), 10.0),
}


def _slo_text(slo: qt.SLO) -> str:
    return f"ttft_ms={slo.ttft_ms:g},tpot_ms={slo.tpot_ms:g},attainment={slo.attainment:g}"


def cp(k: int, n: int) -> tuple[float, float]:
    from capplan.bootstrap import clopper_pearson

    return clopper_pearson(k, n, 0.95)


def summarize(results: list[dict], truth: dict) -> dict:
    cap, se = truth["rate_rps"], truth["se_rps"]
    ok = [r for r in results if "error" not in r]
    honest = [r for r in ok if r["honest"]]
    n = len(ok)
    lb_ok = [r for r in ok if r["rounds"][-1]["lower_bound"] <= cap]
    hit = [r for r in ok if r["rounds"][-1]["ci_low"] <= cap <= r["rounds"][-1]["ci_high"]]
    mean = lambda v: float(sum(v) / len(v)) if v else math.nan  # noqa: E731
    return {
        "truth_rps": cap, "truth_se": se, "loops": len(results), "errors": len(results) - n,
        "honest": len(honest),
        "rounds_to_honest": mean([len(r["rounds"]) - 1 for r in honest]),
        "max_rounds_to_honest": max([len(r["rounds"]) - 1 for r in honest], default=None),
        "minutes_to_honest": mean([r["minutes"] for r in honest]),
        "lower_bound_le_truth": len(lb_ok), "cp_lower_bound": cp(len(lb_ok), n) if n else None,
        "two_sided_covers": len(hit), "cp_two_sided": cp(len(hit), n) if n else None,
        "mean_lower_bound": mean([r["rounds"][-1]["lower_bound"] for r in ok]),
        "mean_estimate": mean([r["rounds"][-1]["estimate"] for r in ok]),
        "mean_wall_min": mean([r["wall_s"] / 60.0 for r in ok]),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", choices=("aiperf", "guidellm"), default="aiperf")
    ap.add_argument("--config", choices=sorted(CONFIGS), default=None,
                    help="default: small for AIPerf, small-half for GuideLLM (the suite's)")
    ap.add_argument("--loops", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--grace", type=float, default=10.0,
                    help="cut-off grace in s (AIPerf's grace period; GuideLLM's runs are then "
                         "bounded by request count; 0: both cancel at the cut-off)")
    ap.add_argument("--max-rounds", type=int, default=3)
    ap.add_argument("--truth-runs", type=int, default=1000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-json", default=None)
    a = ap.parse_args(argv)
    if a.from_json:
        d = json.loads(Path(a.from_json).read_text())
        print(json.dumps(summarize(d["loops"], d["truth"]), indent=1))
        return 0
    venv = Path(os.environ.get("CAPPLAN_PEERS_VENV")
                or Path.home() / ".cache/capplan/peers/aiperf-0.13.0_guidellm-0.8.1")
    a.config = a.config or ("small" if a.tool == "aiperf" else "small-half")
    params, slo, dur, coarse, budget = CONFIGS[a.config]
    grace = a.grace
    t0 = time.perf_counter()
    _, tr = qt.true_cslo(slo, params=params, duration_s=dur, runs=a.truth_runs, horizon_s=600.0,
                         lo_rps=1.0, hi_rps=30.0, tol_rps=0.01,
                         grace_s=None if grace > 0 else 0.0)
    truth = {"rate_rps": tr.rate_rps, "se_rps": tr.se_rps, "protocol": tr.protocol}
    print(f"truth: {tr.to_text()} [{time.perf_counter() - t0:.0f} s]", flush=True)
    results = []
    url, proc = start_subprocess(params, extra_args=("--fixed-prompt-tokens", "64"))
    try:
        for i in range(a.loops):
            seed = a.first_seed + i
            with tempfile.TemporaryDirectory(prefix="loop_realtools_") as tmp:
                try:
                    r = loop(a.tool, url=url, model="mock-llm", tokenizer=str(venv / "tokenizer"),
                             slo=_slo_text(slo), coarse_rates=coarse, duration_s=dur,
                             workdir=tmp, peers_bin=str(venv / "bin"), seed=seed,
                             grace_s=grace, budget_minutes=budget, max_rounds=a.max_rounds)
                    d = as_dict(r)
                except (LoopError, OSError) as exc:
                    d = {"error": str(exc)[:2000]}
            d["seed"] = seed
            results.append(d)
            f = d.get("rounds", [{}])[-1]
            print(f"loop {i} (seed {seed}): " + (
                f"honest={d['honest']} rounds={len(d['rounds']) - 1} minutes={d['minutes']:.1f} "
                f"estimate={f['estimate']:.3f} [{f['ci_low']:.3f}, {f['ci_high']:.3f}] "
                f"LB={f['lower_bound']:.3f} wall={d['wall_s'] / 60:.1f} min"
                if "error" not in d else f"error {d['error'][:300]}"), flush=True)
    finally:
        stop_subprocess(proc)
    s = summarize(results, truth)
    print(json.dumps(s, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"truth": truth, "summary": s, "loops": results,
                                           "tool": a.tool, "config": a.config}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
