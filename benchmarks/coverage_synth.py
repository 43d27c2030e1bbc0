"""Coverage of the C_SLO interval and lower bound against the REAL simulator's truth
(capplan.sim), on several sweep designs, for the default interval ("run-effect") and the
within-run block bootstrap it replaced ("within-run", the OLD method's row).

Designs (``DESIGNS``; SLO ``ttft_ms=2000,tpot_ms=100,attainment=0.99``; no ITL lists, no power):

- ``demo``: the demo protocol — 13 Poisson runs (1…12 req/s), 600 s each, 30-s warm-up,
  2 replicas (the ``demo`` preset before it gained repeats), one run per rate;
- ``gamma``: the same system and protocol with bursty gamma arrivals (CV 2), rates scaled to
  its capacity;
- ``replay``: the same system replaying the public Azure LLM conversation trace time-scaled
  (each run its own stretch of the trace: ``start_row: random``);
- ``kv1``: one replica with a binding KV-cache limit (4 000 blocks);
- ``<design>_rep``: the same with 3 runs at the rates within ±15 % of capacity (repeats near
  capacity, what ``capplan design`` asks for);
- ``designed``: a coarse 6-rate sweep of the demo system (1–11 req/s, 600 s each), then two
  rounds of ``capplan design`` (``capplan.design.propose``) with 35 minutes each: total load-test
  time 130 min, the demo protocol's;
- ``small``: the case of issue 12 — one replica, 300-s runs, rates 0.5, 1, 2, 3, 4, 6 req/s
  (light-load runs with no violations beside overloaded ones; tests/fixtures/
  synth_small_sweep.yaml);
- ``demo``, ``gamma``, ``replay``, ``kv1`` also with the method ``run-effect+twin``: a twin is
  fitted to each sweep's own events (``capplan.twin.fit.fit_twin``) and the between-run SD near
  the crossing taken from 20 simulated runs of it at each bracketing rate
  (``capplan.design.twin_run_effect``), as ``capplan twin fit`` + ``capplan envelope --twin`` do;
- ``aiperf``: the real-client shape — 8 Poisson rates × 40 s against one small-model replica,
  warm-up found by MSER-5 (no manifest warm-up; tests/fixtures/synth_aiperf_shape.yaml); the
  truth is the **steady-state** capacity (600-s runs), what a planner needs, not the 40-s
  protocol's.

Truth (``truth``): pooled attainment of ``--truth-replications`` independent runs
(``capplan.sim.truth.true_attainment``) at 5 rates around a pilot capacity, and the
crossing of a weighted logit-linear fit through them (with its standard error); cached under
benchmarks/_data/ (git-ignored), keyed by the configuration.

Per design and method: two-sided coverage and lower-bound coverage with Clopper–Pearson 95 %
intervals, misses below/above, mean width, mean shortfall (truth − lower bound)/truth, mean
estimate, the share of sweeps whose bound the envelope calls honest and the lower-bound
coverage among them.

    python benchmarks/coverage_synth.py --jobs 2                 # every design, default sizes
    python benchmarks/coverage_synth.py --designs demo --k 300
    python benchmarks/coverage_synth.py --from-json out.json      # re-summarise saved sweeps

Measured results and their discussion: docs/envelope.md, "Coverage".
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SLO_TEXT = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
TRACE = ROOT.parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace2023_conv.csv"
DEMO_RATES = (1.0, 2.0, 3.0, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 8.0, 10.0, 12.0)
#: "run-effect+twin": the run-effect interval with the between-run SD from a twin fitted to the
#: sweep's own events (``capplan twin fit`` then ``capplan envelope --twin``), on the designs
#: with one run per rate (``Design.twin``)
METHODS = ("run-effect", "within-run", "run-effect+twin", "measured-levels", "asked-x")
TWIN = "run-effect+twin"
#: the run-effect interval with each run's level keyed on its *measured* rate, as the importers
#: wrote real clients' runs before levels came from the asked rate (the old rule's row of the
#: short-run designs)
MEASURED_LEVELS = "measured-levels"


def _demo_raw() -> dict:
    """The demo system and protocol as they were before the demo preset gained repeats."""
    from capplan.sim.config import PRESETS

    raw = copy.deepcopy(PRESETS["demo"])
    raw["name"], raw["description"] = "coverage-demo", ""  # the truth cache keys on the model
    raw["power"] = None
    raw["output"] = {"itl": False}
    raw["sweep"] = {"load_model": "open", "rates": list(DEMO_RATES), "duration_s": 600.0,
                    "warmup_s": 30.0}
    return raw


def _fixture(name: str) -> dict:
    """A synth config of the test suite (tests/fixtures), so tests and benchmark share it."""
    import yaml

    return yaml.safe_load((ROOT / "tests" / "fixtures" / name).read_text(encoding="utf-8"))


def _scaled(cap: float) -> list[float]:
    """The demo's rates relative to its capacity (5.65), moved to ``cap``."""
    return [float(f"{r / 5.65 * cap:.2g}") for r in DEMO_RATES]


@dataclass(frozen=True)
class Design:
    name: str
    raw: dict               # synth config (seed set per sweep)
    pilot: float            # pilot capacity (req/s): centre of the truth grid
    repeats_near: int = 1   # runs at the rates within ±15 % of the pilot capacity
    warmup: str = "manifest"
    truth_duration_s: float | None = None  # steady-state truth (None: the protocol's)
    rounds: int = 0         # capplan design rounds
    round_minutes: float = 35.0
    k: int = 100
    twin: bool = False      # also measure the interval with τ from a twin fitted to the sweep
    #: repeats near capacity asked at rates scattered ± this (relative, uniform), as a planner
    #: following two rounds of runs-to-add asks 10.0871 and 10.1189 req/s
    jitter_asked: float = 0.0
    #: the planner's loop: stop the design rounds once the bound is honest
    stop_when_honest: bool = False

    def config(self, seed: int):
        from capplan.sim import parse_config

        raw = copy.deepcopy(self.raw)
        raw["seed"] = int(seed)
        return parse_config(raw)

    def plans(self, cfg):
        from capplan.sim.sweep import RunPlan

        out, i = [], 0
        rng = np.random.default_rng([int(cfg.seed), 77])
        for lv in cfg.rates:
            m = self.repeats_near if abs(lv / self.pilot - 1) <= 0.15 else 1
            for rep in range(m):
                r = float(lv)
                if m > 1 and self.jitter_asked:
                    r = round(r * (1 + rng.uniform(-self.jitter_asked, self.jitter_asked)), 4)
                out.append(RunPlan(i, f"r{i + 1:02d}", r, rep, cfg.run_duration_s(lv)))
                i += 1
        return tuple(out)


def _designs() -> dict[str, Design]:
    demo = _demo_raw()
    gamma = copy.deepcopy(demo)
    gamma["workload"]["arrival"] = {"process": "gamma", "cv": 2.0}
    gamma["sweep"]["rates"] = _scaled(4.68)
    replay = copy.deepcopy(demo)
    replay["workload"]["arrival"] = {"process": "replay", "path": str(TRACE), "format": "azure",
                                     "start_row": "random"}
    replay["sweep"]["rates"] = _scaled(5.0)
    kv1 = copy.deepcopy(demo)
    kv1["system"] = dict(kv1["system"], replicas=1)
    kv1["replica"] = dict(kv1["replica"], kv_blocks=4000)
    kv1["sweep"]["rates"] = _scaled(1.95)
    designed = copy.deepcopy(demo)
    designed["sweep"]["rates"] = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    small = _fixture("synth_small_sweep.yaml")
    aiperf = _fixture("synth_aiperf_shape.yaml")
    short = copy.deepcopy(aiperf)
    short["sweep"]["rates"] = [4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
    short["sweep"]["duration_s"] = 60.0
    d = {
        "demo": Design("demo", demo, 5.65, k=300, twin=True),
        "gamma": Design("gamma", gamma, 4.68, twin=True),
        "replay": Design("replay", replay, 5.0, twin=True),
        "kv1": Design("kv1", kv1, 1.95, twin=True),
        "designed": Design("designed", designed, 5.65, rounds=2),
        "small": Design("small", small, 2.62),
        "aiperf": Design("aiperf", aiperf, 10.0, warmup="mser", truth_duration_s=600.0),
        # the real-client shape of issues 25 and 32: 60-s Poisson runs started idle (200–840
        # requests), light-load runs with no violation, the truth this protocol's
        "short": Design("short", short, 10.5),
        "short_rep": Design("short_rep", short, 10.5, repeats_near=3, jitter_asked=0.01),
        # the loop a planner runs with a real client: the coarse 6-rate sweep, then up to three
        # rounds of capplan design (5 min each, more when the honest set needs it), stopping
        # once the bound is honest
        "short_loop": Design("short_loop", short, 10.5, rounds=3, round_minutes=5.0,
                             stop_when_honest=True),
    }
    for base in ("demo", "gamma", "replay", "kv1"):
        d[f"{base}_rep"] = replace(d[base], name=f"{base}_rep", repeats_near=3, k=100,
                                   twin=False)
    return d


DESIGNS = _designs()
DEFAULT = ("demo", "gamma", "replay", "kv1", "gamma_rep", "replay_rep", "kv1_rep", "designed",
           "small", "aiperf")


# ------------------------------------------------------------------------------ truth

def truth(design: Design, replications: int, refresh: bool = False) -> dict:
    """True capacity: pooled attainment at 5 rates (pilot ± 6 %), crossing of a weighted
    logit-linear fit; cached by the configuration's inputs."""
    from scipy.special import logit

    from capplan.sim.truth import true_attainment

    cfg = design.config(20261129).with_(rates=(design.pilot,))  # the truth ignores the sweep
    grid = [round(design.pilot * f, 4) for f in (0.94, 0.97, 1.0, 1.03, 1.06)]
    key = hashlib.sha256(json.dumps([repr(cfg), SLO_TEXT, replications, grid,
                                     design.truth_duration_s], default=str).encode()
                         ).hexdigest()[:12]
    path = HERE / "_data" / f"coverage_truth_{design.name.split('_')[0]}_{key}.json"
    if path.is_file() and not refresh:
        return json.loads(path.read_text())
    t = time.perf_counter()
    rows = []
    for r in grid:
        w = 60.0 if design.truth_duration_s else None
        a = true_attainment(cfg, r, SLO_TEXT, replications=replications,
                            duration_s=design.truth_duration_s, warmup_s=w)
        rows.append({"rate": r, "attainment": a.attainment, "ci_low": a.ci_low,
                     "ci_high": a.ci_high})
    x = np.array([v["rate"] for v in rows])
    y = logit(np.clip([v["attainment"] for v in rows], 1e-6, 1 - 1e-6))
    se = (logit(np.clip([v["ci_high"] for v in rows], 1e-6, 1 - 1e-6))
          - logit(np.clip([v["ci_low"] for v in rows], 1e-6, 1 - 1e-6))) / 3.92
    w = 1.0 / np.maximum(se, 1e-6) ** 2
    A = np.column_stack([np.ones_like(x), x])
    cov = np.linalg.inv(A.T @ (A * w[:, None]))
    b = cov @ (A.T @ (w * y))
    cap = float((logit(0.99) - b[0]) / b[1])
    g = np.array([-1.0 / b[1], -(logit(0.99) - b[0]) / b[1] ** 2])
    out = {"design": design.name.split("_")[0], "capacity": cap, "se": float(np.sqrt(g @ cov @ g)),
           "rates": rows, "replications": replications, "slo": SLO_TEXT,
           "kind": "steady state" if design.truth_duration_s else "this protocol",
           "seconds": round(time.perf_counter() - t, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


# ------------------------------------------------------------------------------ sweeps

def _fit(stats, design: Design, method: str, reps: int, seed: int, study=None) -> dict:
    from capplan.envelope import fit_from_stats

    if method == TWIN:
        from capplan.design import twin_run_effect
        from capplan.twin.fit import fit_twin

        e = fit_from_stats(stats, SLO_TEXT, reps=reps, seed=seed)
        effect, _ = twin_run_effect(e, fit_twin(study, reps=50, seed=seed), seed=seed)
        if effect is not None:
            e = fit_from_stats(stats, SLO_TEXT, reps=reps, seed=seed, run_effect=effect)
    elif method == "asked-x":  # experiment: each run placed at its asked rate, not its measured
        runs = tuple(replace(r, measured_rps=float(r.load_level)) for r in stats.runs)
        e = fit_from_stats(replace(stats, runs=runs, _cache={}), SLO_TEXT, reps=reps, seed=seed)
    elif method == MEASURED_LEVELS:
        runs = tuple(replace(r, load_level=float(r.measured_rps)) for r in stats.runs)
        e = fit_from_stats(replace(stats, runs=runs, _cache={}), SLO_TEXT, reps=reps, seed=seed)
    else:
        e = fit_from_stats(stats, SLO_TEXT, reps=reps, seed=seed, method=method)
    c = e.cslo
    return {"estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
            "lower_bound": c.lower_bound, "status": c.status,
            "honesty": e.honesty.status if e.honesty else "",
            "tau": None if e.run_effect is None else e.run_effect.tau}


def one_sweep(args) -> dict:
    """Generate sweep ``k`` of a design (with its design rounds), fit it with each method."""
    name, k, seed, reps, fit_seed, methods = args
    from capplan.design import propose
    from capplan.envelope import fit_from_stats
    from capplan.reduce import reduce_study
    from capplan.sim import generate_study
    from capplan.sim.sweep import RunPlan

    design = DESIGNS[name]
    cfg = design.config(seed + k)
    plans = list(design.plans(cfg))
    tmp = Path(tempfile.mkdtemp(prefix="cov_synth_"))
    try:
        out = {"k": k, "rounds": []}
        for rnd in range(design.rounds + 1):
            path, _ = generate_study(cfg, tmp / f"s{rnd}", workers=1, plans=tuple(plans),
                                     overwrite=True)
            stats = reduce_study(path, SLO_TEXT, warmup=design.warmup)
            if rnd == design.rounds:
                break
            env = fit_from_stats(stats, SLO_TEXT, reps=100, seed=fit_seed + k)
            if design.stop_when_honest and env.honesty.honest:
                break
            d = propose(env, budget_minutes=design.round_minutes, sims=2, reps=100,
                        seed=fit_seed + k)
            out["rounds"].append([r.to_dict() for r in d.runs])
            for r in d.runs:
                for rep in range(r.repeats):
                    i = len(plans)
                    plans.append(RunPlan(i, f"r{i + 1:02d}", r.rate_rps, rep, r.duration_s))
        out["minutes"] = round(sum(p.duration_s for p in plans) / 60.0, 2)
        out["runs"] = len(plans)
        for m in methods:
            if m != TWIN or design.twin:
                out[m] = _fit(stats, design, m, reps, fit_seed + k, study=path)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------ summary

def cp(k: int, n: int) -> tuple[float, float]:
    from capplan.bootstrap import clopper_pearson

    return clopper_pearson(k, n, 0.95)


def summarize(results: list[dict], tr: dict) -> dict:
    cap = float(tr["capacity"])
    summ = {"true_capacity": cap, "truth_se": tr.get("se"), "truth_kind": tr.get("kind"),
            "K": len(results),
            "minutes": float(np.mean([r.get("minutes", math.nan) for r in results]))}
    for m in METHODS:
        if not all(m in r for r in results):
            continue
        rows = [r[m] for r in results]
        f = lambda key: np.array([np.nan if x[key] is None else x[key] for x in rows], float)  # noqa: E731
        lo, hi, lb, est = f("ci_low"), f("ci_high"), f("lower_bound"), f("estimate")
        hit = (lo <= cap) & (cap <= hi)
        lb_ok = lb <= cap
        n = len(rows)
        honest = np.array([x["honesty"] == "honest" for x in rows])
        nh = int(honest.sum())
        summ[m] = {
            "coverage_two_sided": float(hit.mean()), "cp_two_sided": cp(int(hit.sum()), n),
            "miss_below": int(np.sum(hi < cap)), "miss_above": int(np.sum(lo > cap)),
            "coverage_lower_bound": float(lb_ok.mean()), "cp_lower_bound": cp(int(lb_ok.sum()), n),
            "mean_width": float(np.nanmean(hi - lo)),
            "mean_shortfall": float(np.nanmean((cap - lb) / cap)),
            "mean_estimate": float(np.nanmean(est)), "sd_estimate": float(np.nanstd(est, ddof=1)),
            "share_honest": nh / n if n else math.nan,
            "coverage_lower_bound_honest": float(lb_ok[honest].mean()) if nh else math.nan,
            "cp_lower_bound_honest": cp(int(lb_ok[honest].sum()), nh) if nh else None,
        }
    return summ


def table(summaries: dict) -> str:
    """Markdown table: one row per design and method."""
    head = ("| design | method | sweeps | load min | truth (req/s) | two-sided (CP 95 %) | miss <, > "
            "| lower bound ≤ truth (CP 95 %) | mean width | mean shortfall | mean est. "
            "| honest | LB cov. among honest |")
    lines = [head, "|" + "---|" * 13]
    for name, s in summaries.items():
        for m in METHODS:
            if m not in s:
                continue
            d = s[m]
            lines.append(
                f"| {name} | {m}{' (old)' if m == 'within-run' else ''} | {s['K']} | "
                f"{s['minutes']:.0f} | {s['true_capacity']:.3f} ± {s['truth_se'] or 0:.3f} | "
                f"{d['coverage_two_sided']:.2f} ({d['cp_two_sided'][0]:.2f}–"
                f"{d['cp_two_sided'][1]:.2f}) | {d['miss_below']}, {d['miss_above']} | "
                f"{d['coverage_lower_bound']:.2f} ({d['cp_lower_bound'][0]:.2f}–"
                f"{d['cp_lower_bound'][1]:.2f}) | {d['mean_width']:.3f} | "
                f"{100 * d['mean_shortfall']:.1f} % | {d['mean_estimate']:.3f} | "
                f"{100 * d['share_honest']:.0f} % | "
                + (f"{d['coverage_lower_bound_honest']:.2f}" if d['coverage_lower_bound_honest']
                   == d['coverage_lower_bound_honest'] else "—") + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--designs", default=",".join(DEFAULT),
                    help="comma-separated: " + ", ".join(DESIGNS))
    ap.add_argument("--k", type=int, default=None, help="sweeps per design (default: per design)")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--methods", default=",".join(m for m in METHODS
                                                  if m not in (MEASURED_LEVELS, "asked-x")),
                    help="comma-separated interval methods to measure: " + ", ".join(METHODS)
                    + f" ({TWIN} only on the designs with one run per rate)")
    ap.add_argument("--seed", type=int, default=5000, help="sweep k uses synth seed SEED + k")
    ap.add_argument("--fit-seed", type=int, default=0, help="sweep k's bootstrap seed = this + k")
    ap.add_argument("--truth-replications", type=int, default=200)
    ap.add_argument("--refresh-truth", action="store_true")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default=None, help="JSON with every sweep and the summaries")
    ap.add_argument("--from-json", default=None, help="re-summarise the sweeps of an earlier --out")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.designs.split(",") if n.strip()]
    methods = tuple(m.strip() for m in a.methods.split(",") if m.strip())
    if any(m not in METHODS for m in methods):
        ap.error(f"unknown method(s) in {methods}; known: {', '.join(METHODS)}")
    bad = [n for n in names if n not in DESIGNS]
    if bad:
        ap.error(f"unknown design(s) {bad}; known: {', '.join(DESIGNS)}")
    if any(DESIGNS[n].raw["workload"].get("arrival", {}).get("process") == "replay"
           for n in names) and not TRACE.is_file():
        print(f"skipping replay designs: {TRACE} not found", file=sys.stderr)
        names = [n for n in names if not n.startswith("replay")]
    t0 = time.perf_counter()
    old = json.loads(Path(a.from_json).read_text()) if a.from_json else None
    summaries, sweeps = {}, {}
    for name in names:
        d = DESIGNS[name]
        t1 = time.perf_counter()
        tr = truth(d, a.truth_replications, a.refresh_truth)
        t2 = time.perf_counter()
        if old is not None:
            results = old["sweeps"][name]
        else:
            k = a.k or d.k
            jobs = [(name, i, a.seed, a.reps, a.fit_seed, methods) for i in range(k)]
            if a.jobs > 1:
                from concurrent.futures import ProcessPoolExecutor

                with ProcessPoolExecutor(a.jobs) as ex:
                    results = list(ex.map(one_sweep, jobs))
            else:
                results = [one_sweep(j) for j in jobs]
        s = summarize(results, tr)
        s["seconds"] = round(time.perf_counter() - t2, 1)
        s["truth_seconds"] = round(t2 - t1, 1)
        summaries[name], sweeps[name] = s, results
        print(f"{name}: truth {tr['capacity']:.4f} ± {tr['se']:.4f} req/s ({tr['kind']}, "
              f"{tr['replications']} runs per rate) [{s['truth_seconds']:.0f} s]; {s['K']} sweeps "
              f"[{s['seconds']:.0f} s]", flush=True)
        for m in METHODS:
            if m not in s:
                continue
            x = s[m]
            print(f"  {m:11s} two-sided {x['coverage_two_sided']:.3f} lower bound "
                  f"{x['coverage_lower_bound']:.3f} [{x['cp_lower_bound'][0]:.3f}, "
                  f"{x['cp_lower_bound'][1]:.3f}] width {x['mean_width']:.3f} shortfall "
                  f"{100 * x['mean_shortfall']:.1f} % honest {100 * x['share_honest']:.0f} %",
                  flush=True)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s, {a.jobs} processes; load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print(table(summaries))
    if a.out:
        Path(a.out).write_text(json.dumps({"summaries": summaries, "sweeps": sweeps}, indent=1,
                                          default=lambda v: None if v != v else v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
