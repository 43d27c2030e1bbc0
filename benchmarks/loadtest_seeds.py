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
≤ the truth, does its two-sided interval cover the truth, how many load-test minutes did it use,
and how far each run's realised rate landed from the asked one (z = (measured − asked) /
sqrt(asked / duration): SD 1 for a Poisson client). ``--target guidellm`` runs GuideLLM 0.8.1
instead of AIPerf against the same server; with ``--suite``, a tool's settings of the suite's
loop test (tests/test_loop_realtools.py: GuideLLM drives the server 2× faster, truth ≈ 8.8
req/s, at most 3 rounds), the loop the clean-clone CI runs.

Two fixed grids it is measured against, each run with the same seed, k = 1, 2, … repeats of
every rate, costed at the first k whose fit is honest ("honest") and at the first that meets the
load test's own stop rule ("rule": honest and within the tolerance):

* ``coarse``: the coarse rates × k (what a fixed-sweep tool runs);
* ``fine``: levels ≤ 10 % apart over the same range × k, the finest bracket the honesty rule
  asks for, chosen without knowing where the crossing is.

    python benchmarks/loadtest_seeds.py --target synth --seeds 10 --out /tmp/lt_synth.json
    python benchmarks/loadtest_seeds.py --target aiperf --seeds 10 --grid-seeds 1 --grid-kmax 3 --out /tmp/lt_aiperf.json
    python benchmarks/loadtest_seeds.py --target guidellm --seeds 5 --grid-seeds 0 --out /tmp/lt_guidellm.json
    python benchmarks/loadtest_seeds.py --target guidellm --suite --seeds 10 --keep records

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
from capplan.loadtest import Bound, InterruptedLoadtest, Spec, SynthTarget, run_loadtest  # noqa: E402

SYNTH = {"model": ROOT / "tests/fixtures/synth_small_sweep.yaml",
         "slo": "ttft_ms=2000,tpot_ms=100,attainment=0.99", "truth": (2.589, 0.010),
         "rates": (1.0, 2.0, 3.0, 4.0), "duration_s": 300.0, "budget": 60.0, "round": 20.0,
         "max_rounds": 6}
REAL = {"slo": "ttft_ms=75,tpot_ms=20,attainment=0.95", "rates": (8.0, 12.0, 16.0, 20.0, 24.0),
        "duration_s": 15.0, "budget": 20.0, "round": 3.0, "max_rounds": 4}


def _grid_synth(seed: int, kmax: int, reps: int, rates, tolerance: float) -> dict:
    """The fixed grid simulated on the model: k repeats of every rate, k = 1, 2, …; the first k
    whose fit is honest ("honest_k"), and the first that also meets the load test's stop rule
    ("rule_k": honest and within the tolerance)."""
    from capplan.design import model_config
    from capplan.sim.sweep import generate_study

    model = load_system(SYNTH["model"])
    out = {"rates": list(rates), "minutes_per_k": len(rates) * SYNTH["duration_s"] / 60.0,
           "honest_k": None, "rule_k": None}
    for k in range(1, kmax + 1):
        cfg = model_config(model, rates=rates, duration_s=SYNTH["duration_s"],
                           warmup_s=0.0, repeats=k, seed=seed)
        with tempfile.TemporaryDirectory(prefix="lt_grid_") as tmp:
            generate_study(cfg, Path(tmp) / "s", workers=1)
            env = fit_envelope(Path(tmp) / "s", SYNTH["slo"], reps=reps, seed=seed)
        _grid_step(out, k, env, tolerance)
        if out["rule_k"]:
            break
    return out


def _grid_step(out: dict, k: int, env, tolerance: float) -> None:
    honest = env.honesty is not None and env.honesty.honest
    if honest and out["honest_k"] is None:
        out.update(honest_k=k, honest_minutes=k * out["minutes_per_k"],
                   honest_lower_bound=env.cslo.lower_bound)
    if Bound.of(env).meets(tolerance):
        out.update(rule_k=k, rule_minutes=k * out["minutes_per_k"],
                   rule_lower_bound=env.cslo.lower_bound, rule_estimate=env.cslo.estimate)


def _grid_tool(tool, url, venv, seed: int, kmax: int, reps: int, work: Path, rates,
               tolerance: float) -> dict:
    """The same fixed grid run with the real tool: k rounds of one run per rate, fitted after
    each (``_grid_synth``'s two answers)."""
    from capplan.loadtest import RunRecord, ToolTarget
    from tests.realtools.loop import workload

    w = workload(prompt_tokens=64, output_tokens=32, tokenizer=str(venv / "tokenizer"),
                 grace_s=10.0)
    t = ToolTarget(tool, url=url, model="mock-llm", workload=w,
                   tokenizer=str(venv / "tokenizer"), path_prefix=(str(venv / "bin"),))
    study = str(work / "study")
    runs = [{"rate_rps": r, "repeats": 1, "duration_s": REAL["duration_s"], "warmup_s": 0.0}
            for r in rates]
    out = {"rates": list(rates), "minutes_per_k": len(rates) * REAL["duration_s"] / 60.0,
           "honest_k": None, "rule_k": None}
    for k in range(1, kmax + 1):
        planned = t.plan(runs, seed_base=1000 * k + 100_000 * seed, out_dir=f"grid/k{k}",
                         study=study)
        recs = [RunRecord(k, i, *p[:5], "grid", p[5]) for i, p in enumerate(planned)]
        for r in recs:
            t.execute(r, str(work))
        t.import_runs(recs, study, str(work))
        _grid_step(out, k, fit_envelope(study, REAL["slo"], reps=reps, seed=seed), tolerance)
        if out["rule_k"]:
            break
    return out


def one(target, spec: Spec, keep: str | None = None) -> dict:
    """One load test; ``keep``: a folder where its record (loadtest.json) is kept as
    seed{N}.json, so a seed's rounds can be read afterwards."""
    with tempfile.TemporaryDirectory(prefix="lt_seed_") as tmp:
        t0 = time.perf_counter()
        try:
            res = run_loadtest(target, spec, Path(tmp) / "lt")
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                (Path(keep) / f"seed{spec.seed}.json").write_text(
                    (Path(tmp) / "lt" / "loadtest.json").read_text())
        except InterruptedLoadtest:
            raise  # Ctrl-C ends the benchmark, not only this seed
        except CapplanError as exc:
            return {"error": exc.format()[:2000], "wall_s": time.perf_counter() - t0}
        runs = _run_rates(res.study, spec.slo)
    f = res.final
    return {"stop": res.stop, "stop_reason": res.stop_reason, "missing": res.missing,
            "honest": res.honest, "minutes": round(res.minutes, 3),
            "requests": res.requests, "rounds": len(res.rounds) - 1, "runs": len(res.runs),
            "estimate": f.estimate if f else math.nan, "lower_bound": f.lower_bound if f else math.nan,
            "ci_low": f.ci_low if f else math.nan, "ci_high": f.ci_high if f else math.nan,
            "gap_rel": f.gap_rel if f else math.nan, "wall_s": res.wall_s, "run_rates": runs}


def _run_rates(study: str, slo: str) -> list[list[float]]:
    """(asked, measured rate, duration, requests) of each run of the final study: how far a
    real client's realised rate lands from the asked one (the position noise the C_SLO
    interval resamples, docs/envelope.md)."""
    env = fit_envelope(study, slo, reps=20, seed=0)
    r = env.runs
    return [[float(a), float(m), float(d), int(n)]
            for a, m, d, n in zip(r["asked_rps"], r["measured_rps"], r["duration_s"], r["n"])]


def fine_rates(coarse, step_rel: float = 0.10) -> tuple[float, ...]:
    """A fixed grid fine enough for the honesty rule's bracket (levels ≤ 10 % apart, so some
    pair brackets any crossing within the coarse range): geometric from the lowest to the
    highest coarse rate, rounded to 3 significant digits."""
    lo, hi = min(coarse), max(coarse)
    n = int(math.ceil(math.log(hi / lo) / math.log1p(step_rel))) + 1
    return tuple(float(f"{lo * (hi / lo) ** (i / (n - 1)):.3g}") for i in range(n))

def summarize(rows: list[dict], truth: float) -> dict:
    ok = [r for r in rows if "error" not in r]
    mean = lambda v: float(sum(v) / len(v)) if v else math.nan  # noqa: E731
    out = {"seeds": len(rows), "errors": len(rows) - len(ok),
           "ends_honest": sum(r["honest"] for r in ok),
           "stops_honest_within_tolerance": sum(r["stop"] == "honest" for r in ok),
           "lower_bound_le_truth": sum(r["lower_bound"] <= truth for r in ok),
           "interval_covers_truth": sum(r["ci_low"] <= truth <= r["ci_high"] for r in ok),
           "mean_minutes": mean([r["minutes"] for r in ok]),
           "mean_wall_min": mean([r["wall_s"] / 60 for r in ok]),
           "mean_lower_bound": mean([r["lower_bound"] for r in ok]),
           "mean_estimate": mean([r["estimate"] for r in ok])}
    for kind in ("coarse", "fine"):
        for rule in ("honest", "rule"):
            g = [r for r in ok if r.get(f"grid_{kind}", {}).get(f"{rule}_k")]
            tried = [r for r in ok if f"grid_{kind}" in r]
            out[f"grid_{kind}_{rule}"] = {
                "seeds_tried": len(tried), "seeds_reached": len(g),
                "mean_grid_minutes": mean([r[f"grid_{kind}"][f"{rule}_minutes"] for r in g]),
                "mean_loop_minutes": mean([r["minutes"] for r in g]),
                "loop_share_mean_of_ratios": mean([r["minutes"] / r[f"grid_{kind}"][f"{rule}_minutes"]
                                                   for r in g]),
                "loop_share_of_total": (sum(r["minutes"] for r in g)
                                        / sum(r[f"grid_{kind}"][f"{rule}_minutes"] for r in g))
                if g else None}
    z = [(m - a) / math.sqrt(a / d) for r in ok for a, m, d, _ in r.get("run_rates", [])
         if a == a and m == m and a > 0 and d > 0]
    rel = [abs(m - a) / a for r in ok for a, m, d, _ in r.get("run_rates", []) if a == a and m == m and a > 0]
    if z:
        zm = mean(z)
        out["rate_scatter"] = {"runs": len(z), "z_mean": zm,
                               "z_sd": math.sqrt(sum((v - zm) ** 2 for v in z) / max(len(z) - 1, 1)),
                               "median_abs_rel": sorted(rel)[len(rel) // 2]}
    return out


def _spec(cfg: dict, a, seed: int) -> Spec:
    return Spec(slo=cfg["slo"], coarse_rates=cfg["rates"], duration_s=cfg["duration_s"],
                budget_minutes=a.budget_minutes or cfg["budget"],
                round_minutes=a.round_minutes or cfg["round"],
                max_rounds=a.max_rounds or cfg["max_rounds"], seed=seed, reps=a.reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("synth", "aiperf", "guidellm"), default="synth")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--grid-seeds", type=int, default=None,
                    help="seeds that also run the fixed grids (default: all for synth, 1 for a tool)")
    ap.add_argument("--grids", default="coarse,fine",
                    help="which fixed grids: coarse (the coarse rates × k), fine (levels ≤ 10 %% "
                         "apart over the coarse range × k)")
    ap.add_argument("--grid-kmax", type=int, default=4)
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="the load test's budget (default: 60 for synth, 20 for a tool)")
    ap.add_argument("--round-minutes", type=float, default=None,
                    help="one design round's budget (default: 20 for synth, 3 for a tool)")
    ap.add_argument("--max-rounds", type=int, default=None)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--truth-runs", type=int, default=300)
    ap.add_argument("--out", default=None)
    ap.add_argument("--suite", action="store_true",
                    help="a tool's settings of the suite's loop test instead (tests/"
                         "test_loop_realtools.py CONFIGS: GuideLLM drives the server 2x faster, "
                         "truth ≈ 8.8 req/s; at most 3 rounds); no fixed grid")
    ap.add_argument("--keep", default=None, help="keep each seed's record here as seed{N}.json")
    a = ap.parse_args(argv)
    grids = [g for g in a.grids.split(",") if g]
    rows = []
    if a.target == "synth":
        truth, se = SYNTH["truth"]
        model = load_system(SYNTH["model"])
        grid_n = a.seeds if a.grid_seeds is None else a.grid_seeds
        for i in range(a.seeds):
            seed = a.first_seed + i
            spec = _spec(SYNTH, a, seed)
            r = one(SynthTarget(model, name="synth_small_sweep", seed=seed), spec, a.keep)
            for g in grids if i < grid_n else ():
                rates = SYNTH["rates"] if g == "coarse" else fine_rates(SYNTH["rates"])
                r[f"grid_{g}"] = _grid_synth(seed, a.grid_kmax, a.reps, rates, spec.tolerance)
            r["seed"] = seed
            rows.append(r)
            print(json.dumps(r), flush=True)
    else:
        from tests.realtools import queue_truth as qt
        from tests.realtools.params import SMALL
        from tests.realtools.queue_server import start_subprocess, stop_subprocess

        venv = Path(os.environ.get("CAPPLAN_PEERS_VENV")
                    or Path.home() / ".cache/capplan/peers/aiperf-0.13.0_guidellm-0.8.1")
        params, real = SMALL.with_(time_scale=0.25), dict(REAL)
        if a.suite:
            from tests.test_loop_realtools import CONFIGS
            params, real["slo"], real["rates"] = CONFIGS[a.target]
            real["max_rounds"] = 3
        kv = dict(x.split("=") for x in real["slo"].split(","))
        slo = qt.SLO(float(kv["ttft_ms"]), float(kv["tpot_ms"]), float(kv["attainment"]))
        _, tr = qt.true_cslo(slo, params=params, duration_s=real["duration_s"],
                             runs=a.truth_runs, horizon_s=600.0, lo_rps=1.0, hi_rps=60.0,
                             tol_rps=0.05)
        truth, se = tr.rate_rps, tr.se_rps
        print(f"truth: {tr.to_text()}", flush=True)
        grid_n = 0 if a.suite else 1 if a.grid_seeds is None else a.grid_seeds
        from capplan.loadtest import ToolTarget
        from tests.realtools.loop import workload

        url, proc = start_subprocess(params, extra_args=("--fixed-prompt-tokens", "64"))
        try:
            for i in range(a.seeds):
                seed = a.first_seed + i
                w = workload(prompt_tokens=64, output_tokens=32,
                             tokenizer=str(venv / "tokenizer"), grace_s=10.0)
                target = ToolTarget(a.target, url=url, model="mock-llm", workload=w,
                                    tokenizer=str(venv / "tokenizer"),
                                    path_prefix=(str(venv / "bin"),))
                spec = _spec(real, a, seed)
                r = one(target, spec, a.keep)
                for g in grids if i < grid_n else ():
                    rates = real["rates"] if g == "coarse" else fine_rates(real["rates"])
                    with tempfile.TemporaryDirectory(prefix="lt_grid_") as tmp:
                        try:
                            r[f"grid_{g}"] = _grid_tool(a.target, url, venv, seed, a.grid_kmax,
                                                        a.reps, Path(tmp), rates, spec.tolerance)
                        except CapplanError as exc:
                            r[f"grid_{g}"] = {"error": exc.format()[:1000]}
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
