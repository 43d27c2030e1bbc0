"""Service-time estimators: the decode-step curve, prefill cost per token and its fixed
overhead, the per-iteration token budget, and whether prefill shares the batch.

Two paths (docs/twin.md "Estimators"):

- **server path** — iterations rebuilt from token stamps (:mod:`capplan.twin.timeline`): the
  decode curve is the mean duration of decode-only iterations per batch size, fitted by a
  piecewise-linear curve with knots at 1, 2, 4, … and the largest observed batch; prefill cost
  is the least-squares line of (iteration − decode step) on the prompt tokens of iterations
  whose prompts all started and finished in them; the token budget is read from iterations
  that computed one full chunk of a long prompt.
- **client path** — only per-request times: TPOT is regressed on the mean number of requests
  decoding at the same time (per replica) plus a term per prompt that finished during the
  request's decode (the stall a prompt in the batch causes); prefill from TTFT of requests that
  arrived to a nearly idle server.

Uncertainty: a bootstrap over blocks of consecutive iterations (server) or of consecutive
requests (client), drawn by :class:`capplan.bootstrap.IID` over the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from .. import bootstrap as boot
from .data import StudyData
from .timeline import CHUNK, DECODE, PREFILL, IterationTrace

MIN_PER_BATCH = 3  # iterations (or requests) needed for a batch size to set a knot
MIXED_STALL_SHARE = 0.25  # client path: prompts share the batch when each stalls decodes by ≥ this share of its prefill


@dataclass(frozen=True)
class DecodeFit:
    knots: np.ndarray
    ms: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    measured: tuple[tuple[int, float, int], ...]  # (batch, mean ms, count)
    how: str
    residual_cv: float  # spread of single observations around the curve

    def step_ms(self, n) -> np.ndarray:
        from ..sim.service import ServiceModel

        return ServiceModel(tuple(int(k) for k in self.knots), tuple(float(v) for v in self.ms), 0.0).step_ms(n)


@dataclass(frozen=True)
class PrefillFit:
    ms_per_token: float
    overhead_ms: float
    ci_per_token: tuple[float, float] | None
    ci_overhead: tuple[float, float] | None
    n: int
    how: str
    notes: tuple[str, ...] = ()
    resid_var: float = 0.0  # variance (ms²) of single prefill times around the line
    mean_ms: float = 0.0  # mean prefill time of the fitted rows

    def jitter_cv(self, explained_var: float = 0.0) -> float:
        """CV of the prefill time around the line, less a known random part (e.g. the wait for
        an iteration boundary, which the simulator already draws)."""
        if not (self.mean_ms > 0):
            return 0.0
        return float(np.sqrt(max(0.0, self.resid_var - explained_var)) / self.mean_ms)


def knots_for(n_values: np.ndarray, counts: np.ndarray, min_segment: int = MIN_PER_BATCH) -> np.ndarray:
    """1 (or the smallest batch seen), the powers of two in between, and the largest batch
    seen — dropping interior knots until every segment between knots holds at least
    ``min_segment`` observations (so that each knot is pinned by data)."""
    obs = n_values[counts >= MIN_PER_BATCH]
    if len(obs) == 0:
        obs = n_values
    lo, hi = int(obs.min()), int(obs.max())
    k = {lo, hi}
    p = 1
    while p < hi:
        if p > lo:
            k.add(p)
        p *= 2
    knots = sorted(k)

    def support(a, b):
        m = (n_values >= a) & (n_values <= b)
        return float(counts[m].sum())

    changed = True
    while changed and len(knots) > 2:
        changed = False
        seg = [support(a, b) for a, b in zip(knots, knots[1:])]
        i = int(np.argmin(seg))
        if seg[i] < min_segment:
            # drop the interior knot of the thinnest segment (the one nearer the middle)
            j = i + 1 if i + 1 < len(knots) - 1 else i
            if j == 0:
                j = 1
            knots.pop(j)
            changed = True
    return np.array(knots, np.int64)


def hat_basis(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation weights of x on the knots (clamped at both ends)."""
    x = np.clip(np.asarray(x, float), knots[0], knots[-1])
    B = np.zeros((len(x), len(knots)))
    if len(knots) == 1:
        B[:, 0] = 1.0
        return B
    j = np.clip(np.searchsorted(knots, x, side="right") - 1, 0, len(knots) - 2)
    w = (x - knots[j]) / (knots[j + 1] - knots[j])
    B[np.arange(len(x)), j] = 1.0 - w
    B[np.arange(len(x)), j + 1] += w
    return B


def _wls(B: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    sw = np.sqrt(np.maximum(w, 0.0))
    beta, *_ = np.linalg.lstsq(B * sw[:, None], y * sw, rcond=None)
    return beta


def _block_weights(n_blocks: int, reps: int, rng) -> np.ndarray:
    """(reps × blocks) draw counts: the blocks resampled with replacement (the project's
    resampler, scheme IID over blocks that are themselves runs of consecutive observations)."""
    return boot.IID().resample(n_blocks, 1, reps, rng).counts()


def _curve_from_sums(S: np.ndarray, C: np.ndarray, nvals: np.ndarray, knots: np.ndarray,
                     W: np.ndarray | None) -> np.ndarray:
    """Knot values from per-(block, batch) sums S and counts C (or their replicates)."""
    if W is None:
        s, c = S.sum(axis=0), C.sum(axis=0)
        ok = c > 0
        return _wls(hat_basis(nvals[ok], knots), s[ok] / c[ok], c[ok])
    Sr, Cr = W @ S, W @ C
    out = np.full((W.shape[0], len(knots)), np.nan)
    for r in range(W.shape[0]):
        ok = Cr[r] > 0
        B = hat_basis(nvals[ok], knots)
        seen = B.sum(axis=0) > 0
        if seen.all():  # a replicate without data near a knot says nothing about it
            out[r] = _wls(B, Sr[r, ok] / Cr[r, ok], Cr[r, ok])
    return out


def _robust(n: np.ndarray, d: np.ndarray, tol: float = 0.25) -> np.ndarray:
    """Keep observations within ``tol`` of their batch size's median (drops iterations that
    hid a recompute prefill or a scheduler hiccup)."""
    order = np.argsort(n, kind="stable")
    ns, ds = n[order], d[order]
    heads = np.r_[0, np.flatnonzero(np.diff(ns)) + 1]
    med = np.empty(len(heads))
    for i, (a, b) in enumerate(zip(heads, np.r_[heads[1:], len(ns)])):
        med[i] = np.median(ds[a:b])
    m = np.repeat(med, np.diff(np.r_[heads, len(ns)]))
    keep_s = np.abs(ds - m) <= tol * np.abs(m)
    keep = np.empty_like(keep_s)
    keep[order] = keep_s
    return keep


def fit_decode(n: np.ndarray, d_ms: np.ndarray, block: np.ndarray, *, reps: int, rng, how: str) -> DecodeFit:
    """Decode curve from (batch, duration) observations grouped in bootstrap blocks."""
    keep = _robust(n, d_ms)
    n, d_ms, block = n[keep], d_ms[keep], block[keep]
    nvals, ni = np.unique(n, return_inverse=True)
    bvals, bi = np.unique(block, return_inverse=True)
    S = np.zeros((len(bvals), len(nvals)))
    C = np.zeros((len(bvals), len(nvals)))
    np.add.at(S, (bi, ni), d_ms)
    np.add.at(C, (bi, ni), 1.0)
    counts = C.sum(axis=0)
    knots = knots_for(nvals, counts, min_segment=20)
    ms = _curve_from_sums(S, C, nvals, knots, None)
    W = _block_weights(len(bvals), reps, rng)
    rep = _curve_from_sums(S, C, nvals, knots, W)
    lo, hi = np.nanpercentile(rep, [2.5, 97.5], axis=0)
    means = S.sum(axis=0) / np.maximum(counts, 1)
    fitted = hat_basis(n, knots) @ ms
    cv = float(np.std(d_ms - fitted) / np.mean(fitted)) if len(d_ms) > 1 else float("nan")
    measured = tuple((int(b), float(m), int(c)) for b, m, c in zip(nvals, means, counts))
    return DecodeFit(knots, np.maximum(ms, 1e-3), lo, hi, measured, how, cv)


def _ols2(P: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Non-negative (overhead, per-token) least squares."""
    coef, _ = nnls(np.c_[np.ones_like(P), P], y)
    return float(coef[0]), float(coef[1])


def fit_prefill_rows(P: np.ndarray, y_ms: np.ndarray, block: np.ndarray, *, reps: int, rng, how: str,
                     min_spread: float = 0.1) -> PrefillFit:
    """y = overhead + ms_per_token × P (both ≥ 0) with a block bootstrap. When prompt lengths
    hardly vary, the two cannot be told apart: per-token cost 0, all time in the overhead."""
    notes = []
    if len(P) == 0:
        return PrefillFit(float("nan"), float("nan"), None, None, 0, how, ("no prompt could be timed",))
    # one robust pass: drop observations far off the first line (hidden multi-iteration prompts)
    a, b = _ols2(P, y_ms)
    res = y_ms - (a + b * P)
    mad = np.median(np.abs(res - np.median(res))) * 1.4826
    keep = np.abs(res) <= max(5 * mad, 0.05 * max(np.median(np.abs(y_ms)), 1e-3))
    P, y_ms, block = P[keep], y_ms[keep], block[keep]
    spread = (np.percentile(P, 90) - np.percentile(P, 10)) / max(np.mean(P), 1.0)
    bvals, bi = np.unique(block, return_inverse=True)
    if spread < min_spread:
        ov = float(np.mean(y_ms))
        notes.append(f"prompt lengths hardly vary (10–90 % range {np.percentile(P, 10):.0f}–"
                     f"{np.percentile(P, 90):.0f} tokens): the per-token prefill cost cannot be told from the "
                     f"fixed overhead, so it is set to 0 and the whole prefill time ({ov:.3g} ms) is overhead — "
                     f"valid near the measured prompt length only")
        sums = np.zeros(len(bvals))
        cnt = np.zeros(len(bvals))
        np.add.at(sums, bi, y_ms)
        np.add.at(cnt, bi, 1.0)
        W = _block_weights(len(bvals), reps, rng)
        rep = (W @ sums) / np.maximum(W @ cnt, 1)
        return PrefillFit(0.0, max(0.0, ov), (0.0, 0.0), boot.percentile_ci(rep), int(len(P)), how, tuple(notes),
                          float(np.var(y_ms)), float(np.mean(y_ms)))
    a, b = _ols2(P, y_ms)
    # per-block sufficient statistics of the 2×2 normal equations
    X = np.c_[np.ones_like(P), P, P * P, y_ms, P * y_ms]
    S = np.zeros((len(bvals), 5))
    np.add.at(S, bi, X)
    W = _block_weights(len(bvals), reps, rng)
    R = W @ S
    ra = np.empty(reps)
    rb = np.empty(reps)
    for r in range(reps):
        n_, sp, spp, sy, spy = R[r]
        A = np.array([[n_, sp], [sp, spp]])
        try:
            sol = np.linalg.solve(A, [sy, spy])
        except np.linalg.LinAlgError:
            sol = [np.nan, np.nan]
        ra[r], rb[r] = sol
        if ra[r] < 0 or rb[r] < 0:  # the non-negative solution on the boundary
            if ra[r] < 0:
                ra[r], rb[r] = 0.0, max(0.0, spy / spp if spp else 0.0)
            else:
                ra[r], rb[r] = max(0.0, sy / n_ if n_ else 0.0), 0.0
    return PrefillFit(b, a, boot.percentile_ci(rb), boot.percentile_ci(ra), int(len(P)), how, tuple(notes),
                      float(np.var(y_ms - (a + b * P))), float(np.mean(y_ms)))


def server_decode(tl: IterationTrace, *, reps: int, rng) -> DecodeFit:
    m = tl.kind == DECODE
    return fit_decode(tl.n_dec[m], tl.dur_ns[m] / 1e6, tl.block[m], reps=reps, rng=rng,
                      how=(f"mean duration of {int(m.sum()):,} decode-only iterations per batch size, rebuilt from "
                           "the token stamps on each replica; piecewise-linear least squares with knots at 1, 2, 4, … "
                           "and the largest batch seen; 95 % interval: bootstrap over blocks of "
                           "consecutive iterations"))


def server_prefill_mixed(tl: IterationTrace, dec: DecodeFit, *, reps: int, rng,
                         budget: float | None = None) -> PrefillFit:
    m = tl.kind == PREFILL
    nseq = tl.n_dec[m] + tl.n_first[m]
    P = tl.prefill_tokens[m].astype(float)
    y = tl.dur_ns[m] / 1e6 - dec.step_ms(nseq)
    blk = tl.block[m]
    if budget is not None and np.isfinite(budget):  # prompts longer than a chunk ran in several iterations
        ok = P + tl.n_dec[m] <= budget
        P, y, blk = P[ok], y[ok], blk[ok]
    return fit_prefill_rows(P, y, blk, reps=reps, rng=rng,
                            how=(f"least squares of (iteration − decode step) on the prompt tokens of "
                                 f"{len(P):,} iterations whose prompts all started and finished in them "
                                 "(overhead = intercept, per token = slope, both ≥ 0); 95 % interval: "
                                 "bootstrap over blocks of iterations"))


def server_budget(tl: IterationTrace, dec: DecodeFit, pf: PrefillFit, *, reps: int, rng):
    """Token budget from iterations that computed one full chunk of a long prompt:
    budget = (iteration − decode step − overhead) / ms per token + decodes. Returns
    (value, ci, n) or None when no such iteration exists (or prefill is free)."""
    m = tl.kind == CHUNK
    if not m.any() or not (pf.ms_per_token > 0):
        return None
    b = (tl.dur_ns[m] / 1e6 - dec.step_ms(tl.n_dec[m] + 1) - pf.overhead_ms) / pf.ms_per_token + tl.n_dec[m]
    bvals, bi = np.unique(tl.block[m], return_inverse=True)
    W = _block_weights(len(bvals), min(reps, 200), rng)
    order = np.argsort(b, kind="stable")
    bs, bis = b[order], bi[order]
    rep = np.empty(W.shape[0])
    for r in range(W.shape[0]):  # weighted median of the resampled blocks
        cw = np.cumsum(W[r][bis])
        rep[r] = bs[min(np.searchsorted(cw, 0.5 * cw[-1]), len(bs) - 1)] if cw[-1] else np.nan
    return float(np.median(b)), boot.percentile_ci(rep), int(m.sum())


def server_prefill_separate(data: StudyData, *, reps: int, rng) -> PrefillFit:
    """Separate prefill: each prompt's lane time = first token − admission."""
    P, y, blk = [], [], []
    for ri, run in enumerate(data.runs):
        ok = (run.admitted >= 0) & (run.first >= run.admitted)
        if not ok.any():
            continue
        i = np.flatnonzero(ok)
        P.append(run.inp[i].astype(float))
        y.append((run.first[i] - run.admitted[i]) / 1e6)
        blk.append(ri * 100_000 + np.arange(len(i)) // 200)
    if not P:
        return PrefillFit(float("nan"), float("nan"), None, None, 0, "", ("no request has both admission and first-token stamps",))
    P, y, blk = np.concatenate(P), np.concatenate(y), np.concatenate(blk)
    return fit_prefill_rows(P, y, blk, reps=reps, rng=rng,
                            how=(f"least squares of (first token − admission) on the prompt tokens of {len(P):,} "
                                 "requests (prefill runs on its own lane: overhead = intercept, per token = "
                                 "slope); 95 % interval: bootstrap over blocks of 200 requests"))


# ------------------------------------------------------------------------------ client path

def _concurrency_integral(starts: np.ndarray, ends: np.ndarray):
    """N(t) = #{i: start_i ≤ t < end_i} as a step function: (times, value after each time)
    and the cumulative area, to average N over any interval."""
    ev_t = np.r_[starts, ends]
    ev_d = np.r_[np.ones(len(starts)), -np.ones(len(ends))]
    o = np.argsort(ev_t, kind="stable")
    t, dlt = ev_t[o], ev_d[o]
    level = np.cumsum(dlt)
    area = np.r_[0.0, np.cumsum(level[:-1] * np.diff(t))]

    def mean_over(a, b):
        def A(x):
            k = np.searchsorted(t, x, side="right") - 1
            k = np.clip(k, 0, len(t) - 1)
            base = area[k] + level[k] * (x - t[k])
            return np.where(x < t[0], 0.0, base)
        width = np.maximum(b - a, 1)
        return (A(b) - A(a)) / width

    def at(x):
        k = np.searchsorted(t, x, side="right") - 1
        return np.where(k >= 0, level[np.clip(k, 0, len(t) - 1)], 0.0)

    return mean_over, at


@dataclass(frozen=True)
class ClientService:
    decode: DecodeFit
    prefill: PrefillFit
    boundary_var: float  # ms²: variance of the wait for the next iteration boundary in the prefill rows
    stall_per_prompt_ms: float  # decode stall per prompt finishing during a decode (mixed ⇒ ≈ prefill time)
    stall_ci: tuple[float, float]
    max_concurrency: float  # requests in flight per replica, largest seen
    mode: str
    how_mode: str


def client_service(data: StudyData, *, replicas: int, reps: int, rng, boundary: bool = True) -> ClientService | None:
    """Decode and prefill from per-request client times (see the module docstring).
    ``boundary=False``: first tokens are sent when the prompt is done, not at the next iteration
    end (separate prefill seen off the token grid), so no boundary wait is taken off the TTFT."""
    rows = []
    tt = []
    for ri, run in enumerate(data.runs):
        okm = (run.status == 0) & (run.first >= 0) & (run.last >= run.first)
        if okm.sum() < 2:
            continue
        has_tok = run.first >= 0
        mean_dec, _ = _concurrency_integral(run.first[has_tok & (run.last > run.first)].astype(float),
                                            run.last[has_tok & (run.last > run.first)].astype(float))
        infl_mean, infl_at = _concurrency_integral(run.arrive[has_tok].astype(float),
                                                   np.maximum(run.last[has_tok], run.first[has_tok]).astype(float))
        firsts = np.sort(run.first[has_tok])
        dm = okm & (run.out >= 2) & (run.last > run.first)
        i = np.flatnonzero(dm)
        if len(i):
            a, b = run.first[i].astype(float), run.last[i].astype(float)
            nbar = mean_dec(a, b) / replicas
            k = (np.searchsorted(firsts, b, side="left") - np.searchsorted(firsts, a, side="right")) / replicas
            rows.append(np.c_[np.full(len(i), ri), (b - a) / 1e6, run.out[i] - 1, np.maximum(nbar, 1.0), k])
        j = np.flatnonzero(okm)
        infl = infl_at(run.arrive[j].astype(float) - 1) / replicas  # in flight just before it arrived
        ndec = infl_at(run.arrive[j].astype(float)) / replicas
        # prompts pending (arrived, no first token yet) when it arrived: none ⇒ a free prefill lane
        _, pend_at = _concurrency_integral(run.arrive[has_tok].astype(float), run.first[has_tok].astype(float))
        pend = pend_at(run.arrive[j].astype(float) - 1) / replicas
        tt.append(np.c_[np.full(len(j), ri), (run.first[j] - run.arrive[j]) / 1e6, run.inp[j], infl, ndec, pend])
    if not rows or not tt:
        return None
    R = np.concatenate(rows)
    TT = np.concatenate(tt)
    # decode: total decode time = Σ_steps step(n̄) + stall × prompts finishing meanwhile
    n_bar = R[:, 3]
    steps = R[:, 2]
    nround = np.maximum(1, np.rint(n_bar)).astype(int)
    nvals, ni = np.unique(nround, return_inverse=True)
    knots = knots_for(nvals, np.bincount(ni), min_segment=20)
    B = hat_basis(n_bar, knots) * steps[:, None]
    X = np.c_[B, R[:, 4]]
    y = R[:, 1]
    w = 1.0 / np.maximum(steps, 1)  # one weight per request, not per token
    sw = np.sqrt(w)
    coef, _ = nnls(X * sw[:, None], y * sw)
    blocks = (R[:, 0] * 100_000 + np.arange(len(R)) // 25).astype(np.int64)
    bvals, bi = np.unique(blocks, return_inverse=True)
    Wt = _block_weights(len(bvals), reps, rng)
    rep = np.full((reps, X.shape[1]), np.nan)
    for r in range(reps):
        ww = Wt[r][bi] * w
        if np.all((B * (ww > 0)[:, None]).sum(axis=0) > 0):  # every knot still pinned by data
            s = np.sqrt(ww)
            rep[r], _ = nnls(X * s[:, None], y * s)
    ms = np.maximum(coef[:-1], 1e-3)
    lo, hi = np.nanpercentile(rep[:, :-1], [2.5, 97.5], axis=0)
    stall, stall_ci = float(coef[-1]), boot.percentile_ci(rep[:, -1])  # percentile_ci drops NaN
    tp = y / steps
    measured = tuple((int(v), float(np.average(tp[ni == k], weights=steps[ni == k])), int((ni == k).sum()))
                     for k, v in enumerate(nvals))
    fitted = (hat_basis(n_bar, knots) @ ms)
    cv = float(np.std(tp - fitted) / np.mean(fitted))
    dec = DecodeFit(knots, ms, lo, hi, measured,
                    f"per-request TPOT of {len(R):,} completed requests regressed on the mean number of requests "
                    "decoding at the same time per replica (piecewise linear, knots at 1, 2, 4, …), with a term per "
                    "prompt that finished during the request's decode; client timings only — no server stamps; "
                    "95 % interval: bootstrap over blocks of 25 consecutive requests", cv)
    # prefill from TTFT of requests that found (nearly) nobody in flight
    infl = TT[:, 3]
    if boundary:
        calm = infl < 0.5  # arrived to an idle server
        if calm.sum() < 20:
            calm = infl <= max(np.percentile(infl, 25), 1.0)
    else:
        # prefill off the grid (separate): the decodes do not delay a prompt, other prompts do —
        # requests that found no prompt pending, with room among the sequences decoding
        full = max(float(np.max(TT[:, 4])) - 1.0, 1.0)
        calm = (TT[:, 5] < 0.5) & (TT[:, 4] < full)
        if calm.sum() < 20:
            calm = infl <= max(np.percentile(infl, 25), 1.0)
    T = TT[calm]
    on_grid = boundary
    boundary = 0.5 * dec.step_ms(np.maximum(T[:, 4], 1)) * (T[:, 4] > 0) * float(on_grid)
    mixed_extra = dec.step_ms(T[:, 4] + 1)
    y_sep = T[:, 1] - boundary
    blk = (T[:, 0] * 100_000 + np.arange(len(T)) // 25).astype(np.int64)
    pf_sep = fit_prefill_rows(T[:, 2].astype(float), y_sep, blk, reps=reps, rng=rng, how="")
    prefill_ms = pf_sep.overhead_ms + pf_sep.ms_per_token * float(np.mean(T[:, 2]))
    if stall >= MIXED_STALL_SHARE * prefill_ms:
        mode = "mixed"
        pf = fit_prefill_rows(T[:, 2].astype(float), T[:, 1] - boundary - mixed_extra, blk, reps=reps, rng=rng, how="")
    else:
        mode = "separate"
        pf = pf_sep
    boundary_var = float(np.mean((dec.step_ms(np.maximum(T[:, 4], 1)) ** 2 / 12.0) * (T[:, 4] > 0))) * float(on_grid)
    calm_what = (f"at most {float(np.max(infl[calm])):.0f} request(s) in flight per replica" if on_grid else
                 "no other prompt pending and room among the decoding sequences")
    how_pf = (f"least squares of TTFT on prompt tokens over {int(calm.sum()):,} requests that arrived with {calm_what}"
              + (", less the expected wait for the next iteration boundary" if on_grid else
                 " (first tokens come off the iteration grid: no boundary wait)")
              + (" and one decode step" if mode == "mixed" else "")
              + "; client timings only; 95 % interval: bootstrap over blocks of 25 requests")
    pf = PrefillFit(pf.ms_per_token, pf.overhead_ms, pf.ci_per_token, pf.ci_overhead, pf.n, how_pf, pf.notes,
                    pf.resid_var, pf.mean_ms)
    how_mode = (f"a prompt finishing during a request's decode adds {stall:.3g} ms to it "
                f"(95 % interval {stall_ci[0]:.3g}–{stall_ci[1]:.3g}) against a prefill time of {prefill_ms:.3g} ms: "
                + (f"prompts share the batch with the decodes (mixed: the stall is ≥ {MIXED_STALL_SHARE:.0%} of a prefill)"
                   if mode == "mixed" else
                   f"prompts hardly slow the running decodes (< {MIXED_STALL_SHARE:.0%} of a prefill), so prefill runs on "
                   "its own resource (separate)"))
    return ClientService(dec, pf, boundary_var, stall, stall_ci, float(np.max(infl)) if len(infl) else 0.0, mode, how_mode)


@dataclass(frozen=True)
class DecodeNoise:
    """Spread of single decode-only steps around the fitted batch curve (server path), or of
    per-request TPOT around it (client path: an average over a request's steps, so smaller)."""

    cv: float  # SD of (step − curve) / curve
    share_off: float  # steps more than 25 % off the curve (hiccups, contention)
    n: int
    per_step: bool
    how: str


def decode_noise(tl: IterationTrace | None, dec: DecodeFit) -> DecodeNoise:
    """The noise term: every decode-only iteration (none dropped) against the curve."""
    if tl is None:
        cv = dec.residual_cv if np.isfinite(dec.residual_cv) else 0.0
        return DecodeNoise(float(cv), float("nan"), 0, False,
                           "SD of per-request TPOT around the fitted curve / the curve (client timings: each value "
                           "averages a request's steps, so single steps vary more)")
    m = tl.kind == DECODE
    if not m.any():
        return DecodeNoise(0.0, float("nan"), 0, True, "no decode-only iteration")
    fit = dec.step_ms(tl.n_dec[m])
    rel = tl.dur_ns[m] / 1e6 / fit - 1.0
    cv = float(np.std(rel))
    off = float(np.mean(np.abs(rel) > 0.25))
    burst = (f"; {tl.burst_share:.1%} of decode tokens came in bursts (closer than the grouping tolerance after "
             "the stream's previous token: a stalled client or server), their steps left out" if tl.burst_share > 0
             else "")
    return DecodeNoise(cv, off, int(m.sum()), True,
                       f"SD of (decode step − the fitted curve) / the curve over all {int(m.sum()):,} decode-only "
                       f"iterations; {off:.1%} of them more than 25 % off the curve" + burst)
