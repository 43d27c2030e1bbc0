"""Exploration figures for notebook 1: funnel, offered vs achieved rate, latency CDFs and time
series per run, breakdown heat maps.

Pure functions: frames in (from ``capplan.metrics``: ``summarize(...).to_frame()``,
``request_frame``, ``breakdown``), a ``plotly.graph_objects.Figure`` out; nothing is computed
here that a number in a table depends on. Envelope and plan figures live with their modules
(``Envelope.figure()``, ``Plan.figure()``). Large runs are thinned for display only (the ECDF
keeps its tail), so a report page stays small.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .contract import pct_label

#: Funnel stages: (summary column, label), in order.
FUNNEL_STAGES: tuple[tuple[str, str], ...] = (
    ("n_offered", "offered"), ("n_admitted", "admitted"), ("n_started", "started"),
    ("n_first_token", "first token"), ("n_completed", "completed"), ("n_good", "SLO-good"),
)
METRIC_LABELS = {
    "ttft_ms": "TTFT (ms)", "ttft_sent_ms": "TTFT from send (ms)", "tpot_ms": "TPOT (ms)",
    "itl_p99_ms": "ITL p99 per request (ms)", "itl_max_ms": "ITL max per request (ms)",
    "e2e_ms": "E2E latency (ms)", "gen_lag_ms": "generator lag (ms)", "queue_ms": "queue (ms)",
}
LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=20, t=60, b=50),
              legend=dict(title=None))


def run_label(row) -> str:
    """'r03 · 4 rps' (open loop) or 'c03 · conc 16' (closed loop)."""
    rid = row["run_id"]
    rps = row.get("offered_rps")
    if rps is not None and not pd.isna(rps):
        return f"{rid} · {rps:g} rps"
    conc = row.get("concurrency")
    if conc is not None and not pd.isna(conc):
        return f"{rid} · conc {int(conc)}"
    return str(rid)


def _labels(summary: pd.DataFrame) -> list[str]:
    return [run_label(r) for r in summary.to_dict("records")]


def _load_axis(summary: pd.DataFrame) -> tuple[pd.Series, str]:
    if summary["offered_rps"].notna().all():
        return summary["offered_rps"], "offered rate, nominal (req/s)"
    if "concurrency" in summary and summary["concurrency"].notna().all():
        return summary["concurrency"], "concurrency"
    return pd.Series(range(len(summary)), index=summary.index), "run"


def funnel_figure(summary: pd.DataFrame) -> go.Figure:
    """Grouped bars per run: offered → admitted → started → first token → completed
    (→ SLO-good when the summary has an SLO). A drop between stages is where requests were
    lost (rejected, failed, unfinished)."""
    labels = _labels(summary)
    fig = go.Figure()
    for col, name in FUNNEL_STAGES:
        if col in summary:
            fig.add_bar(name=name, x=labels, y=summary[col].astype(float),
                        hovertemplate="%{x}<br>" + name + ": %{y:,}<extra></extra>")
    fig.update_layout(**LAYOUT, title="Request funnel per run (steady window)", barmode="group",
                      xaxis_title="run", yaxis_title="requests")
    return fig


def rates_figure(summary: pd.DataFrame) -> go.Figure:
    """Measured offered, achieved and (with an SLO) goodput rate against the nominal load.
    Achieved below offered means the system could not keep up; the dotted diagonal is
    'achieved = nominal'."""
    x, x_title = _load_axis(summary)
    fig = go.Figure()
    series = [("measured_offered_rps", "offered (measured)", "circle"),
              ("achieved_rps", "achieved (completed/s)", "square"),
              ("goodput_rps", "goodput (SLO-good/s)", "diamond")]
    text = _labels(summary)
    for col, name, symbol in series:
        if col in summary:
            fig.add_scatter(x=x, y=summary[col], name=name, mode="lines+markers",
                            marker_symbol=symbol, text=text,
                            hovertemplate="%{text}<br>" + name + ": %{y:.3f} req/s<extra></extra>")
    if x_title.startswith("offered"):
        hi = float(np.nanmax(x)) if len(x) else 1.0
        fig.add_scatter(x=[0, hi], y=[0, hi], mode="lines", name="nominal",
                        line=dict(dash="dot", color="grey"), hoverinfo="skip")
    fig.update_layout(**LAYOUT, title="Offered vs achieved rate", xaxis_title=x_title,
                      yaxis_title="rate (req/s)")
    return fig


def thin_ecdf(values, max_points: int = 600) -> pd.DataFrame:
    """ECDF (value, cdf) of finite values, thinned for display to at most ~max_points rows:
    half spread evenly, half packed towards the tail (p99, p99.9 stay visible)."""
    x = np.sort(np.asarray(pd.Series(values, dtype="float64").dropna(), dtype=float))
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return pd.DataFrame({"value": [], "cdf": []})
    if n > max_points:
        half = max(max_points // 2, 2)
        levels = np.concatenate([np.linspace(0.0, 1.0, half),
                                 1.0 - np.logspace(np.log10(1.0 / n), 0.0, half)])
        idx = np.unique(np.clip(np.ceil(levels * n).astype(int) - 1, 0, n - 1))
    else:
        idx = np.arange(n)
    return pd.DataFrame({"value": x[idx], "cdf": (idx + 1) / n})


def latency_cdf_figure(frames: Mapping[str, pd.DataFrame], metric: str = "ttft_ms", *,
                       limit_ms: float | None = None, ok_only: bool = True,
                       max_points: int = 600, log_x: bool = True) -> go.Figure:
    """Empirical CDF of one per-request metric, one line per run (``frames``: run label →
    request frame). Only completed requests have latencies; the SLO limit is a vertical line."""
    label = METRIC_LABELS.get(metric, metric)
    fig = go.Figure()
    for name, df in frames.items():
        d = df[df["status"] == "ok"] if ok_only and "status" in df else df
        e = thin_ecdf(d[metric], max_points=max_points)
        if log_x:  # a log axis cannot place 0; the CDF heights still count those requests
            e = e[e["value"] > 0]
        fig.add_scatter(x=e["value"], y=e["cdf"], name=str(name), mode="lines",
                        line_shape="hv",
                        hovertemplate=str(name) + "<br>%{x:.1f} ms<br>F = %{y:.4f}<extra></extra>")
    if limit_ms is not None:
        # annotations on a log axis take log10 coordinates (shapes take data values)
        fig.add_vline(x=limit_ms, line_dash="dash", line_color="crimson")
        fig.add_annotation(x=np.log10(limit_ms) if log_x else limit_ms, y=1.0, yref="paper",
                           text=f"SLO {limit_ms:g} ms", showarrow=False, xanchor="left",
                           yanchor="bottom", font=dict(color="crimson"))
    fig.update_layout(**LAYOUT, title=f"{label}: CDF per run (completed requests)",
                      xaxis_title=label, yaxis_title="fraction of requests ≤ x")
    if log_x:
        fig.update_xaxes(type="log")
    return fig


def binned_quantile(df: pd.DataFrame, metric: str, *, bin_s: float = 5.0,
                    q: float = 0.99) -> pd.DataFrame:
    """Per time bin (by scheduled time ``t_s``): the q-quantile of ``metric`` over completed
    requests and the request count. Columns t_s (bin start), value, n."""
    if bin_s <= 0:
        raise ValueError("bin_s must be > 0")
    d = df[df["status"] == "ok"] if "status" in df else df
    d = d[["t_s", metric]].dropna()
    if d.empty:
        return pd.DataFrame({"t_s": [], "value": [], "n": []})
    b = (np.floor(d["t_s"].to_numpy(float) / bin_s) * bin_s)
    g = d.assign(t_bin=b).groupby("t_bin")[metric]
    return pd.DataFrame({"t_s": g.quantile(q).index.to_numpy(float),
                         "value": g.quantile(q).to_numpy(float),
                         "n": g.size().to_numpy(int)})


def latency_timeseries_figure(frames: Mapping[str, pd.DataFrame], metric: str = "ttft_ms", *,
                              bin_s: float = 5.0, q: float = 0.99,
                              limit_ms: float | None = None,
                              warmup_s: float | None = None) -> go.Figure:
    """The q-quantile of a metric per ``bin_s`` bin of scheduled time, one line per run: a
    climbing line is a queue that never drains (overload), a hump at the start is warm-up."""
    label = METRIC_LABELS.get(metric, metric)
    fig = go.Figure()
    for name, df in frames.items():
        s = binned_quantile(df, metric, bin_s=bin_s, q=q)
        fig.add_scatter(x=s["t_s"], y=s["value"], name=str(name), mode="lines",
                        customdata=s["n"],
                        hovertemplate=str(name) + "<br>t = %{x:.0f} s<br>%{y:.1f} ms"
                                                  "<br>n = %{customdata}<extra></extra>")
    if limit_ms is not None:
        # annotations on a log axis take log10 coordinates (shapes take data values)
        fig.add_hline(y=limit_ms, line_dash="dash", line_color="crimson")
        fig.add_annotation(y=np.log10(limit_ms), x=0.0, xref="paper", text=f"SLO {limit_ms:g} ms",
                           showarrow=False, xanchor="left", yanchor="bottom",
                           font=dict(color="crimson"))
    if warmup_s:
        fig.add_vrect(x0=0, x1=warmup_s, fillcolor="grey", opacity=0.12, line_width=0,
                      annotation_text="warm-up", annotation_position="top left")
    pct = pct_label(q)
    fig.update_layout(**LAYOUT, title=f"{label}: {pct} per {bin_s:g} s of scheduled time",
                      xaxis_title="scheduled time since run start (s)", yaxis_title=label)
    fig.update_yaxes(type="log")
    return fig


def breakdown_figure(table: pd.DataFrame, key: str, value: str = "attainment_offered", *,
                     run_order: list[str] | None = None, title: str | None = None,
                     fmt: str = ".3f") -> go.Figure:
    """Heat map of ``value`` per run (columns) and ``key`` group (rows) from a
    ``metrics.breakdown`` frame: where in the mix (long prompts, one tenant) the SLO breaks
    first. Cell text shows the value and N."""
    if key not in table:
        raise KeyError(f"breakdown frame has no column {key!r}")
    runs = run_order or list(dict.fromkeys(table["run_id"]))
    keys = list(dict.fromkeys(table[key]))
    z = table.pivot_table(index=key, columns="run_id", values=value, aggfunc="first",
                          sort=False).reindex(index=keys, columns=runs)
    n = table.pivot_table(index=key, columns="run_id", values="n_offered", aggfunc="first",
                          sort=False).reindex(index=keys, columns=runs)
    text = [[("" if pd.isna(v) else format(v, fmt)) + ("" if pd.isna(c) else f"<br>N={int(c)}")
             for v, c in zip(zr, cr)] for zr, cr in zip(z.to_numpy(), n.to_numpy())]
    scale = "RdYlGn" if value.startswith("attainment") else "Viridis"
    fig = go.Figure(go.Heatmap(z=z.to_numpy(float), x=runs, y=[str(k) for k in keys],
                               text=text, texttemplate="%{text}", colorscale=scale,
                               colorbar=dict(title=value),
                               hovertemplate="run %{x}<br>" + key + " %{y}<br>"
                                             + value + " %{z:" + fmt + "}<extra></extra>"))
    fig.update_layout(**LAYOUT, title=title or f"{value} by {key} and run",
                      xaxis_title="run", yaxis_title=key)
    fig.update_yaxes(type="category")
    fig.update_xaxes(type="category")
    return fig


def quarters_figure(quarters: pd.DataFrame) -> go.Figure:
    """Plan by quarter (``Plan.quarters_frame()``): GPUs as bars, planned peak (and the
    forecast mean, when the demand came from a forecast) as lines on a second axis; hover
    shows cost per quarter."""
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    q = quarters["quarter"].astype(str)
    fig.add_bar(x=q, y=quarters["gpus"], name="GPUs", customdata=quarters["cost_usd_per_quarter"],
                text=quarters["gpus"], textposition="outside",
                hovertemplate="%{x}: %{y} GPUs<br>$%{customdata:,.0f} per quarter<extra></extra>",
                secondary_y=False)
    fig.add_scatter(x=q, y=quarters["peak_rps"], name="planned peak (req/s)",
                    mode="lines+markers", secondary_y=True)
    mean = quarters.get("forecast_mean_rps")
    if mean is not None and pd.Series(mean).notna().any():
        fig.add_scatter(x=q, y=mean, name="forecast mean (req/s)", mode="lines+markers",
                        line=dict(dash="dot"), secondary_y=True)
    fig.update_layout(**LAYOUT, title="Plan by quarter: GPUs and planned peak demand")
    fig.update_yaxes(title_text="GPUs", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="req/s", secondary_y=True, rangemode="tozero", showgrid=False)
    return fig


def format_number(v) -> str:
    """Readable number for report tables: whole numbers without decimals, thousands
    separators, 4 significant digits for small values; text passes through."""
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return "n/a"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        x = float(v)
        if not np.isfinite(x):
            return str(x)
        if x.is_integer() and abs(x) < 1e15:
            return f"{x:,.0f}"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 1:
            return f"{x:,.4g}"
        return f"{x:.4g}"
    return str(v)


def styled(df: pd.DataFrame):
    """A report table: no index, numbers through :func:`format_number`, text left-aligned."""
    st = df.style.hide(axis="index").format(format_number)
    text = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])
            or pd.api.types.is_bool_dtype(df[c])]
    if text:
        st = st.set_properties(subset=text, **{"text-align": "left"})
    return st


def replace_figure(widget, fig) -> None:
    """Put a new figure's traces and layout into a displayed ``go.FigureWidget`` in one update
    (panels redraw in place this way)."""
    with widget.batch_update():
        widget.data = ()
        widget.add_traces(list(fig.data))
        widget.layout = fig.layout
