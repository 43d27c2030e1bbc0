"""Production burstiness against the sweep's: measured dispersion, and the burst factor a plan
sizes its peak with (docs/plan.md, "Production burstiness").

A sweep measures C_SLO under its own arrival process (usually Poisson). A production whose
requests come in bursts fills the queue faster at the same mean rate, so a peak forecast as a
mean rate per window under-states the load the fleet sees inside the window. Two numbers
describe the burstiness at a time scale w:

* the CV of the gaps between arrivals (1 for Poisson, 1/sqrt(k) for gamma gaps of shape k);
* the index of dispersion of the counts in windows of w seconds, D(w) = Var N(w) / E N(w)
  (1 for Poisson; for a renewal process D(w) → CV² as w grows).

The burst factor sizes for the p-quantile of the count in a window at the planned peak. With
the counts approximated as normal with mean μ = λ·w and variance D·μ, that quantile over the
mean is 1 + z_p·sqrt(D/μ). The sweep already absorbed its own fluctuation, so the factor the
plan applies is relative to the sweep's dispersion D_sweep:

    f = (1 + z_p·sqrt(D_prod/μ)) / (1 + z_p·sqrt(D_sweep/μ)),   never below 1.

This is option (b) of sizing with burstiness (a factor), not a re-fit of the envelope on the
twin with production's arrival process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from .contract import pct_label
from .errors import SpecError

#: production counts as covered by the sweep while its D is within 10 % of the most dispersed
#: tested run's: a Poisson sweep and a Poisson production differ by sampling error alone
COVER_TOLERANCE = 0.10


def gap_cv(t_s: np.ndarray) -> float:
    """Coefficient of variation of the gaps between sorted arrival times (s); NaN under 3 rows."""
    t = np.sort(np.asarray(t_s, dtype=float))
    if len(t) < 3:
        return float("nan")
    g = np.diff(t)
    m = float(g.mean())
    return float(g.std() / m) if m > 0 else float("nan")


def counts_in_windows(t_s: np.ndarray, window_s: float) -> np.ndarray:
    """Arrivals in consecutive whole windows of ``window_s`` from the first arrival (a partial
    last window is dropped: it would read as a lull)."""
    t = np.sort(np.asarray(t_s, dtype=float))
    if len(t) == 0:
        return np.zeros(0, np.int64)
    n_win = int(math.floor((t[-1] - t[0]) / window_s))
    if n_win < 1:
        return np.zeros(0, np.int64)
    idx = np.floor((t - t[0]) / window_s).astype(np.int64)
    return np.bincount(idx[idx < n_win], minlength=n_win)


def dispersion(counts: np.ndarray) -> float:
    """Index of dispersion Var/Mean of window counts (1 for Poisson); NaN under 10 windows."""
    c = np.asarray(counts, dtype=float)
    if len(c) < 10 or c.mean() <= 0:
        return float("nan")
    return float(c.var(ddof=1) / c.mean())


def aggregate_counts(per_s: np.ndarray, window_s: float) -> np.ndarray:
    """Per-second counts summed into windows of ``window_s`` whole seconds (a partial last
    window is dropped)."""
    w = int(round(window_s))
    if w < 1 or abs(w - window_s) > 1e-9:
        raise SpecError(f"a per-second rate series gives windows of whole seconds, got {window_s}",
                        field="demand.arrivals.window_s", fix="window_s: 1 (or another whole number)")
    c = np.asarray(per_s, dtype=float)
    n = len(c) // w
    return c[: n * w].reshape(n, w).sum(axis=1)


@dataclass(frozen=True)
class BurstMeasure:
    """Burstiness of one arrival process at one time scale."""

    dispersion: float  # D(w) = Var N(w) / E N(w)
    window_s: float
    gap_cv: float | None  # None for a per-second series (no gaps) or a given number
    source: str  # where it came from, in words

    def to_dict(self) -> dict:
        return {"dispersion": self.dispersion, "window_s": self.window_s, "gap_cv": self.gap_cv,
                "source": self.source}


def measure_times(t_s: np.ndarray, window_s: float, source: str) -> BurstMeasure:
    """Burstiness of arrival times (s)."""
    return BurstMeasure(dispersion(counts_in_windows(t_s, window_s)), window_s, gap_cv(t_s), source)


def measure_per_second(per_s: np.ndarray, window_s: float, source: str) -> BurstMeasure:
    """Burstiness of a per-second request count series."""
    return BurstMeasure(dispersion(aggregate_counts(per_s, window_s)), window_s, None, source)


def burst_factor(d_prod: float, d_sweep: float, mean_count: float, quantile: float) -> float:
    """f = (1 + z_p·sqrt(D_prod/μ)) / (1 + z_p·sqrt(D_sweep/μ)), at least 1 (module docstring)."""
    if not (mean_count > 0):
        raise ValueError(f"mean count per window must be > 0, got {mean_count}")
    z = float(norm.ppf(quantile))
    f = (1 + z * math.sqrt(max(d_prod, 0.0) / mean_count)) / (1 + z * math.sqrt(max(d_sweep, 0.0) / mean_count))
    return max(1.0, f)


@dataclass(frozen=True)
class BurstComparison:
    """Production against the sweep at the plan's peak: the factor and whether the sweep covers
    production (``covered``: production's D is within the most dispersed tested run's)."""

    production: BurstMeasure
    sweep_max_dispersion: float
    sweep_source: str
    peak_rps: float
    quantile: float
    factor: float
    covered: bool

    @property
    def sentence(self) -> str:
        p, w = self.production, self.production.window_s
        if not self.covered:
            return (f"not honest: production is burstier (D={p.dispersion:.3g} at {w:g} s) than anything tested "
                    f"(max D={self.sweep_max_dispersion:.3g}, {self.sweep_source}); the peak is sized with a burst "
                    f"factor of {self.factor:.4g} ({pct_label(self.quantile)} of the {w:g}-s count), an extrapolation "
                    "— sweep at production's arrival process to confirm it")
        return (f"production's burstiness (D={p.dispersion:.3g} at {w:g} s) is within the sweep's "
                f"(max D={self.sweep_max_dispersion:.3g}, {self.sweep_source}); burst factor {self.factor:.4g}")


def compare_burstiness(production: BurstMeasure, sweep_dispersions: list[float], sweep_source: str, peak_rps: float,
                       quantile: float = 0.99) -> BurstComparison:
    """Production's burstiness against the tested runs' (their dispersion at the same window);
    the factor is relative to the most dispersed tested run; covered within ``COVER_TOLERANCE``."""
    d_sweep = [d for d in sweep_dispersions if np.isfinite(d)]
    if not d_sweep:
        d_sweep = [1.0]
        if not sweep_source.startswith("Poisson assumed"):
            sweep_source = f"Poisson assumed: no tested run's dispersion was measured ({sweep_source})"
    dmax = float(max(d_sweep))
    mu = peak_rps * production.window_s
    f = burst_factor(production.dispersion, dmax, mu, quantile)
    return BurstComparison(production, dmax, sweep_source, float(peak_rps), float(quantile), f,
                           covered=bool(production.dispersion <= dmax * (1 + COVER_TOLERANCE)))


# ----------------------------------------------------------------------------- from a plan spec

ARRIVAL_KEYS = ("trace", "format", "per_second", "column", "dispersion", "cv", "window_s", "quantile")


def production_from_spec(arrivals: dict) -> BurstMeasure:
    """Production's burstiness from ``demand.arrivals`` (validated by ``capplan.plan.spec``): a trace
    (Azure CSV / Mooncake JSONL), a per-second count series (CSV, ``column``), a measured
    dispersion, or the gap CV of a gamma renewal process (D = CV², its long-window limit)."""
    w = float(arrivals.get("window_s", 1.0))
    f = "demand.arrivals"
    if arrivals.get("trace"):
        from .sim.arrivals import load_trace

        try:
            tr = load_trace(arrivals["trace"], arrivals.get("format", "auto"))
        except SpecError as exc:  # name the plan spec's field, not the sweep's
            raise SpecError(exc.message, file=exc.file, field=f"{f}.trace", fix=exc.fix) from None
        m = measure_times(tr.t_s, w, f"trace {tr.path} ({tr.n:,} requests over {tr.span_s:,.0f} s)")
    elif arrivals.get("per_second"):
        import pandas as pd

        path, col = arrivals["per_second"], arrivals.get("column", "count")
        try:
            df = pd.read_csv(path)
        except FileNotFoundError:
            raise SpecError("per-second rate series not found", file=str(path), field=f"{f}.per_second",
                            fix="give a CSV with one row per second and a count column") from None
        if col not in df.columns:
            raise SpecError(f"per-second series lacks column {col!r}", file=str(path), field=f"{f}.column",
                            fix="columns: " + ", ".join(map(str, df.columns)))
        per_s = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        if not np.isfinite(per_s).all() or (per_s < 0).any():
            raise SpecError(f"column {col!r} holds a missing, non-numeric or negative count", file=str(path),
                            field=f"{f}.column", fix="one non-negative request count per second")
        m = measure_per_second(per_s, w, f"per-second series {path} ({len(per_s):,} s)")
    elif arrivals.get("dispersion") is not None:
        m = BurstMeasure(float(arrivals["dispersion"]), w, None, "index of dispersion given in the spec")
    else:
        cv = float(arrivals["cv"])
        m = BurstMeasure(cv * cv, w, cv, f"gap CV {cv:g} given in the spec: D = CV² (a renewal process's "
                                         "long-window limit)")
    if not np.isfinite(m.dispersion):
        raise SpecError(f"production's dispersion cannot be measured at {w:g}-s windows: fewer than 10 whole "
                        "windows", field=f"{f}.window_s", fix="a longer trace or series, or a shorter window_s")
    return m


def sweep_dispersions(study, window_s: float) -> tuple[list[float], str]:
    """Dispersion of the scheduled sends of each open-loop tested run (≥ 50 requests) at
    ``window_s``, and a sentence saying where they came from."""
    if study is None:
        return [], "Poisson assumed: no study given"
    from .twin.data import load_study

    data = load_study(study)
    if data.load_model != "open":
        return [], "Poisson assumed: the study is closed-loop"
    ds = []
    for run in data.runs:
        s = run.sched[run.in_window]
        if len(s) >= 50:
            ds.append(measure_times(s / 1e9, window_s, run.run_id).dispersion)
    ok = [d for d in ds if np.isfinite(d)]
    if not ok:
        return [], (f"Poisson assumed: no open-loop tested run holds 50 requests and 10 whole "
                    f"{window_s:g}-s windows")
    return ok, f"{len(ok)} open-loop tested run{'s' if len(ok) != 1 else ''} at {window_s:g} s"
