"""The SLO surface: C_SLO (estimate and lower bound) over a grid of TTFT × TPOT (or ITL)
limits, from the same block statistics and the same per-sweep core as the envelope."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import bootstrap as boot
from ..errors import StudyError
from ..reduce import BlockStats
from ..slo import SLO
from .core import SEED_SWEEP, STATUS_BELOW, Points, cslo_from, replicate_counts, sweep


@dataclass(frozen=True)
class Surface:
    """C_SLO over a grid of TTFT × TPOT (or ITL) limits, from the same block statistics."""

    x_metric: str
    y_metric: str
    frame: pd.DataFrame  # x_ms, y_ms, estimate, lower_bound, status
    target: float

    def to_frame(self) -> pd.DataFrame:
        return self.frame.copy()

    def figure(self, value: str = "lower_bound", current: tuple[float | None, float | None] | None = None):
        """Heat map of C_SLO (``value``: lower_bound or estimate) over the limits grid, limits as
        readable categories (ms), each cell labelled; limits where no tested rate meets the
        target ("no capacity") are grey and say so instead of being coloured as 0; ``current``
        (TTFT, TPOT/ITL limit) marks the SLO in use."""
        import plotly.graph_objects as go

        piv = self.frame.pivot(index="y_ms", columns="x_ms", values=value)
        status = self.frame.pivot(index="y_ms", columns="x_ms", values="status")
        z = piv.to_numpy(dtype=float)
        none = (status.to_numpy() == STATUS_BELOW) | ~np.isfinite(z) | (z <= 0)
        xs = [_limit_text(v) for v in piv.columns]
        ys = [_limit_text(v) for v in piv.index]
        label = "lower bound" if value == "lower_bound" else value.replace("_", " ")
        fig = go.Figure(go.Heatmap(
            z=np.where(none, np.nan, z), x=xs, y=ys, colorscale="Viridis", hoverongaps=False,
            colorbar={"title": f"C_SLO {label}<br>(req/s)"}, name=f"C_SLO {label}",
            hovertemplate=f"{self.x_metric.upper()} ≤ %{{x}} ms<br>{self.y_metric.upper()} ≤ %{{y}} ms<br>"
                          f"C_SLO {label} %{{z:.3g}} req/s<extra></extra>"))
        if none.any():
            fig.add_trace(go.Heatmap(
                z=np.where(none, 1.0, np.nan), x=xs, y=ys, colorscale=[[0, "#d0d0d0"], [1, "#d0d0d0"]],
                showscale=False, hoverongaps=False, name="no capacity",
                hovertemplate=f"{self.x_metric.upper()} ≤ %{{x}} ms<br>{self.y_metric.upper()} ≤ %{{y}} ms<br>"
                              "no capacity: even the lowest tested rate misses the target<extra></extra>"))
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="grey: no capacity "
                                     "(even the lowest tested rate misses the target)",
                                     marker={"symbol": "square", "size": 12, "color": "#d0d0d0"}))
        if current is not None and current[0] is not None and current[1] is not None:
            cx = xs[int(np.argmin(np.abs(np.log(np.asarray(piv.columns, float) / current[0]))))]
            cy = ys[int(np.argmin(np.abs(np.log(np.asarray(piv.index, float) / current[1]))))]
            fig.add_trace(go.Scatter(x=[cx], y=[cy], mode="markers", name=(
                f"current SLO ({self.x_metric.upper()} ≤ {current[0]:g} ms, {self.y_metric.upper()} ≤ "
                f"{current[1]:g} ms)"), marker={"symbol": "star", "size": 16, "color": "crimson",
                                                "line": {"color": "white", "width": 1}}))
        fig.update_layout(title=f"C_SLO {label} for other latency limits, at attainment {self.target:g}",
                          xaxis_title=f"{self.x_metric.upper()} limit (ms)",
                          yaxis_title=f"{self.y_metric.upper()} limit (ms)", template="plotly_white",
                          legend={"orientation": "h", "y": -0.22}, height=520)
        fig.update_xaxes(type="category", tickangle=-45)
        fig.update_yaxes(type="category")
        return fig


def _limit_text(v: float) -> str:
    """A grid limit as a readable tick: 3 significant digits, thousands spaced (1 653, 82.6)."""
    if not math.isfinite(v):
        return "none"
    r = float(f"{v:.3g}")
    return f"{r:,.0f}".replace(",", " ") if r >= 100 else f"{r:g}"



def slo_surface(stats: BlockStats, slo: SLO, x_grid=None, y_grid=None, *, confidence=0.95,
                reps=200, seed=0, scheme: boot.Scheme = boot.Circular()) -> Surface:
    """C_SLO (estimate and lower bound) over TTFT × TPOT/ITL limits from the grid counts."""
    g = stats.grid_spec
    xl, yl = g.limits("x"), g.limits("y")
    xi = (np.arange(0, 2 * g.half + 1, 2) if x_grid is None
          else np.array(sorted({g.index("x", float(v)) for v in x_grid})))
    yi = (np.arange(0, 2 * g.half + 1, 2) if y_grid is None
          else np.array(sorted({g.index("y", float(v)) for v in y_grid})))
    diag = stats.diagnostics.set_index("run_id")
    use = [r for r in stats.runs if r.n_units and bool(diag.loc[r.run_id, "usable"])]
    P = xi.size * yi.size
    if not use:
        raise StudyError("no usable run for an SLO surface")
    # replicate good sums for every grid point at once: C @ grid[:, xi, yi]
    gsum = np.empty((reps, len(use), P))
    nsum = np.empty((reps, len(use)))
    kpt = np.empty((len(use), P))
    for j, r in enumerate(use):
        C = replicate_counts(stats, r, reps=reps, seed=seed, scheme=scheme)
        S = r.grid[:, xi][:, :, yi].reshape(r.n_units, P).astype(np.float64)
        gsum[:, j, :] = C @ S
        nsum[:, j] = C @ r.units["n"]
        kpt[j] = S.sum(axis=0)
    n = np.array([r.n for r in use], dtype=float)
    x_rate = np.array([r.measured_rps for r in use])
    level = np.array([r.load_level for r in use])
    closed = stats.closed_loop
    rows = []
    for p in range(P):
        k = kpt[:, p]
        gr = gsum[:, :, p].copy()
        nr_ = nsum.copy()
        for j in range(len(use)):  # degenerate runs: Beta floor as in the main fit
            if k[j] == 0 or k[j] == n[j]:
                rng = np.random.default_rng([int(seed), SEED_SWEEP + 2, j, p])
                ne = n[j]
                d = rng.beta(ne, 1.0, reps) if k[j] == n[j] else rng.beta(1.0, ne, reps)
                gr[:, j] = d * n[j]
                nr_[:, j] = n[j]
        pts = Points(np.array([r.run_id for r in use]), level, x_rate, n, k, gr, nr_, n.copy())
        sw = sweep(pts, slo.attainment, confidence, seed, closed)
        goodput = sw["att"] * sw["x_rate"]
        cs, _, _ = cslo_from(sw, slo.attainment, confidence, closed,
                              sw["A"] * sw["x_rate"][None, :], goodput)
        ix, iy = xi[p // yi.size], yi[p % yi.size]
        rows.append({"x_ms": float(xl[ix]), "y_ms": float(yl[iy]), "estimate": cs.estimate,
                     "ci_low": cs.ci_low, "ci_high": cs.ci_high,
                     "lower_bound": cs.lower_bound, "status": cs.status})
    return Surface("ttft", g.y_metric, pd.DataFrame(rows), slo.attainment)
