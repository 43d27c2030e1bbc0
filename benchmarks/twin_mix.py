"""The target mix through a calibrated twin against the simulator's truth (docs/mix.md, "The twin
at the target mix"; the small version is tests/test_mix_twin.py).

Study: ``templates/synth-mix.yaml`` (as benchmarks/coverage_mix.py: 2 replicas, chat 85 % with
~500-token prompts, docs 15 % with ~5 000-token prompts, 9 Poisson runs at 1…6 req/s of 300 s,
``ttft_ms=1000,attainment=0.9``). Target: twice the long-prompt share (30 % of prompts ≥ 2048
tokens). Sweep k uses synth seed ``--seed + k`` — the coverage benchmark's sweeps — with the
per-token stamps recorded (``itl``: what a server-side log gives; the simulated requests are the
same), so the twin takes its server path. Per sweep: ``fit_twin``, ``fit_mix`` (reweighting) and
``capplan.mix.loadeffect.twin_mix`` (the twin at the tested and the target cell shares, under the
study's protocol).

Truths (benchmarks/coverage_mix.py's, cached under benchmarks/_data/): the target mix really
simulated (load effect included) — what the twin should predict —, the reweighted truth (what
reweighting estimates) and the tested mix's.

``--client-path K2``: K2 more sweeps without per-token stamps (the twin's client path, as from
GuideLLM / AIPerf output), each twin checked first (``twin check``, its verdict recorded, so a
twin that disagrees carries its warning into the comparison).

    python benchmarks/twin_mix.py --k 20 --jobs 2 --truth-replications 100 --client-path 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from coverage_mix import EDGES, SLO_TEXT, TARGET_LONG, config, cp, truth  # noqa: E402

TOLERANCE = 0.10  # the stated bound on |twin at the target mix − truth| / truth


def target_mix():
    import pandas as pd

    from capplan.mix import target_from_table

    return target_from_table(pd.DataFrame({"input_min": [0, EDGES[0]], "input_max": [EDGES[0], None],
                                           "share": [1 - TARGET_LONG, TARGET_LONG]}))


def one_sweep(args) -> dict:
    k, seed, reps, runs, draws, client, replays = args
    from capplan.mix.loadeffect import twin_mix
    from capplan.mix.reweight import fit_mix
    from capplan.sim import generate_study
    from capplan.twin import check_twin, fit_twin
    import warnings

    tmp = Path(tempfile.mkdtemp(prefix="twin_mix_"))
    t0 = time.perf_counter()
    try:
        path, _ = generate_study(config(seed=seed + k, itl=not client), tmp / "s", workers=1)
        tw = fit_twin(path)
        t1 = time.perf_counter()
        out = {"k": k, "path": "client" if client else "server", "method": tw.source.get("method", "")}
        if client:
            chk = check_twin(tw, path, SLO_TEXT, replays=replays, steady=False)
            where = "; ".join(chk.where) or "every run and metric within the twin's prediction"
            tw = replace(tw, last_check={"verdict": chk.verdict, "where": where, "study": chk.study,
                                         "slo": SLO_TEXT, "replays": replays})  # as `capplan twin check` records it
            out["check"] = {"verdict": chk.verdict, "where": where}
        t2 = time.perf_counter()
        m = fit_mix(path, SLO_TEXT, target_mix(), reps=reps, seed=k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = twin_mix(tw, path, SLO_TEXT, m.target, mixfit=m, seed=k, runs=runs, draws=draws, workers=1)
        t3 = time.perf_counter()
        for name, c in (("measured", r.measured), ("reweighted", r.reweighted), ("twin_tested", r.tested),
                        ("twin_target", r.at_target)):
            out[name] = {"estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high}
        out.update({"agree": r.agree, "disagreement": r.disagreement, "runs": r.runs, "warning": r.warning,
                    "in_words": r.in_words(), "seconds": {"fit_twin": t1 - t0, "check": t2 - t1,
                                                          "mix_and_twin": t3 - t2}})
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def error_stats(est: np.ndarray, lo: np.ndarray, hi: np.ndarray, truth_value: float) -> dict:
    rel = est / truth_value - 1
    hit = (lo <= truth_value) & (truth_value <= hi)
    n = len(est)
    return {"truth": truth_value, "mean_estimate": float(np.mean(est)),
            "sd_estimate": float(np.std(est, ddof=1)) if n > 1 else float("nan"),
            "mean_error": float(np.mean(rel)), "rmse": float(np.sqrt(np.mean(rel ** 2))),
            "max_abs_error": float(np.max(np.abs(rel))), "within_tolerance": float(np.mean(np.abs(rel) <= TOLERANCE)),
            "within_tolerance_cp95": cp(int(np.sum(np.abs(rel) <= TOLERANCE)), n),
            "coverage": float(hit.mean()), "coverage_cp95": cp(int(hit.sum()), n),
            "mean_width": float(np.mean(hi - lo))}


def summarize(rows: list[dict], tr: dict) -> dict:
    def arr(name, part):
        return np.array([r[name][part] for r in rows], float)

    s = {"K": len(rows)}
    for name, t in (("twin_target", tr["full_target_mix"]), ("reweighted", tr["full_target_mix"]),
                    ("twin_tested", tr["tested"]), ("measured", tr["tested"]), ("reweighted_vs_reweighted_truth", None)):
        key = "reweighted" if name.startswith("reweighted_vs") else name
        s[name] = error_stats(arr(key, "estimate"), arr(key, "ci_low"), arr(key, "ci_high"),
                              tr["reweighted"] if t is None else t)
    s["disagreement_found"] = float(np.mean([not r["agree"] for r in rows]))
    s["mean_runs"] = float(np.mean([r["runs"] for r in rows]))
    s["mean_seconds"] = {k: float(np.mean([r["seconds"][k] for r in rows])) for k in rows[0]["seconds"]}
    return s


def _line(name: str, c: dict) -> str:
    a, b = c["within_tolerance_cp95"]
    lo, hi = c["coverage_cp95"]
    return (f"{name:<40} truth {c['truth']:.3f}: mean {c['mean_estimate']:.3f} ± {c['sd_estimate']:.3f} "
            f"(mean error {c['mean_error']:+.1%}, RMSE {c['rmse']:.1%}, max |error| {c['max_abs_error']:.1%}); "
            f"within ±{TOLERANCE:.0%}: {c['within_tolerance']:.2f} (CP95 {a:.2f}–{b:.2f}); interval covers the "
            f"truth {c['coverage']:.2f} (CP95 {lo:.2f}–{hi:.2f}), mean width {c['mean_width']:.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=20, help="sweeps (server path)")
    ap.add_argument("--client-path", type=int, default=0, help="extra sweeps without per-token stamps, checked first")
    ap.add_argument("--replays", type=int, default=10, help="twin check replays per run (client-path sweeps)")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--runs", type=int, default=None, help="twin runs pooled per rate (default: twin_mix's)")
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7000, help="sweep k uses synth seed SEED + k")
    ap.add_argument("--truth-replications", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    tr = truth(a.truth_replications)
    print(f"truth ({tr['replications']} runs per rate): target mix really simulated {tr['full_target_mix']:.3f} "
          f"req/s; reweighted {tr['reweighted']:.3f}; tested mix {tr['tested']:.3f}  [{time.perf_counter() - t0:.0f} s]",
          flush=True)
    jobs = [(k, a.seed, a.reps, a.runs, a.draws, False, a.replays) for k in range(a.k)]
    jobs += [(a.k + k, a.seed, a.reps, a.runs, a.draws, True, a.replays) for k in range(a.client_path)]
    t1 = time.perf_counter()
    if a.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(a.jobs) as ex:
            rows = list(ex.map(one_sweep, jobs))
    else:
        rows = [one_sweep(j) for j in jobs]
    print(f"{len(rows)} sweeps  [{time.perf_counter() - t1:.0f} s; load average "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())}]")
    out = {"truth": {k: tr[k] for k in ("reweighted", "tested", "full_target_mix", "replications")}, "sweeps": rows}
    server = [r for r in rows if r["path"] == "server"]
    if server:
        s = summarize(server, tr)
        out["server"] = s
        print(f"server path ({s['K']} sweeps; {s['mean_runs']:.0f} twin runs per rate; mean seconds per sweep: "
              + ", ".join(f"{k} {v:.1f}" for k, v in s["mean_seconds"].items()) + ")")
        print(_line("twin at the target mix vs simulated", s["twin_target"]))
        print(_line("reweighted vs target mix simulated", s["reweighted"]))
        print(_line("reweighted vs reweighted truth", s["reweighted_vs_reweighted_truth"]))
        print(_line("twin at the tested mix vs tested truth", s["twin_tested"]))
        print(_line("measured tested mix vs tested truth", s["measured"]))
        print(f"the two target-mix intervals do not overlap (disagreement said) in {s['disagreement_found']:.0%} "
              "of the sweeps")
    for r in rows:
        if r["path"] == "client":
            print(f"client path, sweep {r['k']}: check {r['check']['verdict']}; measured {r['measured']['estimate']:.3f}, "
                  f"twin at the tested mix {r['twin_tested']['estimate']:.3f}; at the target mix reweighted "
                  f"{r['reweighted']['estimate']:.3f}, twin {r['twin_target']['estimate']:.3f} "
                  f"[{r['twin_target']['ci_low']:.3f}, {r['twin_target']['ci_high']:.3f}]; warning repeated: "
                  f"{bool(r['warning'])}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
