"""The SQL fragments of the reduction, in one place. Values are bound parameters;
identifiers come from the fixed tables here. Plain SQL (CASE, arithmetic), so another engine can
run it unchanged."""

from __future__ import annotations

import math

from .. import contract as C
from .. import sketch
from ..errors import SpecError
from ..slo import SLO
from .units import CACHE_LABELS, NONE_LABEL, Cells

TTFT_COL = {"scheduled": "ttft_ms", "sent": "ttft_sent_ms"}
ITL_COL = {"p99": "itl_p99_ms", "max": "itl_max_ms"}
KEY_COL = {"ttft": "kt", "tpot": "kp", "itl": "ki", "e2e": "ke", "gen_lag_ms": "kl"}
STATUS_CODE_SQL = ("CASE m.status " + " ".join(f"WHEN '{s}' THEN {i}"
                                                 for i, s in enumerate(C.STATUSES))
                    + f" ELSE {len(C.STATUSES)} END")


def ln_sql(col: str) -> str:
    """ln of a latency, clamped as ``sketch.keys`` clamps (shared by its key and grid code)."""
    return f"ln(greatest({col}, {sketch.MIN_VALUE!r}))"


def key_sql(col: str, ktype: str) -> str:
    """Bucket key (``sketch.keys``); parameters: the key of ``sketch.MIN_VALUE`` (values at or
    below it share it, as ``sketch.keys`` clamps them; no logarithm is taken for them, e.g. a
    generator lag of 0), ln γ."""
    return (f"CAST(CASE WHEN {col} IS NULL THEN NULL WHEN {col} <= {sketch.MIN_VALUE!r} THEN ? "
            f"ELSE ceil(ln({col}) / ? - {sketch.KEY_EPS!r}) END AS {ktype})")


def grid_code_sql(col: str) -> str:
    """Grid code of a value on an axis anchored at a limit: 0…2h for the finite limits it
    meets, 2h+1 above them all, 0 when missing (a missing TPOT/ITL does not fail a request).
    Exact at the anchor (a comparison, not a logarithm). Parameters: anchor, h, ln anchor,
    ln step, 2h+1, h, ln anchor, ln step."""
    return (f"CAST(CASE WHEN {col} IS NULL THEN 0 "
            f"WHEN {col} <= ? THEN greatest(0, ? + CAST(ceil(({ln_sql(col)} - ?) / ?) AS INTEGER)) "
            f"ELSE least(?, ? + greatest(1, CAST(ceil(({ln_sql(col)} - ?) / ?) AS INTEGER))) END "
            "AS SMALLINT)")


def grid_code_params(anchor: float, step: float, half: int) -> list:
    la, ls = math.log(anchor), math.log(step)
    return [anchor, half, la, ls, 2 * half + 1, half, la, ls]


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


def cell_sql(cells: Cells, tenants: list[str], classes: list[str]) -> tuple[str, list, list]:
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
            terms.append(f"(list_position(?, coalesce(m.{col}, ?)) - 1)")
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
