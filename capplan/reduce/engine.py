"""``reduce_study``: one ordered table of the window's requests, one grouped pass per
(unit[, cell]) in DuckDB, and the high-cardinality counts (histogram keys, tail keys and grid
codes by unit) with ``np.bincount`` on the per-request columns that the block length needs
anyway (see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import contract as C
from .. import diagnostics as dg
from .. import sketch
from ..errors import SpecError, StudyError
from ..metrics import Window, good_predicate, request_view
from ..slo import SLO
from ..study import Study, open_study
from .sql import (ITL_COL, KEY_COL, STATUS_CODE_SQL, TTFT_COL, cell_sql, fixed_conditions,
                  grid_code_params, grid_code_sql, key_sql)
from .stats import (KEY_MISSING, TAIL_FROM, BlockStats, CellStats, GridSpec, RunStats,
                    block_length, max_length)
from .units import MAX_UNITS, METRICS, NONE_LABEL, Cells, CountUnits, TimeUnits, bucket_labels

GRID_STEP = 1.10
GRID_HALF = 14
MSER_BINS = 500

def _np(study: Study, q: str, params=None) -> dict:
    """Fetch a query as numpy columns (no pandas round trip for large results); NULL reads
    NaN in float columns and 0 in the others."""
    res = study.sql(q, params if params is not None else []).fetchnumpy()
    out = {}
    for k, v in res.items():
        if isinstance(v, np.ma.MaskedArray):
            v = v.filled(np.nan if np.issubdtype(v.dtype, np.floating) else 0)
        out[k] = np.asarray(v)
    return out


def _dense(idx: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Sums of ``values`` by index into ``size`` slots (empty units and cells read 0)."""
    w = np.nan_to_num(values.astype(np.float64))
    return np.bincount(idx.astype(np.int64), weights=w, minlength=size)


def resolve_window(study: Study, warmup, ttft_col: str = "ttft_ms"
                   ) -> tuple[Window, dict, dict]:
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
    bins = pd.DataFrame(columns=["run_id", "bin", "n", "ttft", "t0"])
    if need:
        whole = request_view(study, Window.of(study, 0.0))
        bins = study.sql(f"""
            WITH s AS (SELECT run_id, greatest(max(scheduled_ns), 1) AS tmax FROM {whole}
                       GROUP BY run_id)
            SELECT m.run_id,
                   least(CAST(floor(m.scheduled_ns * CAST(? AS DOUBLE) / s.tmax) AS BIGINT), ? - 1) AS bin,
                   count(*) AS n, avg(m.{ttft_col}) AS ttft, min(m.t_s) AS t0
            FROM {whole} m JOIN s USING (run_id) GROUP BY ALL""", [MSER_BINS, MSER_BINS]).df()
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
            trending = dg.trend_test(dg.batch_means(y, np.ones_like(y))).trending
            late[r.run_id] = not trending
            out[r.run_id] = 0.0  # overloaded or unusable: no cut
        else:
            out[r.run_id] = float(t0[res.index]) if 0 < res.index < t0.size else 0.0
    return Window.of(study, out), src, late


@dataclass(frozen=True)
class _Plan:
    """What one reduction computes (built once, read by every query)."""

    slo: SLO
    window: Window
    view: str
    ttft_col: str
    y_metric: str
    y_col: str
    alpha: float
    ktype: str
    key_cols: dict          # key column -> request-view expression
    pw_keys: tuple          # (metric, key column) of the block-length latency series
    x_limited: bool
    y_limited: bool
    stored_codes: tuple     # grid codes computed in the table (the axes the SLO limits)
    cells: Cells | None
    cell_sql: str
    cell_params: list
    cell_values: dict       # dimension -> list of values (tenant, slo_class)


def reduce_study(study, slo, *, warmup="manifest", units: CountUnits | TimeUnits | None = None,
                 cells: Cells | None = None, alpha: float = sketch.DEFAULT_ALPHA,
                 max_units: int | None = None, grid_step: float = GRID_STEP,
                 grid_half: int = GRID_HALF, tail_from: float = TAIL_FROM,
                 lag_limit_ms: float | None = None) -> BlockStats:
    """Reduce a study to per-(run, unit[, cell]) statistics for ``slo`` (see the
    ``capplan.reduce`` docstring).

    ``warmup``: a ``metrics.Window``, or "manifest" / "mser" / "none" / seconds /
    {run_id: seconds} (``resolve_window``); ``units``: ``CountUnits`` (default, with
    ``max_units``) or ``TimeUnits``; ``cells``: ``Cells`` or None."""
    study = open_study(study) if not isinstance(study, Study) else study
    slo = SLO.parse(slo)
    if units is None:
        units = CountUnits(MAX_UNITS if max_units is None else max_units)
    elif max_units is not None:
        raise SpecError("give max_units inside CountUnits, not beside units", field="max_units")
    if not isinstance(units, (CountUnits, TimeUnits)):
        raise SpecError(f"units must be CountUnits or TimeUnits, got {type(units).__name__}",
                        field="units")
    ttft_col = TTFT_COL[slo.ttft_from]
    y_metric = "itl" if (slo.itl_ms is not None and slo.tpot_ms is None) else "tpot"
    y_col = "tpot_ms" if y_metric == "tpot" else ITL_COL[slo.itl_stat]
    window, warm_src, warm_late = resolve_window(study, warmup, ttft_col)
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
                                             values.get("slo_class", []))
    plan = _Plan(slo=slo, window=window, view=view, ttft_col=ttft_col, y_metric=y_metric,
                 y_col=y_col, alpha=alpha, ktype="SMALLINT" if alpha >= 1e-3 else "INTEGER",
                 key_cols=key_cols, pw_keys=tuple(pw_keys), x_limited=slo.ttft_ms is not None,
                 y_limited=getattr(slo, f"{y_metric}_ms") is not None,
                 stored_codes=tuple(c for c, lim in (("jx", slo.ttft_ms),
                                                     ("jy", getattr(slo, f"{y_metric}_ms")))
                                    if lim is not None), cells=cells,
                 cell_sql=cell_code, cell_params=cell_params, cell_values=values)
    grid_x = (float(slo.ttft_ms), grid_step) if plan.x_limited else None
    grid_y = (float(getattr(slo, f"{y_metric}_ms")), grid_step) if plan.y_limited else None
    try:
        _build_table(study, plan, grid_x, grid_y, grid_half, tie_break=False)
        pw = _fetch_series(study, plan, tie_break=False)
        if _has_ties(pw):  # ties in scheduled time: re-sort with a request_id tie-break
            _build_table(study, plan, grid_x, grid_y, grid_half, tie_break=True)
            pw = _fetch_series(study, plan, tie_break=True)
        _unit_table(study, plan, units)
        return _reduce_from_table(study, plan, units, pw, warm_src, warm_late, grid_step,
                                  grid_half, tail_from, lag_limit_ms)
    finally:
        study.sql("DROP VIEW IF EXISTS _cp_u")
        study.sql("DROP TABLE IF EXISTS _cp_meta")
        study.sql("DROP TABLE IF EXISTS _cp_req")


def _build_table(study: Study, plan: _Plan, grid_x, grid_y, half: int, *,
                 tie_break: bool) -> None:
    """The window's requests in scheduled order, compact columns. A CTAS
    with ORDER BY keeps that order in rowid (DuckDB's preserve_insertion_order, set here)."""
    ln_g = math.log(sketch.gamma_of(plan.alpha))
    good_sql, good_params = good_predicate(plan.slo, alias="m")
    fixed_sql, fixed_params = fixed_conditions(plan.slo, plan.y_metric)
    cols = ["CAST(m.run_idx AS SMALLINT) AS run_idx", "m.scheduled_ns AS sched"]
    params: list = []
    if tie_break:
        cols.append("hash(m.request_id) AS h")
    cols += [f"{good_sql} AS good",
             f"(m.status = 'ok' AND m.first_token_ns IS NOT NULL AND {fixed_sql}) AS base",
             f"CAST({STATUS_CODE_SQL} AS TINYINT) AS st",
             f"CAST(m.{plan.ttft_col} AS FLOAT) AS ttft",
             "CAST(m.e2e_ms / 1e3 AS FLOAT) AS soj"]
    params += good_params + fixed_params
    k_min = int(sketch.keys(sketch.MIN_VALUE, plan.alpha))
    for k, c in plan.key_cols.items():
        cols.append(f"{key_sql(c, plan.ktype)} AS {k}")
        params += [k_min, ln_g]
    for name, col, g in (("jx", f"m.{plan.ttft_col}", grid_x), ("jy", f"m.{plan.y_col}", grid_y)):
        if g is not None:
            cols.append(f"{grid_code_sql(col)} AS {name}")
            params += grid_code_params(g[0], g[1], half)
    if plan.cells is not None:
        cols += [f"{plan.cell_sql} AS cell",
                 "CAST(coalesce(m.input_tokens, 0) AS BIGINT) AS tok_in",
                 "CAST(coalesce(m.output_tokens, 0) AS BIGINT) AS tok_out",
                 "m.first_token_ns IS NOT NULL AS started"]
        params += plan.cell_params
    order = "run_idx, sched, h" if tie_break else "run_idx, sched"
    study.sql("SET preserve_insertion_order = true")
    study.sql(f"""CREATE OR REPLACE TEMP TABLE _cp_req AS
                  SELECT {", ".join(cols)} FROM {plan.view} m WHERE m.in_window
                  ORDER BY {order}""", params)


def _fetch_series(study: Study, plan: _Plan, *, tie_break: bool) -> dict:
    """The per-request columns in scheduled order (a plain scan returns rowid order under
    preserve_insertion_order; checked here): run, time, good, status code, every log-bucket
    key (missing ⇒ ``KEY_MISSING``), the grid eligibility and stored grid codes, and after a
    tie-break the request hash. Counting with many groups (histogram keys × runs, tail keys ×
    units, grid codes × units) is done on these arrays with ``np.bincount``, which is an order
    of magnitude cheaper than a hash aggregate with as many groups."""
    cols = ["run_idx", "sched", "good", "st", "base"]
    cols += [f"coalesce({k}, {KEY_MISSING}) AS {k}" for k in plan.key_cols]
    cols += [c for c in ("jx", "jy") if c in plan.stored_codes]
    if tie_break:
        cols.append("h")
    pw = _np(study, f"SELECT {', '.join(cols)} FROM _cp_req")
    pr = pw["run_idx"]
    if pr.size and np.any(pr[1:] < pr[:-1]):
        raise StudyError("internal: the reduction lost the scheduled order of requests",
                         fix="report this; set preserve_insertion_order = true in DuckDB")
    return pw


def _has_ties(pw: dict) -> bool:
    """Two requests of a run at the same scheduled time (their order is then arbitrary)."""
    if "h" in pw or pw["sched"].size < 2:
        return False
    same_run = pw["run_idx"][1:] == pw["run_idx"][:-1]
    return bool(np.any(same_run & (pw["sched"][1:] == pw["sched"][:-1])))


def _unit_table(study: Study, plan: _Plan, units) -> None:
    """``_cp_meta`` (per run: unit rule) and the view ``_cp_u`` (each request's unit)."""
    if isinstance(units, CountUnits):
        study.sql("""CREATE OR REPLACE TEMP TABLE _cp_meta AS
                     SELECT run_idx, min(rowid) AS first_row, count(*) AS n_run,
                            least(count(*), CAST(? AS BIGINT)) AS n_units,
                            max(sched) / 1e9 AS t_last
                     FROM _cp_req GROUP BY run_idx""", [int(units.max_units)])
        study.sql("""CREATE OR REPLACE TEMP VIEW _cp_u AS
                     SELECT q.*, m.t_last, q.sched / 1e9 AS t_s,
                            CAST((q.rowid - m.first_row) * m.n_units // m.n_run AS INTEGER) AS unit
                     FROM _cp_req q JOIN _cp_meta m USING (run_idx)""")
        return
    rows = []
    for i, r in enumerate(study.manifest.runs):
        n = units.count(r.run_id)
        rows.append({"run_idx": i, "origin_ns": units.origin_ns(r.run_id, plan.window),
                     "width_ns": units.width_ns(r.run_id), "n_given": -1 if n is None else n})
    study.con.register("_cp_time_df", pd.DataFrame(rows).astype("int64"))
    try:
        study.sql("""CREATE OR REPLACE TEMP TABLE _cp_meta AS
                     SELECT t.run_idx, t.origin_ns, t.width_ns,
                            CASE WHEN t.n_given > 0 THEN t.n_given ELSE
                                 greatest(1, (q.last - t.origin_ns) // t.width_ns + 1) END
                                AS n_units,
                            q.last / 1e9 AS t_last
                     FROM _cp_time_df t
                     JOIN (SELECT run_idx, max(sched) AS last FROM _cp_req GROUP BY run_idx) q
                     USING (run_idx)""")
    finally:
        study.con.unregister("_cp_time_df")
    study.sql("""CREATE OR REPLACE TEMP VIEW _cp_u AS
                 SELECT q.*, m.t_last, q.sched / 1e9 AS t_s,
                        CAST(least(m.n_units - 1, greatest(0, (q.sched - m.origin_ns)
                             // m.width_ns)) AS INTEGER) AS unit
                 FROM _cp_req q JOIN _cp_meta m USING (run_idx)""")


def _anchor_key(hists: list[dict], metric: str) -> int | None:
    """Bucket key of the pooled 90th percentile of ``metric`` over every run."""
    parts = [h[metric] for h in hists if metric in h and h[metric][1].sum() > 0]
    if not parts:
        return None
    k0 = min(p[0] for p in parts)
    size = max(p[0] + p[1].size for p in parts) - k0
    tot = np.zeros(size)
    for a, c in parts:
        tot[a - k0: a - k0 + c.size] += c
    cum = np.cumsum(tot)
    return k0 + int(np.searchsorted(cum, 0.9 * cum[-1]))


def _reduce_from_table(study: Study, plan: _Plan, units, pw: dict, warm_src, warm_late,
                       grid_step, half, tail_from, lag_limit_ms) -> BlockStats:
    runs = study.manifest.runs
    nr = len(runs)
    with_cells = plan.cells is not None
    meta = _np(study, "SELECT * FROM _cp_meta")
    unit_rule = {int(ri): row for ri, *row in zip(
        meta["run_idx"], meta["n_units"], meta.get("origin_ns", meta["n_units"] * 0),
        meta.get("width_ns", meta["n_units"] * 0))}
    bounds = np.searchsorted(pw["run_idx"], np.arange(nr + 1), side="left")
    slices = [slice(int(bounds[i]), int(bounds[i + 1])) for i in range(nr)]
    pool = ThreadPoolExecutor(max_workers=2)  # numpy and FFT release the GIL, DuckDB too
    try:
        # 1. per run, on two threads: whole-run histograms, tail thresholds, block lengths
        first = [pool.submit(_run_series, pw, sl, plan, tail_from) for sl in slices]
        # ... while DuckDB sums per (unit[, cell]): counts, Little's-law and token sums
        status_cols = ", ".join(f"count_if(st = {i}) AS st_{s}"
                                for i, s in enumerate(C.STATUSES))
        ok_counts = ", ".join(f"count_if(st = 0 AND {KEY_COL[m]} IS NOT NULL) AS cnt_{m}"
                              for m in METRICS if KEY_COL[m] in plan.key_cols)
        cell_cols = (", cell, sum(tok_in) AS input_tokens, sum(tok_out) AS output_tokens, "
                     "sum(tok_in) FILTER (WHERE started) AS input_tokens_started"
                     if with_cells else "")
        u = _np(study, f"""
            SELECT run_idx, unit{cell_cols}, count(*) AS n, count_if(good) AS n_good,
                   count_if(st = 0) AS n_ok, {status_cols}, {ok_counts},
                   min(t_s) AS t0, max(t_s) AS t1, sum(ttft) AS ttft_sum, count(ttft) AS ttft_n,
                   coalesce(sum(greatest(0.0, least(t_s + soj, t_last) - t_s)), 0) AS busy_s,
                   coalesce(sum(soj), 0) AS soj_s
            FROM _cp_u GROUP BY ALL""")
        ch = None  # per-(unit, cell) histograms of ok requests
        if with_cells and plan.cells.hist:
            parts = [f"SELECT run_idx, unit, cell, {METRICS.index(m)} AS metric, "
                     f"{KEY_COL[m]} AS k FROM _cp_u WHERE st = 0 AND {KEY_COL[m]} IS NOT NULL"
                     for m in plan.cells.hist if KEY_COL[m] in plan.key_cols]
            if parts:
                ch = _np(study, f"SELECT run_idx, unit, cell, metric, k, count(*) AS c FROM "
                                f"({' UNION ALL '.join(parts)}) GROUP BY ALL")
        per_run = [f.result() for f in first]
        # 2. the SLO grid spec (an axis without a limit is anchored on the pooled p90 bucket),
        #    then per run: grid counts and tail histograms by unit
        gspec = _grid_spec(plan, [r["hist"] for r in per_run], grid_step, half)
        second = [pool.submit(_run_units, pw, sl, plan, units, unit_rule.get(i, (0, 0, 1)),
                              gspec, per_run[i]) for i, sl in enumerate(slices)]
        by_unit = [f.result() for f in second]
    finally:
        pool.shutdown(wait=True)
    cell_index, cell_of = (_cell_index(plan, u) if with_cells else (None, None))
    return _assemble(study, plan, units, u, ch, per_run, by_unit, gspec, cell_index, cell_of,
                     unit_rule, warm_src, warm_late, tail_from, lag_limit_ms)


def _run_series(pw: dict, sl: slice, plan: _Plan, tail_from: float) -> dict:
    """One run's whole-run histograms (latency of ok requests; generator lag of all), the key
    above which its tail histograms start, its block lengths and duplicated events."""
    st = pw["st"][sl]
    ok = st == 0
    hist, thresholds = {}, {}
    for m in METRICS + ("gen_lag_ms",):
        k = KEY_COL[m]
        if k not in plan.key_cols:
            continue
        keys = pw[k][sl]
        sel = keys != KEY_MISSING
        if m in METRICS:
            sel &= ok
        if not sel.any():
            continue
        kk = keys[sel].astype(np.int64)
        k0 = int(kk.min())
        dense = np.bincount(kk - k0).astype(np.int64)
        hist[m] = (k0, dense)
        if m in METRICS:
            cum = np.cumsum(dense)
            thresholds[m] = k0 + int(np.searchsorted(cum, tail_from * cum[-1]))
    good = pw["good"][sl].astype(np.float64)
    lat = {m: pw[c][sl] for m, c in plan.pw_keys}
    s = pw["sched"][sl]
    dups = 0
    if "h" in pw and s.size > 1:  # adjacent equal (scheduled_ns, hash(request_id)): twice
        hs = pw["h"][sl]
        dups = int(np.sum((hs[1:] == hs[:-1]) & (s[1:] == s[:-1])))
    return {"hist": hist, "thresholds": thresholds, "block": block_length(good, lat),
            "dups": dups}


def _unit_of(pw: dict, sl: slice, units, rule) -> tuple[np.ndarray, int]:
    """Each request's unit (as the SQL of ``_cp_u`` computes it) and the run's unit count."""
    n_units, origin_ns, width_ns = (int(v) for v in rule)
    n = sl.stop - sl.start
    if isinstance(units, CountUnits):
        return (np.arange(n, dtype=np.int64) * n_units) // max(n, 1), n_units
    u = (pw["sched"][sl].astype(np.int64) - origin_ns) // width_ns
    return np.clip(u, 0, n_units - 1), n_units


def _run_units(pw: dict, sl: slice, plan: _Plan, units, rule, gspec: GridSpec,
               series: dict) -> dict:
    """One run's cumulative grid counts (units × G × G) and per-unit tail histograms."""
    unit, nu = _unit_of(pw, sl, units, rule)
    G = gspec.size
    base = pw["base"][sl].astype(bool)
    codes = []
    for axis, col, key in (("x", "jx", "kt"), ("y", "jy", KEY_COL[plan.y_metric])):
        if col in plan.stored_codes:
            codes.append(pw[col][sl].astype(np.int64))
            continue
        ka, per = gspec.x_keys if axis == "x" else gspec.y_keys
        if key not in plan.key_cols:
            codes.append(np.zeros(unit.size, dtype=np.int64))
            continue
        k = pw[key][sl].astype(np.int64)
        c = np.clip(gspec.half - ((ka - k) // per), 0, 2 * gspec.half + 1)  # h + ⌈(k−ka)/d⌉
        codes.append(np.where(k == KEY_MISSING, 0, c))
    flat = (unit[base] * G + codes[0][base]) * G + codes[1][base]
    cells = np.bincount(flat, minlength=nu * G * G).reshape(nu, G, G)
    grid = cells.cumsum(axis=1).cumsum(axis=2)
    grid = grid.astype(np.int32 if unit.size < 2**31 else np.int64)
    tails = {}
    ok = pw["st"][sl] == 0
    for m, th in series["thresholds"].items():
        k0, dense_run = series["hist"][m]
        nb = k0 + dense_run.size - th
        keys = pw[KEY_COL[m]][sl]
        sel = ok & (keys != KEY_MISSING) & (keys >= th)
        idx = unit[sel] * nb + (keys[sel].astype(np.int64) - th)
        tails[m] = (int(th), np.bincount(idx, minlength=nu * nb).reshape(nu, nb).astype(
            np.float64))
    return {"grid": grid, "tails": tails, "n_units": nu}


def _grid_spec(plan: _Plan, hists: list[dict], grid_step: float, half: int) -> GridSpec:
    """Limited axes: anchor = the limit, step ``grid_step``; the others: anchor = the pooled
    p90 bucket edge, step = the whole number of buckets nearest to ``grid_step``."""
    g = sketch.gamma_of(plan.alpha)
    per_step = max(1, int(round(math.log(grid_step) / math.log(g))))
    axes = {}
    for axis, metric, limited in (("x", "ttft", plan.x_limited),
                                  ("y", plan.y_metric, plan.y_limited)):
        if limited:
            lim = plan.slo.ttft_ms if axis == "x" else getattr(plan.slo, f"{plan.y_metric}_ms")
            axes[axis] = (float(lim), grid_step, (0, 0))
            continue
        ka = _anchor_key(hists, metric)
        ka = 0 if ka is None else ka  # no data for the metric: every count is the same
        axes[axis] = (g ** ka, g ** per_step, (ka, per_step))
    return GridSpec("ttft", plan.y_metric, axes["x"][0], axes["y"][0], axes["x"][1],
                    axes["y"][1], half, axes["x"][2], axes["y"][2])


def _cell_index(plan: _Plan, u: dict) -> tuple[pd.DataFrame, np.ndarray]:
    """The observed cells, decoded from their mixed-radix codes, in code order; and the map
    code → dense cell number."""
    cells = plan.cells
    codes = np.unique(u["cell"].astype(np.int64))
    radix = []
    if cells.input_edges:
        radix.append(("input_bucket", len(cells.input_edges) + 1))
    if cells.output_edges:
        radix.append(("output_bucket", len(cells.output_edges) + 1))
    if cells.quadrant_split is not None:
        radix += [("input_long", 2), ("output_long", 2)]
    if cells.tenant:
        radix.append(("tenant", max(len(plan.cell_values["tenant"]), 1)))
    if cells.slo_class:
        radix.append(("slo_class", max(len(plan.cell_values["slo_class"]), 1)))
    cols, rest = {}, codes.copy()
    for name, r in reversed(radix):
        cols[name] = rest % r
        rest = rest // r
    frame = pd.DataFrame({"cell": np.arange(codes.size)})
    for name, _ in radix:
        v = cols[name]
        if name in ("tenant", "slo_class"):
            frame[name] = [plan.cell_values[name][i] for i in v]
        elif name in ("input_long", "output_long"):
            frame[name] = v.astype(bool)
        else:
            frame[name] = v.astype(np.int64)
            edges = cells.input_edges if name == "input_bucket" else cells.output_edges
            frame[name + "_label"] = [bucket_labels(edges)[i] for i in v]
    return frame, codes


def _assemble(study, plan, units, u, ch, per_run, by_unit, gspec, cell_index, cell_of,
              unit_rule, warm_src, warm_late, tail_from, lag_limit_ms) -> BlockStats:
    runs = study.manifest.runs
    slo, alpha = plan.slo, plan.alpha
    n_cells = 0 if cell_index is None else len(cell_index)
    skip = {"run_idx", "unit", "cell", "t0", "t1"}
    sum_cols = [c for c in u if c not in skip]
    u_run = u["run_idx"].astype(np.int64)
    out_runs, diags = [], []
    closed = study.manifest.load_model == "closed"
    for i, r in enumerate(runs):
        sel = u_run == i
        nu = by_unit[i]["n_units"]
        hist = per_run[i]["hist"]
        uu = u["unit"][sel].astype(np.int64)
        res = {c: _dense(uu, u[c][sel], nu) for c in sum_cols}
        res["t0"] = np.full(nu, np.nan)
        res["t1"] = np.full(nu, np.nan)
        if nu:
            np.fmin.at(res["t0"], uu, u["t0"][sel].astype(np.float64))
            np.fmax.at(res["t1"], uu, u["t1"][sel].astype(np.float64))
        with np.errstate(invalid="ignore", divide="ignore"):
            res["ttft_mean"] = res["ttft_sum"] / res["ttft_n"]
        cstats = None
        if n_cells:
            ci = np.searchsorted(cell_of, u["cell"][sel].astype(np.int64))
            flat = uu * n_cells + ci
            names = ["n", "n_good", "n_ok", *[f"st_{s}" for s in C.STATUSES],
                     "input_tokens", "output_tokens", "input_tokens_started"]
            sums = {c: _dense(flat, np.nan_to_num(u[c][sel].astype(np.float64)),
                              nu * n_cells).reshape(nu, n_cells) for c in names}
            chist = {}
            if ch is not None:
                cs = ch["run_idx"].astype(np.int64) == i
                for m in plan.cells.hist:
                    mm = cs & (ch["metric"] == METRICS.index(m))
                    chist[m] = (ch["unit"][mm].astype(np.int64),
                                np.searchsorted(cell_of, ch["cell"][mm].astype(np.int64)),
                                ch["k"][mm].astype(np.int64), ch["c"][mm].astype(np.int64))
            cstats = CellStats(sums=sums, hist=chist)
        n = int(res["n"].sum()) if nu else 0
        unit_size = n / nu if nu else 1.0
        grid = by_unit[i]["grid"]
        # tails (dense units × bins, plus the count below each tail)
        tails = {} if not nu else {
            m: (th, dense, res[f"cnt_{m}"] - dense.sum(axis=1))
            for m, (th, dense) in by_unit[i]["tails"].items()}
        (bl_good, bl_lat, bl_metric), dups = per_run[i]["block"], per_run[i]["dups"]
        bl = max_length(bl_good, bl_lat)
        t_first = float(np.nanmin(res["t0"])) if n else math.nan
        t_last = float(np.nanmax(res["t1"])) if n else math.nan
        span = t_last - t_first if n else math.nan
        measured = (n - 1) / span if n and span > 0 else math.nan
        # diagnostics
        tm_units, tw = res["ttft_mean"], res["ttft_n"]
        half_u = nu // 2
        bm = dg.batch_means(tm_units, tw)
        bm_end = dg.batch_means(tm_units[half_u:], tw[half_u:], dg.TREND_BATCHES // 2)
        lag = hist.get("gen_lag_ms")
        lag_p99 = (float(sketch.quantile_from_counts(lag[1], lag[0], 0.99, alpha))
                   if lag else math.nan)
        # Little: L̄ = Σ in-window flight time / T, λ·W̄ = Σ sojourn / T (requests with an end)
        littles = math.nan
        if n and span > 0 and res["soj_s"].sum() > 0:
            littles = float(res["busy_s"].sum() / res["soj_s"].sum())
        lag_limit = lag_limit_ms if lag_limit_ms is not None else max(
            dg.LAG_P99_MS, 0.1 * (slo.ttft_ms or 0.0))
        warm = plan.window.seconds(r.run_id)
        diags.append(dg.run_diagnostics(
            run_id=r.run_id, n=n, warmup_s=warm, warmup_source=warm_src[r.run_id],
            mser_second_half=warm_late[r.run_id], measured_rps=measured,
            nominal_rps=r.nominal_rps if r.nominal_rps is not None else r.offered_rps,
            gen_lag_p99_ms=lag_p99, littles=littles, trend_all=dg.trend_test(bm),
            trend_end=dg.trend_test(bm_end), duplicates=dups,
            lag_limit_ms=lag_limit, closed_loop=closed))
        out_runs.append(RunStats(
            run_id=r.run_id, run_idx=i, load_level=r.load_level, offered_rps=r.offered_rps,
            concurrency=None if r.concurrency is None else float(r.concurrency), repeat=r.repeat,
            nominal_rps=r.nominal_rps, warmup_s=warm, unit_size=unit_size,
            block_len=bl, units=res, grid=grid, hist=hist, tail=tails,
            measured_rps=measured, span_s=span, block_len_good=bl_good,
            block_len_latency=bl_lat, block_metric=bl_metric, cells=cstats))
    return BlockStats(slo=slo, alpha=alpha, load_model=study.manifest.load_model,
                      name=study.manifest.name, runs=tuple(out_runs), grid_spec=gspec,
                      diagnostics=dg.to_frame(diags), window=plan.window, unit_rule=units,
                      cells=plan.cells, cell_index=cell_index, tail_from=tail_from,
                      source=str(study.root))
