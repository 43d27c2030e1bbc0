"""Occupancy by time and activity by column: the time-spread companions of the reduction.

*Occupancy by time* (``occupancy``): how many requests were in a part of their life — by
default waiting: arrived and not yet in service — per time unit of a ``TimeUnits`` grid (the
time-integral in request-seconds, the value at each unit's end, the peak inside each unit).
The counts of ``reduce_study`` attribute a request to the unit it was *scheduled* in;
occupancy spreads each request over the units its interval covers, which a queue-length series
needs (timelines). ``activity`` gives, per run and per value of a column (a replica group),
when it first and last served — what shows a replica that went silent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .. import contract as C
from ..errors import SpecError
from ..metrics import Window, request_view
from ..study import Study, open_study
from .engine import fetch_arrays, resolve_window
from .units import TimeUnits

if TYPE_CHECKING:  # imported where used: the reduction's path stays light (test_cli_basic)
    import pandas as pd


@dataclass(frozen=True)
class Occupancy:
    """Which part of each request's life to count by time: from its ``start`` stamp to the
    first of its ``ends`` stamps that is set (columns of the request view, int64 ns). A
    request without an end stamp occupies nothing when its status is in ``instant`` (refused
    or failed at once), else until ``open_for_s`` after its start (a client timeout, say) or
    the run's end, whichever comes first (None: the run's end).

    The default counts requests *waiting*: arrived (scheduled) and not yet taken into service
    (admitted, prefill started, or — when the server stamps neither — first token)."""

    start: str = "scheduled_ns"
    ends: tuple[str, ...] = ("admitted_ns", "prefill_start_ns", "first_token_ns")
    instant: tuple[str, ...] = ("rejected", "error")
    open_for_s: float | None = None

    def __post_init__(self):
        for c in (self.start, *self.ends):
            if c not in C.INT_NS_COLUMNS:
                raise SpecError(f"Occupancy: {c!r} is not a time column of the contract",
                                field="occupancy", fix="one of " + ", ".join(C.INT_NS_COLUMNS))
        if not self.ends:
            raise SpecError("Occupancy needs at least one end column", field="occupancy.ends")
        bad = [x for x in self.instant if x not in C.STATUSES]
        if bad:
            raise SpecError(f"Occupancy.instant: unknown status(es) {bad}", field="occupancy.instant",
                            fix="choose from " + ", ".join(C.STATUSES))
        if self.open_for_s is not None and not (float(self.open_for_s) >= 0):
            raise SpecError("Occupancy.open_for_s must be ≥ 0 s or None", field="occupancy.open_for_s")


@dataclass(frozen=True)
class RunOccupancy:
    """One run's occupancy per time unit: ``area_s`` (request-seconds inside the unit),
    ``at_end`` (requests present at the unit's end), ``peak`` (most present at once inside
    the unit, its start included) and ``peak_t_s`` (the first time it was reached, s on the
    run's clock); ``edges_s``: the n_units + 1 unit edges. ``n``: requests counted,
    ``n_open``: of them without an end stamp (closed by ``open_for_s`` or the run's end)."""

    run_id: str
    edges_s: np.ndarray = field(repr=False)
    area_s: np.ndarray = field(repr=False)
    at_end: np.ndarray = field(repr=False)
    peak: np.ndarray = field(repr=False)
    peak_t_s: np.ndarray = field(repr=False)
    n: int = 0
    n_open: int = 0
    run_end_s: float = math.nan


def occupancy(study, units: TimeUnits, *, window: Window | str = "none",
              what: Occupancy = Occupancy()) -> tuple[RunOccupancy, ...]:
    """How many requests were in a part of their life (``what``), by time unit: the
    time-integral, the value at each unit's end and the peak inside each unit, per run. A
    request counts over [start, end) (ns); the unit grid is ``units`` (origin, width and count
    per run; without a count, up to the last end). ``window``: which requests count, as in
    ``reduce_study`` (default all of them: the clock, not the steady state, is the point)."""
    study = open_study(study) if not isinstance(study, Study) else study
    if not isinstance(units, TimeUnits):
        raise SpecError("occupancy needs TimeUnits", field="units")
    win, _, _ = resolve_window(study, window)
    view = request_view(study, win)
    end_sql = "coalesce(" + ", ".join(f"m.{c}" for c in what.ends) + ")"
    rows = fetch_arrays(study, f"""
        WITH r AS (SELECT run_idx, max(greatest(scheduled_ns, sent_ns, first_token_ns,
                                                last_token_ns)) AS run_end FROM {view}
                   GROUP BY run_idx)
        SELECT m.run_idx, m.{what.start} AS s,
               CASE WHEN {end_sql} IS NOT NULL THEN greatest({end_sql}, m.{what.start})
                    WHEN list_contains(?, m.status) THEN m.{what.start}
                    ELSE -1 END AS e,
               r.run_end
        FROM {view} m JOIN r USING (run_idx)
        WHERE m.in_window AND m.{what.start} IS NOT NULL""", [list(what.instant)])
    out = []
    ri = rows["run_idx"].astype(np.int64) if rows else np.zeros(0, np.int64)
    for i, r in enumerate(study.manifest.runs):
        sel = ri == i
        s = rows["s"][sel].astype(np.int64)
        e = rows["e"][sel].astype(np.int64)
        run_end = int(rows["run_end"][sel].max()) if sel.any() else 0
        open_ = e < 0
        if open_.any():
            cap = np.full(int(open_.sum()), run_end, np.int64)
            if what.open_for_s is not None:
                cap = np.minimum(cap, s[open_] + int(round(float(what.open_for_s) * C.NS_PER_S)))
            e[open_] = np.maximum(cap, s[open_])
        o_ns = units.origin_ns(r.run_id, win)
        w_ns = units.width_ns(r.run_id)
        nu = units.count(r.run_id)
        if nu is None:
            last = int(e.max()) if e.size else o_ns
            nu = max(1, (last - o_ns) // w_ns + 1)
        out.append(_occupancy_run(r.run_id, s, e, o_ns, w_ns, int(nu), int(open_.sum()),
                                  run_end / C.NS_PER_S))
    return tuple(out)


def _occupancy_run(run_id: str, s: np.ndarray, e: np.ndarray, o_ns: int, w_ns: int, nu: int,
                   n_open: int, run_end_s: float) -> RunOccupancy:
    """Area, end value and peak per unit from [s, e) intervals (int64 ns): the area from
    Σ min(x, e) − Σ min(x, s) at the edges (sorted prefix sums), the peak from one sweep over
    the ±1 events (a request leaving and one arriving at the same instant are not counted
    together)."""
    edges = o_ns + w_ns * np.arange(nu + 1, dtype=np.int64)
    xs = (edges - o_ns) / C.NS_PER_S

    s_sorted, e_sorted = np.sort(s), np.sort(e)

    def below(v_sorted):  # Σ min(x, v) over v, at every edge x (seconds from the origin)
        vs = (v_sorted - o_ns) / C.NS_PER_S
        cum = np.r_[0.0, np.cumsum(vs)]
        k = np.searchsorted(vs, xs, side="left")
        return cum[k] + xs * (vs.size - k)

    area = np.diff(below(e_sorted) - below(s_sorted))
    count_at = (np.searchsorted(s_sorted, edges, side="right")
                - np.searchsorted(e_sorted, edges, side="right"))
    at_end = count_at[1:].astype(np.int64)
    peak = count_at[:-1].astype(np.int64).copy()
    peak_t = edges[:-1].astype(np.float64) / C.NS_PER_S
    keep = e > s
    if keep.any():
        # one sorted key per ±1 event: 2·t + 1 for an arrival, 2·t for a departure, so at one
        # instant the departure comes first (and no argsort is needed)
        key = np.sort(np.concatenate([2 * s[keep] + 1, 2 * e[keep]]))
        t = key >> 1
        c = np.cumsum((key & 1) * 2 - 1)
        u = (t - o_ns) // w_ns
        lo, hi = np.searchsorted(u, [0, nu])
        t, c, u = t[lo:hi], c[lo:hi], u[lo:hi]
        if t.size:
            starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
            seg_max = np.maximum.reduceat(c, starts)
            seg_len = np.diff(np.r_[starts, c.size])
            uu = u[starts]
            # the first time each unit's maximum is reached
            idx = np.flatnonzero(c == np.repeat(seg_max, seg_len))
            seg = np.searchsorted(starts, idx, side="right") - 1
            first = idx[np.r_[True, seg[1:] != seg[:-1]]]
            better = seg_max > peak[uu]
            peak[uu[better]] = seg_max[better]
            peak_t[uu[better]] = t[first[better]] / C.NS_PER_S
    return RunOccupancy(run_id=run_id, edges_s=edges / C.NS_PER_S, area_s=area, at_end=at_end,
                        peak=peak, peak_t_s=peak_t, n=int(s.size), n_open=n_open,
                        run_end_s=run_end_s)


#: the columns ``activity`` may group by (string columns of the contract)
ACTIVITY_COLUMNS = ("replica_group", "tenant", "slo_class")


def activity(study, by: str = "replica_group", *, window: Window | str = "none") -> pd.DataFrame:
    """When each value of a column (a replica, a tenant) was active, per run: one row per
    (run_id, value) with ``n`` (requests), ``n_ok``, ``first_service_s`` (its first admission,
    prefill start or first token), ``last_service_s`` (its last stamp of any kind after the
    schedule), ``last_failed_s`` (the latest scheduled time of its requests that ended
    timeout, error or cancelled; NaN if none) and ``last_scheduled_s``; and per run
    (``whole_run`` true) the same over every request. Requests without a value form the
    value NULL. A replica that went silent while the others served shows
    here — what a timeline derives when no event records it."""
    study = open_study(study) if not isinstance(study, Study) else study
    if by not in ACTIVITY_COLUMNS:
        raise SpecError(f"activity: cannot group by {by!r}", field="by",
                        fix="one of " + ", ".join(ACTIVITY_COLUMNS))
    win, _, _ = resolve_window(study, window)
    view = request_view(study, win)
    df = study.sql(f"""
        SELECT run_id, grouping({by}) = 1 AS whole_run, {by} AS value, count(*) AS n,
               count_if(status = 'ok') AS n_ok,
               min(coalesce(admitted_ns, prefill_start_ns, first_token_ns)) / 1e9
                   AS first_service_s,
               max(greatest(admitted_ns, prefill_start_ns, first_token_ns, last_token_ns)) / 1e9
                   AS last_service_s,
               max(scheduled_ns) FILTER (WHERE status IN ('timeout', 'error', 'cancelled')) / 1e9
                   AS last_failed_s,
               max(scheduled_ns) / 1e9 AS last_scheduled_s
        FROM {view} WHERE in_window
        GROUP BY GROUPING SETS ((run_id, {by}), (run_id))
        ORDER BY run_id, whole_run DESC, value NULLS FIRST""").df()
    return df
