"""Scheduler iterations rebuilt from per-token stamps (the twin's "server" path).

A continuous-batching replica emits one token for every decoding sequence at the end of each
iteration, so on one replica the token stamps of all requests fall on a common grid of
iteration ends. Grouping the stamps (within ``tol_ns``) recovers that grid; per iteration we
then know how long it took, how many sequences decoded in it (tokens that continue a stream
from the previous iteration) and which prompts finished in it (first tokens). With the
server's admission stamps (``admitted_ns`` / ``prefill_start_ns``) we also know which prompts
were being computed. docs/twin.md "Estimators" explains how the fit uses each kind:

- ``DECODE``: no prompt in progress, every token continues a stream → the iteration took
  ``decode_step_ms(n)`` with n = tokens emitted;
- ``PREFILL``: every prompt in progress was admitted at the iteration's start and finished in
  it → ``decode_step_ms(n) + overhead + ms_per_token × (their prompt tokens)``; without
  admission stamps, the prompts that came out at its end all arrived during the iteration before
  (or one prompt found the replica idle: it started at its arrival);
- ``CHUNK``: exactly one prompt in progress, not finished, with decodes running → a full
  chunk of ``token_budget − decodes`` prompt tokens;
- ``OTHER``: anything else (kept for the batch-size and KV bookkeeping only).

The grid exists only when stamps are exact enough and the server really batches: the
``coherence`` (share of token gaps that span exactly one iteration of the grid) says whether it
does; the fit falls back to client-side regressions when it is low.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .data import RunArrays, StudyData

DECODE, PREFILL, CHUNK, OTHER = 0, 1, 2, 3
BLOCK_ITERATIONS = 400  # iterations per bootstrap block (consecutive on one replica)


@dataclass(frozen=True, eq=False)
class IterationTrace:
    """One row per observed iteration of every (run, replica)."""

    run: np.ndarray
    replica: np.ndarray
    block: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    kind: np.ndarray
    n_dec: np.ndarray  # decoding sequences (tokens emitted that continue a stream)
    n_first: np.ndarray  # prompts that finished (first tokens emitted)
    n_prefill: np.ndarray  # prompts in progress (admitted, first token not yet out)
    prefill_tokens: np.ndarray  # PREFILL rows: prompt tokens computed; else 0
    coherence: float  # share of token gaps spanning exactly one grid step
    first_on_grid: float  # share of first tokens sent together with decode tokens (NaN: none)
    n_gaps: int
    sharing: float = float("nan")  # share of decode tokens sent while others decoded that share a stamp
    n_sharing: int = 0  # decode tokens sent while other requests were decoding
    coherence_decode: float = float("nan")  # the coherence of the decode tokens alone
    tol_ms: tuple[float, float] = (float("nan"), float("nan"))  # grouping tolerance used, min and max
    burst_share: float = 0.0  # decode tokens that came closer than the tolerance after their previous one

    @property
    def dur_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    @property
    def n_running(self) -> np.ndarray:
        return self.n_dec + self.n_prefill

    def __len__(self) -> int:
        return int(len(self.kind))


def token_stream(run: RunArrays, idx: np.ndarray):
    """(request, time, is_first) of every received token of requests ``idx``, sorted by
    request then time; None when a request with ≥ 2 tokens has no gap list."""
    idx = idx[run.first[idx] >= 0]
    if run.itl_has is None:
        if np.any(run.out[idx] >= 2):
            return None
        return idx, run.first[idx], np.ones(len(idx), bool)
    multi = run.out[idx] >= 2
    if np.any(multi & ~run.itl_has[idx]):
        return None
    off = run.itl_off
    n_gap = np.where(run.itl_has[idx], off[idx + 1] - off[idx], 0)
    cnt = 1 + n_gap
    total = int(cnt.sum())
    rid = np.repeat(idx, cnt)
    head = np.cumsum(cnt) - cnt
    pos = np.arange(total, dtype=np.int64) - np.repeat(head, cnt)  # 0 = first token
    gap_idx = np.repeat(off[idx], cnt) + pos - 1
    g = np.where(pos > 0, run.itl_val[np.clip(gap_idx, 0, max(len(run.itl_val) - 1, 0))] if len(run.itl_val) else 0, 0)
    # cumulative gaps within each request
    cs = np.cumsum(g)
    base = np.repeat(cs[head], cnt) - np.repeat(g[head], cnt)
    t = np.repeat(run.first[idx], cnt) + (cs - base)
    return rid, t, pos == 0


def _grid(t: np.ndarray, tol_ns: int, rid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Group stamps no more than ``tol_ns`` apart: (grid times, grid index of each stamp).
    With ``rid`` (the request of each stamp) a group never holds two tokens of one request —
    one iteration emits one token per sequence — so a tolerance near the step time cannot merge
    two iterations of a stream."""
    order = np.argsort(t, kind="stable")
    tsort = t[order]
    new = np.r_[True, np.diff(tsort) > tol_ns]
    if rid is not None and len(t):
        g = np.cumsum(new) - 1
        rs = rid[order]
        key = g * (int(rs.max()) + 1) + rs
        dup = np.zeros(len(t), bool)
        o = np.argsort(key, kind="stable")  # stable: time order within a (group, request)
        dup[o[1:]] = key[o[1:]] == key[o[:-1]]
        if dup.any():  # split the few groups that hold a request twice, in time order
            new = new.copy()
            for gi in np.unique(g[dup]):
                idx = np.flatnonzero(g == gi)
                seen: set = set()
                for i in idx:
                    if rs[i] in seen:
                        new[i] = True
                        seen = set()
                    seen.add(rs[i])
    cid = np.empty(len(t), np.int64)
    cid[order] = np.cumsum(new) - 1
    return tsort[new], cid


def step_tolerance_ns(rid: np.ndarray, t: np.ndarray, floor_ns: int = 200_000, share: float = 0.2) -> int:
    """How far apart the stamps of one iteration may be: ``share`` of the median gap between a
    stream's tokens (≈ the decode step), at least ``floor_ns``. Exact stamps need no more than
    the floor; a server that writes an iteration's tokens over a millisecond (llama.cpp on a
    CPU), or a client that stamps them on arrival, needs more. Grouping never puts two tokens
    of one stream together (:func:`_grid`), so a tolerance near the step cannot merge two
    iterations of a stream."""
    same = rid[1:] == rid[:-1]
    gaps = np.diff(t)[same] if len(t) > 1 else np.zeros(0)
    gaps = gaps[gaps > 0]
    if not len(gaps):
        return floor_ns
    return int(max(floor_ns, share * float(np.median(gaps))))


def _group_span_ns(t: np.ndarray, cid: np.ndarray, m: int) -> np.ndarray:
    """Last − first stamp of every group (0 for single stamps)."""
    lo = np.full(m, np.iinfo(np.int64).max)
    hi = np.full(m, np.iinfo(np.int64).min)
    np.minimum.at(lo, cid, t)
    np.maximum.at(hi, cid, t)
    return hi - lo


def _replica(run: RunArrays, idx: np.ndarray, tol_ns: int, separate: bool, timeout_ns: int):
    ts = token_stream(run, idx)
    if ts is None:
        return None
    rid, t, is_first = ts
    if len(t) < 2:
        return None
    n_gaps = int((~is_first).sum())
    dk = ~is_first
    if tol_ns is None:
        tol_ns = step_tolerance_ns(rid[dk], t[dk])
    # coherence on the full stream (first tokens included)
    T_all, cid = _grid(t, tol_ns, rid)
    same = rid[1:] == rid[:-1]
    step = cid[1:] - cid[:-1]
    coherence = float(np.mean(step[same] == 1)) if same.any() else float("nan")
    # and on the decode tokens alone: first tokens sent off the grid (prefill on its own lane)
    # add grid points a decode gap then spans
    T_d, cid_d = _grid(t[dk], tol_ns, rid[dk])
    same_d = rid[dk][1:] == rid[dk][:-1]
    coherence_dec = float(np.mean((cid_d[1:] - cid_d[:-1])[same_d] == 1)) if same_d.any() else float("nan")
    ntok_d = np.bincount(cid_d, minlength=len(T_d))
    # first tokens sent while others were decoding are on the grid when they come within one
    # iteration's write spread (90 % quantile of the decode groups' spans) of a decode token;
    # a prompt finished on its own lane lands anywhere in the step
    span = _group_span_ns(t[dk], cid_d, len(T_d))
    multi = ntok_d >= 2
    spread = max(200_000, int(np.quantile(span[multi], 0.9))) if multi.any() else 200_000
    td_sorted = np.sort(t[dk])
    tf = t[is_first]
    k = np.searchsorted(td_sorted, tf)
    near = np.minimum(np.abs(tf - td_sorted[np.clip(k - 1, 0, max(len(td_sorted) - 1, 0))]),
                      np.abs(td_sorted[np.clip(k, 0, max(len(td_sorted) - 1, 0))] - tf)) if len(td_sorted) else \
        np.full(len(tf), np.iinfo(np.int64).max)
    with_dec = near <= spread
    active = _active_count(run, idx, tf) > 0  # others between their first and last token
    first_on_grid = float(np.mean(with_dec[active])) if active.any() else float("nan")
    # batching shows as decode tokens of concurrent streams sharing a stamp
    busy = _active_count(run, idx, t[dk]) >= 2
    sharing = float(np.mean(ntok_d[cid_d][busy] >= 2)) if busy.any() else float("nan")
    n_sharing = int(busy.sum())
    if separate:  # the grid is made of decode tokens only
        keep = ~is_first
        rid, t, is_first = rid[keep], t[keep], is_first[keep]
        if len(t) < 2:
            return None
        T_all, cid = _grid(t, tol_ns, rid)
        same = rid[1:] == rid[:-1]
    T = T_all
    m = len(T)
    ntok = np.bincount(cid, minlength=m)
    nfirst = np.bincount(cid[is_first], minlength=m)
    # tokens that continue a stream from the previous grid step
    cont = np.zeros(len(t), bool)
    cont[1:] = same & (cid[1:] - cid[:-1] == 1)
    ncont = np.bincount(cid[cont], minlength=m)
    # a stream cut by its client's deadline still ran in the iteration after its last token
    # (the server aborts it at that boundary and drops the token)
    cut = (run.status[rid] != 0) & np.r_[rid[1:] != rid[:-1], True]
    nxt = cid[cut] + 1
    nxt = nxt[nxt < m]
    ntok = ntok + np.bincount(nxt, minlength=m)
    ncont = ncont + np.bincount(nxt, minlength=m)
    ndec = ntok - nfirst
    # prompts in progress during step j: admitted < T[j] and first token > T[j-1]
    sel = idx[run.admitted[idx] >= 0]
    adm_sorted = np.sort(run.admitted[sel])
    f = run.first[sel].astype(np.float64)
    # admitted but never got a token: computing its prompt until its client gave up
    f[f < 0] = np.minimum(run.sched[sel][f < 0] + timeout_ns, run.sched.max(initial=0) + timeout_ns)
    first_sorted = np.sort(f)
    A = np.searchsorted(adm_sorted, T, side="left")
    F_prev = np.r_[0, np.searchsorted(first_sorted, T[:-1], side="right")]
    npf = np.maximum(A - F_prev, 0) if not separate else np.zeros(m, np.int64)
    start = np.r_[-1, T[:-1]].astype(np.int64)
    kind = np.full(m, OTHER, np.int8)
    has_adm = len(sel) > 0
    j = np.arange(m)
    # every decode token continues its stream (a resumed one means a recompute prefill); with
    # separate prefill a newly joined stream is fine as long as the step was busy before
    dec_ok = (j > 0) & (ndec > 0) & (nfirst == 0) & ((ncont >= 1) if separate else (ncont == ndec))
    # a stream's tokens closer together than the grouping tolerance were not two iterations: the
    # client received a burst after a stall (a busy machine). The steps ending at them and the
    # stalled step before are not decode times
    burst = np.zeros(len(t), bool)
    burst[1:] = same & (np.diff(t) < tol_ns) & ~is_first[1:]
    bad = np.zeros(m, bool)
    if burst.any():
        bad[cid[burst]] = True
        bad[np.maximum(cid[burst] - 1, 0)] = True
    dec_ok &= ~bad
    burst_share = float(burst.sum() / max(int((~is_first).sum()), 1))
    if has_adm or separate:
        kind[dec_ok & (npf == 0)] = DECODE
    else:  # without admission stamps a prompt in progress cannot be seen
        kind[dec_ok] = DECODE
    ptok = np.zeros(m, np.int64)
    if has_adm and not separate:
        groups = _first_token_groups(cid, rid, is_first, run.admitted, run.inp)
        if groups is not None:
            cl, amin, amax, psum = groups
            prev = np.where(cl > 0, T[np.maximum(cl - 1, 0)], -1)
            clean = (amin == amax) & (amin >= 0) & (amin >= prev) & (npf[cl] == nfirst[cl]) & \
                ((amin == prev) | (ndec[cl] == 0)) & (ncont[cl] == ndec[cl])
            cc = cl[clean]
            kind[cc] = PREFILL
            start[cc] = amin[clean]
            ptok[cc] = psum[clean]
        chunk = (j > 0) & (npf == 1) & (nfirst == 0) & (ndec >= 1) & (ncont == ndec)
        kind[chunk] = CHUNK
    elif not separate:
        # without admission stamps: prompts that arrived during the previous iteration and came
        # out at the end of this one were admitted at its start and computed in it (a prompt
        # that waited for a slot, or ran over several iterations, comes out later); a prompt that
        # found the replica idle started at its arrival
        groups = _first_token_groups(cid, rid, is_first, run.arrive, run.inp)
        if groups is not None:
            cl, amin, amax, psum = groups
            prev = np.where(cl > 0, T[np.maximum(cl - 1, 0)], np.iinfo(np.int64).min)
            prev2 = np.where(cl > 1, T[np.maximum(cl - 2, 0)], np.iinfo(np.int64).min)
            busy = (cl > 0) & (ndec[cl] > 0) & (ncont[cl] == ndec[cl]) & (amin > prev2) & (amax <= prev)
            idle = (ndec[cl] == 0) & (nfirst[cl] == 1) & (amin > prev)
            ok = busy | idle
            kind[cl[ok]] = PREFILL
            start[cl[ok]] = np.where(busy[ok], prev[ok], amin[ok])
            ptok[cl[ok]] = psum[ok]
    start = np.where((kind == OTHER) & (start < 0), T, start)
    return dict(start=start, end=T, kind=kind, ndec=ndec, nfirst=nfirst, npf=npf, ptok=ptok,
                coherence=coherence, first_on_grid=first_on_grid, n_gaps=n_gaps, sharing=sharing,
                n_sharing=n_sharing, coherence_dec=coherence_dec, tol_ns=tol_ns, burst_share=burst_share)


def _active_count(run: RunArrays, idx: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Requests of ``idx`` with first token < t ≤ last token, at each time t."""
    f = run.first[idx]
    l_ = run.last[idx]
    ok = (f >= 0) & (l_ > f)
    n_started = np.searchsorted(np.sort(f[ok]), times, side="left")
    n_ended = np.searchsorted(np.sort(l_[ok]), times, side="left")
    return n_started - n_ended



def _first_token_groups(cid, rid, is_first, stamp, inp):
    """The iterations that emitted first tokens, with the earliest and latest ``stamp``
    (admission or arrival) and the summed prompt tokens of their requests; None when none."""
    fi = np.flatnonzero(is_first)
    fc = cid[fi]
    o = np.argsort(fc, kind="stable")
    fc, fr = fc[o], rid[fi][o]
    if not len(fc):
        return None
    heads = np.r_[0, np.flatnonzero(np.diff(fc)) + 1]
    st = stamp[fr]
    return (fc[heads], np.minimum.reduceat(st, heads), np.maximum.reduceat(st, heads),
            np.add.reduceat(inp[fr], heads))


def build_timeline(data: StudyData, *, tol_ns: int | None = None, separate: bool = False,
                   runs: tuple[int, ...] | None = None, timeout_s: float = 60.0) -> IterationTrace | None:
    """Iterations of every (run, replica) whose stamps allow it; None when no replica does
    (no gap lists, or several replicas without ``replica_group``). ``timeout_s``: how long a
    prompt that never produced a token stayed in the batch (the client timeout). ``tol_ns``:
    the grouping tolerance; None scales it to each run's step time (:func:`step_tolerance_ns`)."""
    parts = []
    coh_num = coh_den = 0.0
    cd_num = cd_den = 0.0
    bu_num = 0.0
    tols: list[int] = []
    fog_num = fog_den = 0.0
    sh_num = sh_den = 0.0
    block0 = 0
    for ri, run in enumerate(data.runs):
        if runs is not None and ri not in runs:
            continue
        if data.replica_names:
            groups = [np.flatnonzero(run.replica == g) for g in range(len(data.replica_names))]
        elif data.replicas == 1:
            groups = [np.arange(run.n)]
        else:
            return None
        for g, idx in enumerate(groups):
            if len(idx) == 0:
                continue
            r = _replica(run, idx, tol_ns, separate, int(round(timeout_s * 1e9)))
            if r is None:
                continue
            m = len(r["end"])
            blocks = block0 + np.arange(m) // BLOCK_ITERATIONS
            block0 = int(blocks[-1]) + 1 if m else block0
            parts.append((ri, g, blocks, r))
            tols.append(r["tol_ns"])
            bu_num += r["burst_share"] * r["n_gaps"]
            if not np.isnan(r["coherence"]):
                coh_num += r["coherence"] * r["n_gaps"]
                coh_den += r["n_gaps"]
            if not np.isnan(r["coherence_dec"]):
                cd_num += r["coherence_dec"] * r["n_gaps"]
                cd_den += r["n_gaps"]
            if not np.isnan(r["sharing"]):
                sh_num += r["sharing"] * r["n_sharing"]
                sh_den += r["n_sharing"]
            if not np.isnan(r["first_on_grid"]):
                fog_num += r["first_on_grid"] * m
                fog_den += m
    if not parts:
        return None
    cat = lambda k: np.concatenate([p[3][k] for p in parts])  # noqa: E731
    return IterationTrace(
        run=np.concatenate([np.full(len(p[3]["end"]), p[0]) for p in parts]),
        replica=np.concatenate([np.full(len(p[3]["end"]), p[1]) for p in parts]),
        block=np.concatenate([p[2] for p in parts]),
        start_ns=cat("start"), end_ns=cat("end"), kind=cat("kind"), n_dec=cat("ndec"),
        n_first=cat("nfirst"), n_prefill=cat("npf"), prefill_tokens=cat("ptok"),
        coherence=coh_num / coh_den if coh_den else float("nan"),
        first_on_grid=fog_num / fog_den if fog_den else float("nan"), n_gaps=int(coh_den),
        sharing=sh_num / sh_den if sh_den else float("nan"), n_sharing=int(sh_den),
        coherence_decode=cd_num / cd_den if cd_den else float("nan"),
        burst_share=bu_num / coh_den if coh_den else 0.0,
        tol_ms=(min(tols) / 1e6, max(tols) / 1e6))
