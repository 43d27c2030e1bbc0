"""The reduction's results (``BlockStats`` of ``RunStats``, with ``CellStats`` and the SLO
``GridSpec``) and the one block-length rule every consumer uses (``block_length``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from .. import bootstrap as boot
from .. import contract as C
from .. import diagnostics as dg
from .. import sketch
from ..errors import SpecError
from ..metrics import Window
from ..slo import SLO
from .sql import KEY_MISSING
from .units import MAX_UNITS, Cells, CountUnits, TimeUnits

if TYPE_CHECKING:  # imported where used: the reduction's path stays light (test_cli_basic)
    import pandas as pd

TAIL_FROM = 0.95

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
    for each status, ``input_tokens``, ``output_tokens``, ``output_tokens_asked`` (the answer
    lengths asked for: ``max_output_tokens``, the tokens received where it is not recorded —
    the offered output, e.g. a tenant's demand), ``input_tokens_started`` (input tokens of
    requests that got a first token), ``computed_input_tokens`` and
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
    """Everything the consumers need, reduced once from a study (``capplan.reduce``)."""

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

#: The block-length rule reads each run at this many "fine units" at most: a run of n
#: requests is cut into F = min(FINE_UNITS, n) runs of consecutive requests (fine unit
#: ⌊rank·F/n⌋, like ``CountUnits``) and Politis–White runs on the per-fine-unit means. With
#: n ≤ F a fine unit is one request, so the rule is PW on the per-request series itself.
FINE_UNITS = 16384


def fine_index(n: int) -> np.ndarray:
    """Each request's fine unit (⌊rank·F/n⌋, F = min(FINE_UNITS, n))."""
    f = min(FINE_UNITS, n)
    return (np.arange(n, dtype=np.int64) * f) // max(n, 1)


def block_length(good, latency: Mapping[str, np.ndarray]):
    """The block-length rule (``capplan.reduce``) on per-request series in scheduled order:
    ``good`` (0/1) and ``latency`` (metric → log-bucket keys, whose values are the log up to
    α, with ``KEY_MISSING`` for a missing one; or raw positive values with NaN for missing,
    logged here). Sums them per fine unit and applies ``block_length_fine``."""
    good = np.asarray(good, dtype=np.float64)
    n = good.size
    fine = fine_index(n)
    nf = min(FINE_UNITS, n)
    cnt = np.bincount(fine, minlength=nf).astype(np.float64)
    sums = {"n": cnt, "good": np.bincount(fine, weights=good, minlength=nf)}
    lat = {}
    for m, v in latency.items():
        v = np.asarray(v)
        if np.issubdtype(v.dtype, np.integer):
            has = v < KEY_MISSING
            v = v.astype(np.float64)
        else:
            v = v.astype(np.float64)
            has = ~np.isnan(v)
            v = np.log(np.maximum(np.where(has, v, 1.0), sketch.MIN_VALUE))
        sums[f"{m}_sum"] = np.bincount(fine[has], weights=v[has], minlength=nf)
        sums[f"{m}_n"] = np.bincount(fine[has], minlength=nf).astype(np.float64)
        sums[f"{m}_max"] = np.array([v[has].max()]) if has.any() else np.array([np.nan])
        lat[m] = m
    return block_length_fine(n, sums, lat)


def block_length_fine(n: int, sums: Mapping[str, np.ndarray], latency: Mapping[str, str]):
    """The block-length rule from per-fine-unit sums (``sums.fine_sums``: ``n``, ``good``,
    and per latency series ``<col>_sum``, ``<col>_n``, ``<col>_max``; ``latency`` maps a
    metric to its column prefix). Politis–White on the per-fine-unit mean of the 0/1 good
    series and of each latency series (a missing latency — a failed request — read as the
    run's largest value: a failure is a violation), in fine units, times the mean fine-unit
    size n/F, capped at ⌈min(3√n, n/3)⌉ as PW caps a series of n. With n ≤ FINE_UNITS that is
    PW on the per-request series (docs/statistics.md#block-length).

    Returns (PW on good, the largest PW over the latency series — per scheme — or None, the
    metric with the largest circular one, or ""); the run's block length is the larger of the
    two (``max_length``)."""
    one = boot.BlockLength(1.0, 1.0)
    if n < 3:
        return one, None, ""
    cnt = np.asarray(sums["n"], dtype=np.float64)
    keep = cnt > 0
    cnt = cnt[keep]
    scale = n / cnt.size
    cap = math.ceil(min(3 * math.sqrt(n), n / 3))

    def pw(series) -> boot.BlockLength:
        b = boot.optimal_block_length(series)
        return boot.BlockLength(min(b.stationary * scale, cap), min(b.circular * scale, cap))

    bl_good = pw(np.asarray(sums["good"], dtype=np.float64)[keep] / cnt)
    if not latency:
        return bl_good, None, ""
    best, best_m, top = None, "", -1.0
    for m, c in latency.items():
        s_ = np.asarray(sums[f"{c}_sum"], dtype=np.float64)[keep]
        k_ = np.asarray(sums[f"{c}_n"], dtype=np.float64)[keep]
        mx = np.asarray(sums[f"{c}_max"], dtype=np.float64)
        mx = mx[~np.isnan(mx)]
        if not k_.sum() or not mx.size:
            b = one
        else:
            b = pw((s_ + (cnt - k_) * float(mx.max())) / cnt)
        best = max_length(best, b) if best is not None else b
        if b.circular > top:
            best_m, top = m, b.circular
    return bl_good, best, best_m


def max_length(a: boot.BlockLength, b: boot.BlockLength | None) -> boot.BlockLength:
    if b is None:
        return a
    return boot.BlockLength(max(a.stationary, b.stationary), max(a.circular, b.circular))



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
    import pandas as pd
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
