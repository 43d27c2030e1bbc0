"""Per-request metrics (SQL over the study's ``events`` view) and the SLO-good predicate.

Per request, in the view ``request_view(study, window)`` names (one view per steady window
``Window``; every caller states its window, and a view is never redefined):
- ``ttft_ms``      first_token − scheduled (coordinated-omission safe; the default SLO clock)
- ``ttft_sent_ms`` first_token − sent (what the client saw after it actually sent)
- ``tpot_ms``      (last − first) / (output_tokens − 1), NULL with fewer than 2 output tokens
- ``itl_p99_ms`` / ``itl_max_ms``  p99 (type 7) and max of the request's ``itl_ns`` gaps
- ``e2e_ms``       last_token − scheduled;  ``e2e_sent_ms`` last_token − sent
- ``gen_lag_ms``   sent − scheduled (generator lag)
- ``queue_ms``     admitted − server_received (or − sent) where the server stamped it
- ``cached_input_tokens``  input − computed_input_tokens (prompt tokens found in the prefix
  cache), NULL where the study does not stamp ``computed_input_tokens``
- ``t_s``          scheduled time in seconds since the run's start
- ``in_window``    scheduled at or after the run's warm-up in the view's window (every such
  request counts, whenever it finished: an unfinished one is a violation, never dropped)

Per run: ``summarize`` (funnel, measured vs nominal offered rate, throughput, percentiles with
the early-stopping sample rule, attainment and goodput). Notebook helpers: ``request_frame``
(one run's requests), ``breakdown`` (by tenant / class / token-length bucket), ``ecdf``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import contract as C
from .dialect import Dialect
from .earlystop import n_min
from .errors import StudyError
from .present import MISSING, fmt
from .slo import SLO, good_terms
from .study import Study

if TYPE_CHECKING:  # imported where used: the reduction's path stays light (test_cli_basic)
    import pandas as pd

#: a percentile cell of a metric the study does not record (the notebooks hide such tables)
NOT_RECORDED = f"{MISSING} (not recorded)"

REQUEST_VIEW_PREFIX = "request_metrics_"


@dataclass(frozen=True)
class Window:
    """The steady window of every run: requests *scheduled* at or after the run's warm-up
    count, whenever they finished (an unfinished one is a violation, never dropped).

    Every query over per-request metrics states its window (``request_view(study, window)``),
    so two consumers that need the same window (compare's rows, its C_SLO) say so, and no
    consumer changes what another one reads."""

    #: (run_id, warm-up seconds) for every manifest run, in manifest order
    warmup: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, study: Study, warmup_s: float | Mapping[str, float] | None = None) -> "Window":
        """None → the manifest's warm-ups (0 where it has none); a number → that for every
        run; a {run_id: seconds} map → those runs, the manifest's for the others."""
        if warmup_s is not None and not isinstance(warmup_s, Mapping):
            w = float(warmup_s)
            return cls(tuple((r.run_id, w) for r in study.manifest.runs))
        given = {str(k): float(v) for k, v in (warmup_s or {}).items()}
        return cls(tuple((r.run_id, given.get(r.run_id, float(r.warmup_s or 0.0)))
                         for r in study.manifest.runs))

    def seconds(self, run_id: str) -> float:
        for rid, w in self.warmup:
            if rid == run_id:
                return w
        raise KeyError(run_id)

    def as_dict(self) -> dict[str, float]:
        return dict(self.warmup)

    @property
    def key(self) -> str:
        """A short digest of the window (its warm-ups in whole ns), naming its view."""
        text = "\n".join(f"{rid}\t{int(round(w * C.NS_PER_S))}" for rid, w in self.warmup)
        return hashlib.sha1(text.encode()).hexdigest()[:12]


def request_view(study: Study, window: Window) -> str:
    """The name of a DuckDB view of per-request metrics (columns in the module docstring)
    whose ``in_window`` is ``window``. The name is the window's digest, so a name always means
    one window: the view is created on first use and never redefined (lazy: nothing is
    computed until queried)."""
    name = study.view_name(REQUEST_VIEW_PREFIX + window.key)
    runs_table = study.view_name("manifest_runs_" + window.key)
    if study.has_view(name):
        return name
    study.register(runs_table, window_runs(study.manifest, window))
    study.create_view(name, request_select(study.dialect, study.has("itl_ns"),
                                           study.events_view, runs_table))
    return name


def window_runs(manifest: C.Manifest, window: Window) -> dict[str, np.ndarray]:
    """The manifest's runs with their index and warm-up in ns: the table the per-request
    metrics join (``request_select``), as numpy columns (NaN: missing), which DuckDB
    registers as they are. Not a pandas frame, nor an Arrow table (pyarrow looks for pandas
    types and so imports it): the reduction's path stays free of pandas, which `capplan
    envelope` imports beside the reduction (tests/test_cli_basic.py)."""
    runs = manifest.runs

    def floats(name: str) -> np.ndarray:  # None reads NaN in a float64 array
        return np.array([getattr(r, name) for r in runs], dtype=np.float64)

    return {"run_id": np.array([r.run_id for r in runs], dtype=object),
            "run_idx": np.arange(len(runs), dtype=np.int16),
            "offered_rps": floats("offered_rps"), "concurrency": floats("concurrency"),
            "load_level": floats("load_level"),
            "repeat": np.array([r.repeat for r in runs], dtype=np.int64),
            "duration_s": floats("duration_s"),
            "warmup_ns": np.array([int(round(window.seconds(r.run_id) * C.NS_PER_S))
                                   for r in runs], dtype=np.int64)}


def request_select(dialect: Dialect, has_itl: bool, events: str, runs: str) -> str:
    """The SELECT of the per-request metrics (columns in the module docstring) over an events
    table and a table of manifest runs (run_id, run_idx, load_level, offered_rps,
    concurrency, repeat, duration_s, warmup_ns), in either engine's SQL: the one definition
    of TTFT, TPOT, ITL, E2E and the window that DuckDB's view and the Spark reduction share."""
    none = "CAST(NULL AS DOUBLE)"
    gaps = f"e.itl_ns IS NULL OR {dialect.list_len('e.itl_ns')} = 0"
    itl = (f"CASE WHEN {gaps} THEN NULL ELSE {dialect.list_quantile('e.itl_ns', 0.99)} / 1e6 END"
           if has_itl else none)
    itl_max = (f"CASE WHEN {gaps} THEN NULL ELSE {dialect.list_max('e.itl_ns')} / 1e6 END"
               if has_itl else none)
    # token counts beyond the three below pass through as the contract declares them
    more_tokens = "".join(f", e.{c.name}" for c in C.EVENT_COLUMNS if c.name.endswith("_tokens")
                          and c.name not in ("input_tokens", "output_tokens",
                                             "computed_input_tokens"))
    return f"""
        SELECT
            e.run_id, e.request_id, e.status, e.tenant, e.slo_class, e.replica_group,
            e.input_tokens, e.output_tokens,
            coalesce(e.computed_input_tokens, e.input_tokens) AS computed_input_tokens{more_tokens},
            e.input_tokens - e.computed_input_tokens AS cached_input_tokens,
            e.prefix_group, e.session_id,
            e.scheduled_ns, e.sent_ns, e.first_token_ns, e.last_token_ns,
            e.admitted_ns, e.server_received_ns, e.prefill_start_ns, e.itl_ns,
            m.run_idx, m.load_level, m.offered_rps, m.concurrency, m.repeat,
            e.scheduled_ns / 1e9 AS t_s,
            e.scheduled_ns >= m.warmup_ns AS in_window,
            (e.first_token_ns - e.scheduled_ns) / 1e6 AS ttft_ms,
            (e.first_token_ns - coalesce(e.sent_ns, e.scheduled_ns)) / 1e6 AS ttft_sent_ms,
            CASE WHEN e.output_tokens > 1 AND e.last_token_ns IS NOT NULL
                      AND e.first_token_ns IS NOT NULL
                 THEN (e.last_token_ns - e.first_token_ns) / 1e6 / (e.output_tokens - 1)
            END AS tpot_ms,
            {itl} AS itl_p99_ms,
            {itl_max} AS itl_max_ms,
            (e.last_token_ns - e.scheduled_ns) / 1e6 AS e2e_ms,
            (e.last_token_ns - coalesce(e.sent_ns, e.scheduled_ns)) / 1e6 AS e2e_sent_ms,
            (e.sent_ns - e.scheduled_ns) / 1e6 AS gen_lag_ms,
            (e.admitted_ns - coalesce(e.server_received_ns, e.sent_ns)) / 1e6 AS queue_ms
        FROM {events} e JOIN {runs} m ON e.run_id = m.run_id
    """


def good_predicate(slo: SLO, alias: str = "") -> tuple[str, list]:
    """SQL boolean expression 'this request is SLO-good' over ``request_view`` columns, with
    its bound parameters: ``capplan.slo.good_terms``, the rule the array mask
    (``capplan.slo.good_array``) is built from too. Missing metrics of an ok request (TPOT
    with one output token, ITL without a gap list) do not fail it; a missing first token does."""
    a = f"{alias}." if alias else ""
    parts = [f"{a}status = 'ok'", f"{a}first_token_ns IS NOT NULL"]
    params: list = []
    for t in good_terms(slo):
        col = f"{a}{t.column}"
        parts.append(f"({col} IS NULL OR {col} <= ?)" if t.missing_passes else f"{col} <= ?")
        params.append(t.limit_ms)
    return "(" + " AND ".join(parts) + ")", params


def class_good_predicate(classes, alias: str = "") -> tuple[str, list]:
    """'This request is SLO-good under its own class's SLO' (an ``SLOClasses``): a CASE on
    ``slo_class`` over :func:`good_predicate` of each class, the default SLO for any other
    class (FALSE when the file has no default). Docs: docs/mix.md, "SLO classes"."""
    a = f"{alias}." if alias else ""
    parts, params = [], []
    for name, s in classes.classes:
        pred, p = good_predicate(s, alias)
        parts.append(f"WHEN {a}slo_class = ? THEN {pred}")
        params += [name] + p
    if classes.default is not None:
        pred, p = good_predicate(classes.default, alias)
        els = pred
        params += p
    else:
        els = "FALSE"
    return f"(CASE {' '.join(parts)} ELSE {els} END)", params

# --------------------------------------------------------------------------------------------
# Per-run summary
# --------------------------------------------------------------------------------------------

#: Latency metrics summarised per run: (name, request view column; None = pooled ITL gaps).
#: Percentiles are over *completed* (status ok) requests of the steady window; rejected, failed
#: and unfinished requests are counted in the funnel and, under an SLO, as violations.
SUMMARY_METRICS: tuple[tuple[str, str | None], ...] = (
    ("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", None), ("e2e", "e2e_ms"),
)
EARLY_STOP_CONFIDENCE = 0.99
FUNNEL_COLUMNS = ("n_offered", "n_admitted", "n_started", "n_first_token", "n_completed")


def insufficient_text(n: int, p: float, confidence: float = EARLY_STOP_CONFIDENCE) -> str:
    """Shown instead of a percentile the sample cannot support
    (docs/statistics.md#sample-size-rules, t = 1)."""
    return f"insufficient samples (N = {int(n):,}, need {n_min(p, 1, confidence):,})"


def measured_rate_rps(n: int, first_ns, last_ns) -> float:
    """Offered rate measured from scheduled stamps, (N − 1) / (last − first): the interarrival
    estimator needs no nominal duration, so a harness that bunches its schedule shows."""
    import pandas as pd
    if n is None or first_ns is None or last_ns is None:
        return float("nan")
    if pd.isna(n) or pd.isna(first_ns) or pd.isna(last_ns) or n < 2 or not last_ns > first_ns:
        return float("nan")
    return (float(n) - 1.0) / ((float(last_ns) - float(first_ns)) / C.NS_PER_S)


@dataclass(frozen=True)
class RunSummary:
    """One row per manifest run, steady window only. ``to_frame()`` is numeric: a percentile
    the sample cannot support is NaN there and explained in ``notes``; ``display_frame()`` and
    ``to_text()`` show "insufficient samples (N = …, need …)" in its place."""

    table: pd.DataFrame = field(repr=False)
    slo: SLO | None = None
    percentiles: tuple[float, ...] = C.PERCENTILES
    percentile_definition: str = C.PERCENTILE_DEFINITION
    confidence: float = EARLY_STOP_CONFIDENCE

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(self.table["run_id"])

    def run(self, run_id: str) -> pd.Series:
        rows = self.table[self.table["run_id"] == run_id]
        if rows.empty:
            raise KeyError(run_id)
        return rows.iloc[0]

    def cell_text(self, row, metric: str, p: float) -> str:
        """A percentile as printed: the value, or why it is not shown."""
        import pandas as pd
        n = row[f"{metric}_n"]
        if pd.isna(n):
            return NOT_RECORDED
        if n < n_min(p, 1, self.confidence):
            return insufficient_text(n, p, self.confidence)
        v = row[C.pct_col(metric, p)]
        return fmt(v, ",.1f")

    def _key(self) -> pd.DataFrame:
        import pandas as pd
        t = self.table
        out = pd.DataFrame({"run_id": t["run_id"]})
        if t["offered_rps"].notna().any():
            out["offered_rps"] = t["offered_rps"].map(lambda v: "" if pd.isna(v) else f"{v:g}")
        if t["concurrency"].notna().any():
            out["concurrency"] = t["concurrency"].map(lambda v: "" if pd.isna(v) else f"{int(v)}")
        return out

    def display_frame(self, section: str = "all") -> pd.DataFrame:
        """Readable strings, one row per run keyed by run_id and load.
        ``section``: funnel, rates, latency, slo, engine or all."""
        import pandas as pd
        if section not in ("funnel", "rates", "latency", "slo", "engine", "all"):
            raise ValueError(f"unknown section {section!r}")
        t = self.table
        out = self._key()

        def ints(s):
            return s.map(lambda v: "" if pd.isna(v) else f"{int(v):,}")

        def nums(s, d=2):
            return s.map(lambda v: fmt(v, f",.{d}f"))

        if section in ("funnel", "all"):
            for c in (*FUNNEL_COLUMNS, *[f"n_{s}" for s in C.STATUSES], "n_excluded_warmup"):
                out[c.removeprefix("n_")] = ints(t[c])
        if section in ("rates", "all"):
            out["window_s"] = nums(t["window_s"], 1)
            out["measured_rps"] = nums(t["measured_offered_rps"], 3)
            out["measured/nominal"] = nums(t["rate_ratio"], 3)
            out["achieved_rps"] = nums(t["achieved_rps"], 3)
            out["output_tok_s"] = nums(t["output_tok_s"], 1)
            out["total_tok_s"] = nums(t["total_tok_s"], 1)
            out["computed_tok_s"] = nums(t["total_computed_tok_s"], 1)
        if section in ("latency", "all"):
            for metric, _ in SUMMARY_METRICS:
                for p in self.percentiles:
                    out[C.pct_col(metric, p)] = [self.cell_text(r, metric, p)
                                                         for _, r in t.iterrows()]
        if section in ("slo", "all") and self.slo is not None:
            out["good"] = ints(t["n_good"])
            out["attain_offered"] = nums(t["attainment_offered"], 4)
            out["attain_admitted"] = nums(t["attainment_admitted"], 4)
            out["goodput_rps"] = nums(t["goodput_rps"], 3)
            out["error_rate"] = nums(t["error_rate"], 4)
            out["meets_slo"] = t["meets_slo"].map(
                lambda v: MISSING if pd.isna(v) else ("yes" if v else "NO"))
        if section in ("engine", "all") and "engine_scrapes" in t:
            out = out.join(self._engine_cells(section == "engine"))
        return out

    def _engine_cells(self, with_attainment: bool) -> pd.DataFrame:
        """Preemptions (count, per 1k requests), peak KV usage, peak running and waiting, each
        "not recorded" where the engine's metrics do not say; attainment beside them."""
        import pandas as pd
        t = self.table

        def cells(col, fmt):
            return t[col].map(lambda v: "not recorded" if pd.isna(v) else fmt(v))

        out = pd.DataFrame(index=t.index)
        if with_attainment:
            out["requests"] = t["n_offered"].map(lambda v: f"{int(v):,}")
            if self.slo is not None:
                out["attain_offered"] = t["attainment_offered"].map(
                    lambda v: fmt(v, ".4f"))
        out["scrapes"] = t["engine_scrapes"].map(lambda v: f"{int(v)}")
        out["preemptions"] = cells("preemptions", lambda v: f"{v:,.0f}")
        out["preempt_per_1k"] = cells("preemptions_per_1k", lambda v: f"{v:,.1f}")
        out["kv_peak"] = cells("kv_usage_peak", lambda v: f"{100 * v:.1f}%")
        out["running_peak"] = cells("running_peak", lambda v: f"{v:,.0f}")
        out["waiting_peak"] = cells("waiting_peak", lambda v: f"{v:,.0f}")
        return out

    def to_text(self) -> str:
        """What `capplan summarize` prints: a block per section, one row per run in each."""
        parts = [
            "Funnel (steady window: every request scheduled after warm-up counts, whenever it "
            "finished)\n" + self.display_frame("funnel").to_string(index=False),
            "Rates (offered rate measured from scheduled_ns vs nominal; throughput over completed "
            "requests)\n" + self.display_frame("rates").to_string(index=False),
        ]
        lat = self.display_frame("latency")
        key = list(self._key().columns)
        for metric, _ in SUMMARY_METRICS:
            cols = {C.pct_col(metric, p): C.pct_label(p) for p in self.percentiles}
            block = lat[key + list(cols)].rename(columns=cols)
            parts.append(f"{metric.upper()} ms, completed requests "
                         f"({self.percentile_definition})\n" + block.to_string(index=False))
        if self.slo is not None:
            parts.append(f"SLO: {self.slo.describe()}. Good = status ok and every limit holds; "
                         "rejected, failed and unfinished requests are violations.\n"
                         + self.display_frame("slo").to_string(index=False))
        parts.append(self._engine_text())
        notes = [f"  {r.run_id}: {r.notes}" for r in self.table.itertuples() if r.notes]
        if notes:
            parts.append("Notes\n" + "\n".join(notes))
        return "\n\n".join(parts)


    def _engine_text(self) -> str:
        t = self.table
        if "engine_scrapes" not in t or not (t["engine_scrapes"] > 0).any():
            why = sorted(set(t["engine_note"])) if "engine_note" in t else []
            return ("Engine metrics: not recorded (" + "; ".join(w.removeprefix("not recorded (")
                                                          .removesuffix(")") for w in why)
                    + "). `capplan telemetry engine FILE --into STUDY` imports a recorded "
                      "/metrics file (docs/engine-metrics.md).")
        text = ("Engine metrics (the engine's own /metrics, scrapes in the steady window: "
                "preemptions = the counter's increase, restarts counted; peaks over the "
                "scrapes; docs/engine-metrics.md)\n"
                + self.display_frame("engine").to_string(index=False))
        notes = [f"  {r.run_id}: {r.engine_note}" for r in t.itertuples() if r.engine_note]
        return text + ("\n" + "\n".join(notes) if notes else "")


def _check_unknown_runs(study: Study) -> None:
    """Events whose run_id is not in the manifest would vanish from every per-run number."""
    row = study.sql(
        f"SELECT count(*), min(run_id) FROM {study.events_view} "
        f"WHERE NOT {study.dialect.list_contains('?', 'run_id')}",
        [list(study.manifest.run_ids)]).fetchone()
    if row[0]:
        raise StudyError(f"{row[0]:,} events have a run_id that is not in study.yaml",
                         file=str(study.root / C.MANIFEST_NAME), column="run_id",
                         example=f"run_id = {row[1]!r}",
                         fix="add the run to study.yaml 'runs:' or remove those events "
                             "(`capplan validate` lists every problem)", code="unknown_run")


def summarize(study: Study, slo: SLO | str | dict | None = None, *,
              warmup_s: float | dict[str, float] | None = None,
              confidence: float = EARLY_STOP_CONFIDENCE) -> RunSummary:
    """Per-run funnel, rates, latency percentiles and, with an SLO, attainment and goodput.

    Steady window: requests *scheduled* at or after the run's warm-up (manifest ``warmup_s``,
    or the override: one number for every run or a {run_id: seconds} map). Every such request
    counts, whenever it finished; one that never completed is a violation, never dropped.
    One grouped DuckDB pass over the events (plus one over the ITL gaps when present)."""
    slo = SLO.parse(slo) if slo is not None else None
    window = Window.of(study, warmup_s)
    view = request_view(study, window)
    _check_unknown_runs(study)
    pcts = [float(p) for p in C.PERCENTILES]
    good_sql, good_params = good_predicate(slo) if slo is not None else ("FALSE", [])
    params: list = list(C.STATUSES)
    status_cols = ", ".join(f"count_if(in_window AND status = ?) AS n_{s}" for s in C.STATUSES)
    metric_cols = []
    for name, col in SUMMARY_METRICS:
        if col is None:
            continue
        metric_cols.append(f"count({col}) FILTER (WHERE in_window AND status = 'ok') AS {name}_n")
        metric_cols.append(f"{study.dialect.quantiles(col)} "
                           f"FILTER (WHERE in_window AND status = 'ok') AS {name}_q")
        params.append(pcts)
    params.extend(good_params)
    df = study.sql(f"""
        SELECT run_id,
            count_if(in_window) AS n_offered,
            count_if(NOT in_window) AS n_excluded_warmup,
            count_if(in_window AND status <> 'rejected') AS n_admitted,
            count_if(in_window AND status <> 'rejected'
                     AND (prefill_start_ns IS NOT NULL OR first_token_ns IS NOT NULL)) AS n_started,
            count_if(in_window AND first_token_ns IS NOT NULL) AS n_first_token,
            count_if(in_window AND status = 'ok' AND last_token_ns IS NOT NULL) AS n_completed,
            {status_cols},
            min(scheduled_ns) FILTER (WHERE in_window) AS first_scheduled_ns,
            max(scheduled_ns) FILTER (WHERE in_window) AS last_scheduled_ns,
            max(greatest(scheduled_ns, sent_ns, first_token_ns, last_token_ns))
                FILTER (WHERE in_window) AS end_ns,
            sum(output_tokens) FILTER (WHERE in_window AND status = 'ok') AS out_tokens,
            sum(input_tokens) FILTER (WHERE in_window AND status = 'ok') AS in_tokens,
            sum(computed_input_tokens) FILTER (WHERE in_window AND status = 'ok') AS computed_in_tokens,
            {", ".join(metric_cols)},
            count_if(in_window AND {good_sql}) AS n_good
        FROM {view}
        GROUP BY run_id
    """, params).df()
    itl = None
    if study.has("itl_ns"):
        itl = study.sql(f"""
            SELECT run_id, count(*) AS itl_n, {study.dialect.quantiles('g / 1e6')} AS itl_q
            FROM (SELECT run_id, {study.dialect.explode('itl_ns')} AS g FROM {view}
                  WHERE in_window AND status = 'ok' AND itl_ns IS NOT NULL)
            GROUP BY run_id
        """, [pcts]).df()
    table = _assemble(study, window, df, itl, slo, confidence)
    return RunSummary(table=_with_engine(study, window, df, table), slo=slo, confidence=confidence)


def _with_engine(study: Study, window: Window, agg: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The engine's KV pressure beside each run (``capplan.engine_metrics.pressure``) over the
    run's steady window: from its warm-up to the last stamp of a window request."""
    import pandas as pd
    from . import engine_metrics

    ends = dict(zip(agg["run_id"], agg["end_ns"]))
    windows = {}
    for rid in table["run_id"]:
        lo = int(round(window.seconds(rid) * C.NS_PER_S))
        end = ends.get(rid)
        windows[rid] = (lo, lo - 1 if end is None or pd.isna(end) else int(end))
    engine = engine_metrics.pressure(engine_metrics.read(study.root), windows,
                                     dict(zip(table["run_id"], table["n_offered"])))
    at = list(table.columns).index("notes")
    out = table.drop(columns="notes").merge(engine, on="run_id", how="left")
    cols = list(table.columns[:at]) + list(engine_metrics.PRESSURE_COLUMNS) + ["notes"]
    return out.assign(notes=table["notes"].to_numpy())[cols]


def _assemble(study: Study, window: Window, agg: pd.DataFrame, itl: pd.DataFrame | None,
              slo: SLO | None, confidence: float) -> pd.DataFrame:
    """Manifest order, one row per run (runs without events included), derived rates and the
    early-stopping rule applied to every percentile."""
    import pandas as pd
    by_run = {r["run_id"]: r for r in agg.to_dict("records")}
    itl_by_run = {r["run_id"]: r for r in itl.to_dict("records")} if itl is not None else {}
    rows = []
    for spec in study.manifest.runs:
        a = by_run.get(spec.run_id, {})
        notes: list[str] = []
        row: dict = {
            "run_id": spec.run_id, "offered_rps": spec.offered_rps,
            "concurrency": spec.concurrency, "load_level": spec.load_level,
            "repeat": spec.repeat, "warmup_s": window.seconds(spec.run_id),
        }
        for c in (*FUNNEL_COLUMNS, *[f"n_{s}" for s in C.STATUSES], "n_excluded_warmup"):
            row[c] = int(_num(a.get(c), 0))
        n = row["n_offered"]
        first, last, end = (a.get(k) for k in ("first_scheduled_ns", "last_scheduled_ns", "end_ns"))
        window_s = (last - first) / C.NS_PER_S if n >= 2 else float("nan")
        elapsed_s = (end - first) / C.NS_PER_S if n >= 1 and not pd.isna(end) else float("nan")
        row["window_s"] = window_s
        row["elapsed_s"] = elapsed_s
        row["measured_offered_rps"] = measured_rate_rps(n, first, last)
        nominal = spec.offered_rps
        row["rate_ratio"] = (row["measured_offered_rps"] / nominal
                             if nominal and not math.isnan(row["measured_offered_rps"]) else float("nan"))
        per_s = (lambda x: x / elapsed_s) if elapsed_s and elapsed_s > 0 else (lambda x: float("nan"))
        out_tok = _num(a.get("out_tokens"), 0)
        in_tok = _num(a.get("in_tokens"), 0)
        comp_tok = _num(a.get("computed_in_tokens"), 0)
        row["achieved_rps"] = per_s(row["n_completed"])
        row["output_tok_s"] = per_s(out_tok)
        row["total_tok_s"] = per_s(in_tok + out_tok)
        row["total_computed_tok_s"] = per_s(comp_tok + out_tok)
        for name, col in SUMMARY_METRICS:
            if col is None:
                if study.has("itl_ns"):
                    src = itl_by_run.get(spec.run_id, {})
                    cnt, qs = int(_num(src.get("itl_n"), 0)), src.get("itl_q")
                else:
                    cnt, qs = float("nan"), None
            else:
                cnt, qs = int(_num(a.get(f"{name}_n"), 0)), a.get(f"{name}_q")
            row[f"{name}_n"] = cnt
            short = []
            for i, p in enumerate(C.PERCENTILES):
                ok = not pd.isna(cnt) and cnt >= n_min(p, 1, confidence) and qs is not None
                row[C.pct_col(name, p)] = float(qs[i]) if ok else float("nan")
                if not pd.isna(cnt) and cnt < n_min(p, 1, confidence):
                    short.append(p)
            if short and cnt > 0:
                notes.append(f"{name} {', '.join(C.pct_label(p) for p in short)}: "
                             f"insufficient samples (N = {cnt:,}, need "
                             + ", ".join(f"{n_min(p, 1, confidence):,}" for p in short) + ")")
        if slo is not None:
            good = int(_num(a.get("n_good"), 0))
            row["n_good"] = good
            row["n_violations"] = n - good
            row["attainment_offered"] = good / n if n else float("nan")
            adm = row["n_admitted"]
            row["attainment_admitted"] = good / adm if adm else float("nan")
            row["goodput_rps"] = per_s(good)
            row["error_rate"] = (n - row["n_ok"]) / n if n else float("nan")
            meets = (row["attainment_offered"] >= slo.attainment) if n else None
            if meets is not None and slo.max_error_rate is not None:
                meets = meets and row["error_rate"] <= slo.max_error_rate
            row["meets_slo"] = meets
        if n == 0:
            notes.insert(0, "no requests scheduled in the steady window")
        elif n == 1:
            notes.insert(0, "one request in the window: no rate can be measured")
        row["notes"] = "; ".join(notes)
        rows.append(row)
    df = pd.DataFrame(rows)
    if slo is not None:
        df["meets_slo"] = df["meets_slo"].astype("boolean")
    return df


def _num(v, default):
    import pandas as pd
    return default if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else v


# --------------------------------------------------------------------------------------------
# Notebook helpers (pure: a study in, a frame out)
# --------------------------------------------------------------------------------------------

REQUEST_FRAME_COLUMNS = (
    "run_id", "request_id", "status", "t_s", "in_window", "ttft_ms", "ttft_sent_ms", "tpot_ms",
    "itl_p99_ms", "itl_max_ms", "e2e_ms", "gen_lag_ms", "queue_ms", "input_tokens",
    "output_tokens", "computed_input_tokens", "tenant", "slo_class", "replica_group",
)


def request_frame(study: Study, run_id: str, *, slo: SLO | str | None = None,
                  warmup_s: float | dict[str, float] | None = None,
                  window_only: bool = False, columns=REQUEST_FRAME_COLUMNS) -> pd.DataFrame:
    """Per-request metrics of one run, in scheduled order (for CDFs and time series). With an
    SLO a boolean ``good`` column is added."""
    if run_id not in study.manifest.run_ids:
        raise StudyError(f"run {run_id!r} is not in study.yaml", file=str(study.root / C.MANIFEST_NAME),
                         column="run_id", fix="runs: " + ", ".join(study.manifest.run_ids))
    view = request_view(study, Window.of(study, warmup_s))
    unknown = [c for c in columns if c not in REQUEST_FRAME_COLUMNS]
    if unknown:
        raise ValueError(f"unknown request_frame column(s): {unknown}")
    select = ", ".join(columns)
    params: list = []
    if slo is not None:
        g, gp = good_predicate(SLO.parse(slo))
        select += f", {g} AS good"
        params.extend(gp)
    params.append(run_id)
    where = "run_id = ?" + (" AND in_window" if window_only else "")
    return study.sql(f"SELECT {select} FROM {view} WHERE {where} "
                     "ORDER BY scheduled_ns, request_id", params).df()


BREAKDOWN_KEYS = ("tenant", "slo_class", "replica_group", "status", "input_tokens", "output_tokens")


def breakdown(study: Study, by: str, *, slo: SLO | str | None = None,
              edges: list[float] | None = None, run_id: str | None = None,
              warmup_s: float | dict[str, float] | None = None) -> pd.DataFrame:
    """Steady-window requests grouped by run and a key: a string column (tenant, slo_class,
    replica_group, status) or a token count cut into buckets at ``edges`` (e.g. input_tokens
    with edges [256, 1024, 4096] gives <256, 256–1024, 1024–4096, ≥4096). Counts, completed,
    median and p99 TTFT/TPOT (type 7, no sample-size gate: read N), and with an SLO the good
    count and attainment over offered."""
    if by not in BREAKDOWN_KEYS:
        raise ValueError(f"breakdown by {by!r}: choose one of {', '.join(BREAKDOWN_KEYS)}")
    view = request_view(study, Window.of(study, warmup_s))
    params: list = []
    if by in ("input_tokens", "output_tokens"):
        edges = sorted(float(e) for e in (edges or [256, 1024, 4096]))
        cases = " ".join(f"WHEN {by} < ? THEN {i}" for i in range(len(edges)))
        key_sql = f"CASE {cases} ELSE {len(edges)} END"
        params.extend(edges)
        labels = ([f"<{edges[0]:g}"] + [f"{a:g}–{b:g}" for a, b in zip(edges, edges[1:])]
                  + [f"≥{edges[-1]:g}"])
    else:
        key_sql, labels = f"coalesce({by}, '(none)')", None
    good_sql, good_params = good_predicate(SLO.parse(slo)) if slo is not None else ("FALSE", [])
    params.extend(good_params)
    where = "in_window"
    if run_id is not None:
        where += " AND run_id = ?"
        params.append(run_id)
    df = study.sql(f"""
        SELECT run_id, {key_sql} AS key, count(*) AS n_offered,
               count_if(status = 'ok') AS n_completed,
               count_if({good_sql}) AS n_good,
               quantile_cont(ttft_ms, 0.5) FILTER (WHERE status = 'ok') AS ttft_p50_ms,
               quantile_cont(ttft_ms, 0.99) FILTER (WHERE status = 'ok') AS ttft_p99_ms,
               quantile_cont(tpot_ms, 0.5) FILTER (WHERE status = 'ok') AS tpot_p50_ms,
               quantile_cont(tpot_ms, 0.99) FILTER (WHERE status = 'ok') AS tpot_p99_ms
        FROM {view} WHERE {where}
        GROUP BY ALL ORDER BY run_id, key
    """, params).df()
    if labels is not None:
        df["key"] = df["key"].map(lambda i: labels[int(i)])
    df = df.rename(columns={"key": by if labels is None else f"{by}_bucket"})
    if slo is None:
        df = df.drop(columns="n_good")
    else:
        df["attainment_offered"] = df["n_good"] / df["n_offered"]
    return df


def ecdf(values) -> pd.DataFrame:
    """Empirical CDF of finite values: columns value, cdf (i/n), for step plots."""
    import pandas as pd
    x = np.sort(np.asarray(pd.Series(values).dropna(), dtype=float))
    x = x[np.isfinite(x)]
    return pd.DataFrame({"value": x, "cdf": np.arange(1, len(x) + 1) / max(len(x), 1)})
