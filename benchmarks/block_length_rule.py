"""Which series the block length is computed on: the rule of ``capplan.reduce.block_length``
against the previous rule, by the coverage of per-run intervals on the real simulator.

Rules (b = block length in requests; PW = Politis–White, ``bootstrap.optimal_block_length``):
  union     (current) max of PW on the 0/1 SLO-good series, log TTFT, log TPOT, and the log of
            any other latency the SLO limits — every series a statistic of the run is read from
  primary   (previous envelope rule) max of PW on the good series and on the log of ONE latency:
            the SLO limit with the most violations in the run (TTFT on ties)

For each offered rate, N independent runs of the ``demo`` protocol (600 s, 30-s warm-up; the
``demo`` preset without ITL lists and power samples) are reduced once per rule. Per run, a
circular block bootstrap (reps replicates, the run's own stream) gives 95 % percentile
intervals of the attainment (SLO ttft_ms=2000,tpot_ms=100), of TTFT p99 and of TPOT p99 (ok
requests, from the per-unit tail histograms). The truth at a rate is the pooled value over its
N runs (attainment Σgood/Σn; p99 from the pooled histogram). Reported: coverage with its
Clopper–Pearson 95 % interval, mean interval width, median block length — per rule, rate and
statistic. Runs at the same rate are independent, so coverage is the within-run bootstrap's
own (between-run drift near saturation is out of its reach by design).

    python benchmarks/block_length_rule.py --runs 100 --rates 3,4.5,5.5 --reps 400
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np

SLO_TEXT = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
_MISSING = 32767


def previous_rule(limits: dict):
    """The envelope's block-length rule before the union rule (for comparison only)."""
    from capplan import bootstrap as boot
    from capplan import sketch

    def rule(good, latency):
        good = np.asarray(good, dtype=np.float64)
        one = boot.BlockLength(1.0, 1.0)
        bl_good = boot.optimal_block_length(good) if good.size >= 3 else one
        if not latency or good.size < 3:
            return bl_good, None, ""
        best, best_v = None, -1
        for m, v in latency.items():
            if m not in limits:
                continue
            lk = int(sketch.keys(np.array([limits[m]]))[0])
            nv = int(np.count_nonzero((np.asarray(v) < _MISSING) & (np.asarray(v) > lk)))
            if nv > best_v:
                best, best_v = m, nv
        v = np.asarray(latency[best], dtype=np.float64)
        miss = v >= _MISSING
        if miss.all():
            return bl_good, one, best
        if miss.any():
            v = np.where(miss, np.max(v[~miss]), v)
        return bl_good, boot.optimal_block_length(v), best
    return rule


@contextlib.contextmanager
def rule_in_place(rule):
    from capplan import reduce as R

    saved = R.block_length
    R.block_length = rule
    try:
        yield
    finally:
        R.block_length = saved


def per_run(stats, reps: int, seed: int) -> dict:
    """Per-run 95 % intervals of attainment, TTFT p99 and TPOT p99; pooled truths."""
    from capplan import bootstrap as boot
    from capplan import sketch

    scheme = boot.Circular()
    out = {"att": [], "ttft": [], "tpot": [], "block_len": []}
    pooled = {}
    for r in stats.runs:
        R = stats.resample(r, scheme, reps=reps, seed=seed)
        a = R.sums(r.units["n_good"]) / R.sums(r.units["n"])
        out["att"].append(boot.percentile_ci(a))
        for m in ("ttft", "tpot"):
            k0, h, below = r.tail[m]
            q = boot.quantile_replicates(R, h, k0, 0.99, stats.alpha, below=below)
            out[m].append(boot.percentile_ci(q))
            k, c = r.hist[m]
            pooled.setdefault(m, {})
            for kk, cc in zip(range(k, k + c.size), c):
                pooled[m][kk] = pooled[m].get(kk, 0) + cc
        out["block_len"].append(scheme.block_requests(r.block_len))
    truth = {"att": sum(r.n_good for r in stats.runs) / sum(r.n for r in stats.runs)}
    for m, d in pooled.items():
        k0 = min(d)
        dense = np.zeros(max(d) - k0 + 1)
        for kk, cc in d.items():
            dense[kk - k0] = cc
        truth[m] = float(sketch.quantile_from_counts(dense, k0, 0.99, stats.alpha))
    return {"ci": out, "truth": truth}


def main(argv=None) -> int:
    from scipy import stats as st

    from capplan.reduce import reduce_study
    from capplan.sim import preset
    from capplan.sim.sweep import generate_study

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100, help="independent runs per rate")
    ap.add_argument("--rates", default="3,4.5,5.5")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=9000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rates = [float(v) for v in a.rates.split(",")]
    rules = {"union": None, "primary": previous_rule({"ttft": 2000.0, "tpot": 100.0})}
    res = {}
    t0 = time.perf_counter()
    for rate in rates:
        cfg = preset("demo").with_(itl=False, power=None, rates=(rate,), repeats=a.runs,
                                   seed=a.seed)
        with tempfile.TemporaryDirectory(prefix="cp-blrule-") as tmp:
            path, _ = generate_study(cfg, Path(tmp) / "s", workers=2)
            for name, rule in rules.items():
                ctx = rule_in_place(rule) if rule is not None else contextlib.nullcontext()
                with ctx:
                    stats = reduce_study(path, SLO_TEXT)
                res[(rate, name)] = per_run(stats, a.reps, seed=1)
        print(f"rate {rate:g}: simulated and reduced [{time.perf_counter() - t0:.0f} s]",
              flush=True)
    print(f"\n{a.runs} runs per rate, {a.reps} replicates, 95 % percentile intervals; "
          "coverage [Clopper–Pearson 95 %], mean width, median block length (requests)")
    rows = []
    for rate in rates:
        for stat in ("att", "ttft", "tpot"):
            for name in rules:
                d = res[(rate, name)]
                t = d["truth"][stat]
                ci = np.array(d["ci"][stat])
                hit = (ci[:, 0] <= t) & (t <= ci[:, 1])
                k, n = int(hit.sum()), len(hit)
                lo = st.beta.ppf(0.025, k, n - k + 1) if k else 0.0
                hi = st.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
                w = float(np.mean(ci[:, 1] - ci[:, 0]))
                bl = float(np.median(d["ci"]["block_len"]))
                rows.append({"rate": rate, "statistic": stat, "rule": name, "coverage": k / n,
                             "cp95": [float(lo), float(hi)], "mean_width": w,
                             "median_block_len": bl, "truth": t})
                print(f"{rate:5g} req/s  {stat:5s} {name:8s} coverage {k / n:5.3f} "
                      f"[{lo:.3f}, {hi:.3f}]  width {w:10.4g}  block {bl:7.1f}  truth {t:.5g}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
