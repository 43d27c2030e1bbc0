"""``reduce_study``: the entry point of the reduction, and its DuckDB engine — the window's
requests from one ordered DuckDB query as compact numpy columns, then every count with
``np.bincount`` (``count``), per run on two threads; runs that do not fit the fetch budget are
read one run at a time (see the package docstring). ``engine="spark"`` hands the same plan to
``capplan.reduce.spark``."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from .. import sketch
from ..dialect import ENGINES
from ..errors import SpecError, StudyError
from ..slo import SLO
from ..study import Study, open_study
from .assemble import RunCounts, RunSeries, assemble_stats, grid_spec
from .count import grid_counts, request_codes, run_counts, run_series, unit_counts
from .plan import reduction_plan, resolve_window
from .sql import KEY_COL, KEY_MISSING, TTFT_COL, order_sql, request_columns
from .stats import TAIL_FROM, BlockStats
from .units import MAX_UNITS, CountUnits, TimeUnits

GRID_STEP = 1.10
GRID_HALF = 14
#: the per-request columns of a reduction are fetched at once up to this many bytes; a
#: larger study is read one run at a time (``fetch_mb``)
FETCH_MB = 2048


def fetch_arrays(study: Study, q: str, params=None) -> dict:
    """Fetch a query as numpy columns through Arrow (no pandas round trip); NULL reads NaN in
    float columns and 0 in the others. Parameters stay bound. The query runs as a relation
    (``sql``), whose Arrow result DuckDB builds in parallel as it collects it; through
    ``execute()`` the rows are materialised first and copied to Arrow once more (12 × 10^6
    ordered requests: 1.12 s against 1.25 s wall, 2.17 against 2.44 CPU s). It runs on a
    cursor of the study's connection (same database, views and settings), because DuckDB
    refuses a relation on a connection that still holds an unfinished ``execute()`` result,
    and so that two threads can fetch at once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    with study.con.cursor() as cur:
        tbl = cur.sql(q, params=list(params) if params else None).to_arrow_table()
    out = {}
    for name in tbl.column_names:
        col = tbl.column(name)
        if col.null_count and not pa.types.is_floating(col.type):
            col = pc.fill_null(col, pa.scalar(False if pa.types.is_boolean(col.type) else 0, col.type))
        out[name] = np.asarray(col.to_numpy())
    return out


def reduce_study(study, slo, *, warmup="manifest", units: CountUnits | TimeUnits | None = None,
                 cells=None, alpha: float = sketch.DEFAULT_ALPHA,
                 max_units: int | None = None, grid_step: float = GRID_STEP,
                 grid_half: int = GRID_HALF, tail_from: float = TAIL_FROM,
                 lag_limit_ms: float | None = None, engine: str | None = None,
                 spark=None, fetch_mb: float | None = None,
                 progress: bool = False) -> BlockStats:
    """Reduce a study to per-(run, unit[, cell]) statistics for ``slo`` (see the
    ``capplan.reduce`` docstring).

    ``warmup``: a ``metrics.Window``, or "manifest" / "mser" / "none" / seconds /
    {run_id: seconds} (``resolve_window``); ``units``: ``CountUnits`` (default, with
    ``max_units``) or ``TimeUnits``; ``cells``: ``Cells`` or None. ``engine``: "duckdb"
    (default for a path or a ``Study``) or "spark" (default for a ``SparkStudy``; a path is
    then opened on ``spark``, a SparkSession or a master URL, default ``local[*]``);
    ``fetch_mb``: DuckDB reads the study one run at a time when its per-request columns
    would exceed this (default ``FETCH_MB``); ``progress``: a bar over runs on stderr."""
    if engine is not None and engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}", field="engine",
                        fix="use " + " or ".join(ENGINES))
    if engine == "spark" or (engine is None and getattr(study, "dialect", None) is not None
                             and study.dialect.spark):
        from ..sparkstudy import SparkStudy, open_spark_study

        if not isinstance(study, SparkStudy):
            study = open_spark_study(study, spark=spark)
    else:
        study = open_study(study) if not isinstance(study, Study) else study
    slo = SLO.parse(slo)
    if units is None:
        units = CountUnits(MAX_UNITS if max_units is None else max_units)
    elif max_units is not None:
        raise SpecError("give max_units inside CountUnits, not beside units", field="max_units")
    if not isinstance(units, (CountUnits, TimeUnits)):
        raise SpecError(f"units must be CountUnits or TimeUnits, got {type(units).__name__}",
                        field="units")
    window, warm_src, warm_late = resolve_window(study, warmup, TTFT_COL[slo.ttft_from])
    plan = reduction_plan(study, slo, window, cells=cells, alpha=alpha, grid_step=grid_step,
                          grid_half=grid_half)
    if study.dialect.spark:
        from .spark import spark_counts

        per_run, by_unit, gspec, cell_codes = spark_counts(study, plan, units, tail_from)
    else:
        per_run, by_unit, gspec, cell_codes = _duckdb_counts(
            study, plan, units, tail_from, FETCH_MB if fetch_mb is None else fetch_mb,
            progress)
    return assemble_stats(study.manifest, str(study.root), plan, units, per_run, by_unit, gspec,
                          cell_codes, warm_src, warm_late, tail_from, lag_limit_ms)


# ============================================================================ DuckDB

def _fetch_columns(plan, tie_break: bool) -> tuple[list[str], list]:
    """The per-request columns DuckDB fetches; with ``tie_break`` also a hash of request_id
    (to count events recorded twice: adjacent in the tie order, same time and hash)."""
    return request_columns(plan, extra=("hash(m.request_id) AS h",) if tie_break else (),
                           values=True)


def _fetch(study: Study, plan, *, tie_break: bool, run_id: str | None = None,
           ordered: bool = True) -> dict:
    """The window's requests (all runs, or one) in scheduled order as numpy columns: one
    DuckDB query (scan, per-request metrics and keys, sort). Without ``tie_break`` the order
    is by scheduled time only, which is the tie rule's order whenever a run has no ties.
    ``ordered=False`` (one run): no sort, the rows as the scan gives them."""
    cols, params = _fetch_columns(plan, tie_break)
    where = "m.in_window"
    if run_id is not None:
        where += " AND m.run_id = ?"
        params = params + [run_id]
    order = "m.run_idx, " + (order_sql("m") if tie_break else "m.scheduled_ns")
    rq = fetch_arrays(study, f"SELECT {', '.join(cols)} FROM {plan.view} m WHERE {where}"
                      + (f" ORDER BY {order}" if ordered else ""), params)
    request_codes(rq, plan)
    pr = rq["run_idx"]
    if pr.size and np.any(pr[1:] < pr[:-1]):
        raise StudyError("internal: the reduction lost the scheduled order of requests",
                         fix="report this with the DuckDB version")
    return rq


def _ties(rq: dict) -> np.ndarray:
    """Run indices with two requests at the same scheduled time (their order then needs the
    tie rule)."""
    if "h" in rq or rq["sched"].size < 2:
        return np.zeros(0, dtype=np.int64)
    same = (rq["run_idx"][1:] == rq["run_idx"][:-1]) & (rq["sched"][1:] == rq["sched"][:-1])
    return np.unique(rq["run_idx"][1:][same]).astype(np.int64)


def _row_bytes(plan, tie_break: bool) -> int:
    cols, _ = _fetch_columns(plan, tie_break)
    return 8 * len(cols) + 16  # an upper bound (most columns are 1–4 bytes)


def _slices(rq: dict, nr: int) -> list[slice]:
    r = rq["run_idx"]  # searched in its own dtype (int16): no int64 copy of the column
    bounds = np.append(np.searchsorted(r, np.arange(nr, dtype=r.dtype), side="left"), r.size)
    return [slice(int(bounds[i]), int(bounds[i + 1])) for i in range(nr)]


def _pooled_hists(study: Study, plan) -> list[dict]:
    """Whole-run histograms of the unanchored grid axes only (what the grid spec needs
    before any run is counted), by SQL: the streaming path's first pass."""
    need = [m for m, limited in (("ttft", plan.x_limited), (plan.y_metric, plan.y_limited))
            if not limited and KEY_COL[m] in plan.key_cols]
    hists = [dict() for _ in study.manifest.runs]
    if not need:
        return hists
    cols, params = request_columns(plan)
    for m in need:
        k = KEY_COL[m]
        rows = study.sql(f"WITH r AS (SELECT {', '.join(cols)} FROM {plan.view} m "
                         f"WHERE m.in_window) SELECT run_idx, {k} AS k, count(*) AS c FROM r "
                         f"WHERE st = 0 AND {k} <> {KEY_MISSING} GROUP BY run_idx, k",
                         params).fetchnumpy()
        for i in np.unique(rows["run_idx"]):
            sel = rows["run_idx"] == i
            kk, cc = rows["k"][sel].astype(np.int64), rows["c"][sel].astype(np.int64)
            k0 = int(kk.min())
            dense = np.zeros(int(kk.max()) - k0 + 1, dtype=np.int64)
            dense[kk - k0] = cc
            hists[int(i)][m] = (k0, dense)
    return hists


def _cell_codes(study: Study, plan) -> np.ndarray:
    """The observed cell codes, in code order (the streaming path reads them first)."""
    cols, params = request_columns(plan)
    rows = study.sql(f"WITH r AS (SELECT {', '.join(cols)} FROM {plan.view} m "
                     "WHERE m.in_window) SELECT DISTINCT cell FROM r ORDER BY cell",
                     params).fetchnumpy()
    return np.asarray(rows["cell"], dtype=np.int64)


def _fetch_run(study: Study, plan, run_id: str, *, numpy_sort: bool = True) -> dict:
    """One run's requests in the tie rule's order. With ``numpy_sort``, read as the scan
    gives them (no ORDER BY) and sorted by scheduled time in numpy unless already in that
    order (a file written in scheduled order needs no sort at all): while no two requests
    share a scheduled time that is the one order SQL's sort would give, whatever the sort
    algorithm (hence numpy's fastest, not a stable one: 12 against 17–35 ms per 10^6
    requests in completion order). A run with ties is read again, sorted in SQL by the tie
    rule. On 12 runs of 10^6 requests, reading run by run: 2.9 CPU s with DuckDB's sort, 2.0
    without (rows in scheduled order), 2.55 with numpy's stable sort (rows in completion
    order). Without ``numpy_sort`` DuckDB sorts (the streaming path: its sort spills to disk
    under a memory limit, numpy's would not)."""
    a = _fetch(study, plan, tie_break=False, run_id=run_id, ordered=not numpy_sort)
    s = a["sched"]
    if numpy_sort and s.size > 1 and np.any(s[1:] < s[:-1]):
        o = np.argsort(s)
        a = {k: v[o] for k, v in a.items()}
    if _ties(a).size:
        a = _fetch(study, plan, tie_break=True, run_id=run_id)
    return a


#: reading run by run pays a query per run, and each query opens every event file; it pays
#: off when a run has at least this many requests per event file. Whole reduction, CPU s,
#: one query → run by run (one file per run): 12 × 10^6 requests 4.3–4.6 → 2.7–2.9
#: (constant shape), 4.0 → 3.1–3.2 (Poisson shape); 30 × 200k 4.1–4.5 → 2.1; but
#: 30 × 60k 1.0 → 1.3–1.75, 30 × 20k 0.7 → 1.2 and 200 × 2000 3.6 → 14.5
BY_RUN_ROWS_PER_FILE = 4096


def _by_run(study: Study, n_rows: int) -> bool:
    """Whether to read the study run by run (``_counts_by_run``): every row group of the
    event files holds one run (its run_id statistics have min = max), so a query of one run
    reads only that run's row groups and each row is read once; and the runs are long enough
    for a query per run (``BY_RUN_ROWS_PER_FILE``). Only the speed depends on it: a run's
    query filters on run_id either way."""
    files = [str(f) for f in study.event_files]
    nr = len(study.manifest.runs)
    if not files or not nr or n_rows < BY_RUN_ROWS_PER_FILE * nr * len(files):
        return False
    total, mixed = study.sql(
        "SELECT count(*), count(*) FILTER (WHERE stats_min_value IS NULL OR "
        "stats_max_value IS NULL OR stats_min_value <> stats_max_value) "
        "FROM parquet_metadata(?) WHERE path_in_schema = 'run_id'", [files]).fetchall()[0]
    return bool(total) and not mixed


def _pooled_axes(plan) -> bool:
    """Whether the grid spec needs the pooled histograms (an axis the SLO does not limit)."""
    return any(not limited and KEY_COL[m] in plan.key_cols
               for m, limited in (("ttft", plan.x_limited), (plan.y_metric, plan.y_limited)))


@contextmanager
def _one_query_thread(study: Study):
    """DuckDB on one thread per query for the duration (the connection's setting restored
    after): the run-by-run reduction runs two queries at once on its own two threads, and
    each run's row group is scanned by one thread anyway, so DuckDB's own workers would
    only crowd the two cores (`capplan envelope` on 12 runs of 10^6 requests, 12 commands
    interleaved: CPU 10.0 → 9.8 s, wall 5.84 → 5.73 s median; benchmarks/README.md)."""
    before = int(study.sql("SELECT current_setting('threads')").fetchall()[0][0])
    study.sql("SET threads = 1")
    try:
        yield
    finally:
        study.sql(f"SET threads = {before}")


def _counts_by_run(study: Study, plan, units, tail_from: float):
    """The in-memory reduction of a study whose row groups hold one run each (``_by_run``):
    one query per run on two threads, each run counted as soon as it is fetched, so DuckDB's
    scan of one run overlaps the numpy counting of another and no sort needs the whole
    study's memory (figures at ``BY_RUN_ROWS_PER_FILE`` and in benchmarks/README.md). Where
    the grid spec needs the pooled histograms (an axis without a limit), a run keeps only
    its grid inputs (``count.UnitCounts``) until every run is in; with cells, whose codes
    must all be known first, the per-unit counts come after every run's whole-run part,
    from the arrays kept in memory."""
    runs = study.manifest.runs
    gspec = None if _pooled_axes(plan) else grid_spec(plan, [dict() for _ in runs])
    cells = plan.cells is not None

    def first(r):
        a = _fetch_run(study, plan, r.run_id)
        s = run_series(a, plan, tail_from)
        if cells:
            return a, s, None
        part = unit_counts(a, plan, units, r.run_id, s, None)
        if gspec is None:
            return None, s, part
        return None, s, part.counts(grid_counts(part.grid_in, plan, gspec, part.n_units))

    # two threads: DuckDB, numpy's counting and scipy's FFT release the GIL
    with _one_query_thread(study), ThreadPoolExecutor(max_workers=2) as pool:
        got = list(pool.map(first, runs))
        per_run = [g[1] for g in got]
        if gspec is None:
            gspec = grid_spec(plan, [r.hist for r in per_run])
        if not cells:  # a run is counted (RunCounts) or waits for its grid (UnitCounts)
            by_unit = [c if isinstance(c, RunCounts) else
                       c.counts(grid_counts(c.grid_in, plan, gspec, c.n_units))
                       for _, _, c in got]
            return per_run, by_unit, gspec, None
        arrays = [g[0] for g in got]
        del got
        cell_codes = np.unique(np.concatenate(  # the observed cells, in code order
            [np.unique(a["cell"]) for a in arrays])).astype(np.int64)
        by_unit = list(pool.map(
            lambda i: run_counts(arrays[i], plan, units, runs[i].run_id, gspec, per_run[i],
                                 cell_codes), range(len(runs))))
    return per_run, by_unit, gspec, cell_codes


def _duckdb_counts(study: Study, plan, units, tail_from: float, fetch_mb: float,
                   progress: bool):
    """Every run's ``RunSeries`` and ``RunCounts``, the grid spec and the observed cells.
    In memory: run by run on two threads where the row groups hold one run each and the
    runs are long (``_by_run``, ``_counts_by_run``), else one ordered fetch of every run,
    counted per run on two threads. Past ``fetch_mb``: one fetch per run (a first SQL pass
    gives the pooled histograms of an unanchored grid axis and the observed cells), so
    memory holds one run at a time."""
    runs = study.manifest.runs
    nr = len(runs)
    # fetchall, not fetchone: a result read to its end leaves the connection free for the
    # caller's next relation (the fetches run on cursors)
    n_rows = int(study.sql("SELECT count(*) FROM raw_events").fetchall()[0][0])
    if n_rows * _row_bytes(plan, True) <= fetch_mb * 2**20:
        if _by_run(study, n_rows):
            return _counts_by_run(study, plan, units, tail_from)
        rq = _fetch(study, plan, tie_break=False)
        if _ties(rq).size:  # ties in scheduled time: sort again with the tie rule
            rq = _fetch(study, plan, tie_break=True)
        slices = _slices(rq, nr)
        cell_codes = None
        if plan.cells is not None:  # the observed cells, in code order
            cell_codes = np.flatnonzero(np.bincount(rq["cell"].astype(np.int64)))
        arrays = [{k: v[sl] for k, v in rq.items()} for sl in slices]
        # two threads (numpy's counting and scipy's FFT release the GIL): first per run the
        # whole-run histograms, tail thresholds and block lengths; then the SLO grid spec
        # (an axis without a limit is anchored on the pooled p90 bucket); then per run
        # everything by unit
        with ThreadPoolExecutor(max_workers=2) as pool:
            per_run = list(pool.map(lambda a: run_series(a, plan, tail_from), arrays))
            gspec = grid_spec(plan, [r.hist for r in per_run])
            by_unit = list(pool.map(
                lambda i: run_counts(arrays[i], plan, units, runs[i].run_id, gspec,
                                     per_run[i], cell_codes), range(nr)))
        return per_run, by_unit, gspec, cell_codes
    gspec = grid_spec(plan, _pooled_hists(study, plan))
    cell_codes = _cell_codes(study, plan) if plan.cells is not None else None
    per_run: list[RunSeries] = []
    by_unit = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=nr, unit="run", desc="reduce", file=sys.stderr, leave=False)
    for r in runs:
        a = _fetch_run(study, plan, r.run_id, numpy_sort=False)
        per_run.append(run_series(a, plan, tail_from))
        by_unit.append(run_counts(a, plan, units, r.run_id, gspec, per_run[-1], cell_codes))
        del a
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return per_run, by_unit, gspec, cell_codes
