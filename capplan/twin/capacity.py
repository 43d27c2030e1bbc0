"""The twin's steady-state C_SLO: the largest Poisson rate (at the measured mix) whose long-run
attainment meets the SLO, with a 95 % interval.

Each evaluation simulates ``runs`` independent long runs (``duration_s``, the first
``warmup_s`` left out) and pools their SLO-good requests, counted by the simulated side's one
evaluator (:func:`capplan.sim.evaluate.steady`, the pipeline's definitions) — the same pooled
attainment :func:`capplan.sim.truth.true_attainment` bisects, so the twin's C_SLO and the
``true_capacity`` of a generating configuration are the same quantity. (Pooling matters near
saturation: a few runs with congestion episodes pull the pooled attainment below a typical
run's.) The crossing is found by the one bracketing and bisection
(:func:`capplan.sim.evaluate.bracket_crossing`) with common random numbers (the same
workloads at every rate: arrival gaps scale with the rate).

- **Monte-Carlo error**: each run's own crossing, from a logit-linear fit through its
  attainment at the evaluated rates near the estimate; SE = their SD / √runs;
- **parameter effect**: for each of ``draws`` parameter draws (:meth:`Twin.draw`), the shift of
  the crossing of run 0's workload, read from its attainment at three rates around the estimate;
- **interval**: estimate ± 1.96 · sqrt(Monte-Carlo SE² + variance of the parameter effects).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import multiprocessing as mp
import numpy as np

from ..slo import SLO
from ..sim.config import SynthConfig
from ..sim.evaluate import bracket_crossing, steady

STEADY_DURATION_S = 1800.0  # at least this long …
STEADY_REQUESTS = 12_000  # … and long enough for this many requests per run at the first guess
NEGLIGIBLE_REL_SD = 1e-3  # service parameters known this well need no draws
STEADY_WARMUP_SHARE = 1 / 6  # of the run, left out
REL_TOL = 0.005
SEED_OFFSET = 2_000_003  # parameter draws


@dataclass(frozen=True)
class SteadyCSLO:
    estimate: float
    ci_low: float
    ci_high: float
    per_run: tuple[float, ...]  # each run's own crossing (Monte-Carlo spread)
    duration_s: float
    warmup_s: float
    evaluations: int  # simulated runs
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        f = lambda x: None if x is None or not math.isfinite(x) else round(float(x), 6)  # noqa: E731
        return {"estimate": f(self.estimate), "ci_low": f(self.ci_low), "ci_high": f(self.ci_high),
                "kind": "steady state: Poisson arrivals at the measured mix, long runs pooled",
                "duration_s": round(self.duration_s, 3), "warmup_s": round(self.warmup_s, 3),
                "runs": len(self.per_run), "simulated_runs": self.evaluations, "notes": list(self.notes)}


def simulated_counts(twin: "Twin", rate: float, slo: SLO, *, duration_s: float, warmup_s: float,
                     seed: int, run: int) -> tuple[int, int]:
    """(in-window requests, SLO-good ones) of one long Poisson run of ``twin`` at ``rate``:
    :func:`capplan.sim.evaluate.steady`'s run ``run`` at workload seed ``seed`` — the streams
    ``capplan.sim.truth.true_attainment`` gives its replication ``run`` of a config with that
    seed, so the twin and a generating configuration see the same arrivals and the same normal
    draws behind their lengths (common random numbers)."""
    st = steady(twin, None, slo, rate_rps=rate, first_run=run, duration_s=duration_s, warmup_s=warmup_s,
                seed=seed, arrival="poisson")
    return st.n[0], st.good[0]


def config_counts(cfg, rate: float, slo: SLO, *, duration_s: float, warmup_s: float, run: int,
                  outcome: bool = False):
    """(in-window requests, SLO-good ones) of one run of a synth configuration ``cfg`` (its
    arrival process, seed and serving policies) at ``rate``: :func:`capplan.sim.evaluate.steady`'s
    run ``run``; with ``outcome`` also the run's ``Outcome`` and the simulator's ``SimResult``."""
    st = steady(cfg, None, slo, rate_rps=rate, first_run=run, duration_s=duration_s, warmup_s=warmup_s,
                outcomes=outcome)
    return (st.n[0], st.good[0], *st.outcomes[0]) if outcome else (st.n[0], st.good[0])


def _job(args):
    if isinstance(args[0], SynthConfig):  # a configuration's run (config_counts)
        cfg, slo, rate, dur, warm, run = args
        return config_counts(cfg, rate, slo, duration_s=dur, warmup_s=warm, run=run)
    twin, slo, rate, dur, warm, seed, run = args
    return simulated_counts(twin, rate, slo, duration_s=dur, warmup_s=warm, seed=seed, run=run)


class _Sim:
    """Runs batches of simulations inline or on a process pool (results never depend on it):
    the caller's ``executor``, else one of its own with ``workers`` processes."""

    def __init__(self, workers: int, executor=None):
        self.workers = workers
        self.pool = executor
        self.own = executor is None
        self.count = 0

    def __enter__(self):
        if self.own and self.workers > 1:
            self.pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"))
        return self

    def __exit__(self, *exc):
        if self.own and self.pool is not None:
            self.pool.shutdown()

    def map(self, jobs):
        self.count += len(jobs)
        if self.pool is None:
            return [_job(j) for j in jobs]
        return list(self.pool.map(_job, jobs))


def _logit(p):
    p = np.clip(np.asarray(p, float), 1e-4, 1 - 1e-4)
    return np.log(p) - np.log1p(-p)


def pooled_crossing(sim: _Sim, twin, slo: SLO, *, start: float, runs: int, duration_s: float, warmup_s: float,
                    seed: int, rel_tol: float = REL_TOL):
    """(rate, per-run crossings, note): :func:`capplan.sim.evaluate.bracket_crossing` on the
    attainment pooled over ``runs`` (each rate's runs simulated once, as one batch).
    ``twin``: a Twin (Poisson arrivals at its measured mix) or a SynthConfig (as configured)."""
    target = slo.attainment
    cache: dict[float, np.ndarray] = {}

    def job(r, m):
        if isinstance(twin, SynthConfig):
            return (twin, slo, r, duration_s, warmup_s, m)
        return (twin, slo, r, duration_s, warmup_s, int(seed), m)

    def passes(r):
        if r not in cache:
            cache[r] = np.array(sim.map([job(r, m) for m in range(runs)]), float)
        c = cache[r]
        return c[:, 1].sum() / max(c[:, 0].sum(), 1.0) >= target

    est, note = bracket_crossing(passes, start, rel_tol=rel_tol)
    if note:
        return est, (), note
    return est, _per_run_crossings(cache, est, target), ""


def _per_run_crossings(cache: dict, est: float, target: float) -> tuple[float, ...]:
    """Each run's own crossing: a logit-linear fit through its attainment at the rates the
    bisection evaluated within ±10 % of the estimate (at least three of them)."""
    rates = np.array(sorted(cache))
    near = rates[np.argsort(np.abs(rates - est))][:max(3, int(np.sum(np.abs(rates / est - 1) <= 0.1)))]
    near = np.sort(near)
    out = []
    for m in range(len(cache[rates[0]])):
        a = np.array([cache[r][m, 1] / max(cache[r][m, 0], 1.0) for r in near])
        y = _logit(a)
        if np.ptp(y) == 0:
            out.append(est)
            continue
        b1, b0 = np.polyfit(near, y, 1)
        c = (_logit(target) - b0) / b1 if b1 < 0 else est
        out.append(float(np.clip(c, est / 2, est * 2)))
    return tuple(out)


def capacity_guess(cfg: SynthConfig) -> float:
    """A first guess of a configuration's capacity (req/s), where a C_SLO search starts: 0.8 ×
    the service model's throughput bound at the workload's mean lengths (prefill and decode
    pools apart when disaggregated)."""
    rng = np.random.default_rng(0)
    inp, out = cfg.lengths.sample(4000, rng)
    if cfg.prefixes is not None and cfg.prefixes.kind == "system":
        inp = inp + cfg.prefixes.share * cfg.prefixes.tokens
    mi, mo = float(np.mean(inp)), float(np.mean(out))

    def pool_caps(rp, n_pre, n_dec, lanes):
        sm = rp.service
        pre = n_pre * lanes / max(1e-9, (sm.prefill_ms_per_token * mi + sm.prefill_overhead_ms) / 1e3)
        b = rp.max_batch
        dec = n_dec * b / max(1e-9, max(mo - 1, 1) * float(sm.step_ms(b)) / 1e3)
        return pre, dec

    if cfg.disagg is not None:
        d = cfg.disagg
        pre, _ = pool_caps(d.prefill.params, d.prefill.replicas, 0, d.lanes)
        _, dec = pool_caps(d.decode.params, 0, d.decode.replicas, 1)
        return 0.8 * min(pre, dec)
    pre, dec = pool_caps(cfg.replica, cfg.replicas, cfg.replicas, 1)
    return 0.8 / (1 / pre + 1 / dec)  # colocated: both kinds of work on the same GPUs


def config_cslo(cfg: SynthConfig, slo: SLO | str, *, start: float, runs: int = 4, duration_s: float = 1800.0,
                warmup_s: float | None = None, workers: int | None = None, executor=None,
                rel_tol: float = REL_TOL) -> SteadyCSLO:
    """Steady-state C_SLO of a synth configuration as configured (its arrival process, serving
    policies, pools): the pooled crossing of ``runs`` runs of ``duration_s`` (the first
    ``warmup_s``, default a sixth, left out), ± 1.96 × the Monte-Carlo SE of the per-run
    crossings. No parameter uncertainty: the configuration's service times are taken as known."""
    s = SLO.parse(slo)
    warmup_s = duration_s * STEADY_WARMUP_SHARE if warmup_s is None else warmup_s
    runs = max(1, int(runs))
    workers = max(1, min(int(workers or min(2, os.cpu_count() or 1)), runs))
    with _Sim(workers, executor) as sim:
        est, per_run, note = pooled_crossing(sim, cfg, s, start=start, runs=runs, duration_s=duration_s,
                                             warmup_s=warmup_s, seed=cfg.seed, rel_tol=rel_tol)
        count = sim.count
    if note:
        return SteadyCSLO(est, est, est, per_run, duration_s, warmup_s, count, (note,))
    se = float(np.std(per_run, ddof=1) / np.sqrt(len(per_run))) if len(per_run) > 1 else 0.0
    h = 1.959964 * se
    return SteadyCSLO(est, max(0.0, est - h), est + h, per_run, duration_s, warmup_s, count,
                      (f"pooled attainment of {runs} independent {duration_s:.0f}-s runs (first {warmup_s:.0f} s left "
                       f"out), {cfg.arrival.process} arrivals; Monte-Carlo SE {se:.3g} req/s; service times taken as "
                       "known (no parameter uncertainty)",))


def _service_rel_sd(twin) -> float:
    """Largest relative SD (from the 95 % intervals) of the decode points and prefill cost."""
    rel = [((d.ci95[1] - d.ci95[0]) / 3.92) / d.ms for d in twin.decode if d.ci95 and d.ms > 0]
    kp = twin.param("prefill_ms_per_token")
    if kp.ci95 and float(kp.value) > 0:
        rel.append(kp.sd / float(kp.value))
    ov = twin.param("prefill_overhead_ms")
    if ov.ci95:
        rel.append(ov.sd / max(float(ov.value), float(twin.service.step_ms(1))))
    return float(max(rel, default=np.inf)) if all(d.ci95 for d in twin.decode) else float("inf")


def steady_cslo(twin: "Twin", slo: SLO | str, *, start: float | None = None, runs: int = 4, draws: int = 10,
                seed: int = 0, duration_s: float | None = None, warmup_s: float | None = None,
                workers: int | None = None, executor=None) -> SteadyCSLO:
    """Steady-state C_SLO of ``twin`` with a 95 % interval (see the module docstring).
    ``start``: a first guess of the rate (e.g. the measured envelope's estimate); default the
    median measured rate. Runs last ``duration_s`` (default: the longer of 1800 s and 12,000
    requests at ``start``), the first ``warmup_s`` (default a sixth) left out; ``seed`` is the
    workload seed (run m uses the streams of ``true_attainment``'s replication m at that
    seed). ``workers`` processes (default up to 2), or the caller's ``executor``; results do not
    depend on either."""
    s = SLO.parse(slo)
    if start is None:
        rates = [float(r["offered_rps"]) for r in twin.workload.per_run if r.get("offered_rps")]
        start = float(np.median(rates)) if rates else 1.0
    if duration_s is None:
        duration_s = max(STEADY_DURATION_S, STEADY_REQUESTS / max(start, 1e-3))
    if warmup_s is None:
        warmup_s = duration_s * STEADY_WARMUP_SHARE
    runs = max(1, int(runs))
    workers = max(1, min(int(workers or min(2, os.cpu_count() or 1)), runs))
    notes = []
    with _Sim(workers, executor) as sim:
        est, per_run, note = pooled_crossing(sim, twin, s, start=start, runs=runs, duration_s=duration_s,
                                             warmup_s=warmup_s, seed=seed)
        if note:
            return SteadyCSLO(est, est, est, per_run, duration_s, warmup_s, sim.count, (note,))
        se_mc = float(np.std(per_run, ddof=1) / np.sqrt(len(per_run))) if len(per_run) > 1 else 0.0
        effects: list[float] = []
        rel = _service_rel_sd(twin)
        if draws > 0 and rel < NEGLIGIBLE_REL_SD:
            notes.append(f"every service parameter is known within {rel:.2%} (1 SD): no parameter draws simulated")
            draws = 0
        if draws > 0:
            rates = [est * (1 + d) for d in (-0.04, 0.0, 0.04)]
            twins = [twin] + [twin.draw(np.random.default_rng([int(seed), SEED_OFFSET, k])) for k in range(draws)]
            out = sim.map([(tw, s, r, duration_s, warmup_s, int(seed), 0) for tw in twins for r in rates])
            att = np.array([g / max(n, 1) for n, g in out]).reshape(len(twins), 3)
            cross = []
            for a in att:
                y = _logit(a)
                b1, b0 = np.polyfit(rates, y, 1) if np.ptp(y) > 0 else (0.0, 0.0)
                cross.append((_logit(s.attainment) - b0) / b1 if b1 < 0 else np.nan)
            effects = [c - cross[0] for c in cross[1:] if np.isfinite(c) and np.isfinite(cross[0])]
        count = sim.count
    sd_par = float(np.std(effects, ddof=1)) if len(effects) > 1 else 0.0
    h = 1.959964 * float(np.hypot(se_mc, sd_par))
    if twin.workload.arrival.process != "poisson":
        notes.append(f"the measured arrivals look {twin.workload.arrival.process}"
                     + (f" (CV {twin.workload.arrival.cv:.2f})" if twin.workload.arrival.process == "gamma" else "")
                     + "; the steady-state C_SLO uses Poisson arrivals (the usual planning assumption)")
    notes.append(f"pooled attainment of {runs} independent {duration_s:.0f}-s runs (first {warmup_s:.0f} s left out); "
                 f"Monte-Carlo SE {se_mc:.3g} req/s; parameter uncertainty from {len(effects)} draws "
                 f"(SD {sd_par:.3g} req/s)")
    return SteadyCSLO(est, max(0.0, est - h), est + h, per_run, duration_s, warmup_s, count, tuple(notes))
