"""Coverage of the C_SLO interval on short-run sweeps shaped like a real Poisson client's
(issue 32): the interval of the current code ("new") beside the rule before the change ("old"),
on the same sweeps, in one run.

Shape (what a planner with GuideLLM or AIPerf runs): 60-s Poisson runs started idle against one
replica of a small model (the ``aiperf`` system of benchmarks/coverage_synth.py,
tests/fixtures/synth_aiperf_shape.yaml), six coarse rates 3.5 … 13.5 req/s (210–810 requests a
run) plus three repeats at each of two rates near the crossing (10.0 and 10.7 req/s, as a planner
adds after the coarse pass). Arrivals are real Poisson draws, so each run's measured rate lies
± 4–7 % (one SD) from the asked one; the light-load runs have zero or one violation. No manifest
warm-up: MSER-5 finds it, as for an imported real client. SLO
``ttft_ms=2000,tpot_ms=100,attainment=0.99``.

Truth: this protocol's capacity — pooled attainment of ``--truth-replications`` independent 60-s
runs started idle at 5 rates around the crossing, crossed by a weighted logit-linear fit
(``capplan.sim.truth.true_attainment``; benchmarks/coverage_synth.py's ``truth``, cached
under benchmarks/_data/).

Per rule: two-sided coverage of the interval, one-sided coverage of the lower bound (all sweeps,
and among the sweeps whose bound capplan calls honest), each with its Wilson 95 % interval;
misses below/above; median width; median relative width; runs excluded per sweep.

    nice -n 10 python benchmarks/coverage_short_runs.py --k 100 --jobs 2
    nice -n 10 python benchmarks/coverage_short_runs.py --k 10           # quick look

Measured results: docs/envelope.md, "Short runs from real clients".
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import coverage_synth as cs  # noqa: E402  (the truth and the synth system are shared)

SLO_TEXT = cs.SLO_TEXT
COARSE = (3.5, 5.5, 7.5, 9.5, 11.5, 13.5)
NEAR = (10.0, 10.7)
REPEATS = 3
DURATION_S = 60.0
#: "new": the code as it is; "old": the interval rule before issue 32 (``method`` of
#: ``fit_from_stats``'s realised-rate handling, see RULES)
RULES = ("new", "old")


def design() -> cs.Design:
    raw = copy.deepcopy(cs._fixture("synth_aiperf_shape.yaml"))
    raw["sweep"]["rates"] = list(COARSE)
    raw["sweep"]["duration_s"] = DURATION_S
    # the truth is keyed on the system and the protocol (60 s from idle), as design "short"
    return cs.Design("short", raw, 10.5, warmup="mser")


def plans(cfg):
    from capplan.sim.sweep import RunPlan

    out = []
    for lv in COARSE:
        out.append(RunPlan(len(out), f"r{len(out) + 1:02d}", float(lv), 0, DURATION_S))
    for lv in NEAR:
        for rep in range(REPEATS):
            out.append(RunPlan(len(out), f"r{len(out) + 1:02d}", float(lv), rep, DURATION_S))
    return tuple(out)


def _fit(stats, rule: str, reps: int, seed: int) -> dict:
    from capplan.envelope import fit_from_stats

    kw = {} if rule == "new" else {"rate_noise": False}
    e = fit_from_stats(stats, SLO_TEXT, reps=reps, seed=seed, **kw)
    c = e.cslo
    return {"estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
            "lower_bound": c.lower_bound, "status": c.status,
            "honest": bool(e.honesty.honest) if e.honesty else False,
            "tau": None if e.run_effect is None else e.run_effect.tau,
            "excluded": int((~e.runs["usable"].astype(bool)).sum())}


def one_sweep(args) -> dict:
    k, seed, reps, fit_seed, rules = args
    from capplan.reduce import reduce_study
    from capplan.sim import generate_study

    d = design()
    cfg = d.config(seed + k)
    tmp = Path(tempfile.mkdtemp(prefix="cov_short_"))
    try:
        t = time.perf_counter()
        path, _ = generate_study(cfg, tmp / "s", workers=1, plans=plans(cfg), overwrite=True)
        stats = reduce_study(path, SLO_TEXT, warmup=d.warmup)
        out = {"k": k, "gen_s": time.perf_counter() - t,
               "rate_ratio": [r.measured_rps / r.load_level for r in stats.runs],
               "n": [r.n for r in stats.runs]}
        for rule in rules:
            t = time.perf_counter()
            out[rule] = _fit(stats, rule, reps, fit_seed + k)
            out[rule]["fit_s"] = time.perf_counter() - t
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n (95 %)."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    c = (p + z * z / (2 * n)) / den
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, c - h), min(1.0, c + h))


def summarize(results: list[dict], cap: float) -> dict:
    out = {}
    for rule in RULES:
        rows = [r[rule] for r in results if rule in r]
        if not rows:
            continue
        f = lambda key: np.array([np.nan if x[key] is None else x[key] for x in rows], float)  # noqa: E731
        lo, hi, lb = f("ci_low"), f("ci_high"), f("lower_bound")
        hit = (lo <= cap) & (cap <= hi)
        lb_ok = lb <= cap
        honest = np.array([x["honest"] for x in rows])
        n, nh = len(rows), int(honest.sum())
        out[rule] = {
            "sweeps": n, "two_sided": float(hit.mean()), "two_sided_wilson": wilson(int(hit.sum()), n),
            "miss_below": int(np.sum(hi < cap)), "miss_above": int(np.sum(lo > cap)),
            "lower_bound": float(lb_ok.mean()), "lower_bound_wilson": wilson(int(lb_ok.sum()), n),
            "honest": nh, "lower_bound_honest": float(lb_ok[honest].mean()) if nh else math.nan,
            "lower_bound_honest_k": int(lb_ok[honest].sum()),
            "lower_bound_honest_wilson": wilson(int(lb_ok[honest].sum()), nh),
            "two_sided_honest": float(hit[honest].mean()) if nh else math.nan,
            "median_width": float(np.nanmedian(hi - lo)),
            "median_rel_width": float(np.nanmedian((hi - lo) / f("estimate"))),
            "median_shortfall": float(np.nanmedian((cap - lb) / cap)),
            "excluded_per_sweep": float(np.mean(f("excluded"))),
            "fit_s": float(np.mean(f("fit_s"))),
        }
    return out


def table(s: dict, cap: float, se: float) -> str:
    lines = ["| rule | sweeps | two-sided (Wilson 95 %) | miss <, > | lower bound ≤ truth "
             "(Wilson 95 %) | honest | LB among honest (Wilson 95 %) | median width (req/s) "
             "| median width / estimate | median shortfall | runs excluded / sweep |",
             "|" + "---|" * 11]
    for rule in RULES:
        if rule not in s:
            continue
        d = s[rule]
        w2, wl, wh = d["two_sided_wilson"], d["lower_bound_wilson"], d["lower_bound_honest_wilson"]
        hon = (f"{d['lower_bound_honest']:.2f} ({d['lower_bound_honest_k']} of {d['honest']}; "
               f"{wh[0]:.2f}–{wh[1]:.2f})" if d["honest"] else "—")
        lines.append(
            f"| {rule} | {d['sweeps']} | {d['two_sided']:.2f} ({w2[0]:.2f}–{w2[1]:.2f}) | "
            f"{d['miss_below']}, {d['miss_above']} | {d['lower_bound']:.2f} ({wl[0]:.2f}–"
            f"{wl[1]:.2f}) | {d['honest']} | {hon} | {d['median_width']:.3f} | "
            f"{100 * d['median_rel_width']:.1f} % | {100 * d['median_shortfall']:.1f} % | "
            f"{d['excluded_per_sweep']:.2f} |")
    return (f"truth {cap:.3f} ± {se:.3f} req/s (this protocol: 60-s runs from idle)\n\n"
            + "\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=100, help="sweeps")
    ap.add_argument("--reps", type=int, default=400, help="bootstrap replicates per fit")
    ap.add_argument("--seed", type=int, default=9000, help="sweep k uses synth seed SEED + k")
    ap.add_argument("--fit-seed", type=int, default=0)
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--truth-replications", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON with every sweep and the summary")
    ap.add_argument("--from-json", default=None,
                    help="re-summarise earlier --out files (comma-separated: pooled)")
    a = ap.parse_args(argv)
    rules = tuple(r.strip() for r in a.rules.split(",") if r.strip())
    if any(r not in RULES for r in rules):
        ap.error(f"unknown rule(s) {rules}; known: {', '.join(RULES)}")
    t0 = time.perf_counter()
    tr = cs.truth(design(), a.truth_replications)
    cap, se = float(tr["capacity"]), float(tr["se"])
    if a.from_json:
        results = [r for f in a.from_json.split(",") if f.strip()
                   for r in json.loads(Path(f.strip()).read_text())["sweeps"]]
    else:
        jobs = [(i, a.seed, a.reps, a.fit_seed, rules) for i in range(a.k)]
        if a.jobs > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(a.jobs) as ex:
                results = list(ex.map(one_sweep, jobs))
        else:
            results = [one_sweep(j) for j in jobs]
    s = summarize(results, cap)
    ratio = np.concatenate([r["rate_ratio"] for r in results]) - 1.0
    n = np.concatenate([r["n"] for r in results])
    print(f"{len(results)} sweeps in {time.perf_counter() - t0:.0f} s ({a.jobs} processes; "
          f"generate+reduce {np.mean([r['gen_s'] for r in results]):.2f} s a sweep, fit "
          + ", ".join(f"{r} {s[r]['fit_s']:.2f} s" for r in s) + "); load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"measured / asked rate − 1: SD {np.std(ratio):.3f}, range {ratio.min():+.3f} … "
          f"{ratio.max():+.3f}; requests a run {n.min()}–{n.max()}\n")
    print(table(s, cap, se))
    if a.out:
        Path(a.out).write_text(json.dumps({"truth": tr, "summary": s, "sweeps": results},
                                          indent=1, default=lambda v: None if v != v else v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
