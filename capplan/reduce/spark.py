"""The Spark executor of the reduction: the per-request columns of ``reduce.sql`` (the same SQL
as DuckDB's), the scheduled order and unit index from a window per (run, second) with the
offsets of the earlier seconds (so a run's rank is exact and a long run is not one task), then
one aggregation per level — (run, key) histograms, (run, unit) sums of ``sums.unit_sums``,
(run, unit, grid codes), (run, unit, key) tails above each run's threshold, (run, fine unit)
block-length inputs, (run, unit, cell) sums and histograms. Only those small results reach
the driver (docs/scale.md, "What reaches the driver")."""

from __future__ import annotations

import numpy as np

from .assemble import RunCounts, RunSeries, grid_spec
from .sql import KEY_COL, KEY_MISSING, key_code_sql, request_columns
from .stats import FINE_UNITS, CellStats, block_length_fine
from .sums import busy_sql, cell_sums, filter_sql, fine_sums, unit_sums
from .units import METRICS, CountUnits

#: the rank of a request inside its run is counted per (run, scheduled second) and offset by
#: the earlier seconds' counts
RANK_BUCKET_NS = 1_000_000_000


def unit_sql(units, plan, manifest) -> tuple[str, list]:
    """The unit index in SQL over the ranked requests (``count.units_of`` in numpy):
    ``CountUnits``: ⌊rank·min(U, n)/n⌋; ``TimeUnits``: ⌊(scheduled − origin)/width⌋ clipped
    to [0, U − 1] (U from ``n_units``, or the data), per run."""
    d = plan.dialect
    if isinstance(units, CountUnits):
        u = int(units.max_units)
        return d.floor_div(f"rank * least({u}, n_run)", "n_run"), []
    cases, params = [], []
    for i, r in enumerate(manifest.runs):
        nu = units.count(r.run_id)
        u = d.floor_div(f"(sched - CAST(? AS BIGINT))", "CAST(? AS DOUBLE)")
        expr = f"greatest({u}, 0)" if nu is None else f"least(greatest({u}, 0), {int(nu) - 1})"
        cases.append(f"WHEN {i} THEN {expr}")
        params += [units.origin_ns(r.run_id, plan.window), units.width_ns(r.run_id)]
    return f"CASE run_idx {' '.join(cases)} END", params


def _collect(study, sql: str, params: list | None = None):
    return study.frame(sql, params).toPandas()


def _dense(df, run_idx: int, group: str, size: int, names) -> dict:
    """Columns ``names`` of the rows of one run as dense arrays over ``group`` (0…size−1);
    missing groups read 0 (counts, sums) — min/max are filled with NaN by the caller."""
    sub = df[df["run_idx"] == run_idx]
    idx = sub[group].to_numpy(dtype=np.int64)
    out = {}
    for n in names:
        a = np.zeros(size)
        a[idx] = sub[n].to_numpy(dtype=np.float64)
        out[n] = a
    return out


def spark_counts(study, plan, units, tail_from: float):
    """Every run's ``RunSeries`` and ``RunCounts``, the grid spec and the observed cells,
    aggregated by Spark (see the module docstring)."""
    spark = study.spark
    d = plan.dialect
    runs = study.manifest.runs
    nr = len(runs)
    v = study.view_name
    cols, params = request_columns(plan, extra=(
        "m.request_id AS rid", "m.first_token_ns AS ftn", "m.last_token_ns AS ltn"))
    base = v("capplan_rq0")
    spark.sql(f"SELECT {', '.join(cols)}, {d.floor_div('m.scheduled_ns', str(RANK_BUCKET_NS))}"
              f" AS tb FROM {plan.view} m WHERE m.in_window", args=params or None
              ).createOrReplaceTempView(base)
    # offsets: requests of the run in earlier seconds, the run's size and last scheduled time
    offs = v("capplan_offs")
    spark.sql(f"""
        SELECT run_idx, tb, sum(c) OVER (PARTITION BY run_idx ORDER BY tb
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - c
                                   AS off,
               sum(c) OVER (PARTITION BY run_idx) AS n_run,
               max(smax) OVER (PARTITION BY run_idx) AS sched_last
        FROM (SELECT run_idx, tb, count(*) AS c, max(sched) AS smax FROM {base}
              GROUP BY run_idx, tb)""").createOrReplaceTempView(offs)
    usql, uparams = unit_sql(units, plan, study.manifest)
    w = ("PARTITION BY r.run_idx, r.tb ORDER BY r.sched ASC NULLS LAST, r.rid ASC NULLS LAST, "
         "r.ftn ASC NULLS LAST, r.ltn ASC NULLS LAST")
    ranked = spark.sql(f"""
        SELECT r.*, o.off + row_number() OVER ({w}) - 1 AS rank, o.n_run, o.sched_last,
               CASE WHEN r.sched = lag(r.sched) OVER ({w}) AND r.rid = lag(r.rid) OVER ({w})
                    THEN 1 ELSE 0 END AS dup
        FROM {base} r JOIN {offs} o ON r.run_idx = o.run_idx AND r.tb = o.tb""")
    rqv = v("capplan_rq")
    ranked.createOrReplaceTempView(v("capplan_ranked"))
    rq = spark.sql(f"""
        SELECT *, {usql} AS unit,
               {d.floor_div(f'rank * least({FINE_UNITS}, n_run)', 'n_run')} AS fine,
               {busy_sql('(sched / 1e9)', 'soj', '(sched_last / 1e9)')} AS busy
        FROM {v('capplan_ranked')}""", args=uparams or None)
    from pyspark import StorageLevel

    rq = rq.persist(StorageLevel.MEMORY_AND_DISK)
    rq.createOrReplaceTempView(rqv)
    try:
        return _aggregate(study, plan, units, tail_from, rqv, nr, runs)
    finally:
        rq.unpersist()
        for name in ("capplan_rq0", "capplan_offs", "capplan_ranked", "capplan_rq",
                     "capplan_th"):
            spark.catalog.dropTempView(v(name))


def _aggregate(study, plan, units, tail_from, rqv, nr, runs):
    d = plan.dialect
    # 1. whole-run histograms (ok requests; generator lag of all), one pass over a long
    #    (run, metric, key) form
    stacked = []
    for m in METRICS + ("gen_lag_ms",):
        k = KEY_COL[m]
        if k in plan.key_cols:
            f = filter_sql(f"ok_{k}" if m in METRICS else f"has_{k}")
            stacked += [f"'{m}'", f"CASE WHEN {f} THEN {k} ELSE {KEY_MISSING} END"]
    hdf = _collect(study, f"SELECT run_idx, metric, k, count(*) AS c FROM (SELECT run_idx, "
                   f"stack({len(stacked) // 2}, {', '.join(stacked)}) AS (metric, k) "
                   f"FROM {rqv}) WHERE k <> {KEY_MISSING} GROUP BY run_idx, metric, k")
    hists = [dict() for _ in runs]
    for (i, m), g in hdf.groupby(["run_idx", "metric"]):
        kk = g["k"].to_numpy(dtype=np.int64)
        k0 = int(kk.min())
        dense = np.zeros(int(kk.max()) - k0 + 1, dtype=np.int64)
        dense[kk - k0] = g["c"].to_numpy(dtype=np.int64)
        hists[int(i)][m] = (k0, dense)
    # 2. block-length inputs per fine unit, and events recorded twice
    fs = fine_sums(plan.pw_keys)
    fdf = _collect(study, f"SELECT run_idx, fine, "
                   + ", ".join(f"{s.sql()} AS {n}" for n, s in fs.items())
                   + f" FROM {rqv} GROUP BY run_idx, fine")
    us = unit_sums(plan.key_cols)
    udf = _collect(study, f"SELECT run_idx, unit, "
                   + ", ".join(f"{s.sql()} AS {n}" for n, s in us.items())
                   + f", sum(dup) AS dups FROM {rqv} GROUP BY run_idx, unit")
    per_run = []
    n_run = np.zeros(nr, dtype=np.int64)
    for i in range(nr):
        sub = udf[udf["run_idx"] == i]
        n_run[i] = int(sub["n"].sum())
        n = int(n_run[i])
        nf = min(FINE_UNITS, n)
        fsum = _dense(fdf, i, "fine", nf, list(fs))
        block = block_length_fine(n, fsum, {m: c for m, c in plan.pw_keys})
        per_run.append(RunSeries.of(hists[i], tail_from, block, int(sub["dups"].sum())))
    gspec = grid_spec(plan, [r.hist for r in per_run])
    # 3. grid codes: stored where the SLO limits the axis, else from the key
    G = gspec.size
    codes, cparams = [], []
    for axis, col, key in (("x", "jx", "kt"), ("y", "jy", KEY_COL[plan.y_metric])):
        if col in plan.stored_codes:
            codes.append(col)
        elif key not in plan.key_cols:
            codes.append("0")
        else:
            ka, per = gspec.x_keys if axis == "x" else gspec.y_keys
            codes.append(key_code_sql(d, key))
            cparams += [gspec.half, ka, per, 2 * gspec.half + 1]
    gdf = _collect(study, f"SELECT run_idx, unit, {codes[0]} AS cx, {codes[1]} AS cy, "
                   f"count(*) AS c FROM {rqv} WHERE base GROUP BY 1, 2, 3, 4", cparams)
    # 4. tails above each run's threshold
    th_rows = [(i, m, int(t)) for i, r in enumerate(per_run) for m, t in r.thresholds.items()]
    tdf = None
    if th_rows:
        import pandas as pd

        study.register(study.view_name("capplan_th"),
                       pd.DataFrame(th_rows, columns=["run_idx", "metric", "th"]).astype(
                           {"run_idx": "int64", "metric": "object", "th": "int64"}))
        thv = study.view_name("capplan_th")
        stacked = []
        for m in METRICS:
            k = KEY_COL[m]
            if k in plan.key_cols:
                stacked += [f"'{m}'", f"CASE WHEN {filter_sql('ok_' + k)} THEN {k} "
                                      f"ELSE {KEY_MISSING} END"]
        tdf = _collect(study, f"""
            SELECT r.run_idx, r.metric, r.unit, r.k, count(*) AS c
            FROM (SELECT run_idx, unit, stack({len(stacked) // 2}, {', '.join(stacked)})
                         AS (metric, k) FROM {rqv}) r
            JOIN {thv} t ON r.run_idx = t.run_idx AND r.metric = t.metric
            WHERE r.k <> {KEY_MISSING} AND r.k >= t.th
            GROUP BY r.run_idx, r.metric, r.unit, r.k""")
    # 5. cells
    cell_codes, cdf, chdf = None, None, None
    if plan.cells is not None:
        cs = cell_sums()
        cdf = _collect(study, "SELECT run_idx, unit, cell, "
                       + ", ".join(f"{s.sql()} AS {n}" for n, s in cs.items())
                       + f" FROM {rqv} GROUP BY run_idx, unit, cell")
        cell_codes = np.unique(cdf["cell"].to_numpy(dtype=np.int64))
        parts = []
        for m in plan.cells.hist:
            k = KEY_COL[m]
            if k in plan.key_cols:
                parts.append(f"SELECT run_idx, '{m}' AS metric, unit, cell, {k} AS k, "
                             f"count(*) AS c FROM {rqv} WHERE {filter_sql('ok_' + k)} "
                             f"GROUP BY run_idx, unit, cell, {k}")
        chdf = _collect(study, " UNION ALL ".join(parts)) if parts else None
    by_unit = []
    for i, r in enumerate(runs):
        n = int(n_run[i])
        nu = _n_units(units, r.run_id, n, udf, i)
        sums = _dense(udf, i, "unit", nu, list(us))
        sub = udf[udf["run_idx"] == i]
        have = np.zeros(nu, dtype=bool)
        have[sub["unit"].to_numpy(dtype=np.int64)] = True
        for name, s in us.items():
            if s.kind in ("min", "max"):
                sums[name][~have] = np.nan
        g = gdf[gdf["run_idx"] == i]
        flat = ((g["unit"].to_numpy(dtype=np.int64) * G + g["cx"].to_numpy(dtype=np.int64)) * G
                + g["cy"].to_numpy(dtype=np.int64))
        grid = np.bincount(flat, weights=g["c"].to_numpy(dtype=np.float64),
                           minlength=nu * G * G).astype(np.int64).reshape(nu, G, G)
        tails = {}
        for m, th in per_run[i].thresholds.items():
            k0, dense_run = per_run[i].hist[m]
            nb = k0 + dense_run.size - th
            t = tdf[(tdf["run_idx"] == i) & (tdf["metric"] == m)]
            idx = t["unit"].to_numpy(dtype=np.int64) * nb + (t["k"].to_numpy(dtype=np.int64) - th)
            tails[m] = np.bincount(idx, weights=t["c"].to_numpy(dtype=np.float64),
                                   minlength=nu * nb).reshape(nu, nb)
        cstats = None
        if cell_codes is not None:
            cstats = _cells(plan, cdf, chdf, i, nu, cell_codes)
        by_unit.append(RunCounts.of(sums, nu, grid, tails, per_run[i], cstats))
    return per_run, by_unit, gspec, cell_codes


def _n_units(units, run_id: str, n: int, udf, i: int) -> int:
    if isinstance(units, CountUnits):
        return min(int(units.max_units), n)
    nu = units.count(run_id)
    if nu is None:
        sub = udf[udf["run_idx"] == i]
        nu = max(1, int(sub["unit"].max()) + 1) if len(sub) else 1
    return nu


def _cells(plan, cdf, chdf, i: int, nu: int, cell_codes: np.ndarray) -> CellStats:
    nc = cell_codes.size
    sub = cdf[cdf["run_idx"] == i]
    flat = sub["unit"].to_numpy(dtype=np.int64) * nc + np.searchsorted(
        cell_codes, sub["cell"].to_numpy(dtype=np.int64))
    sums = {}
    for name in cell_sums():
        a = np.zeros(nu * nc)
        a[flat] = sub[name].to_numpy(dtype=np.float64)
        sums[name] = a.reshape(nu, nc)
    hist = {}
    for m in plan.cells.hist:
        if KEY_COL[m] not in plan.key_cols:
            continue
        h = chdf[(chdf["run_idx"] == i) & (chdf["metric"] == m)] if chdf is not None else None
        if h is None or not len(h):
            hist[m] = tuple(np.zeros(0, dtype=np.int64) for _ in range(4))
            continue
        u = h["unit"].to_numpy(dtype=np.int64)
        c = np.searchsorted(cell_codes, h["cell"].to_numpy(dtype=np.int64))
        k = h["k"].to_numpy(dtype=np.int64)
        order = np.lexsort((k, c, u))  # (unit, cell, key) order, as np.unique gives it
        hist[m] = (u[order], c[order], k[order], h["c"].to_numpy(dtype=np.int64)[order])
    return CellStats(sums=sums, hist=hist)

