"""The one evaluator of the simulated side: how many requests of a simulated run at a rate were
in the steady window and how many of those met the SLO, and the one bisection for the rate
where that attainment crosses the target.

Every caller that asks "attainment (or counts) at a rate" of a simulated system — the ground
truth (``capplan.sim.truth``), the twin's steady-state C_SLO and its policy and P/D sweeps
(``capplan.twin.capacity``), the twin's in-memory protocol (``capplan.twin.protocol``) — goes
through :func:`steady`, and every capacity search through :func:`bisect_crossing` (inside
:func:`bracket_crossing` where the bracket is not given). So:

- **one outcome rule.** A run becomes an :class:`Outcome` (per-request schedule, first and
  last token, tokens received, status, ITL statistics) and :func:`good_mask` decides which
  requests are good with the same terms as the SQL predicate ``capplan.metrics.good_predicate``
  (both built from ``capplan.slo.good_terms``; ``tests/test_good_rule.py`` runs every case
  through both). The steady window is the study's: scheduled at or after the warm-up, the
  warm-up rounded to whole nanoseconds as ``capplan.metrics`` rounds it.
- **one seed map.** Run ``m`` of a system with seed ``s`` draws from
  ``SeedSequence([s, TRUTH_SEED_OFFSET + m])`` whatever the rate (common random numbers: the
  attainment curve being bisected is the same curve at every step), the streams
  ``true_attainment``'s replication ``m`` has always used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import SpecError
from ..present import fmt, fmt_pct
from ..slo import SLO, good_array
from .config import ArrivalSpec, SynthConfig
from .engine import SimResult
from .replica import CANCELLED, OK, REJECTED, TIMEOUT
from .events import token_times
from .sweep import generate_study, simulate_level

TRUTH_SEED_OFFSET = 1_000_003  # keeps evaluation streams apart from a sweep's own runs

#: the per-run numbers :func:`run_metrics` gives (beside ``n`` and ``n_good``)
METRICS = ("attainment", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "achieved_rps",
           "share_rejected", "share_timed_out")


# ----------------------------------------------------------------------------- the outcome rule

@dataclass(frozen=True, eq=False)
class Outcome:
    """Per-request outcome of one run (measured or simulated), in the run's order: times in ns
    from the run's start (−1 when absent), statuses as ``capplan.contract.STATUSES`` indices."""

    sched: np.ndarray
    first: np.ndarray
    last: np.ndarray
    out: np.ndarray
    status: np.ndarray
    itl_p99_ms: np.ndarray | None = None
    itl_max_ms: np.ndarray | None = None


def itl_stats(off: np.ndarray, val: np.ndarray, has: np.ndarray):
    """Per-request ITL p99 and max (ms) from concatenated gaps (``off`` the offsets); NaN where
    a request has no gap, as the SQL view's NULL."""
    n = len(off) - 1
    p99 = np.full(n, np.nan)
    mx = np.full(n, np.nan)
    for i in np.flatnonzero(has & (np.diff(off) > 0)):
        g = val[off[i]:off[i + 1]] / 1e6
        p99[i] = np.quantile(g, 0.99)
        mx[i] = g.max()
    return p99, mx


def good_mask(o: Outcome, slo: SLO, sent_ns: np.ndarray | None = None) -> np.ndarray:
    """capplan.metrics.good_predicate on arrays (both from ``capplan.slo.good_terms``), the
    metrics as ``request_view`` defines them; a missing stamp (−1) is NULL. ``sent_ns``: the
    client's send stamps for ``ttft_from = sent`` (None or −1: unknown, TTFT from scheduled
    as the SQL's coalesce)."""
    known = lambda x: np.where(x >= 0, x, np.nan).astype(np.float64)  # noqa: E731
    first, last = known(o.first), known(o.last)
    sched = o.sched.astype(np.float64)
    sent = sched if sent_ns is None else np.where(sent_ns >= 0, sent_ns, o.sched).astype(np.float64)
    nan = np.full(len(sched), np.nan)

    def metric(col: str) -> np.ndarray:
        if col == "ttft_ms":
            return (first - sched) / 1e6
        if col == "ttft_sent_ms":
            return (first - sent) / 1e6
        if col == "tpot_ms":
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(o.out > 1, (last - first) / 1e6 / np.maximum(o.out - 1, 1), np.nan)
        if col == "e2e_ms":
            return (last - sched) / 1e6
        v = o.itl_p99_ms if col == "itl_p99_ms" else o.itl_max_ms
        return nan if v is None else v

    return good_array(slo, (o.status == OK) & (o.first >= 0), metric)


def warmup_ns(warmup_s: float) -> int:
    """The warm-up in whole nanoseconds, rounded as ``capplan.metrics`` rounds a run's."""
    return int(round(float(warmup_s) * 1e9))


def run_metrics(o: Outcome, slo: SLO, warmup_ns: int) -> dict:
    """A run's numbers as ``capplan summarize`` reports them (steady window = scheduled at or
    after the warm-up; percentiles type 7 over completed requests; throughput = completed
    requests / time from the first scheduled request to the last event), with ``n`` in-window
    requests and ``n_good`` of them SLO-good."""
    w = o.sched >= warmup_ns
    n = int(w.sum())
    st = o.status[w]
    ok = (st == OK) & (o.first[w] >= 0)
    out = {"n": n}
    if n == 0:
        return {**out, **{m: float("nan") for m in METRICS}, "n_good": 0}
    good = good_mask(o, slo)[w]
    out["n_good"] = int(good.sum())
    out["attainment"] = float(good.mean())
    ttft = ((o.first[w] - o.sched[w]) / 1e6)[ok]
    okm = ok & (o.out[w] > 1) & (o.last[w] >= 0)
    tpot = ((o.last[w] - o.first[w]) / 1e6 / np.maximum(o.out[w] - 1, 1))[okm]
    for name, v in (("ttft", ttft), ("tpot", tpot)):
        q = np.quantile(v, [0.5, 0.99]) if len(v) else [np.nan, np.nan]
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = float(q[0]), float(q[1])
    ends = np.max(np.c_[o.sched[w], o.first[w], o.last[w]], axis=1)
    elapsed = (ends.max() - o.sched[w].min()) / 1e9
    completed = int((ok & (o.last[w] >= 0)).sum())
    out["achieved_rps"] = completed / elapsed if elapsed > 0 else float("nan")
    out["share_rejected"] = float(np.mean(st == REJECTED))
    out["share_timed_out"] = float(np.mean((st == TIMEOUT) | (st == CANCELLED)))
    return out


def simulated_outcome(cfg: SynthConfig, level: float, *, duration_s: float, seed_key: tuple[int, ...],
                      itl: bool) -> tuple[Outcome, SimResult]:
    """One simulated run of ``cfg`` at ``level`` on the streams ``SeedSequence([cfg.seed,
    *seed_key])``, as its per-request Outcome (ITL statistics only with ``itl``: they cost a
    pass over every token) and the simulator's result."""
    res = simulate_level(cfg, level, duration_s=duration_s, seed_key=seed_key)
    n_recv, first, last, off, val = token_times(res, with_itl=itl)
    p99 = mx = None
    if itl:
        p99, mx = itl_stats(off, val, n_recv > 1)
    return Outcome(res.sched_ns, first, last, n_recv, res.status.astype(np.int8), p99, mx), res


# ----------------------------------------------------------------------------- the evaluator

def system_config(system, *, rates=None, duration_s: float, warmup_s: float, repeats: int = 1,
                  seed: int = 0, itl: bool = False) -> SynthConfig:
    """The synth configuration of ``system`` — a twin (anything with ``synth_config``) or a
    ``SynthConfig`` — for an open-loop protocol: ``rates`` (None: the system's own), each run
    ``duration_s`` long with the first ``warmup_s`` outside the steady window, ``repeats`` per
    rate, the workload ``seed``; no power model; per-request ITL kept only with ``itl``."""
    if hasattr(system, "synth_config"):
        return system.synth_config(rates=None if rates is None else tuple(float(r) for r in rates),
                                   duration_s=duration_s, warmup_s=warmup_s, repeats=repeats, seed=seed, itl=itl)
    if not isinstance(system, SynthConfig):
        raise SpecError("simulating needs a twin (capplan twin fit) or a synth config", field="twin",
                        fix="pass --twin twin.yaml, or a synth config file")
    kw = {} if rates is None else {"rates": tuple(float(r) for r in rates)}
    return system.with_(**kw, duration_s=float(duration_s), warmup_s=float(warmup_s), repeats=int(repeats),
                        requests_per_run=None, seed=int(seed), itl=bool(itl), power=None, load_model="open")


def run_study(system, scenario=None, out=None, *, rates=None, duration_s: float | None = None,
              warmup_s: float = 0.0, repeats: int = 1, seed: int = 0, workers: int = 1):
    """The other evaluator: simulated runs written as a study (a twin's output is a study), for
    what needs a written study's reduction rather than counts — a trial fit's block statistics
    and diagnostics (``capplan design``), a window-by-window timeline (``capplan.plan.dynamics``).
    ``system`` under ``scenario`` (its ``apply(system).config``), or ``system`` on the protocol
    given (``system_config``: ``rates``, ``duration_s``, ``warmup_s``, ``repeats``, ``seed``); a
    ``SynthConfig`` with neither is simulated as configured. Returns ``generate_study``'s
    (study path, per-run statistics)."""
    if out is None:
        raise SpecError("run_study needs an output folder", field="out")
    if scenario is not None:
        cfg = scenario.apply(system).config
    elif isinstance(system, SynthConfig) and duration_s is None:
        cfg = system
    else:
        if duration_s is None:
            raise SpecError("simulating a twin needs a run length", field="duration_s")
        cfg = system_config(system, rates=rates, duration_s=duration_s, warmup_s=warmup_s,
                            repeats=repeats, seed=seed)
    return generate_study(cfg, out, workers=workers)


@dataclass(frozen=True, eq=False)
class Steady:
    """In-window and SLO-good requests of ``len(n)`` independent simulated runs at one rate:
    run ``first_run + i`` is ``n[i]``, ``good[i]``. ``attainment`` pools them (Σ good / Σ n:
    near saturation a few congested runs pull the pooled attainment below a typical run's).
    With ``input_edges``: the same per input-length bucket (bucket b = how many edges are ≤ the
    prompt's tokens), ``cell_n[i][b]``, ``cell_good[i][b]``. ``outcomes``: each run's
    (Outcome, SimResult) when asked for."""

    offered_rps: float
    slo: str
    duration_s: float
    warmup_s: float
    seed: int
    first_run: int
    n: tuple[int, ...]
    good: tuple[int, ...]
    input_edges: tuple[float, ...] = ()
    cell_n: tuple[tuple[int, ...], ...] = ()
    cell_good: tuple[tuple[int, ...], ...] = ()
    outcomes: tuple[tuple[Outcome, SimResult], ...] = field(default=(), repr=False)

    @property
    def n_requests(self) -> int:
        return int(sum(self.n))

    @property
    def n_good(self) -> int:
        return int(sum(self.good))

    @property
    def attainment(self) -> float:
        """Pooled attainment Σ good / Σ n (NaN with no in-window request)."""
        n = np.asarray(self.n, float)
        return float(np.asarray(self.good, float).sum() / n.sum()) if n.sum() else float("nan")

    @property
    def per_run(self) -> tuple[float, ...]:
        """Each run's own attainment (0 for a run with no in-window request)."""
        n, g = np.asarray(self.n, float), np.asarray(self.good, float)
        return tuple(float(a) for a in g / np.maximum(n, 1))

    def to_dict(self) -> dict:
        return {"offered_rps": self.offered_rps, "slo": self.slo, "duration_s": self.duration_s,
                "warmup_s": self.warmup_s, "seed": self.seed, "first_run": self.first_run, "n": list(self.n),
                "good": list(self.good), "attainment": self.attainment}

    def to_text(self) -> str:
        runs = len(self.n)
        return (f"{fmt(self.offered_rps)} req/s under {self.slo}: attainment {fmt_pct(self.attainment, 2)} "
                f"({self.n_good:,} of {self.n_requests:,} in-window requests, {runs} simulated run"
                f"{'s' if runs != 1 else ''} of {fmt(self.duration_s)} s, the first {fmt(self.warmup_s)} s left out; "
                f"seed {self.seed}, runs {self.first_run}–{self.first_run + runs - 1})")


def steady(system, scenario=None, slo: SLO | str = "", *, rate_rps: float, runs: int = 1, first_run: int = 0,
           duration_s: float | None = None, warmup_s: float | None = None, seed: int | None = None,
           arrival: str | ArrivalSpec | None = None, input_edges=None, outcomes: bool = False) -> Steady:
    """Counts of ``runs`` independent simulated runs of ``system`` under ``scenario`` at
    ``rate_rps`` (docstring of the module: one outcome rule, one seed map).

    ``system``: a ``SynthConfig`` (simulated as configured: its arrivals, seed, serving
    policies, fleet control) or a twin (``synth_config``; its measured arrival process unless
    ``arrival`` says otherwise). ``scenario``: None, or what changes — anything whose
    ``apply(system)`` gives a context with the changed ``config`` (a ``capplan.twin.Scenario``
    applied to a twin). ``duration_s``: each run's length (default: the configuration's own
    run length at the rate); ``warmup_s``: left out of the counts (default: the
    configuration's); ``seed``: the workload seed (default: the configuration's; a twin's
    default is 0). ``arrival``: "poisson" or an ArrivalSpec to replace the configured arrival
    process. ``input_edges``: also count per prompt-length bucket. ``outcomes``: keep each
    run's per-request Outcome and SimResult."""
    s = SLO.parse(slo)
    if runs < 1:
        raise SpecError("runs must be ≥ 1", field="replications")
    need_itl = s.itl_ms is not None
    rate = float(rate_rps)
    if isinstance(system, SynthConfig) and scenario is None:
        cfg = system if seed is None else system.with_(seed=int(seed))
    elif scenario is None:
        cfg = system_config(system, rates=(rate,), duration_s=duration_s, warmup_s=warmup_s,
                            seed=int(seed or 0), itl=need_itl)
    else:
        cfg = scenario.apply(system).config
        if seed is not None:
            cfg = cfg.with_(seed=int(seed))
    if arrival is not None:
        if arrival == "poisson":
            arrival = ArrivalSpec("poisson")
        if not isinstance(arrival, ArrivalSpec):
            raise ValueError(f"arrival must be 'poisson' or an ArrivalSpec, got {arrival!r}")
        cfg = cfg.with_(arrival=arrival)
    dur = float(duration_s if duration_s is not None else cfg.run_duration_s(rate))
    warm = float(cfg.warmup_s if warmup_s is None else warmup_s)
    if warm >= dur:
        raise SpecError(f"warm-up {warm:g} s must be shorter than the run ({dur:g} s)", field="warmup_s")
    edges = None if input_edges is None else np.asarray([float(e) for e in input_edges], float)
    w0 = warmup_ns(warm)
    n, good, cn, cg, kept = [], [], [], [], []
    for m in range(int(first_run), int(first_run) + int(runs)):
        o, res = simulated_outcome(cfg, rate, duration_s=dur, seed_key=(TRUTH_SEED_OFFSET + m,), itl=need_itl)
        w = o.sched >= w0
        g = good_mask(o, s) & w
        n.append(int(w.sum()))
        good.append(int(g.sum()))
        if edges is not None:
            b = (res.input_tokens[:, None] >= edges[None, :]).sum(axis=1)
            cn.append(tuple(int(x) for x in np.bincount(b[w], minlength=len(edges) + 1)))
            cg.append(tuple(int(x) for x in np.bincount(b[g], minlength=len(edges) + 1)))
        if outcomes:
            kept.append((o, res))
    return Steady(rate, str(s), dur, warm, int(cfg.seed), int(first_run), tuple(n), tuple(good),
                  () if edges is None else tuple(float(e) for e in edges), tuple(cn), tuple(cg), tuple(kept))


# ----------------------------------------------------------------------------- the one bisection

def bisect_crossing(passes, lo: float, hi: float, *, tol_rps: float | None = None,
                    rel_tol: float | None = None) -> tuple[float, float]:
    """The final (last passing, first failing) bracket of the rate where ``passes`` turns
    false, halving [lo, hi] until it is narrower than ``tol_rps`` (absolute) or ``rel_tol``
    (relative to its upper end). ``passes(lo)`` is taken to hold and ``passes(hi)`` not (the
    caller checked both, or found them with :func:`bracket_crossing`); a monotone curve is
    assumed — with common random numbers the simulated one is the same curve at every step."""
    if (tol_rps is None) == (rel_tol is None):
        raise ValueError("give tol_rps or rel_tol")
    if not lo < hi:
        raise ValueError(f"need lo < hi, got {lo!r}, {hi!r}")

    def wide() -> bool:
        return hi - lo > tol_rps if tol_rps is not None else (hi - lo) / hi > rel_tol

    while wide():
        mid = 0.5 * (lo + hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def bracket_crossing(passes, start: float, *, rel_tol: float, width: float = 1.2, step: float = 1.5,
                     reach: float = 1000.0) -> tuple[float, str]:
    """(crossing, note): the rate where ``passes`` turns false, searched from a first guess
    ``start``: [start / width, start · width] is tried, widened by factors of ``step`` until it
    brackets the crossing, then bisected to ``rel_tol`` (:func:`bisect_crossing`); the midpoint
    of the final bracket. Past ``reach``× away from ``start`` the search stops and says so
    (crossing 0 or inf, with the note)."""
    lo, hi = start / width, start * width
    if not passes(lo):
        hi, lo = lo, None
        while lo is None:
            r = hi / step
            if r < start / reach:
                return 0.0, f"misses the SLO even at {r:.3g} req/s (e.g. failures alone exceed 1 − target)"
            if passes(r):
                lo = r
            else:
                hi = r
    elif passes(hi):
        lo, hi = hi, None
        while hi is None:
            r = lo * step
            if r > reach * start:
                return math.inf, f"meets the SLO even at {r:g} req/s"
            if passes(r):
                lo = r
            else:
                hi = r
    lo, hi = bisect_crossing(passes, lo, hi, rel_tol=rel_tol)
    return 0.5 * (lo + hi), ""
