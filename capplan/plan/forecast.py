"""Quarterly peak demand from a demand history: Holt–Winters exponential smoothing (statsmodels)
with a simulated prediction interval of each quarter's peak; plans use the interval's upper end.

Why simulate: the plan needs the *highest* load of a quarter, and the maximum of a forecast
path is not the maximum of the point forecast. We draw ``reps`` future paths from the fitted
state-space model (``ETSResults.simulate``, normal errors with the fitted variance), take the
peak of each path inside each calendar quarter, and report the mean and the percentile
interval of those peaks.

The history is brought to one observation per period first: finer than daily → daily peaks;
daily–weekly spacing → daily; weekly → weekly peaks; monthly or coarser → monthly peaks. The
seasonal term is used as the data allow: weekly (7) for daily data with ≥ 4 weeks, yearly (52
or 12) for weekly/monthly data with ≥ 2 years; otherwise trend only. Timestamps may be text
(ISO), datetimes, or numbers since the epoch (s, ms, µs or ns, told apart by magnitude).

References: Holt 1957; Winters 1960; Hyndman & Athanasopoulos, *Forecasting: Principles and
Practice* (3rd ed.) §8 (ETS models and simulated prediction intervals).
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..contract import pct_label
from ..errors import SpecError

MIN_POINTS = 10
#: per-period frequency → (seasonal period, periods of history the seasonal term needs)
_SEASON = {"D": (7, 28), "W": (52, 104), "MS": (12, 24)}


@dataclass(frozen=True)
class Forecast:
    """Quarterly peak forecast. Per quarter: ``labels``, ``mean`` (mean of simulated peaks),
    ``lower``/``upper`` (percentile interval at ``interval``), ``point`` (peak of the point
    forecast). ``trend_per_step`` and ``season`` are the fitted components at the end of the
    history (per ``freq`` step); ``bands`` holds the per-step point forecast and interval, and
    ``peak_so_far_upper``: the upper end of the peak from the quarter's start up to the step
    (at a quarter's last step it is the quarter's planned peak; ``capplan.plan.fleet_steps`` dates
    a fleet step by the first step where it passes what the previous fleet carries)."""

    labels: tuple[str, ...]
    mean: tuple[float, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    point: tuple[float, ...]
    interval: float
    model: str
    freq: str
    seasonal_periods: int | None
    trend_per_step: float
    season: tuple[float, ...]
    level: float
    mean_to_peak: float
    reps: int
    seed: int
    history: pd.Series = field(repr=False, compare=False)
    bands: pd.DataFrame = field(repr=False, compare=False)
    notes: tuple[str, ...] = ()

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"quarter": list(self.labels), "peak_mean_rps": self.mean,
                             "peak_lower_rps": self.lower, "peak_upper_rps": self.upper,
                             "point_forecast_peak_rps": self.point})

    def figure(self):
        """History, point forecast, the per-step interval band and each quarter's planned peak."""
        import plotly.graph_objects as go

        b = self.bands
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=self.history.index, y=self.history.to_numpy(), name="history (peak per step)",
                                 mode="lines", line={"color": "#444"}))
        fig.add_trace(go.Scatter(x=b.index, y=b["upper"], mode="lines", line={"width": 0}, showlegend=False,
                                 hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=b.index, y=b["lower"], mode="lines", line={"width": 0}, fill="tonexty",
                                 fillcolor="rgba(31,119,180,0.2)", name=f"{self.interval:.0%} interval"))
        fig.add_trace(go.Scatter(x=b.index, y=b["point"], name="point forecast", mode="lines",
                                 line={"color": "#1f77b4"}))
        starts = [pd.Period(q, "Q").start_time for q in self.labels]
        ends = [pd.Period(q, "Q").end_time for q in self.labels]
        tz = b.index.tz
        xs, ys = [], []
        for s, e, u in zip(starts, ends, self.upper):
            s = s.tz_localize(tz) if tz is not None else s
            e = e.tz_localize(tz) if tz is not None else e
            xs += [s, e, None]
            ys += [u, u, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="planned peak (upper bound)",
                                 line={"color": "#d62728", "dash": "dash"}))
        fig.update_layout(title=f"Demand forecast ({self.model})", yaxis_title="offered rate (req/s)",
                          template="plotly_white")
        return fig


def _bad(msg, field_="demand.history", fix=None, file=None):
    return SpecError(msg, field=field_, fix=fix, file=file)


def read_history(path: str | os.PathLike, *, time_column: str = "t", rate_column: str = "rps") -> pd.Series:
    """Read a CSV or parquet demand history into a rate series indexed by UTC timestamps."""
    path = Path(path)
    file = str(path)
    if not path.is_file():
        raise _bad("demand history file not found", file=file,
                   fix="give demand.history a CSV or parquet file (relative to the spec file)")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            df = pd.read_parquet(path)
        else:
            df = pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure is the user's file
        raise _bad(f"cannot read demand history: {exc}", file=file, fix="write a CSV with a header row, "
                   f"or a parquet file, with columns {time_column} and {rate_column}") from None
    for col, fld in ((time_column, "demand.history_time_column"), (rate_column, "demand.history_rate_column")):
        if col not in df.columns:
            raise _bad(f"demand history has no column {col!r} (columns: {', '.join(map(str, df.columns))})",
                       fld, fix=f"name the column {col!r} or set {fld.split('.')[-1]}", file=file)
    return history_series(df[time_column], df[rate_column], file=file)


def history_series(times, rates, *, file: str | None = None) -> pd.Series:
    """Validate and index a history: timestamps parsed to UTC, rates finite and ≥ 0."""
    t = pd.Series(times)
    if pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t):
        v = t.astype("float64")
        mag = np.nanmax(np.abs(v.to_numpy())) if len(v) else 0
        unit = "ns" if mag > 1e17 else "us" if mag > 1e14 else "ms" if mag > 1e11 else "s"
        idx = pd.to_datetime(v, unit=unit, utc=True)
    else:
        try:
            idx = pd.to_datetime(t, utc=True, format="mixed")
        except (ValueError, TypeError) as exc:
            raise _bad(f"demand history timestamps cannot be read: {exc}", "demand.history_time_column",
                       fix="write ISO timestamps like 2026-01-31T12:00:00Z or seconds since the epoch",
                       file=file) from None
    if idx.isna().any():
        row = int(np.flatnonzero(idx.isna().to_numpy())[0])
        raise _bad(f"demand history has an empty or unreadable timestamp (row {row + 1})",
                   "demand.history_time_column", fix="fill or drop that row", file=file)
    r = pd.to_numeric(pd.Series(rates), errors="coerce")
    if r.isna().any() or not np.isfinite(r.to_numpy(dtype=float)).all():
        row = int(np.flatnonzero(~np.isfinite(r.to_numpy(dtype=float)))[0])
        raise _bad(f"demand history has a missing or non-numeric rate (row {row + 1}: {pd.Series(rates).iloc[row]!r})",
                   "demand.history_rate_column", fix="every row needs a request rate in req/s", file=file)
    if (r < 0).any():
        row = int(np.flatnonzero((r < 0).to_numpy())[0])
        raise _bad(f"demand history has a negative rate (row {row + 1}: {r.iloc[row]:g})",
                   "demand.history_rate_column", fix="rates are req/s and cannot be negative", file=file)
    s = pd.Series(r.to_numpy(dtype=float), index=pd.DatetimeIndex(idx), name="rps").sort_index()
    if len(s) < MIN_POINTS:
        raise _bad(f"demand history has {len(s)} rows; a forecast needs at least {MIN_POINTS}",
                   fix="give a longer history, or a fixed peak (demand.peak_rps)", file=file)
    return s


def _regularise(s: pd.Series) -> tuple[pd.Series, str, int | None, list[str]]:
    """One peak per period, the pandas frequency and the seasonal period the data allow."""
    notes = []
    ns = s.index.as_unit("ns").asi8  # pandas ≥ 3 defaults to µs: never assume the unit
    dt = np.median(np.diff(ns)) / 1e9 / 86400.0  # days
    freq = "D" if dt < 6.5 else "W" if dt < 27 else "MS"
    period, need = _SEASON[freq]
    y = s.resample(freq).max()
    gaps = int(y.isna().sum())
    if gaps:
        y = y.interpolate(limit_direction="both")
        notes.append(f"{gaps} empty {freq} period(s) in the history were filled by linear interpolation")
    if len(y) < MIN_POINTS:
        raise _bad(f"demand history spans only {len(y)} periods of {freq}; a forecast needs at least {MIN_POINTS}",
                   fix="give a longer history, or a fixed peak (demand.peak_rps)")
    if len(y) < need:
        notes.append(f"history of {len(y)} {freq} periods is shorter than {need}: no seasonal term (trend only)")
        period = None
    return y, freq, period, notes


def forecast_peaks(history: pd.Series, *, horizon_quarters: int = 4, interval: float = 0.95, reps: int = 1000,
                   seed: int = 0, seasonal: str | None = "auto") -> Forecast:
    """Fit Holt–Winters (additive trend, additive season where the data allow) to the history's
    per-period peaks and simulate the peak of each of the next ``horizon_quarters`` calendar
    quarters (those starting after the last observation)."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    y, freq, period, notes = _regularise(history)
    if seasonal is None:
        period = None
    last = y.index[-1]
    q0 = (last.tz_localize(None) if last.tz is not None else last).to_period("Q") + 1
    quarters = [q0 + i for i in range(horizon_quarters)]
    end = quarters[-1].end_time
    if last.tz is not None:
        end = end.tz_localize(last.tz)
    future = pd.date_range(last, end, freq=freq if freq != "MS" else "MS", inclusive="right")
    if freq == "W":
        future = pd.date_range(last, end + pd.Timedelta(days=6), freq="W", inclusive="right")
    H = len(future)
    model = ExponentialSmoothing(y.to_numpy(), trend="add", seasonal="add" if period else None,
                                 seasonal_periods=period, initialization_method="estimated")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter; the fit is checked by its use
        res = model.fit()
        sims = np.asarray(res.simulate(H, repetitions=reps, anchor="end", random_state=seed))
    sims = sims.reshape(H, reps)
    point = np.asarray(res.forecast(H))
    sims = np.maximum(sims, 0.0)  # a rate is never negative
    point = np.maximum(point, 0.0)
    alpha = (1.0 - interval) / 2.0
    fut_naive = future.tz_localize(None) if future.tz is not None else future
    labels, mean, lower, upper, pk = [], [], [], [], []
    so_far = np.full(H, np.nan)  # upper end of the peak from the quarter's start to each step
    for q in quarters:
        sel = (fut_naive >= q.start_time) & (fut_naive <= q.end_time)  # a week counts where it ends
        if not sel.any():
            raise _bad(f"no forecast step falls in {q}", fix="use a finer history")
        so_far[sel] = np.quantile(np.maximum.accumulate(sims[sel], axis=0), 1.0 - alpha, axis=1)
        peaks = sims[sel].max(axis=0)
        labels.append(str(q))
        mean.append(float(peaks.mean()))
        lower.append(float(np.quantile(peaks, alpha)))
        upper.append(float(np.quantile(peaks, 1.0 - alpha)))
        pk.append(float(point[sel].max()))
    bands = pd.DataFrame({"point": point, "lower": np.quantile(sims, alpha, axis=1),
                          "upper": np.quantile(sims, 1.0 - alpha, axis=1), "peak_so_far_upper": so_far},
                         index=future)
    season = tuple(float(v) for v in res.season[-period:]) if period else ()
    tail = history[history.index > history.index[-1] - pd.Timedelta(days=28)]
    mtp = float(tail.mean() / tail.max()) if tail.max() > 0 else 1.0
    desc = ("Holt–Winters additive trend" + (f" + additive season (period {period})" if period else "")
            + f", {freq} peaks, {reps} simulated paths")
    return Forecast(labels=tuple(labels), mean=tuple(mean), lower=tuple(lower), upper=tuple(upper), point=tuple(pk),
                    interval=interval, model=desc, freq=freq, seasonal_periods=period,
                    trend_per_step=float(res.trend[-1]), season=season, level=float(res.level[-1]),
                    mean_to_peak=mtp, reps=reps, seed=seed, history=y, bands=bands, notes=tuple(notes))


def _history_key(path: str | os.PathLike) -> tuple[str, int, int]:
    """(path, mtime, size) of a demand history file: the cache key of the file-level fits, so an
    edited file is read again."""
    p = Path(path)
    if not p.is_file():
        raise _bad("demand history file not found", file=str(p),
                   fix="give demand.history a CSV or parquet file (relative to the spec file)")
    st = p.stat()
    return str(p), st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=16)
def _cached(path: str, mtime_ns: int, size: int, time_column: str, rate_column: str, horizon_quarters: int,
            interval: float, reps: int, seed: int) -> Forecast:
    s = read_history(path, time_column=time_column, rate_column=rate_column)
    try:
        return forecast_peaks(s, horizon_quarters=horizon_quarters, interval=interval, reps=reps, seed=seed)
    except SpecError as exc:
        raise SpecError(exc.args[0], field=exc.field, fix=exc.fix, file=path) from None


def forecast_peaks_from_file(path: str | os.PathLike, *, time_column: str = "t", rate_column: str = "rps",
                             horizon_quarters: int = 4, interval: float = 0.95, reps: int = 1000,
                             seed: int = 0) -> Forecast:
    """``forecast_peaks`` of a history file, cached on (path, mtime, size, settings) so the
    what-if panel does not refit on every slider move."""
    return _cached(*_history_key(path), time_column, rate_column, int(horizon_quarters),
                   float(interval), int(reps), int(seed))


# ----------------------------------------------------------------------------- back-test

#: fewest rolling origins a back-test accepts (fewer give no usable error quantile)
MIN_ORIGINS = 4
#: quantiles of the actual/forecast ratio a back-test reports
RATIO_QUANTILES = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class BackTest:
    """The forecast back-tested on its own history (rolling origin, docs/plan.md "Back-test").
    One row per (origin, quarter ahead) in ``rows``: the actual peak, the forecast mean of the
    peak, the planned peak (the interval's upper end, what the plan sizes for), their ratios and
    the absolute percentage error. ``mape`` and ``ratio_quantiles`` (actual / forecast mean) say
    how accurate the forecast is; ``under_forecast`` is the ``quantile`` of actual / planned − 1,
    and ``u = max(0, under_forecast)`` the demand uncertainty that would have covered the actual
    peak in that share of the back-tested quarters."""

    origins: tuple[str, ...]
    horizon_quarters: int
    interval: float
    quantile: float
    mape: float
    ratio_quantiles: tuple[tuple[float, float], ...]
    planned_ratio_quantiles: tuple[tuple[float, float], ...]
    under_forecast: float
    u: float
    freq: str
    model: str
    rows: pd.DataFrame = field(repr=False, compare=False)

    @property
    def quarters(self) -> int:
        return len(self.rows)

    @property
    def sentence(self) -> str:
        """Where ``u`` came from, in one line (the plan's summary and Assumptions quote it)."""
        q = pct_label(self.quantile)
        return (f"back-tested: {q} under-forecast of the planned peak {self.under_forecast:+.1%} over "
                f"{len(self.origins)} origins ({self.quarters} quarters, {self.horizon_quarters} ahead each), "
                f"so u = {self.u:.1%}; forecast MAPE {self.mape:.1%}")

    def to_text(self) -> str:
        r = ", ".join(f"{pct_label(p)} {v:.3f}" for p, v in self.ratio_quantiles)
        rp = ", ".join(f"{pct_label(p)} {v:.3f}" for p, v in self.planned_ratio_quantiles)
        return "\n".join([
            f"Back-test of the demand forecast ({self.model}) on its own history: fitted at "
            f"{len(self.origins)} quarter ends ({self.origins[0]} … {self.origins[-1]}), each forecasting the next "
            f"{self.horizon_quarters} quarter(s), compared with the peak that happened ({self.quarters} quarters).",
            f"Forecast mean of the quarter's peak: MAPE {self.mape:.1%}; actual / forecast {r} "
            f"(> 1: under-forecast).",
            f"Planned peak (upper end of the {self.interval:.0%} interval): actual / planned {rp}.",
            f"u = max(0, {pct_label(self.quantile)} of actual / planned − 1) = {self.u:.1%}: planning for "
            f"planned peak × (1 + u) would have covered the actual peak in {self.quantile:.0%} of these quarters.",
        ])

    def to_frame(self) -> pd.DataFrame:
        return self.rows.copy()

    def figure(self):
        """Actual peak against the forecast mean and the planned peak, per back-tested quarter."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for step in sorted(self.rows["step"].unique()):
            r = self.rows[self.rows["step"] == step]
            tag = f" ({step} ahead)" if self.horizon_quarters > 1 else ""
            fig.add_trace(go.Scatter(x=r["quarter"], y=r["forecast_mean_rps"], mode="markers",
                                     name="forecast mean" + tag, marker={"symbol": "circle-open"}))
            fig.add_trace(go.Scatter(x=r["quarter"], y=r["planned_peak_rps"], mode="markers",
                                     name="planned peak" + tag, marker={"symbol": "triangle-up-open"}))
        actual = self.rows.drop_duplicates("quarter")
        fig.add_trace(go.Scatter(x=actual["quarter"], y=actual["actual_peak_rps"], mode="lines+markers",
                                 name="actual peak", line={"color": "#444"}))
        fig.update_layout(title=f"Forecast back-test: {len(self.origins)} origins, MAPE {self.mape:.1%}",
                          yaxis_title="quarter's peak (req/s)", template="plotly_white")
        return fig


def _quarter_labels(q: pd.Period, freq: str) -> pd.DatetimeIndex:
    """The period labels of a per-period series that fall in quarter ``q`` (a week counts where it ends)."""
    return pd.date_range(q.start_time, q.end_time.normalize(), freq=freq)


def backtest(history: pd.Series, *, horizon_quarters: int = 1, interval: float = 0.95, quantile: float = 0.9,
             reps: int = 1000, seed: int = 0, forecaster=None) -> BackTest:
    """Rolling-origin back-test of ``forecaster`` (default :func:`forecast_peaks`, the plan's):
    at every calendar-quarter end with enough history before it to fit the same model as the
    whole history and ``horizon_quarters`` complete quarters after it, fit on the history up to
    that end, forecast the next ``horizon_quarters`` quarters' peaks and compare each with the
    peak that happened. Raises SpecError (field ``demand.uncertainty``) naming the history
    needed when it gives fewer than ``MIN_ORIGINS`` origins."""
    forecaster = forecaster or forecast_peaks
    y, freq, period, _ = _regularise(history)
    min_train = _SEASON[freq][1] if period else MIN_POINTS
    naive = y.index.tz_localize(None) if y.index.tz is not None else y.index
    qidx = naive.to_period("Q")
    first = pd.date_range(naive[0], periods=min_train, freq=freq)[-1].to_period("Q")
    last = qidx[-1]
    if naive[-1] < _quarter_labels(last, freq)[-1]:
        last -= 1  # the last quarter is not complete
    H = int(horizon_quarters)
    n = (last - H).ordinal - first.ordinal + 1
    if n < MIN_ORIGINS:
        more = MIN_ORIGINS - max(n, 0)
        through = (last + more).end_time.date().isoformat()
        unit = {"D": "days", "W": "weeks", "MS": "months"}[freq]
        raise _bad(f"demand history too short to back-test: {max(n, 0)} origin(s), a back-test needs "
                   f"{MIN_ORIGINS}. Each origin is a quarter end with at least {min_train} {unit} of history "
                   f"before it and {H} complete quarter(s) after it; the history runs "
                   f"{naive[0].date()} – {naive[-1].date()} ({len(y)} {unit})",
                   "demand.uncertainty",
                   fix=f"give {more} more complete quarter(s) of history (through {through}), a shorter "
                       f"horizon_quarters, or u as a number (uncertainty: 0.2)")
    origins = [first + i for i in range(n)]
    rows = []
    model = ""
    for o in origins:
        fc = forecaster(y[qidx <= o], horizon_quarters=H, interval=interval, reps=reps, seed=seed)
        model = getattr(fc, "model", model)
        want = tuple(str(o + k) for k in range(1, H + 1))
        if tuple(fc.labels) != want:
            raise _bad(f"the back-test fit at {o} forecast quarters {', '.join(fc.labels)} instead of "
                       f"{', '.join(want)}", "demand.history", fix="give a regular history (one rate per period)")
        for k, (label, mean, upper) in enumerate(zip(fc.labels, fc.mean, fc.upper), start=1):
            actual = float(y[qidx == o + k].max())
            if actual <= 0:
                raise _bad(f"the history's peak in {label} is 0: the back-test's percentage errors are undefined",
                           "demand.history", fix="give u as a number (uncertainty: 0.2)")
            rows.append({"origin": str(o), "quarter": label, "step": k, "actual_peak_rps": actual,
                         "forecast_mean_rps": float(mean), "planned_peak_rps": float(upper),
                         "actual_to_forecast": actual / float(mean) if mean > 0 else float("inf"),
                         "actual_to_planned": actual / float(upper) if upper > 0 else float("inf"),
                         "ape": abs(actual - float(mean)) / actual})
    return backtest_errors(pd.DataFrame(rows), origins=tuple(str(o) for o in origins), horizon_quarters=H,
                           interval=interval, quantile=quantile, freq=freq, model=model)


def backtest_errors(rows: pd.DataFrame, *, origins: tuple[str, ...], horizon_quarters: int, interval: float,
                    quantile: float, freq: str = "", model: str = "") -> BackTest:
    """The error summary of back-test rows (``actual_peak_rps``, ``forecast_mean_rps``,
    ``planned_peak_rps``): MAPE = mean |actual − forecast| / actual; ratio quantiles (type 7);
    u = max(0, quantile of actual / planned − 1)."""
    a = rows["actual_peak_rps"].to_numpy(dtype=float)
    m = rows["forecast_mean_rps"].to_numpy(dtype=float)
    p = rows["planned_peak_rps"].to_numpy(dtype=float)
    mape = float(np.mean(np.abs(a - m) / a))
    rq = tuple((q, float(np.quantile(a / m, q))) for q in RATIO_QUANTILES)
    pq = tuple((q, float(np.quantile(a / p, q))) for q in RATIO_QUANTILES)
    under = float(np.quantile(a / p, quantile)) - 1.0
    return BackTest(origins=origins, horizon_quarters=horizon_quarters, interval=interval, quantile=quantile,
                    mape=mape, ratio_quantiles=rq, planned_ratio_quantiles=pq, under_forecast=under,
                    u=max(0.0, under), freq=freq, model=model, rows=rows)


@functools.lru_cache(maxsize=8)
def _cached_backtest(path: str, mtime_ns: int, size: int, time_column: str, rate_column: str,
                     horizon_quarters: int, interval: float, quantile: float, reps: int, seed: int) -> BackTest:
    s = read_history(path, time_column=time_column, rate_column=rate_column)
    try:
        return backtest(s, horizon_quarters=horizon_quarters, interval=interval, quantile=quantile, reps=reps,
                        seed=seed)
    except SpecError as exc:  # too short: the spec's uncertainty line is the place, the history is named
        if exc.field == "demand.uncertainty":
            raise SpecError(f"{exc.args[0]} (history {path})", field=exc.field, fix=exc.fix) from None
        raise SpecError(exc.args[0], field=exc.field, fix=exc.fix, file=path) from None


def backtest_from_file(path: str | os.PathLike, *, time_column: str = "t", rate_column: str = "rps",
                       horizon_quarters: int = 1, interval: float = 0.95, quantile: float = 0.9,
                       reps: int = 1000, seed: int = 0) -> BackTest:
    """``backtest`` of a history file, cached on (path, mtime, size, settings): a spec with
    ``demand.uncertainty: backtest`` is loaded by several pages and the what-if panel."""
    return _cached_backtest(*_history_key(path), time_column, rate_column, int(horizon_quarters),
                            float(interval), float(quantile), int(reps), int(seed))
