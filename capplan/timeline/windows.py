"""Per-window figures of a run on its clock (docs/timeline.md "Windows").

Every count comes from the one reduction (``capplan.reduce``): ``reduce_study`` with time units
of the window's width from the run's start (no warm-up cut: the clock is the point) gives the
offered, good and per-status counts of requests *scheduled* in each window and, through one
cell, each window's TTFT histogram; ``occupancy`` gives the requests waiting over time. The
replica counts come from the events (``capplan.timeline.events``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..earlystop import n_min
from ..reduce import BlockStats, Cells, Occupancy, RunOccupancy, TimeUnits, occupancy, reduce_study
from ..sketch import quantile_from_counts
from ..slo import SLO
from ..study import Study
from .events import ReplicaSeries

#: the percentile of TTFT shown per window, and the confidence of its sample-size rule
TTFT_P = 0.99
CONFIDENCE = 0.99

WINDOW_COLUMNS = (
    "run_id", "window", "t_start_s", "t_end_s", "offered", "admitted", "good", "rejected",
    "timed_out", "errors", "cancelled", "offered_rps", "goodput_rps", "attainment", "in_breach",
    "waiting_mean", "waiting_end", "waiting_peak", "waiting_peak_t_s", "waiting_area_req_s",
    "ttft_n", "ttft_p99_ms",
    "replicas_ready", "replicas_provisioned")


def reduce_windows(study: Study, slo: SLO, width_s: float, n_units: dict[str, int],
                   waiting: Occupancy) -> tuple[BlockStats, tuple[RunOccupancy, ...]]:
    """The reduction and the waiting series on one grid: ``width_s`` windows from 0 on every
    run's clock, ``n_units[run_id]`` of them."""
    origin = {r: 0.0 for r in study.manifest.run_ids}
    units = TimeUnits(float(width_s), origin, dict(n_units))
    # grid_half=0: one SLO only (no surface); the tails stay for a consumer that bootstraps
    bs = reduce_study(study, slo, warmup="none", units=units, cells=Cells(hist=("ttft",)),
                      grid_half=0)
    occ = occupancy(study, units, window="none", what=waiting)
    return bs, occ


def window_frame(bs: BlockStats, occ: tuple[RunOccupancy, ...], replicas: dict[str, ReplicaSeries],
                 width_s: float, run_ids: tuple[str, ...]) -> pd.DataFrame:
    """One row per (run, window): ``WINDOW_COLUMNS`` (docs/timeline.md "Windows")."""
    frames = []
    occ_by = {o.run_id: o for o in occ}
    target = bs.slo.attainment
    need = n_min(TTFT_P, 1, CONFIDENCE)
    for run in bs.runs:
        if run.run_id not in run_ids:
            continue
        u = run.units
        nu = run.n_units
        o = occ_by[run.run_id]
        k = min(nu, o.area_s.size)
        edges = np.arange(k + 1) * float(width_s)
        offered = u["n"][:k]
        good = u["n_good"][:k]
        rejected = u["st_rejected"][:k]
        with np.errstate(invalid="ignore", divide="ignore"):
            att = np.where(offered > 0, good / offered, np.nan)
        ttft_n, ttft_p = _window_p99(run, k, need, bs.alpha)
        rs = replicas[run.run_id]
        df = pd.DataFrame({
            "run_id": run.run_id, "window": np.arange(k), "t_start_s": edges[:-1],
            "t_end_s": edges[1:], "offered": offered.astype(np.int64),
            "admitted": (offered - rejected).astype(np.int64), "good": good.astype(np.int64),
            "rejected": rejected.astype(np.int64),
            "timed_out": u["st_timeout"][:k].astype(np.int64),
            "errors": u["st_error"][:k].astype(np.int64),
            "cancelled": u["st_cancelled"][:k].astype(np.int64),
            "offered_rps": offered / width_s, "goodput_rps": good / width_s,
            "attainment": att, "in_breach": (offered > 0) & (np.nan_to_num(att, nan=1.0) < target),
            "waiting_mean": o.area_s[:k] / width_s, "waiting_end": o.at_end[:k],
            "waiting_peak": o.peak[:k], "waiting_peak_t_s": o.peak_t_s[:k],
            "waiting_area_req_s": o.area_s[:k],
            "ttft_n": ttft_n, "ttft_p99_ms": ttft_p,
            "replicas_ready": rs.mean_over(edges, "ready"),
            "replicas_provisioned": rs.mean_over(edges, "provisioned")})
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=list(WINDOW_COLUMNS))
    return pd.concat(frames, ignore_index=True)[list(WINDOW_COLUMNS)]


def _window_p99(run, k: int, need: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """TTFT count and p99 per window from the per-(unit, cell) histograms (one cell): the
    p99 only where the window holds ``need`` completed requests (the early-stopping rule)."""
    n = np.zeros(k, np.int64)
    p = np.full(k, np.nan)
    if run.cells is None or "ttft" not in run.cells.hist:
        return n, p
    unit, _, key, cnt = run.cells.hist["ttft"]
    inside = unit < k
    unit, key, cnt = unit[inside], key[inside], cnt[inside]
    n = np.bincount(unit, weights=cnt, minlength=k).astype(np.int64)
    full = np.flatnonzero(n >= need)
    if full.size:
        sel = np.isin(unit, full)
        k0 = int(key[sel].min())
        nb = int(key[sel].max()) - k0 + 1
        row = np.searchsorted(full, unit[sel])
        dense = np.zeros((full.size, nb))
        np.add.at(dense, (row, key[sel] - k0), cnt[sel])
        p[full] = quantile_from_counts(dense, k0, TTFT_P, alpha)
    return n, p


def windows_needed(end_s: float, width_s: float) -> int:
    """Windows from 0 that cover a run ending at ``end_s``."""
    return max(1, int(math.floor(end_s / width_s)) + 1)
