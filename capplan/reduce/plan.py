"""What one reduction computes (``ReducePlan``, built once from the study, the SLO and the
window, read by both engines) and the steady window it runs on (``resolve_window``). Both
query the study through ``study.sql(...)`` in the study's own dialect, so a DuckDB ``Study``
and a ``SparkStudy`` are planned alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .. import diagnostics as dg
from ..dialect import Dialect
from ..errors import SpecError
from ..metrics import Window, request_view
from ..slo import SLO
from .sql import ITL_COL, TTFT_COL, cell_sql, mser_bins_sql
from .units import NONE_LABEL, Cells

MSER_BINS = 500


def resolve_window(study, warmup, ttft_col: str = "ttft_ms") -> tuple[Window, dict, dict]:
    """The steady window of a reduction: a ``Window`` is taken as given; a number or
    {run_id: s} too; "none" is 0; "manifest" uses the manifest's warmup_s and MSER-5 where it
    is absent; "mser" always MSER-5 (on time-bin TTFT means over the whole run). Returns
    (window, source, mser_second_half) — the last two keyed by run_id."""
    runs = study.manifest.runs
    late = {r.run_id: False for r in runs}
    if isinstance(warmup, Window):
        return warmup, {r.run_id: "given" for r in runs}, late
    if isinstance(warmup, bool):
        raise SpecError(f"unknown warmup {warmup!r}",
                        fix="use 'manifest', 'mser', 'none', seconds, or {run_id: seconds}")
    if isinstance(warmup, (Mapping, int, float)):
        return Window.of(study, warmup), {r.run_id: "given" for r in runs}, late
    if warmup in (None, "none"):
        return Window.of(study, 0.0), {r.run_id: "none" for r in runs}, late
    if warmup not in ("manifest", "mser"):
        raise SpecError(f"unknown warmup {warmup!r}",
                        fix="use 'manifest', 'mser', 'none', seconds, or {run_id: seconds}")
    need = {r.run_id for r in runs if warmup == "mser" or r.warmup_s is None}
    if need:
        # pandas only here: where the manifest gives every warm-up, `capplan envelope`
        # imports it beside the reduction (its Preload thread), not before it
        import pandas as pd

        whole = request_view(study, Window.of(study, 0.0))
        bins = study.sql(mser_bins_sql(whole, ttft_col), [MSER_BINS, MSER_BINS]).df()
    out, src = {}, {}
    for r in runs:
        if r.run_id not in need:
            out[r.run_id], src[r.run_id] = float(r.warmup_s), "manifest"
            continue
        b = bins[bins["run_id"] == r.run_id].sort_values("bin")
        y = b["ttft"].to_numpy(dtype=float)
        if y.size and np.isnan(y).all():
            y = np.zeros_like(y)
        y = pd.Series(y).ffill().bfill().to_numpy()
        res = dg.mser5(y)
        t0 = b["t0"].to_numpy(dtype=float)
        src[r.run_id] = "mser5"
        if res.in_second_half:
            # on a short run (a few hundred requests) MSER's truncation point is noise: only a
            # trend says the run never settled. The whole run is the window, and the run's
            # TTFT and attainment trends decide once the SLO is known (``reduce.assemble``)
            out[r.run_id] = 0.0
            src[r.run_id] = dg.MSER_LATE_FLAT
        else:
            out[r.run_id] = float(t0[res.index]) if 0 < res.index < t0.size else 0.0
    return Window.of(study, out), src, late


@dataclass(frozen=True)
class ReducePlan:
    """What one reduction computes (built once by ``reduction_plan``, read by every query)."""

    slo: SLO
    window: Window
    view: str               # the request view of the window (in the study's engine)
    dialect: Dialect
    ttft_col: str
    y_metric: str
    y_col: str
    alpha: float
    ktype: str
    key_cols: dict          # key column -> request-view expression
    pw_keys: tuple          # (metric, key column) of the block-length latency series
    x_limited: bool
    y_limited: bool
    stored_codes: tuple     # grid codes computed in SQL (the axes the SLO limits)
    grid_x: tuple | None    # (anchor, step) of a limited axis
    grid_y: tuple | None
    grid_step: float
    grid_half: int
    cells: Cells | None
    cell_sql: str
    cell_params: list
    cell_values: dict       # dimension -> list of values (tenant, slo_class)


def reduction_plan(study, slo: SLO, window: Window, *, cells: Cells | None, alpha: float,
                   grid_step: float, grid_half: int) -> ReducePlan:
    """The reduction's plan: which latency is the grid's second axis, which keys and grid
    codes the per-request columns hold, the block-length series and the cell code."""
    ttft_col = TTFT_COL[slo.ttft_from]
    y_metric = "itl" if (slo.itl_ms is not None and slo.tpot_ms is None) else "tpot"
    y_col = "tpot_ms" if y_metric == "tpot" else ITL_COL[slo.itl_stat]
    view = request_view(study, window)
    has_itl = study.has("itl_ns")
    key_cols = {"kt": f"m.{ttft_col}", "kp": "m.tpot_ms", "ke": "m.e2e_ms",
                "kl": "m.gen_lag_ms"}
    if has_itl:
        key_cols["ki"] = f"m.{ITL_COL[slo.itl_stat]}"
    pw_keys = [("ttft", "kt"), ("tpot", "kp")]
    if slo.itl_ms is not None and has_itl:
        pw_keys.append(("itl", "ki"))
    if slo.e2e_ms is not None:
        pw_keys.append(("e2e", "ke"))
    cell_code, cell_params, values = "", [], {}
    if cells is not None:
        for dim, col in (("tenant", "tenant"), ("slo_class", "slo_class")):
            if getattr(cells, dim):
                values[dim] = [r[0] for r in study.sql(
                    f"SELECT DISTINCT coalesce({col}, ?) AS v FROM {view} WHERE in_window "
                    "ORDER BY v", [NONE_LABEL]).fetchall()]
        cell_code, cell_params, _ = cell_sql(cells, values.get("tenant", []),
                                             values.get("slo_class", []), study.dialect)
    y_lim = getattr(slo, f"{y_metric}_ms")
    return ReducePlan(
        slo=slo, window=window, view=view, dialect=study.dialect, ttft_col=ttft_col,
        y_metric=y_metric, y_col=y_col, alpha=alpha,
        ktype="SMALLINT" if alpha >= 1e-3 else "INTEGER", key_cols=key_cols,
        pw_keys=tuple(pw_keys), x_limited=slo.ttft_ms is not None, y_limited=y_lim is not None,
        stored_codes=tuple(c for c, lim in (("jx", slo.ttft_ms), ("jy", y_lim))
                           if lim is not None),
        grid_x=(float(slo.ttft_ms), grid_step) if slo.ttft_ms is not None else None,
        grid_y=(float(y_lim), grid_step) if y_lim is not None else None,
        grid_step=grid_step, grid_half=grid_half, cells=cells, cell_sql=cell_code,
        cell_params=cell_params, cell_values=values)
