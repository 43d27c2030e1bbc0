"""From the counts of either engine to ``BlockStats``: the per-run pieces (``RunSeries``:
whole-run histograms, tail thresholds, block lengths, duplicates; ``RunCounts``: per-unit
sums, grid, tails, cells), the SLO grid spec (an axis the SLO does not limit is anchored on
the pooled p90 bucket), the cell index, and the diagnostics. Nothing here reads rows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import contract as C
from .. import diagnostics as dg
from .. import sketch
from .stats import BlockStats, CellStats, GridSpec, RunStats, max_length
from .units import CACHE_LABELS, METRICS, bucket_labels

if TYPE_CHECKING:  # imported where used: the reduction's path stays light (test_cli_basic)
    import pandas as pd


@dataclass(frozen=True)
class RunSeries:
    """One run's whole-run part: histograms (metric → (k0, dense counts)), the key above
    which each latency's tail histogram starts, block lengths (good, latency, metric) and the
    count of events recorded twice."""

    hist: dict
    thresholds: dict
    block: tuple
    dups: int

    @classmethod
    def of(cls, hist: dict, tail_from: float, block: tuple, dups: int) -> "RunSeries":
        thresholds = {}
        for m, (k0, dense) in hist.items():
            if m in METRICS:
                cum = np.cumsum(dense)
                thresholds[m] = k0 + int(np.searchsorted(cum, tail_from * cum[-1]))
        return cls(hist, thresholds, block, int(dups))


@dataclass(frozen=True)
class RunCounts:
    """One run's per-unit part: ``units`` (name → per-unit array, as ``RunStats.units``),
    the cumulative grid, tails (metric → (k0, units × bins, below)) and cells."""

    units: dict
    n_units: int
    grid: np.ndarray
    tails: dict
    cells: CellStats | None

    @classmethod
    def of(cls, sums: dict, nu: int, grid_counts: np.ndarray, tails: dict,
           series: RunSeries, cells: CellStats | None) -> "RunCounts":
        """From the raw sums of ``sums.unit_sums``, the (units × G × G) grid counts and the
        dense tail counts above each threshold."""
        res = {"n": sums["n"], "n_good": sums["n_good"], "n_ok": sums["st_ok"].copy()}
        for s in C.STATUSES:
            res[f"st_{s}"] = sums[f"st_{s}"]
        for m in METRICS:
            if f"cnt_{m}" in sums:
                res[f"cnt_{m}"] = sums[f"cnt_{m}"]
        res["t0"] = sums["t0_ns"] / 1e9
        res["t1"] = sums["t1_ns"] / 1e9
        res["ttft_sum"] = sums["ttft_sum"]
        res["ttft_n"] = sums["ttft_n"]
        with np.errstate(invalid="ignore", divide="ignore"):
            res["ttft_mean"] = res["ttft_sum"] / res["ttft_n"]
        res["busy_s"] = sums["busy_s"]
        res["soj_s"] = sums["soj_s"]
        n = int(res["n"].sum())
        # narrowed first, then summed in place: half the time of two int64 cumsums and a cast
        # (10 against 20 ms a run of 1024 units × 30 × 30); exact, as no sum exceeds n
        grid = grid_counts.astype(np.int32 if n < 2**31 else np.int64)
        np.cumsum(grid, axis=1, out=grid)
        np.cumsum(grid, axis=2, out=grid)
        tl = {m: (int(series.thresholds[m]), dense, res[f"cnt_{m}"] - dense.sum(axis=1))
              for m, dense in tails.items()}
        return cls(res, int(nu), grid, tl, cells)


def anchor_key(hists: list[dict], metric: str) -> int | None:
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


def grid_spec(plan, hists: list[dict]) -> GridSpec:
    """Limited axes: anchor = the limit, step ``grid_step``; the others: anchor = the pooled
    p90 bucket edge, step = the whole number of buckets nearest to ``grid_step``."""
    g = sketch.gamma_of(plan.alpha)
    per_step = max(1, int(round(math.log(plan.grid_step) / math.log(g))))
    axes = {}
    for axis, metric, limited in (("x", "ttft", plan.x_limited),
                                  ("y", plan.y_metric, plan.y_limited)):
        if limited:
            lim = plan.slo.ttft_ms if axis == "x" else getattr(plan.slo, f"{plan.y_metric}_ms")
            axes[axis] = (float(lim), plan.grid_step, (0, 0))
            continue
        ka = anchor_key(hists, metric)
        ka = 0 if ka is None else ka  # no data for the metric: every count is the same
        axes[axis] = (g ** ka, g ** per_step, (ka, per_step))
    return GridSpec("ttft", plan.y_metric, axes["x"][0], axes["y"][0], axes["x"][1],
                    axes["y"][1], plan.grid_half, axes["x"][2], axes["y"][2])


def cell_index(plan, codes: np.ndarray) -> pd.DataFrame:
    """The observed cells, decoded from their mixed-radix codes, in code order."""
    import pandas as pd
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


def off_schedule_requests(run) -> int:
    """Requests the load tool itself recorded as sent off the asked schedule (manifest key
    ``off_schedule_requests``; studies imported before it carry GuideLLM's older key)."""
    x = run.extra.get("off_schedule_requests", run.extra.get("guidellm_startup_burst_requests"))
    try:
        return max(int(x or 0), 0)
    except (TypeError, ValueError):
        return 0


def assemble_stats(manifest: C.Manifest, source: str, plan, units, per_run: list[RunSeries],
                   by_unit: list[RunCounts], gspec: GridSpec, cell_codes, warm_src, warm_late,
                   tail_from, lag_limit_ms) -> BlockStats:
    """BlockStats from the per-run pieces (manifest order), with the diagnostics."""
    runs = manifest.runs
    slo, alpha = plan.slo, plan.alpha
    out_runs, diags = [], []
    closed = manifest.load_model == "closed"
    for i, r in enumerate(runs):
        res, nu, hist = by_unit[i].units, by_unit[i].n_units, per_run[i].hist
        n = int(res["n"].sum()) if nu else 0
        unit_size = n / nu if nu else 1.0
        (bl_good, bl_lat, bl_metric), dups = per_run[i].block, per_run[i].dups
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
        src, late = warm_src[r.run_id], warm_late[r.run_id]
        if src == dg.MSER_LATE_FLAT and nu:
            src, late = dg.late_warmup_verdict(
                tm_units, tw, res["n_good"], res["n"], slo.attainment)
        diags.append(dg.run_diagnostics(
            run_id=r.run_id, n=n, warmup_s=warm, warmup_source=src,
            mser_second_half=late, measured_rps=measured,
            nominal_rps=r.nominal_rps if r.nominal_rps is not None else r.offered_rps,
            gen_lag_p99_ms=lag_p99, littles=littles, trend_all=dg.trend_test(bm),
            trend_end=dg.trend_test(bm_end), duplicates=dups,
            lag_limit_ms=lag_limit, closed_loop=closed, span_s=span, arrival=r.arrival,
            off_schedule=off_schedule_requests(r)))
        out_runs.append(RunStats(
            run_id=r.run_id, run_idx=i, load_level=r.load_level, offered_rps=r.offered_rps,
            concurrency=None if r.concurrency is None else float(r.concurrency), repeat=r.repeat,
            nominal_rps=r.nominal_rps, warmup_s=warm, unit_size=unit_size,
            block_len=bl, units=res, grid=by_unit[i].grid, hist=hist,
            tail=by_unit[i].tails if nu else {}, measured_rps=measured, span_s=span,
            block_len_good=bl_good, block_len_latency=bl_lat, block_metric=bl_metric,
            cells=by_unit[i].cells))
    cidx = None if cell_codes is None else cell_index(plan, cell_codes)
    return BlockStats(slo=slo, alpha=alpha, load_model=manifest.load_model,
                      name=manifest.name, runs=tuple(out_runs), grid_spec=gspec,
                      diagnostics=dg.to_frame(diags), window=plan.window, unit_rule=units,
                      cells=plan.cells, cell_index=cidx, tail_from=tail_from,
                      source=source)
