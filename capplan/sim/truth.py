"""Ground truth: the attainment a run protocol really has at an offered rate.

The truth is estimated by simulation with the one evaluator of the simulated side
(:func:`capplan.sim.evaluate.steady`): per-request outcomes in memory, counted with the same
SLO-good rule as the pipeline's SQL (``capplan.metrics.good_predicate``; both built from
``capplan.slo.good_terms``) and the same steady window, so that later tests can check fitted
capacities and their confidence intervals against it.

Two notions, both useful:
- ``mode="run"`` (default): the expected pooled attainment of a run of the configured protocol
  (duration_s, warm-up), i.e. Σ good / Σ in-window requests over ``replications`` independent
  runs. Near and above saturation this depends on run length (queues keep growing), which is
  exactly what a study's envelope estimates.
- ``mode="steady"``: one long run (``duration_s`` large) — the long-run attainment.

Replication seeds do not depend on the rate (common random numbers), so the estimated
attainment curve is smooth in the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SpecError
from ..slo import SLO
from .config import SynthConfig
from .evaluate import TRUTH_SEED_OFFSET, bisect_crossing, steady

__all__ = ["TRUTH_SEED_OFFSET", "TruthResult", "true_attainment", "CapacityTruth", "true_capacity", "CellTruth",
           "true_cell_attainment", "true_mix_capacity"]


@dataclass(frozen=True)
class TruthResult:
    offered_rps: float
    slo: str
    attainment: float
    ci_low: float
    ci_high: float
    n_requests: int
    n_good: int
    replications: int
    per_run: tuple[float, ...]

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("offered_rps", "slo", "attainment", "ci_low", "ci_high",
                                              "n_requests", "n_good", "replications")}


def true_attainment(cfg: SynthConfig, rate_rps: float, slo: SLO | str, *, replications: int = 8,
                    duration_s: float | None = None, warmup_s: float | None = None,
                    seed: int | None = None) -> TruthResult:
    """Pooled attainment of ``slo`` over independent runs at ``rate_rps`` (open loop).

    The 95 % interval treats runs as iid replicates of a ratio estimator (t interval on
    per-run good − attainment·n residuals), which is honest because runs are independent."""
    if cfg.load_model != "open":
        raise SpecError("true_attainment needs an open-loop config", field="sweep.load_model")
    s = SLO.parse(slo)
    st = steady(cfg, None, s, rate_rps=rate_rps, runs=replications, duration_s=duration_s, warmup_s=warmup_s,
                seed=seed)
    n = np.array(st.n, float)
    g = np.array(st.good, float)
    att = float(g.sum() / n.sum()) if n.sum() else float("nan")
    k = len(n)
    if k >= 2 and n.sum() > 0:
        resid = g - att * n
        se = math.sqrt(float(np.sum(resid ** 2)) / (k - 1) / k) / float(n.mean())
        from scipy.stats import t as tdist

        h = float(tdist.ppf(0.975, k - 1)) * se
    else:
        h = float("nan")
    return TruthResult(float(rate_rps), str(s), att, max(0.0, att - h), min(1.0, att + h), int(n.sum()),
                       int(g.sum()), k, tuple(float(a) for a in g / np.maximum(n, 1)))


@dataclass(frozen=True)
class CapacityTruth:
    """The rate where the simulated attainment curve crosses the SLO target (bisection with
    common random numbers, so the curve being bisected is the same at every step)."""

    slo: str
    capacity_rps: float
    bracket: tuple[float, float]  # last passing, first failing rate evaluated
    evaluations: tuple[TruthResult, ...]


def true_capacity(cfg: SynthConfig, slo: SLO | str, lo_rps: float, hi_rps: float, *, tol_rps: float = 0.05,
                  replications: int = 8, duration_s: float | None = None, warmup_s: float | None = None,
                  seed: int | None = None) -> CapacityTruth:
    """Largest rate whose pooled attainment meets ``slo.attainment``, to within ``tol_rps``.

    ``lo_rps`` must pass and ``hi_rps`` must fail; otherwise SpecError says which and what to
    change. Returns the midpoint of the final bracket."""
    s = SLO.parse(slo)
    kw = dict(replications=replications, duration_s=duration_s, warmup_s=warmup_s, seed=seed)
    if not (0 < lo_rps < hi_rps):
        raise SpecError("need 0 < lo_rps < hi_rps", field="lo_rps")
    a = true_attainment(cfg, lo_rps, s, **kw)
    b = true_attainment(cfg, hi_rps, s, **kw)
    evals = [a, b]
    if a.attainment < s.attainment:
        raise SpecError(f"the low end {lo_rps:g} req/s already misses the SLO (attainment {a.attainment:.4f})",
                        field="lo_rps", fix="start the bracket at a lower rate")
    if b.attainment >= s.attainment:
        raise SpecError(f"the high end {hi_rps:g} req/s still meets the SLO (attainment {b.attainment:.4f})",
                        field="hi_rps", fix="end the bracket at a higher rate")

    def passes(rate):
        evals.append(true_attainment(cfg, rate, s, **kw))
        return evals[-1].attainment >= s.attainment

    lo, hi = bisect_crossing(passes, lo_rps, hi_rps, tol_rps=tol_rps)
    return CapacityTruth(str(s), 0.5 * (lo + hi), (lo, hi), tuple(evals))


# ----------------------------------------------------------------------------- per cell (mix)


@dataclass(frozen=True)
class CellTruth:
    """Per input-length bucket attainment at one rate (pooled over independent runs)."""

    offered_rps: float
    slo: str
    input_edges: tuple[float, ...]
    n: tuple[int, ...]      # in-window requests per bucket (index = edges ≤ input tokens)
    good: tuple[int, ...]

    def attainment(self, weights=None) -> float:
        """Pooled attainment (``weights`` None) or Σ_b w_b · good_b / n_b at a target mix."""
        n, g = np.asarray(self.n, float), np.asarray(self.good, float)
        if weights is None:
            return float(g.sum() / n.sum())
        w = np.asarray(weights, float)
        w = w / w.sum()
        a = w > 0
        return float(np.sum(w[a] * g[a] / n[a]))


def true_cell_attainment(cfg: SynthConfig, rate_rps: float, slo: SLO | str, input_edges, *,
                         replications: int = 8, duration_s: float | None = None,
                         warmup_s: float | None = None, seed: int | None = None) -> CellTruth:
    """Per input-bucket attainment of ``slo`` at ``rate_rps`` over independent runs, counted with
    the pipeline's own definitions (as ``true_attainment``); common random numbers across rates."""
    s = SLO.parse(slo)
    edges = tuple(float(e) for e in input_edges)
    st = steady(cfg, None, s, rate_rps=rate_rps, runs=replications, duration_s=duration_s, warmup_s=warmup_s,
                seed=seed, input_edges=edges)
    n = np.sum(st.cell_n, axis=0, dtype=np.int64)
    g = np.sum(st.cell_good, axis=0, dtype=np.int64)
    return CellTruth(float(rate_rps), str(s), edges, tuple(int(x) for x in n), tuple(int(x) for x in g))


def true_mix_capacity(cfg: SynthConfig, slo: SLO | str, lo_rps: float, hi_rps: float, input_edges, weights, *,
                      tol_rps: float = 0.05, **kw) -> tuple[float, list[CellTruth]]:
    """Largest rate whose per-bucket attainment at the *tested* mix, reweighted to ``weights``
    (Σ_b w_b · A_b(λ)), meets ``slo.attainment``: the quantity mix reweighting estimates
    (docs/mix.md). Bisection with common random numbers; returns (capacity, evaluations)."""
    s = SLO.parse(slo)
    evals = []

    def att(x):
        t = true_cell_attainment(cfg, x, s, input_edges, **kw)
        evals.append(t)
        return t.attainment(weights)

    if att(lo_rps) < s.attainment:
        raise SpecError(f"the low end {lo_rps:g} req/s already misses the SLO at this mix", field="lo_rps",
                        fix="start the bracket at a lower rate")
    if att(hi_rps) >= s.attainment:
        raise SpecError(f"the high end {hi_rps:g} req/s still meets the SLO at this mix", field="hi_rps",
                        fix="end the bracket at a higher rate")
    lo, hi = bisect_crossing(lambda x: att(x) >= s.attainment, lo_rps, hi_rps, tol_rps=tol_rps)
    return 0.5 * (lo + hi), evals
