"""The SQL of the reduction, in one place and for both engines (``capplan.dialect``): the
per-request columns (status code, SLO-good flag, grid eligibility, every log-bucket key, the
grid codes, the cell code), the tie rule of the scheduled order, and the unit index. Values are
bound parameters; identifiers come from the fixed tables here. DuckDB runs the per-request
columns in one ordered query, with the latencies in place of their keys and grid codes, which
numpy computes with the same operations (``count.request_codes``), and counts in numpy
(``engine``); Spark runs the same columns and aggregates them in SQL (``spark``); the
aggregations of both are listed side by side in ``sums``."""

from __future__ import annotations

import math

from .. import contract as C
from .. import sketch
from ..dialect import Dialect
from ..errors import SpecError
from ..metrics import good_predicate
from ..slo import SLO, good_terms
from .units import CACHE_LABELS, NONE_LABEL, Cells

TTFT_COL = {"scheduled": "ttft_ms", "sent": "ttft_sent_ms"}
ITL_COL = {"p99": "itl_p99_ms", "max": "itl_max_ms"}
KEY_COL = {"ttft": "kt", "tpot": "kp", "itl": "ki", "e2e": "ke", "gen_lag_ms": "kl"}
STATUS_CODE_SQL = ("CASE m.status " + " ".join(f"WHEN '{s}' THEN {i}"
                                                 for i, s in enumerate(C.STATUSES))
                    + f" ELSE {len(C.STATUSES)} END")
#: SMALLINT sentinel for a missing latency (failed request) in the per-request columns
KEY_MISSING = 32767
#: The scheduled order of a run's requests. Ties in scheduled_ns are broken by request_id
#: (byte order, the same in DuckDB and Spark), then by the token stamps, so that the order —
#: hence unit boundaries and the block-length series — is one total order in both engines.
ORDER_COLUMNS = ("scheduled_ns", "request_id", "first_token_ns", "last_token_ns")


def order_sql(alias: str = "m") -> str:
    return ", ".join(f"{alias}.{c} ASC NULLS LAST" for c in ORDER_COLUMNS)


def _f(x: float) -> str:
    """A float constant of the code as a DOUBLE literal (never user input)."""
    return f"CAST({float(x)!r} AS DOUBLE)"


def ln_sql(col: str) -> str:
    """ln of a latency, clamped as ``sketch.keys`` clamps (shared by its key and grid code)."""
    return f"ln(greatest({col}, {_f(sketch.MIN_VALUE)}))"


def key_sql(col: str, ktype: str) -> str:
    """Bucket key (``sketch.keys``); parameters: the key of ``sketch.MIN_VALUE`` (values at or
    below it share it, as ``sketch.keys`` clamps them; no logarithm is taken for them, e.g. a
    generator lag of 0), ln γ."""
    return (f"CAST(CASE WHEN {col} IS NULL THEN NULL WHEN {col} <= {_f(sketch.MIN_VALUE)} "
            f"THEN ? ELSE ceil(ln({col}) / ? - {_f(sketch.KEY_EPS)}) END AS {ktype})")


def grid_code_sql(col: str) -> str:
    """Grid code of a value on an axis anchored at a limit: 0…2h for the finite limits it
    meets, 2h+1 above them all, 0 when missing (a missing TPOT/ITL does not fail a request).
    Exact at the anchor (a comparison, not a logarithm); elsewhere ⌈(ln x − ln a)/ln s − ε⌉,
    so a value on a grid limit meets it in both engines (``capplan.dialect``). Parameters:
    anchor, h, ln anchor, ln step, 2h+1, h, ln anchor, ln step."""
    eps = _f(sketch.KEY_EPS)
    return (f"CAST(CASE WHEN {col} IS NULL THEN 0 "
            f"WHEN {col} <= ? THEN greatest(0, ? + CAST(ceil(({ln_sql(col)} - ?) / ? - {eps}) "
            "AS INTEGER)) "
            f"ELSE least(?, ? + greatest(1, CAST(ceil(({ln_sql(col)} - ?) / ? - {eps}) "
            "AS INTEGER))) END AS SMALLINT)")


def grid_code_params(anchor: float, step: float, half: int) -> list:
    la, ls = math.log(anchor), math.log(step)
    return [anchor, half, la, ls, 2 * half + 1, half, la, ls]


def key_code_sql(dialect: Dialect, key: str) -> str:
    """Grid code of a log-bucket key on an axis anchored at a bucket edge (the axes the SLO
    does not limit): h + ⌈(k − k_a)/d⌉ clipped to 0…2h+1, 0 when the key is missing (the
    numpy form is in ``engine``). Parameters: h, k_a, d, 2h+1."""
    c = f"(? - {dialect.floor_div(f'(? - {key})', '?')})"
    return (f"CASE WHEN {key} = {KEY_MISSING} THEN 0 ELSE least(greatest({c}, 0), ?) END")


def fixed_conditions(slo: SLO, y_metric: str) -> tuple[str, list]:
    """SQL for the SLO limits that the grid does not vary (columns of the request view m)."""
    parts, params = [], []
    if slo.e2e_ms is not None:
        parts.append("m.e2e_ms <= ?")
        params.append(float(slo.e2e_ms))
    if y_metric == "tpot" and slo.itl_ms is not None:
        c = f"m.{ITL_COL[slo.itl_stat]}"
        parts.append(f"({c} IS NULL OR {c} <= ?)")
        params.append(float(slo.itl_ms))
    if y_metric == "itl" and slo.tpot_ms is not None:
        parts.append("(m.tpot_ms IS NULL OR m.tpot_ms <= ?)")
        params.append(float(slo.tpot_ms))
    return (" AND ".join(parts) if parts else "TRUE"), params


def cell_sql(cells: Cells, tenants: list[str], classes: list[str],
             dialect: Dialect) -> tuple[str, list, list]:
    """Mixed-radix cell code over the asked dimensions, its parameters and the radices."""
    terms, params, radix = [], [], []
    if cells.input_edges:
        terms.append(" + ".join(f"CAST(coalesce(m.{cells.input_column}, 0) >= ? AS INTEGER)"
                                for _ in cells.input_edges))
        params += list(cells.input_edges)
        radix.append(len(cells.input_edges) + 1)
    if cells.output_edges:
        terms.append(" + ".join(f"CAST(coalesce(m.{cells.output_column}, 0) >= ? AS INTEGER)"
                                for _ in cells.output_edges))
        params += list(cells.output_edges)
        radix.append(len(cells.output_edges) + 1)
    if cells.quadrant_split is not None:
        terms.append(f"CAST(coalesce(m.{cells.input_column}, 0) > ? AS INTEGER)")
        terms.append(f"CAST(coalesce(m.{cells.output_column}, 0) > ? AS INTEGER)")
        params += list(cells.quadrant_split)
        radix += [2, 2]
    for on, col, values in ((cells.tenant, "tenant", tenants),
                            (cells.slo_class, "slo_class", classes)):
        if on:
            terms.append(f"({dialect.list_position('?', f'coalesce(m.{col}, ?)')} - 1)")
            params += [values, NONE_LABEL]
            radix.append(max(len(values), 1))
    if cells.cache:
        terms.append("(CASE WHEN m.cached_input_tokens IS NULL THEN 2 "
                     "WHEN m.cached_input_tokens > 0 THEN 1 ELSE 0 END)")
        radix.append(len(CACHE_LABELS))
    code, mult = "0", 1
    for t, r in zip(terms, radix):  # first dimension varies slowest
        code = f"({code}) * {r} + ({t})"
        mult *= r
    if mult >= 2**31:
        raise SpecError(f"too many cells ({mult:,}): use fewer bucket edges, tenants or classes",
                        field="cells")
    return f"CAST({code} AS INTEGER)", params, radix


def request_columns(plan, *, extra: tuple[str, ...] = (), values: bool = False
                    ) -> tuple[list[str], list]:
    """The per-request columns of the reduction (a ``ReducePlan``), in the plan's dialect:
    run, scheduled time, SLO-good, grid eligibility (``base``: status ok, a first token, the
    SLO's limits off the grid's axes), status code, TTFT and sojourn (float32, as counted),
    every log-bucket key (missing ⇒ ``KEY_MISSING``), the grid codes of the axes the SLO
    limits, and with cells the cell code and token counts. ``extra``: more expressions over
    the request view ``m``.

    ``values``: instead of SLO-good, ``base``, TTFT, sojourn, keys and grid codes, each
    latency they are computed from as DOUBLE (``v_<column>``, ``value_columns``), for the
    numpy executor, which computes them itself with the same operations
    (``count.request_codes``; SLO-good from the one rule's array form,
    ``capplan.slo.good_array``). DuckDB evaluates the CASE, coalesce, casts and boolean
    terms row by row, numpy's passes are vectorised: on 12 runs of 10^6 requests the keys
    and codes took 0.7 of the query's 3.2 CPU seconds, SLO-good and ``base`` ≈ 0.5 of the
    rest (benchmarks/README.md, issue 29); the numbers are the same. Spark keeps them in
    SQL. Returns the SELECT list and its parameters, in order."""
    cols = ["CAST(m.run_idx AS SMALLINT) AS run_idx", "m.scheduled_ns AS sched", *extra]
    params: list = []
    if not values:
        good_sql, good_params = good_predicate(plan.slo, alias="m")
        fixed_sql, fixed_params = fixed_conditions(plan.slo, plan.y_metric)
        cols += [f"coalesce({good_sql}, FALSE) AS good",
                 f"coalesce(m.status = 'ok' AND m.first_token_ns IS NOT NULL AND {fixed_sql}, "
                 "FALSE) AS base"]
        params += good_params + fixed_params
    cols.append(f"CAST({STATUS_CODE_SQL} AS TINYINT) AS st")
    if values:
        cols += [f"CAST(m.{c} AS DOUBLE) AS v_{c}" for c in value_columns(plan)]
    else:
        cols += [f"CAST(m.{plan.ttft_col} AS FLOAT) AS ttft",
                 "CAST(m.e2e_ms / 1e3 AS FLOAT) AS soj"]
        ln_g = math.log(sketch.gamma_of(plan.alpha))
        k_min = int(sketch.keys(sketch.MIN_VALUE, plan.alpha))
        for k, c in plan.key_cols.items():
            cols.append(f"coalesce({key_sql(c, plan.ktype)}, {KEY_MISSING}) AS {k}")
            params += [k_min, ln_g]
        for name, col, g in (("jx", f"m.{plan.ttft_col}", plan.grid_x),
                             ("jy", f"m.{plan.y_col}", plan.grid_y)):
            if g is not None:
                cols.append(f"{grid_code_sql(col)} AS {name}")
                params += grid_code_params(g[0], g[1], plan.grid_half)
    if plan.cells is not None:
        cols += [f"{plan.cell_sql} AS cell",
                 "CAST(coalesce(m.input_tokens, 0) AS BIGINT) AS tok_in",
                 "CAST(coalesce(m.output_tokens, 0) AS BIGINT) AS tok_out",
                 "CAST(coalesce(m.computed_input_tokens, 0) AS BIGINT) AS tok_comp",
                 "CAST(coalesce(m.max_output_tokens, m.output_tokens, 0) AS BIGINT) AS tok_ask",
                 "m.first_token_ns IS NOT NULL AS started"]
        params += plan.cell_params
    return cols, params


def value_columns(plan) -> list[str]:
    """The request-view latencies TTFT, sojourn, the keys, the grid codes and SLO-good are
    computed from (``request_columns(values=True)``), each once, in a fixed order."""
    cols = [plan.ttft_col, "e2e_ms", *(c.removeprefix("m.") for c in plan.key_cols.values())]
    if plan.grid_y is not None:
        cols.append(plan.y_col)
    cols += [t.column for t in good_terms(plan.slo)]
    return list(dict.fromkeys(cols))


def mser_bins_sql(view: str, ttft_col: str) -> str:
    """Per run, MSER time bins of the whole run (warm-up included): request count, mean TTFT
    and first scheduled second of each bin. Parameters: bins, bins."""
    return f"""
        WITH s AS (SELECT run_id, greatest(max(scheduled_ns), 1) AS tmax FROM {view}
                   GROUP BY run_id),
             b AS (SELECT m.run_id,
                          least(CAST(floor(m.scheduled_ns * CAST(? AS DOUBLE) / s.tmax) AS BIGINT),
                                ? - 1) AS bin,
                          m.{ttft_col} AS ttft, m.t_s AS t_s
                   FROM {view} m JOIN s ON m.run_id = s.run_id)
        SELECT run_id, bin, count(*) AS n, avg(ttft) AS ttft, min(t_s) AS t0
        FROM b GROUP BY run_id, bin"""
