"""The reduction: raw request rows → per-(run, unit[, cell]) sufficient statistics. The ONLY
step that touches raw rows for every consumer (envelope, compare, and the coming timeline and
mix reweighting); everything after it works on small numpy arrays.

Design
------
*Window.* Every reduction states its steady window (``capplan.metrics.Window``: warm-up
seconds per run). ``reduce_study(warmup=...)`` takes a ``Window`` as given, or resolves one
from "manifest" / "mser" / "none" / seconds / {run_id: seconds} (MSER-5 where asked or where
the manifest has no warm-up); the result keeps it (``BlockStats.window``), so a consumer that
needs more numbers over the same requests reads them from the same statistics or passes the
same window on.

*One ordered table.* The window's requests are sorted in scheduled order into one
materialised table — a CTAS with ORDER BY, whose rowid keeps the order — that holds compact
columns: flags, status code, scheduled time, every log-bucket key (each logarithm is taken
once, here), the SLO grid codes and, when asked, the cell code. Ties in ``scheduled_ns`` are
found afterwards from the ordered times (no string column is read on the common path); only a
run with ties is re-sorted with a hash of ``request_id`` as tie-break, which also finds events
recorded twice. Every other statistic is a GROUP BY over that table.

*Units* (the lattice sub-blocks of the block bootstrap), chosen by a small frozen object:
- ``CountUnits(max_units)`` (the envelope's default): ``U = min(max_units, n)`` units of
  ⌊n/U⌋ or ⌈n/U⌉ consecutive requests (a request per unit for runs up to ``max_units``);
- ``TimeUnits(width_s, origin_s, n_units)``: unit = ⌊(scheduled_ns − origin) / width⌋, the
  origin being the run's window start unless given. Two studies reduced with the same widths
  and aligned windows share the grid (unit i covers the same scheduled times on both sides):
  what a paired comparison needs; ``time_units_for`` builds such a grid for matched runs.
A bootstrap block is ``L = b·U/n`` consecutive units (``bootstrap.Circular.block_units``).

*Block length* — one rule for every consumer (``block_length``): b is the largest
Politis–White length over the run's 0/1 SLO-good series, the log of its TTFT and of its TPOT,
and the log of any other latency the SLO limits (ITL statistic, E2E), each in scheduled order,
a missing latency (failed request) read as the run's largest (a failure is a violation). Why
the union (docs/statistics.md#block-length): one resample serves every statistic read from the
run — attainment, error rate, the TTFT and TPOT percentile intervals, compare's per-cell
deltas — so the block must be long enough for the most dependent of those series. A block too
short under-covers; one too long only makes the variance estimate a little noisier. The 0/1
series alone is far too short when violations are rare and come in bursts (its
autocorrelations are mostly noise: 2.8 requests against 41 on log TTFT in a synthetic model),
and picking one "primary" latency by its violations flips between TTFT and TPOT across a sweep
and ignores a strongly dependent TPOT at light load (on the demo study PW on log TPOT is 19–123
requests where log TTFT gives 1–39).

*Per unit* (integer counts, so they add exactly and in any order):
- requests, ok, SLO-good (exact SQL predicate of the reduction SLO), one count per status,
  first/last scheduled time, TTFT sum and count (trend), Little's-law sums;
- ``grid``: a cumulative count ``G[u, i, j]`` of requests that are good under the SLO whose
  TTFT limit is ``x_i`` and whose TPOT (or ITL) limit is ``y_j`` (i, j = 0…2h, the last index
  "no limit"). An axis the SLO limits is anchored on the limit, ``x_i = limit·step^(i−h)``, so
  at (h, h) the grid count equals the exact count; an axis it does not limit is anchored on the
  pooled 90th-percentile bucket and its candidate limits are bucket edges, where counting keys
  is exact too. Other limits of the SLO (E2E, the third latency metric) are fixed conditions. A
  changed TTFT/TPOT/ITL limit or target re-fits from these counts without reading events
  (limits snap to the nearest grid value, stated in the result); the SLO surface reads the
  whole grid.
- ``tail``: log-bucket histograms (``capplan.sketch``) of TTFT, TPOT, ITL statistic and E2E
  per unit above each run's ``tail_from`` quantile, plus a per-unit count below — enough to
  bootstrap p99/p99.9 at a fraction of the memory.
Per run: full log-bucket histograms of the same metrics and of generator lag.

*Cells* (optional, ``Cells``): input-length bucket, output-length bucket, length quadrant,
tenant, SLO class, prefix-cache hit (hit / miss / unknown, from ``computed_input_tokens``). The cell code is computed in the same table and the per-unit counts are
grouped by (unit, cell) in the same pass, so per-(run, unit, cell) counts, good counts, status
counts, token sums and log-bucket histograms come out together (``RunStats.cells``); the
per-unit arrays are their sums over cells. Without cells nothing per cell is built.

Every query binds its values; identifiers come from fixed tables in this module. The SQL is
plain (CASE, GROUP BY, ORDER BY), so it could run on another engine unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from . import bootstrap as boot
from . import contract as C
from . import diagnostics as dg
from . import sketch
from .errors import SpecError, StudyError
from .metrics import Window, good_predicate, request_view
from .slo import SLO
from .study import Study, open_study

MAX_UNITS = 1024
GRID_STEP = 1.10
GRID_HALF = 14
TAIL_FROM = 0.95
MSER_BINS = 500
METRICS = ("ttft", "tpot", "itl", "e2e")
NONE_LABEL = "(none)"


# ============================================================================ units and cells

@dataclass(frozen=True)
class CountUnits:
    """Units of consecutive requests in scheduled order: ``min(max_units, n)`` per run."""

    max_units: int = MAX_UNITS

    def __post_init__(self):
        if isinstance(self.max_units, bool) or not isinstance(self.max_units, (int, np.integer)) \
                or self.max_units < 1:
            raise SpecError(f"max_units must be an integer ≥ 1, got {self.max_units!r}",
                            field="max_units")


def _per_run(value, run_id: str, what: str):
    if isinstance(value, Mapping):
        if run_id not in value:
            raise SpecError(f"TimeUnits.{what} has no value for run {run_id!r}",
                            field=what, fix="give every run of the study a value")
        return value[run_id]
    return value


@dataclass(frozen=True)
class TimeUnits:
    """Units of equal scheduled-time width: unit = ⌊(scheduled_ns − origin) / width⌋, clipped
    to [0, n_units − 1].

    ``width_s``: seconds, one number or {run_id: seconds}; ``origin_s``: {run_id: seconds on
    the run's clock}, default the run's window start (its warm-up); ``n_units``: {run_id:
    count}, default from the data (the last request's unit + 1). Two studies with the same
    widths, origins and counts per matched run share one grid (see ``time_units_for``)."""

    width_s: float | Mapping[str, float]
    origin_s: Mapping[str, float] | None = None
    n_units: Mapping[str, int] | None = None

    def width_ns(self, run_id: str) -> int:
        w = float(_per_run(self.width_s, run_id, "width_s"))
        if not (w > 0 and math.isfinite(w)):
            raise SpecError(f"TimeUnits width for run {run_id!r} must be > 0 s, got {w!r}",
                            field="width_s")
        return max(1, int(round(w * C.NS_PER_S)))

    def origin_ns(self, run_id: str, window: Window) -> int:
        o = window.seconds(run_id) if self.origin_s is None else float(
            _per_run(self.origin_s, run_id, "origin_s"))
        return int(round(o * C.NS_PER_S))

    def count(self, run_id: str) -> int | None:
        if self.n_units is None:
            return None
        n = int(_per_run(self.n_units, run_id, "n_units"))
        if n < 1:
            raise SpecError(f"TimeUnits n_units for run {run_id!r} must be ≥ 1, got {n}",
                            field="n_units")
        return n


#: the token columns a cell bucket may read (integers of the request view)
_TOKEN_COLUMNS = tuple(c.name for c in C.EVENT_COLUMNS if c.name.endswith("_tokens"))


@dataclass(frozen=True)
class Cells:
    """Cell dimensions summed in the same pass as the units. Buckets: index = number of edges
    ≤ value (edges [256, 1024] → <256, 256–1024, ≥1024; a missing count reads 0); quadrant:
    (input > split_in, output > split_out); tenant and slo_class: their values ("(none)" when
    missing); cache: ``CACHE_LABELS`` — "hit" when some prompt tokens came from the prefix
    cache (``computed_input_tokens`` < ``input_tokens``), "miss" when none did, "unknown" where
    ``computed_input_tokens`` is not stamped. ``hist``: metrics with per-(unit, cell) log-bucket
    histograms (ok requests)."""

    input_edges: tuple[float, ...] = ()
    output_edges: tuple[float, ...] = ()
    quadrant_split: tuple[float, float] | None = None
    tenant: bool = False
    slo_class: bool = False
    cache: bool = False
    hist: tuple[str, ...] = ("ttft", "tpot")
    input_column: str = "input_tokens"
    output_column: str = "output_tokens"

    def __post_init__(self):
        for name in ("input_edges", "output_edges"):
            e = tuple(float(v) for v in getattr(self, name))
            if any(not math.isfinite(v) for v in e) or any(b <= a for a, b in zip(e, e[1:])):
                raise SpecError(f"Cells.{name} must be increasing finite numbers, got {e}",
                                field=name)
            object.__setattr__(self, name, e)
        if self.quadrant_split is not None:
            q = tuple(float(v) for v in self.quadrant_split)
            if len(q) != 2:
                raise SpecError("Cells.quadrant_split is (input split, output split)",
                                field="quadrant_split")
            object.__setattr__(self, "quadrant_split", q)
        bad = [m for m in self.hist if m not in METRICS]
        if bad:
            raise SpecError(f"Cells.hist: unknown metric(s) {bad}", field="hist",
                            fix="choose from " + ", ".join(METRICS))
        for name in ("input_column", "output_column"):
            if getattr(self, name) not in _TOKEN_COLUMNS:
                raise SpecError(f"Cells.{name} must be a token column, got "
                                f"{getattr(self, name)!r}", field=name,
                                fix="one of " + ", ".join(_TOKEN_COLUMNS))

    @property
    def dims(self) -> tuple[str, ...]:
        """The cell dimensions asked for, in cell-index column order."""
        out = []
        if self.input_edges:
            out.append("input_bucket")
        if self.output_edges:
            out.append("output_bucket")
        if self.quadrant_split is not None:
            out += ["input_long", "output_long"]
        if self.tenant:
            out.append("tenant")
        if self.slo_class:
            out.append("slo_class")
        if self.cache:
            out.append("cache")
        return tuple(out)


#: the cache cell's values, by code
CACHE_LABELS = ("miss", "hit", "unknown")


def bucket_labels(edges: Sequence[float]) -> list[str]:
    """Readable names of the buckets that ``edges`` cut: <a, a–b, …, ≥z."""
    if not edges:
        return ["all"]
    return ([f"<{edges[0]:g}"] + [f"{a:g}–{b:g}" for a, b in zip(edges, edges[1:])]
            + [f"≥{edges[-1]:g}"])


def time_units_for(sides: Sequence[tuple[Study, Window, Sequence[str]]], *,
                   max_units: int = MAX_UNITS) -> list[TimeUnits]:
    """One time grid shared by several studies: ``sides`` are (study, window, run ids) with
    the runs matched by position. Per matched run: origin = the latest window start, width =
    the longest window span over the sides / (max_units − 1), and the same unit count, so unit i
    covers the same scheduled times on every side. Returns one ``TimeUnits`` per side, keyed by
    that side's run ids."""
    ends = []
    for study, window, run_ids in sides:
        view = request_view(study, window)
        rows = dict(study.sql(f"SELECT run_id, max(scheduled_ns) FROM {view} WHERE in_window "
                              "GROUP BY run_id").fetchall())
        ends.append([rows.get(r) for r in run_ids])
    n_pairs = len(sides[0][2])
    widths, origins, counts = [{} for _ in sides], [{} for _ in sides], [{} for _ in sides]
    for i in range(n_pairs):
        origin_ns = max(int(round(w.seconds(ids[i]) * C.NS_PER_S)) for _, w, ids in sides)
        last = [e[i] for e in ends if e[i] is not None]
        span_ns = max(max(last) - origin_ns, 1) if last else 1
        width_ns = max(1, -(-span_ns // max(int(max_units) - 1, 1)))
        n_u = int(span_ns // width_ns) + 1
        for k, (_, _, ids) in enumerate(sides):
            widths[k][ids[i]] = width_ns / C.NS_PER_S
            origins[k][ids[i]] = origin_ns / C.NS_PER_S
            counts[k][ids[i]] = n_u
    return [TimeUnits(widths[k], origins[k], counts[k]) for k in range(len(sides))]


# ============================================================================ results

@dataclass(frozen=True)
class GridSpec:
    """Candidate limits per axis: ``anchor·step^(i−half)`` for i = 0…2·half, then "no
    limit". An axis the SLO limits has the limit as anchor and ``GRID_STEP``; an axis it does
    not limit has a bucket edge as anchor and a whole number of buckets as step (``*_keys``:
    the anchor's bucket key and the buckets per step, 0 for a limited axis)."""

    x_metric: str  # always "ttft"
    y_metric: str  # "tpot" or "itl"
    x_anchor: float
    y_anchor: float
    x_step: float
    y_step: float
    half: int
    x_keys: tuple[int, int] = (0, 0)
    y_keys: tuple[int, int] = (0, 0)

    @property
    def size(self) -> int:
        return 2 * self.half + 2

    def limits(self, axis: str) -> np.ndarray:
        a, s = (self.x_anchor, self.x_step) if axis == "x" else (self.y_anchor, self.y_step)
        finite = a * s ** (np.arange(2 * self.half + 1) - self.half)
        return np.concatenate([finite, [np.inf]])

    def index(self, axis: str, value: float | None) -> int:
        """Nearest grid index of a limit (log scale); None ⇒ "no limit"."""
        if value is None:
            return self.size - 1
        a, s = (self.x_anchor, self.x_step) if axis == "x" else (self.y_anchor, self.y_step)
        i = int(round(math.log(value / a) / math.log(s))) + self.half
        return min(max(i, 0), 2 * self.half)


@dataclass(frozen=True)
class CellStats:
    """One run's per-(unit, cell) statistics; cell c is row c of ``BlockStats.cell_index``.

    ``sums``: name → (n_units × n_cells) float64 — ``n``, ``n_good``, ``n_ok``, ``st_<status>``
    for each status, ``input_tokens``, ``output_tokens``, ``input_tokens_started`` (input
    tokens of requests that got a first token), ``computed_input_tokens`` and
    ``computed_input_tokens_started`` (the prompt tokens actually computed: prefix-cache misses;
    all of them where not stamped). ``hist``: metric → (unit, cell, key, count)
    int64 arrays, log-bucket histograms of ok requests (``Cells.hist`` metrics)."""

    sums: dict = field(repr=False)
    hist: dict = field(repr=False)


@dataclass(frozen=True)
class RunStats:
    """One run's unit statistics (arrays have one entry per unit, in time order)."""

    run_id: str
    run_idx: int
    load_level: float
    offered_rps: float | None
    concurrency: float | None
    repeat: int
    nominal_rps: float | None
    warmup_s: float
    unit_size: float                    # mean requests per unit (n / units)
    block_len: boot.BlockLength          # the block-length rule's result, in requests
    units: dict = field(repr=False)      # name -> (n_units,) arrays
    grid: np.ndarray = field(repr=False)  # (n_units, size, size) int, cumulative good counts
    hist: dict = field(repr=False)       # metric -> (k0, counts) whole-run histogram
    tail: dict = field(repr=False)       # metric -> (k0, counts (units × bins), below (units,))
    measured_rps: float = math.nan
    span_s: float = math.nan
    #: Politis–White on the 0/1 SLO-good series, and the largest over the latency series
    #: (``block_metric`` names it); ``block_len`` is the larger of the two
    block_len_good: boot.BlockLength | None = None
    block_len_latency: boot.BlockLength | None = None
    block_metric: str = ""
    cells: CellStats | None = field(default=None, repr=False)

    @property
    def n_units(self) -> int:
        return int(self.units["n"].size)

    @property
    def n(self) -> int:
        return int(self.units["n"].sum())

    @property
    def n_good(self) -> int:
        return int(self.units["n_good"].sum())

    def percentile(self, metric: str, p: float, alpha: float) -> float:
        k0, c = self.hist.get(metric, (0, np.zeros(0)))
        if c.sum() <= 0:
            return math.nan
        return float(sketch.quantile_from_counts(c, k0, p, alpha))


@dataclass(frozen=True)
class BlockStats:
    """Everything the consumers need, reduced once from a study (see module docstring)."""

    slo: SLO
    alpha: float
    load_model: str
    name: str
    runs: tuple[RunStats, ...]
    grid_spec: GridSpec
    diagnostics: pd.DataFrame = field(repr=False)
    window: Window | None = None
    unit_rule: CountUnits | TimeUnits = CountUnits()
    cells: Cells | None = None
    #: one row per cell (the ``Cells.dims`` columns), None without cells
    cell_index: pd.DataFrame | None = field(default=None, repr=False)
    tail_from: float = TAIL_FROM
    source: str | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def closed_loop(self) -> bool:
        return self.load_model == "closed"

    def run(self, run_id: str) -> RunStats:
        for r in self.runs:
            if r.run_id == run_id:
                return r
        raise KeyError(run_id)

    def resample(self, run: RunStats, scheme: boot.Scheme, *, reps: int,
                 seed: int) -> boot.Resample:
        """The block-bootstrap replicates of one run, cached (same arguments ⇒ the same
        object). The run's stream is ``default_rng([seed, run_idx])``, independent of the
        other runs."""
        L = scheme.block_units(run.block_len, run.unit_size)
        key = ("resample", run.run_idx, int(reps), int(seed), scheme, round(L, 9))
        R = self._cache.get(key)
        if R is None:
            rng = np.random.default_rng([int(seed), int(run.run_idx)])
            R = self._cache[key] = scheme.resample(run.n_units, L, reps, rng)
        return R

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
        if slo.same_limits(self.slo):
            return [r.units["n_good"] for r in self.runs]
        if not self.can_serve(slo):
            raise SpecError("this SLO changes a limit the reduced statistics cannot vary "
                            f"(only TTFT, {self.grid_spec.y_metric.upper()} and the target)",
                            fix="re-reduce from the study: fit_envelope(study, slo)")
        g = self.grid_spec
        ix = g.index("x", slo.ttft_ms)
        iy = g.index("y", getattr(slo, f"{g.y_metric}_ms"))
        return [r.grid[:, ix, iy].astype(np.float64) for r in self.runs]

    def with_slo(self, slo: SLO) -> "BlockStats":
        """The same statistics labelled with another SLO the grid serves (used by refits)."""
        return replace(self, slo=slo)


# ============================================================================ block length

_KEY_MISSING = 32767  # SMALLINT sentinel for a missing latency (failed request) in the fetch


def block_length(good, latency: Mapping[str, np.ndarray]):
    """The block-length rule (module docstring): Politis–White on the 0/1 ``good`` series
    and on the log of every series in ``latency`` (metric → per-request series in scheduled
    order: log-bucket keys, whose values are the log up to α, or raw positive values, logged
    here). Missing values (NaN, or keys ≥ ``_KEY_MISSING``) read as the series' largest value.
    Each length is capped at min(3√n, n/3) as PW is.

    Returns (PW on good, the largest PW over the latency series — per scheme — or None, the
    metric with the largest circular one, or ""); the run's block length is the larger of the
    two (``max_length``)."""
    good = np.asarray(good, dtype=np.float64)
    n = good.size
    one = boot.BlockLength(1.0, 1.0)
    bl_good = boot.optimal_block_length(good) if n >= 3 else one
    if not latency or n < 3:
        return bl_good, None, ""
    best, best_m, top = None, "", -1.0
    for m, v in latency.items():
        v = np.asarray(v)
        keys = np.issubdtype(v.dtype, np.integer)
        v = v.astype(np.float64)
        miss = np.isnan(v) | (v >= _KEY_MISSING) if keys else np.isnan(v)
        if miss.all():
            b = one
        else:
            if miss.any():
                v = np.where(miss, np.max(v[~miss]), v)
            if not keys:
                v = np.log(np.maximum(v, sketch.MIN_VALUE))
            b = boot.optimal_block_length(v)
        best = max_length(best, b) if best is not None else b
        if b.circular > top:
            best_m, top = m, b.circular
    return bl_good, best, best_m


def max_length(a: boot.BlockLength, b: boot.BlockLength | None) -> boot.BlockLength:
    if b is None:
        return a
    return boot.BlockLength(max(a.stationary, b.stationary), max(a.circular, b.circular))


# ============================================================================ SQL (one place)

_TTFT_COL = {"scheduled": "ttft_ms", "sent": "ttft_sent_ms"}
_ITL_COL = {"p99": "itl_p99_ms", "max": "itl_max_ms"}
_KEY_COL = {"ttft": "kt", "tpot": "kp", "itl": "ki", "e2e": "ke", "gen_lag_ms": "kl"}
_STATUS_CODE_SQL = ("CASE m.status " + " ".join(f"WHEN '{s}' THEN {i}"
                                                 for i, s in enumerate(C.STATUSES))
                    + f" ELSE {len(C.STATUSES)} END")


def _ln_sql(col: str) -> str:
    """ln of a latency, clamped as ``sketch.keys`` clamps (shared by its key and grid code)."""
    return f"ln(greatest({col}, {sketch.MIN_VALUE!r}))"


def _key_sql(col: str, ktype: str) -> str:
    """Bucket key (``sketch.keys``); parameter: ln γ."""
    return (f"CAST(CASE WHEN {col} IS NULL THEN NULL ELSE "
            f"ceil({_ln_sql(col)} / ? - {sketch.KEY_EPS!r}) END AS {ktype})")


def _grid_code_sql(col: str) -> str:
    """Grid code of a value on an axis anchored at a limit: 0…2h for the finite limits it
    meets, 2h+1 above them all, 0 when missing (a missing TPOT/ITL does not fail a request).
    Exact at the anchor (a comparison, not a logarithm). Parameters: anchor, h, ln anchor,
    ln step, 2h+1, h, ln anchor, ln step."""
    return (f"CAST(CASE WHEN {col} IS NULL THEN 0 "
            f"WHEN {col} <= ? THEN greatest(0, ? + CAST(ceil(({_ln_sql(col)} - ?) / ?) AS INTEGER)) "
            f"ELSE least(?, ? + greatest(1, CAST(ceil(({_ln_sql(col)} - ?) / ?) AS INTEGER))) END "
            "AS SMALLINT)")


def _grid_code_params(anchor: float, step: float, half: int) -> list:
    la, ls = math.log(anchor), math.log(step)
    return [anchor, half, la, ls, 2 * half + 1, half, la, ls]


def _key_code_sql(key_col: str) -> str:
    """Grid code on an axis whose limits are bucket edges: from the bucket key, exactly.
    Parameters: 2h+1, h, anchor key, buckets per step."""
    return (f"CASE WHEN {key_col} IS NULL THEN 0 ELSE least(?, greatest(0, ? + "
            f"CAST(ceil(({key_col} - ?) / ?) AS INTEGER))) END")


def _fixed_conditions(slo: SLO, y_metric: str) -> tuple[str, list]:
    """SQL for the SLO limits that the grid does not vary (columns of the request view m)."""
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


def _cell_sql(cells: Cells, tenants: list[str], classes: list[str]) -> tuple[str, list, list]:
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


# ============================================================================ the reduction

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
    cells: Cells | None
    cell_sql: str
    cell_params: list
    cell_values: dict       # dimension -> list of values (tenant, slo_class)


def reduce_study(study, slo, *, warmup="manifest", units: CountUnits | TimeUnits | None = None,
                 cells: Cells | None = None, alpha: float = sketch.DEFAULT_ALPHA,
                 max_units: int | None = None, grid_step: float = GRID_STEP,
                 grid_half: int = GRID_HALF, tail_from: float = TAIL_FROM,
                 lag_limit_ms: float | None = None) -> BlockStats:
    """Reduce a study to per-(run, unit[, cell]) statistics for ``slo`` (module docstring).

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
    ttft_col = _TTFT_COL[slo.ttft_from]
    y_metric = "itl" if (slo.itl_ms is not None and slo.tpot_ms is None) else "tpot"
    y_col = "tpot_ms" if y_metric == "tpot" else _ITL_COL[slo.itl_stat]
    window, warm_src, warm_late = resolve_window(study, warmup, ttft_col)
    view = request_view(study, window)
    has_itl = study.has("itl_ns")
    key_cols = {"kt": f"m.{ttft_col}", "kp": "m.tpot_ms", "ke": "m.e2e_ms",
                "kl": "m.gen_lag_ms"}
    if has_itl:
        key_cols["ki"] = f"m.{_ITL_COL[slo.itl_stat]}"
    pw_keys = [("ttft", "kt"), ("tpot", "kp")]
    if slo.itl_ms is not None and has_itl:
        pw_keys.append(("itl", "ki"))
    if slo.e2e_ms is not None:
        pw_keys.append(("e2e", "ke"))
    cell_sql, cell_params, values = "", [], {}
    if cells is not None:
        for dim, col in (("tenant", "tenant"), ("slo_class", "slo_class")):
            if getattr(cells, dim):
                values[dim] = [r[0] for r in study.sql(
                    f"SELECT DISTINCT coalesce({col}, ?) AS v FROM {view} WHERE in_window "
                    "ORDER BY v", [NONE_LABEL]).fetchall()]
        cell_sql, cell_params, _ = _cell_sql(cells, values.get("tenant", []),
                                             values.get("slo_class", []))
    plan = _Plan(slo=slo, window=window, view=view, ttft_col=ttft_col, y_metric=y_metric,
                 y_col=y_col, alpha=alpha, ktype="SMALLINT" if alpha >= 1e-3 else "INTEGER",
                 key_cols=key_cols, pw_keys=tuple(pw_keys), x_limited=slo.ttft_ms is not None,
                 y_limited=getattr(slo, f"{y_metric}_ms") is not None, cells=cells,
                 cell_sql=cell_sql, cell_params=cell_params, cell_values=values)
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
    """The window's requests in scheduled order, compact columns (module docstring). A CTAS
    with ORDER BY keeps that order in rowid (DuckDB's preserve_insertion_order, set here)."""
    ln_g = math.log(sketch.gamma_of(plan.alpha))
    good_sql, good_params = good_predicate(plan.slo, alias="m")
    fixed_sql, fixed_params = _fixed_conditions(plan.slo, plan.y_metric)
    cols = [f"CAST(m.run_idx AS SMALLINT) AS run_idx", "m.scheduled_ns AS sched"]
    params: list = []
    if tie_break:
        cols.append("hash(m.request_id) AS h")
    cols += [f"{good_sql} AS good",
             f"(m.status = 'ok' AND m.first_token_ns IS NOT NULL AND {fixed_sql}) AS base",
             f"CAST({_STATUS_CODE_SQL} AS TINYINT) AS st",
             f"CAST(m.{plan.ttft_col} AS FLOAT) AS ttft",
             "CAST(m.e2e_ms / 1e3 AS FLOAT) AS soj"]
    params += good_params + fixed_params
    for k, c in plan.key_cols.items():
        cols.append(f"{_key_sql(c, plan.ktype)} AS {k}")
        params.append(ln_g)
    for name, col, g in (("jx", f"m.{plan.ttft_col}", grid_x), ("jy", f"m.{plan.y_col}", grid_y)):
        if g is not None:
            cols.append(f"{_grid_code_sql(col)} AS {name}")
            params += _grid_code_params(g[0], g[1], half)
    if plan.cells is not None:
        cols += [f"{plan.cell_sql} AS cell",
                 "CAST(coalesce(m.input_tokens, 0) AS BIGINT) AS tok_in",
                 "CAST(coalesce(m.output_tokens, 0) AS BIGINT) AS tok_out",
                 "CAST(coalesce(m.computed_input_tokens, 0) AS BIGINT) AS tok_comp",
                 "m.first_token_ns IS NOT NULL AS started"]
        params += plan.cell_params
    order = "run_idx, sched, h" if tie_break else "run_idx, sched"
    study.sql("SET preserve_insertion_order = true")
    study.sql(f"""CREATE OR REPLACE TEMP TABLE _cp_req AS
                  SELECT {", ".join(cols)} FROM {plan.view} m WHERE m.in_window
                  ORDER BY {order}""", params)


def _fetch_series(study: Study, plan: _Plan, *, tie_break: bool) -> dict:
    """The per-request series in scheduled order: run, time, good, the block-length latency
    keys (missing ⇒ ``_KEY_MISSING``) and, after a tie-break, the request hash. (A plain scan
    returns rowid order under preserve_insertion_order; checked here.)"""
    sel = "".join(f", coalesce({c}, {_KEY_MISSING}) AS {c}" for _, c in plan.pw_keys)
    pw = _np(study, f"SELECT run_idx, sched, good{sel}{', h' if tie_break else ''} FROM _cp_req")
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
    alpha, slo = plan.alpha, plan.slo
    with_cells = plan.cells is not None
    meta = _np(study, "SELECT run_idx, n_units FROM _cp_meta")
    n_units_of = np.zeros(nr, dtype=np.int64)
    n_units_of[meta["run_idx"].astype(np.int64)] = meta["n_units"]

    # block lengths run on two threads while DuckDB reduces (numpy and FFT release the GIL)
    bounds = np.searchsorted(pw["run_idx"], np.arange(nr + 1), side="left")
    pool = ThreadPoolExecutor(max_workers=2)
    bl_jobs = [pool.submit(_run_block_length, pw, slice(bounds[i], bounds[i + 1]), plan)
               for i in range(nr)]
    pool.shutdown(wait=False)

    # 1. per (unit[, cell]) counts, Little's-law sums, token sums — one pass
    status_cols = ", ".join(f"count_if(st = {i}) AS st_{s}" for i, s in enumerate(C.STATUSES))
    ok_counts = ", ".join(f"count({_KEY_COL[m]}) FILTER (WHERE st = 0) AS cnt_{m}"
                          for m in METRICS if _KEY_COL[m] in plan.key_cols)
    cell_cols = (", cell, sum(tok_in) AS input_tokens, sum(tok_out) AS output_tokens, "
                 "sum(tok_in) FILTER (WHERE started) AS input_tokens_started, "
                 "sum(tok_comp) AS computed_input_tokens, "
                 "sum(tok_comp) FILTER (WHERE started) AS computed_input_tokens_started"
                 if with_cells else "")
    u = _np(study, f"""
        SELECT run_idx, unit{cell_cols}, count(*) AS n, count_if(good) AS n_good,
               count_if(st = 0) AS n_ok, {status_cols}, {ok_counts},
               min(t_s) AS t0, max(t_s) AS t1, sum(ttft) AS ttft_sum, count(ttft) AS ttft_n,
               coalesce(sum(greatest(0.0, least(t_s + soj, t_last) - t_s)), 0) AS busy_s,
               coalesce(sum(soj), 0) AS soj_s
        FROM _cp_u GROUP BY ALL""")

    # 2. whole-run histograms (percentiles; latency over ok requests) and generator lag
    hist_metrics = [m for m in METRICS + ("gen_lag_ms",) if _KEY_COL[m] in plan.key_cols]
    parts = []
    for i, m in enumerate(hist_metrics):
        k = _KEY_COL[m]
        cond = "st = 0 AND " if m in METRICS else ""
        parts.append(f"SELECT run_idx, {i} AS metric, {k} AS k, count(*) AS c "
                     f"FROM _cp_req WHERE {cond}{k} IS NOT NULL GROUP BY ALL")
    h = _np(study, " UNION ALL ".join(parts))
    hist = [{} for _ in range(nr)]
    thresholds = {}
    code = h["run_idx"].astype(np.int64) * 16 + h["metric"].astype(np.int64)
    order = np.argsort(code, kind="stable")
    for key_, idx in _groups(code[order], order):
        ri, mi = divmod(int(key_), 16)
        k = h["k"][idx].astype(np.int64)
        k0 = int(k.min())
        dense = np.bincount(k - k0, weights=h["c"][idx]).astype(np.int64)
        hist[ri][hist_metrics[mi]] = (k0, dense)
        if hist_metrics[mi] in METRICS:
            cum = np.cumsum(dense)
            thresholds[(ri, METRICS.index(hist_metrics[mi]))] = \
                k0 + int(np.searchsorted(cum, tail_from * cum[-1]))

    # 3. the SLO grid: axes the SLO limits were coded in the table; the others from keys
    gspec, jx_sql, jy_sql, gparams = _grid(plan, hist, grid_step, half)
    g = _np(study, f"SELECT run_idx, unit, {jx_sql} AS jx, {jy_sql} AS jy, count(*) AS c "
                   "FROM _cp_u WHERE base GROUP BY ALL", gparams)

    # 4. per-unit tail histograms above each run's tail_from quantile
    t = _tails(study, thresholds, plan)

    # 5. per-(unit, cell) histograms
    ch = None
    if with_cells and plan.cells.hist:
        parts = [f"SELECT run_idx, unit, cell, {METRICS.index(m)} AS metric, "
                 f"{_KEY_COL[m]} AS k FROM _cp_u WHERE st = 0 AND {_KEY_COL[m]} IS NOT NULL"
                 for m in plan.cells.hist if _KEY_COL[m] in plan.key_cols]
        if parts:
            ch = _np(study, f"SELECT run_idx, unit, cell, metric, k, count(*) AS c FROM "
                            f"({' UNION ALL '.join(parts)}) GROUP BY ALL")
    cell_index, cell_of = (_cell_index(plan, u) if with_cells else (None, None))
    block_lengths = [j.result() for j in bl_jobs]
    return _assemble(study, plan, units, u, g, t, ch, hist, thresholds, gspec, cell_index,
                     cell_of, n_units_of, block_lengths, warm_src, warm_late, tail_from,
                     lag_limit_ms)


def _groups(keys: np.ndarray, order: np.ndarray):
    """(key, indices) of consecutive equal ``keys`` (already sorted); indices into the
    original arrays through ``order``."""
    if keys.size == 0:
        return
    cut = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True])
    for a, b in zip(cut[:-1], cut[1:]):
        yield keys[a], order[a:b]


def _grid(plan: _Plan, hist: list[dict], grid_step: float, half: int):
    """The grid spec and the SQL of both grid codes (a stored column, or a code from keys)."""
    g = sketch.gamma_of(plan.alpha)
    per_step = max(1, int(round(math.log(grid_step) / math.log(g))))
    axes, sqls, params = {}, {}, []
    for axis, metric, limited, col, key in (
            ("x", "ttft", plan.x_limited, "jx", "kt"),
            ("y", plan.y_metric, plan.y_limited, "jy", _KEY_COL[plan.y_metric])):
        if limited:
            lim = plan.slo.ttft_ms if axis == "x" else getattr(plan.slo, f"{plan.y_metric}_ms")
            axes[axis] = (float(lim), grid_step, (0, 0))
            sqls[axis] = col
            continue
        ka = _anchor_key(hist, metric) if key in plan.key_cols else None
        if ka is None:  # no data for the metric: any anchor serves (every count is equal)
            ka = 0
        axes[axis] = (g ** ka, g ** per_step, (ka, per_step))
        sqls[axis] = _key_code_sql(key) if key in plan.key_cols else "0"
        if key in plan.key_cols:
            params += [2 * half + 1, half, ka, per_step]
    gspec = GridSpec("ttft", plan.y_metric, axes["x"][0], axes["y"][0], axes["x"][1],
                     axes["y"][1], half, axes["x"][2], axes["y"][2])
    return gspec, sqls["x"], sqls["y"], params


def _tails(study: Study, thresholds: dict, plan: _Plan) -> dict:
    tails_df = pd.DataFrame([{"run_idx": a, "metric": b, "k_lo": v}
                             for (a, b), v in thresholds.items()],
                            columns=["run_idx", "metric", "k_lo"]).astype("int64")
    study.con.register("_cp_tail_df", tails_df)
    try:
        parts = [f"SELECT run_idx, unit, {i} AS metric, {_KEY_COL[m]} AS k FROM _cp_u "
                 f"WHERE st = 0 AND {_KEY_COL[m]} IS NOT NULL"
                 for i, m in enumerate(METRICS) if _KEY_COL[m] in plan.key_cols]
        return _np(study, f"""
            SELECT x.run_idx, x.unit, x.metric, x.k, count(*) AS c
            FROM ({' UNION ALL '.join(parts)}) x JOIN _cp_tail_df t
                 ON x.run_idx = t.run_idx AND x.metric = t.metric
            WHERE x.k >= t.k_lo GROUP BY ALL""")
    finally:
        study.con.unregister("_cp_tail_df")


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
    return frame, codes


def _run_block_length(pw: dict, sl: slice, plan: _Plan):
    good = pw["good"][sl].astype(np.float64)
    lat = {m: pw[c][sl] for m, c in plan.pw_keys}
    s = pw["sched"][sl]
    dups = 0
    if "h" in pw and s.size > 1:  # adjacent equal (scheduled_ns, hash(request_id)): twice
        hs = pw["h"][sl]
        dups = int(np.sum((hs[1:] == hs[:-1]) & (s[1:] == s[:-1])))
    return block_length(good, lat), dups


def _assemble(study, plan, units, u, g, t, ch, hist, thresholds, gspec, cell_index, cell_of,
              n_units_of, block_lengths, warm_src, warm_late, tail_from,
              lag_limit_ms) -> BlockStats:
    runs = study.manifest.runs
    slo, alpha = plan.slo, plan.alpha
    G = gspec.size
    n_cells = 0 if cell_index is None else len(cell_index)
    skip = {"run_idx", "unit", "cell", "t0", "t1"}
    sum_cols = [c for c in u if c not in skip]
    u_run = u["run_idx"].astype(np.int64)
    out_runs, diags = [], []
    closed = study.manifest.load_model == "closed"
    for i, r in enumerate(runs):
        sel = u_run == i
        nu = int(n_units_of[i])
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
                     "input_tokens", "output_tokens", "input_tokens_started",
                     "computed_input_tokens", "computed_input_tokens_started"]
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
        # grid → 2-D cumulative counts
        gs = g["run_idx"].astype(np.int64) == i
        flat = (g["unit"][gs].astype(np.int64) * G + g["jx"][gs].astype(np.int64)) * G \
            + g["jy"][gs].astype(np.int64)
        cells_ = np.bincount(flat, weights=g["c"][gs], minlength=nu * G * G).reshape(nu, G, G)
        grid = np.rint(cells_.cumsum(axis=1).cumsum(axis=2))
        grid = grid.astype(np.int32 if n < 2**31 else np.int64)
        # tails (dense units × bins, plus the count below each tail)
        tails = {}
        ts = t["run_idx"].astype(np.int64) == i
        for mi, m in enumerate(METRICS):
            k0c = hist[i].get(m)
            if k0c is None or nu == 0:
                continue
            th = thresholds[(i, mi)]
            nb = k0c[0] + k0c[1].size - th
            sm = ts & (t["metric"] == mi)
            idx = t["unit"][sm].astype(np.int64) * nb + (t["k"][sm].astype(np.int64) - th)
            dense = np.bincount(idx, weights=t["c"][sm], minlength=nu * nb).reshape(nu, nb)
            tails[m] = (int(th), dense, res[f"cnt_{m}"] - dense.sum(axis=1))
        (bl_good, bl_lat, bl_metric), dups = block_lengths[i]
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
        lag = hist[i].get("gen_lag_ms")
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
            block_len=bl, units=res, grid=grid, hist=hist[i], tail=tails,
            measured_rps=measured, span_s=span, block_len_good=bl_good,
            block_len_latency=bl_lat, block_metric=bl_metric, cells=cstats))
    return BlockStats(slo=slo, alpha=alpha, load_model=study.manifest.load_model,
                      name=study.manifest.name, runs=tuple(out_runs), grid_spec=gspec,
                      diagnostics=dg.to_frame(diags), window=plan.window, unit_rule=units,
                      cells=plan.cells, cell_index=cell_index, tail_from=tail_from,
                      source=str(study.root))


# ============================================================================ in memory

def stats_from_series(runs: list[dict], slo: SLO | str, *, max_units: int = MAX_UNITS,
                      load_model: str = "open", name: str = "in-memory") -> BlockStats:
    """BlockStats built in memory from per-run 0/1 SLO-good series, skipping SQL (for
    simulations, tests and tools that already hold indicators). Each dict needs ``run_id``,
    ``load_level`` and ``good`` (0/1 array in scheduled order); optional ``rate_rps``
    (measured rate; default the load level), ``repeat``, ``ok`` (0/1 status-ok series,
    default all ok; the others count as ``error``; a good request must be ok), ``latency`` (a
    positive per-request latency series, e.g. TTFT, joining the block-length rule as in
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
        s = n / nu if nu else 1.0
        grid = np.zeros((nu, 2, 2), dtype=np.int64)
        grid[:, 0, :] = g_u[:, None]
        grid[:, 1, :] = n_u[:, None]
        rate = float(r.get("rate_rps", r["load_level"]))
        lat = r.get("latency")
        bl_good, bl_lat, bl_metric = block_length(
            good, {} if lat is None else {"latency": np.asarray(lat, dtype=np.float64)})
        ok = r.get("ok")
        ok_u = n_u.copy() if ok is None else np.bincount(
            unit, weights=np.asarray(ok, dtype=np.float64), minlength=nu)
        units = {"n": n_u, "n_good": g_u, "n_ok": ok_u}
        for st in C.STATUSES:
            units[f"st_{st}"] = (ok_u.copy() if st == "ok" else n_u - ok_u if st == "error"
                                 else np.zeros_like(n_u))
        out.append(RunStats(
            run_id=str(r["run_id"]), run_idx=i, load_level=float(r["load_level"]),
            offered_rps=None if load_model == "closed" else rate,
            concurrency=float(r["load_level"]) if load_model == "closed" else None,
            repeat=int(r.get("repeat", 0)), nominal_rps=None, warmup_s=0.0, unit_size=s,
            block_len=max_length(bl_good, bl_lat), units=units, grid=grid.astype(np.int32),
            hist={}, tail={}, measured_rps=rate, span_s=n / rate if rate > 0 else math.nan,
            block_len_good=bl_good, block_len_latency=bl_lat, block_metric=bl_metric))
        diags.append({"run_id": str(r["run_id"]), "n": n, "usable": n >= dg.MIN_REQUESTS,
                      "reason": "" if n >= dg.MIN_REQUESTS else "too few requests",
                      "warnings": ""})
    gs = GridSpec("ttft", "tpot", float(slo.ttft_ms or 1.0), float(slo.tpot_ms or 1.0), 2.0,
                  2.0, 0)
    window = Window(tuple((str(r["run_id"]), 0.0) for r in runs))
    return BlockStats(slo=slo, alpha=sketch.DEFAULT_ALPHA, load_model=load_model, name=name,
                      runs=tuple(out), grid_spec=gs, diagnostics=pd.DataFrame(diags),
                      window=window, unit_rule=CountUnits(max_units), source=None)
