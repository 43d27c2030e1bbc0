"""What is summed per (run, unit), per (run, unit, cell) and per (run, fine unit): one table,
read by both executors — numpy over DuckDB's ordered per-request arrays (``count``) and
Spark SQL aggregates (``spark``) — so the two cannot drift.

Each sum is (kind, value column, filter) over the per-request columns of ``reduce.sql`` plus
two the executors add: ``busy`` (seconds in flight inside the window, see ``busy_sql``) and
the unit indices. A filter is a name of ``FILTERS``, which holds it in both forms."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import contract as C
from .sql import KEY_COL, KEY_MISSING
from .units import METRICS

STATUS_NAMES = (*C.STATUSES, "other")


@dataclass(frozen=True)
class Sum:
    """``kind``: count | sum | min | max; ``value``: a per-request column (sum, min, max);
    ``where``: a name in ``FILTERS`` or None (every request)."""

    kind: str
    value: str | None = None
    where: str | None = None

    def sql(self) -> str:
        """The Spark/DuckDB aggregate (over the per-request columns)."""
        cond = None if self.where is None else filter_sql(self.where)
        if self.kind == "count":
            return "count(*)" if cond is None else f"count(CASE WHEN {cond} THEN 1 END)"
        v = self.value if cond is None else f"CASE WHEN {cond} THEN {self.value} END"
        if self.kind == "sum":  # an empty sum is 0, as np.bincount gives it
            return f"coalesce(sum(CAST({v} AS DOUBLE)), CAST(0.0 AS DOUBLE))"
        return f"{self.kind}({v})"


def filter_sql(name: str) -> str:
    """A filter of ``FILTERS`` in SQL: ``good``, ``base``, ``ok``, ``st<j>``, ``has_ttft``,
    ``has_soj``, ``started``, ``ok_<key column>``, ``has_<key column>``."""
    if name in ("good", "base", "started"):
        return name
    if name == "ok":
        return "st = 0"
    if name.startswith("st") and name[2:].isdigit():
        return f"st = {int(name[2:])}"
    if name == "has_ttft":
        return "ttft IS NOT NULL"
    if name == "has_soj":
        return "soj IS NOT NULL"
    if name.startswith("ok_"):
        return f"st = 0 AND {name[3:]} <> {KEY_MISSING}"
    if name.startswith("has_"):
        return f"{name[4:]} <> {KEY_MISSING}"
    raise KeyError(name)


def filter_np(name: str, a: dict) -> np.ndarray:
    """The same filter over one run's numpy columns ``a``: NaN is SQL's NULL (TTFT and
    sojourn are float), KEY_MISSING a missing key."""
    if name in ("good", "base", "started"):
        return a[name].astype(bool)
    if name == "ok":
        return a["st"] == 0
    if name.startswith("st") and name[2:].isdigit():
        return a["st"] == int(name[2:])
    if name == "has_ttft":
        return ~np.isnan(a["ttft"])
    if name == "has_soj":
        return ~np.isnan(a["soj"])
    if name.startswith("ok_"):
        return (a["st"] == 0) & (a[name[3:]] != KEY_MISSING)
    if name.startswith("has_"):
        return a[name[4:]] != KEY_MISSING
    raise KeyError(name)


def unit_sums(key_cols) -> dict[str, Sum]:
    """Per (run, unit): requests, SLO-good, per status, latency counts of ok requests, first and
    last scheduled ns, TTFT sum and count, seconds in flight (``busy``), sojourn seconds, and
    events recorded twice (``dup``: the same scheduled_ns and request_id as the previous
    request in the scheduled order)."""
    out = {"n": Sum("count"), "n_good": Sum("count", where="good")}
    for j, s in enumerate(STATUS_NAMES):
        out[f"st_{s}"] = Sum("count", where=f"st{j}")
    for m in METRICS:
        k = KEY_COL[m]
        if k in key_cols:
            out[f"cnt_{m}"] = Sum("count", where=f"ok_{k}")
    out.update({"t0_ns": Sum("min", "sched"), "t1_ns": Sum("max", "sched"),
                "ttft_sum": Sum("sum", "ttft", "has_ttft"), "ttft_n": Sum("count",
                                                                          where="has_ttft"),
                "busy_s": Sum("sum", "busy"), "soj_s": Sum("sum", "soj", "has_soj")})
    return out


def cell_sums() -> dict[str, Sum]:
    """Per (run, unit, cell) (``CellStats.sums``)."""
    out = {"n": Sum("count"), "n_good": Sum("count", where="good"),
           "n_ok": Sum("count", where="ok")}
    for j, s in enumerate(C.STATUSES):
        out[f"st_{s}"] = Sum("count", where=f"st{j}")
    out.update({"input_tokens": Sum("sum", "tok_in"), "output_tokens": Sum("sum", "tok_out"),
                "output_tokens_asked": Sum("sum", "tok_ask"),
                "input_tokens_started": Sum("sum", "tok_in", "started"),
                "computed_input_tokens": Sum("sum", "tok_comp"),
                "computed_input_tokens_started": Sum("sum", "tok_comp", "started")})
    return out


def fine_sums(pw_keys) -> dict[str, Sum]:
    """Per (run, fine unit), the inputs of the block-length rule
    (``stats.block_length_fine``): requests, SLO-good, and per latency series the sum, count
    and largest of its present keys."""
    out = {"n": Sum("count"), "good": Sum("count", where="good")}
    for _, k in pw_keys:
        out[f"{k}_sum"] = Sum("sum", k, f"has_{k}")
        out[f"{k}_n"] = Sum("count", where=f"has_{k}")
        out[f"{k}_max"] = Sum("max", k, f"has_{k}")
    return out


def sums_np(sums: dict[str, Sum], a: dict, group: np.ndarray, size: int,
            bounds: np.ndarray | None = None) -> dict:
    """Every sum of ``sums`` over one run's numpy columns ``a``, grouped by ``group`` (values
    0…size−1). count/sum → float64; min/max → float64 with NaN for an empty group. Filters
    are computed once each; the status counts in one pass.

    ``bounds``: where each group starts (size + 1 offsets, the last one the row count) when
    the groups are contiguous, i.e. ``group`` is non-decreasing (units and fine units of
    requests in scheduled order). Counts and sums of integer columns then come from segment
    sums (``np.add.reduceat`` in int64: exact, so the same numbers as ``np.bincount``, and
    several times faster than a boolean-indexed copy and a bincount); sums of float columns
    keep ``np.bincount``, whose sequential order of addition they were defined by."""
    masks: dict[str, np.ndarray] = {}

    def mask(name):
        if name not in masks:
            masks[name] = filter_np(name, a)
        return masks[name]

    out: dict[str, np.ndarray] = {}
    st_names = [n for n, s in sums.items() if s.kind == "count" and s.where
                and s.where.startswith("st") and s.where[2:].isdigit()]
    if st_names and bounds is None:  # one bincount for every status
        ns = len(STATUS_NAMES)
        by = np.bincount(group * ns + np.minimum(a["st"].astype(np.int64), ns - 1),
                         minlength=size * ns).reshape(size, ns).astype(np.float64)
        for n in st_names:
            out[n] = by[:, int(sums[n].where[2:])].copy()
    for name, s in sums.items():
        if name in out:
            continue
        sel = None if s.where is None else mask(s.where)
        if bounds is not None and (s.kind in ("count", "min", "max") or (
                s.kind == "sum" and np.issubdtype(a[s.value].dtype, np.integer))):
            if s.kind == "count":
                out[name] = (np.diff(bounds) if sel is None else
                             segment_sums(sel, bounds)).astype(np.float64)
            elif s.kind == "sum":
                v = a[s.value] if sel is None else np.where(sel, a[s.value], 0)
                out[name] = segment_sums(v, bounds).astype(np.float64)
            else:
                out[name] = segment_extremes(s.kind, a[s.value], sel, bounds)
            continue
        if s.kind == "sum":
            # rows left out weigh +0.0, which changes no partial sum's bits (a sum that starts
            # at +0.0 is never −0.0): the same sums without two masked copies (7.5 against
            # 16 ms for 10^6 requests)
            w = a[s.value].astype(np.float64)
            if sel is not None:
                np.copyto(w, 0.0, where=~sel)
            out[name] = np.bincount(group, weights=w, minlength=size)
            continue
        g = group if sel is None else group[sel]
        if s.kind == "count":
            out[name] = np.bincount(g, minlength=size).astype(np.float64)
        else:
            v = (a[s.value] if sel is None else a[s.value][sel]).astype(np.float64)
            out[name] = _extreme(s.kind, g, v, size)
    return out


def group_bounds(group: np.ndarray, size: int) -> np.ndarray:
    """Where each of the groups 0…size−1 of a non-decreasing ``group`` starts, and the row
    count: the ``bounds`` of ``sums_np``."""
    return np.searchsorted(group, np.arange(size + 1), side="left")


def segment_sums(v: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """int64 sums of ``v`` (integers or booleans) over the contiguous segments
    ``bounds[i]:bounds[i + 1]`` (0 for an empty one). Exact while a segment's sum stays
    below 2^63 (keys are below 2^31, so for any run of fewer than 4·10^9 requests)."""
    out = np.zeros(bounds.size - 1, dtype=np.int64)
    has = bounds[1:] > bounds[:-1]
    if has.any():  # reduceat reads an empty segment as one element: leave those out
        out[has] = np.add.reduceat(v, bounds[:-1][has], dtype=np.int64)
    return out


def segment_extremes(kind: str, v: np.ndarray, sel: np.ndarray | None,
                     bounds: np.ndarray) -> np.ndarray:
    """min or max of ``v`` (where ``sel``) over the contiguous segments of ``bounds``, as
    float64 (NaN for a segment with no value). The extreme is taken before the conversion
    to float64, which is monotone, so it is the extreme of the converted values."""
    res = np.full(bounds.size - 1, np.nan)
    op = np.minimum if kind == "min" else np.maximum
    if sel is not None:  # rows left out read as the operation's identity
        if np.issubdtype(v.dtype, np.integer):
            info = np.iinfo(v.dtype)
            fill = info.max if kind == "min" else info.min
        else:
            fill = np.inf if kind == "min" else -np.inf
        v = np.where(sel, v, np.asarray(fill, dtype=v.dtype))
        has = segment_sums(sel, bounds) > 0
    else:
        has = bounds[1:] > bounds[:-1]
    nonempty = bounds[1:] > bounds[:-1]
    if nonempty.any():
        ext = op.reduceat(v, bounds[:-1][nonempty])
        res[has] = np.asarray(ext, dtype=np.float64)[has[nonempty]]
    return res


def _extreme(kind: str, g: np.ndarray, v: np.ndarray, size: int) -> np.ndarray:
    """min or max of ``v`` per group ``g`` (non-decreasing: the requests are in scheduled
    order and units follow it), NaN for an empty group."""
    res = np.full(size, np.nan)
    if not g.size:
        return res
    starts = np.searchsorted(g, np.arange(size), side="left")
    ends = np.searchsorted(g, np.arange(size), side="right")
    has = ends > starts
    op = np.minimum if kind == "min" else np.maximum
    res[has] = op.reduceat(v, starts[has])
    return res


def busy_np(t_s: np.ndarray, soj: np.ndarray, t_last: float) -> np.ndarray:
    """Seconds each request is in flight inside the window: from its scheduled time to its
    end (scheduled + sojourn), or to the window's last scheduled time when it has no end or
    ends later (Little's law, ``diagnostics``)."""
    end = soj.astype(np.float64)
    end += t_s
    np.fmin(end, t_last, out=end)  # fmin: a missing end (NaN) reads the last scheduled time
    end -= t_s
    return np.maximum(0.0, end, out=end)


def busy_sql(t_s: str, soj: str, t_last: str) -> str:
    """``busy_np`` in SQL (the same operations in the same order, so the same doubles)."""
    return (f"greatest(CAST(0.0 AS DOUBLE), least(coalesce({t_s} + CAST({soj} AS DOUBLE), "
            f"{t_last}), {t_last}) - {t_s})")
