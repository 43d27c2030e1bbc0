"""Per-request metrics (SQL over the study's ``events`` view) and the SLO-good predicate.

Per request:
- ``ttft_ms``      first_token − scheduled (coordinated-omission safe; the default SLO clock)
- ``ttft_sent_ms`` first_token − sent (what the client saw after it actually sent)
- ``tpot_ms``      (last − first) / (output_tokens − 1), NULL with fewer than 2 output tokens
- ``itl_p99_ms`` / ``itl_max_ms``  p99 (type 7) and max of the request's ``itl_ns`` gaps
- ``e2e_ms``       last_token − scheduled;  ``e2e_sent_ms`` last_token − sent
- ``gen_lag_ms``   sent − scheduled (generator lag)
- ``queue_ms``     admitted − server_received (or − sent) where the server stamped it
- ``t_s``          scheduled time in seconds since the run's start
- ``in_window``    scheduled at or after the run's warm-up (every such request counts, whenever
  it finished: an unfinished one is a violation, never dropped)
"""

from __future__ import annotations

import pandas as pd

from . import contract as C
from .slo import SLO
from .study import Study

REQUEST_VIEW = "request_metrics"
RUNS_TABLE = "manifest_runs"


def register_runs(study: Study, warmup_s: dict[str, float] | None = None) -> None:
    """Register the manifest runs (run_id, load level, warm-up in ns) as a DuckDB table.
    ``warmup_s`` overrides the manifest's warm-up per run (e.g. from MSER-5)."""
    rows = []
    for r in study.manifest.runs:
        w = (warmup_s or {}).get(r.run_id, r.warmup_s)
        rows.append({
            "run_id": r.run_id,
            "offered_rps": r.offered_rps,
            "concurrency": r.concurrency,
            "load_level": r.load_level,
            "repeat": r.repeat,
            "duration_s": r.duration_s,
            "warmup_ns": int(round((w or 0.0) * C.NS_PER_S)),
        })
    df = pd.DataFrame(rows).astype({"run_id": "object", "offered_rps": "float64",
                                    "concurrency": "float64", "load_level": "float64",
                                    "repeat": "int64", "duration_s": "float64",
                                    "warmup_ns": "int64"})
    study.con.register("_manifest_runs_df", df)
    study.con.execute(f"CREATE OR REPLACE TABLE {RUNS_TABLE} AS SELECT * FROM _manifest_runs_df")
    study.con.unregister("_manifest_runs_df")


def create_request_view(study: Study, warmup_s: dict[str, float] | None = None) -> str:
    """Define the ``request_metrics`` view (lazy: nothing is computed until queried)."""
    register_runs(study, warmup_s)
    itl = (
        "CASE WHEN e.itl_ns IS NULL OR len(e.itl_ns) = 0 THEN NULL "
        "ELSE list_aggregate(e.itl_ns, 'quantile_cont', 0.99) / 1e6 END"
        if study.has("itl_ns") else "CAST(NULL AS DOUBLE)"
    )
    itl_max = (
        "CASE WHEN e.itl_ns IS NULL OR len(e.itl_ns) = 0 THEN NULL "
        "ELSE list_max(e.itl_ns) / 1e6 END" if study.has("itl_ns") else "CAST(NULL AS DOUBLE)"
    )
    study.con.execute(f"""
        CREATE OR REPLACE VIEW {REQUEST_VIEW} AS
        SELECT
            e.run_id, e.request_id, e.status, e.tenant, e.slo_class, e.replica_group,
            e.input_tokens, e.output_tokens,
            coalesce(e.computed_input_tokens, e.input_tokens) AS computed_input_tokens,
            e.scheduled_ns, e.sent_ns, e.first_token_ns, e.last_token_ns,
            e.admitted_ns, e.server_received_ns, e.prefill_start_ns,
            m.load_level, m.offered_rps, m.concurrency, m.repeat,
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
        FROM events e JOIN {RUNS_TABLE} m USING (run_id)
    """)
    return REQUEST_VIEW


def good_predicate(slo: SLO, alias: str = "") -> tuple[str, list]:
    """SQL boolean expression 'this request is SLO-good' over request_metrics columns, with
    its bound parameters. Missing metrics of an ok request (TPOT with one output token, ITL
    without a gap list) do not fail it; a missing first token does."""
    a = f"{alias}." if alias else ""
    ttft_col = f"{a}ttft_ms" if slo.ttft_from == "scheduled" else f"{a}ttft_sent_ms"
    itl_col = f"{a}itl_p99_ms" if slo.itl_stat == "p99" else f"{a}itl_max_ms"
    parts = [f"{a}status = 'ok'", f"{a}first_token_ns IS NOT NULL"]
    params: list = []
    if slo.ttft_ms is not None:
        parts.append(f"{ttft_col} <= ?")
        params.append(float(slo.ttft_ms))
    if slo.tpot_ms is not None:
        parts.append(f"({a}tpot_ms IS NULL OR {a}tpot_ms <= ?)")
        params.append(float(slo.tpot_ms))
    if slo.itl_ms is not None:
        parts.append(f"({itl_col} IS NULL OR {itl_col} <= ?)")
        params.append(float(slo.itl_ms))
    if slo.e2e_ms is not None:
        parts.append(f"{a}e2e_ms <= ?")
        params.append(float(slo.e2e_ms))
    return "(" + " AND ".join(parts) + ")", params
