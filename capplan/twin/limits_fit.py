"""Admission limits, client timeout and load-independent failures, as far as the events show
them (docs/twin.md "Estimators"):

- **max batch** — the most sequences seen running at once on a replica; it *binds* (and is
  then the estimate) when requests waited while that many ran;
- **KV capacity** — tokens held by running sequences (prompt + tokens sent so far) at each
  iteration start; when a request waited at the head of the queue although the batch had room
  and no prompt was being computed, the cache was full: capacity < held + its prompt. The
  largest amount held after an admission is a lower bound;
- **queue limit** — with rejections, the longest queue seen on a replica;
- **client timeout** — between the longest successful request and the first iteration boundary
  after the last token of a request that timed out while generating;
- **faults** — errors, and requests left without a token while later ones were served (a stall:
  not a queueing effect, since each replica serves its queue in order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .data import CANCELLED, ERROR, OK, REJECTED, TIMEOUT, RunArrays, StudyData
from .timeline import DECODE, IterationTrace, token_stream


@dataclass(frozen=True)
class LimitBound:
    value: float | None
    lo: float | None = None
    hi: float | None = None
    binding: bool = False
    how: str = ""
    n: int = 0


def nice_in(lo: float, hi: float) -> float:
    """The 'roundest' number in [lo, hi] (e.g. 60 in [59.98, 60.07]); the midpoint if none."""
    if not (hi >= lo):
        return lo
    for step in (3600, 600, 300, 120, 60, 30, 10, 5, 2, 1, 0.5, 0.2, 0.1, 0.05, 0.01, 0.005, 0.001):
        k = math.ceil(lo / step - 1e-12)
        if k * step <= hi + 1e-12 and k > 0:
            return round(k * step, 6)
    return 0.5 * (lo + hi)


# ------------------------------------------------------------------------------ timeout, faults

def timeout_bounds(data: StudyData, tl: IterationTrace | None) -> LimitBound:
    lo = 0.0
    for run in data.runs:
        m = ((run.status == OK) | (run.status == TIMEOUT)) & (run.last >= 0)
        if m.any():
            lo = max(lo, float(np.max(run.last[m] - run.sched[m])) / 1e9)
    hi = math.inf
    n_to = 0
    if tl is not None:
        for ri, run in enumerate(data.runs):
            m = (run.status == TIMEOUT) & (run.last >= 0)
            if not m.any():
                continue
            for g in np.unique(run.replica[m]) if data.replica_names else [0]:
                sel = (tl.run == ri) & (tl.replica == (g if data.replica_names else 0))
                grid = np.sort(tl.end_ns[sel])
                if len(grid) == 0:
                    continue
                i = np.flatnonzero(m & ((run.replica == g) if data.replica_names else True))
                k = np.searchsorted(grid, run.last[i], side="right")
                has = k < len(grid)
                if has.any():
                    hi = min(hi, float(np.min(grid[k[has]] - run.sched[i][has])) / 1e9)
                    n_to += int(has.sum())
    n_timeouts = sum(int((r.status == TIMEOUT).sum()) for r in data.runs)
    return LimitBound(None if not math.isfinite(hi) else nice_in(lo, hi), lo, hi if math.isfinite(hi) else None,
                 n_to > 0, n=n_timeouts)


def quick_ttft_ns(data: StudyData) -> int:
    """What 'served at once' means in this study: 3 × the 10th percentile of the time from
    arrival to first token of completed requests."""
    v = np.concatenate([(r.first - r.arrive)[(r.status == OK) & (r.first >= 0)] for r in data.runs] or [np.zeros(0)])
    return int(3 * np.percentile(v, 10)) if len(v) else 0


def stalled(run: RunArrays, wait_s: float, quick_ns: int = 0, single_queue: bool = True) -> np.ndarray:
    """Requests left without a token by the server, not by a queue. Each replica serves its
    queue in order, so while a request waits no later request on its replica can be served —
    and one arriving then cannot be served at once. A request that got no token is *stalled*
    when a request scheduled after it on the same replica got its first token, or arrived and
    was served within ``quick_ns``, while it was certainly still waiting: ``wait_s`` after its
    schedule (a lower bound of the client timeout) or, cancelled at the end, until the end of
    the run. Without replica names and with several replicas nothing can be said (all False)."""
    cand = ((run.status == TIMEOUT) | (run.status == CANCELLED)) & (run.first < 0)
    out = np.zeros(run.n, bool)
    if not cand.any() or not single_queue:
        return out
    end = max(int(run.last.max(initial=0)), int(run.first.max(initial=0)), int(run.sched.max(initial=0)))
    groups = np.unique(run.replica[run.replica >= 0]) if (run.replica >= 0).any() else [None]
    big = np.iinfo(np.int64).max
    for g in groups:
        on = np.ones(run.n, bool) if g is None else (run.replica == g)
        served = on & (run.first >= 0)
        if not served.any():
            continue
        order = np.flatnonzero(served)[np.argsort(run.sched[served], kind="stable")]
        ss = run.sched[order]
        # earliest moment a later request proved the queue empty: its first token, or its
        # arrival when it was served at once
        proof = run.first[order].copy()
        quick = (run.first[order] - run.arrive[order]) <= quick_ns
        proof[quick] = np.minimum(proof[quick], run.arrive[order][quick])
        suffix_min = np.minimum.accumulate(proof[::-1])[::-1]
        ci = np.flatnonzero(cand & on)
        k = np.searchsorted(ss, run.sched[ci], side="right")
        earliest = np.where(k < len(ss), suffix_min[np.minimum(k, len(ss) - 1)], big)
        until = np.where(run.status[ci] == CANCELLED, end, run.sched[ci] + int(wait_s * 1e9))
        out[ci] = earliest < until
    return out


@dataclass(frozen=True)
class Faults:
    error_share: float
    stall_share: float
    n_errors: int
    n_stalls: int
    n: int


def single_queue(data: StudyData) -> bool:
    """Whether each request's queue is known (replica names, or one replica)."""
    return bool(data.replica_names) or data.replicas == 1


def stall_masks(data: StudyData, wait_s: float) -> dict[str, np.ndarray]:
    """:func:`stalled` for every run of the study."""
    q = quick_ttft_ns(data)
    sq = single_queue(data)
    return {r.run_id: stalled(r, wait_s, q, sq) for r in data.runs}


def faults(data: StudyData, wait_s: float) -> Faults:
    n = sum(r.n for r in data.runs)
    ne = sum(int((r.status == ERROR).sum()) for r in data.runs)
    ns = sum(int(m.sum()) for m in stall_masks(data, wait_s).values())
    return Faults(ne / n if n else 0.0, ns / n if n else 0.0, ne, ns, n)


# ------------------------------------------------------------------------------ queue, batch, KV

MAX_BATCH_SHARE = 0.5  # of the iterations with waiting requests, at the largest batch: a batch limit
MIN_BLOCKED = 20  # head-of-queue waits with room in the batch needed to call the KV cache binding
BLOCKED_QUANTILE = 0.1


def _intervals_max(starts: np.ndarray, ends: np.ndarray) -> int:
    if len(starts) == 0:
        return 0
    t = np.r_[starts, ends]
    d = np.r_[np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)]
    o = np.lexsort((d, t))  # ends before starts at equal times
    return int(np.max(np.cumsum(d[o])))


def _waiting_intervals(run: RunArrays, on: np.ndarray, timeout_s: float):
    """[arrival, admission) of requests queued on a replica (never admitted: until their
    client gave up, or the end of the run)."""
    end = int(max(run.last.max(initial=0), run.sched.max(initial=0)))
    adm = on & (run.admitted >= 0) & (run.status != REJECTED)
    never = on & (run.admitted < 0) & (run.status != REJECTED) & (run.status != ERROR)
    s = np.r_[run.arrive[adm], run.arrive[never]]
    e = np.r_[run.admitted[adm], np.minimum(run.sched[never] + int(timeout_s * 1e9), end)]
    return s, e


def queue_limit(data: StudyData, timeout_s: float) -> LimitBound:
    n_rej = sum(int((r.status == REJECTED).sum()) for r in data.runs)
    if not data.replica_names and data.replicas > 1:
        longest = None
    else:
        longest = 0
        for run in data.runs:
            groups = range(len(data.replica_names)) if data.replica_names else [None]
            for g in groups:
                on = np.ones(run.n, bool) if g is None else run.replica == g
                if not (run.admitted[on] >= 0).any():
                    continue
                s, e = _waiting_intervals(run, on, timeout_s)
                longest = max(longest, _intervals_max(s, e))
    if n_rej and longest:
        return LimitBound(float(longest), float(longest), None, True,
                     f"{n_rej:,} requests were rejected; the longest queue seen on a replica was {longest} requests", n_rej)
    if n_rej:
        return LimitBound(None, None, None, False, f"{n_rej:,} requests were rejected but queue lengths cannot be rebuilt "
                     "without admission stamps and replica names (admitted_ns, replica_group)", n_rej)
    return LimitBound(None, float(longest) if longest is not None else None, None, False,
                 "no request was rejected" + (f"; the longest queue seen on a replica was {longest} requests"
                                              if longest is not None else ""), 0)


@dataclass(frozen=True)
class AdmissionLimits:
    max_batch: LimitBound
    kv_tokens: LimitBound


def admission_limits(data: StudyData, tl: IterationTrace, timeout_s: float, *, block_size: int = 16) -> AdmissionLimits:
    """Max running sequences and KV capacity from the timeline (server path)."""
    max_run = int(tl.n_running.max()) if len(tl) else 0
    waited_full = 0
    waited_any = 0
    held_after_admit = 0.0
    blocked: list[float] = []
    for ri, run in enumerate(data.runs):
        groups = range(len(data.replica_names)) if data.replica_names else [None]
        for gi, g in enumerate(groups):
            on = np.ones(run.n, bool) if g is None else run.replica == g
            sel = (tl.run == ri) & (tl.replica == (g if g is not None else 0))
            if not sel.any():
                continue
            starts = tl.start_ns[sel]
            kinds = tl.kind[sel]
            nrun = tl.n_running[sel]
            ndec = tl.n_dec[sel]
            ws, we = _waiting_intervals(run, on, timeout_s)
            o = np.argsort(ws, kind="stable")
            ws, we = ws[o], we[o]
            # waiting at each iteration start: arrived before it, admitted/dropped after it
            n_arr = np.searchsorted(ws, starts, side="left")
            n_gone = np.searchsorted(np.sort(we), starts, side="right")
            waiting = n_arr - n_gone
            # only decode-only steps: in a step that computes prompts the token budget may hold requests back
            waited_full += int(np.sum((nrun >= max_run) & (waiting > 0) & (kinds == DECODE)))
            waited_any += int(np.sum((waiting > 0) & (kinds == DECODE)))
            # KV tokens held at time t: prompts admitted before t, plus tokens sent by t,
            # minus what finished requests held
            idx = np.flatnonzero(on & (run.admitted >= 0))
            if len(idx) == 0:
                continue
            ts = token_stream(run, idx)
            if ts is None:
                continue
            tok_t = np.sort(ts[1])
            n_tok = np.bincount(np.searchsorted(idx, ts[0]), minlength=len(idx)) if len(ts[0]) else np.zeros(len(idx))
            end = np.where(run.last[idx] >= 0, run.last[idx], np.maximum(run.admitted[idx], run.first[idx]))
            a_o = np.argsort(run.admitted[idx], kind="stable")
            a_t = run.admitted[idx][a_o]
            a_cum = np.r_[0, np.cumsum(run.inp[idx][a_o])]
            e_o = np.argsort(end, kind="stable")
            e_t = end[e_o]
            e_cum = np.r_[0, np.cumsum((run.inp[idx] + n_tok)[e_o])]

            def held(t, admitted_incl: bool):
                a = a_cum[np.searchsorted(a_t, t, side="right" if admitted_incl else "left")]
                e = e_cum[np.searchsorted(e_t, t, side="right")]
                k = np.searchsorted(tok_t, t, side="right")
                return a - e + k

            slack = (block_size - 1) / 2.0
            adm_times = np.unique(a_t)
            after = held(adm_times, True)
            n_running_at = np.searchsorted(a_t, adm_times, side="right") - np.searchsorted(e_t, adm_times, side="right")
            held_after_admit = max(held_after_admit, float(np.max(after + slack * n_running_at)))
            # head-of-line waits with room in the batch and no prompt running (decode-only step)
            cand = np.flatnonzero((kinds == DECODE) & (waiting > 0) & (nrun < max_run))
            if len(cand):
                req_of = np.r_[np.flatnonzero(on & (run.admitted >= 0) & (run.status != REJECTED)),
                               np.flatnonzero(on & (run.admitted < 0) & (run.status != REJECTED)
                                              & (run.status != ERROR))][o]
                t_c = starts[cand]
                co = np.argsort(t_c, kind="stable")
                heads = np.empty(len(cand), np.int64)
                i = 0
                for k in co:  # the queue is served in order: its head only moves forward in time
                    while i < len(we) and we[i] <= t_c[k]:
                        i += 1
                    heads[k] = i
                ok = (heads < len(we)) & (ws[np.minimum(heads, len(ws) - 1)] < t_c)
                if ok.any():
                    h = req_of[heads[ok]]
                    blocked.extend((held(t_c[ok], True) + slack * nrun[cand][ok] + run.inp[h]
                                    + ndec[cand][ok]).tolist())
    # a batch limit caps the batch at the same size whenever requests wait; a full KV cache
    # stops admission at varying batch sizes
    full_share = waited_full / waited_any if waited_any else 0.0
    binds = waited_any > 0 and full_share >= MAX_BATCH_SHARE
    mb = LimitBound(float(max_run), float(max_run), None, binds,
               (f"requests waited in {waited_any:,} decode-only iterations, {full_share:.0%} of them with {max_run} "
                "sequences running: the batch was full" if binds else
                f"at most {max_run} sequences ran at once" + (
                    f"; requests waited in {waited_any:,} decode-only iterations but only {full_share:.0%} of them at "
                    "that size "
                    "(another limit held them back)" if waited_any else " and no request waited")))
    if len(blocked) >= MIN_BLOCKED:
        # a head of the queue misread (a preempted sequence waits in front, with a longer prompt)
        # gives a value below the capacity: a low quantile, not the minimum
        hi = float(np.quantile(blocked, BLOCKED_QUANTILE))
        lo = held_after_admit
        val = lo if lo > hi else 0.5 * (lo + hi)
        kv = LimitBound(val, lo, max(lo, hi), True, f"{len(blocked):,} iteration starts where the head of the queue waited "
                   f"with room in the batch and no prompt running: the cache was full; the most held after an "
                   f"admission was {lo:,.0f} tokens, the {BLOCKED_QUANTILE:.0%} quantile of held + the waiting prompt "
                   f"{hi:,.0f}", len(blocked))
    else:
        kv = LimitBound(None, held_after_admit, None, False,
                   f"the KV cache never held back a request; at most {held_after_admit:,.0f} tokens were held at once "
                   "on a replica")
    return AdmissionLimits(mb, kv)
