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
(``envelope.runs._borrowed_deff``; with ``method="within-run"``, the nearest by load level).

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

from .. import bootstrap as boot
from .. import honesty as hon
from .. import runeffect as rfx
from .. import sketch
from ..errors import SpecError, StudyError
from ..present import MISSING, fmt_num, json_text, json_value, records
from ..reduce import BlockStats, reduce_study
from ..slo import CSLO_CONFIDENCE, CSLO_REPS, CSLO_SEED, SLO, check_confidence, check_reps

# the parts (core: per-sweep fit; runs: per-run table; surface: C_SLO over limits), re-exported
# where callers import them from capplan.envelope
from .core import (CSLO, SEED_SWEEP, STATUS_ABOVE, STATUS_BELOW, STATUS_BRACKETED, Points,
                   cslo_from, knee_and_max, sweep)
from .core import replicate_counts  # noqa: F401  (re-exported)
from .runs import LEVEL_TOL_REL, MIN_DONOR_EVENTS, P_CI  # noqa: F401  (re-exported)
from .runs import group_levels, run_percentiles, run_table
from .surface import Surface, slo_surface

#: interval methods: "run-effect" (default) adds the between-run variation the within-run
#: bootstrap cannot see and targets the mean run (``capplan.runeffect``); "within-run" is the
#: block bootstrap alone, as before 2026-12 (kept for comparison: docs/envelope.md "Coverage")
METHODS = ("run-effect", "within-run")


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



def fit_from_stats(stats: BlockStats, slo: SLO | str, *, confidence: float = CSLO_CONFIDENCE,
                   reps: int = CSLO_REPS, seed: int = CSLO_SEED, scheme: str | boot.Scheme = "circular",
                   block_len: float | None = None, method: str = "run-effect",
                   run_effect: rfx.RunEffect | None = None, rate_noise: bool = True) -> Envelope:
    """The envelope from reduced statistics (the fast path behind ``refit``). ``scheme``: a
    ``capplan.bootstrap`` scheme, or its name (with ``block_len``, requests) mapped once here;
    ``method``: "run-effect" (default) or "within-run" (``METHODS``); ``run_effect``: a known
    between-run SD (e.g. ``RunEffect.from_samples`` of a twin) instead of the sweep's own
    estimate; ``rate_noise``: with the run-effect method, each replicate moves each level's x
    by the realised-rate noise of its runs (``core._x_noise``); False is the rule before issue
    32, kept for the coverage benchmark (benchmarks/coverage_short_runs.py)."""
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
    # first: it also leaves the replicate request totals run_table reads (cached, SLO-free)
    pct = run_percentiles(stats, reps=reps, seed=seed, scheme=scheme,
                           confidence=confidence)
    runs, good_rep, n_rep, err_rep = run_table(stats, slo, good_units, reps=reps, seed=seed,
                                                scheme=scheme, confidence=confidence,
                                                method=method)
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
    pts = Points(run_id=runs["run_id"].to_numpy()[use], level=runs["load_level"].to_numpy(float)[use],
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


def _with_run_effect(pts: Points, target: float, seed: int, effect, rate_var=None):
    """The points with each run's marginal attainment (estimate and replicates) under the
    between-run model of ``capplan.runeffect``; repeats are then averaged, not resampled."""
    rng = np.random.default_rng([int(seed), SEED_SWEEP + 5])
    fit = rfx.apply(pts.n, pts.n_good, pts.x_rate, pts.level, pts.good_rep / pts.n_rep,
                    pts.n / np.maximum(pts.n_eff, 1e-9), target, rng=rng, effect=effect,
                    rate_var=rate_var)
    new = replace(pts, n_good=fit.marginal * pts.n, good_rep=fit.replicates * pts.n_rep)
    return new, fit.effect, fit.used


def _finish(pts: Points, runs: pd.DataFrame, slo, target, confidence, seed, closed, notes,
            iid=False, method: str = "within-run") -> Envelope:
    if pts.n.size == 0:
        raise StudyError("no usable run to fit an envelope",
                         fix="see the diagnostics: " + "; ".join(notes) if notes else None)
    mer = None if slo is None else slo.max_error_rate
    new = method == "run-effect"
    sw = sweep(pts, target, confidence, seed, closed, max_error_rate=mer,
                two_stage=not new or closed)
    x_rate = sw["x_rate"]
    goodput = sw["att"] * x_rate
    goodput_rep = sw["A"] * x_rate[None, :]
    cs, more, vals = cslo_from(sw, target, confidence, closed, goodput_rep, goodput,
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
    knee, mg = knee_and_max(sw["x"], goodput, thr, x_rate)
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
    rng = np.random.default_rng([int(seed), SEED_SWEEP + 3])
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
    pts = Points(runs["run_id"].to_numpy(), s.level, s.level if not s.closed else np.full(m, np.nan),
                  s.n, s.k, gr, np.tile(s.n, (reps, 1)), s.n.copy())
    notes = ["summary-table input: requests assumed independent (iid); with time-correlated "
             "requests the true interval is wider"]
    env = _finish(pts, runs, None, target, confidence, seed, s.closed, notes, iid=True)
    env = replace(env, reps=reps, seed=seed, scheme=boot.IID(), _summary_points=s)
    return replace(env, honesty=_honesty(env))


# ============================================================================ for other analyses

#: the per-run inputs of the sweep fit, for analyses that bring their own replicates
#: (capplan.mix reweights per-cell attainment and fits the result here)
RunPoints = Points


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
