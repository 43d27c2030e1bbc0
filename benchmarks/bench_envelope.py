"""Benchmark: the SLO capacity envelope from parquet, on two sweep shapes, side by side with a
straightforward pandas + ``arch`` circular-block-bootstrap pipeline on the same data.

Builds once (cached under benchmarks/_data/, git-ignored) two sweeps of RUNS runs × ROWS
requests with numpy (``build_study``):
  constant  constant-rate arrivals at 20·k req/s, TTFT = base·exp(σ·AR(1) + load), lognormal
            TPOT, ~0.2 % failures, sequential string ids, rows in scheduled order;
            SLO ttft_ms=2000,tpot_ms=100,attainment=0.99
  poisson   an M/M/1 queue: Poisson arrivals at 8·k req/s, exponential 10-ms service, TTFT =
            waiting + service (Lindley), ρ = 0.08…0.96; random hexadecimal string ids, one row
            group per file, rows in completion order; a TTFT-only SLO ttft_ms=150,attainment=0.99
Then, per shape, each in a fresh child process:

  capplan   open_study + reduce_study (the DuckDB reduction) + fit_envelope(..., reps=1000,
            stats=...) (per-run attainment and TTFT/TPOT/ITL/E2E p99 CIs, isotonic fit, C_SLO
            CI and lower bound, diagnostics); then refits for a changed target and a changed
            TTFT limit (env.refit), best of 3
  command   `python -m capplan envelope STUDY --slo ... --out FILE`, wall time of the whole
            command (interpreter start, imports, reduction, fit, printing, JSON)
  baseline  pandas.read_parquet → per run: SLO-good 0/1 series in scheduled order,
            arch.bootstrap.optimal_block_length, CircularBlockBootstrap(b).apply(mean, reps)
            (b = PW on the good series), then the same isotonic fit and logit crossing; with
            the same block bootstrap for a TTFT p99 CI per run unless --no-baseline-p99. The
            "attainment-only" figure is the baseline without the p99 part.

The baseline is slow at full size (arch calls the statistic once per replicate); by default it
runs on --baseline-runs runs and is scaled linearly to RUNS (stated in the output). The machine
is shared: figures are best of --repeats, with the load average printed; compare ratios from
one run.

    python benchmarks/bench_envelope.py                          # both shapes, 12 × 1 M
    python benchmarks/bench_envelope.py --shapes poisson --repeats 3
    python benchmarks/bench_envelope.py --rows-per-run 100000 --baseline-runs 2   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPES = ("constant", "poisson")
#: the SLO of each shape: the constant-rate sweep has TTFT and TPOT limits, the M/M/1 sweep
#: TTFT only (its TPOT is not load dependent)
SLO_TEXTS = {"constant": "ttft_ms=2000,tpot_ms=100,attainment=0.99",
             "poisson": "ttft_ms=150,attainment=0.99"}


def build_study(dest: Path, runs: int, rows: int, seed: int, shape: str = "constant") -> Path:
    """The sweep of one shape (cached): ``constant`` — constant-rate arrivals at 20·k req/s,
    AR(1) log TTFT growing with load, sequential string ids, row groups of 2^20 rows;
    ``poisson`` — an M/M/1 queue (Poisson arrivals at 8·k req/s, exponential service of mean
    10 ms, FIFO; TTFT = waiting + service by Lindley's recursion, so dependence grows towards
    saturation: ρ = 0.08 … 0.96), random hexadecimal string request ids, one row group per
    file, rows written in completion order (not scheduled order)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml
    from scipy import signal

    from capplan import contract as C
    from capplan.io import manifest_dict

    if (dest / C.MANIFEST_NAME).is_file():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    (tmp / C.EVENTS_DIR).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    mruns = []
    for k in range(runs):
        run_id = f"r{k + 1:02d}"
        load = (k + 1) / runs
        if shape == "poisson":
            rate = 8.0 * (k + 1)
            gaps = rng.exponential(1.0 / rate, rows)
            sched_s = np.cumsum(gaps) - gaps[0]
            svc = rng.exponential(0.010, rows)
            # Lindley: W_n = X_n − min_{k≤n} X_k, X_n = Σ_{k≤n} (S_{k−1} − A_k), X_0 = 0
            x = np.concatenate([[0.0], np.cumsum(svc[:-1] - gaps[1:])])
            wait = x - np.minimum.accumulate(np.minimum(x, 0.0))
            sched = np.rint(sched_s * 1e9).astype(np.int64)
            ttft_ms = (wait + svc) * 1e3
            arrival = "poisson"
        else:
            rate = 20.0 * (k + 1)
            sched = (np.arange(rows) * (1e9 / rate)).astype(np.int64)
            phi = 0.98
            z = signal.lfilter([1.0], [1.0, -phi], rng.standard_normal(rows) * np.sqrt(1 - phi**2))
            ttft_ms = 400 * np.exp(0.45 * z + 2.2 * load**2)
            arrival = "constant"
        mruns.append({"run_id": run_id, "offered_rps": rate, "arrival": arrival,
                      "duration_s": round(rows / rate, 3), "warmup_s": 0.0})
        tpot_ms = rng.lognormal(np.log(30 * (1 + load)), 0.3, rows)
        out_tok = np.maximum(2, rng.geometric(1 / 150, rows)).astype(np.int64)
        first = sched + (ttft_ms * 1e6).astype(np.int64)
        last = first + (tpot_ms * 1e6 * (out_tok - 1)).astype(np.int64)
        st = rng.choice(3, rows, p=[0.998, 0.001, 0.001])
        status = np.array(["ok", "timeout", "rejected"])[st]
        fail = st != 0
        if shape == "poisson":
            ids = np.char.add(f"{run_id}-", np.char.mod("%016x", rng.integers(0, 2**62, rows)))
            order = np.argsort(np.where(fail, sched, last), kind="stable")  # completion order
        else:
            ids = np.char.add(f"{run_id}-", np.arange(rows).astype("U9"))
            order = np.arange(rows)
        tbl = pa.table({
            "run_id": pa.array(np.full(rows, run_id)),
            "request_id": pa.array(ids),
            "scheduled_ns": sched, "sent_ns": sched,
            "first_token_ns": pa.array(first, mask=fail),
            "last_token_ns": pa.array(last, mask=fail),
            "input_tokens": rng.integers(50, 2000, rows, dtype=np.int64),
            "output_tokens": np.where(fail, 0, out_tok),
            "status": pa.array(status),
        }).take(pa.array(order))
        pq.write_table(tbl, tmp / C.EVENTS_DIR / f"{run_id}.parquet", compression="zstd",
                       row_group_size=rows if shape == "poisson" else 1 << 20)
    (tmp / C.MANIFEST_NAME).write_text(yaml.safe_dump(
        manifest_dict(f"bench-envelope-{shape}", mruns), sort_keys=False))
    os.replace(tmp, dest)
    return dest


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu_s() -> float:
    """CPU seconds of this process, all threads (less sensitive to a shared machine's load
    than wall time)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child_capplan(path: str, reps: int, shape: str) -> dict:
    from capplan.envelope import fit_envelope
    from capplan.reduce import reduce_study
    from capplan.slo import SLO
    from capplan.study import open_study

    slo = SLO.parse(SLO_TEXTS[shape])
    t0, c0 = time.perf_counter(), _cpu_s()
    study = open_study(path)
    stats = reduce_study(study, slo)
    t1, c1 = time.perf_counter(), _cpu_s()
    env = fit_envelope(study, slo, reps=reps, seed=0, stats=stats)
    t2, c2 = time.perf_counter(), _cpu_s()
    rf_target, rf_ttft = [], []
    for i in range(3):
        a = time.perf_counter()
        env.refit(attainment=0.95 + 0.01 * i)
        b = time.perf_counter()
        env.refit(slo=slo.with_(ttft_ms=slo.ttft_ms * 1.1 ** (i + 1)))
        c = time.perf_counter()
        rf_target.append(b - a)
        rf_ttft.append(c - b)
    return {"reduce_s": t1 - t0, "fit_s": t2 - t1, "total_s": t2 - t0,
            "reduce_cpu_s": c1 - c0, "fit_cpu_s": c2 - c1,
            "refit_target_s": min(rf_target), "refit_ttft_s": min(rf_ttft),
            "rss_mb": _rss_mb(), "cslo": env.cslo.to_dict(),
            "n_good": env.runs["n_good"].tolist(), "n": env.runs["n"].tolist(),
            "block_len": env.runs["block_len"].tolist(),
            "block_len_good": env.runs["block_len_good"].tolist(),
            "block_metric": env.runs["block_metric"].tolist()}


def child_command(path: str, reps: int, shape: str) -> dict:
    """The whole `capplan envelope` command, as a user runs it (a fresh interpreter)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "envelope.json"
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "capplan", "envelope", path, "--slo",
                            SLO_TEXTS[shape], "--reps", str(reps), "--out", str(out)],
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode:
            raise RuntimeError(r.stderr)
        cslo = json.loads(out.read_text())["cslo"]
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "cslo": cslo}


def child_baseline(path: str, reps: int, runs: int, p99: bool, shape: str) -> dict:
    import numpy as np
    import pandas as pd
    import yaml
    from arch.bootstrap import CircularBlockBootstrap, optimal_block_length
    from scipy.optimize import isotonic_regression
    from scipy.special import logit

    lim = {"constant": {"ttft": 2000.0, "tpot": 100.0}, "poisson": {"ttft": 150.0}}[shape]
    t0, c0 = time.perf_counter(), _cpu_s()
    man = yaml.safe_load(open(Path(path) / "study.yaml"))
    rates, atts, reps_att, n_good = [], [], [], []
    p99_s, p99_cpu, p99_ci = 0.0, 0.0, []
    for r in man["runs"][:runs]:
        df = pd.read_parquet(Path(path) / "events" / f"{r['run_id']}.parquet",
                             columns=["scheduled_ns", "first_token_ns", "last_token_ns",
                                      "output_tokens", "status"])
        df = df.sort_values("scheduled_ns")
        ttft = (df["first_token_ns"] - df["scheduled_ns"]) / 1e6
        tpot = (df["last_token_ns"] - df["first_token_ns"]) / 1e6 / (df["output_tokens"] - 1)
        good = (df["status"] == "ok") & df["first_token_ns"].notna() & (ttft <= lim["ttft"])
        if "tpot" in lim:
            good &= tpot.isna() | (tpot <= lim["tpot"])
        good = good.to_numpy(float)
        b = float(optimal_block_length(good)["circular"].iloc[0])
        bs = CircularBlockBootstrap(max(1, int(round(b))), good, seed=0)
        rep = bs.apply(np.mean, reps).ravel()
        if p99:  # the same block bootstrap for the TTFT p99 CI of ok requests (capplan gives it)
            tp, cp_ = time.perf_counter(), _cpu_s()
            ok = ttft[df["status"] == "ok"].to_numpy(float)
            bq = CircularBlockBootstrap(max(1, int(round(b))), ok, seed=0)
            q = bq.apply(lambda v: np.quantile(v, 0.99), reps).ravel()
            p99_ci.append([float(v) for v in np.percentile(q, [2.5, 97.5])])
            p99_s += time.perf_counter() - tp
            p99_cpu += _cpu_s() - cp_
        sched = df["scheduled_ns"].to_numpy()
        rates.append((len(df) - 1) / ((sched[-1] - sched[0]) / 1e9))
        atts.append(good.mean())
        reps_att.append(rep)
        n_good.append(int(good.sum()))
    x = np.array(rates)
    A = np.column_stack(reps_att)
    w = 1.0 / np.maximum(A.var(axis=0), 1e-12)
    target = 0.99

    def cross(y):
        f = isotonic_regression(y, weights=w, increasing=False).x
        bad = np.nonzero(f < target)[0]
        if not bad.size:
            return x[-1]
        i = bad[0]
        if i == 0:
            return 0.0
        f0, f1 = np.clip(f[i - 1], 1e-6, 1 - 1e-6), np.clip(f[i], 1e-6, 1 - 1e-6)
        return x[i - 1] + (x[i] - x[i - 1]) * (logit(f0) - logit(target)) / (logit(f0) - logit(f1))

    est = cross(np.array(atts))
    cr = np.array([cross(A[k]) for k in range(reps)])
    t1 = time.perf_counter()
    return {"total_s": t1 - t0, "p99_s": p99_s, "att_s": t1 - t0 - p99_s, "runs": runs,
            "cpu_s": _cpu_s() - c0, "att_cpu_s": _cpu_s() - c0 - p99_cpu,
            "rss_mb": _rss_mb(), "estimate": float(est), "p99_ci": p99_ci,
            "ci": [float(v) for v in np.percentile(cr, [2.5, 97.5])], "n_good": n_good}


def _spawn(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         check=True, env={**os.environ})
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(shape: str, a) -> dict:
    """Build (cached) and time one shape: capplan, the command, the baseline (best of
    ``a.repeats``, children interleaved so that load changes hit all three)."""
    dest = HERE / "_data" / f"envelope_{shape}_{a.runs}x{a.rows_per_run}_s{a.seed}"
    t = time.perf_counter()
    build_study(dest, a.runs, a.rows_per_run, a.seed, shape)
    print(f"{shape}: {dest} ({a.runs} runs × {a.rows_per_run:,} requests; ready in "
          f"{time.perf_counter() - t:.1f} s)", flush=True)
    common = ["--path", str(dest), "--reps", str(a.reps), "--shape", shape]
    cps, cmds, bls = [], [], []
    for i in range(a.repeats):
        cps.append(_spawn(["--child", "capplan", *common]))
        cmds.append(_spawn(["--child", "command", *common]))
        if i < a.baseline_repeats:
            bls.append(_spawn(["--child", "baseline", *common, "--baseline-runs",
                               str(a.baseline_runs)]
                              + (["--no-baseline-p99"] if a.no_baseline_p99 else [])))
    assert all(c["cslo"] == cps[0]["cslo"] for c in cps), "same seed must give the same C_SLO"
    assert all(c["cslo"] == cps[0]["cslo"] for c in cmds), "the command must give the same C_SLO"
    cp = min(cps, key=lambda d: d["total_s"])
    cmd = min(cmds, key=lambda d: d["wall_s"])
    bl = min(bls, key=lambda d: d["total_s"])
    scale = a.runs / bl["runs"]
    return {"cp": cp, "cmd": cmd, "bl": bl, "scale": scale, "all_cp": cps, "all_cmd": cmds,
            "all_bl": bls, "good_ok": cp["n_good"][: bl["runs"]] == bl["n_good"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows-per-run", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--baseline-runs", type=int, default=2,
                    help="runs the arch baseline processes (scaled linearly to --runs)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each child this many times and keep the fastest (noisy box)")
    ap.add_argument("--baseline-repeats", type=int, default=None,
                    help="repeats of the (slow) baseline; default --repeats")
    ap.add_argument("--no-baseline-p99", action="store_true",
                    help="baseline computes attainment CIs only (no TTFT p99 CI)")
    ap.add_argument("--child", choices=["capplan", "command", "baseline"], default=None)
    ap.add_argument("--path", default=None)
    ap.add_argument("--shape", default="constant", choices=SHAPES)
    ap.add_argument("--json", default=None, help="write every measurement here")
    a = ap.parse_args()
    if a.child == "capplan":
        print(json.dumps(child_capplan(a.path, a.reps, a.shape)))
        return
    if a.child == "command":
        print(json.dumps(child_command(a.path, a.reps, a.shape)))
        return
    if a.child == "baseline":
        print(json.dumps(child_baseline(a.path, a.reps, a.baseline_runs,
                                        not a.no_baseline_p99, a.shape)))
        return
    shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
    a.baseline_repeats = a.repeats if a.baseline_repeats is None else max(1, a.baseline_repeats)
    load0 = os.getloadavg()[0]
    res = {sh: measure(sh, a) for sh in shapes}
    load1 = os.getloadavg()[0]
    print(f"\nreps = {a.reps}; best of {a.repeats}; load average {load0:.1f} at the start, "
          f"{load1:.1f} at the end, on {os.cpu_count()} CPUs")
    w = 12
    print(f"{'step (wall s unless said)':48s}" + "".join(f"{sh:>{w}s}" for sh in shapes))

    def row(label, f, fmt="{:.2f}"):
        print(f"{label:48s}" + "".join(f"{fmt.format(f(res[sh])):>{w}s}" for sh in shapes))

    row("SLO", lambda r: "", "{}")
    for sh in shapes:
        print(f"  {sh}: {SLO_TEXTS[sh]}")
    row("capplan reduce (open + DuckDB reduction)", lambda r: r["cp"]["reduce_s"])
    row("capplan fit (bootstrap, isotonic, CIs)", lambda r: r["cp"]["fit_s"])
    row("capplan reduce + fit", lambda r: r["cp"]["total_s"])
    row("  CPU seconds: reduce", lambda r: r["cp"]["reduce_cpu_s"])
    row("  CPU seconds: fit", lambda r: r["cp"]["fit_cpu_s"])
    row("`capplan envelope` command, end to end", lambda r: r["cmd"]["wall_s"])
    row("  its CPU seconds (all threads)", lambda r: r["cmd"]["cpu_s"])
    row("capplan refit, changed target (best of 3)", lambda r: r["cp"]["refit_target_s"],
        "{:.3f}")
    row("capplan refit, changed TTFT limit (best of 3)", lambda r: r["cp"]["refit_ttft_s"],
        "{:.3f}")
    row("capplan peak RSS MB (reduce + fit)", lambda r: r["cp"]["rss_mb"], "{:.0f}")
    row("baseline runs measured", lambda r: r["bl"]["runs"], "{:d}")
    row("baseline measured (attainment + p99)", lambda r: r["bl"]["total_s"])
    row("baseline scaled to all runs", lambda r: r["bl"]["total_s"] * r["scale"])
    row("  its CPU seconds (scaled)", lambda r: r["bl"]["cpu_s"] * r["scale"])
    row("  attainment only, CPU seconds (scaled)", lambda r: r["bl"]["att_cpu_s"] * r["scale"])
    row("  of which attainment only", lambda r: r["bl"]["att_s"] * r["scale"])
    row("ratio: attainment-only baseline / reduce + fit",
        lambda r: r["bl"]["att_s"] * r["scale"] / r["cp"]["total_s"], "{:.1f}×")
    row("ratio: attainment-only baseline / command",
        lambda r: r["bl"]["att_s"] * r["scale"] / r["cmd"]["wall_s"], "{:.1f}×")
    row("ratio by CPU s: attainment-only baseline / command",
        lambda r: r["bl"]["att_cpu_s"] * r["scale"] / r["cmd"]["cpu_s"], "{:.1f}×")
    row("ratio: full baseline / reduce + fit",
        lambda r: r["bl"]["total_s"] * r["scale"] / r["cp"]["total_s"], "{:.1f}×")
    row("good counts capplan == baseline", lambda r: str(r["good_ok"]), "{}")
    for sh in shapes:
        r = res[sh]
        c = r["cp"]["cslo"]
        print(f"\n{sh}: C_SLO {c['estimate']:.4g} [{c['ci_low']:.4g}, {c['ci_high']:.4g}] "
              f"lower bound {c['lower_bound']:.4g} ({c['status']}); block lengths (requests) "
              f"{[round(b, 1) for b in r['cp']['block_len']]}; series "
              f"{sorted(set(r['cp']['block_metric']))}")
        if a.repeats > 1:
            print("  every repeat (s): reduce+fit "
                  + ", ".join(f"{d['total_s']:.2f}" for d in r["all_cp"]) + "; command "
                  + ", ".join(f"{d['wall_s']:.2f}" for d in r["all_cmd"]) + "; baseline "
                  + ", ".join(f"{d['total_s']:.2f}" for d in r["all_bl"]))
    if a.json:
        Path(a.json).write_text(json.dumps({"load": [load0, load1], "results": res}, indent=1,
                                           default=str))


if __name__ == "__main__":
    main()
