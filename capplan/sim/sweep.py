"""Simulate the runs of a sweep and write them as a study directory (atomically).

Each run gets its own seed, derived from (config seed, run index), so runs are independent and
can be simulated in parallel processes without changing a single byte of the output.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import multiprocessing as mp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from .. import contract as C
from ..errors import SpecError
from ..io import atomic_dir, check_out, events_table, manifest_dict
from . import arrivals as A
from .config import SynthConfig
from .control import Control
from .engine import ClosedLoop, SimResult, simulate
from .events import events_arrow, power_arrow, timeline_arrow

# Pinned writer options: same table ⇒ same bytes (no timestamps are written by parquet-cpp).
PARQUET_OPTIONS = dict(compression="zstd", compression_level=3, row_group_size=1 << 17,
                       use_dictionary=True, write_statistics=True, data_page_version="1.0",
                       version="2.6")


def write_parquet(table: pa.Table, path: str | os.PathLike) -> None:
    pq.write_table(table, str(path), **PARQUET_OPTIONS)


@dataclass(frozen=True)
class RunPlan:
    index: int  # position in the sweep (seed stream)
    run_id: str
    level: float  # offered_rps (open) or concurrency (closed)
    repeat: int
    duration_s: float


def plan_runs(cfg: SynthConfig) -> tuple[RunPlan, ...]:
    levels = cfg.rates if cfg.load_model == "open" else cfg.concurrency
    out, i = [], 0
    for lv in levels:
        for rep in range(cfg.repeats_for(lv)):
            rid = f"r{i + 1:02d}"
            out.append(RunPlan(i, rid, float(lv), rep, cfg.run_duration_s(lv)))
            i += 1
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _trace(path: str, fmt: str) -> A.Trace:
    return A.load_trace(path, fmt)


def _lengths_for(cfg: SynthConfig, tenant_idx: np.ndarray, rng: np.random.Generator):
    n = len(tenant_idx)
    inp, out = cfg.lengths.sample(n, rng)
    for j, t in enumerate(cfg.tenants):
        if t.lengths is not None:
            m = tenant_idx == j
            a, b = t.lengths.sample(int(m.sum()), rng)
            inp[m], out[m] = a, b
    return inp, out


def _tenants_for(cfg: SynthConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    if not cfg.tenants:
        return np.zeros(n, np.int64)
    p = np.asarray([t.share for t in cfg.tenants], float)
    return rng.choice(len(p), size=n, p=p / p.sum()).astype(np.int64)


def simulate_level(cfg: SynthConfig, level: float, *, duration_s: float | None = None,
                   seed_key: tuple[int, ...] = (0,), progress=None) -> SimResult:
    """Simulate one run at an offered rate (open) or concurrency (closed). The random streams
    come from SeedSequence([cfg.seed, *seed_key])."""
    ss = np.random.SeedSequence([int(cfg.seed), *[int(k) for k in seed_key]])
    r_arr, r_len, r_ten = (np.random.default_rng(s) for s in ss.spawn(3))
    dur = float(duration_s if duration_s is not None else cfg.run_duration_s(level))
    end_s = dur + cfg.drain
    common = dict(n_replicas=cfg.replicas, params=cfg.replica, timeout_s=cfg.timeout_s, end_s=end_s,
                  progress=progress)
    if cfg.control is not None:  # a fresh controller per run (it keeps state)
        common["control"] = Control(cfg.control)
    if cfg.load_model == "closed":
        def draw(n):
            ten = _tenants_for(cfg, n, r_ten)
            a, b = _lengths_for(cfg, ten, r_len)
            return a, b, ten
        return simulate(closed=ClosedLoop(int(level), dur, cfg.think_s, cfg.backoff_s, cfg.ramp_s),
                        draw=draw, **common)
    rows = passes = None
    if cfg.arrival.process == "replay":
        tr = _trace(cfg.arrival.path, cfg.arrival.format)
        row = cfg.arrival.start_row
        if row == "random":  # each run its own stretch: independent workload samples
            row = int(r_arr.integers(tr.n))
        sched, rows, passes = A.replay_rows(tr, level, dur, row)
        inp, out = tr.input_tokens[rows].copy(), np.maximum(tr.output_tokens[rows], 1)
        ten = _tenants_for(cfg, len(sched), r_ten)
    else:
        if cfg.demand is not None:  # a rate that changes during the run (the level is its scale)
            proc = cfg.arrival.process if cfg.arrival.process in ("constant", "gamma") else "poisson"
            sched = cfg.demand.arrivals_ns(dur, r_arr, process=proc, cv=cfg.arrival.cv)
        else:
            sched = A.arrival_times_ns(cfg.arrival.process, level, dur, r_arr, cfg.arrival.cv)
        ten = _tenants_for(cfg, len(sched), r_ten)
        inp, out = _lengths_for(cfg, ten, r_len)
    fault = None
    if cfg.faults is not None and cfg.faults.any:  # its own stream: the others stay as they were
        u = np.random.default_rng(ss.spawn(1)[0]).random(len(sched))
        fault = np.where(u < cfg.faults.error_share, 1,
                         np.where(u < cfg.faults.error_share + cfg.faults.stall_share, 2, 0)).astype(np.int64)
    scale = None
    if cfg.replica.prefill == "separate" and cfg.replica.prefill_jitter_cv > 0:
        scale = lognormal_factors(np.random.default_rng(ss.spawn(1)[0]), len(sched), cfg.replica.prefill_jitter_cv)
    hooks, px = serving_hooks(cfg, ss, sched, inp, out, ten, rows, passes)
    if cfg.disagg is not None:
        from .disagg import simulate_disagg

        res = simulate_disagg(cfg.disagg, sched_ns=sched, input_tokens=hooks.pop("input_tokens", inp),
                              output_tokens=out, tenant=ten, timeout_s=cfg.timeout_s, end_s=end_s, fault=fault,
                              progress=progress, **hooks)
    else:
        res = simulate(sched_ns=sched, input_tokens=hooks.pop("input_tokens", inp), output_tokens=out, tenant=ten,
                       fault=fault, prefill_scale=scale, **hooks, **common)
    res.prefixes = px
    return res


def serving_hooks(cfg: SynthConfig, ss: np.random.SeedSequence, sched, inp, out, ten, rows=None, passes=None):
    """The engine's serving-policy hooks for one run (docs/scenarios.md): the prefixes of the
    prompts (their own random stream, so the other draws stay as they were; the prompts grow by
    their shared prefixes), the prefix cache and the scheduling / admission policy. Returns
    (keyword arguments of ``simulate``, the run's Prefixes or None); nothing when the config
    has none of them."""
    from . import prefix as P
    from .policy import Policy

    kw: dict = {}
    px = None
    n_rep, rp = cfg.replicas, cfg.replica
    if cfg.disagg is not None:  # the hooks act on the prefill pool
        n_rep, rp = cfg.disagg.prefill.replicas, cfg.disagg.prefill.params
    if cfg.prefixes is not None and cfg.prefixes.kind != "trace":
        new_inp, px = P.generate(cfg.prefixes, inp, out, np.random.default_rng(ss.spawn(1)[0]))
        kw["input_tokens"] = inp = new_inp
    elif cfg.prefixes is not None or (cfg.prefix_cache is not None and rows is not None):
        tr = _trace(cfg.arrival.path, cfg.arrival.format) if rows is not None else None
        if tr is None or tr.hash_ids is None:
            raise SpecError("trace prefixes need a replayed Mooncake trace with hash_ids",
                            field="workload.prefixes.kind",
                            fix="workload.arrival: {process: replay, path: <mooncake JSONL>} or another prefix kind")
        px = P.from_hash_ids(tr.hash_ids, rows, passes, inp)
    if cfg.prefix_cache is not None:
        if px is None:  # a cache but no shared prefixes: every lookup misses
            n = len(sched)
            px = P.Prefixes(np.zeros(n + 1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                            np.full(n, -1, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64),
                            np.full(n, -1, np.int64))
        kw["prefix"] = P.PrefixCache(cfg.prefix_cache, px, rp.block_size, n_rep)
    if cfg.policy is not None and cfg.policy.active:
        sm = rp.service
        table = sm.step_table_ns(rp.max_batch + 1)
        kp_ns, over_ns = sm.prefill_ms_per_token * 1e6, sm.prefill_overhead_ms * 1e6
        kw["policy"] = Policy(cfg.policy, tenants=tuple(t.name for t in cfg.tenants),
                              classes=tuple(t.slo_class for t in cfg.tenants),
                              ten=np.asarray(ten).tolist(), sched=np.asarray(sched).tolist(),
                              inp=np.asarray(inp).tolist(),
                              step_ns=lambda b: int(table[min(b, len(table) - 1)]),
                              prefill_ns=lambda n: kp_ns * n + over_ns, n_replicas=n_rep)
    return kw, px


def lognormal_factors(rng: np.random.Generator, n: int, cv: float) -> np.ndarray:
    """n lognormal factors with mean 1 and coefficient of variation ``cv``."""
    s2 = np.log1p(cv * cv)
    return np.exp(rng.normal(-0.5 * s2, np.sqrt(s2), n))


def run_tables(cfg: SynthConfig, plan: RunPlan, progress=None) -> tuple[pa.Table, pa.Table | None, dict]:
    """Simulate one run of the sweep → (events, power or None, stats)."""
    res = simulate_level(cfg, plan.level, duration_s=plan.duration_s, seed_key=(plan.index,), progress=progress)
    names = tuple(t.name for t in cfg.tenants)
    classes = tuple(t.slo_class for t in cfg.tenants)
    ev = events_table(events_arrow(res, plan.run_id, tenants=names, slo_classes=classes, with_itl=cfg.itl,
                                   prefixes=res.prefixes))
    pw = None
    if cfg.power is not None and cfg.disagg is None:  # (the power model is per colocated replica)
        last_busy = max((int((t0[-1] + k[-1] * s[-1])) for t0, k, s in zip(res.seg_t0, res.seg_k, res.seg_step)
                         if len(t0)), default=0)
        horizon = max(plan.duration_s, last_busy / C.NS_PER_S)
        pw = power_arrow(res, plan.run_id, gpus_per_replica=int(cfg.system["gpus_per_replica"]),
                         idle_w=cfg.power.idle_w, busy_w=cfg.power.busy_w, horizon_s=horizon,
                         token_budget=cfg.replica.token_budget)
    stats = dict(res.stats)
    if cfg.control is not None or res.timeline:  # fleet changes, prefix-cache flushes
        stats["timeline"] = timeline_arrow(res, plan.run_id)
    counts = np.bincount(res.status, minlength=6)
    stats.update(run_id=plan.run_id, level=plan.level, ok=int(counts[0]), rejected=int(counts[1]),
                 timeout=int(counts[2]), error=int(counts[3]), cancelled=int(counts[4]))
    return ev, pw, stats


def _worker(args):
    cfg, plan, events_path = args
    ev, pw, stats = run_tables(cfg, plan)
    write_parquet(ev, events_path)
    return plan.index, pw, stats


def manifest_for(cfg: SynthConfig, plans: tuple[RunPlan, ...], extra: dict | None = None) -> dict:
    runs = []
    for p in plans:
        r = {"run_id": p.run_id}
        if cfg.load_model == "open":
            r["offered_rps"] = float(p.level)
            r["arrival"] = cfg.arrival.process
        else:
            r["concurrency"] = int(p.level)
            r["arrival"] = "concurrency"
        r["duration_s"] = round(float(p.duration_s), 6)
        r["warmup_s"] = float(cfg.warmup_s)
        r["repeat"] = int(p.repeat)
        runs.append(r)
    sm = cfg.replica.service
    workload = {
        "generator": "capplan synth",
        "seed": int(cfg.seed),
        "arrival": {k: v for k, v in vars(cfg.arrival).items() if v is not None},
        "lengths": cfg.lengths.to_dict(),
        "tenants": [{"name": t.name, "share": t.share, "slo_class": t.slo_class,
                     **({"lengths": t.lengths.to_dict()} if t.lengths else {})} for t in cfg.tenants],
        "replica": {"max_batch": cfg.replica.max_batch, "token_budget": cfg.replica.token_budget,
                    "kv_blocks": cfg.replica.kv_blocks, "block_size": cfg.replica.block_size,
                    "kv_watermark": cfg.replica.kv_watermark, "max_model_len": cfg.replica.max_model_len,
                    "queue_limit": cfg.replica.queue_limit, "router": "least outstanding work (tokens)",
                    "preemption": "recompute",
                    **({"prefill": cfg.replica.prefill, "prefill_lanes": cfg.replica.prefill_lanes,
                        "prefill_jitter_cv": cfg.replica.prefill_jitter_cv}
                       if cfg.replica.prefill != "mixed" else {})},
        "service_model": sm.to_dict(),
        "client": {"timeout_s": cfg.timeout_s, "drain_s": cfg.drain, "think_s": cfg.think_s,
                   "backoff_s": cfg.backoff_s},
        "power": None if cfg.power is None else {"idle_w": cfg.power.idle_w, "busy_w": cfg.power.busy_w},
        "itl": cfg.itl,
    }
    if cfg.faults is not None and cfg.faults.any:
        workload["faults"] = {"error_share": cfg.faults.error_share, "stall_share": cfg.faults.stall_share}
    workload.update(serving_manifest(cfg))
    if cfg.prefix_cache is not None and cfg.prefix_cache.router == "prefix_affinity":
        workload["replica"]["router"] = "prefix affinity (least outstanding work within a slack)"
    return manifest_dict(cfg.name, runs, system=dict(cfg.system), workload=workload, load_model=cfg.load_model,
                         **(extra or {}))


def serving_manifest(cfg: SynthConfig) -> dict:
    """The serving policies of ``cfg`` as study.yaml's workload records them (empty without)."""
    from dataclasses import asdict

    from .policy import describe_policy
    from .prefix import describe_cache

    out: dict = {}
    if cfg.prefixes is not None:
        out["prefixes"] = asdict(cfg.prefixes)
    if cfg.prefix_cache is not None:
        out["prefix_cache"] = describe_cache(cfg.prefix_cache)
    if cfg.policy is not None and cfg.policy.active:
        out["policy"] = describe_policy(cfg.policy)
    if cfg.disagg is not None:
        from .disagg import describe_disagg

        out["disaggregation"] = describe_disagg(cfg.disagg)
    return out


def readme_text(cfg: SynthConfig, plans: tuple[RunPlan, ...], stats: list[dict]) -> str:
    """A README for the generated study: what it is, how to regenerate it, per-run outcomes."""
    from .config import PRESETS

    name_preset = next((k for k, v in PRESETS.items() if v.get("name") == cfg.name), None)
    how = (f"capplan synth --preset {name_preset} --out <dir>" + (f" --seed {cfg.seed}" if name_preset and
           cfg.seed != PRESETS[name_preset].get("seed") else "")) if name_preset else \
        "capplan synth --config <the config> --out <dir>"
    lines = [f"# {cfg.name}", "", "Generated by `capplan synth` — do not edit by hand; regenerate with", "",
             f"    {how}", "", "(same parameters and seed ⇒ byte-identical files). Model and parameters: docs/synth.md.", ""]
    if cfg.description:
        lines += [cfg.description, ""]
    sysd = cfg.system
    lines += [f"System: {sysd['replicas']} × {sysd['model']} on {sysd['gpus_per_replica']} × {sysd['gpu']} "
              f"(TP{sysd['tp']}, PP{sysd['pp']}); max batch {cfg.replica.max_batch}, token budget "
              f"{cfg.replica.token_budget}, KV {cfg.replica.kv_blocks} blocks × {cfg.replica.block_size}; "
              f"client timeout {cfg.timeout_s:g} s, drain {cfg.drain:g} s.", "",
              "| run | level | requests | ok | timeout | rejected | error | cancelled | preemptions |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in stats:
        lines.append(f"| {s['run_id']} | {s['level']:g} | {s['requests']} | {s['ok']} | {s['timeout']} | "
                     f"{s['rejected']} | {s['error']} | {s['cancelled']} | {s['preemptions']} |")
    retried = [s for s in stats if s.get("retries_sent")]
    if retried:  # client retries (docs/timeline.md "Client retries")
        lines += ["", "Client retries: " + "; ".join(
            f"{s['run_id']} {s['retries_sent']:,} retries, ×{s['retry_amplification']:.4f} attempts per "
            "request" for s in retried) + " (retry amplification = attempts / original requests)."]
    lines += ["", "Unfinished requests at the end of a run (duration + drain) are kept: status `timeout` "
              "when their client deadline had passed, else `cancelled`, with the tokens received so far.", ""]
    return "\n".join(lines)


def _check_destination(dest: Path) -> None:
    """The study directory is replaced as a whole: ``io.check_out`` (an old study, or an empty
    folder, may stand where it goes)."""
    check_out(dest, C.MANIFEST_NAME, "study")


def generate_study(cfg: SynthConfig, out: str | os.PathLike, *, workers: int | None = None,
                   progress: bool = False, overwrite: bool = True,
                   plans: tuple[RunPlan, ...] | None = None, manifest_extra: dict | None = None,
                   readme_extra: str = "") -> tuple[Path, list[dict]]:
    """Simulate every run of ``cfg`` (or the given ``plans``) and write the study directory at
    ``out`` atomically (events/<run_id>.parquet, resources/power.parquet, study.yaml).
    ``manifest_extra`` adds top-level keys to study.yaml (e.g. the twin and scenario a twin
    run came from) and ``readme_extra`` a paragraph to README.md. Returns (path, per-run stats)."""
    plans = plan_runs(cfg) if plans is None else tuple(plans)
    _check_destination(Path(out))
    workers = max(1, min(int(workers or min(2, os.cpu_count() or 1)), len(plans)))
    bar = None
    if progress:
        from tqdm import tqdm

        total = sum(p.level * p.duration_s for p in plans) if cfg.load_model == "open" else None
        bar = tqdm(total=int(total) if total else None, unit="req", desc=f"synth {cfg.name}",
                   file=__import__("sys").stderr, dynamic_ncols=True)
    powers: dict[int, pa.Table] = {}
    stats: dict[int, dict] = {}
    try:
        with atomic_dir(out, overwrite=overwrite) as tmp:
            (tmp / C.EVENTS_DIR).mkdir()
            jobs = [(cfg, p, tmp / C.EVENTS_DIR / f"{p.run_id}.parquet") for p in plans]
            if workers == 1:
                for cfg_, p, path in jobs:
                    cb = bar.update if bar is not None else None
                    ev, pw, st = run_tables(cfg_, p, progress=cb)
                    write_parquet(ev, path)
                    powers[p.index], stats[p.index] = pw, st
                    if bar is not None and cfg.load_model != "open":
                        bar.update(st["requests"])
            else:
                with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
                    for idx, pw, st in ex.map(_worker, jobs):
                        powers[idx], stats[idx] = pw, st
                        if bar is not None:
                            bar.update(st["requests"])
            timelines = [stats[p.index].pop("timeline", None) for p in plans]
            if any(t is not None for t in timelines):
                (tmp / C.TIMELINE_DIR).mkdir()
                for p, t in zip(plans, timelines):
                    if t is not None:
                        write_parquet(t, tmp / C.TIMELINE_DIR / f"{p.run_id}.parquet")
            if cfg.power is not None:
                (tmp / C.RESOURCES_DIR).mkdir()
                write_parquet(pa.concat_tables([powers[p.index] for p in plans]),
                              tmp / C.RESOURCES_DIR / "power.parquet")
            (tmp / "README.md").write_text(readme_text(cfg, plans, [stats[p.index] for p in plans])
                                           + (readme_extra.rstrip() + "\n" if readme_extra else ""),
                                           encoding="utf-8")
            (tmp / C.MANIFEST_NAME).write_text(
                yaml.safe_dump(manifest_for(cfg, plans, manifest_extra), sort_keys=False, allow_unicode=True),
                encoding="utf-8")
    finally:
        if bar is not None:
            bar.close()
    return Path(out), [stats[p.index] for p in plans]
