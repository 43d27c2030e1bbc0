"""Coverage of the reweighted C_SLO interval against the simulator's truth at a target mix.

Study: ``templates/synth-mix.yaml`` — 2 replicas, a chat tenant (85 %, ~500-token prompts) and
a docs tenant (15 %, ~5 000-token prompts), 9 Poisson runs at 1…6 req/s of 300 s each; under
``ttft_ms=1000,attainment=0.9`` the long-prompt bucket (input ≥ 2048 tokens) fails first.
Target: twice the long-prompt share (30 %). Sweep k uses synth seed ``--seed + k``; each sweep is
reduced once with the input-bucket cells and fitted by ``capplan.mix.fit_mix`` (unweighted and
reweighted C_SLO from the same block draws).

Truths (``capplan.sim.truth``, common random numbers, cached under benchmarks/_data/):
- **reweighted truth** — the rate where Σ_b w_b · A_b(λ) crosses the target, A_b being each
  bucket's true attainment *at the tested mix* (``true_mix_capacity``): what reweighting
  estimates, and the truth the coverage claim is about;
- **tested-mix truth** — the study's own C_SLO (``true_capacity``);
- **full truth at the target mix** — the same protocol simulated with 30 % docs requests: it
  adds the load effect (more prefill work slows every request), which reweighting cannot see;
  reported, with how often the reweighted interval covers it too.

- **class truth** — SLO classes (``CLASSES``: interactive = the chat tenant, batch = the docs
  tenant, both under TTFT ≤ 1 s, at 0.95 and 0.6): each class's true crossing at the tested mix
  (its bucket's attainment, the same simulated runs), and the joint truth, their minimum — what
  ``capplan.mix.classes.fit_classes`` estimates.

Reported: coverage of the two-sided interval and of the one-sided lower bound (with 95 %
Clopper–Pearson intervals), widths, estimates, for the reweighted fit against the reweighted
truth, the unweighted fit against the same truth (it should not cover), and the class fit
against the class truth — over all sweeps and over the sweeps whose bound capplan calls honest
(``Envelope.honesty`` / ``ClassFit.honesty``). ``--design repeats`` adds 3 runs at each of
3.5, 4, 4.5 and 5 req/s (the rates bracketing the reweighted and the class crossings), the
repeats capplan's honesty rule asks for; ``--method within-run`` gives the earlier intervals.

    python benchmarks/coverage_mix.py --k 200 --reps 400 --jobs 2
    python benchmarks/coverage_mix.py --k 100 --reps 400 --jobs 2 --design repeats --truth-replications 100
    python benchmarks/coverage_mix.py --from-json a.json b.json   # re-summarise (and pool) saved sweeps
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SLO_TEXT = "ttft_ms=1000,attainment=0.9"
EDGES = (2048.0,)
TARGET_LONG = 0.30
#: SLO classes of the class coverage (the tenants' slo_class; same TTFT limit as SLO_TEXT, so
#: each class's truth is its input bucket's attainment in the same simulated runs)
CLASSES = {"classes": {"interactive": {"ttft_ms": 1000, "attainment": 0.95},
                       "batch": {"ttft_ms": 1000, "attainment": 0.6}}}
CLASS_BUCKET = {"interactive": 0, "batch": 1}
#: --design repeats: runs per level near the reweighted and the class crossings
REPEATS_AT = ((3.5, 3), (4.0, 3), (4.5, 3), (5.0, 3))


def config(**kw):
    from capplan.sim import load_config

    return load_config(ROOT / "templates" / "synth-mix.yaml").with_(**kw)


def config_at_share(long_share: float, **kw):
    """The same protocol with the docs tenant at ``long_share`` of the requests."""
    from capplan.sim.config import parse_config
    import yaml

    raw = yaml.safe_load((ROOT / "templates" / "synth-mix.yaml").read_text())
    raw["workload"]["tenants"][0]["share"] = 1.0 - long_share
    raw["workload"]["tenants"][1]["share"] = long_share
    return parse_config(raw).with_(**kw)


def tested_share(cfg) -> float:
    t = {x.name: x.share for x in cfg.tenants}
    return float(t["docs"] / sum(t.values()))


def _bisect(att, target: float, lo: float, hi: float, tol: float) -> float:
    """The rate where a decreasing ``att`` crosses ``target`` (bisection to ``tol``)."""
    if att(lo) < target or att(hi) >= target:
        raise ValueError(f"the truth bracket [{lo}, {hi}] does not bracket {target}")
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if att(mid) >= target else (lo, mid)
    return 0.5 * (lo + hi)


def class_truth(replications: int, refresh: bool = False) -> dict:
    """Each class's true C_SLO at the tested mix and the joint one (their minimum)."""
    from capplan.sim.truth import true_cell_attainment

    cfg = config()
    key = hashlib.sha256(json.dumps([repr(cfg), SLO_TEXT, replications, EDGES, CLASSES],
                                    default=str).encode()).hexdigest()[:12]
    path = HERE / "_data" / f"coverage_mix_classes_truth_{key}.json"
    if path.is_file() and not refresh:
        return json.loads(path.read_text())
    cache: dict[float, object] = {}

    def cell(x):
        if x not in cache:
            cache[x] = true_cell_attainment(cfg, x, SLO_TEXT, EDGES, replications=replications)
        return cache[x]

    out = {}
    for name, slo in CLASSES["classes"].items():
        b = CLASS_BUCKET[name]
        out[name] = _bisect(lambda x: cell(x).good[b] / cell(x).n[b], slo["attainment"], 1.0, 7.0, 0.02)
    out = {"classes": out, "joint": min(out.values()), "replications": replications,
           "cells": {f"{x:.4f}": {"n": list(c.n), "good": list(c.good)} for x, c in sorted(cache.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return out


def truth(replications: int, refresh: bool = False) -> dict:
    from capplan.sim.truth import true_capacity, true_mix_capacity

    cfg = config()
    p = tested_share(cfg)
    weights = [1.0 - TARGET_LONG, TARGET_LONG]
    key = hashlib.sha256(json.dumps([repr(cfg), SLO_TEXT, replications, EDGES, TARGET_LONG],
                                    default=str).encode()).hexdigest()[:12]
    path = HERE / "_data" / f"coverage_mix_truth_{key}.json"
    if path.is_file() and not refresh:
        return json.loads(path.read_text())
    t = time.perf_counter()
    rw, evals = true_mix_capacity(cfg, SLO_TEXT, 1.0, 6.0, EDGES, weights, tol_rps=0.02,
                                  replications=replications)
    tested = true_capacity(cfg, SLO_TEXT, 1.0, 6.5, tol_rps=0.02, replications=replications)
    full = true_capacity(config_at_share(TARGET_LONG), SLO_TEXT, 0.5, 6.0, tol_rps=0.02,
                         replications=replications)
    out = {"reweighted": float(rw), "tested": float(tested.capacity_rps), "full_target_mix": float(full.capacity_rps),
           "tested_long_share": p, "target_long_share": TARGET_LONG, "replications": replications,
           "slo": SLO_TEXT, "edges": list(EDGES),
           "cells": {f"{e.offered_rps:.4f}": {"n": list(e.n), "good": list(e.good)} for e in evals},
           "seconds": round(time.perf_counter() - t, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return out


def one_sweep(args) -> dict:
    k, seed, reps, fit_seed, confidence, design, method = args
    import pandas as pd

    from capplan.mix import target_from_table
    from capplan.mix.classes import fit_classes
    from capplan.mix.reweight import fit_mix
    from capplan.sim import generate_study

    target = target_from_table(pd.DataFrame({"input_min": [0, EDGES[0]], "input_max": [EDGES[0], None],
                                             "share": [1 - TARGET_LONG, TARGET_LONG]}))
    tmp = Path(tempfile.mkdtemp(prefix="cov_mix_"))
    try:
        extra = {"repeats_at": REPEATS_AT} if design == "repeats" else {}
        path, _ = generate_study(config(seed=seed + k, **extra), tmp / "s", workers=1)
        m = fit_mix(path, SLO_TEXT, target, reps=reps, seed=fit_seed + k, confidence=confidence, method=method)
        cf = fit_classes(path, CLASSES, reps=reps, seed=fit_seed + k, confidence=confidence, method=method)
        out = {"k": k, "ess_share": m.ess_share}
        for name, c, h in (("tested", m.base.cslo, m.base.honesty), ("reweighted", m.envelope.cslo, m.envelope.honesty),
                           ("classes", cf.cslo, cf.honesty)):
            out[name] = {"estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
                         "lower_bound": c.lower_bound, "status": c.status,
                         "honesty": None if h is None else h.status}
        out["classes"]["binding"] = cf.binding_class
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cp(k: int, n: int) -> tuple[float, float]:
    from capplan.bootstrap import clopper_pearson

    return clopper_pearson(k, n, 0.95)


def coverage(rows: list[dict], truth_value: float) -> dict:
    lo = np.array([r["ci_low"] for r in rows], float)
    hi = np.array([r["ci_high"] for r in rows], float)
    lb = np.array([r["lower_bound"] for r in rows], float)
    est = np.array([np.nan if r["estimate"] is None else r["estimate"] for r in rows], float)
    hit = (lo <= truth_value) & (truth_value <= hi)
    lb_ok = lb <= truth_value
    n = len(rows)
    return {"truth": truth_value, "coverage_two_sided": float(hit.mean()),
            "coverage_two_sided_cp95": cp(int(hit.sum()), n),
            "miss_below": int((hi < truth_value).sum()), "miss_above": int((lo > truth_value).sum()),
            "coverage_lower_bound": float(lb_ok.mean()), "coverage_lower_bound_cp95": cp(int(lb_ok.sum()), n),
            "mean_width": float(np.mean(hi - lo)), "mean_estimate": float(np.nanmean(est)),
            "sd_estimate": float(np.nanstd(est, ddof=1)) if n > 1 else float("nan"),
            "statuses": {s: int(sum(r["status"] == s for r in rows)) for s in {r["status"] for r in rows}},
            "honesty": {str(s): int(sum(r.get("honesty") == s for r in rows)) for s in {r.get("honesty") for r in rows}},
            "n": n}


def summarize(results: list[dict], tr: dict, confidence: float, ct: dict | None = None) -> dict:
    rw = [r["reweighted"] for r in results]
    un = [r["tested"] for r in results]
    out = {"K": len(results), "confidence": confidence, "truth": {k: tr[k] for k in
           ("reweighted", "tested", "full_target_mix", "tested_long_share", "target_long_share", "replications")},
           "reweighted_vs_reweighted_truth": coverage(rw, tr["reweighted"]),
           "unweighted_vs_reweighted_truth": coverage(un, tr["reweighted"]),
           "unweighted_vs_tested_truth": coverage(un, tr["tested"]),
           "reweighted_vs_full_target_mix_truth": coverage(rw, tr["full_target_mix"]),
           "mean_ess_share": float(np.mean([r["ess_share"] for r in results]))}
    honest_rw = [x for x in rw if x.get("honesty") == "honest"]
    honest_un = [x for x in un if x.get("honesty") == "honest"]
    if honest_rw:
        out["reweighted_honest_vs_reweighted_truth"] = coverage(honest_rw, tr["reweighted"])
    if honest_un:
        out["unweighted_honest_vs_tested_truth"] = coverage(honest_un, tr["tested"])
    if ct is not None and all("classes" in r for r in results):
        cl = [r["classes"] for r in results]
        out["truth"]["classes"] = ct["classes"]
        out["truth"]["classes_joint"] = ct["joint"]
        out["classes_vs_class_truth"] = coverage(cl, ct["joint"])
        honest_cl = [x for x in cl if x.get("honesty") == "honest"]
        if honest_cl:
            out["classes_honest_vs_class_truth"] = coverage(honest_cl, ct["joint"])
        out["classes_binding"] = {b: sum(x.get("binding") == b for x in cl) for b in {x.get("binding") for x in cl}}
    return out


def _line(name: str, c: dict) -> str:
    lo, hi = c["coverage_two_sided_cp95"]
    llo, lhi = c["coverage_lower_bound_cp95"]
    return (f"{name:<44} truth {c['truth']:.3f}: coverage {c['coverage_two_sided']:.3f} (CP95 {lo:.3f}–{hi:.3f}), "
            f"misses below/above {c['miss_below']}/{c['miss_above']}; lower bound {c['coverage_lower_bound']:.3f} "
            f"(CP95 {llo:.3f}–{lhi:.3f}); mean width {c['mean_width']:.3f}; estimates "
            f"{c['mean_estimate']:.3f} ± {c['sd_estimate']:.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=200, help="independent sweeps")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7000, help="sweep k uses synth seed SEED + k")
    ap.add_argument("--fit-seed", type=int, default=0)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--truth-replications", type=int, default=40)
    ap.add_argument("--refresh-truth", action="store_true")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--design", choices=("protocol", "repeats"), default="protocol",
                    help="repeats: 3 runs at each of 3.5, 4, 4.5, 5 req/s on top of the protocol")
    ap.add_argument("--method", choices=("run-effect", "within-run"), default="run-effect")
    ap.add_argument("--out", default=None)
    ap.add_argument("--from-json", nargs="+", default=None,
                    help="re-summarise the sweeps saved by --out (several files: their sweeps pooled)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    tr = truth(a.truth_replications, a.refresh_truth)
    print(f"truth ({tr['replications']} runs per rate): reweighted to {tr['target_long_share']:.0%} long "
          f"{tr['reweighted']:.3f} req/s; tested mix ({tr['tested_long_share']:.0%} long) {tr['tested']:.3f}; "
          f"simulated at {tr['target_long_share']:.0%} long (load effect included) {tr['full_target_mix']:.3f}"
          f"  [{time.perf_counter() - t0:.0f} s]", flush=True)
    ct = class_truth(a.truth_replications, a.refresh_truth)
    print(f"class truth: " + ", ".join(f"{c} {v:.3f}" for c, v in ct["classes"].items())
          + f"; joint {ct['joint']:.3f} req/s", flush=True)
    t1 = time.perf_counter()
    if a.from_json:
        results = [r for f in a.from_json for r in json.loads(Path(f).read_text())["sweeps"]]
    else:
        jobs = [(k, a.seed, a.reps, a.fit_seed, a.confidence, a.design, a.method) for k in range(a.k)]
        if a.jobs > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(a.jobs) as ex:
                results = list(ex.map(one_sweep, jobs))
        else:
            results = [one_sweep(j) for j in jobs]
    s = summarize(results, tr, a.confidence, ct)
    print(f"{s['K']} sweeps, {a.reps} replicates, nominal {a.confidence:.0%}  "
          f"[{time.perf_counter() - t1:.0f} s; load average {os.getloadavg()[0]:.1f}]")
    print(_line("reweighted C_SLO vs reweighted truth", s["reweighted_vs_reweighted_truth"]))
    print(_line("unweighted C_SLO vs reweighted truth", s["unweighted_vs_reweighted_truth"]))
    print(_line("unweighted C_SLO vs tested-mix truth", s["unweighted_vs_tested_truth"]))
    print(_line("reweighted C_SLO vs simulated target mix", s["reweighted_vs_full_target_mix_truth"]))
    for key, name in (("reweighted_honest_vs_reweighted_truth", "reweighted, where called honest"),
                      ("unweighted_honest_vs_tested_truth", "unweighted, where called honest, vs tested"),
                      ("classes_vs_class_truth", "SLO classes (joint) vs class truth"),
                      ("classes_honest_vs_class_truth", "SLO classes, where called honest")):
        if key in s:
            print(_line(name, s[key]) + f"; {s[key]['n']} sweeps")
    for key in ("reweighted_vs_reweighted_truth", "unweighted_vs_tested_truth", "classes_vs_class_truth"):
        if key in s:
            print(f"honesty verdicts ({key.split('_vs_')[0]}): {s[key]['honesty']}")
    if "classes_binding" in s:
        print(f"binding class: {s['classes_binding']}")
    print(f"mean effective sample size of the reweighting: {s['mean_ess_share']:.0%} of the tested requests")
    if a.out:
        Path(a.out).write_text(json.dumps({"summary": s, "sweeps": results}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
