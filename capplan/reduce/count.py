"""The numpy executor of the reduction: one run's ordered per-request arrays (DuckDB's fetch,
``engine``) → whole-run histograms, block lengths, and every per-unit, grid, tail and cell
count, with ``np.bincount``. The sums are those of ``sums`` (the same table Spark
aggregates); the grid, tail and histogram counts are counts of the SQL-computed keys and
codes, as in ``spark``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import sketch
from ..errors import StudyError
from ..slo import good_array
from .assemble import RunCounts, RunSeries
from .sql import KEY_COL, KEY_MISSING, value_columns
from .stats import FINE_UNITS, CellStats, GridSpec, block_length_fine, fine_index
from .sums import busy_np, cell_sums, fine_sums, group_bounds, sums_np, unit_sums
from .units import METRICS, CountUnits


def request_codes(a: dict, plan) -> dict:
    """SLO-good, grid eligibility (``base``), the TTFT and sojourn (float32), log-bucket keys
    and grid codes of the fetched latencies (``sql.request_columns(values=True)``): what
    ``request_columns`` computes in SQL, with the same operations in the same order (a key
    is ``sketch.keys``, a grid code ``grid_codes``, SLO-good ``slo.good_array``), each
    logarithm taken once per latency. Replaces the ``v_`` columns of
    ``a`` in place and returns it. Two scratch arrays serve every latency (fresh 8-MB arrays
    per step cost more in page faults than the arithmetic)."""
    v = {c: a.pop(f"v_{c}") for c in value_columns(plan)}
    ktype = np.int16 if plan.ktype == "SMALLINT" else np.int32
    key_limit = KEY_MISSING if ktype is np.int16 else np.iinfo(np.int32).max
    keys = {col.removeprefix("m."): k for k, col in plan.key_cols.items()}
    grids = {col: (name, g) for name, col, g in (("jx", plan.ttft_col, plan.grid_x),
                                                 ("jy", plan.y_col, plan.grid_y))
             if g is not None}
    n = a["st"].size
    lnx, work = np.empty(n), np.empty(n)
    for col in dict.fromkeys([*keys, *grids]):
        x = v[col]
        sketch.log_clamped(x, out=lnx)
        if col in keys:
            kk = sketch.keys_of_log(lnx, plan.alpha, out=work)  # NaN where missing
            # fmin/fmax skip NaN; a key the SQL cast would refuse, or one that would read
            # as missing, is an error there and here
            if n and max(-np.fmin.reduce(kk), np.fmax.reduce(kk)) >= key_limit:
                raise StudyError(f"a {col} of {float(np.nanmax(np.abs(x))):.6g} is beyond the "
                                 "range of the latency histograms",
                                 fix="check the event timestamps' unit (nanoseconds)")
            np.copyto(kk, KEY_MISSING, where=np.isnan(kk))  # no ±inf is left to map
            a[keys[col]] = kk.astype(ktype)
        if col in grids:
            name, g = grids[col]
            a[name] = grid_codes(x, lnx, g[0], g[1], plan.grid_half, out=work)
    # SLO-good and grid eligibility by the SLO's one rule (``good_terms``). A request has a
    # first token where its TTFT is known: the TTFT is NULL only without one, as the
    # scheduled stamp, which the contract requires, is never NULL
    ok = (a["st"] == 0) & ~np.isnan(v[plan.ttft_col])
    a["good"] = good_array(plan.slo, ok, v.__getitem__)
    a["base"] = good_array(plan.slo, ok, v.__getitem__, without=(plan.ttft_col, plan.y_col))
    a["ttft"] = v[plan.ttft_col].astype(np.float32)
    a["soj"] = (v["e2e_ms"] / 1e3).astype(np.float32)
    return a


def grid_codes(x: np.ndarray, lnx: np.ndarray, anchor: float, step: float, half: int,
               out: np.ndarray | None = None) -> np.ndarray:
    """``sql.grid_code_sql`` in numpy: 0…2h+1 on an axis anchored at a limit, exact at the
    anchor (a comparison), 0 where the value is missing. ``lnx``: ``sketch.log_clamped(x)``;
    ``out``: a float64 scratch array of x's size. With ``half`` 0 the two codes are the
    comparison itself (a value at or below the anchor has ⌈…⌉ ≤ 0, clipped to 0; one above
    it at least 1, clipped to 1; a missing one compares false), which the command's one-SLO
    reduction takes without the logarithm's arithmetic."""
    if half == 0:
        return np.greater(x, anchor).astype(np.int16)
    c = np.subtract(lnx, math.log(anchor), out=out)
    c /= math.log(step)
    c -= sketch.KEY_EPS
    np.ceil(c, out=c)
    c += half
    np.maximum(c, half + 1, out=c, where=x > anchor)  # above the anchor: ≥ h + 1
    np.clip(c, 0, 2 * half + 1, out=c)
    np.copyto(c, 0.0, where=np.isnan(c))  # missing: 0 (a third of nan_to_num's time: it
    return c.astype(np.int16)             # looks for ±inf too, which the clip has removed)


def run_series(a: dict, plan, tail_from: float, *, hist: dict | None = None) -> RunSeries:
    """One run's whole-run histograms (latency of ok requests; generator lag of all), the key
    above which its tail histograms start, its block lengths and duplicated events.
    ``hist``: the run's histograms when already counted (``engine``'s streaming pass)."""
    ok = a["st"] == 0
    if hist is None:
        hist = {}
        for m in METRICS + ("gen_lag_ms",):
            k = KEY_COL[m]
            if k not in plan.key_cols:
                continue
            keys = a[k]
            sel = keys != KEY_MISSING
            if m in METRICS:
                sel &= ok
            if not sel.any():
                continue
            kk = keys[sel]  # in its own int16: the shift below widens it in the same pass
            k0 = int(kk.min())  # (5 against 11–14 ms a latency of 10^6 requests)
            hist[m] = (k0, np.bincount(np.subtract(kk, k0, dtype=np.intp)).astype(np.int64))
    n = a["st"].size
    fine = fine_index(n)
    nf = min(FINE_UNITS, n)
    sums = sums_np(fine_sums(plan.pw_keys), a, fine, nf, group_bounds(fine, nf))
    block = block_length_fine(n, sums, {m: c for m, c in plan.pw_keys})
    s = a["sched"]
    dups = 0
    if "h" in a and s.size > 1:  # adjacent equal (scheduled_ns, request_id hash): twice
        dups = int(np.sum((a["h"][1:] == a["h"][:-1]) & (s[1:] == s[:-1])))
    return RunSeries.of(hist, tail_from, block, dups)


def units_of(a: dict, units, run_id: str, window) -> tuple[np.ndarray, int]:
    """Each request's unit and the run's unit count (``CountUnits``: ⌊rank·U/n⌋;
    ``TimeUnits``: ⌊(scheduled − origin)/width⌋ clipped to [0, U − 1]; the SQL form is
    ``spark.unit_sql``). Units are non-decreasing, since the requests are in scheduled
    order."""
    n = a["sched"].size
    if isinstance(units, CountUnits):
        nu = min(int(units.max_units), n)
        return (np.arange(n, dtype=np.int64) * nu) // max(n, 1), nu
    origin, width = units.origin_ns(run_id, window), units.width_ns(run_id)
    u = (a["sched"].astype(np.int64) - origin) // width
    nu = units.count(run_id)
    if nu is None:
        nu = max(1, int(u[-1]) + 1) if n else 1
    return np.clip(u, 0, nu - 1), nu


def key_codes(keys: np.ndarray, anchor_key: int, per: int, half: int) -> np.ndarray:
    """Grid code of each log-bucket key on an axis anchored at a bucket edge: h + ⌈(k −
    k_a)/d⌉ clipped to 0…2h+1, 0 when missing (``sql.key_code_sql`` in SQL)."""
    k = keys.astype(np.int64)
    c = np.clip(half - ((anchor_key - k) // per), 0, 2 * half + 1)
    return np.where(k == KEY_MISSING, 0, c)


def run_counts(a: dict, plan, units, run_id: str, gspec: GridSpec, series: RunSeries,
               cell_codes: np.ndarray | None) -> RunCounts:
    """One run's per-unit sums (``sums.unit_sums``), its cumulative grid counts
    (units × G × G), per-unit tail histograms and, with cells, per-(unit, cell) sums and
    histograms."""
    part = unit_counts(a, plan, units, run_id, series, cell_codes)
    return part.counts(grid_counts(part.grid_in, plan, gspec, part.n_units))


@dataclass(frozen=True)
class UnitCounts:
    """One run's per-unit counts but the SLO grid, and the few per-request columns the grid
    reads (``grid_in``: the unit and the grid inputs of each grid-eligible request), so that
    a run can be counted before the grid spec is known (it needs every run's histograms when
    an axis has no limit) while its other columns are dropped."""

    sums: dict
    n_units: int
    tails: dict
    cells: CellStats | None
    series: RunSeries
    grid_in: dict

    def counts(self, grid: np.ndarray) -> RunCounts:
        return RunCounts.of(self.sums, self.n_units, grid, self.tails, self.series, self.cells)


def unit_counts(a: dict, plan, units, run_id: str, series: RunSeries,
                cell_codes: np.ndarray | None) -> UnitCounts:
    """``run_counts`` without the grid: per-unit sums, tails and cells, and the grid's
    inputs (``UnitCounts.grid_in``)."""
    unit, nu = units_of(a, units, run_id, plan.window)
    n = unit.size
    t_s = a["sched"] / 1e9
    a = {**a, "busy": busy_np(t_s, a["soj"], float(t_s[-1]) if n else np.nan)}
    res = sums_np(unit_sums(plan.key_cols), a, unit, nu, group_bounds(unit, nu))
    # the grid's inputs, of grid-eligible requests: per axis, the stored code where the SLO
    # limits it, else the log-bucket key (coded once the grid spec is known), else nothing
    base = a["base"]
    grid_in = {"unit": unit[base]}
    for axis, col, key in (("x", "jx", "kt"), ("y", "jy", KEY_COL[plan.y_metric])):
        if col in plan.stored_codes:
            grid_in[axis] = ("code", a[col][base])
        elif key in plan.key_cols:
            grid_in[axis] = ("key", a[key][base])
    # tails: units × bins above the run's threshold
    ok = a["st"] == 0
    tails = {}
    for m, th in series.thresholds.items():
        k0, dense_run = series.hist[m]
        nb = k0 + dense_run.size - th
        keys = a[KEY_COL[m]]
        sel = ok & (keys != KEY_MISSING) & (keys >= th)
        idx = unit[sel] * nb + (keys[sel].astype(np.int64) - th)
        tails[m] = np.bincount(idx, minlength=nu * nb).reshape(nu, nb).astype(np.float64)
    cstats = None
    if cell_codes is not None:
        cstats = run_cells(a, plan, unit, nu, ok, cell_codes)
    return UnitCounts(res, nu, tails, cstats, series, grid_in)


def grid_counts(grid_in: dict, plan, gspec: GridSpec, nu: int) -> np.ndarray:
    """The (units × G × G) counts of grid-eligible requests by grid code (not cumulative):
    a stored code where the SLO limits the axis, else the code of the key
    (``key_codes``), 0 on an axis without data."""
    G = gspec.size
    unit = grid_in["unit"]
    codes = []
    for axis in ("x", "y"):
        kind, v = grid_in.get(axis, (None, None))
        if kind == "code":
            codes.append(v.astype(np.int64))
        elif kind == "key":
            ka, per = gspec.x_keys if axis == "x" else gspec.y_keys
            codes.append(key_codes(v, ka, per, gspec.half))
        else:
            codes.append(np.zeros(unit.size, dtype=np.int64))
    flat = (unit * G + codes[0]) * G + codes[1]
    return np.bincount(flat, minlength=nu * G * G).reshape(nu, G, G)


def run_cells(a: dict, plan, unit: np.ndarray, nu: int, ok: np.ndarray,
              cell_codes: np.ndarray) -> CellStats:
    """Per-(unit, cell) sums (``sums.cell_sums``) and log-bucket histograms of one run."""
    nc = cell_codes.size
    cell = np.searchsorted(cell_codes, a["cell"].astype(np.int64))
    flat = unit * nc + cell
    flat_sums = sums_np(cell_sums(), a, flat, nu * nc)
    sums = {k: v.reshape(nu, nc) for k, v in flat_sums.items()}
    hist = {}
    for m in plan.cells.hist:
        k = KEY_COL[m]
        if k not in plan.key_cols:
            continue
        keys = a[k]
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
