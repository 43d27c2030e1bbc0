"""The target mix: the share of production requests in each cell (input-length bucket ×
output-length bucket [× tenant] [× SLO class]), from a production trace or a bucket table
(docs/mix.md, "Target mix").

A trace is read through DuckDB (parquet, CSV or JSON lines; streamed, never loaded whole) with
common column names recognised — capplan's own ``input_tokens``/``output_tokens``/``tenant``/
``slo_class``, Azure's ``ContextTokens``/``GeneratedTokens``/``TIMESTAMP``, Mooncake's
``input_length``/``output_length``/``timestamp`` (ms) — and counted per cell in one GROUP BY.
With timestamps, the busiest clock hour's mix is given beside the whole trace's ("peak hour"
vs "day"): long prompts often crowd the peak.

A bucket table states the shares directly: one row per cell with ``input_min``/``input_max``
(and ``output_min``/``output_max``; max empty = no upper end), optional ``tenant``/``slo_class``,
and ``share`` or ``requests``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import spec as S
from ..errors import SpecError
from ..reduce import NONE_LABEL, bucket_labels

#: cell dimensions in the order the reduction writes them
DIMS = ("input_bucket", "output_bucket", "tenant", "slo_class")
DEFAULT_INPUT_EDGES = (1024.0, 4096.0)

_ALIASES = {
    "input": ("input_tokens", "contexttokens", "input_length", "prompt_tokens", "context_tokens",
              "num_prefill_tokens", "input_len"),
    "output": ("output_tokens", "generatedtokens", "output_length", "completion_tokens",
               "generated_tokens", "num_decode_tokens", "output_len"),
    "time": ("timestamp", "scheduled_ns", "t", "time", "arrival_time", "ts"),
    "tenant": ("tenant",),
    "slo_class": ("slo_class",),
}


@dataclass(frozen=True)
class Buckets:
    """The cells a mix is counted in. Bucket index = number of edges ≤ the token count (edges
    [1024, 4096] → <1024, 1024–4096, ≥4096); ``tenant``/``slo_class`` split by their values."""

    input_edges: tuple[float, ...] = DEFAULT_INPUT_EDGES
    output_edges: tuple[float, ...] = ()
    tenant: bool = False
    slo_class: bool = False

    def __post_init__(self):
        for name in ("input_edges", "output_edges"):
            e = tuple(float(v) for v in getattr(self, name))
            if any(not math.isfinite(v) or v <= 0 for v in e) or any(b <= a for a, b in zip(e, e[1:])):
                raise SpecError(f"{name} must be increasing positive token counts, got {list(e)}",
                                field=name, fix="e.g. input edges 1024,4096")
            object.__setattr__(self, name, e)

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(d for d, on in zip(DIMS, (bool(self.input_edges), bool(self.output_edges),
                                                self.tenant, self.slo_class)) if on)

    def describe(self) -> str:
        parts = []
        if self.input_edges:
            parts.append("input tokens " + ", ".join(bucket_labels(self.input_edges)))
        if self.output_edges:
            parts.append("output tokens " + ", ".join(bucket_labels(self.output_edges)))
        if self.tenant:
            parts.append("tenant")
        if self.slo_class:
            parts.append("SLO class")
        return " × ".join(parts) or "one cell"

    def label(self, row) -> str:
        """A cell's readable name, e.g. ``input ≥4096 · output <256 · tenant acme``."""
        out = []
        if self.input_edges:
            out.append(f"input {bucket_labels(self.input_edges)[int(row['input_bucket'])]}")
        if self.output_edges:
            out.append(f"output {bucket_labels(self.output_edges)[int(row['output_bucket'])]}")
        if self.tenant:
            out.append(f"tenant {row['tenant']}")
        if self.slo_class:
            out.append(f"class {row['slo_class']}")
        return " · ".join(out) or "all"

    def index_of(self, input_tokens, output_tokens) -> tuple[np.ndarray, np.ndarray]:
        """Bucket indices of token counts (numbers of edges ≤ value)."""
        i = np.searchsorted(np.asarray(self.input_edges), np.asarray(input_tokens, float), side="right")
        o = np.searchsorted(np.asarray(self.output_edges), np.asarray(output_tokens, float), side="right")
        return i.astype(np.int64), o.astype(np.int64)


@dataclass(frozen=True)
class TargetMix:
    """Target share per cell. ``frame``: the ``buckets.dims`` columns, ``requests`` (counted in
    the trace, NaN for a table given as shares), ``share`` (sums to 1), ``label``."""

    buckets: Buckets
    frame: pd.DataFrame
    period: str  # "day" (the whole trace), "peak hour …", or "table"
    source: str
    n_requests: float = math.nan
    notes: tuple[str, ...] = ()

    def to_frame(self) -> pd.DataFrame:
        return self.frame.copy()

    def shares(self) -> dict[tuple, float]:
        """Cell key (values of ``buckets.dims``) → share."""
        dims = list(self.buckets.dims)
        return {tuple(r[d] for d in dims): float(r["share"]) for _, r in self.frame.iterrows()}

    def to_text(self) -> str:
        head = f"target mix ({self.period}) from {self.source}: {self.buckets.describe()}"
        if self.n_requests == self.n_requests:
            head += f"; {self.n_requests:,.0f} requests"
        lines = [head] + [f"  {r['label']:<40} {r['share']:7.1%}" for _, r in self.frame.iterrows()]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def figure(self):
        import plotly.graph_objects as go

        fig = go.Figure(go.Bar(x=self.frame["label"], y=self.frame["share"]))
        fig.update_layout(title=f"Target mix — {self.period}", yaxis_title="share of requests",
                          yaxis_tickformat=".0%", template="plotly_white")
        return fig


# ----------------------------------------------------------------------------- traces


def _open(path: Path):
    import duckdb

    suffix = path.suffix.lower()
    con = duckdb.connect()
    try:  # the relational API takes the path as a value: nothing is formatted into SQL
        reader = (con.read_parquet if suffix in (".parquet", ".pq") else
                  con.read_json if suffix in (".jsonl", ".json", ".ndjson") else con.read_csv)
        reader(str(path)).create_view("trace")
        cols = con.execute("DESCRIBE trace").fetchall()
    except duckdb.Error as exc:
        con.close()
        raise SpecError(f"cannot read the target trace: {str(exc).splitlines()[0]}", file=str(path),
                        fix="give a parquet, CSV (with a header row) or JSON-lines file") from None
    return con, {c[0]: c[1] for c in cols}


def _column(cols: dict, kind: str, given: str | None, path: Path, required: bool) -> str | None:
    if given is not None:
        if given not in cols:
            raise SpecError(f"the target trace has no column {given!r} (columns: {', '.join(cols)})",
                            file=str(path), field=f"{kind}_column", fix="name an existing column")
        return given
    low = {c.lower(): c for c in cols}
    for a in _ALIASES[kind]:
        if a in low:
            return low[a]
    if required:
        raise SpecError(f"the target trace has no {kind}-token column (looked for "
                        f"{', '.join(_ALIASES[kind])}; columns: {', '.join(cols)})", file=str(path),
                        field=f"{kind}_column", fix=f"name it {_ALIASES[kind][0]} or pass the column name")
    return None


def _time_sql(col: str, dtype: str, con, path: Path) -> str:
    """SQL for epoch seconds (double) of the time column: timestamps as such; numbers by
    magnitude (s, ms, µs, ns); text cast to a timestamp."""
    q = f'"{col}"'
    d = dtype.upper()
    if "TIMESTAMP" in d or d == "DATE":
        return f"epoch({q})"
    if any(t in d for t in ("INT", "DOUBLE", "FLOAT", "DECIMAL", "REAL")):
        mag = con.execute(f"SELECT max(abs({q})) FROM trace").fetchone()[0] or 0
        div = 1e9 if mag > 1e17 else 1e6 if mag > 1e14 else 1e3 if mag > 1e11 else 1.0
        if col.lower() == "timestamp" and mag < 1e11 and "INT" in d:
            div = 1e3  # Mooncake-style relative millisecond stamps
        return f"CAST({q} AS DOUBLE) / {div}"
    return f"epoch(CAST({q} AS TIMESTAMP))"


def target_from_trace(path: str | os.PathLike, buckets: Buckets = Buckets(), *, period: str = "day",
                      input_column: str | None = None, output_column: str | None = None,
                      time_column: str | None = None) -> TargetMix:
    """The mix of a production trace: ``period`` "day" (every request) or "peak_hour" (the
    clock hour with the most requests; needs timestamps)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("target trace file not found", file=str(p),
                        fix="give a parquet/CSV/JSON-lines file of production requests, or a bucket table")
    if period not in ("day", "peak_hour"):
        raise SpecError(f"unknown period {period!r}", field="period", fix="use day or peak_hour")
    con, cols = _open(p)
    try:
        cin = _column(cols, "input", input_column, p, True)
        cout = _column(cols, "output", output_column, p, bool(buckets.output_edges))
        ct = _column(cols, "time", time_column, p, period == "peak_hour")
        exprs, params = [], []
        for d, col, edges in (("input_bucket", cin, buckets.input_edges),
                              ("output_bucket", cout, buckets.output_edges)):
            if edges:
                exprs.append(" + ".join(f'CAST(coalesce("{col}", 0) >= ? AS INTEGER)' for _ in edges)
                             + f" AS {d}")
                params += list(edges)
        for d in ("tenant", "slo_class"):
            if getattr(buckets, d):
                c = _column(cols, d, None, p, True)
                exprs.append(f"coalesce(CAST(\"{c}\" AS VARCHAR), ?) AS {d}")
                params.append(NONE_LABEL)
        where, wparams, notes = "", [], []
        label = "day"
        if ct is not None:
            tsql = _time_sql(ct, cols[ct], con, p)
            span = con.execute(f"SELECT min({tsql}), max({tsql}), count(*) FROM trace").fetchone()
            if period == "peak_hour":
                hour, n_peak = con.execute(
                    f"SELECT floor({tsql} / 3600) AS h, count(*) AS c FROM trace WHERE {tsql} IS NOT NULL "
                    "GROUP BY h ORDER BY c DESC, h LIMIT 1").fetchone()
                where, wparams = f"WHERE floor({tsql} / 3600) = ?", [hour]
                if span[0] is not None and span[0] < 1e9:  # relative times (before 2001): no clock
                    label = f"peak hour (hour {hour:.0f}–{hour + 1:.0f} from the trace's time zero)"
                else:
                    start = pd.Timestamp(hour * 3600, unit="s", tz="UTC")
                    label = f"peak hour {start:%Y-%m-%d %H:%M}–{start + pd.Timedelta(hours=1):%H:%M} UTC"
                hours = (span[1] - span[0]) / 3600 if span[0] is not None else 0
                if hours < 2:
                    notes.append(f"the trace spans only {hours:.2g} h: its peak hour is most of it")
            else:
                hours = (span[1] - span[0]) / 3600 if span[0] is not None else 0
                label = f"day ({hours:.3g} h of trace)" if hours < 20 else "day"
        if not exprs:
            raise SpecError("a target mix needs at least one cell dimension", field="buckets",
                            fix="give input edges (e.g. 1024,4096), output edges, tenant or slo_class")
        df = con.execute(f"SELECT {', '.join(buckets.dims)}, count(*) AS requests "
                         f"FROM (SELECT {', '.join(exprs)} FROM trace {where}) GROUP BY ALL ORDER BY ALL",
                         params + wparams).df()
        n_bad = con.execute(f'SELECT count(*) FROM trace WHERE "{cin}" IS NULL OR "{cin}" < 0').fetchone()[0]
    finally:
        con.close()
    if n_bad:
        notes.append(f"{n_bad} trace row(s) without a valid input-token count were counted in the first "
                     "input bucket")
    return _finish(buckets, df, label, str(p), notes)


#: the periods of a production trace's mix, in the order they are fitted and shown
PERIODS = ("day", "peak_hour")


def load_target_periods(path, buckets: Buckets = Buckets(), periods=PERIODS,
                        **kw) -> tuple[dict[str, TargetMix], tuple[str, ...]]:
    """The target's mix in each of ``periods`` (:func:`load_target`), and what was left out: a
    bucket table has one mix (period "table") whatever was asked; a trace without timestamps has
    no peak hour — left out with a note when the day is asked too, an error when it is not."""
    out, notes = {}, []
    for period in periods:
        try:
            tg = load_target(path, buckets, period=period, **kw)
        except SpecError as exc:
            if period == "peak_hour" and exc.field == "time_column" and "day" in periods:
                notes.append("the target has no timestamps: the day's mix only")
                continue
            raise
        out[period] = tg
        if tg.period == "table":
            break  # a table has no periods
    return out, tuple(notes)


def _finish(buckets: Buckets, df: pd.DataFrame, period: str, source: str, notes) -> TargetMix:
    df = df.copy()
    total = float(df["requests"].sum())
    if not total > 0:
        raise SpecError("the target mix has no requests", file=source, fix="check the trace or the table")
    df["share"] = df["requests"] / total
    df["label"] = [buckets.label(r) for _, r in df.iterrows()]
    return TargetMix(buckets=buckets, frame=df.reset_index(drop=True), period=period, source=source,
                     n_requests=total, notes=tuple(notes))


# ----------------------------------------------------------------------------- tables


def _bounds(df: pd.DataFrame, lo: str, hi: str, file: str) -> tuple[tuple[float, ...], np.ndarray]:
    a = pd.to_numeric(df[lo], errors="coerce").fillna(0.0).to_numpy(float)
    b = pd.to_numeric(df[hi], errors="coerce").to_numpy(float) if hi in df.columns else np.full(len(df), np.nan)
    b = np.where(np.isnan(b), np.inf, b)
    if (b <= a).any():
        row = int(np.flatnonzero(b <= a)[0])
        raise SpecError(f"bucket table row {row + 1}: {hi} {b[row]:g} is not above {lo} {a[row]:g}",
                        file=file, field=hi, fix="each row is a range [min, max) of token counts")
    edges = tuple(sorted({float(v) for v in np.concatenate([a, b]) if v > 0 and np.isfinite(v)}))
    idx = np.searchsorted(np.asarray(edges), a, side="right")
    # the row must be exactly one bucket: [edges[i-1], edges[i])
    top = np.asarray(edges + (np.inf,))[idx]
    if not np.all(top == b):
        row = int(np.flatnonzero(top != b)[0])
        raise SpecError(f"bucket table row {row + 1} ([{a[row]:g}, {b[row]:g})) spans several buckets of "
                        f"the edges {list(edges)}", file=file, field=lo,
                        fix="give one row per bucket: every row's range between two consecutive edges")
    return edges, idx.astype(np.int64)


def target_from_table(source, *, tenant: bool | None = None, slo_class: bool | None = None) -> TargetMix:
    """A bucket table (CSV/parquet path or frame): ``input_min``, ``input_max`` [,
    ``output_min``, ``output_max``] [, ``tenant``] [, ``slo_class``], and ``share`` or
    ``requests``. Cells not listed have share 0."""
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if not p.is_file():
            raise SpecError("bucket table not found", file=str(p), fix="give a CSV or parquet file")
        df = pd.read_parquet(p) if p.suffix.lower() in (".parquet", ".pq") else pd.read_csv(p)
        file = str(p)
    else:
        df, file = pd.DataFrame(source), "bucket table"
    if "input_min" not in df.columns:
        raise SpecError("bucket table has no input_min column", file=file, field="input_min",
                        fix="columns: input_min, input_max[, output_min, output_max][, tenant][, slo_class], share")
    wcol = "share" if "share" in df.columns else "requests" if "requests" in df.columns else None
    if wcol is None:
        raise SpecError("bucket table has neither a share nor a requests column", file=file,
                        fix="add share (fractions) or requests (counts)")
    w = pd.to_numeric(df[wcol], errors="coerce")
    if w.isna().any() or (w < 0).any():
        row = int(np.flatnonzero((w.isna() | (w < 0)).to_numpy())[0])
        raise SpecError(f"bucket table row {row + 1}: {wcol} {df[wcol].iloc[row]!r} is not a number ≥ 0",
                        file=file, field=wcol, fix=f"every row needs a {wcol} ≥ 0")
    in_edges, in_idx = _bounds(df, "input_min", "input_max", file)
    out_edges, out_idx = ((), None)
    if "output_min" in df.columns:
        out_edges, out_idx = _bounds(df, "output_min", "output_max", file)
    b = Buckets(input_edges=in_edges, output_edges=out_edges,
                tenant=("tenant" in df.columns) if tenant is None else tenant,
                slo_class=("slo_class" in df.columns) if slo_class is None else slo_class)
    out = pd.DataFrame({"input_bucket": in_idx})
    if out_idx is not None:
        out["output_bucket"] = out_idx
    for d in ("tenant", "slo_class"):
        if getattr(b, d):
            out[d] = df[d].fillna(NONE_LABEL).astype(str).to_numpy()
    dims = list(b.dims)
    if out.duplicated(dims).any():
        row = int(np.flatnonzero(out.duplicated(dims).to_numpy())[0])
        raise SpecError(f"bucket table row {row + 1} repeats a cell", file=file, fix="one row per cell")
    out["requests"] = w.to_numpy(float) if wcol == "requests" else np.nan
    total = float(w.sum())
    if not total > 0:
        raise SpecError("the bucket table's shares add up to 0", file=file, field=wcol)
    out["share"] = w.to_numpy(float) / total
    notes = []
    if wcol == "share" and abs(total - 1) > 1e-6:
        notes.append(f"the table's shares add up to {total:.4g}; they were scaled to 1")
    out["label"] = [b.label(r) for _, r in out.iterrows()]
    return TargetMix(buckets=b, frame=out.sort_values(dims).reset_index(drop=True), period="table",
                     source=file, n_requests=float(w.sum()) if wcol == "requests" else math.nan,
                     notes=tuple(notes))


def load_target(path, buckets: Buckets = Buckets(), *, period: str = "day", **kw) -> TargetMix:
    """A bucket table when the file has ``input_min`` and ``share``/``requests`` columns, else a
    production trace counted into ``buckets``."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() in (".csv", ".parquet", ".pq"):
        con, cols = _open(p)
        con.close()
        if "input_min" in cols and ({"share", "requests"} & set(cols)):
            return target_from_table(p)
    return target_from_trace(p, buckets, period=period, **kw)


def parse_edges(text: str | None, field_: str) -> tuple[float, ...]:
    """``"1024,4096"`` → (1024.0, 4096.0); empty or "none" → ()."""
    if text is None or str(text).strip().lower() in ("", "none"):
        return ()
    out = []
    for part in str(text).split(","):
        out.append(S.number(part.strip(), field_, above=0.0, text_ok=True, example="1024,4096"))
    return tuple(out)


