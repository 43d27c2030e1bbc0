"""``reduce_study``: the window's requests from one ordered DuckDB query as compact numpy
columns, then every count with ``np.bincount``, per run on two threads (see the package
docstring)."""

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
from .units import (CACHE_LABELS, MAX_UNITS, METRICS, NONE_LABEL, Cells, CountUnits, TimeUnits,
                    bucket_labels)

GRID_STEP = 1.10
GRID_HALF = 14
MSER_BINS = 500

def fetch_arrays(study: Study, q: str, params=None) -> dict:
    """Fetch a query as numpy columns (no pandas round trip for large results); NULL reads
    NaN in float columns and 0 in the others."""
    res = study.sql(q, params if params is not None else []).fetchnumpy()
    out = {}
    for k, v in res.items():
        if isinstance(v, np.ma.MaskedArray):
            v = v.filled(np.nan if np.issubdtype(v.dtype, np.floating) else 0)
        out[k] = np.asarray(v)
    return out


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
    stored_codes: tuple     # grid codes computed in SQL (the axes the SLO limits)
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
    rq = _requests(study, plan, grid_x, grid_y, grid_half, tie_break=False)
    if _has_ties(rq):  # ties in scheduled time: sort again with a request_id tie-break
        rq = _requests(study, plan, grid_x, grid_y, grid_half, tie_break=True)
    return _reduce_arrays(study, plan, units, rq, warm_src, warm_late, grid_step, grid_half,
                          tail_from, lag_limit_ms)


def _requests(study: Study, plan: _Plan, grid_x, grid_y, half: int, *,
              tie_break: bool) -> dict:
    """The window's requests in scheduled order, as compact numpy columns: run, scheduled
    time, SLO-good, grid eligibility (``base``), status code, TTFT and sojourn (float32),
    every log-bucket key (each logarithm taken once, here; missing ⇒ ``KEY_MISSING``), the
    grid codes of the axes the SLO limits, and with cells the cell code and token counts.
    One DuckDB query (scan, per-request metrics, sort); every count after it is an
    ``np.bincount`` over these arrays — cheaper than materialising the sorted rows and
    grouping them again (a hash aggregate with ~1 M groups for the grid cost more than the
    sort), and what the block length needs anyway."""
    ln_g = math.log(sketch.gamma_of(plan.alpha))
    good_sql, good_params = good_predicate(plan.slo, alias="m")
    fixed_sql, fixed_params = fixed_conditions(plan.slo, plan.y_metric)
    cols = ["CAST(m.run_idx AS SMALLINT) AS run_idx", "m.scheduled_ns AS sched"]
    params: list = []
    if tie_break:
        cols.append("hash(m.request_id) AS h")
    cols += [f"coalesce({good_sql}, FALSE) AS good",
             f"coalesce(m.status = 'ok' AND m.first_token_ns IS NOT NULL AND {fixed_sql}, "
             "FALSE) AS base",
             f"CAST({STATUS_CODE_SQL} AS TINYINT) AS st",
             f"CAST(m.{plan.ttft_col} AS FLOAT) AS ttft",
             "CAST(m.e2e_ms / 1e3 AS FLOAT) AS soj"]
    params += good_params + fixed_params
    k_min = int(sketch.keys(sketch.MIN_VALUE, plan.alpha))
    for k, c in plan.key_cols.items():
        cols.append(f"coalesce({key_sql(c, plan.ktype)}, {KEY_MISSING}) AS {k}")
        params += [k_min, ln_g]
    for name, col, g in (("jx", f"m.{plan.ttft_col}", grid_x), ("jy", f"m.{plan.y_col}", grid_y)):
        if g is not None:
            cols.append(f"{grid_code_sql(col)} AS {name}")
            params += grid_code_params(g[0], g[1], half)
    if plan.cells is not None:
        cols += [f"{plan.cell_sql} AS cell",
                 "CAST(coalesce(m.input_tokens, 0) AS BIGINT) AS tok_in",
                 "CAST(coalesce(m.output_tokens, 0) AS BIGINT) AS tok_out",
                 "CAST(coalesce(m.computed_input_tokens, 0) AS BIGINT) AS tok_comp",
                 "CAST(coalesce(m.max_output_tokens, m.output_tokens, 0) AS BIGINT) AS tok_ask",
                 "m.first_token_ns IS NOT NULL AS started"]
        params += plan.cell_params
    order = "run_idx, sched, h" if tie_break else "run_idx, sched"
    rq = fetch_arrays(study, f"SELECT {', '.join(cols)} FROM {plan.view} m WHERE m.in_window "
                    f"ORDER BY {order}", params)
    pr = rq["run_idx"]
    if pr.size and np.any(pr[1:] < pr[:-1]):
        raise StudyError("internal: the reduction lost the scheduled order of requests",
                         fix="report this with the DuckDB version")
    return rq


def _has_ties(rq: dict) -> bool:
    """Two requests of a run at the same scheduled time (their order is then arbitrary)."""
    if "h" in rq or rq["sched"].size < 2:
        return False
    same_run = rq["run_idx"][1:] == rq["run_idx"][:-1]
    return bool(np.any(same_run & (rq["sched"][1:] == rq["sched"][:-1])))


def _units_of(rq: dict, sl: slice, units, run_id: str,
              window: Window) -> tuple[np.ndarray, int]:
    """Each request's unit and the run's unit count (``CountUnits``: ⌊rank·U/n⌋;
    ``TimeUnits``: ⌊(scheduled − origin)/width⌋ clipped to [0, U − 1]). Units are
    non-decreasing, since the requests are in scheduled order."""
    n = sl.stop - sl.start
    if isinstance(units, CountUnits):
        nu = min(int(units.max_units), n)
        return (np.arange(n, dtype=np.int64) * nu) // max(n, 1), nu
    origin, width = units.origin_ns(run_id, window), units.width_ns(run_id)
    u = (rq["sched"][sl].astype(np.int64) - origin) // width
    nu = units.count(run_id)
    if nu is None:
        nu = max(1, int(u[-1]) + 1) if n else 1
    return np.clip(u, 0, nu - 1), nu


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


def _reduce_arrays(study: Study, plan: _Plan, units, rq: dict, warm_src, warm_late,
                   grid_step, half, tail_from, lag_limit_ms) -> BlockStats:
    runs = study.manifest.runs
    nr = len(runs)
    bounds = np.searchsorted(rq["run_idx"], np.arange(nr + 1), side="left")
    slices = [slice(int(bounds[i]), int(bounds[i + 1])) for i in range(nr)]
    cell_codes = None
    if plan.cells is not None:  # the observed cells, in code order
        cell_codes = np.flatnonzero(np.bincount(rq["cell"].astype(np.int64)))
    # two threads (numpy's counting and scipy's FFT release the GIL): first per run the
    # whole-run histograms, tail thresholds and block lengths; then the SLO grid spec (an axis
    # without a limit is anchored on the pooled p90 bucket); then per run everything by unit
    with ThreadPoolExecutor(max_workers=2) as pool:
        per_run = list(pool.map(lambda sl: _run_series(rq, sl, plan, tail_from), slices))
        gspec = _grid_spec(plan, [r["hist"] for r in per_run], grid_step, half)
        by_unit = list(pool.map(
            lambda i: _run_units(rq, slices[i], plan, units, runs[i].run_id, gspec,
                                 per_run[i], cell_codes), range(nr)))
    cell_index = None if cell_codes is None else _cell_index(plan, cell_codes)
    return _assemble(study, plan, units, per_run, by_unit, gspec, cell_index, warm_src,
                     warm_late, tail_from, lag_limit_ms)


def _run_series(rq: dict, sl: slice, plan: _Plan, tail_from: float) -> dict:
    """One run's whole-run histograms (latency of ok requests; generator lag of all), the key
    above which its tail histograms start, its block lengths and duplicated events."""
    ok = rq["st"][sl] == 0
    hist, thresholds = {}, {}
    for m in METRICS + ("gen_lag_ms",):
        k = KEY_COL[m]
        if k not in plan.key_cols:
            continue
        keys = rq[k][sl]
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
    good = rq["good"][sl].astype(np.float64)
    lat = {m: rq[c][sl] for m, c in plan.pw_keys}
    s = rq["sched"][sl]
    dups = 0
    if "h" in rq and s.size > 1:  # adjacent equal (scheduled_ns, hash(request_id)): twice
        hs = rq["h"][sl]
        dups = int(np.sum((hs[1:] == hs[:-1]) & (s[1:] == s[:-1])))
    return {"hist": hist, "thresholds": thresholds, "block": block_length(good, lat),
            "dups": dups}


_STATUS_NAMES = [*C.STATUSES, "other"]


def _run_units(rq: dict, sl: slice, plan: _Plan, units, run_id: str, gspec: GridSpec,
               series: dict, cell_codes: np.ndarray | None) -> dict:
    """One run's per-unit arrays (counts, status counts, times, TTFT and Little's-law sums),
    its cumulative grid counts (units × G × G), per-unit tail histograms and, with cells,
    per-(unit, cell) sums and histograms."""
    unit, nu = _units_of(rq, sl, units, run_id, plan.window)
    n = unit.size
    st = rq["st"][sl].astype(np.int64)
    ok = st == 0
    good = rq["good"][sl]
    res = {"n": np.bincount(unit, minlength=nu).astype(np.float64),
           "n_good": np.bincount(unit, weights=good, minlength=nu)}
    ns = len(_STATUS_NAMES)
    by_status = np.bincount(unit * ns + np.minimum(st, ns - 1), minlength=nu * ns)
    by_status = by_status.reshape(nu, ns).astype(np.float64)
    res["n_ok"] = by_status[:, 0].copy()
    for j, s_ in enumerate(C.STATUSES):
        res[f"st_{s_}"] = by_status[:, j].copy()
    for m in METRICS:
        k = KEY_COL[m]
        if k in plan.key_cols:
            res[f"cnt_{m}"] = np.bincount(unit[ok & (rq[k][sl] != KEY_MISSING)],
                                          minlength=nu).astype(np.float64)
    # units are non-decreasing: a unit's first and last request bound its scheduled times
    t_s = rq["sched"][sl] / 1e9
    lo = np.searchsorted(unit, np.arange(nu), side="left")
    hi = np.searchsorted(unit, np.arange(nu), side="right") - 1
    has = hi >= lo
    res["t0"] = np.where(has, t_s[np.minimum(lo, max(n - 1, 0))] if n else np.nan, np.nan)
    res["t1"] = np.where(has, t_s[np.clip(hi, 0, max(n - 1, 0))] if n else np.nan, np.nan)
    ttft = rq["ttft"][sl].astype(np.float64)
    has_t = ~np.isnan(ttft)
    res["ttft_sum"] = np.bincount(unit[has_t], weights=ttft[has_t], minlength=nu)
    res["ttft_n"] = np.bincount(unit[has_t], minlength=nu).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        res["ttft_mean"] = res["ttft_sum"] / res["ttft_n"]
    # Little's law: time in flight inside the window (a request without an end counts until
    # the window's last scheduled time), and sojourns of the requests with an end
    soj = rq["soj"][sl].astype(np.float64)
    has_s = ~np.isnan(soj)
    t_last = float(t_s[-1]) if n else math.nan
    busy = np.maximum(0.0, np.minimum(np.where(has_s, t_s + soj, np.inf), t_last) - t_s)
    res["busy_s"] = np.bincount(unit, weights=busy, minlength=nu)
    res["soj_s"] = np.bincount(unit[has_s], weights=soj[has_s], minlength=nu)
    # the SLO grid: a stored code where the SLO limits the axis, else the code from the key
    G = gspec.size
    codes = []
    for axis, col, key in (("x", "jx", "kt"), ("y", "jy", KEY_COL[plan.y_metric])):
        if col in plan.stored_codes:
            codes.append(rq[col][sl].astype(np.int64))
        elif key not in plan.key_cols:
            codes.append(np.zeros(n, dtype=np.int64))
        else:
            ka, per = gspec.x_keys if axis == "x" else gspec.y_keys
            k = rq[key][sl].astype(np.int64)
            c = np.clip(gspec.half - ((ka - k) // per), 0, 2 * gspec.half + 1)  # h + ⌈(k−ka)/d⌉
            codes.append(np.where(k == KEY_MISSING, 0, c))
    base = rq["base"][sl]
    flat = (unit[base] * G + codes[0][base]) * G + codes[1][base]
    grid = np.bincount(flat, minlength=nu * G * G).reshape(nu, G, G)
    grid = grid.cumsum(axis=1).cumsum(axis=2).astype(np.int32 if n < 2**31 else np.int64)
    # tails: dense units × bins above the run's threshold, and the count below it
    tails = {}
    for m, th in series["thresholds"].items():
        k0, dense_run = series["hist"][m]
        nb = k0 + dense_run.size - th
        keys = rq[KEY_COL[m]][sl]
        sel = ok & (keys != KEY_MISSING) & (keys >= th)
        idx = unit[sel] * nb + (keys[sel].astype(np.int64) - th)
        dense = np.bincount(idx, minlength=nu * nb).reshape(nu, nb).astype(np.float64)
        tails[m] = (int(th), dense, res[f"cnt_{m}"] - dense.sum(axis=1))
    cstats = None
    if cell_codes is not None:
        cstats = _run_cells(rq, sl, plan, unit, nu, ok, cell_codes)
    return {"units": res, "n_units": nu, "grid": grid, "tails": tails, "cells": cstats}


def _run_cells(rq: dict, sl: slice, plan: _Plan, unit: np.ndarray, nu: int, ok: np.ndarray,
               cell_codes: np.ndarray) -> CellStats:
    """Per-(unit, cell) sums and log-bucket histograms of one run."""
    nc = cell_codes.size
    cell = np.searchsorted(cell_codes, rq["cell"][sl].astype(np.int64))
    flat = unit * nc + cell
    size = nu * nc

    def count(mask=None, weights=None):
        f = flat if mask is None else flat[mask]
        w = None if weights is None else (weights if mask is None else weights[mask])
        return np.bincount(f, weights=w, minlength=size).astype(np.float64).reshape(nu, nc)

    st = rq["st"][sl]
    started = rq["started"][sl]
    tok_in = rq["tok_in"][sl].astype(np.float64)
    sums = {"n": count(), "n_good": count(rq["good"][sl]), "n_ok": count(ok)}
    for j, s_ in enumerate(C.STATUSES):
        sums[f"st_{s_}"] = count(st == j)
    sums["input_tokens"] = count(weights=tok_in)
    sums["output_tokens"] = count(weights=rq["tok_out"][sl].astype(np.float64))
    sums["output_tokens_asked"] = count(weights=rq["tok_ask"][sl].astype(np.float64))
    sums["input_tokens_started"] = count(started, tok_in)
    tok_comp = rq["tok_comp"][sl].astype(np.float64)
    sums["computed_input_tokens"] = count(weights=tok_comp)
    sums["computed_input_tokens_started"] = count(started, tok_comp)
    hist = {}
    for m in plan.cells.hist:
        k = KEY_COL[m]
        if k not in plan.key_cols:
            continue
        keys = rq[k][sl]
        sel = ok & (keys != KEY_MISSING)
        kk = keys[sel].astype(np.int64)
        if not kk.size:
            hist[m] = tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
            continue
        k0 = int(kk.min())
        code = flat[sel] * (int(kk.max()) - k0 + 1) + (kk - k0)
        vals, cnt = np.unique(code, return_counts=True)
        uc, kd = np.divmod(vals, int(kk.max()) - k0 + 1)
        u_, c_ = np.divmod(uc, nc)
        hist[m] = (u_, c_, kd + k0, cnt.astype(np.int64))
    return CellStats(sums=sums, hist=hist)


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


def _cell_index(plan: _Plan, codes: np.ndarray) -> pd.DataFrame:
    """The observed cells, decoded from their mixed-radix codes, in code order."""
    cells = plan.cells
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
    if cells.cache:
        radix.append(("cache", len(CACHE_LABELS)))
    cols, rest = {}, codes.copy()
    for name, r in reversed(radix):
        cols[name] = rest % r
        rest = rest // r
    frame = pd.DataFrame({"cell": np.arange(codes.size)})
    for name, _ in radix:
        v = cols[name]
        if name in ("tenant", "slo_class"):
            frame[name] = [plan.cell_values[name][i] for i in v]
        elif name == "cache":
            frame[name] = [CACHE_LABELS[i] for i in v]
        elif name in ("input_long", "output_long"):
            frame[name] = v.astype(bool)
        else:
            frame[name] = v.astype(np.int64)
            edges = cells.input_edges if name == "input_bucket" else cells.output_edges
            frame[name + "_label"] = [bucket_labels(edges)[i] for i in v]
    return frame


def _assemble(study, plan, units, per_run, by_unit, gspec, cell_index, warm_src, warm_late,
              tail_from, lag_limit_ms) -> BlockStats:
    runs = study.manifest.runs
    slo, alpha = plan.slo, plan.alpha
    out_runs, diags = [], []
    closed = study.manifest.load_model == "closed"
    for i, r in enumerate(runs):
        res, nu, hist = by_unit[i]["units"], by_unit[i]["n_units"], per_run[i]["hist"]
        n = int(res["n"].sum()) if nu else 0
        unit_size = n / nu if nu else 1.0
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
            block_len=bl, units=res, grid=by_unit[i]["grid"], hist=hist,
            tail=by_unit[i]["tails"] if nu else {}, measured_rps=measured, span_s=span,
            block_len_good=bl_good, block_len_latency=bl_lat, block_metric=bl_metric,
            cells=by_unit[i]["cells"]))
    return BlockStats(slo=slo, alpha=alpha, load_model=study.manifest.load_model,
                      name=study.manifest.name, runs=tuple(out_runs), grid_spec=gspec,
                      diagnostics=dg.to_frame(diags), window=plan.window, unit_rule=units,
                      cells=plan.cells, cell_index=cell_index, tail_from=tail_from,
                      source=str(study.root))
