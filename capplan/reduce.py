"""The reduction: raw request rows → per-(run, unit) sufficient statistics. The ONLY step of
the envelope that touches raw rows; everything after it works on small numpy arrays.

Design
------
*Units.* Inside each run's measurement window (after warm-up) requests are sorted in
scheduled order (ties by a hash of request_id) into one materialised table — a CTAS with
ORDER BY, whose rowid keeps the order — that also holds every log-bucket key and grid code,
so each logarithm is taken once. The window is cut into ``U = min(max_units, n)`` units of
⌊n/U⌋ or ⌈n/U⌉ consecutive requests (a request per unit for runs up to ``max_units``).
Units are the lattice sub-blocks of the block bootstrap: a bootstrap block is ``L = b·U/n``
consecutive units, b being the larger of the Politis–White block lengths of the run's 0/1
SLO-good series and of the log of its primary latency series (``conservative_block_length``;
computed by FFT on the request-level series — the only per-request arrays fetched: one byte
per request for good, the log-bucket keys of the SLO's latency limits, and a hash that finds
duplicated events).

*Per unit* (all integer counts, so they add exactly and in any order):
- requests, ok, SLO-good (exact SQL predicate of the reduction SLO), one count per status,
  first/last scheduled time, TTFT sum and count (trend), token sums;
- ``grid``: a cumulative count ``G[u, i, j]`` of requests that are good under the SLO whose
  TTFT limit is ``x_i`` and whose TPOT (or ITL) limit is ``y_j``, where ``x_i = anchor·step^(i−h)``
  for i = 0…2h and the last index is "no limit" (same for y). The anchors are the reduction
  SLO's own limits, so at (h, h) the grid count equals the exact count; other limits of the
  SLO (E2E, the third latency metric) are applied as fixed conditions. In SQL each request
  gets a pair of grid codes (a coarse log-bucket key relative to the anchor), one
  ``GROUP BY run, unit, code_x, code_y`` counts them, numpy turns them into 2-D cumulative sums.
  A changed TTFT/TPOT/ITL limit or attainment target re-fits from these counts without
  reading events (limits snap to the nearest grid value, stated in the result); the SLO
  surface reads the whole grid.
- ``tail``: log-bucket histograms (``capplan.sketch``, α = 0.5 %) of TTFT, TPOT, ITL stat and
  E2E per unit, holding the buckets above each run's ``tail_from`` quantile plus a per-unit
  count of values below — enough to bootstrap p99/p99.9 at a fraction of the memory.
- per unit, Little's-law sums (time in flight inside the window, sojourns); per run: full
  log-bucket histograms of the same metrics and of generator lag (percentile point
  estimates), and — only when a run needs MSER-5 — time-bin TTFT means over the whole run.

Every query binds its values; identifiers come from fixed tables in this module. The SQL is
plain (window function, CASE, GROUP BY), so it could run on another engine unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from . import bootstrap as boot
from . import diagnostics as dg
from . import sketch
from .contract import STATUSES
from .errors import SpecError, StudyError
from .metrics import create_request_view, good_predicate
from .slo import SLO
from .study import Study, open_study

MAX_UNITS = 1024
GRID_STEP = 1.10
GRID_HALF = 14
TAIL_FROM = 0.95
MSER_BINS = 500
METRICS = ("ttft", "tpot", "itl", "e2e")
_DEFAULT_ANCHOR = {"ttft": 1000.0, "tpot": 50.0, "itl": 100.0}


@dataclass(frozen=True)
class GridSpec:
    """Candidate limits: ``anchor·step^(i−half)`` for i = 0…2·half, then "no limit"."""

    x_metric: str  # always "ttft"
    y_metric: str  # "tpot" or "itl"
    x_anchor: float
    y_anchor: float
    step: float
    half: int

    @property
    def size(self) -> int:
        return 2 * self.half + 2

    def limits(self, axis: str) -> np.ndarray:
        a = self.x_anchor if axis == "x" else self.y_anchor
        finite = a * self.step ** (np.arange(2 * self.half + 1) - self.half)
        return np.concatenate([finite, [np.inf]])

    def index(self, axis: str, value: float | None) -> int:
        """Nearest grid index of a limit (log scale); None ⇒ "no limit"."""
        if value is None:
            return self.size - 1
        a = self.x_anchor if axis == "x" else self.y_anchor
        i = int(round(math.log(value / a) / math.log(self.step))) + self.half
        return min(max(i, 0), 2 * self.half)


@dataclass(frozen=True)
class RunStats:
    """One run's unit statistics (arrays have one entry per unit, in scheduled order)."""

    run_id: str
    run_idx: int
    load_level: float
    offered_rps: float | None
    concurrency: float | None
    repeat: int
    nominal_rps: float | None
    warmup_s: float
    unit_size: float                    # mean requests per unit (n / units)
    block_len: boot.BlockLength          # Politis–White, in requests
    units: dict = field(repr=False)      # name -> (n_units,) arrays
    grid: np.ndarray = field(repr=False)  # (n_units, size, size) int, cumulative good counts
    hist: dict = field(repr=False)       # metric -> (k0, counts) whole-run histogram
    tail: dict = field(repr=False)       # metric -> (k0, counts (units × bins), below (units,))
    measured_rps: float = math.nan
    span_s: float = math.nan
    #: the two Politis–White lengths whose maximum is ``block_len``: on the 0/1 SLO-good
    #: series, and on the log of the run's primary latency series (``block_metric``)
    block_len_good: boot.BlockLength | None = None
    block_len_latency: boot.BlockLength | None = None
    block_metric: str = ""

    @property
    def n_units(self) -> int:
        return int(self.units["n"].size)

    @property
    def n(self) -> int:
        return int(self.units["n"].sum())

    @property
    def n_good(self) -> int:
        return int(self.units["n_good"].sum())

    def block_units(self, scheme: str, block_len: float | None = None) -> float:
        """Block length in units (≥ 1) for ``scheme``."""
        if scheme == "iid":
            return 1.0
        b = block_len if block_len is not None else self.block_len.for_scheme(scheme)
        return max(1.0, b / self.unit_size)

    def percentile(self, metric: str, p: float, alpha: float) -> float:
        k0, c = self.hist.get(metric, (0, np.zeros(0)))
        if c.sum() <= 0:
            return math.nan
        return float(sketch.quantile_from_counts(c, k0, p, alpha))


@dataclass(frozen=True)
class BlockStats:
    """Everything the envelope needs, reduced once from a study (see module docstring)."""

    slo: SLO
    alpha: float
    load_model: str
    name: str
    runs: tuple[RunStats, ...]
    grid_spec: GridSpec
    diagnostics: pd.DataFrame = field(repr=False)
    max_units: int = MAX_UNITS
    tail_from: float = TAIL_FROM
    source: str | None = None
    warmup: object = "manifest"
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def closed_loop(self) -> bool:
        return self.load_model == "closed"

    def run(self, run_id: str) -> RunStats:
        for r in self.runs:
            if r.run_id == run_id:
                return r
        raise KeyError(run_id)

    # -- SLO changes served from the grid -------------------------------------------------
    def fixed_part(self, slo: SLO) -> tuple:
        """The SLO parts the grid cannot vary (must match the reduction SLO)."""
        g = self.grid_spec
        other = "itl_ms" if g.y_metric == "tpot" else "tpot_ms"
        # max_error_rate is not here: error counts per unit do not depend on it
        return (slo.e2e_ms, getattr(slo, other), slo.itl_stat if slo.itl_ms is not None
                or g.y_metric == "itl" else None, slo.ttft_from)

    def can_serve(self, slo: SLO) -> bool:
        return self.fixed_part(slo) == self.fixed_part(self.slo)

    def effective_slo(self, slo: SLO) -> SLO:
        """``slo`` with its TTFT and TPOT/ITL limits snapped to the grid."""
        g = self.grid_spec
        ix = g.index("x", slo.ttft_ms)
        iy = g.index("y", getattr(slo, f"{g.y_metric}_ms"))
        xl, yl = g.limits("x"), g.limits("y")
        kw = {"ttft_ms": None if ix == g.size - 1 else float(xl[ix]),
              f"{g.y_metric}_ms": None if iy == g.size - 1 else float(yl[iy])}
        if slo.ttft_ms is not None and math.isclose(kw["ttft_ms"], slo.ttft_ms, rel_tol=1e-9):
            kw["ttft_ms"] = slo.ttft_ms
        yv = getattr(slo, f"{g.y_metric}_ms")
        if yv is not None and math.isclose(kw[f"{g.y_metric}_ms"], yv, rel_tol=1e-9):
            kw[f"{g.y_metric}_ms"] = yv
        try:
            return slo.with_(**kw)
        except SpecError:
            return slo

    def good_units(self, slo: SLO) -> list[np.ndarray]:
        """Per-run, per-unit good counts under ``slo`` (exact for the reduction SLO and for
        grid limits; other limits snap — see ``effective_slo``)."""
        if _same_limits(slo, self.slo):
            return [r.units["n_good"] for r in self.runs]
        if not self.can_serve(slo):
            raise SpecError("this SLO changes a limit the reduced statistics cannot vary "
                            f"(only TTFT, {self.grid_spec.y_metric.upper()} and the target)",
                            fix="re-reduce from the study: fit_envelope(study, slo)")
        g = self.grid_spec
        ix = g.index("x", slo.ttft_ms)
        iy = g.index("y", getattr(slo, f"{g.y_metric}_ms"))
        return [r.grid[:, ix, iy].astype(np.float64) for r in self.runs]


def _same_limits(a: SLO, b: SLO) -> bool:
    """Same latency limits (the target and max_error_rate do not change who is good)."""
    return (a.with_(attainment=0.5, max_error_rate=None)
            == b.with_(attainment=0.5, max_error_rate=None))


# ============================================================================ SQL (one place)

_TTFT_COL = {"scheduled": "ttft_ms", "sent": "ttft_sent_ms"}
_ITL_COL = {"p99": "itl_p99_ms", "max": "itl_max_ms"}


def _grid_code_sql(col: str) -> str:
    """Grid code of a value relative to an anchor: 0…2h for the finite limits it meets,
    2h+1 when above them all. Parameters: anchor, anchor, ln(step), h, h, anchor, ln(step), G."""
    return (f"CASE WHEN {col} IS NULL THEN 0 "
            f"WHEN {col} <= ? THEN greatest(0, ? + CAST(ceil(ln(greatest({col}, 1e-12) / ?) / ?) AS INTEGER)) "
            f"ELSE least(?, ? + greatest(1, CAST(ceil(ln({col} / ?) / ?) AS INTEGER))) END")


def _grid_code_params(anchor: float, step: float, half: int) -> list:
    ls = math.log(step)
    return [anchor, half, anchor, ls, 2 * half + 1, half, anchor, ls]


def _fixed_conditions(slo: SLO, y_metric: str) -> tuple[str, list]:
    """SQL for the SLO limits that the grid does not vary (columns of request_metrics m)."""
    parts, params = [], []
    if slo.e2e_ms is not None:
        parts.append("m.e2e_ms <= ?")
        params.append(float(slo.e2e_ms))
    if y_metric == "tpot" and slo.itl_ms is not None:
        c = f"m.{_ITL_COL[slo.itl_stat]}"
        parts.append(f"({c} IS NULL OR {c} <= ?)")
        params.append(float(slo.itl_ms))
    if y_metric == "itl" and slo.tpot_ms is not None:
        parts.append("(m.tpot_ms IS NULL OR m.tpot_ms <= ?)")
        params.append(float(slo.tpot_ms))
    return (" AND ".join(parts) if parts else "TRUE"), params


def _fetch_df(study: Study, q: str, params=None) -> pd.DataFrame:
    return study.sql(q, params if params is not None else []).df()


# ============================================================================ the reduction

def resolve_warmup(study: Study, warmup, bins: pd.DataFrame) -> tuple[dict, dict, dict]:
    """Warm-up seconds per run: a number or {run_id: s} is taken as given; "none" is 0;
    "manifest" uses the manifest's warmup_s and MSER-5 where it is absent; "mser" always
    MSER-5. Returns (warmup_s, source, mser_second_half) keyed by run_id."""
    out, src, late = {}, {}, {}
    for r in study.manifest.runs:
        late[r.run_id] = False
        if isinstance(warmup, dict):
            out[r.run_id], src[r.run_id] = float(warmup.get(r.run_id, r.warmup_s or 0.0)), "given"
            continue
        if isinstance(warmup, (int, float)) and not isinstance(warmup, bool):
            out[r.run_id], src[r.run_id] = float(warmup), "given"
            continue
        if warmup in (None, "none", False):
            out[r.run_id], src[r.run_id] = 0.0, "none"
            continue
        if warmup not in ("manifest", "mser"):
            raise SpecError(f"unknown warmup {warmup!r}",
                            fix="use 'manifest', 'mser', 'none', seconds, or {run_id: seconds}")
        if warmup == "manifest" and r.warmup_s is not None:
            out[r.run_id], src[r.run_id] = float(r.warmup_s), "manifest"
            continue
        b = bins[bins["run_id"] == r.run_id].sort_values("bin")
        y = b["ttft"].to_numpy(dtype=float)
        if y.size and np.isnan(y).all():
            y = np.zeros_like(y)
        y = pd.Series(y).ffill().bfill().to_numpy()
        res = dg.mser5(y)
        t0 = b["t0"].to_numpy(dtype=float)
        if res.in_second_half:
            trending = dg.trend_test(dg.batch_means(y, np.ones_like(y))).trending
            late[r.run_id] = not trending
            out[r.run_id], src[r.run_id] = 0.0, "mser5"  # overloaded or unusable: no cut
        else:
            out[r.run_id] = float(t0[res.index]) if res.index > 0 and res.index < t0.size else 0.0
            src[r.run_id] = "mser5"
    return out, src, late


def _needs_mser(study: Study, warmup) -> bool:
    if warmup == "mser":
        return True
    return warmup == "manifest" and any(r.warmup_s is None for r in study.manifest.runs)


_STATUS_CODE_SQL = ("CASE m.status " + " ".join(f"WHEN '{s}' THEN {i}" for i, s in enumerate(STATUSES))
                    + f" ELSE {len(STATUSES)} END")


def reduce_study(study, slo, *, warmup="manifest", alpha: float = sketch.DEFAULT_ALPHA,
                 max_units: int = MAX_UNITS, grid_step: float = GRID_STEP,
                 grid_half: int = GRID_HALF, tail_from: float = TAIL_FROM,
                 lag_limit_ms: float | None = None, block_metrics: tuple[str, ...] = ()
                 ) -> BlockStats:
    """Reduce a study to per-(run, unit) statistics for ``slo`` (see module docstring).
    ``block_metrics`` (names in ``METRICS``): latency series whose Politis–White length also
    bounds each run's block length from below — for a consumer that reads their percentiles
    (compare gates TPOT and ITL p99 whatever the SLO limits)."""
    study = open_study(study) if not isinstance(study, Study) else study
    slo = SLO.parse(slo)
    runs = study.manifest.runs
    run_idx = {r.run_id: i for i, r in enumerate(runs)}
    ttft_col = _TTFT_COL[slo.ttft_from]
    itl_col = _ITL_COL[slo.itl_stat]
    y_metric = "itl" if (slo.itl_ms is not None and slo.tpot_ms is None) else "tpot"

    # 1. warm-up: time-bin TTFT means over whole runs (MSER-5), only when some run needs it
    bins = pd.DataFrame(columns=["run_id", "bin", "n", "ttft", "t0"])
    if _needs_mser(study, warmup):
        create_request_view(study, warmup_s={r.run_id: 0.0 for r in runs})
        bins = _fetch_df(study, f"""
            WITH s AS (SELECT run_id, greatest(max(scheduled_ns), 1) AS tmax FROM request_metrics
                       GROUP BY run_id)
            SELECT m.run_id,
                   least(CAST(floor(m.scheduled_ns * CAST(? AS DOUBLE) / s.tmax) AS BIGINT), ? - 1) AS bin,
                   count(*) AS n, avg(m.{ttft_col}) AS ttft, min(m.t_s) AS t0
            FROM request_metrics m JOIN s USING (run_id) GROUP BY ALL""", [MSER_BINS, MSER_BINS])
    warm_s, warm_src, warm_late = resolve_warmup(study, warmup, bins)
    create_request_view(study, warmup_s=warm_s)
    study.con.register("_cp_runs_df", pd.DataFrame(
        {"run_id": [r.run_id for r in runs], "run_idx": [run_idx[r.run_id] for r in runs]}))
    study.con.execute("CREATE OR REPLACE TEMP TABLE _cp_runs AS SELECT * FROM _cp_runs_df")
    study.con.unregister("_cp_runs_df")

    # 2. grid anchors: the SLO's own limits, else the 90th percentile of the data (exact,
    #    so the grid is the same on every run)
    def _anchor(col, limit, metric):
        if limit is not None:
            return float(limit)
        v = study.sql(f"SELECT quantile_cont({col}, 0.9) FROM request_metrics "
                      "WHERE in_window AND status = 'ok'").fetchone()[0]
        return float(v) if v is not None and v > 0 else _DEFAULT_ANCHOR[metric]

    y_col = "tpot_ms" if y_metric == "tpot" else itl_col
    gspec = GridSpec("ttft", y_metric, _anchor(ttft_col, slo.ttft_ms, "ttft"),
                     _anchor(y_col, getattr(slo, f"{y_metric}_ms"), y_metric),
                     grid_step, grid_half)

    # 3. the window's requests in scheduled order (ties broken by hash(request_id)), one
    #    materialisation of compact columns: flags, status code, time, log-bucket keys and
    #    grid codes (every logarithm is taken once, here). A CTAS with ORDER BY keeps that order
    #    in rowid (DuckDB's preserve_insertion_order, set here) — far cheaper than a window
    #    function carrying the payload. Unit = ⌊(rowid − first)·U/n⌋, U = min(max_units, n).
    ln_g = math.log(sketch.gamma_of(alpha))
    good_sql, good_params = good_predicate(slo, alias="m")
    fixed_sql, fixed_params = _fixed_conditions(slo, y_metric)
    keys = {"kt": f"m.{ttft_col}", "kp": "m.tpot_ms", "ki": f"m.{itl_col}", "ke": "m.e2e_ms",
            "kl": "m.gen_lag_ms"}
    ktype = "SMALLINT" if alpha >= 1e-3 else "INTEGER"  # |key| ≤ ln(1e12)/ln γ fits
    key_sql = ", ".join(f"CAST(CASE WHEN {c} IS NULL THEN NULL ELSE {sketch.key_sql(c)} END "
                        f"AS {ktype}) AS {k}" for k, c in keys.items())
    study.sql("SET preserve_insertion_order = true")
    study.sql(f"""
        CREATE OR REPLACE TEMP TABLE _cp_req AS
        SELECT CAST(r.run_idx AS SMALLINT) AS run_idx, hash(m.request_id) AS h,
               {good_sql} AS good,
               (m.status = 'ok' AND m.first_token_ns IS NOT NULL AND {fixed_sql}) AS base,
               CAST({_STATUS_CODE_SQL} AS TINYINT) AS st,
               m.t_s, CAST(m.{ttft_col} AS FLOAT) AS ttft, CAST(m.e2e_ms / 1e3 AS FLOAT) AS soj,
               {key_sql},
               CAST({_grid_code_sql('m.' + ttft_col)} AS SMALLINT) AS jx,
               CAST({_grid_code_sql('m.' + y_col)} AS SMALLINT) AS jy
        FROM request_metrics m JOIN _cp_runs r USING (run_id) WHERE m.in_window
        ORDER BY r.run_idx, m.scheduled_ns, h""",
              good_params + fixed_params + [ln_g] * len(keys)
              + _grid_code_params(gspec.x_anchor, grid_step, grid_half)
              + _grid_code_params(gspec.y_anchor, grid_step, grid_half))
    study.sql("""CREATE OR REPLACE TEMP TABLE _cp_meta AS
                 SELECT run_idx, min(rowid) AS first_row, count(*) AS n_run,
                        least(count(*), CAST(? AS BIGINT)) AS n_units, max(t_s) AS t_last
                 FROM _cp_req GROUP BY run_idx""", [int(max_units)])
    study.sql("""CREATE OR REPLACE TEMP VIEW _cp_u AS
                 SELECT q.*, m.t_last,
                        CAST((q.rowid - m.first_row) * m.n_units // m.n_run AS INTEGER) AS unit
                 FROM _cp_req q JOIN _cp_meta m USING (run_idx)""")
    try:
        return _reduce_from_table(study, slo, runs, run_idx, warm_s, warm_src, warm_late,
                                  gspec, alpha, max_units, tail_from, lag_limit_ms, warmup,
                                  tuple(block_metrics))
    finally:
        study.sql("DROP VIEW IF EXISTS _cp_u")
        study.sql("DROP TABLE IF EXISTS _cp_meta")
        study.sql("DROP TABLE IF EXISTS _cp_req")


def _np(study: Study, q: str, params=None) -> dict:
    """Fetch a query as numpy columns (no pandas round trip for large results)."""
    res = study.sql(q, params if params is not None else []).fetchnumpy()
    return {k: np.asarray(v) for k, v in res.items()}


_KEY_COL = {"ttft": "kt", "tpot": "kp", "itl": "ki", "e2e": "ke", "gen_lag_ms": "kl"}


def _reduce_from_table(study, slo, runs, run_idx, warm_s, warm_src, warm_late, gspec, alpha,
                       max_units, tail_from, lag_limit_ms, warmup,
                       block_metrics: tuple[str, ...] = ()) -> BlockStats:
    nr = len(runs)
    G = gspec.size
    # 4. per-unit counts (and Little's-law sums: time in flight inside the window, sojourns)
    status_cols = ", ".join(f"sum(CAST(st = {i} AS INTEGER)) AS st_{s}"
                            for i, s in enumerate(STATUSES))
    ok_counts = ", ".join(f"count({_KEY_COL[m]}) FILTER (WHERE st = 0) AS cnt_{m}" for m in METRICS)
    u = _fetch_df(study, f"""
        SELECT run_idx, unit, count(*) AS n, sum(CAST(good AS INTEGER)) AS n_good,
               sum(CAST(st = 0 AS INTEGER)) AS n_ok, {status_cols}, {ok_counts},
               min(t_s) AS t0, max(t_s) AS t1, avg(ttft) AS ttft_mean, count(ttft) AS ttft_n,
               coalesce(sum(greatest(0.0, least(t_s + soj, t_last) - t_s)), 0) AS busy_s,
               coalesce(sum(soj), 0) AS soj_s
        FROM _cp_u GROUP BY ALL ORDER BY run_idx, unit""")
    g = _np(study, "SELECT run_idx, unit, jx, jy, count(*) AS c FROM _cp_u WHERE base GROUP BY ALL")

    # 5. whole-run histograms (percentiles; latency over ok requests) and generator lag
    hist_metrics = METRICS + ("gen_lag_ms",)
    parts = []
    for i, m in enumerate(hist_metrics):
        k = _KEY_COL[m]
        cond = "st = 0 AND " if m in METRICS else ""
        parts.append(f"SELECT run_idx, {i} AS metric, {k} AS k, count(*) AS c "
                     f"FROM _cp_req WHERE {cond}{k} IS NOT NULL GROUP BY ALL")
    h = _fetch_df(study, " UNION ALL ".join(parts))
    hist = [{} for _ in range(nr)]
    thresholds = {}
    for (ri, mi), grp in h.groupby(["run_idx", "metric"]):
        k = grp["k"].to_numpy(np.int64)
        c = grp["c"].to_numpy(np.int64)
        k0 = int(k.min())
        dense = np.bincount(k - k0, weights=c).astype(np.int64)
        hist[int(ri)][hist_metrics[int(mi)]] = (k0, dense)
        if int(mi) < len(METRICS):
            cum = np.cumsum(dense)
            thresholds[(int(ri), int(mi))] = k0 + int(np.searchsorted(cum, tail_from * cum[-1]))

    # 6. per-unit tail histograms above each run's tail_from quantile
    tails_df = pd.DataFrame([{"run_idx": a, "metric": b, "k_lo": v}
                             for (a, b), v in thresholds.items()],
                            columns=["run_idx", "metric", "k_lo"]).astype("int64")
    study.con.register("_cp_tail_df", tails_df)
    parts = [f"SELECT run_idx, unit, {i} AS metric, {_KEY_COL[m]} AS k FROM _cp_u "
             f"WHERE st = 0 AND {_KEY_COL[m]} IS NOT NULL" for i, m in enumerate(METRICS)]
    t = _np(study, f"""
        SELECT x.run_idx, x.unit, x.metric, x.k, count(*) AS c
        FROM ({' UNION ALL '.join(parts)}) x JOIN _cp_tail_df t
             ON x.run_idx = t.run_idx AND x.metric = t.metric
        WHERE x.k >= t.k_lo GROUP BY ALL""")
    study.con.unregister("_cp_tail_df")

    # 7. the request-level good series (one byte per request) for Politis–White, in order
    #    (a plain scan returns rowid order under preserve_insertion_order; checked below)
    lat_cols = _latency_key_cols(slo, gspec.y_metric)
    extra = [(m, _LAT_KEY[m]) for m in block_metrics if m in _LAT_KEY]
    for m, c in extra:
        if all(c != c2 for _, c2, _ in lat_cols):
            lat_cols.append((m, c, None))
    sel = "".join(f", coalesce({c}, {_KEY_MISSING}) AS {c}" for _, c, _ in lat_cols)
    pw = _np(study, f"SELECT run_idx, good, h{sel} FROM _cp_req")
    pr = pw["run_idx"]
    if pr.size and np.any(pr[1:] < pr[:-1]):
        raise StudyError("internal: the reduction lost the scheduled order of requests",
                         fix="report this; set preserve_insertion_order = true in DuckDB")
    pw_bounds = np.searchsorted(pr, np.arange(nr + 1), side="left")

    # ---------------------------------------------------------------- assemble per run
    unit_cols = [c for c in u.columns if c not in ("run_idx", "unit")]
    u_run = u["run_idx"].to_numpy()
    g_run, t_run = g["run_idx"], t["run_idx"]
    out_runs, diags = [], []
    closed = study.manifest.load_model == "closed"
    for r in runs:
        i = run_idx[r.run_id]
        sel = u_run == i
        nu = int(sel.sum())
        units = {c: u.loc[sel, c].to_numpy(dtype=np.float64) for c in unit_cols}
        n = int(units["n"].sum()) if nu else 0
        unit_size = n / nu if nu else 1.0
        # grid → 2-D cumulative counts
        gs = g_run == i
        flat = (g["unit"][gs].astype(np.int64) * G + g["jx"][gs].astype(np.int64)) * G \
            + g["jy"][gs].astype(np.int64)
        cells = np.bincount(flat, weights=g["c"][gs], minlength=nu * G * G).reshape(nu, G, G)
        grid = cells.cumsum(axis=1).cumsum(axis=2)
        grid = np.rint(grid).astype(np.int32 if n < 2**31 else np.int64)
        # tails (dense units × bins, plus the count below each tail)
        tails = {}
        ts = t_run == i
        for mi, m in enumerate(METRICS):
            k0c = hist[i].get(m)
            if k0c is None or nu == 0:
                continue
            th = thresholds[(i, mi)]
            nb = k0c[0] + k0c[1].size - th
            sm = ts & (t["metric"] == mi)
            idx = t["unit"][sm].astype(np.int64) * nb + (t["k"][sm].astype(np.int64) - th)
            dense = np.bincount(idx, weights=t["c"][sm], minlength=nu * nb).reshape(nu, nb)
            tails[m] = (int(th), dense, units[f"cnt_{m}"] - dense.sum(axis=1))
        # request-level good series → block length
        ps = slice(pw_bounds[i], pw_bounds[i + 1])
        series = pw["good"][ps].astype(np.float64)
        hs = pw["h"][ps]  # adjacent equal (scheduled_ns, hash(request_id)): recorded twice
        dups = int(np.sum(hs[1:] == hs[:-1])) if hs.size > 1 else 0
        lat = {m: pw[c][ps] for m, c, _ in lat_cols}
        limited = [(m, c, lim) for m, c, lim in lat_cols if lim is not None]
        bl_good, bl_lat, bl_metric = conservative_block_length(
            series, {m: lat[m] for m, _, _ in limited}, {m: lim for m, _, lim in limited},
            alpha)
        bl = _bl_max(bl_good, bl_lat)
        for m, _ in extra:  # the consumer's own latency series bound it too
            bl = _bl_max(bl, _key_series_block_length(lat[m]))
        t_first = float(units["t0"].min()) if nu else math.nan
        t_last = float(units["t1"].max()) if nu else math.nan
        span = t_last - t_first if nu else math.nan
        measured = (n - 1) / span if nu and span > 0 else math.nan
        # diagnostics
        tm_units = units.get("ttft_mean", np.zeros(0))
        tw = units.get("ttft_n", np.zeros(0))
        half = nu // 2
        bm = dg.batch_means(tm_units, tw)
        bm_end = dg.batch_means(tm_units[half:], tw[half:], dg.TREND_BATCHES // 2)
        lag = hist[i].get("gen_lag_ms")
        lag_p99 = float(sketch.quantile_from_counts(lag[1], lag[0], 0.99, alpha)) if lag else math.nan
        # Little: L̄ = Σ in-window flight time / T, λ·W̄ = Σ sojourn / T (requests with an end)
        littles = math.nan
        if nu and span > 0 and units["soj_s"].sum() > 0:
            littles = float(units["busy_s"].sum() / units["soj_s"].sum())
        lag_limit = lag_limit_ms if lag_limit_ms is not None else max(
            dg.LAG_P99_MS, 0.1 * (slo.ttft_ms or 0.0))
        d = dg.run_diagnostics(
            run_id=r.run_id, n=n, warmup_s=warm_s[r.run_id], warmup_source=warm_src[r.run_id],
            mser_second_half=warm_late[r.run_id], measured_rps=measured,
            nominal_rps=r.nominal_rps if r.nominal_rps is not None else r.offered_rps,
            gen_lag_p99_ms=lag_p99, littles=littles, trend_all=dg.trend_test(bm),
            trend_end=dg.trend_test(bm_end), duplicates=dups,
            lag_limit_ms=lag_limit, closed_loop=closed)
        diags.append(d)
        out_runs.append(RunStats(
            run_id=r.run_id, run_idx=i, load_level=r.load_level, offered_rps=r.offered_rps,
            concurrency=None if r.concurrency is None else float(r.concurrency), repeat=r.repeat,
            nominal_rps=r.nominal_rps, warmup_s=warm_s[r.run_id], unit_size=unit_size,
            block_len=bl, units=units, grid=grid, hist=hist[i], tail=tails,
            measured_rps=measured, span_s=span, block_len_good=bl_good,
            block_len_latency=bl_lat, block_metric=bl_metric))
    return BlockStats(slo=slo, alpha=alpha, load_model=study.manifest.load_model,
                      name=study.manifest.name, runs=tuple(out_runs), grid_spec=gspec,
                      diagnostics=dg.to_frame(diags), max_units=max_units, tail_from=tail_from,
                      source=str(study.root), warmup=warmup)


_KEY_MISSING = 32767  # SMALLINT sentinel for a missing latency (failed request) in the fetch
_LAT_KEY = {"ttft": "kt", "tpot": "kp", "itl": "ki", "e2e": "ke"}


def _latency_key_cols(slo: SLO, y_metric: str) -> list[tuple[str, str, float]]:
    """(metric, key column, limit) of the SLO's latency limits, TTFT first (the default primary
    series), then TPOT or ITL (the grid's y metric), then E2E."""
    out = []
    if slo.ttft_ms is not None:
        out.append(("ttft", "kt", float(slo.ttft_ms)))
    y = getattr(slo, f"{y_metric}_ms")
    if y is not None:
        out.append((y_metric, _LAT_KEY[y_metric], float(y)))
    if slo.e2e_ms is not None:
        out.append(("e2e", "ke", float(slo.e2e_ms)))
    return out


def _key_series_block_length(keys) -> boot.BlockLength:
    """Politis–White length of a log-bucket key series (the log up to α) in scheduled order;
    a missing value (a failed request) reads as the run's largest."""
    v = np.asarray(keys, dtype=np.float64)
    miss = v >= _KEY_MISSING
    if v.size < 3 or miss.all():
        return boot.BlockLength(1.0, 1.0)
    return boot.optimal_block_length(np.where(miss, v[~miss].max(), v))


def _bl_max(a: boot.BlockLength, b: boot.BlockLength | None) -> boot.BlockLength:
    if b is None:
        return a
    return boot.BlockLength(max(a.stationary, b.stationary), max(a.circular, b.circular))


def conservative_block_length(good, latency: dict, limits: dict | None = None,
                              alpha: float = sketch.DEFAULT_ALPHA):
    """Block length of a run = max(PW on the 0/1 good series, PW on the log of its primary
    latency series), each capped at min(3√n, n/3) as PW is (STATISTICS.md §3).

    Why: when violations are rare and cluster in bursts, the autocorrelations of the 0/1
    series are mostly noise and PW comes out far too short (2.8 requests against 41 on log
    TTFT in a synthetic model) and the interval under-covers; the latency series that drives
    the violations carries the dependence visibly.

    ``latency``: metric → per-request series in scheduled order (log-bucket keys — the log
    up to α — or raw values when ``limits`` is None and the series are positive floats);
    missing values (failed requests; ≥ ``_KEY_MISSING`` or NaN) are set to the run's largest
    value (a failure is a violation). The primary series is the metric with the most
    violations of its limit (by bucket key), TTFT on ties and when nothing is violated.
    Returns (PW on good, PW on the primary latency or None, its metric name or "")."""
    good = np.asarray(good, dtype=np.float64)
    n = good.size
    one = boot.BlockLength(1.0, 1.0)
    bl_good = boot.optimal_block_length(good) if n >= 3 else one
    if not latency or n < 3:
        return bl_good, None, ""
    best, best_v = None, -1
    for m, v in latency.items():
        v = np.asarray(v)
        if limits is not None:
            lk = int(sketch.keys(np.array([limits[m]]), alpha)[0])
            ok = v < _KEY_MISSING
            nv = int(np.count_nonzero(ok & (v > lk)))
        else:
            nv = 0
        if nv > best_v:
            best, best_v = m, nv
    v = np.asarray(latency[best], dtype=np.float64)
    miss = (v >= _KEY_MISSING) | np.isnan(v) if limits is not None else np.isnan(v)
    if miss.all():
        return bl_good, one, best
    if miss.any():
        v = np.where(miss, np.max(v[~miss]), v)
    if limits is None:
        v = np.log(np.maximum(v, sketch.MIN_VALUE))
    return bl_good, boot.optimal_block_length(v), best


def with_slo_anchor(stats: BlockStats, slo: SLO) -> BlockStats:
    """The same statistics labelled with another SLO the grid serves (used by refits)."""
    return replace(stats, slo=slo)


def stats_from_series(runs: list[dict], slo: SLO | str, *, max_units: int = MAX_UNITS,
                      load_model: str = "open", name: str = "in-memory") -> BlockStats:
    """BlockStats built in memory from per-run 0/1 SLO-good series, skipping SQL (for
    simulations, tests and tools that already hold indicators). Each dict needs ``run_id``,
    ``load_level`` and ``good`` (0/1 array in scheduled order); optional ``rate_rps``
    (measured rate; default the load level), ``repeat``, ``ok`` (0/1 status-ok series,
    default all ok; the others count as ``error``; a good request must be ok), ``latency`` (a positive per-request
    latency series, e.g. TTFT: the block length is then max(PW on good, PW on its log), as in
    ``reduce_study``). Only the given SLO (any target) can be re-fitted; there are no latency
    histograms."""
    slo = SLO.parse(slo)
    out, diags = [], []
    for i, r in enumerate(runs):
        good = np.asarray(r["good"], dtype=np.float64)
        if r.get("ok") is not None:
            good = good * np.asarray(r["ok"], dtype=np.float64)
        n = good.size
        nu = min(n, max_units)
        unit = np.arange(n) * nu // n if n else np.zeros(0, dtype=np.int64)  # as in the SQL
        g_u = np.bincount(unit, weights=good, minlength=nu)
        n_u = np.bincount(unit, minlength=nu).astype(np.float64)
        edges = np.arange(nu)
        s = n / nu if nu else 1.0
        grid = np.zeros((edges.size, 2, 2), dtype=np.int64)
        grid[:, 0, :] = g_u[:, None]
        grid[:, 1, :] = n_u[:, None]
        rate = float(r.get("rate_rps", r["load_level"]))
        lat = r.get("latency")
        bl_good, bl_lat, bl_metric = conservative_block_length(
            good, {} if lat is None else {"latency": np.asarray(lat, dtype=np.float64)})
        ok = r.get("ok")
        ok_u = n_u.copy() if ok is None else np.bincount(
            unit, weights=np.asarray(ok, dtype=np.float64), minlength=nu)
        units = {"n": n_u, "n_good": g_u, "n_ok": ok_u}
        for st in STATUSES:
            units[f"st_{st}"] = (ok_u.copy() if st == "ok" else n_u - ok_u if st == "error"
                                 else np.zeros_like(n_u))
        out.append(RunStats(
            run_id=str(r["run_id"]), run_idx=i, load_level=float(r["load_level"]),
            offered_rps=None if load_model == "closed" else rate,
            concurrency=float(r["load_level"]) if load_model == "closed" else None,
            repeat=int(r.get("repeat", 0)), nominal_rps=None, warmup_s=0.0, unit_size=s,
            block_len=_bl_max(bl_good, bl_lat), units=units, grid=grid.astype(np.int32),
            hist={}, tail={}, measured_rps=rate, span_s=n / rate if rate > 0 else math.nan,
            block_len_good=bl_good, block_len_latency=bl_lat, block_metric=bl_metric))
        diags.append({"run_id": str(r["run_id"]), "n": n, "usable": n >= dg.MIN_REQUESTS,
                      "reason": "" if n >= dg.MIN_REQUESTS else "too few requests",
                      "warnings": ""})
    gs = GridSpec("ttft", "tpot", float(slo.ttft_ms or 1.0), float(slo.tpot_ms or 1.0), 2.0, 0)
    return BlockStats(slo=slo, alpha=sketch.DEFAULT_ALPHA, load_model=load_model, name=name,
                      runs=tuple(out), grid_spec=gs, diagnostics=pd.DataFrame(diags),
                      max_units=max_units, source=None)
