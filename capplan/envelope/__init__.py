"""The SLO capacity envelope: C_SLO, the largest offered rate at which the SLO holds, with a
block-bootstrap confidence interval and the one-sided lower bound a plan should use.

Recipe (docs/statistics.md#the-cslo-interval, measured to cover at the nominal level):
1. per run, a block bootstrap of the per-unit statistics (``capplan.bootstrap`` scheme objects,
   named once at the edge; block length = ``capplan.reduce.block_length``'s rule, the largest
   Politis–White length over the run's 0/1 SLO-good series and its log latencies); runs are
   resampled independently (stratified); a load level with repeats is resampled in two stages
   (repeats, then blocks);
2. a **decreasing** isotonic curve of attainment vs load, weighted by inverse variance
   (weighted PAVA; Robertson, Wright & Dykstra 1988), fitted to the estimate and to every
   replicate;
3. C_SLO = the **first down-crossing** of the target, interpolated on the logit scale between
   the two bracketing load levels, so every lower tested level also passes;
4. percentile interval of the replicate crossings and a one-sided percentile lower bound;
5. an explicit status when the target is not bracketed ("≥ max tested", "< min tested") and
   suggested rates to add when the bracket is wide (the bootstrap cannot see interpolation
   error between grid points).

A run with no failures (or no successes) has nothing to resample; its replicates are drawn
from Beta(N_eff, 1) (or Beta(1, N_eff)), whose quantiles are the Clopper–Pearson bounds at
N_eff (docs/statistics.md#degenerate-runs), so a short perfect run cannot make the interval
collapse. Its N_eff uses the design effect of a non-degenerate usable run at a lower load
(``_borrowed_deff``; with ``method="within-run"``, the nearest by load level).

The default interval (``method="run-effect"``, ``capplan.runeffect``) adds what a within-run
bootstrap cannot see (docs/statistics.md#what-a-within-run-bootstrap-cannot-see): a random run
effect on logit attainment, estimated from the runs near the crossing, in every replicate, and
the mean-run attainment as the estimand; a failing run without a steady state stays in the fit
as evidence against capacity above its rate; every interval contains its estimate; and
``Envelope.honesty`` (``capplan.honesty``) says whether the sweep supports the bound.

With ``SLO.max_error_rate`` a level must also keep its error rate (share of offered requests
not ``ok``, as in ``metrics.summarize``) at or below the limit: an increasing isotonic curve of
the error rate gets the same replicates and crossing machinery, and C_SLO is, per replicate,
the smaller of the two crossings (``CSLO.binding`` says which one gives the estimate).

Closed-loop sweeps (concurrency levels) use the same machinery over concurrency; the capacity
is the achieved goodput rate (req/s) at the highest passing concurrency, flagged closed-loop.
A summary-only table (rate, requests, good requests) fits under an explicit iid assumption.

References: Künsch 1989; Politis & Romano 1992, 1994; Politis & White 2004; Patton, Politis &
White 2009; Davison & Hinkley 1997 §3.8; Clopper & Pearson 1934; Robertson, Wright &
Dykstra 1988; Zhong et al. 2024 (DistServe goodput).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import isotonic_regression

from .. import bootstrap as boot
from .. import honesty as hon
from .. import runeffect as rfx
from .. import sketch
from ..contract import PERCENTILES, ci_cols, pct_col
from ..earlystop import n_min
from ..errors import SpecError, StudyError
from ..present import MISSING, fmt_num, json_text, json_value, records
from ..reduce import BlockStats, reduce_study
from ..slo import CSLO_CONFIDENCE, CSLO_REPS, CSLO_SEED, SLO, check_confidence, check_reps

STATUS_BRACKETED = "bracketed"
STATUS_ABOVE = "≥ max tested"
STATUS_BELOW = "< min tested"
_SEED_SWEEP = 1_000_003  # stream id of the sweep-level draws (independent of run streams)
#: interval methods: "run-effect" (default) adds the between-run variation the within-run
#: bootstrap cannot see and targets the mean run (``capplan.runeffect``); "within-run" is the
#: block bootstrap alone, as before 2026-12 (kept for comparison: docs/envelope.md "Coverage")
METHODS = ("run-effect", "within-run")
#: runs asked at rates closer than this (relative) are one load level: a design that asks for
#: 3 × 10.0871 and 3 × 10.1189 req/s asked for six repeats, and a client cannot tell such rates
#: apart (a 60-s Poisson run realises its rate ± 4 %). 1 %: rates that round to the same three
#: significant digits (``honesty.askable``) join; the demo's 5.4 and 5.5 (1.8 %, one SD of a
#: 600-s run's realised rate) stay apart. docs/envelope.md, "Levels and repeats".
LEVEL_TOL_REL = 0.01
#: the diagnostics reason of a run whose warm-up search found no steady state
from ..diagnostics import NO_STEADY_STATE  # noqa: E402  (the exclusion's reason prefix)
P_CI = 0.99  # the percentile that gets a bootstrap CI in the per-run table


@dataclass(frozen=True)
class CSLO:
    """C_SLO with its interval. ``estimate`` is NaN when status is "< min tested"; with
    "≥ max tested" it is the largest tested rate (a lower bound on the truth)."""

    estimate: float
    ci_low: float
    ci_high: float
    lower_bound: float
    status: str
    confidence: float
    unit: str = "req/s"
    closed_loop: bool = False
    suggested_rates: tuple[float, ...] = ()
    load_at_capacity: float = math.nan  # closed loop: the concurrency that achieves it
    #: the constraint whose crossing is C_SLO: "attainment", "error_rate" (SLO.max_error_rate)
    #: or "" when nothing binds inside the tested range (status "≥ max tested")
    binding: str = "attainment"

    def to_dict(self) -> dict:
        return {k: json_value(v) for k, v in self.__dict__.items()}


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


def _attainment_axis(values, floor: float = 0.01, ceil: float = 0.99999):
    """Attainment on a logit scale (clipped to [floor, ceil], so 0 and 1 can be drawn)."""
    a = np.clip(np.asarray(values, dtype=float), floor, ceil)
    return np.log(a) - np.log1p(-a)


_ATT_TICKS = (0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999)


def _misses(attainment: float) -> str:
    m = float(f"{(1 - attainment) * 1000:.4g}")
    return f"{m:g} miss" + ("" if m == 1 else "es")


@dataclass(frozen=True)
class Envelope:
    """Result of ``fit_envelope``: C_SLO, the per-run table, the fitted curve, diagnostics."""

    slo: SLO | None
    target: float
    cslo: CSLO
    runs: pd.DataFrame
    levels: pd.DataFrame
    diagnostics: pd.DataFrame
    knee: dict
    max_goodput: dict
    stats: BlockStats | None = field(repr=False, default=None)
    notes: tuple[str, ...] = ()
    confidence: float = 0.95
    reps: int = 1000
    seed: int = 0
    #: the bootstrap scheme (``capplan.bootstrap``), with its block-length override
    scheme: boot.Scheme = boot.Circular()
    iid_assumption: bool = False
    #: replicate C_SLO values (req/s; censored: 0 when a replicate fails at the lowest level,
    #: the largest tested level when it passes everywhere — see ``crossing_flags``)
    crossing_replicates: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    #: per replicate: −1 "< min tested", 0 bracketed, +1 "≥ max tested"
    crossing_flags: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=int))
    level_replicates: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0)))
    #: the interval method (``METHODS``) and, for "run-effect", the between-run SD used
    method: str = "within-run"
    run_effect: rfx.RunEffect | None = None
    #: is the lower bound honest here, what it estimates, the runs that would make it so
    honesty: hon.Honesty | None = None

    @property
    def block_len(self) -> float | None:
        """The block length override in requests (None: Politis–White per run)."""
        return self.scheme.block_len

    def settings_note(self) -> str:
        """"" when this is the measured C_SLO's fit (``capplan.slo``'s ``CSLO_*`` settings, the
        run-effect method); else words that label the number as another fit of it, for whoever
        prints it beside the name (docs/envelope.md, "One measured C_SLO")."""
        if (self.reps, self.seed, self.method) == (CSLO_REPS, CSLO_SEED, "run-effect") \
                and abs(self.confidence - CSLO_CONFIDENCE) < 1e-12:
            return ""
        return (f"fitted with {self.reps} bootstrap replicates, seed {self.seed}, {self.confidence:.0%}, method "
                f"{self.method} — not the measured C_SLO's settings ({CSLO_REPS} replicates, seed {CSLO_SEED}, "
                f"{CSLO_CONFIDENCE:.0%}, run-effect: capplan envelope's defaults), so an approximation of it")

    # ------------------------------------------------------------------ views
    #: columns of the run and diagnostics tables in ``to_text`` (those present are shown)
    TEXT_RUN_COLUMNS = ("run_id", "x", "n", "attainment", "att_ci_low", "att_ci_high", "fitted",
                        "design_effect", "n_eff", "usable")
    TEXT_DIAGNOSTIC_COLUMNS = ("run_id", "warmup_s", "warmup_source", "measured_rps",
                               "gen_lag_p99_ms", "littles_ratio", "overloaded", "too_short",
                               "usable")

    def to_text(self, *, tables: bool = True) -> str:
        """The envelope as `capplan envelope` prints it: the SLO, C_SLO with its interval, lower
        bound and status, then (with ``tables``) the per-run table and diagnostics, then the
        notes. A notebook ``print(env.to_text())`` shows the same text."""
        c = self.cslo
        unit = c.unit
        kind = ("closed loop (capacity = goodput at the highest passing concurrency)"
                if c.closed_loop else "open loop")
        lines = [self.honesty.to_text(), ""] if self.honesty is not None else []
        lines += [f"SLO: {self.slo.describe()}" if self.slo is not None
                 else f"attainment target: {self.target:g} (good requests as the input table "
                 "counts them)",
                 f"sweep: {len(self.runs)} runs, {kind}"
                 + ("; iid assumption" if self.iid_assumption else ""),
                 f"C_SLO estimate:   {fmt_num(c.estimate)} {unit}   status: {c.status}",
                 f"{c.confidence:.0%} CI:           [{fmt_num(c.ci_low)}, {fmt_num(c.ci_high)}] {unit}",
                 f"lower bound ({c.confidence:.0%}, one-sided): {fmt_num(c.lower_bound)} {unit}"]
        if self.settings_note() and not self.iid_assumption:
            lines.append(f"({self.settings_note()})")
        if c.closed_loop:
            lines.append(f"at concurrency:   {fmt_num(c.load_at_capacity)}")
        if self.run_effect is not None:
            lines.append(self.run_effect.sentence())
        if c.suggested_rates:
            lines.append("suggested rates to add: " + ", ".join(f"{v:g}" for v in c.suggested_rates))
        if tables:
            cols = [k for k in self.TEXT_RUN_COLUMNS if k in self.runs.columns]
            lines += ["", self.runs[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep=MISSING)]
            if len(self.diagnostics):
                dcols = [k for k in self.TEXT_DIAGNOSTIC_COLUMNS if k in self.diagnostics.columns]
                lines += ["", "diagnostics:", self.diagnostics[dcols].to_string(
                    index=False, float_format=lambda v: f"{v:.4g}", na_rep=MISSING)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_frame(self) -> pd.DataFrame:
        """The per-run table (one row per run, unusable runs included with their reason)."""
        return self.runs.copy()

    def to_dict(self) -> dict:
        """JSON-ready dict: ``cslo`` (nested) plus flattened ``cslo.*`` keys, runs, levels,
        diagnostics, knee, max goodput, notes and the settings."""
        d = {
            "slo": None if self.slo is None else self.slo.to_dict(),
            "target": self.target,
            "cslo": self.cslo.to_dict(),
        }
        for k, v in self.cslo.to_dict().items():
            d[f"cslo.{k}"] = v
        d.update({
            "runs": records(self.runs),
            "levels": records(self.levels),
            "diagnostics": records(self.diagnostics),
            "knee": {k: json_value(v) for k, v in self.knee.items()},
            "max_goodput": {k: json_value(v) for k, v in self.max_goodput.items()},
            "notes": list(self.notes),
            "honesty": None if self.honesty is None else self.honesty.to_dict(),
            "run_effect": None if self.run_effect is None else self.run_effect.to_dict(),
            "settings": {"method": self.method, "confidence": self.confidence, "reps": self.reps,
                         "seed": self.seed, "scheme": self.scheme.name, "block_len": self.block_len,
                         "iid_assumption": self.iid_assumption,
                         "percentile_definition": "log-bucket histogram (α = "
                         f"{self.stats.alpha if self.stats else sketch.DEFAULT_ALPHA:g}), "
                         "inverse-CDF rank with log-uniform interpolation in the bucket"},
        })
        return d

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The envelope as JSON (``present.json_text``: missing values null), written when
        ``path`` is given."""
        return json_text(self.to_dict(), path)

    @property
    def x_label(self) -> str:
        return "concurrency" if self.cslo.closed_loop else "offered rate (req/s)"

    def figure(self):
        """Attainment vs load on a logit scale (0.9 → 0.99 → 0.999 equally tall, so the region
        where the decision is made is visible; 0 and 1 are drawn at the edges), per-run
        attainment with its CI, the isotonic fit with its CI band, the target, and C_SLO: the
        estimate, the lower bound the plan uses and the confidence interval — all in the
        legend."""
        import plotly.graph_objects as go

        r = self.runs[self.runs["usable"]]
        lv = self.levels
        c = self.cslo
        L = _attainment_axis
        fig = go.Figure()
        conf = f"{self.confidence:.0%}"
        fig.add_trace(go.Scatter(x=lv["x"], y=L(lv["ci_high"]), mode="lines", line={"width": 0},
                                 showlegend=False, hoverinfo="skip", legendgroup="band"))
        fig.add_trace(go.Scatter(x=lv["x"], y=L(lv["ci_low"]), mode="lines", line={"width": 0},
                                 fill="tonexty", fillcolor="rgba(31,119,180,0.2)", legendgroup="band",
                                 name=f"{conf} CI of the fitted curve", hoverinfo="skip"))
        att = r["attainment"].to_numpy(float)
        misses = (1 - att) * 1000
        fig.add_trace(go.Scatter(
            x=r["x"], y=L(att), mode="markers", name="runs (attainment with its CI)",
            marker={"size": 8, "symbol": ["triangle-up" if a >= 1 else ("triangle-down" if a <= 0.01 else "circle")
                                          for a in att]},
            customdata=np.stack([att, misses, r["n"].to_numpy(float)], axis=1),
            hovertemplate="%{x:.3f} " + ("" if c.closed_loop else "req/s") + "<br>attainment %{customdata[0]:.4f}"
                          " (%{customdata[1]:.3g} misses per 1 000)<br>%{customdata[2]:,.0f} requests<extra></extra>",
            error_y={"type": "data", "symmetric": False,
                     "array": np.clip(L(r["att_ci_high"]) - L(att), 0, None),
                     "arrayminus": np.clip(L(att) - L(r["att_ci_low"]), 0, None)}))
        fig.add_trace(go.Scatter(x=lv["x"], y=L(lv["fitted"]), mode="lines", name="isotonic fit"))
        x_lo, x_hi = float(np.nanmin(lv["x"])), float(np.nanmax(lv["x"]))
        fig.add_trace(go.Scatter(x=[x_lo, x_hi], y=L([self.target] * 2), mode="lines",
                                 line={"dash": "dash", "color": "crimson"},
                                 name=f"target {self.target:g} ({_misses(self.target)} per 1 000)"))
        y0, y1 = float(L([0.01])[0]), float(L([0.99999])[0])
        if not c.closed_loop and c.ci_low == c.ci_low and c.ci_high == c.ci_high:
            fig.add_trace(go.Scatter(x=[c.ci_low, c.ci_high, c.ci_high, c.ci_low, c.ci_low],
                                     y=[y0, y0, y1, y1, y0], fill="toself", fillcolor="rgba(44,160,44,0.12)",
                                     mode="lines",
                                     line={"width": 0}, hoverinfo="skip",
                                     name=f"C_SLO {conf} interval {c.ci_low:.3g}–{c.ci_high:.3g} {c.unit}"))
        xc = c.load_at_capacity if c.closed_loop else c.estimate
        if xc == xc:
            fig.add_trace(go.Scatter(x=[xc, xc], y=[y0, y1], mode="lines", line={"color": "green"},
                                     name=f"C_SLO estimate {c.estimate:.3g} {c.unit} ({c.status})"))
        if not c.closed_loop and c.lower_bound == c.lower_bound and c.lower_bound > 0:
            fig.add_trace(go.Scatter(x=[c.lower_bound, c.lower_bound], y=[y0, y1], mode="lines",
                                     line={"color": "black", "dash": "dot", "width": 2},
                                     name=f"C_SLO lower bound {c.lower_bound:.3g} {c.unit} (the planning number)"))
        fig.update_layout(title=f"SLO attainment — {self.slo.describe() if self.slo else ''}",
                          xaxis_title=self.x_label, template="plotly_white", height=520,
                          yaxis_title="SLO attainment (stretched near 1)",
                          legend={"orientation": "h", "y": -0.2})
        fig.update_yaxes(tickvals=list(L(_ATT_TICKS)), range=[y0 - 0.3, y1 + 0.3],
                         ticktext=[f"{t:g}" + (f" ({_misses(t)} per 1 000)" if t >= 0.9 else "")
                                   for t in _ATT_TICKS])
        return fig

    def goodput_figure(self):
        """Goodput and throughput (req/s) vs load, with the max-goodput point and the knee."""
        import plotly.graph_objects as go

        lv = self.levels
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=lv["x"], y=lv["throughput_rps"], mode="lines+markers",
                                 name="throughput at the offered rate (completed share × offered rate)"))
        fig.add_trace(go.Scatter(
            x=lv["x"], y=lv["goodput_rps"], mode="lines+markers",
            name="goodput at the offered rate (attainment × offered rate), with its CI",
            error_y={"type": "data", "symmetric": False,
                     "array": (lv["goodput_ci_high"] - lv["goodput_rps"]).clip(lower=0),
                     "arrayminus": (lv["goodput_rps"] - lv["goodput_ci_low"]).clip(lower=0)}))
        if self.max_goodput.get("x") == self.max_goodput.get("x"):
            fig.add_trace(go.Scatter(x=[self.max_goodput["x"]],
                                     y=[self.max_goodput["goodput_rps"]], mode="markers",
                                     marker={"size": 12, "symbol": "star"}, name="max goodput"))
        if self.knee.get("x") == self.knee.get("x"):
            fig.add_vline(x=self.knee["x"], line_dash="dot", annotation_text="knee")
        fig.update_layout(title="Goodput and throughput at the offered rate", xaxis_title=self.x_label,
                          yaxis_title="req/s", template="plotly_white", legend={"orientation": "h", "y": -0.2})
        return fig

    # ------------------------------------------------------------------ what-if
    def refit(self, slo: SLO | str | None = None, attainment: float | None = None) -> "Envelope":
        """Re-fit for a changed SLO limit (TTFT, TPOT/ITL) or target from the cached block
        statistics — no events are read. Same seed ⇒ same numbers. A change the statistics
        cannot serve (e.g. a new E2E limit) re-reduces from the study."""
        if self.stats is None:
            if slo is not None:
                raise SpecError("a summary-table envelope has no latency data to change the SLO")
            return _fit_summary_points(self._summary_points, attainment or self.target,
                                       confidence=self.confidence, reps=self.reps, seed=self.seed)
        new = SLO.parse(slo) if slo is not None else self.slo
        if attainment is not None:
            new = new.with_(attainment=float(attainment))
        if not self.stats.can_serve(new):
            if self.stats.source is None:
                raise SpecError("this SLO changes a limit the reduced statistics cannot vary",
                                fix="call fit_envelope(study, slo) to re-reduce")
            return fit_envelope(self.stats.source, new, confidence=self.confidence,
                                reps=self.reps, seed=self.seed, scheme=self.scheme,
                                warmup=self.stats.window, method=self.method,
                                run_effect=self._given_effect)
        return fit_from_stats(self.stats, new, confidence=self.confidence, reps=self.reps,
                              seed=self.seed, scheme=self.scheme, method=self.method,
                              run_effect=self._given_effect)

    @property
    def _given_effect(self):
        """What a refit keeps of the between-run SD: a given value as it is, a twin's τ (the
        floor the new fit's own estimate is held at); an estimated one is re-estimated for
        the new SLO."""
        e = self.run_effect
        if e is None:
            return None
        if e.source == "twin":  # a fitted twin effect always carries its floor (apply)
            return rfx.RunEffect.fixed(e.twin_tau, "twin")
        return e if e.source == "given" else None

    def surface(self, ttft_ms_grid=None, tpot_ms_grid=None, *, reps: int | None = None) -> Surface:
        """C_SLO over TTFT × TPOT (or ITL) limits (grid values snap to the reduction grid;
        default: every other grid value). ``reps`` defaults to min(self.reps, 200)."""
        if self.stats is None:
            raise SpecError("a summary-table envelope has no latency data for an SLO surface")
        return slo_surface(self.stats, self.slo, ttft_ms_grid, tpot_ms_grid,
                           confidence=self.confidence, reps=reps or min(self.reps, 200),
                           seed=self.seed, scheme=self.scheme)

    _summary_points: object = field(default=None, repr=False, compare=False)


# ============================================================================ helpers

def _logit(p):
    return np.log(p) - np.log1p(-p)


def _count_dtype(n_units: int, max_unit: float):
    # float32 counts and sums are exact only below 2^24 (docs/statistics.md#block-bootstrap)
    return np.float32 if n_units * max(max_unit, 1.0) * 2 < 2**24 else np.float64


def run_counts(stats: BlockStats, run, *, reps: int, seed: int,
               scheme: boot.Scheme) -> np.ndarray:
    """The (reps × units) count matrix of the run's replicates (``BlockStats.resample``),
    for matrix statistics."""
    R = stats.resample(run, scheme, reps=reps, seed=seed)
    return R.counts(_count_dtype(run.n_units, float(run.units["n"].max()) if run.n_units else 1.0))


# ============================================================================ per-sweep core

@dataclass(frozen=True)
class _Points:
    """Per-run inputs of the sweep fit (usable runs only)."""

    run_id: np.ndarray
    level: np.ndarray      # manifest load level (grouping key)
    x_rate: np.ndarray     # req/s at the level (measured offered rate)
    n: np.ndarray
    n_good: np.ndarray
    good_rep: np.ndarray   # (reps × runs)
    n_rep: np.ndarray      # (reps × runs)
    n_eff: np.ndarray
    #: SLO.max_error_rate: per-run error counts (offered requests not ``ok``) and their
    #: replicates (reps × runs), None when the SLO has no error-rate limit
    n_err: np.ndarray | None = None
    err_rep: np.ndarray | None = None
    #: per run, the variance (req/s)² of its realised rate about its asked one
    #: (``_rate_var``); given, each replicate moves each level's x by that noise (``_sweep``)
    rate_var: np.ndarray | None = None


def _sweep(points: _Points, target: float, confidence: float, seed: int, closed_loop: bool,
           max_error_rate: float | None = None, two_stage: bool = True):
    """Stratified (two-stage) bootstrap over levels, isotonic fits, crossings. With
    ``max_error_rate`` (and ``points.err_rep``) the error rate gets the same treatment as an
    increasing curve, and each replicate's C_SLO is the smaller of the two crossings.
    ``two_stage=False``: the repeats at a level are pooled replicate by replicate (their
    replicates already carry the between-run variation)."""
    rng = np.random.default_rng([int(seed), _SEED_SWEEP])
    levels = np.unique(points.level)
    reps = points.good_rep.shape[0]
    m = levels.size
    use_err = max_error_rate is not None and points.err_rep is not None
    A = np.empty((reps, m))
    E = np.empty((reps, m)) if use_err else None
    err = np.full(m, math.nan)
    att = np.empty(m)
    x = np.empty(m)
    xr = np.empty(m)
    nl = np.empty(m)
    neff = np.empty(m)
    nruns = np.empty(m, dtype=np.int64)
    for j, lv in enumerate(levels):
        idx = np.nonzero(points.level == lv)[0]
        nruns[j] = idx.size
        att[j] = points.n_good[idx].sum() / points.n[idx].sum()
        x[j] = lv if closed_loop else np.nanmean(points.x_rate[idx])
        xr[j] = np.nanmean(points.x_rate[idx])
        nl[j] = points.n[idx].sum()
        neff[j] = points.n_eff[idx].sum()
        if use_err:
            err[j] = points.n_err[idx].sum() / points.n[idx].sum()
        if idx.size == 1 or not two_stage:
            A[:, j] = (points.good_rep[:, idx].sum(axis=1) / points.n_rep[:, idx].sum(axis=1))
            if use_err:
                E[:, j] = points.err_rep[:, idx].sum(axis=1) / points.n_rep[:, idx].sum(axis=1)
        else:  # two-stage: resample repeats, then each one's own block replicate
            pick = idx[rng.integers(idx.size, size=(reps, idx.size))]
            row = rng.integers(reps, size=(reps, idx.size))
            A[:, j] = (points.good_rep[row, pick].sum(axis=1)
                       / points.n_rep[row, pick].sum(axis=1))
            if use_err:  # the same repeats and replicates as the attainment
                E[:, j] = (points.err_rep[row, pick].sum(axis=1)
                           / points.n_rep[row, pick].sum(axis=1))
    order = np.argsort(x, kind="stable")
    levels, A, att, x, xr, nl, neff, err, nruns = (
        levels[order], A[:, order], att[order], x[order], xr[order], nl[order], neff[order],
        err[order], nruns[order])
    eps = 0.5 / (nl + 1.0)
    X = x
    if points.rate_var is not None and not closed_loop:
        X = x[None, :] + _x_noise(points, levels, rng, reps)
    fitted, F, w, est, rep = _fit_curve(att, A, nl, neff, x, target, eps, X)
    out = dict(levels=levels, x=x, x_rate=xr, att=att, A=A, fitted=fitted, F=F, n=nl,
               n_eff=neff, n_runs=nruns, w=w, err=err, err_fitted=np.full(m, math.nan), E=E,
               binding_est="attainment", err_binds=np.zeros(reps, dtype=bool))
    if use_err:
        # an increasing error-rate curve ≡ a decreasing ok-share curve 1 − E with target
        # 1 − max_error_rate: the first down-crossing of the latter is the first up-crossing
        # of the former (logit(1 − p) = −logit p, so the interpolation is the same)
        E = E[:, order]
        out["E"] = E
        ofit, OF, _, oest, orep = _fit_curve(1.0 - err, 1.0 - E, nl, neff, x,
                                             1.0 - max_error_rate, eps, X)
        out["err_fitted"] = 1.0 - ofit
        e_est = est[0] if est[1] >= 0 else -1.0
        o_est = oest[0] if oest[1] >= 0 else -1.0
        if o_est < e_est or (oest[1] == -1 and est[1] != -1):
            est, out["binding_est"] = oest, "error_rate"
        binds = orep[0] < rep[0]
        rep = tuple(np.where(binds, b, a) for a, b in zip(rep, orep))
        out["err_binds"] = binds
    if est[1] == 1:
        out["binding_est"] = ""
    out.update(est=(float(est[0]), int(est[1]), int(est[2])), rep_x=rep[0], rep_flag=rep[1],
               rep_i=rep[2])
    return out


def _x_noise(points: _Points, levels: np.ndarray, rng: np.random.Generator,
             reps: int) -> np.ndarray:
    """(reps × levels) draws of the error of each level's x — the mean *measured* rate of its
    runs — as the position of the *asked* rate the truth is defined at: N(0, mean realised-rate
    variance of its runs / their number). A 60-s Poisson run realises its rate ± 4 %; with the
    level's x held fixed, the replicate crossings could not see that the bracketing levels'
    positions are themselves draws (docs/envelope.md, "Short runs from real clients")."""
    rv = np.asarray(points.rate_var, dtype=np.float64)
    sd = np.array([math.sqrt(max(float(np.mean(rv[points.level == lv])), 0.0)
                             / np.count_nonzero(points.level == lv)) for lv in levels])
    return rng.standard_normal((reps, levels.size)) * sd[None, :]


def _fit_curve(att, A, nl, neff, x, target, eps, X=None):
    """Weighted decreasing isotonic fit of a proportion curve (estimate and replicates) and the
    first down-crossings of ``target``: (fitted, F, weights, (x, flag, i), (xs, flags, is)).
    ``X``: the replicates' own level positions (reps × levels; default ``x``)."""
    reps = A.shape[0]
    var = np.nanvar(A, axis=0)
    pt = (att * nl + 0.5) / (nl + 1.0)
    floor = pt * (1 - pt) / np.maximum(neff, 1.0)
    w = 1.0 / np.maximum(var, floor)
    fitted = isotonic_regression(att, weights=w, increasing=False).x
    F = np.empty_like(A)
    for r in range(reps):
        F[r] = isotonic_regression(A[r], weights=w, increasing=False).x
    est_x, est_flag, est_i = _crossing(fitted[None, :], x, target, eps)
    rep = _crossing(F, x if X is None else X, target, eps)
    return fitted, F, w, (float(est_x[0]), int(est_flag[0]), int(est_i[0])), rep


def _crossing(F: np.ndarray, x: np.ndarray, target: float, eps: np.ndarray):
    """First down-crossing of ``target`` by each row of F, interpolated on the logit scale.
    Returns (x*, flag, i) with flag −1 (< min tested; x* = 0), 0 (bracketed), +1 (≥ max
    tested; x* = max x); i is the index of the last passing level (−1 if none). ``x``: the
    levels' positions, shared (levels,) or per row (rows × levels)."""
    X = np.broadcast_to(np.asarray(x, dtype=np.float64), F.shape)
    passing = F >= target
    fail_any = ~passing
    first_fail = np.where(fail_any.any(axis=1), fail_any.argmax(axis=1), F.shape[1])
    out = np.empty(F.shape[0])
    flag = np.zeros(F.shape[0], dtype=np.int64)
    below = first_fail == 0
    above = first_fail == F.shape[1]
    mid = ~below & ~above
    out[below] = 0.0
    flag[below] = -1
    out[above] = X[above, -1]
    flag[above] = 1
    if mid.any():
        i = first_fail[mid]
        rows = np.nonzero(mid)[0]
        f0 = np.clip(F[rows, i - 1], eps[i - 1], 1 - eps[i - 1])
        f1 = np.clip(F[rows, i], eps[i], 1 - eps[i])
        lt = _logit(min(max(target, 1e-12), 1 - 1e-12))
        l0, l1 = _logit(f0), _logit(f1)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(l0 > l1, (l0 - lt) / (l0 - l1), 1.0)
        frac = np.clip(np.nan_to_num(frac, nan=1.0), 0.0, 1.0)
        out[rows] = X[rows, i - 1] + frac * (X[rows, i] - X[rows, i - 1])
    return out, flag, first_fail - 1


def _cslo_from(sw: dict, target: float, confidence: float, closed_loop: bool,
               goodput_rep: np.ndarray | None, goodput: np.ndarray | None,
               run_effect: bool = False):
    est_x, est_flag, est_i = sw["est"]
    x = sw["x"]
    rep_x, rep_flag, rep_i = sw["rep_x"], sw["rep_flag"], sw["rep_i"]
    notes = []
    if closed_loop:
        # capacity = achieved goodput at the highest passing concurrency
        reps = rep_x.size
        vals = np.where(rep_i >= 0, goodput_rep[np.arange(reps), np.maximum(rep_i, 0)], 0.0)
        est = float(goodput[est_i]) if est_i >= 0 else math.nan
        load = float(x[est_i]) if est_i >= 0 else math.nan
    else:
        vals = rep_x
        est = est_x if est_flag >= 0 else math.nan
        load = math.nan
    lo, hi = boot.percentile_ci(vals, confidence)
    lb = boot.lower_bound(vals, confidence)
    if run_effect and est == est:
        # the upper end is Efron's bias-corrected (BC) one: replicate crossings sit mostly
        # below the estimate near a steep crossing (one replica with repeats), which leaves the
        # percentile interval short above (9 of 100 intervals entirely below the truth), and
        # mostly above it on a gentle one (the demo protocol), which leaves it long (0 of 300
        # below the truth). The lower end and the lower bound, the planning side, stay the
        # percentile's, whose coverage was measured (docs/envelope.md, "Coverage"); BC there
        # lowered the one-replica bound's coverage from 0.96 to 0.83.
        hi = boot.bias_corrected_ci(vals, est, confidence)[1]
        if not (lo <= est <= hi and lb <= est):
            # the estimate is a plausible value by construction: an interval of replicate
            # crossings that excludes it (replicates skewed by a bound near 0 or 1) is widened
            notes.append(f"the bootstrap interval [{lo:.3g}, {hi:.3g}] excluded the estimate "
                         f"{est:.3g}; widened to contain it")
            lo, hi, lb = min(lo, est), max(hi, est), min(lb, est)
    if est_flag == 1:
        status = STATUS_ABOVE
        hi = est if not closed_loop else max(hi, est)
        notes.append("every tested level meets the SLO: C_SLO is at least the largest tested "
                     "level; test higher rates to bracket it")
        suggested = tuple(float(f"{x[-1] * f:.3g}") for f in (1.25, 1.5, 2.0))
    elif est_flag == -1:
        status = STATUS_BELOW
        lo, lb = 0.0, min(lb, 0.0) if lb == lb else 0.0
        notes.append("no tested level meets the SLO: C_SLO is below the smallest tested level")
        suggested = tuple(float(f"{x[0] * f:.3g}") for f in (0.25, 0.5, 0.75))
    else:
        status = STATUS_BRACKETED
        suggested = ()
        if not closed_loop:
            i = est_i + 1
            width = x[i] - x[i - 1]
            if width > max(0.1 * est, hi - lo):
                suggested = tuple(float(f"{v:.3g}") for v in np.linspace(x[i - 1], x[i], 5)[1:-1])
                notes.append(f"the bracket [{x[i - 1]:.3g}, {x[i]:.3g}] is wide: interpolation "
                             "error between tested rates is not in the CI; add rates "
                             + ", ".join(f"{v:g}" for v in suggested))
    if status == STATUS_BRACKETED and not closed_loop and "n_runs" in sw and not run_effect:
        i = est_i + 1
        single = [x[j] for j in (i - 1, i) if sw["n_runs"][j] < 2]
        if single:
            notes.append(
                "the rates bracketing C_SLO (" + ", ".join(f"{v:.3g}" for v in single)
                + ") have a single run each: near saturation runs differ far more than a "
                "within-run bootstrap can see, and a single run is usually optimistic (rare "
                "congestion episodes), so the interval and lower bound can be too high; "
                "repeat those rates (≥ 3 runs each) — see docs/envelope.md, 'Coverage'")
    frac_below = float(np.mean(rep_flag == -1))
    if status != STATUS_BELOW and frac_below > (1 - confidence) / 2:
        notes.append(f"{frac_below:.0%} of replicates fail already at the lowest tested level: "
                     "the lower end of the interval is censored at 0")
    binding = sw.get("binding_est", "attainment")
    if sw.get("E") is not None:
        share = float(np.mean(sw["err_binds"]))
        which = {"attainment": "the attainment target binds",
                 "error_rate": "the error-rate limit binds",
                 "": "neither constraint binds inside the tested range"}[binding]
        notes.append(f"{which} at the estimate; the error-rate limit binds in {share:.0%} of "
                     "bootstrap replicates")
    cs = CSLO(estimate=float(est), ci_low=float(lo), ci_high=float(hi), lower_bound=float(lb),
              status=status, confidence=confidence, closed_loop=closed_loop,
              suggested_rates=suggested, load_at_capacity=load, binding=binding)
    return cs, notes, vals


def _knee_and_max(x, goodput, throughput, x_rate) -> tuple[dict, dict]:
    """Max-goodput point, and the saturation knee: the last level before goodput stops
    following load (marginal goodput ΔG/Δλ below one half of the marginal offered rate)."""
    mg = {"x": math.nan, "goodput_rps": math.nan}
    if goodput.size:
        j = int(np.nanargmax(goodput))
        mg = {"x": float(x[j]), "goodput_rps": float(goodput[j]), "offered_rps": float(x_rate[j])}
    knee = {"x": math.nan, "method": "first level where ΔG/Δλ < 0.5 (goodput vs offered rate)"}
    if goodput.size >= 2:
        dx = np.diff(x_rate)
        with np.errstate(invalid="ignore", divide="ignore"):
            slope = np.diff(goodput) / dx
        bad = np.nonzero(slope < 0.5)[0]
        if bad.size:
            knee.update({"x": float(x[bad[0]]), "goodput_rps": float(goodput[bad[0]]),
                         "throughput_rps": float(throughput[bad[0]])})
    return knee, mg


# ============================================================================ from stats

def _run_table(stats: BlockStats, slo: SLO, good_units, *, reps, seed, scheme: boot.Scheme,
               confidence, method: str = "within-run"):
    """Per-run attainment (+ CI, design effect, N_eff, early stopping) and percentiles.

    With ``method="run-effect"``: a run with no failures borrows a design effect only from a
    run at a *lower* load (``_borrowed_deff``), and a run excluded only because its warm-up
    search found no steady state stays in the fit when it fails the target (it is evidence
    against capacity above its rate; ``kept_as_evidence``)."""
    diag = stats.diagnostics.set_index("run_id")
    rows, good_rep, n_rep = [], [], []
    per = []
    with_err = slo.max_error_rate is not None
    err_raw, err_rep = {}, []
    kept = set()
    for r, gu in zip(stats.runs, good_units):
        usable = bool(diag.loc[r.run_id, "usable"]) if r.run_id in diag.index else False
        n = r.n
        k = float(np.sum(gu))
        if (method == "run-effect" and not usable and n and k / n < slo.attainment
                and all(x.startswith(NO_STEADY_STATE)
                        for x in str(diag.loc[r.run_id, "reason"]).split("; "))):
            usable = True  # a failing run without steady state still bounds capacity above
            kept.add(r.run_id)
        if r.n_units == 0 or n == 0:
            per.append((r, usable and False, n, k, None, None, math.nan))
            continue
        a = k / n
        if scheme.independent:  # requests independent: request-level resampling ≡ binomial
            rng_i = np.random.default_rng([int(seed), int(r.run_idx)])
            gr = rng_i.binomial(n, a, size=reps).astype(np.float64)
            nr_ = np.full(reps, float(n))
        else:
            R = stats.resample(r, scheme, reps=reps, seed=seed)
            gr = R.sums(gu)
            key = ("n_rep", id(R))
            nr_ = stats._cache.get(key)
            if nr_ is None:  # SLO-independent: computed once per replicate set
                nr_ = stats._cache[key] = R.sums(r.units["n"])
        att_rep = gr / nr_
        deff = boot.design_effect(float(np.var(att_rep)), a, n)
        per.append((r, usable, n, k, gr, nr_, deff))
        if with_err:
            bad_u = r.units["n"] - r.units["n_ok"]
            if scheme.independent:  # own stream: the attainment draws above are unchanged
                rng_e = np.random.default_rng([int(seed), _SEED_SWEEP + 4, int(r.run_idx)])
                err_raw[r.run_id] = rng_e.binomial(n, bad_u.sum() / n, size=reps) / n
            else:  # replicate error *rates*, so they pair with whatever denominators follow
                err_raw[r.run_id] = R.sums(bad_u) / nr_
    donors = _deff_donors(per)
    below_only = method == "run-effect"
    rng = np.random.default_rng([int(seed), _SEED_SWEEP + 1])
    rng_err = np.random.default_rng([int(seed), _SEED_SWEEP + 4])
    for r, usable, n, k, gr, nr_, deff in per:
        a = k / n if n else math.nan
        degenerate = gr is not None and (k == 0 or k == n)
        if deff == deff:
            d_used, d_src = deff, "own"
        else:
            d_used, d_src = _borrowed_deff(r.load_level, donors, below_only=below_only)
        neff = boot.n_effective(n, d_used) if n else 0.0
        if gr is not None:
            if degenerate:  # Clopper–Pearson floor at N_eff (docs/statistics.md#degenerate-runs)
                keff = a * neff
                lo, hi = boot.clopper_pearson(keff, neff, confidence)
                draws = (rng.beta(max(neff, 1.0), 1.0, size=reps) if k == n
                         else rng.beta(1.0, max(neff, 1.0), size=reps))
                gr = draws * n
                nr_ = np.full(reps, float(n))
            else:
                lo, hi = boot.percentile_ci(gr / nr_, confidence)
        else:
            lo = hi = math.nan
        n_err = float(n - r.units["n_ok"].sum()) if r.n_units else 0.0
        if with_err:
            er = err_raw.get(r.run_id)
            if er is not None and gr is not None and (n_err == 0 or n_err == n):
                # no errors (or only errors): nothing to resample; Beta floor at N_eff,
                # scaled to the run's own replicate denominators
                ne = max(neff, 1.0)
                d = rng_err.beta(1.0, ne, size=reps) if n_err == 0 else rng_err.beta(ne, 1.0,
                                                                                      size=reps)
                er = d
            err_rep.append(er * nr_ if er is not None else np.full(reps, math.nan))
        bad_eff = int(round((n - k) * neff / n)) if n else 0
        need = n_min(slo.attainment, bad_eff, 0.99) if n else 0
        row = {
            "run_id": r.run_id, "load_level": r.load_level, "offered_rps": r.offered_rps,
            "concurrency": r.concurrency, "repeat": r.repeat,
            "measured_rps": r.measured_rps,
            "n": n, "n_good": int(k), "n_ok": int(r.units["n_ok"].sum()) if r.n_units else 0,
            "attainment": a, "att_ci_low": lo, "att_ci_high": hi,
            "n_errors": int(n_err), "error_rate": n_err / n if n else math.nan,
            "ci_floor": "clopper-pearson" if degenerate else "",
            "design_effect": deff, "design_effect_used": max(d_used, 1.0) if n else math.nan,
            "design_effect_source": d_src if n else "", "n_eff": neff,
            "early_stop_ok": bool(neff >= need), "early_stop_n_min": need,
            "block_len": 1.0 if scheme.independent else scheme.pw_length(r.block_len),
            "block_len_good": (scheme.pw_length(r.block_len_good) if r.block_len_good
                               is not None and not scheme.independent else math.nan),
            "block_len_latency": (scheme.pw_length(r.block_len_latency) if
                                  r.block_len_latency is not None and not scheme.independent
                                  else math.nan),
            "block_metric": r.block_metric,
            "unit_size": r.unit_size, "warmup_s": r.warmup_s,
            "duration_s": r.warmup_s + r.span_s if r.span_s == r.span_s else math.nan,
            "usable": usable,
            "reason": ("" if r.run_id in kept else str(diag.loc[r.run_id, "reason"]))
            if r.run_id in diag.index else "no data",
            "warnings": "; ".join(w for w in (
                str(diag.loc[r.run_id, "warnings"]) if r.run_id in diag.index else "",
                "no steady state (MSER-5) but it fails the target: kept as evidence against "
                "capacity above its rate" if r.run_id in kept else "") if w),
            "kept_as_evidence": r.run_id in kept,
        }
        for st in ("rejected", "timeout", "error", "cancelled"):
            row[f"n_{st}"] = int(r.units[f"st_{st}"].sum()) if r.n_units else 0
        rows.append(row)
        if gr is not None:
            good_rep.append(gr)
            n_rep.append(nr_)
        else:
            good_rep.append(np.full(reps, math.nan))
            n_rep.append(np.full(reps, math.nan))
    E = (np.column_stack(err_rep) if err_rep else np.zeros((reps, 0))) if with_err else None
    return pd.DataFrame(rows), np.column_stack(good_rep) if good_rep else np.zeros((reps, 0)), \
        np.column_stack(n_rep) if n_rep else np.zeros((reps, 0)), E


#: a run lends its design effect to a degenerate run only with at least this many of its
#: rarer outcome: with one event the block-bootstrap design effect is exactly 1 whatever the
#: clustering (the event's draw count is ~Poisson(1)), and with a few isolated events ≈ 1.
MIN_DONOR_EVENTS = 5


def _deff_donors(per) -> list[tuple[float, float, str]]:
    """(load level, design effect, run_id) of the runs whose design effect can be lent to a
    degenerate run, in order of preference: usable runs with ≥ MIN_DONOR_EVENTS of each
    outcome; else usable non-degenerate runs; else any non-degenerate run."""
    def pick(cond):
        return [(float(r.load_level), float(d), r.run_id) for r, u, n, k, gr, nr_, d in per
                if d == d and cond(u, n, k)]

    for cond in (lambda u, n, k: u and min(k, n - k) >= MIN_DONOR_EVENTS,
                 lambda u, n, k: u, lambda u, n, k: True):
        ok = pick(cond)
        if ok:
            return ok
    return []


def _borrowed_deff(level: float, donors, below_only: bool = False) -> tuple[float, str]:
    """Design effect for a run with no failures (or no successes), whose own bootstrap
    variance is zero: that of the nearest non-degenerate run by load level, ties to the
    lower level (the run most like it in load, not a sweep-wide median dominated by
    near-saturation runs). With no donor at all, 1 (iid), said in the source.

    ``below_only`` (the run-effect method): only a run at a lower or equal load may lend.
    Stated prior: violations where none were seen cluster no more than at the nearest load
    below with violations (congestion episodes grow with load); with no such run, requests
    are taken as independent — the run's own data (n requests, none failed) then give the
    Clopper–Pearson bound at n. Lending the design effect of an overloaded run above (≈ 45)
    to a light-load run left it N_eff ≈ 6 and an attainment interval [0.54, 1] that its data
    do not justify (docs/statistics.md#degenerate-runs)."""
    lv = float(level)
    if below_only:
        donors = [d for d in donors if d[0] <= lv]
        if not donors:
            return 1.0, "none below: iid (no lower-load run with both outcomes)"
    if not donors:
        return 1.0, "none: iid (no run with both outcomes)"
    best = min(donors, key=lambda t: (abs(t[0] - lv), t[0]))
    return max(best[1], 1.0), f"nearest run {best[2]}"


def _percentile_table(stats: BlockStats, *, reps, seed, scheme: boot.Scheme, confidence):
    """SLO-independent per-run percentiles (+ p99 CI), cached on the stats."""
    key = ("pct", reps, seed, scheme, confidence)
    if key in stats._cache:
        return stats._cache[key]
    rows = []
    for r in stats.runs:
        row = {"run_id": r.run_id}
        C = (run_counts(stats, r, reps=reps, seed=seed, scheme=scheme)
             if r.n_units and r.tail else None)
        for m in ("ttft", "tpot", "itl", "e2e"):
            for p in PERCENTILES:
                row[pct_col(m, p)] = r.percentile(m, p, stats.alpha)
            lo = hi = math.nan
            tail = r.tail.get(m)
            if tail is not None and r.n_units:
                k0, h, below = tail
                q = boot.quantile_replicates(C, h, k0, P_CI, stats.alpha,
                                             below=below)
                lo, hi = boot.percentile_ci(q, confidence)
            ci_lo, ci_hi = ci_cols(pct_col(m, P_CI, unit=""))
            row[ci_lo], row[ci_hi] = lo, hi
        lag = r.hist.get("gen_lag_ms")
        row["gen_lag_p99_ms"] = (float(sketch.quantile_from_counts(lag[1], lag[0], 0.99, stats.alpha))
                                 if lag else math.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    stats._cache[key] = df
    return df


def group_levels(asked, tol_rel: float = LEVEL_TOL_REL, span_s=None) -> np.ndarray:
    """The load level of each run: runs whose asked rates lie within a tolerance of their
    neighbour (single linkage on the sorted distinct rates) share one level, placed at the
    run-weighted mean of their asked rates. The tolerance is ``tol_rel``, or — given the runs'
    measured lengths ``span_s`` — one standard deviation of the rate a Poisson run of that
    length realises (1/√(λ·T) relative) when that is larger: a 60-s run at 10 req/s lands ± 4 %
    from its asked rate, so runs asked 2–3 % apart cannot be told apart by the data and, as
    separate one-run levels, gave intervals too narrow (the simulated short-run loop's lower
    bound covered 0.77). Levels are *what was asked*; the fit's x is each level's mean
    *measured* rate."""
    a = np.asarray(asked, dtype=np.float64)
    out = a.copy()
    u = np.unique(a[np.isfinite(a)])
    if u.size < 2:
        return out
    span = None
    if span_s is not None:
        sp = np.asarray(span_s, dtype=np.float64)
        ok = np.isfinite(sp) & (sp > 0)
        span = float(np.median(sp[ok])) if ok.any() else None
    start = 0
    for i in range(1, u.size + 1):
        tol = tol_rel
        if span is not None and i < u.size:
            tol = max(tol_rel, hon.rate_noise_rel(u[i - 1], span))
        if i == u.size or u[i] > u[i - 1] * (1.0 + tol):
            grp = u[start:i]
            if grp.size > 1:
                sel = np.isin(a, grp)
                out[sel] = float(np.mean(a[sel]))
            start = i
    return out


def fit_from_stats(stats: BlockStats, slo: SLO | str, *, confidence: float = CSLO_CONFIDENCE,
                   reps: int = CSLO_REPS, seed: int = CSLO_SEED, scheme: str | boot.Scheme = "circular",
                   block_len: float | None = None, method: str = "run-effect",
                   run_effect: rfx.RunEffect | None = None, rate_noise: bool = True) -> Envelope:
    """The envelope from reduced statistics (the fast path behind ``refit``). ``scheme``: a
    ``capplan.bootstrap`` scheme, or its name (with ``block_len``, requests) mapped once here;
    ``method``: "run-effect" (default) or "within-run" (``METHODS``); ``run_effect``: a known
    between-run SD (e.g. ``RunEffect.from_samples`` of a twin) instead of the sweep's own
    estimate; ``rate_noise``: with the run-effect method, each replicate moves each level's x
    by the realised-rate noise of its runs (``_x_noise``); False is the rule before issue 32,
    kept for the coverage benchmark (benchmarks/coverage_short_runs.py)."""
    slo = SLO.parse(slo)
    scheme = boot.scheme_from_name(scheme, block_len)
    if method not in METHODS:
        raise SpecError(f"unknown interval method {method!r}", field="method",
                        fix="use " + " or ".join(METHODS))
    check_confidence(confidence, "confidence")
    notes = []
    exact = stats.can_serve(slo) and slo.same_limits(stats.slo)
    if not exact:
        eff = stats.effective_slo(slo)
        if eff != slo:
            notes.append(f"limits snapped to the reduction grid: {eff}")
        slo = eff
    good_units = stats.good_units(slo)
    runs, good_rep, n_rep, err_rep = _run_table(stats, slo, good_units, reps=reps, seed=seed,
                                                scheme=scheme, confidence=confidence,
                                                method=method)
    pct = _percentile_table(stats, reps=reps, seed=seed, scheme=scheme,
                            confidence=confidence)
    runs = runs.merge(pct, on="run_id", how="left")
    closed = stats.closed_loop
    runs["x"] = runs["concurrency"] if closed else runs["measured_rps"].fillna(runs["offered_rps"])
    runs["asked_rps"] = runs["load_level"]
    if not closed:  # repeats asked at rates a client cannot tell apart share one level
        grouped = group_levels(runs["load_level"].to_numpy(float),
                               span_s=[r.span_s for r in stats.runs])
        for lv in np.unique(grouped[grouped != runs["load_level"].to_numpy(float)]):
            ids = runs.loc[grouped == lv, "run_id"].tolist()
            notes.append(f"runs {', '.join(ids)} were asked at rates closer than a run "
                         f"realises its rate (or 1 %): one level ({lv:.4g} req/s), treated as "
                         "repeats")
        runs["load_level"] = grouped
    runs["goodput_rps"] = runs["measured_rps"] * runs["attainment"]
    runs["throughput_rps"] = runs["measured_rps"] * runs["n_ok"] / runs["n"]
    use = runs["usable"].to_numpy(bool)
    for rid, reason in runs.loc[~use, ["run_id", "reason"]].itertuples(index=False):
        notes.append(f"run {rid} excluded: {reason}")
    for rid, w in runs.loc[use, ["run_id", "warnings"]].itertuples(index=False):
        if w:
            notes.append(f"run {rid}: {w}")
    pts = _Points(run_id=runs["run_id"].to_numpy()[use], level=runs["load_level"].to_numpy(float)[use],
                  x_rate=runs["measured_rps"].to_numpy(float)[use], n=runs["n"].to_numpy(float)[use],
                  n_good=runs["n_good"].to_numpy(float)[use], good_rep=good_rep[:, use],
                  n_rep=n_rep[:, use], n_eff=runs["n_eff"].to_numpy(float)[use],
                  n_err=runs["n_errors"].to_numpy(float)[use],
                  err_rep=None if err_rep is None else err_rep[:, use])
    effect = None
    if method == "run-effect" and not closed and pts.n.size:
        rv = _rate_var(stats)[use]
        pts, effect, used = _with_run_effect(pts, slo.attainment, seed, run_effect, rv)
        if rate_noise:
            pts = replace(pts, rate_var=rv)
        runs["tau_window"] = False
        runs.loc[use, "tau_window"] = used
    env = _finish(pts, runs, slo, slo.attainment, confidence, seed, closed, notes,
                  method=method)
    env = replace(env, stats=stats, reps=reps, seed=seed, scheme=scheme,
                  diagnostics=stats.diagnostics.copy(), method=method, run_effect=effect)
    return replace(env, honesty=_honesty(env))


def _near_rates(env: Envelope) -> tuple[float, ...]:
    """The tested rates bracketing the estimate (the top two when it is above the range)."""
    x = env.levels["x"].to_numpy(float)
    c = env.cslo
    if c.status == STATUS_BELOW or x.size == 0:
        return ()
    if c.status == STATUS_ABOVE:
        return tuple(float(v) for v in x[-2:])
    est = c.load_at_capacity if c.closed_loop else c.estimate
    i = int(np.searchsorted(x, est, side="right"))
    return tuple(float(v) for v in x[max(i - 1, 0): i + 1])


def _honesty(env: Envelope) -> hon.Honesty:
    """``capplan.honesty.assess`` on a fitted envelope. Repeats near the crossing are the runs
    of a bracketing level, or — whatever rate they were asked at — the usable runs whose
    measured rates lie within ``honesty.neighbourhood`` of the estimate."""
    near = _near_rates(env)
    runs = env.runs
    use = runs[runs["usable"]]
    win = use[use["tau_window"]] if "tau_window" in use.columns else use.iloc[:0]
    lv = env.levels
    at = lv["x"].round(9).isin([round(v, 9) for v in near])
    rep_near = int(lv.loc[at, "n_runs"].max()) if near else 0
    c = env.cslo
    if (not c.closed_loop and c.status == STATUS_BRACKETED and c.estimate == c.estimate
            and len(use) and {"duration_s", "warmup_s"} <= set(use.columns)):
        span = float(use["duration_s"].astype(float).median()) - float(
            use["warmup_s"].astype(float).fillna(0.0).median())
        h = hon.neighbourhood(c.estimate, span)
        around = int((np.abs(use["x"].astype(float) - c.estimate) <= h).sum())
        rep_near = max(rep_near, around)
    level_runs = {round(float(k), 9): int(v)
                  for k, v in use.groupby("load_level").size().items()}
    return hon.assess(
        method=env.method, status=c.status, iid=env.iid_assumption, estimate=c.estimate,
        lower_bound=c.lower_bound, runs=runs.assign(x=runs["x"].astype(float)),
        near_rates=tuple(float(v) for v in lv["x"] if any(abs(v - u) < 1e-9 for u in near)),
        n_near=int(((win["n_good"] > 0) & (win["n_good"] < win["n"])).sum()) if len(win) else 0,
        effect_source="none" if env.run_effect is None else env.run_effect.source,
        repeats_near=rep_near, target=env.target, suggested_rates=c.suggested_rates,
        near_levels=tuple(float(v) for v in lv.loc[at, "load_level"]),
        level_runs=level_runs, bracket=_bracket(env), ci_width=c.ci_high - c.ci_low)


def _bracket(env: Envelope) -> tuple[float, float] | None:
    """The x of the two levels an open-loop, bracketed estimate is interpolated between."""
    c = env.cslo
    if c.closed_loop or c.status != STATUS_BRACKETED or not c.estimate == c.estimate:
        return None
    x = env.levels["x"].to_numpy(float)
    i = int(np.searchsorted(x, c.estimate, side="right"))
    if i <= 0 or i >= x.size:
        return None
    return float(x[i - 1]), float(x[i])


def _rate_var(stats: BlockStats) -> np.ndarray:
    """Per run, the variance of its realised rate about the nominal one: the index of
    dispersion of the sweep's arrivals (the mean over its runs: one arrival process) × rate /
    span (``capplan.runeffect.realized_rate_var``)."""
    idc = [rfx.dispersion_index(r.units["t0"], r.units["n"]) for r in stats.runs
           if r.n_units and "t0" in r.units]
    idc = [v for v in idc if v == v]
    pooled = float(np.mean(idc)) if idc else math.nan
    return rfx.realized_rate_var(pooled, [r.measured_rps for r in stats.runs],
                                 [r.span_s for r in stats.runs])


def _with_run_effect(pts: _Points, target: float, seed: int, effect, rate_var=None):
    """The points with each run's marginal attainment (estimate and replicates) under the
    between-run model of ``capplan.runeffect``; repeats are then averaged, not resampled."""
    rng = np.random.default_rng([int(seed), _SEED_SWEEP + 5])
    fit = rfx.apply(pts.n, pts.n_good, pts.x_rate, pts.level, pts.good_rep / pts.n_rep,
                    pts.n / np.maximum(pts.n_eff, 1e-9), target, rng=rng, effect=effect,
                    rate_var=rate_var)
    new = replace(pts, n_good=fit.marginal * pts.n, good_rep=fit.replicates * pts.n_rep)
    return new, fit.effect, fit.used


def _finish(pts: _Points, runs: pd.DataFrame, slo, target, confidence, seed, closed, notes,
            iid=False, method: str = "within-run") -> Envelope:
    if pts.n.size == 0:
        raise StudyError("no usable run to fit an envelope",
                         fix="see the diagnostics: " + "; ".join(notes) if notes else None)
    mer = None if slo is None else slo.max_error_rate
    new = method == "run-effect"
    sw = _sweep(pts, target, confidence, seed, closed, max_error_rate=mer,
                two_stage=not new or closed)
    x_rate = sw["x_rate"]
    goodput = sw["att"] * x_rate
    goodput_rep = sw["A"] * x_rate[None, :]
    cs, more, vals = _cslo_from(sw, target, confidence, closed, goodput_rep, goodput,
                                run_effect=new)
    # throughput per level (ok share × rate), from the run table
    thr = []
    for lv in sw["levels"]:
        rr = runs[(runs["load_level"] == lv) & runs["usable"]]
        thr.append(float((rr["measured_rps"] * rr["n_ok"] / rr["n"]).mean()))
    thr = np.asarray(thr)
    glo, ghi = np.nanpercentile(goodput_rep, [100 * (1 - confidence) / 2,
                                              100 * (1 + confidence) / 2], axis=0)
    alo, ahi = np.nanpercentile(sw["A"], [100 * (1 - confidence) / 2,
                                          100 * (1 + confidence) / 2], axis=0)
    levels = pd.DataFrame({
        "load_level": sw["levels"], "x": sw["x"], "offered_rps": x_rate, "n_runs": sw["n_runs"],
        "n": sw["n"],
        "n_eff": sw["n_eff"], "attainment": sw["att"], "ci_low": alo, "ci_high": ahi,
        "fitted": sw["fitted"], "weight": sw["w"], "goodput_rps": goodput,
        "goodput_ci_low": glo, "goodput_ci_high": ghi, "throughput_rps": thr,
    })
    if sw["E"] is not None:
        elo, ehi = np.nanpercentile(sw["E"], [100 * (1 - confidence) / 2,
                                              100 * (1 + confidence) / 2], axis=0)
        levels["error_rate"] = sw["err"]
        levels["error_ci_low"], levels["error_ci_high"] = elo, ehi
        levels["error_fitted"] = sw["err_fitted"]
    if new and not closed:
        # the table shows what was measured; the fit used each level's mean-run attainment
        ok = runs[runs["usable"]].groupby("load_level")[["n_good", "n"]].sum()
        levels["mean_run_attainment"] = levels["attainment"]
        levels["attainment"] = [float(ok.loc[lv, "n_good"] / ok.loc[lv, "n"]) for lv in
                                levels["load_level"]]
    fit_map = dict(zip(sw["levels"], sw["fitted"]))
    runs = runs.copy()
    runs["fitted"] = [fit_map.get(lv, math.nan) if u else math.nan
                      for lv, u in zip(runs["load_level"], runs["usable"])]
    knee, mg = _knee_and_max(sw["x"], goodput, thr, x_rate)
    return Envelope(slo=slo, target=float(target), cslo=cs, runs=runs, levels=levels,
                    diagnostics=pd.DataFrame(), knee=knee, max_goodput=mg, stats=None,
                    notes=tuple(notes + more), confidence=confidence, iid_assumption=iid,
                    crossing_replicates=vals, crossing_flags=sw["rep_flag"],
                    level_replicates=sw["A"])


# ============================================================================ public entry

def fit_envelope(study, slo, *, confidence: float = CSLO_CONFIDENCE, reps: int = CSLO_REPS,
                 seed: int = CSLO_SEED,
                 scheme: str | boot.Scheme = "circular", block_len: float | None = None,
                 warmup="manifest", stats: BlockStats | None = None,
                 method: str = "run-effect", run_effect: rfx.RunEffect | None = None) -> Envelope:
    """Fit the SLO capacity envelope of a sweep. With its defaults (``capplan.slo``'s
    ``CSLO_*`` settings, the run-effect method, circular blocks, the manifest's warm-up) this is
    "the measured C_SLO" every command and page prints under that name (docs/envelope.md, "One
    measured C_SLO").

    ``study``: a Study or a path; ``slo``: an SLO or ``"ttft_ms=2000,attainment=0.99"``;
    ``scheme``: "circular" (default), "stationary", "iid" or a ``capplan.bootstrap`` scheme;
    ``block_len`` (requests) overrides Politis–White; ``warmup``: a ``metrics.Window``, or
    "manifest" (manifest warmup_s, else MSER-5), "mser", "none", seconds or {run_id: seconds};
    ``stats``: a precomputed ``reduce_study`` result to skip reading events (its window is
    then the one used); ``method``: "run-effect" (default: between-run variation included,
    docs/envelope.md "Coverage") or "within-run"; ``run_effect``: a known between-run SD
    (``capplan.runeffect.RunEffect``, e.g. from a twin).
    """
    slo = SLO.parse(slo)
    check_reps(reps, "reps")
    scheme = boot.scheme_from_name(scheme, block_len)  # the name becomes an object here, once
    if stats is None or not stats.can_serve(slo):
        stats = reduce_study(study, slo, warmup=warmup)
    return fit_from_stats(stats, slo, confidence=confidence, reps=reps, seed=seed,
                          scheme=scheme, method=method, run_effect=run_effect)


# ============================================================================ SLO surface

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
        C = run_counts(stats, r, reps=reps, seed=seed, scheme=scheme)
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
                rng = np.random.default_rng([int(seed), _SEED_SWEEP + 2, j, p])
                ne = n[j]
                d = rng.beta(ne, 1.0, reps) if k[j] == n[j] else rng.beta(1.0, ne, reps)
                gr[:, j] = d * n[j]
                nr_[:, j] = n[j]
        pts = _Points(np.array([r.run_id for r in use]), level, x_rate, n, k, gr, nr_, n.copy())
        sw = _sweep(pts, slo.attainment, confidence, seed, closed)
        goodput = sw["att"] * sw["x_rate"]
        cs, _, _ = _cslo_from(sw, slo.attainment, confidence, closed,
                              sw["A"] * sw["x_rate"][None, :], goodput)
        ix, iy = xi[p // yi.size], yi[p % yi.size]
        rows.append({"x_ms": float(xl[ix]), "y_ms": float(yl[iy]), "estimate": cs.estimate,
                     "ci_low": cs.ci_low, "ci_high": cs.ci_high,
                     "lower_bound": cs.lower_bound, "status": cs.status})
    return Surface("ttft", g.y_metric, pd.DataFrame(rows), slo.attainment)


# ============================================================================ summary table

_RATE_NAMES = ("offered_rps", "rate", "rate_rps", "load_level", "concurrency", "qps", "rps")
_N_NAMES = ("n", "requests", "n_requests", "total")
_GOOD_NAMES = ("n_good", "good", "good_requests", "good_count")


def _pick(df: pd.DataFrame, names, what: str) -> str:
    low = {c.lower(): c for c in df.columns}
    for nme in names:
        if nme in low:
            return low[nme]
    raise SpecError(f"summary table has no {what} column (looked for {', '.join(names)})",
                    fix="columns: offered_rps, requests, good_requests")


@dataclass(frozen=True)
class _Summary:
    level: np.ndarray
    n: np.ndarray
    k: np.ndarray
    closed: bool


def fit_summary_table(df_or_path, slo_target, *, confidence: float = 0.95, reps: int = 1000,
                      seed: int = 0) -> Envelope:
    """Envelope from a table of (rate, requests, good requests) — e.g. a published attainment
    table — under an explicit **iid assumption** (requests independent: binomial replicates;
    the true interval is wider when requests are time-correlated)."""
    if isinstance(df_or_path, (str, os.PathLike)):
        p = Path(df_or_path)
        if not p.is_file():
            raise SpecError(f"summary table not found: {p}")
        df = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
    else:
        df = pd.DataFrame(df_or_path)
    rate = _pick(df, _RATE_NAMES, "rate")
    ncol = _pick(df, _N_NAMES, "requests")
    gcol = _pick(df, _GOOD_NAMES, "good requests")
    target = slo_target.attainment if isinstance(slo_target, SLO) else float(
        SLO.parse(slo_target).attainment if isinstance(slo_target, str) else slo_target)
    n = df[ncol].to_numpy(float)
    k = df[gcol].to_numpy(float)
    if (n <= 0).any() or (k < 0).any() or (k > n).any():
        raise SpecError("summary table needs requests > 0 and 0 ≤ good ≤ requests")
    s = _Summary(df[rate].to_numpy(float), n, k, rate.lower() == "concurrency")
    return _fit_summary_points(s, target, confidence=confidence, reps=reps, seed=seed)


def _fit_summary_points(s: _Summary, target, *, confidence, reps, seed) -> Envelope:
    rng = np.random.default_rng([int(seed), _SEED_SWEEP + 3])
    m = s.n.size
    gr = np.empty((reps, m))
    rows = []
    for j in range(m):
        nj, kj = s.n[j], s.k[j]
        if kj == nj:
            gr[:, j] = rng.beta(nj, 1.0, reps) * nj
            lo, hi = boot.clopper_pearson(kj, nj, confidence)
        elif kj == 0:
            gr[:, j] = rng.beta(1.0, nj, reps) * nj
            lo, hi = boot.clopper_pearson(kj, nj, confidence)
        else:
            gr[:, j] = rng.binomial(int(nj), kj / nj, reps)
            lo, hi = boot.percentile_ci(gr[:, j] / nj, confidence)
        rows.append({"run_id": f"row{j}", "load_level": s.level[j],
                     "offered_rps": None if s.closed else s.level[j],
                     "concurrency": s.level[j] if s.closed else None,
                     "measured_rps": math.nan if s.closed else s.level[j], "n": int(nj),
                     "n_good": int(kj), "n_ok": int(nj), "attainment": kj / nj,
                     "att_ci_low": lo, "att_ci_high": hi, "design_effect": 1.0, "n_eff": nj,
                     "usable": True, "reason": "", "warnings": ""})
    runs = pd.DataFrame(rows)
    runs["x"] = runs["load_level"]
    runs["goodput_rps"] = runs["measured_rps"] * runs["attainment"]
    runs["throughput_rps"] = runs["measured_rps"]
    pts = _Points(runs["run_id"].to_numpy(), s.level, s.level if not s.closed else np.full(m, np.nan),
                  s.n, s.k, gr, np.tile(s.n, (reps, 1)), s.n.copy())
    notes = ["summary-table input: requests assumed independent (iid); with time-correlated "
             "requests the true interval is wider"]
    env = _finish(pts, runs, None, target, confidence, seed, s.closed, notes, iid=True)
    env = replace(env, reps=reps, seed=seed, scheme=boot.IID(), _summary_points=s)
    return replace(env, honesty=_honesty(env))


# ============================================================================ for other analyses

#: the per-run inputs of the sweep fit, for analyses that bring their own replicates
#: (capplan.mix reweights per-cell attainment and fits the result here)
RunPoints = _Points


def envelope_from_points(points: RunPoints, runs: pd.DataFrame, slo, target: float, *, confidence: float,
                         seed: int, closed: bool, notes=(), method: str = "within-run",
                         stats: BlockStats | None = None,
                         run_effect: rfx.RunEffect | None = None) -> Envelope:
    """The sweep fit — weighted isotonic curve, first down-crossing, interval, lower bound,
    status — of per-run replicates an analysis computed itself (docs/mix.md, "Reweighting"),
    with the bound's honesty. ``method="run-effect"`` adds the between-run variation exactly as
    ``fit_from_stats`` does (``runs``: one row per point, in order, with the run table's columns;
    ``stats``: the reduction the points came from, for each run's realised-rate noise);
    "within-run" keeps the analysis's own replicates (honesty: optimistic)."""
    if method not in METHODS:
        raise SpecError(f"unknown interval method {method!r}", field="method", fix="use " + " or ".join(METHODS))
    runs = runs.copy()
    effect = None
    if method == "run-effect" and not closed and points.n.size:
        rv = np.zeros(points.n.size)
        if stats is not None:
            by_id = dict(zip([r.run_id for r in stats.runs], _rate_var(stats)))
            rv = np.array([by_id.get(r, 0.0) for r in points.run_id], dtype=np.float64)
        points, effect, used = _with_run_effect(points, target, seed, run_effect, rv)
        points = replace(points, rate_var=rv)  # the levels' positions, as in fit_from_stats
        runs["tau_window"] = False
        runs.loc[runs["usable"].to_numpy(bool), "tau_window"] = used
    env = _finish(points, runs, slo, target, confidence, seed, closed, list(notes), method=method)
    env = replace(env, method=method, run_effect=effect)
    return replace(env, honesty=_honesty(env))
