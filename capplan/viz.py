"""Exploration figures for notebook 1: funnel, offered vs achieved rate, latency CDFs and time
series per run, breakdown heat maps.

Pure functions: frames in (from ``capplan.metrics``: ``summarize(...).to_frame()``,
``request_frame``, ``breakdown``), a ``plotly.graph_objects.Figure`` out; nothing is computed
here that a number in a table depends on. Envelope and plan figures live with their modules
(``Envelope.figure()``, ``Plan.figure()``). Large runs are thinned for display only (the ECDF
keeps its tail), so a report page stays small.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .contract import pct_label
from .glossary import for_readers
from .present import MISSING

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


#: Run colours: a qualitative palette (Plotly's ten); past ten runs the colours repeat with
#: another dash, so no two runs of a page look the same.
RUN_COLOURS: tuple[str, ...] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
RUN_DASHES: tuple[str, ...] = ("solid", "dash", "dot", "dashdot")


def run_style(i: int) -> dict:
    """The line of the i-th run (0-based): a colour, and a dash once the colours repeat."""
    return dict(color=RUN_COLOURS[i % len(RUN_COLOURS)],
                dash=RUN_DASHES[(i // len(RUN_COLOURS)) % len(RUN_DASHES)])


def text_colour(fill: str) -> str:
    """Black or white, whichever reads better on ``fill`` ('#rrggbb' or 'rgb(r, g, b)'): the
    WCAG relative luminance against the mid-point of the two contrasts."""
    from plotly.colors import hex_to_rgb, unlabel_rgb

    rgb = hex_to_rgb(fill) if fill.startswith("#") else unlabel_rgb(fill)
    lin = [(c / 255) / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "black" if lum > 0.179 else "white"


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
    for i, (name, df) in enumerate(frames.items()):
        d = df[df["status"] == "ok"] if ok_only and "status" in df else df
        e = thin_ecdf(d[metric], max_points=max_points)
        if log_x:  # a log axis cannot place 0; the CDF heights still count those requests
            e = e[e["value"] > 0]
        fig.add_scatter(x=e["value"], y=e["cdf"], name=str(name), mode="lines",
                        line_shape="hv", line=run_style(i),
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
    for i, (name, df) in enumerate(frames.items()):
        s = binned_quantile(df, metric, bin_s=bin_s, q=q)
        fig.add_scatter(x=s["t_s"], y=s["value"], name=str(name), mode="lines",
                        line=run_style(i), customdata=s["n"],
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
                     fmt: str = ".3f", min_n: int = 100) -> go.Figure:
    """Heat map of ``value`` per run (columns) and ``key`` group (rows) from a
    ``metrics.breakdown`` frame: where in the mix (long prompts, one tenant) the SLO breaks
    first. Cell text shows the value in black or white, whichever reads on the cell's colour;
    N is in the hover. Cells with fewer than ``min_n`` requests (default 100: below it one miss
    moves attainment by more than the 0.99 target's 1 % budget) are grey and show their N
    ("n=42") under the value instead of a colour read as if certain — short enough not to
    overlap its neighbours."""
    from plotly.colors import get_colorscale, sample_colorscale

    if key not in table:
        raise KeyError(f"breakdown frame has no column {key!r}")
    runs = run_order or list(dict.fromkeys(table["run_id"]))
    keys = list(dict.fromkeys(table[key]))
    z = table.pivot_table(index=key, columns="run_id", values=value, aggfunc="first",
                          sort=False).reindex(index=keys, columns=runs)
    n = table.pivot_table(index=key, columns="run_id", values="n_offered", aggfunc="first",
                          sort=False).reindex(index=keys, columns=runs)
    zv, nv = z.to_numpy(float), n.to_numpy(float)
    few = np.isfinite(zv) & (np.nan_to_num(nv, nan=0.0) < min_n)
    shown = np.where(few, np.nan, zv)
    scale = "RdYlGn" if value.startswith("attainment") else "Viridis"
    finite = shown[np.isfinite(shown)]
    zmin, zmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = (zmax - zmin) or 1.0
    colours = get_colorscale(scale)

    def cell(v, c, f):
        if pd.isna(v):
            return "", "black"
        if f:  # grey cell: its value and how few requests it holds
            return format(v, fmt) + ("" if pd.isna(c) else f"<br>n={int(c)}"), "black"
        fill = sample_colorscale(colours, [min(max((v - zmin) / span, 0.0), 1.0)])[0]
        return format(v, fmt), text_colour(fill)

    cells = [[cell(v, c, f) for v, c, f in zip(zr, cr, fr)] for zr, cr, fr in zip(zv, nv, few)]
    label = HEADERS.get(value, human(value))
    fig = go.Figure(go.Heatmap(z=shown, x=runs, y=[str(k) for k in keys], zmin=zmin, zmax=zmax,
                               colorscale=scale, colorbar=dict(title=label), hoverongaps=False,
                               customdata=nv, name=label,
                               hovertemplate="run %{x}<br>" + key + " %{y}<br>" + label
                                             + " %{z:" + fmt + "}<br>N = %{customdata}<extra></extra>"))
    if few.any():  # too few requests to read a colour into: grey, marked in the text
        fig.add_trace(go.Heatmap(z=np.where(few, 1.0, np.nan), x=runs, y=[str(k) for k in keys],
                                 colorscale=[[0, "#d9d9d9"], [1, "#d9d9d9"]], showscale=False,
                                 hoverongaps=False, customdata=nv, name="too few requests",
                                 hovertemplate="run %{x}<br>" + key + " %{y}<br>N = %{customdata}: "
                                               "too few requests to judge<extra></extra>"))
    order = [(i, j) for j in range(len(runs)) for i in range(len(keys))]
    fig.add_trace(go.Scatter(x=[runs[j] for _, j in order], y=[str(keys[i]) for i, _ in order],
                             mode="text", text=[cells[i][j][0] for i, j in order],
                             textfont=dict(size=10, color=[cells[i][j][1] for i, j in order]),
                             hoverinfo="skip", showlegend=False))
    fig.update_layout(**LAYOUT, title=title or f"{label} by {human(key)} and run",
                      xaxis_title="run", yaxis_title=human(key))
    if few.any():
        fig.add_annotation(x=0, y=-0.18, xref="paper", yref="paper", showarrow=False, xanchor="left",
                           text=f"grey: fewer than {min_n:,} requests (n under the value) — too few "
                                "for a single miss not to decide the cell. Hover a cell for its N.",
                           font=dict(size=11))
    fig.update_yaxes(type="category")
    fig.update_xaxes(type="category")
    return fig


def quarters_figure(quarters: pd.DataFrame) -> go.Figure:
    """Plan by quarter (``Plan.quarters_frame()``): GPUs in groups as bars, peak demand and the
    planned demand (peak + uncertainty, what the plan sizes for; and the forecast mean, when
    the demand came from a forecast) as lines on a second axis; hover shows cost per quarter."""
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    q = quarters["quarter"].astype(str)
    fig.add_bar(x=q, y=quarters["gpus"], name="GPUs", customdata=quarters["cost_usd_per_quarter"],
                text=quarters["gpus"], textposition="outside",
                hovertemplate="%{x}: %{y} GPUs<br>$%{customdata:,.0f} per quarter<extra></extra>",
                secondary_y=False)
    fig.add_scatter(x=q, y=quarters["peak_rps"], name="peak demand (req/s)",
                    mode="lines+markers", secondary_y=True)
    if "demand_rps" in quarters:
        fig.add_scatter(x=q, y=quarters["demand_rps"], name="planned demand incl. uncertainty (req/s)",
                        mode="lines+markers", line=dict(dash="dash"), secondary_y=True)
    mean = quarters.get("forecast_mean_rps")
    if mean is not None and pd.Series(mean).notna().any():
        fig.add_scatter(x=q, y=mean, name="forecast mean (req/s)", mode="lines+markers",
                        line=dict(dash="dot"), secondary_y=True)
    fig.update_layout(**LAYOUT, title="Plan by quarter: GPUs in replica groups, peak and planned demand")
    fig.update_yaxes(title_text="GPUs", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="req/s", secondary_y=True, rangemode="tozero", showgrid=False)
    return fig


def format_number(v) -> str:
    """Readable number for report tables: whole numbers without decimals, thousands
    separators, 4 significant digits for small values; text passes through."""
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return MISSING
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


#: page headers for columns people read (the frames and exports keep snake_case names)
HEADERS = {
    "run_id": "run", "offered_rps": "offered rate, nominal (req/s)", "concurrency": "concurrency",
    "measured_rps": "offered rate, measured (req/s)", "measured_offered_rps": "offered rate, measured (req/s)",
    "measured/nominal": "measured / nominal", "rate_ratio": "measured / nominal",
    "window_s": "steady window (s)", "achieved_rps": "achieved rate (req/s)",
    "output_tok_s": "output tokens/s", "total_tok_s": "tokens/s (in + out)",
    "computed_tok_s": "tokens/s computed (prefix cache misses)", "first_token": "first token",
    "excluded_warmup": "in warm-up (left out)", "good": "SLO-meeting",
    "attain_offered": "attainment (of offered)", "attain_admitted": "attainment (of admitted)",
    "attainment_offered": "attainment (of offered)",
    "goodput_rps": "goodput over the window (req/s)", "error_rate": "error rate", "meets_slo": "meets SLO",
    "n": "requests", "n_good": "SLO-meeting", "attainment": "attainment", "n_eff": "N_eff",
    "warmup_s": "warm-up (s)", "warmup_source": "warm-up from", "gen_lag_p99_ms": "generator lag p99 (ms)",
    "littles_ratio": "Little's law ratio", "overloaded": "overloaded", "too_short": "too short",
    "usable": "usable", "reason": "why not usable", "warnings": "warnings",
    "item": "line item", "value": "value", "unit": "unit", "formula": "formula", "inputs": "inputs",
    "quantity": "quantity", "note": "note", "check": "check", "ok": "status ok", "caveat": "caveat",
    "assumption": "assumption", "quarter": "quarter", "start": "first day", "end": "last day",
    "peak_rps": "peak demand (req/s)", "demand_rps": "planned demand incl. uncertainty (req/s)",
    "groups": "replica groups", "gpus": "GPUs in groups", "billed_gpus": "billed GPUs", "nodes": "nodes",
    "cost_usd_per_month": "cost per month (USD)", "cost_usd_per_quarter": "cost per quarter (USD)",
    "cost_usd_per_year": "cost per year at this size (USD)",
    "cost_usd_per_1k_good_requests": "cost per 1 000 SLO-meeting requests (USD)",
    "forecast_mean_rps": "forecast mean peak (req/s)", "forecast_lower_rps": "forecast interval low (req/s)",
    "input_tokens_bucket": "prompt length (tokens)", "output_tokens_bucket": "output length (tokens)",
    "tenant": "tenant", "case": "case", "c_slo_rps": "C_SLO (req/s)",
    "capacity_rps_per_group": "capacity per replica group (req/s)",
    # the sensitivity band of each quarter (capplan.plan.sensitivity.Sensitivity.quarters_frame)
    "c_slo_low_rps": "band: C_SLO from (req/s)", "c_slo_high_rps": "band: C_SLO below (req/s)",
    "capacity_low_rps_per_group": "band per replica group from (req/s)",
    "capacity_high_rps_per_group": "band per replica group below (req/s)",
    "groups_below_band": "replica groups below the band", "groups_on_the_estimate": "replica groups on the estimate",
    "groups_on_the_lower_bound": "replica groups on the lower bound", "knife_edge": "knife-edge",
    "cslo_estimate": "C_SLO estimate (req/s)", "ci_low": "95 % low", "ci_high": "95 % high",
    "lower_bound": "lower bound (req/s)", "delta_%": "delta (%)", "delta_ci": "delta CI",
}
#: words of column names that are abbreviations (``cslo_rps`` → 'C_SLO (req/s)')
_WORDS = {"cslo": "C_SLO", "gpu": "GPU", "gpus": "GPUs", "kv": "KV", "slo": "SLO", "ci": "CI", "cv": "CV",
          "sd": "SD", "rps": "req/s", "j": "J", "jain": "Jain"}
_UNITS = (("_rps", " (req/s)"), ("_ms", " (ms)"), ("_pct", " (%)"), ("_usd", " (USD)"), ("_s", " (s)"),
          ("_w", " (W)"), ("_wh", " (Wh)"))


def human(col) -> str:
    """A readable header for a column name: the HEADERS entry, else words with the unit
    suffix in brackets (``ttft_p99_ms`` → 'ttft p99 (ms)'); other text passes through."""
    c = str(col)
    if c in HEADERS:
        return HEADERS[c]
    if "_" not in c or c[:1].isupper():  # already words, or a name like C_SLO / N_eff
        return c
    unit = ""
    for suffix, text in _UNITS:
        if c.endswith(suffix):
            c, unit = c[: -len(suffix)], text
            break
    words = " ".join(_WORDS.get(w, w) for w in c.split("_"))
    for metric in ("ttft", "tpot", "itl", "e2e"):
        if words.startswith(metric + " "):
            words = metric.upper() + words[len(metric):]
    if words.startswith("n "):
        words = "N " + words[2:]
    words = re.sub(r"\bp(\d+) (\d+)\b", r"p\1.\2", words)  # p99_9 → p99.9
    return words + unit


def format_usd(v) -> str:
    """Money on a page: $1,027,585 (whole dollars from $1 000), $6.79 (cents below)."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return MISSING
    return f"${v:,.0f}" if abs(v) >= 1000 else f"${v:,.2f}"


def styled(df: pd.DataFrame, *, headers: dict | None = None):
    """A report table: no index, human headers (:func:`human`, ``headers`` overrides), numbers
    through :func:`format_number`, text left-aligned."""
    names = {c: (headers or {}).get(c, human(c)) for c in df.columns}
    if len(set(names.values())) == len(names):
        df = df.rename(columns=names)
    st = df.style.hide(axis="index").format(format_number)
    money = [c for c in df.columns if "(USD" in str(c) and pd.api.types.is_numeric_dtype(df[c])]
    if money:
        st = st.format(format_usd, subset=money)
    text = [c for c in df.columns if not pd.api.types.is_numeric_dtype(df[c])
            or pd.api.types.is_bool_dtype(df[c])]
    if text:  # the cells and their header: a right-aligned header sat far from its text column
        st = st.set_properties(subset=text, **{"text-align": "left"})
        st = st.set_table_styles({c: [{"selector": "th", "props": "text-align: left"}] for c in text},
                                 overwrite=False)
    return st


def percentile_table(summary, metric: str) -> tuple[pd.DataFrame, str]:
    """One latency metric's percentiles (ms) per run from a ``metrics.summarize`` result, and a
    footnote for the cells the sample cannot support: they show — instead of repeating the
    reason in every row."""
    import re

    funnel = summary.display_frame("funnel")
    out = funnel[[c for c in ("run_id", "offered_rps", "concurrency") if c in funnel]].copy()
    need: set[int] = set()
    for p in summary.percentiles:
        cells = []
        for _, r in summary.table.iterrows():
            text = summary.cell_text(r, metric, p)
            m = re.search(r"need ([\d,]+)", text) if text.startswith("insufficient") else None
            if m:
                need.add(int(m.group(1).replace(",", "")))
                text = "—"
            cells.append(text)
        out[f"{pct_label(p)} (ms)"] = cells
    note = ("— : too few completed requests in the run for that percentile (a p99 needs about "
            f"{min(need):,}; rarer percentiles need more)." if need else "")
    return out, note


# ----------------------------------------------------------------------------- page tables


def _with_ci(v, lo, hi, fmt: str) -> str:
    if v is None or pd.isna(v):
        return MISSING
    s = format(v, fmt)
    if lo is not None and hi is not None and not (pd.isna(lo) or pd.isna(hi)):
        s += f" ({format(lo, fmt)}–{format(hi, fmt)})"
    return s


def envelope_runs_frame(env) -> pd.DataFrame:
    """The envelope's per-run table trimmed to what the page's question needs (the whole table
    is in envelope.json): run, rates, requests, SLO-meeting, attainment with its CI, N_eff,
    TTFT p99 with its CI, and why a run is not used."""
    r = env.runs
    out = pd.DataFrame({"run_id": r["run_id"]})
    if "offered_rps" in r and r["offered_rps"].notna().any():
        out["offered_rps"] = r["offered_rps"]
    if "measured_rps" in r:
        out["measured_rps"] = r["measured_rps"]
    out["n"] = r["n"]
    out["n_good"] = r["n_good"]
    out["attainment (CI)"] = [_with_ci(a, lo, hi, ".4f") for a, lo, hi in
                              zip(r["attainment"], r["att_ci_low"], r["att_ci_high"])]
    if "n_eff" in r:
        out["n_eff"] = r["n_eff"]
    if "ttft_p99_ms" in r:
        out["TTFT p99 from the histogram, ms (CI)"] = [
            _with_ci(v, lo, hi, ".0f") for v, lo, hi in
            zip(r["ttft_p99_ms"], r.get("ttft_p99_ci_low", [None] * len(r)), r.get("ttft_p99_ci_high", [None] * len(r)))]
    out["reason"] = [("" if u else str(x)) for u, x in zip(r["usable"], r["reason"])]
    return out


def pooling_note(env) -> str:
    """Why the C_SLO estimate can sit above a run that missed the target (the isotonic fit
    pooled it with its neighbours), or "" when no usable run below the estimate missed it."""
    c = env.cslo
    if c.closed_loop or not (c.estimate == c.estimate):
        return ""
    r = env.runs[env.runs["usable"]]
    below = r[(r["x"] < c.estimate) & (r["attainment"] < env.target)]
    if below.empty:
        return ""
    runs = ", ".join(f"{row.run_id} ({row.x:.3g} req/s, attainment {row.attainment:.4f})" for row in below.itertuples())
    return (f"**Why the estimate {c.estimate:.4g} sits above a run that missed the target** ({runs}): the "
            "fit makes attainment non-increasing in load, so a run that did worse than a faster one is pooled "
            "with it into one level (isotonic fit), weighted by how much each run can be trusted; the interval "
            "and lower bound allow for that run's result.")


def about_frame(plan) -> pd.DataFrame:
    """What the plan is, in words (``Plan.about``): label, text."""
    return pd.DataFrame(plan.about(), columns=["setting", "text"])


def checks_frame(plan) -> pd.DataFrame:
    """The plan's checks for a page: failing first, then caveated, then the rest; the result in
    words."""
    rows = sorted(plan.checks, key=lambda c: (c.ok, not c.caveat))
    return pd.DataFrame({"ok": ["FAILS" if not c.ok else ("holds, with a caveat" if c.caveat else "holds")
                                for c in rows],
                         "check": [c.sentence for c in rows], "caveat": [for_readers(c.caveat) for c in rows]})
class FigureArea:
    """A chart that a panel redraws in place: an ipywidgets ``Output`` showing plotly's own
    mimetype, drawn by the plotly extension that JupyterLab and Voila load once per page.

    Not a ``go.FigureWidget``: in plotly 6+ that is an anywidget whose model carries all of
    plotly.js (~5 MB) through the kernel and the server to every page, which is what made
    several people opening the what-if app at once wait on each other. ``.figure`` is the
    figure on screen, ``.widget`` the ``Output`` to place in a layout."""

    def __init__(self, fig: go.Figure | None = None, *, css_class: str | None = None):
        import ipywidgets as W

        self.widget = W.Output(layout=W.Layout(width="100%"))
        if css_class:
            self.widget.add_class(css_class)
        self.show(go.Figure() if fig is None else fig)

    def show(self, fig: go.Figure) -> None:
        import json

        from IPython.display import display

        self.figure = fig
        self.widget.clear_output(wait=True)
        with self.widget:
            display({"application/vnd.plotly.v1+json": json.loads(fig.to_json()),
                     "text/plain": "<plotly figure>"}, raw=True)
