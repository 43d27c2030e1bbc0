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
  it → ``decode_step_ms(n) + overhead + ms_per_token × (their prompt tokens)``;
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

from .data import RunData, StudyData

DECODE, PREFILL, CHUNK, OTHER = 0, 1, 2, 3
BLOCK_ITERATIONS = 400  # iterations per bootstrap block (consecutive on one replica)


@dataclass(frozen=True, eq=False)
class Timeline:
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

    @property
    def dur_ns(self) -> np.ndarray:
        return self.end_ns - self.start_ns

    @property
    def n_running(self) -> np.ndarray:
        return self.n_dec + self.n_prefill

    def __len__(self) -> int:
        return int(len(self.kind))


def token_stream(run: RunData, idx: np.ndarray):
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


def _grid(t: np.ndarray, tol_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Group stamps no more than ``tol_ns`` apart: (grid times, grid index of each stamp)."""
    order = np.argsort(t, kind="stable")
    tsort = t[order]
    new = np.r_[True, np.diff(tsort) > tol_ns]
    cid = np.empty(len(t), np.int64)
    cid[order] = np.cumsum(new) - 1
    return tsort[new], cid


def _replica(run: RunData, idx: np.ndarray, tol_ns: int, separate: bool, timeout_ns: int):
    ts = token_stream(run, idx)
    if ts is None:
        return None
    rid, t, is_first = ts
    if len(t) < 2:
        return None
    n_gaps = int((~is_first).sum())
    # coherence on the full stream (first tokens included)
    T_all, cid = _grid(t, tol_ns)
    same = rid[1:] == rid[:-1]
    step = cid[1:] - cid[:-1]
    coherence = float(np.mean(step[same] == 1)) if same.any() else float("nan")
    ntok_all = np.bincount(cid, minlength=len(T_all))
    nfirst_all = np.bincount(cid[is_first], minlength=len(T_all))
    nfirst_ctx = nfirst_all[cid[is_first]]
    with_dec = (ntok_all[cid[is_first]] - nfirst_ctx) > 0
    # first tokens sent while others were decoding: on the grid iff a decode token shares the stamp
    active = _active_count(run, idx, t[is_first]) > 0  # others between their first and last token
    first_on_grid = float(np.mean(with_dec[active])) if active.any() else float("nan")
    # batching shows as decode tokens of concurrent streams sharing a stamp
    dec_tok = ~is_first
    busy = _active_count(run, idx, t[dec_tok]) >= 2
    sharing = float(np.mean(ntok_all[cid[dec_tok]][busy] >= 2)) if busy.any() else float("nan")
    n_sharing = int(busy.sum())
    if separate:  # the grid is made of decode tokens only
        keep = ~is_first
        rid, t, is_first = rid[keep], t[keep], is_first[keep]
        if len(t) < 2:
            return None
        T_all, cid = _grid(t, tol_ns)
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
    if has_adm or separate:
        kind[dec_ok & (npf == 0)] = DECODE
    else:  # without admission stamps a prompt in progress cannot be seen
        kind[dec_ok] = DECODE
    ptok = np.zeros(m, np.int64)
    if has_adm and not separate:
        fi = np.flatnonzero(is_first)
        fc = cid[fi]
        o = np.argsort(fc, kind="stable")
        fc, fr = fc[o], rid[fi][o]
        if len(fc):
            heads = np.r_[0, np.flatnonzero(np.diff(fc)) + 1]
            cl = fc[heads]
            adm_f = run.admitted[fr]
            amin = np.minimum.reduceat(adm_f, heads)
            amax = np.maximum.reduceat(adm_f, heads)
            psum = np.add.reduceat(run.inp[fr], heads)
            prev = np.where(cl > 0, T[np.maximum(cl - 1, 0)], -1)
            clean = (amin == amax) & (amin >= 0) & (amin >= prev) & (npf[cl] == nfirst[cl]) & \
                ((amin == prev) | (ndec[cl] == 0)) & (ncont[cl] == ndec[cl])
            cc = cl[clean]
            kind[cc] = PREFILL
            start[cc] = amin[clean]
            ptok[cc] = psum[clean]
        chunk = (j > 0) & (npf == 1) & (nfirst == 0) & (ndec >= 1) & (ncont == ndec)
        kind[chunk] = CHUNK
    start = np.where((kind == OTHER) & (start < 0), T, start)
    return dict(start=start, end=T, kind=kind, ndec=ndec, nfirst=nfirst, npf=npf, ptok=ptok,
                coherence=coherence, first_on_grid=first_on_grid, n_gaps=n_gaps, sharing=sharing,
                n_sharing=n_sharing)


def _active_count(run: RunData, idx: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Requests of ``idx`` with first token < t ≤ last token, at each time t."""
    f = run.first[idx]
    l_ = run.last[idx]
    ok = (f >= 0) & (l_ > f)
    n_started = np.searchsorted(np.sort(f[ok]), times, side="left")
    n_ended = np.searchsorted(np.sort(l_[ok]), times, side="left")
    return n_started - n_ended



def build_timeline(data: StudyData, *, tol_ns: int = 200_000, separate: bool = False,
                   runs: tuple[int, ...] | None = None, timeout_s: float = 60.0) -> Timeline | None:
    """Iterations of every (run, replica) whose stamps allow it; None when no replica does
    (no gap lists, or several replicas without ``replica_group``). ``timeout_s``: how long a
    prompt that never produced a token stayed in the batch (the client timeout)."""
    parts = []
    coh_num = coh_den = 0.0
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
            if not np.isnan(r["coherence"]):
                coh_num += r["coherence"] * r["n_gaps"]
                coh_den += r["n_gaps"]
            if not np.isnan(r["sharing"]):
                sh_num += r["sharing"] * r["n_sharing"]
                sh_den += r["n_sharing"]
            if not np.isnan(r["first_on_grid"]):
                fog_num += r["first_on_grid"] * m
                fog_den += m
    if not parts:
        return None
    cat = lambda k: np.concatenate([p[3][k] for p in parts])  # noqa: E731
    return Timeline(
        run=np.concatenate([np.full(len(p[3]["end"]), p[0]) for p in parts]),
        replica=np.concatenate([np.full(len(p[3]["end"]), p[1]) for p in parts]),
        block=np.concatenate([p[2] for p in parts]),
        start_ns=cat("start"), end_ns=cat("end"), kind=cat("kind"), n_dec=cat("ndec"),
        n_first=cat("nfirst"), n_prefill=cat("npf"), prefill_tokens=cat("ptok"),
        coherence=coh_num / coh_den if coh_den else float("nan"),
        first_on_grid=fog_num / fog_den if fog_den else float("nan"), n_gaps=int(coh_den),
        sharing=sh_num / sh_den if sh_den else float("nan"), n_sharing=int(sh_den))
