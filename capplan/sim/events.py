"""Turn raw simulator output into contract tables: per-request events and per-second power.

Token timestamps are rebuilt from each request's stints (first iteration, token count) and its
replica's piecewise-constant iteration segments, all vectorised: the end of iteration i of a
replica is ``seg_t0[s] + (i − seg_i0[s] + 1) · seg_step[s]`` for the segment s holding i.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import contract as C
from .engine import ERROR, OK, REJECTED, STATUS_NAMES, SimResult


def _iteration_clock(res: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """(base key of each replica, end time of every iteration of all replicas, keyed by
    base_r + iteration). A replica's segments tile its iterations 0..n−1 in order, so in segment
    s the end of iteration i is (t0_s + (1 − i0_s)·step_s) + i·step_s."""
    bases, ends = [], []
    base = 0
    for r in range(len(res.seg_i0)):
        i0, t0, step, k = res.seg_i0[r], res.seg_t0[r], res.seg_step[r], res.seg_k[r]
        n_it = int(k.sum())
        bases.append(base)
        if n_it:
            ends.append(np.repeat(t0 + (1 - i0) * step, k) + np.arange(n_it, dtype=np.int64) * np.repeat(step, k))
        base += n_it
    return (np.asarray(bases, np.int64),
            np.concatenate(ends) if ends else np.zeros(0, np.int64))


def _itl_values(rid, cnt, start, is_first, iter_end) -> np.ndarray:
    """All requests' inter-token gaps, concatenated in request order, with one large
    allocation (fresh memory is costly: keys are built by an in-place cumsum and gathered in
    place).

    Stints are sorted by request, then in time. Within a stint the gap before token i is the
    length of its iteration (the replica is busy, so iterations run back to back); the first
    token of a later stint (after a preemption) gets the gap from the previous stint's last
    token."""
    if len(rid) == 0:
        return np.zeros(0, np.int64)
    first = is_first.astype(np.int64)
    seg_len = cnt - first  # a request's very first token has no gap before it
    seg_key0 = start + first
    keep = seg_len > 0
    total = int(seg_len[keep].sum())
    if total == 0:
        return np.zeros(0, np.int64)
    iter_len = np.diff(iter_end, prepend=iter_end[:1])
    k_len, k_key0 = seg_len[keep], seg_key0[keep]
    pos = np.cumsum(k_len) - k_len
    arr = np.ones(total, np.int64)
    prev_last = np.r_[0, (k_key0 + k_len - 1)[:-1]]
    arr[pos] = k_key0 - prev_last
    np.cumsum(arr, out=arr)  # iteration key of every gap's later token
    np.take(iter_len, arr, out=arr, mode="clip")  # element-wise, so in place is safe
    later = np.flatnonzero(~is_first)  # stints after a preemption (always kept: cnt ≥ 1)
    if len(later):
        cross = iter_end[start[later]] - iter_end[start[later - 1] + cnt[later - 1] - 1]
        kept_index = np.cumsum(keep) - 1
        arr[pos[kept_index[later]]] = cross
    return arr


def _token_times_offgrid(res: SimResult, rid, cnt, start, iter_end, with_itl: bool):
    """token_times when some tokens were sent off the iteration grid (separate prefill: the
    token a prefill lane emits when it finishes): every token's time is gathered, the off-grid
    ones are merged in, and the gaps are differences within each request."""
    n = len(res.sched_ns)
    total = int(cnt.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    t_grid = iter_end[np.repeat(start, cnt) + within] if total else np.zeros(0, np.int64)
    r_all = np.concatenate([np.repeat(rid, cnt), res.xtok_rid])
    t_all = np.concatenate([t_grid, res.xtok_ns])
    order = np.lexsort((t_all, r_all))
    r_all, t_all = r_all[order], t_all[order]
    n_recv = np.bincount(r_all, minlength=n).astype(np.int64)
    first = np.full(n, -1, np.int64)
    last = np.full(n, -1, np.int64)
    if len(r_all):
        head = np.r_[True, r_all[1:] != r_all[:-1]]
        tail = np.r_[r_all[1:] != r_all[:-1], True]
        first[r_all[head]] = t_all[head]
        last[r_all[tail]] = t_all[tail]
    if not with_itl:
        return n_recv, first, last, None, None
    values = np.diff(t_all)[~head[1:]] if len(r_all) else np.zeros(0, np.int64)
    offsets = np.r_[0, np.cumsum(np.maximum(n_recv - 1, 0))].astype(np.int64)
    return n_recv, first, last, offsets, values


def token_times(res: SimResult, with_itl: bool = True):
    """(n_received, first_token_ns, last_token_ns, itl offsets int64 | None, itl values | None);
    first/last are −1 where no token was received."""
    n = len(res.sched_ns)
    order = np.argsort(res.stint_rid, kind="stable")
    rid = res.stint_rid[order]
    cnt = res.stint_count[order]
    bases, iter_end = _iteration_clock(res)
    start = bases[res.stint_rep[order]] + res.stint_first_iter[order]
    if res.xtok_rid is not None and len(res.xtok_rid):
        return _token_times_offgrid(res, rid, cnt, start, iter_end, with_itl)
    n_recv = np.bincount(rid, weights=cnt, minlength=n).astype(np.int64)
    first = np.full(n, -1, np.int64)
    last = np.full(n, -1, np.int64)
    if len(rid):
        is_first = np.r_[True, rid[1:] != rid[:-1]]
        is_last = np.r_[rid[1:] != rid[:-1], True]
        first[rid[is_first]] = iter_end[start[is_first]]
        last[rid[is_last]] = iter_end[start[is_last] + cnt[is_last] - 1]
    if not with_itl:
        return n_recv, first, last, None, None
    values = _itl_values(rid, cnt, start, is_first if len(rid) else np.zeros(0, bool), iter_end)
    per = np.maximum(n_recv - 1, 0)
    offsets = np.r_[0, np.cumsum(per)].astype(np.int64)
    return n_recv, first, last, offsets, values


def events_arrow(res: SimResult, run_id: str, *, tenants: tuple[str, ...] = (),
                 slo_classes: tuple[str | None, ...] = (), with_itl: bool = True,
                 prefixes=None) -> pa.Table:
    """The run's events as a contract table (one row per offered request, in issue order).
    With a prefix cache: ``computed_input_tokens``; with ``prefixes`` (a
    :class:`capplan.sim.prefix.Prefixes`): ``prefix_group`` and ``session_id``."""
    n = len(res.sched_ns)
    n_recv, first, last, offsets, values = token_times(res, with_itl)
    status = res.status.astype(np.int64)
    sched = pa.array(res.sched_ns, pa.int64())
    no_tok = n_recv == 0
    cols = {
        "run_id": pa.array([run_id] * n, pa.string()) if n else pa.array([], pa.string()),
        "request_id": pc.utf8_lpad(pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string()), 7, "0"),
        "scheduled_ns": sched,
        "sent_ns": sched,
        "first_token_ns": pa.array(first, pa.int64(), mask=no_tok),
        "last_token_ns": pa.array(last, pa.int64(), mask=no_tok),
        "input_tokens": pa.array(res.input_tokens, pa.int64()),
        "output_tokens": pa.array(n_recv, pa.int64()),
        "max_output_tokens": pa.array(res.target_output, pa.int64()),  # what the client asked for
        "status": pc.take(pa.array(list(STATUS_NAMES), pa.string()), pa.array(status)),
    }
    if with_itl:
        lst = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32) if offsets[-1] < 2**31 else offsets,
                                                pa.int32() if offsets[-1] < 2**31 else pa.int64()),
                                       pa.array(values, pa.int64()), mask=pa.array(no_tok))
        if lst.type != pa.list_(pa.int64()):
            lst = lst.cast(pa.list_(pa.int64()))
        cols["itl_ns"] = lst
    admitted = res.admitted_ns
    cols["admitted_ns"] = pa.array(admitted, pa.int64(), mask=admitted < 0)
    cols["prefill_start_ns"] = cols["admitted_ns"]
    cols["server_received_ns"] = sched
    if tenants:
        cols["tenant"] = pc.take(pa.array(list(tenants), pa.string()), pa.array(res.tenant))
        if any(c is not None for c in slo_classes):
            cols["slo_class"] = pc.take(pa.array(list(slo_classes), pa.string()), pa.array(res.tenant))
    reason = np.where(status == OK, 0, np.where((status == REJECTED) | (status == ERROR), 2, 1))
    cols["finish_reason"] = pc.take(pa.array(["length", "abort", None], pa.string()), pa.array(reason))
    n_rep = len(res.seg_i0)
    rep = np.where(res.replica >= 0, res.replica, n_rep)
    names = list(res.replica_names) if res.replica_names is not None else [f"replica-{i}" for i in range(n_rep)]
    cols["replica_group"] = pc.take(pa.array(names + [None], pa.string()), pa.array(rep))
    if res.computed_input is not None:
        ci = res.computed_input
        cols["computed_input_tokens"] = pa.array(ci, pa.int64(), mask=ci < 0)
    if prefixes is not None:
        g = prefixes.group
        if (g >= 0).any():
            labels = prefixes.group_names
            cols["prefix_group"] = pa.array([None if x < 0 else (labels[x] if x < len(labels) else f"h{x}")
                                             for x in g.tolist()], pa.string())
        se = prefixes.session
        if (se >= 0).any():
            cols["session_id"] = pa.array([None if x < 0 else f"s{x:06d}" for x in se.tolist()], pa.string())
    fields = [pa.field(c.name, c.dtype, nullable=c.nullable) for c in C.EVENT_COLUMNS if c.name in cols]
    return pa.Table.from_arrays([cols[f.name] for f in fields], schema=pa.schema(fields))


def power_arrow(res: SimResult, run_id: str, *, gpus_per_replica: int, idle_w: float, busy_w: float,
                horizon_s: float, token_budget: int) -> pa.Table:
    """Per-second, per-GPU power (an assumption, not a measurement): while an iteration runs a
    GPU draws idle_w + (busy_w − idle_w) · (0.6 + 0.4 · min(1, tokens in the iteration /
    token_budget)), so a full prefill chunk draws busy_w and a small decode batch about 60 % of
    the dynamic range; idle_w between iterations. ``t_ns`` is the start of the 1-s window on the
    run clock and ``power_w`` the window mean; ``energy_mj`` accumulates from the run start."""
    n_sec = max(int(np.ceil(horizon_s)), 1)
    grid = np.arange(n_sec + 1, dtype=np.int64) * C.NS_PER_S
    rows = {k: [] for k in ("t_ns", "gpu_index", "power_w", "energy_mj", "gpu_util_pct", "run_id", "host")}

    def busy_integral(a, b, w):
        """∫ w over the union of [a_i, b_i) up to each grid point (intervals sorted, disjoint)."""
        cum = np.r_[0.0, np.cumsum((b - a) * w)]
        idx = np.searchsorted(b, grid, side="right")
        val = cum[idx]
        if len(a):
            j = np.minimum(idx, len(a) - 1)
            part = (idx < len(a)) & (a[j] < grid)
            val = val + np.where(part, (grid - a[j]) * w[j], 0.0)
        return np.diff(val) / C.NS_PER_S

    for r in range(len(res.seg_i0)):
        a = res.seg_t0[r]
        b = a + res.seg_k[r] * res.seg_step[r]
        inten = 0.6 + 0.4 * np.minimum(1.0, res.seg_tok[r] / float(token_budget))
        frac = np.clip(busy_integral(a, b, np.ones(len(a))), 0.0, 1.0)
        dyn = np.clip(busy_integral(a, b, inten.astype(float)), 0.0, 1.0)
        watts = idle_w + (busy_w - idle_w) * dyn
        energy = np.cumsum(watts) * 1000.0  # W × 1 s = J → mJ
        for g in range(gpus_per_replica):
            rows["t_ns"].append(grid[:-1])
            rows["gpu_index"].append(np.full(n_sec, g, np.int64))
            rows["power_w"].append(np.round(watts, 3))
            rows["energy_mj"].append(np.round(energy, 1))
            rows["gpu_util_pct"].append(np.round(frac * 100.0, 3))
            rows["run_id"].append(np.full(n_sec, run_id, object))
            rows["host"].append(np.full(n_sec, f"replica-{r}", object))
    cols = {k: np.concatenate(v) for k, v in rows.items()}
    fields = [pa.field(c.name, c.dtype, nullable=c.nullable) for c in C.RESOURCE_COLUMNS if c.name in cols]
    return pa.Table.from_arrays([pa.array(cols[f.name], f.type) for f in fields], schema=pa.schema(fields))


def timeline_arrow(res: SimResult, run_id: str) -> pa.Table:
    """The run's fleet changes (``res.timeline``) as a contract timeline table, in time order
    (ties keep the order they happened in); replicas named as in ``replica_group``."""
    rows = sorted(enumerate(res.timeline), key=lambda x: (x[1][0], x[0]))
    cols: dict[str, list] = {c.name: [] for c in C.TIMELINE_COLUMNS}
    for _, (t, event, rep, extra) in rows:
        cols["run_id"].append(run_id)
        cols["t_ns"].append(int(t))
        cols["event"].append(event)
        cols["replica"].append(None if rep is None else f"replica-{rep}")
        for c in C.TIMELINE_COLUMNS[4:]:
            v = extra.get(c.name)
            if c.dtype == pa.int64() and v is not None:
                v = int(v)
            elif c.dtype == pa.float64() and v is not None:
                v = float(v)
            cols[c.name].append(v)
    return pa.Table.from_arrays([pa.array(cols[c.name], c.dtype) for c in C.TIMELINE_COLUMNS],
                                schema=C.TIMELINE_SCHEMA)
