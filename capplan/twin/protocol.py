"""Simulate a load-test protocol on a twin, in memory: the runs a sweep of (rates × repeats)
would have produced, as per-request arrays — fast enough to repeat the protocol many times
(a parametric bootstrap of the envelope; docs/twin.md "Simulating a protocol").

Run ``i`` of :func:`simulate_protocol` draws from ``SeedSequence([seed, i])`` exactly as run
``i`` of ``capplan.sim.generate_study(twin.synth_config(...))`` does, so the in-memory runs
and a written study agree request for request. (That is a sweep's seed map, not the
evaluator's: :func:`capplan.sim.evaluate.steady` counts runs on streams kept apart from any
sweep's. Both build a run's outcome with ``simulated_outcome`` and score it with the one
outcome rule, ``good_mask`` / ``run_metrics``.)
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import multiprocessing as mp
import numpy as np

from ..slo import SLO
from ..sim.config import ArrivalSpec
from ..sim.evaluate import Outcome, good_mask, run_metrics, simulated_outcome, warmup_ns
from ..sim.sweep import plan_runs


@dataclass(frozen=True, eq=False)
class SimRun:
    """One simulated run: per-request arrays in scheduled order (times in ns from the run's
    start, −1 when absent; statuses as capplan.contract.STATUSES indices)."""

    run_id: str
    offered_rps: float
    repeat: int
    duration_s: float
    warmup_s: float
    sched: np.ndarray
    first: np.ndarray
    last: np.ndarray
    out: np.ndarray
    inp: np.ndarray
    status: np.ndarray
    tenant: np.ndarray
    itl_p99_ms: np.ndarray | None = None
    itl_max_ms: np.ndarray | None = None

    @property
    def outcome(self) -> Outcome:
        return Outcome(self.sched, self.first, self.last, self.out, self.status, self.itl_p99_ms, self.itl_max_ms)

    @property
    def in_window(self) -> np.ndarray:
        return self.sched >= warmup_ns(self.warmup_s)

    def metrics(self, slo: SLO | str) -> dict:
        """Attainment, TTFT/TPOT p50/p99, throughput, shares rejected / timed out (steady window)."""
        return run_metrics(self.outcome, SLO.parse(slo), warmup_ns(self.warmup_s))

    def series(self, slo: SLO | str) -> dict:
        """The run as ``capplan.reduce.stats_from_series`` wants it: in-window 0/1 good and ok
        series and TTFT (ms; failed requests take the run's largest) in scheduled order."""
        s = SLO.parse(slo)
        w = self.in_window
        good = good_mask(self.outcome, s)[w]
        ok = (self.status == 0)[w]
        ttft = ((self.first - self.sched) / 1e6)[w]
        ttft = np.where(self.first[w] >= 0, ttft, np.nan)
        fill = np.nanmax(ttft) if np.isfinite(ttft).any() else 1.0
        sched_w = self.sched[w]
        rate = (len(sched_w) - 1) / ((sched_w[-1] - sched_w[0]) / 1e9) if len(sched_w) > 1 and sched_w[-1] > sched_w[0] \
            else self.offered_rps
        return {"run_id": self.run_id, "load_level": self.offered_rps, "rate_rps": float(rate), "repeat": self.repeat,
                "good": good.astype(np.int8), "ok": ok.astype(np.int8),
                "latency": np.where(np.isfinite(ttft), np.maximum(ttft, 1e-6), fill)}


def _one(args):
    cfg, plan, need_itl = args
    o, res = simulated_outcome(cfg, plan.level, duration_s=plan.duration_s, seed_key=(plan.index,), itl=need_itl)
    return SimRun(plan.run_id, float(plan.level), int(plan.repeat), float(plan.duration_s), float(cfg.warmup_s),
                  o.sched, o.first, o.last, o.out, res.input_tokens, o.status, res.tenant, o.itl_p99_ms, o.itl_max_ms)


def simulate_protocol(twin, *, rates, duration_s: float, warmup_s: float = 0.0, repeats: int = 1, seed: int = 0,
                      arrival: str | ArrivalSpec = "poisson", itl: bool = False,
                      workers: int | None = None) -> tuple[SimRun, ...]:
    """Simulate the protocol (each rate ``repeats`` times, ``duration_s`` each, first
    ``warmup_s`` outside the steady window) on ``twin``. ``arrival``: "poisson" (default),
    "measured" (the twin's fitted process) or an ArrivalSpec. ``itl=True`` keeps per-request
    ITL p99/max (needed only for ITL SLOs). ``workers`` processes (default 1); results do not
    depend on it. Returns one SimRun per run, in (rate, repeat) order."""
    cfg = twin.synth_config(rates=tuple(float(r) for r in rates), duration_s=duration_s, warmup_s=warmup_s,
                            repeats=repeats, seed=seed, itl=itl)
    if isinstance(arrival, ArrivalSpec):
        cfg = replace(cfg, arrival=arrival)
    elif arrival == "poisson":
        cfg = replace(cfg, arrival=ArrivalSpec("poisson"))
    elif arrival != "measured":
        raise ValueError(f"arrival must be 'poisson', 'measured' or an ArrivalSpec, got {arrival!r}")
    jobs = [(cfg, p, itl) for p in plan_runs(cfg)]
    workers = max(1, min(int(workers or 1), len(jobs), os.cpu_count() or 1))
    if workers == 1:
        return tuple(_one(j) for j in jobs)
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        return tuple(ex.map(_one, jobs))
