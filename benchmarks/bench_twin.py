"""Benchmark the twin (issue 11): speed, recovery on synthetic studies, fidelity on client data.

  speed     fit on the demo study (target ≤ 10 s) and check with 20 replays per run (≤ 60 s
            on 2 cores), each in a fresh child process, beside `capplan summarize` of the same
            study as the baseline (ratios), with the load average.
  recovery  for configurations that differ from the demo (prefill ×0.5 and ×2 speed, another
            decode curve, 1 and 4 replicas, a KV cache that binds): simulate a sweep with
            capplan synth, fit a twin to it, and compare the fitted prefill ms/token and decode
            step at batch 1 and 32 with the generating values (target within 10 %), and the
            twin's steady-state C_SLO with ``true_capacity`` of the generating configuration
            under the same steady protocol (4 pooled Poisson runs of max(1800 s, 12,000 requests),
            the first sixth left out; target within 5 %).
  fidelity  the real-client fixtures (GuideLLM, AIPerf, inference-perf against the mock server):
            fit, check, and the same check of a twin whose decode is 30 % slower.

    python benchmarks/bench_twin.py speed
    python benchmarks/bench_twin.py recovery [--configs prefill-slow,...] [--replications 4]
    python benchmarks/bench_twin.py fidelity

Results are printed as markdown tables and saved under benchmarks/_data/ (git-ignored).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "_data"
SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
DEMO_TABLE = {1: 29.4062, 2: 29.9921, 4: 29.9841, 8: 31.4136, 16: 32.8364, 32: 36.918, 64: 51.9867}

#: name → (what it changes, patch applied to the demo preset)
CONFIGS: dict[str, tuple[str, dict]] = {
    "prefill-slow": ("prefill speed ×0.5 (0.2111 ms/token)",
                     {"replica": {"service_model": {"decode_step_ms": DEMO_TABLE, "prefill_ms_per_token": 0.211126}}}),
    "prefill-fast": ("prefill speed ×2 (0.0528 ms/token) + 2 ms overhead per prefill iteration",
                     {"replica": {"service_model": {"decode_step_ms": DEMO_TABLE, "prefill_ms_per_token": 0.052782,
                                                    "prefill_overhead_ms": 2.0}}}),
    "decode-curve": ("another decode curve (20 ms at 1 → 72 ms at 128), 5 ms overhead, 1 replica",
                     {"system": {"replicas": 1},
                      "replica": {"service_model": {"decode_step_ms": {1: 20.0, 16: 24.0, 64: 40.0, 128: 72.0},
                                                    "prefill_ms_per_token": 0.105563, "prefill_overhead_ms": 5.0}}}),
    "replicas-1": ("1 replica (demo service model)", {"system": {"replicas": 1}}),
    "replicas-4": ("4 replicas (demo service model)", {"system": {"replicas": 4}}),
    "kv-binds": ("KV cache of 2,500 blocks (40 k tokens) per replica: admission waits for memory",
                 {"replica": {"kv_blocks": 2500}}),
}


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _config(name: str):
    from capplan.sim.config import PRESETS, parse_config

    raw = copy.deepcopy(PRESETS["demo"])  # (a JSON round trip made sweep.repeats' rate keys text)
    for k, v in CONFIGS[name][1].items():
        raw[k] = {**raw.get(k, {}), **v}
    raw["name"] = f"twin-recovery-{name}"
    raw["power"] = None
    return parse_config(raw)


# ------------------------------------------------------------------------------------- speed

def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (user + system)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _child_speed(kind: str, twin_path: str) -> dict:
    t = time.perf_counter()
    c0 = _cpu_s()
    if kind == "summarize":
        from capplan import open_study
        from capplan.metrics import summarize

        summarize(open_study(ROOT / "data/sample"), SLO)
    elif kind == "fit":
        from capplan.twin import fit_twin, write_twin

        write_twin(fit_twin(ROOT / "data/sample"), twin_path)
    elif kind == "check":
        from capplan.twin import check_twin, load_twin

        c = check_twin(load_twin(twin_path), ROOT / "data/sample", SLO, replays=20, workers=2)
        return {"kind": kind, "wall_s": time.perf_counter() - t, "cpu_s": _cpu_s() - c0, "verdict": c.verdict,
                "cslo": c.cslo}
    return {"kind": kind, "wall_s": time.perf_counter() - t, "cpu_s": _cpu_s() - c0}


def speed(args) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    twin_path = str(DATA / "demo.twin.yaml")
    rows = []
    load0 = _load()
    for kind in ("summarize", "fit", "check"):
        out = subprocess.run([sys.executable, __file__, "_child", kind, twin_path], capture_output=True, text=True,
                             cwd=ROOT, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["wall_s"]
    print(f"load average before / after: {load0} / {_load()} (1/5/15 min), {os.cpu_count()} cores\n")
    print("| step | wall s | CPU s (all processes) | vs summarize | target |")
    print("|---|---|---|---|---|")
    targets = {"summarize": "baseline", "fit": "≤ 10 s", "check": "≤ 60 s (20 replays per run, 2 workers)"}
    for r in rows:
        print(f"| {r['kind']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['wall_s'] / base:.1f}× | "
              f"{targets[r['kind']]} |")
    chk = rows[2]
    print(f"\ncheck verdict on the demo: {chk['verdict']}; C_SLO measured {chk['cslo']['measured']['estimate']}, "
          f"twin replaying the runs {chk['cslo']['replay']['estimate']}, twin steady state "
          f"{chk['cslo']['twin']['estimate']:.3f} [{chk['cslo']['twin']['ci_low']:.3f}, "
          f"{chk['cslo']['twin']['ci_high']:.3f}]")
    (DATA / "twin_speed.json").write_text(json.dumps({"load": load0, "rows": rows}, indent=2))


# ------------------------------------------------------------------------------------- recovery

def _truth(cfg, guess: float, replications: int, duration_s: float = 1800.0, warmup_s: float = 300.0):
    from capplan.errors import SpecError
    from capplan.sim.truth import true_capacity

    lo, hi = 0.6 * guess, 1.5 * guess
    for _ in range(6):
        try:
            return true_capacity(cfg, SLO, lo, hi, tol_rps=0.005 * guess, replications=replications,
                                 duration_s=duration_s, warmup_s=warmup_s)
        except SpecError as exc:
            if "low end" in str(exc):
                lo /= 1.5
            else:
                hi *= 1.5
    raise RuntimeError("no bracket found")


def recovery(args) -> None:
    from capplan.sim.sweep import generate_study
    from capplan.twin import fit_twin, steady_cslo

    names = args.configs.split(",") if args.configs else list(CONFIGS)
    DATA.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"load average at start: {_load()}")
    for name in names:
        cfg = _config(name)
        sm = cfg.replica.service
        t0 = time.perf_counter()
        # a coarse capacity (one long run per rate, another seed) to place the sweep's rates
        guess = 5.65 * cfg.replicas / 2
        coarse = _truth(cfg.with_(seed=cfg.seed + 1), guess, 1)
        c0 = coarse.capacity_rps
        rates = [round(c0 * f, 3) for f in (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)]
        sweep = cfg.with_(rates=tuple(rates), duration_s=300.0, warmup_s=30.0)
        with tempfile.TemporaryDirectory(prefix="twin-rec-") as tmp:
            study, _ = generate_study(sweep, Path(tmp) / "study", workers=2)
            t1 = time.perf_counter()
            tw = fit_twin(study, seed=0)
            t_fit = time.perf_counter() - t1
        dur = max(1800.0, 12_000 / c0)  # the twin's steady protocol at this rate (capplan.twin.capacity)
        # the twin's runs use the streams true_capacity uses at the generating seed (common random
        # numbers: the same arrivals and length draws; only the fitted model differs)
        st = steady_cslo(tw, SLO, start=c0, seed=cfg.seed, runs=args.replications, workers=2, duration_s=dur,
                         warmup_s=dur / 6)
        truth = _truth(cfg, c0, args.replications, dur, dur / 6)
        gen = {"prefill_ms_per_token": sm.prefill_ms_per_token, "prefill_overhead_ms": sm.prefill_overhead_ms,
               "decode_1": float(sm.step_ms(1)), "decode_32": float(sm.step_ms(32)),
               "token_budget": cfg.replica.token_budget, "max_batch": cfg.replica.max_batch,
               "kv_tokens": (cfg.replica.kv_blocks - int(cfg.replica.kv_watermark * cfg.replica.kv_blocks))
               * cfg.replica.block_size, "queue_limit": cfg.replica.queue_limit}
        fit = {"prefill_ms_per_token": float(tw.value("prefill_ms_per_token")),
               "prefill_overhead_ms": float(tw.value("prefill_overhead_ms")),
               "decode_1": float(tw.service.step_ms(1)), "decode_32": float(tw.service.step_ms(32)),
               "token_budget": tw.value("token_budget"), "max_batch": tw.value("max_batch"),
               "kv_tokens": tw.value("kv_capacity_tokens"), "kv_source": tw.param("kv_capacity_tokens").source,
               "max_batch_source": tw.param("max_batch").source, "queue_limit": tw.value("queue_limit")}
        err = {k: fit[k] / gen[k] - 1.0 for k in ("prefill_ms_per_token", "decode_1", "decode_32")}
        row = {"config": name, "what": CONFIGS[name][0], "rates": rates, "generating": gen, "fitted": fit,
               "errors": err, "cslo_twin": st.estimate, "cslo_twin_ci": [st.ci_low, st.ci_high],
               "cslo_true": truth.capacity_rps, "cslo_true_bracket": list(truth.bracket),
               "cslo_error": st.estimate / truth.capacity_rps - 1.0, "fit_s": t_fit,
               "total_s": time.perf_counter() - t0, "load": _load(), "notes": list(tw.notes)}
        results.append(row)
        print(json.dumps({k: row[k] for k in ("config", "errors", "cslo_twin", "cslo_true", "cslo_error", "fit_s",
                                              "total_s", "load")}), flush=True)
        (DATA / "twin_recovery.json").write_text(json.dumps(results, indent=2, default=float))
    print()
    print("| configuration | prefill ms/token gen → fit | decode@1 ms gen → fit | decode@32 ms gen → fit | "
          "twin steady C_SLO [95 %] | true steady C_SLO | C_SLO error |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        g, f, e = r["generating"], r["fitted"], r["errors"]
        print(f"| {r['config']}: {r['what']} | {g['prefill_ms_per_token']:.4f} → {f['prefill_ms_per_token']:.4f} "
              f"({e['prefill_ms_per_token']:+.1%}) | {g['decode_1']:.2f} → {f['decode_1']:.2f} ({e['decode_1']:+.1%}) | "
              f"{g['decode_32']:.2f} → {f['decode_32']:.2f} ({e['decode_32']:+.1%}) | {r['cslo_twin']:.3f} "
              f"[{r['cslo_twin_ci'][0]:.3f}, {r['cslo_twin_ci'][1]:.3f}] | {r['cslo_true']:.3f} | "
              f"{r['cslo_error']:+.1%} |")
    print()
    print("| configuration | overhead ms gen → fit | token budget | max batch | KV tokens gen → fit (source) | "
          "queue limit | fit s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        g, f = r["generating"], r["fitted"]
        print(f"| {r['config']} | {g['prefill_overhead_ms']:.2f} → {f['prefill_overhead_ms']:.2f} | "
              f"{g['token_budget']} → {f['token_budget']} | {g['max_batch']} → {f['max_batch']} ({f['max_batch_source']}) | "
              f"{g['kv_tokens']:,} → {f['kv_tokens']:,} ({f['kv_source']}) | {g['queue_limit']} → {f['queue_limit']} | "
              f"{r['fit_s']:.1f} |")


# ------------------------------------------------------------------------------------- fidelity

FIXTURES = {
    "guidellm": ["tests/fixtures/guidellm/poisson_v2.json.gz"],
    "aiperf": ["tests/fixtures/aiperf/artifacts"],
    "inference-perf": ["tests/fixtures/inference_perf"],
}
FIDELITY_SLO = "ttft_ms=2000,tpot_ms=80,attainment=0.9"


def fidelity(args) -> None:
    from capplan.importers import import_paths, write_import
    from capplan.twin import check_twin, fit_twin

    rows = []
    with tempfile.TemporaryDirectory(prefix="twin-fid-") as tmp:
        for tool, paths in FIXTURES.items():
            study = write_import(import_paths(tool, [str(ROOT / p) for p in paths]), Path(tmp) / tool)
            tw = fit_twin(study)
            for label, t in (("fitted", tw), ("decode 30 % slower", tw.scaled(decode=1.3))):
                c = check_twin(t, study, FIDELITY_SLO, replays=20, steady=False)
                m = c.metrics.set_index("metric")
                rows.append({"tool": tool, "twin": label, "verdict": c.verdict, "where": list(c.where),
                             "runs": int(len(c.runs)), "mode": tw.value("prefill_mode"),
                             "decode_1_ms": float(tw.service.step_ms(1)),
                             "outside": {k: int(v) for k, v in m["outside"].items()}})
    print(f"SLO {FIDELITY_SLO}; 20 replays per run\n")
    print("| fixture | twin | runs | verdict | where (metrics with more runs outside than chance) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tool']} | {r['twin']} | {r['runs']} | {r['verdict']} | "
              f"{'; '.join(w.split(':')[0] for w in r['where']) or '—'} |")
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "twin_fidelity.json").write_text(json.dumps(rows, indent=2))


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "_child":
        print(json.dumps(_child_speed(sys.argv[2], sys.argv[3]), default=float))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("speed")
    r = sub.add_parser("recovery")
    r.add_argument("--configs", default=None, help="comma-separated subset of " + ", ".join(CONFIGS))
    r.add_argument("--replications", type=int, default=4, help="runs per rate for the true capacity")
    sub.add_parser("fidelity")
    args = ap.parse_args()
    {"speed": speed, "recovery": recovery, "fidelity": fidelity}[args.what](args)


if __name__ == "__main__":
    main()
