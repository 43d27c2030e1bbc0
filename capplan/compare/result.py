"""The comparison's result: the metric catalogue, the verdict and the Comparison that prints,
tabulates and draws itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..present import MISSING
from ..slo import SLO
from .gates import Gates


@dataclass(frozen=True)
class MetricSpec:
    """One row kind of the comparison table. ``better`` is the good direction; ``kind`` is
    ``stat`` (bootstrap CI), ``deterministic`` (fails at once) or ``info`` (never gated)."""

    name: str
    label: str
    unit: str
    better: str  # "higher" | "lower"
    kind: str  # "stat" | "deterministic" | "info"


METRICS: dict[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("offered_rps", "offered rate (measured)", "req/s", "higher", "info"),
    MetricSpec("attainment", "SLO attainment (offered)", "fraction", "higher", "stat"),
    MetricSpec("ttft_p99_ms", "TTFT p99", "ms", "lower", "stat"),
    MetricSpec("tpot_p99_ms", "TPOT p99", "ms", "lower", "stat"),
    MetricSpec("itl_p99_ms", "ITL p99 (per-request ITL: the SLO's itl_stat of its gaps)", "ms",
               "lower", "stat"),
    MetricSpec("goodput_rps_per_gpu", "request goodput per GPU", "req/s/GPU", "higher", "stat"),
    MetricSpec("throughput_rps_per_gpu", "completed requests per GPU", "req/s/GPU", "higher",
               "stat"),
    MetricSpec("cslo_rps", "C_SLO (capacity under SLO)", "req/s", "higher", "stat"),
    MetricSpec("error_rate", "failure rate (error+timeout+cancelled)", "fraction", "lower",
               "stat"),
    MetricSpec("reject_rate", "reject rate", "fraction", "lower", "stat"),
    MetricSpec("server_error_rate", "server errors (status error) at steady load", "fraction",
               "lower", "deterministic"),
    MetricSpec("missing_requests", "requests missing from candidate", "requests", "lower",
               "deterministic"),
    MetricSpec("peak_gpu_mem_gib", "peak GPU memory", "GiB", "lower", "deterministic"),
    MetricSpec("energy_j_per_good_request", "energy per SLO-meeting request", "J", "lower", "stat"),
    MetricSpec("cost_usd_per_1k_good", "cost per 1 000 SLO-meeting requests", "USD", "lower",
               "stat"),
    MetricSpec("fair_share_deviation", "fair-share deviation (max |share − entitled|)",
               "fraction", "lower", "stat"),
    MetricSpec("jain_index", "Jain's index of share / entitled", "index", "higher", "info"),
)}

#: quantile rows read from histograms (name -> histogram key in the reduction)
Q_METRICS = {"ttft_p99_ms": "ttft", "tpot_p99_ms": "tpot", "itl_p99_ms": "itl"}
BUCKET_DIMS = ("input_tokens", "max_output_tokens", "output_tokens", "quadrant", "tenant",
               "slo_class")
OTHER_LABEL = "(other)"


@dataclass(frozen=True)
class Verdict:
    """Overall outcome: passed only when no gate failed and (with fail_on_regression) no
    bucket was flagged."""

    passed: bool
    failed: tuple[str, ...]
    flagged_buckets: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_text(self) -> str:
        head = "PASS: every gate passes" if self.passed else "FAIL"
        lines = [head]
        lines += [f"  gate failed: {f}" for f in self.failed]
        lines += [f"  bucket regressed: {f}" for f in self.flagged_buckets]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class Comparison:
    """Result of ``compare``. ``to_frame()`` is the comparison table (scopes: "steady runs",
    "saturated runs", "sweep", "run <id>"); ``buckets`` the bucket table (steady runs);
    ``fairness`` the per-tenant table; ``workload`` one row per matched run (offered facts,
    pairing, the run's family and why); ``verdict`` the gate outcome."""

    table: pd.DataFrame = field(repr=False)
    buckets: pd.DataFrame = field(repr=False)
    fairness: pd.DataFrame = field(repr=False)
    workload: pd.DataFrame = field(repr=False)
    verdict: Verdict
    paired: bool
    slo: SLO
    gates: Gates = field(repr=False)
    baseline_name: str = ""
    candidate_name: str = ""
    reps: int = 0
    seed: int = 0
    confidence_headline: float = 0.975
    confidence_buckets: float = 0.975
    notes: tuple[str, ...] = ()
    #: (baseline, candidate) envelopes of the C_SLO row — ``capplan.envelope.Envelope`` fitted
    #: on the comparison's own reduced statistics (``.stats``: the window, units, cells,
    #: block lengths every row used); None where it could not be fitted
    envelopes: tuple = field(default=(None, None), repr=False, compare=False)

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    def display_frame(self) -> pd.DataFrame:
        """Readable strings for print / export."""
        t = self.table

        def f(v, unit):
            if v is None or (isinstance(v, float) and not np.isfinite(v)):
                return MISSING
            if unit == "fraction":
                return f"{v:.4f}"
            if unit == "requests":
                return f"{v:,.0f}"
            return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"

        out = pd.DataFrame({
            "metric": t["metric"], "scope": t["scope"], "unit": t["unit"],
            "baseline": [f(v, u) for v, u in zip(t["baseline"], t["unit"])],
            "candidate": [f(v, u) for v, u in zip(t["candidate"], t["unit"])],
            "delta": [f(v, u) for v, u in zip(t["delta"], t["unit"])],
            "delta_%": [(MISSING if not np.isfinite(v) else f"{v:+.1f}") for v in t["delta_pct"]],
            "delta CI": [("" if not (np.isfinite(a) and np.isfinite(b)) else
                          f"[{f(a, u)}, {f(b, u)}]")
                         for a, b, u in zip(t["ci_low"], t["ci_high"], t["unit"])],
            "change": t["change"], "gate": t["gate"], "verdict": t["verdict"],
        })
        return out

    def to_text(self) -> str:
        mode = ("PAIRED (same trace rows; the same blocks resampled in both)" if self.paired
                else "independent (block bootstrap per study)")
        parts = [
            f"compare: baseline {self.baseline_name!r} vs candidate {self.candidate_name!r}",
            f"SLO: {self.slo.describe()}",
            f"bootstrap: {mode}; {self.reps} replicates, seed {self.seed}; headline CIs "
            f"simultaneous at {self.confidence_headline:.4g}, bucket CIs simultaneous at "
            f"{self.confidence_buckets:.4g}",
            self.display_frame().to_string(index=False),
        ]
        if len(self.workload) and "family" in self.workload:
            w = self.workload
            fam = [f"  {rb}: {f}" + (f" — {why}" if why else "")
                   for rb, f, why in zip(w["run_baseline"], w["family"], w["why"])]
            parts.append("Run families (decided by the baseline; saturated runs are gated "
                         "separately, their intervals widened by the run-to-run spread)\n"
                         + "\n".join(fam))
        row_notes = [f"  {r.metric} ({r.scope}): {r.note}" for r in self.table.itertuples()
                     if r.note]
        if row_notes:
            parts.append("Row notes\n" + "\n".join(row_notes))
        flagged = self.buckets[self.buckets["flag"] != ""] if len(self.buckets) else self.buckets
        if len(flagged):
            cols = ["scope", "dimension", "bucket", "metric", "n_baseline", "n_candidate",
                    "baseline", "candidate", "delta", "ci_low", "ci_high", "flag"]
            shown = flagged[cols].copy()
            for col in ("baseline", "candidate", "delta", "ci_low", "ci_high"):
                shown[col] = shown[col].map(lambda v: f"{v:.4g}")
            parts.append("Bucket regressions\n" + shown.to_string(index=False, na_rep=MISSING))
        if len(self.fairness):
            parts.append("Tenant fairness (service = weighted tokens; age = max(TTFT, queue))\n"
                         + self.fairness.to_string(index=False, na_rep=MISSING, float_format=lambda v: f"{v:.4g}"))
        if self.notes:
            parts.append("Notes\n" + "\n".join(f"  {n}" for n in self.notes))
        parts.append(self.verdict.to_text())
        return "\n\n".join(parts)

    # ---------------------------------------------------------------- figures

    def figure(self):
        """Deltas with their CIs, one panel row per gated/stat metric (relative to baseline)."""
        import plotly.graph_objects as go

        t = self.table[~self.table["scope"].str.startswith("run ")
                       & np.isfinite(self.table["delta_pct"])]
        base = t["baseline"].abs().replace(0, np.nan)
        lo = 100 * t["ci_low"] / base
        hi = 100 * t["ci_high"] / base
        colors = t["verdict"].map({"FAIL": "crimson", "pass": "seagreen"}).fillna("grey")
        fig = go.Figure(go.Scatter(
            x=t["delta_pct"], y=t["metric"] + " (" + t["scope"] + ")", mode="markers",
            marker=dict(color=colors, size=10),
            error_x=dict(type="data", symmetric=False, array=(hi - t["delta_pct"]).fillna(0),
                         arrayminus=(t["delta_pct"] - lo).fillna(0)),
            hovertext=t["scope"] + ": " + t["verdict"], name="delta"))
        fig.add_vline(x=0, line_dash="dot")
        fig.update_layout(title="candidate − baseline (% of baseline) with simultaneous CI",
                          xaxis_title="delta %", yaxis_title="", height=120 + 40 * len(t))
        return fig

    def figure_buckets(self, metric: str = "ttft_p99_ms", scope: str = "steady runs"):
        """Per-bucket delta and CI for one metric (attainment, error_rate or ttft_p99_ms) of one
        run family, one subplot row per dimension; flagged buckets in red."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        bk = self.buckets
        if len(bk):
            bk = bk[(bk["metric"] == metric) & (bk["scope"] == scope)]
        dims = [d for d in BUCKET_DIMS if len(bk) and (bk["dimension"] == d).any()]
        fig = make_subplots(rows=max(len(dims), 1), cols=1, subplot_titles=dims,
                            vertical_spacing=0.08)
        for i, d in enumerate(dims, start=1):
            s = bk[bk["dimension"] == d]
            color = np.where(s["flag"] != "", "crimson", "steelblue")
            fig.add_trace(go.Scatter(
                x=s["bucket"], y=s["delta"], mode="markers", marker=dict(color=color, size=9),
                error_y=dict(type="data", symmetric=False,
                             array=(s["ci_high"] - s["delta"]).fillna(0),
                             arrayminus=(s["delta"] - s["ci_low"]).fillna(0)),
                name=d, showlegend=False, text=[f"n={a:,}/{b:,}" for a, b in
                                                zip(s["n_baseline"], s["n_candidate"])]), row=i,
                col=1)
            fig.add_hline(y=0, line_dash="dot", row=i, col=1)
        fig.update_layout(title=f"{metric}, {scope}: candidate − baseline by bucket "
                                f"(simultaneous CI)",
                          height=260 * max(len(dims), 1))
        return fig

    def figure_fairness(self):
        """Share of weighted-token service per tenant vs entitled share."""
        import plotly.graph_objects as go

        f = self.fairness
        fig = go.Figure()
        if len(f):
            fig.add_bar(x=f["tenant"], y=f["entitled_share"], name="entitled")
            fig.add_bar(x=f["tenant"], y=f["share_baseline"], name="baseline")
            fig.add_bar(x=f["tenant"], y=f["share_candidate"], name="candidate")
        fig.update_layout(barmode="group", title="tenant share of weighted-token service",
                          yaxis_title="share")
        return fig
