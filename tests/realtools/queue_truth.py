"""The ground truth of queue_server: an independent discrete-event simulation of its model.

Written from the model's description, not from the server's code (only the parameter dataclass
in params.py is shared), so agreement between the two on the same arrival times is evidence that
this simulator *is* the server, and its C_SLO is the server's true capacity.

The model (times in ms, multiplied by ``time_scale``):

* ``slots`` sequence slots, taken at prefill start and given back at the last token; requests
  wait FIFO for a slot.
* one prefill lane; a prefill takes ``prefill_base_ms + prefill_ms_per_token * prompt_tokens``;
  the first token is emitted at the end of the prefill, and the sequence then decodes.
* decode iterations of ``decode_base_ms + decode_ms_per_seq * batch`` run back to back while any
  sequence decodes; each emits one token to every sequence in the batch it started with. A
  sequence whose prefill ended at or before an iteration's start joins that iteration.
* a request of ``n`` output tokens has its first token at prefill end and n-1 decode tokens.
* ``prefill_lane="chunked"`` (params.EngineParams): no prefill lane — the prompts admitted at an
  iteration's start are computed inside it (decode_step(decoding + new) + prefill_base_ms +
  prefill_ms_per_token × their tokens); first tokens at its end.

TTFT is measured from the intended arrival, TPOT = (last - first) / (n - 1), E2E = last - arrival.

    python -m tests.realtools.queue_truth --config reference   # C_SLO of the reference replica
    python -m tests.realtools.queue_truth --config small       # the CI replica
"""

from __future__ import annotations

import argparse
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from tests.realtools.params import REFERENCE, SMALL, EngineParams


@dataclass(frozen=True)
class SLO:
    """A request is good when it completed AND ttft <= ttft_ms AND tpot <= tpot_ms; the SLO holds
    at a rate when the fraction of good requests is at least ``attainment``."""

    ttft_ms: float = 1000.0
    tpot_ms: float = 80.0
    attainment: float = 0.95


@dataclass(frozen=True)
class Trace:
    """Per-request times of one simulated run (seconds on the arrival clock) and the metrics."""

    arrival_s: np.ndarray
    prefill_start_s: np.ndarray
    prefill_end_s: np.ndarray
    last_token_s: np.ndarray
    output_tokens: np.ndarray
    #: the decode iteration each request joined (−1: none) and every iteration's end (seconds):
    #: request r's decode tokens come at iteration_end_s[join_iteration[r] : + output − 1]
    join_iteration: np.ndarray | None = None
    iteration_end_s: np.ndarray | None = None

    def token_times_s(self, r: int) -> np.ndarray:
        """Every output token's time of request ``r`` (first token at the prefill end)."""
        k = int(self.output_tokens[r]) - 1
        j = int(self.join_iteration[r]) if self.join_iteration is not None else -1
        dec = self.iteration_end_s[j:j + k] if k > 0 and j >= 0 else np.zeros(0)
        return np.r_[self.prefill_end_s[r], dec]

    @property
    def first_token_s(self) -> np.ndarray:
        return self.prefill_end_s

    @property
    def ttft_ms(self) -> np.ndarray:
        return (self.prefill_end_s - self.arrival_s) * 1e3

    @property
    def tpot_ms(self) -> np.ndarray:
        """NaN for one-token answers (no inter-token time)."""
        n = self.output_tokens.astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 1, (self.last_token_s - self.prefill_end_s) * 1e3 / (n - 1), np.nan)

    @property
    def e2e_ms(self) -> np.ndarray:
        return (self.last_token_s - self.arrival_s) * 1e3

    def good(self, slo: SLO, *, cutoff_s: float | None = None) -> np.ndarray:
        """The SLO-good mask; with ``cutoff_s`` a request not finished by then was cancelled."""
        tpot = self.tpot_ms
        ok = (self.ttft_ms <= slo.ttft_ms) & (np.isnan(tpot) | (tpot <= slo.tpot_ms))
        if cutoff_s is not None:
            ok &= self.last_token_s <= cutoff_s
        return ok


def _as_lengths(x, n: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.int64)
    return np.full(n, int(a), dtype=np.int64) if a.ndim == 0 else a


def simulate(arrivals_s, prompt_tokens, output_tokens, params: EngineParams = REFERENCE) -> Trace:
    """Run the model on the given arrival times (sorted, seconds) until every request finished.

    ``prompt_tokens`` / ``output_tokens``: one int for all requests or one per request.
    The loop advances from event time to event time (next arrival, the prefill lane's end, the
    running decode iteration's end); at one instant the decode end (slots freed) and prefill end
    (sequence joins) are applied before new work starts, which is the tie rule of the model."""
    arr = np.asarray(arrivals_s, dtype=float)
    n = len(arr)
    p_tok = _as_lengths(prompt_tokens, n)
    o_tok = _as_lengths(output_tokens, n)
    if n and (np.any(np.diff(arr) < 0) or np.any(o_tok < 1)):
        raise ValueError("arrivals must be sorted and every request needs >= 1 output token")
    if params.prefill_lane == "chunked":
        return _simulate_chunked(arr, p_tok, o_tok, params)
    pf_s = np.array([params.prefill_ms(int(p)) for p in p_tok]) / 1e3 if n else np.zeros(0)
    step_base = params.decode_base_ms * params.time_scale / 1e3
    step_per = params.decode_ms_per_seq * params.time_scale / 1e3

    ps = np.full(n, np.nan)
    pe = np.full(n, np.nan)
    last = np.full(n, np.nan)
    join_it = np.full(n, -1, dtype=np.int64)
    iter_end: list[float] = []

    inf = math.inf
    waiting: deque[int] = deque()      # arrived, no slot / prefill lane yet (FIFO)
    free_slots = params.slots
    next_arr = 0
    pf_req = -1                        # request on the prefill lane
    pf_end = inf
    joined: list[int] = []             # prefill done, waiting for the next decode iteration
    batch = 0                          # sequences in the running iteration
    dec_end = inf
    it = 0                             # index of the running decode iteration
    finish_at: dict[int, list[int]] = {}   # iteration index -> sequences whose last token it is
    done = 0

    while done < n:
        t_arr = arr[next_arr] if next_arr < n else inf
        t = min(t_arr, pf_end, dec_end)
        if t == inf:
            raise RuntimeError("simulation stalled")
        if dec_end == t:                               # iteration ends: tokens, finished seqs
            for r in finish_at.pop(it, ()):
                last[r] = t
                free_slots += 1
                done += 1
                batch -= 1
            iter_end.append(t)
            dec_end = inf
            it += 1
        if pf_end == t:                                # prefill ends: first token
            r = pf_req
            if o_tok[r] == 1:
                last[r] = t
                free_slots += 1
                done += 1
            else:
                joined.append(r)
            pf_req, pf_end = -1, inf
        while next_arr < n and arr[next_arr] == t:
            waiting.append(next_arr)
            next_arr += 1
        # start work at t
        if dec_end == inf and (batch or joined):
            for r in joined:                           # joins this iteration; last token at the
                finish_at.setdefault(it + int(o_tok[r]) - 2, []).append(r)   # end of it+n-2
                join_it[r] = it
            batch += len(joined)
            joined.clear()
            dec_end = t + step_base + step_per * batch
        if pf_end == inf and waiting and free_slots > 0:
            r = waiting.popleft()
            free_slots -= 1
            ps[r] = t
            pf_req, pf_end = r, t + pf_s[r]
            pe[r] = pf_end
    return Trace(arr, ps, pe, last, o_tok, join_it, np.asarray(iter_end, dtype=float))


def _simulate_chunked(arr: np.ndarray, p_tok: np.ndarray, o_tok: np.ndarray, params: EngineParams) -> Trace:
    """Chunked prefill: iterations back to back while anything runs; at an iteration's start the
    waiting requests that arrived by then take free slots (FIFO) and their prompts are computed
    in it (their first token at its end, their decode tokens from the next iteration on)."""
    n = len(arr)
    ps, pe, last = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    join_it = np.full(n, -1, dtype=np.int64)
    iter_end: list[float] = []
    waiting: deque[int] = deque()
    decoding: list[list[int]] = []            # [request, decode tokens still to emit]
    free = params.slots
    nxt = 0
    t = -math.inf
    done = 0
    while done < n:
        if not decoding and not waiting:      # idle until the next arrival
            t = max(t, arr[nxt])
        while nxt < n and arr[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        new = []
        while waiting and free > 0:
            r = waiting.popleft()
            free -= 1
            ps[r] = t
            new.append(r)
        if not decoding and not new:
            continue
        dur = params.decode_step_ms(len(decoding) + len(new))
        if new:
            dur += params.chunk_ms(int(p_tok[new].sum()))
        end = t + dur / 1e3
        it = len(iter_end)
        iter_end.append(end)
        keep = []
        for d in decoding:
            d[1] -= 1
            if d[1] == 0:
                last[d[0]] = end
                free += 1
                done += 1
            else:
                keep.append(d)
        for r in new:
            pe[r] = end
            if o_tok[r] == 1:
                last[r] = end
                free += 1
                done += 1
            else:
                join_it[r] = it + 1
                keep.append([r, int(o_tok[r]) - 1])
        decoding = keep
        t = end
    return Trace(arr, ps, pe, last, o_tok, join_it, np.asarray(iter_end, dtype=float))


def poisson_arrivals(rate_rps: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrival times in [0, duration_s). The unit exponentials are drawn first and then
    scaled by 1/rate, so one seed gives common random numbers across rates (smooth bisection)."""
    mean_n = rate_rps * duration_s
    k = int(mean_n + 10 * math.sqrt(mean_n + 1) + 20)
    e = np.cumsum(rng.exponential(1.0, size=k))
    while e[-1] / rate_rps < duration_s:
        e = np.concatenate([e, e[-1] + np.cumsum(rng.exponential(1.0, size=k))])
    t = e / rate_rps
    return t[t < duration_s]


def _prompts(prompt_tokens, rng: np.random.Generator, n: int):
    """A fixed prompt length, or ``prompt_tokens(rng, n)`` drawn per request (drawn after the
    arrivals, so the arrival stream is the same either way)."""
    return prompt_tokens(rng, n) if callable(prompt_tokens) else prompt_tokens


def prompt_pool(tokens) -> "callable":
    """Prompt lengths drawn with replacement from ``tokens`` (e.g. the lengths a study sent)."""
    pool = np.asarray(tokens, dtype=np.int64)

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return pool[rng.integers(0, len(pool), size=n)]

    return draw


@dataclass(frozen=True)
class Attainment:
    """An attainment estimate with its Monte-Carlo standard error."""

    value: float
    se: float
    n_requests: int
    per_run: tuple = field(default=(), repr=False)


def run_attainment(rate_rps: float, slo: SLO, *, duration_s: float, runs: int, seed: int = 0,
                   params: EngineParams = REFERENCE, prompt_tokens=64,
                   output_tokens: int = 32, grace_s: float | None = None) -> Attainment:
    """Mean attainment over ``runs`` independent runs of ``duration_s`` started from an idle
    server: the protocol truth a sweep of runs of that length estimates. Requests arriving in
    [0, duration_s) count; they run to completion unless ``grace_s`` is given, when a request
    not finished by duration_s + grace_s is cancelled (not good)."""
    per = []
    n_req = 0
    for k in range(runs):
        rng = np.random.default_rng([seed, k])
        a = poisson_arrivals(rate_rps, duration_s, rng)
        if len(a) == 0:
            continue
        tr = simulate(a, _prompts(prompt_tokens, rng, len(a)), output_tokens, params)
        cut = None if grace_s is None else duration_s + grace_s
        per.append(tr.good(slo, cutoff_s=cut).mean())
        n_req += len(a)
    per = np.asarray(per)
    se = float(per.std(ddof=1) / math.sqrt(len(per))) if len(per) > 1 else math.nan
    return Attainment(float(per.mean()), se, n_req, tuple(per))


def steady_attainment(rate_rps: float, slo: SLO, *, horizon_s: float = 7200.0,
                      warmup_frac: float = 0.1, seed: int = 0, params: EngineParams = REFERENCE,
                      prompt_tokens=64, output_tokens: int = 32,
                      batches: int = 30) -> Attainment:
    """Pooled steady-state attainment of one long run (the first ``warmup_frac`` of arrivals
    discarded); the standard error is by batch means over ``batches`` consecutive batches."""
    rng = np.random.default_rng([seed, 10**6])
    a = poisson_arrivals(rate_rps, horizon_s, rng)
    tr = simulate(a, _prompts(prompt_tokens, rng, len(a)), output_tokens, params)
    g = tr.good(slo)[a >= warmup_frac * horizon_s].astype(float)
    means = np.array([b.mean() for b in np.array_split(g, batches)])
    return Attainment(float(g.mean()), float(means.std(ddof=1) / math.sqrt(batches)), len(g))


@dataclass(frozen=True)
class CSLO:
    """A true C_SLO: the largest rate whose attainment >= target, with its Monte-Carlo standard
    error (attainment SE at the crossing divided by the attainment-vs-rate slope)."""

    rate_rps: float
    se_rps: float
    attainment: float
    slope_per_rps: float
    protocol: str

    def to_text(self) -> str:
        return (f"{self.protocol}: C_SLO = {self.rate_rps:.3f} ± {self.se_rps:.3f} req/s "
                f"(attainment there {self.attainment:.4f}, slope {self.slope_per_rps:.4f}/req/s)")


def _bisect(f, target: float, lo: float, hi: float, tol: float, protocol: str) -> CSLO:
    a_lo, a_hi = f(lo), f(hi)
    if a_lo.value < target:
        raise ValueError(f"attainment {a_lo.value:.3f} < target already at {lo} req/s")
    if a_hi.value >= target:
        raise ValueError(f"attainment {a_hi.value:.3f} >= target still at {hi} req/s")
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        a = f(mid)
        if a.value >= target:
            lo, a_lo = mid, a
        else:
            hi, a_hi = mid, a
    h = max(0.05 * lo, 4 * tol)          # slope from a finite difference around the crossing
    a_dn, a_up = f(lo - h), f(lo + h)
    slope = (a_up.value - a_dn.value) / (2 * h)
    se = a_lo.se / abs(slope) if slope else math.inf
    return CSLO(lo, se, a_lo.value, slope, protocol)


def true_cslo(slo: SLO = SLO(), *, params: EngineParams = REFERENCE, prompt_tokens=64,
              output_tokens: int = 32, duration_s: float = 60.0, runs: int = 200,
              horizon_s: float = 7200.0, lo_rps: float = 0.5, hi_rps: float = 30.0,
              tol_rps: float = 0.01, seed: int = 0, grace_s: float | None = None
              ) -> tuple[CSLO, CSLO]:
    """Both true capacities by bisection on the rate (common random numbers across rates):
    the steady-state C_SLO (one ``horizon_s`` run) and the C_SLO of the protocol "mean attainment
    of ``runs`` runs of ``duration_s`` started idle". ``prompt_tokens``: one length, or a
    callable ``(rng, n) -> lengths`` (e.g. :func:`prompt_pool`)."""
    kw = dict(params=params, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    steady = _bisect(lambda r: steady_attainment(r, slo, horizon_s=horizon_s, seed=seed, **kw),
                     slo.attainment, lo_rps, hi_rps, tol_rps, f"steady state ({horizon_s:g} s)")
    runs_c = _bisect(lambda r: run_attainment(r, slo, duration_s=duration_s, runs=runs, seed=seed,
                                              grace_s=grace_s, **kw),
                     slo.attainment, lo_rps, hi_rps, tol_rps,
                     f"mean of {runs} runs of {duration_s:g} s from idle")
    return steady, runs_c


#: The configurations the README reports: (params, prompt, output, SLO, run length s).
CONFIGS = {
    "reference": (REFERENCE, 64, 32, SLO(1000.0, 80.0, 0.95), 60.0),
    "small": (SMALL, 64, 32, SLO(1000.0, 80.0, 0.95), 20.0),
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="reference")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--duration-s", type=float, help="run length of the from-idle protocol")
    p.add_argument("--horizon-s", type=float, default=7200.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    params, p_tok, o_tok, slo, dur = CONFIGS[a.config]
    dur = a.duration_s or dur
    t0 = time.perf_counter()
    steady, runs = true_cslo(slo, params=params, prompt_tokens=p_tok, output_tokens=o_tok,
                             duration_s=dur, runs=a.runs, horizon_s=a.horizon_s, seed=a.seed)
    print(f"{a.config}: {params}, prompt {p_tok}, output {o_tok}, {slo}")
    print(steady.to_text())
    print(runs.to_text())
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
