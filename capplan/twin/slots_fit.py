"""Slot (batch) limit and prefill lanes from per-request times, and from the engine's own
configuration — for engines the twin did not generate, whose load tools record no admission
stamps (docs/twin.md "Slots, lanes and noise").

- **slots, from the data**: a sequence decodes from its first to its last token; a request
  *queues* from ``arrival + quick`` (longer than a request served at once needs) to its first
  token. While requests queue, a slot limit holds the number of sequences decoding together at
  the limit (or one below, while the next prompt computes in a slot); a server without one lets
  it grow with the queue. The limit seen is the most sequences ever decoding together while
  requests queued (reached for at least ``MIN_TOP_SHARE`` of the queued time, so that one
  mis-stamped token does not set it); it *binds* when at least ``BIND_SHARE`` of the queued
  time ran within one sequence of it.
- **slots, from the engine**: study.yaml ``system`` may carry the engine's configuration
  (``engine_config``: ``max_num_seqs`` (vLLM), ``n_parallel`` / ``parallel`` / ``np`` /
  ``total_slots`` (llama.cpp), or its command line ``args`` with ``--max-num-seqs N``, ``-np N``,
  ``--parallel N``) or scraped metrics (``engine_metrics``: ``vllm:num_requests_running`` max,
  llama.cpp ``/props`` ``total_slots``); a limit there is the engine's own word.
- **slots, from the manifest**: ``system.max_batch`` (or ``slots``), what the person who wrote
  study.yaml said.
- **prefill lanes** (separate prefill): with L lanes busy, prompts complete every prefill / L.
  For each prompt that arrived before the previous prompt's first token (by more than
  ``LANE_SHRINK`` of its own prefill) and waited longer than its own prefill (× 1 +
  ``LANE_SHRINK``), the time between that first token and its own, over its fitted prefill time; lanes = round(1 / the median ratio), when at least ``MIN_LANE_PAIRS``
  prompts waited and they are at least ``MIN_WAIT_SHARE`` of the prompts that arrived while
  another computed (with a lane limit nearly all of them wait; else no limit held prompts back:
  any number, the default). A throughput reading:
  a prefill line 20 % too long (client overhead in the TTFT) still gives one lane.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .data import OK, StudyData
from .limits_fit import quick_ttft_ns

MIN_TOP_SHARE = 0.01
BIND_SHARE = 0.5
MIN_QUEUED_S = 5.0
LANE_SHRINK = 0.2
MIN_LANE_PAIRS = 30
MIN_WAIT_SHARE = 0.5  # of prompts arriving while another computes, waiting: a lane limit


@dataclass(frozen=True)
class SlotsSeen:
    value: int | None  # the most sequences decoding together while requests queued
    binding: bool
    share: float  # of the queued time, within one sequence of ``value``
    queued_s: float
    how: str
    hist: tuple[tuple[int, float], ...] = ()  # (sequences decoding, seconds queued at that count)


def _groups(data: StudyData, run):
    if data.replica_names:
        return [np.flatnonzero(run.replica == g) for g in range(len(data.replica_names))]
    if data.replicas == 1:
        return [np.arange(run.n)]
    return []


def _step_hist(dec_s, dec_e, q_s, q_e) -> dict[int, float]:
    """Seconds spent with n sequences decoding while ≥ 1 request queued, per n."""
    t = np.r_[dec_s, dec_e, q_s, q_e].astype(np.int64)
    dd = np.r_[np.ones(len(dec_s)), -np.ones(len(dec_e)), np.zeros(len(q_s) + len(q_e))].astype(np.int64)
    dq = np.r_[np.zeros(len(dec_s) + len(dec_e)), np.ones(len(q_s)), -np.ones(len(q_e))].astype(np.int64)
    if len(t) < 2:
        return {}
    o = np.lexsort((-(dd + dq), t))  # ends before starts at equal times
    t, dd, dq = t[o], dd[o], dq[o]
    n_dec = np.cumsum(dd)[:-1]
    n_q = np.cumsum(dq)[:-1]
    dt = np.diff(t) / 1e9
    m = (n_q > 0) & (dt > 0)
    out: dict[int, float] = {}
    vals, inv = np.unique(n_dec[m], return_inverse=True)
    sums = np.bincount(inv, weights=dt[m], minlength=len(vals))
    for v, s in zip(vals, sums):
        out[int(v)] = out.get(int(v), 0.0) + float(s)
    return out


def slots_from_data(data: StudyData) -> SlotsSeen:
    """The slot limit the events show (module docstring)."""
    quick = max(quick_ttft_ns(data), 1)
    hist: dict[int, float] = {}
    for run in data.runs:
        for idx in _groups(data, run):
            f, l_, a = run.first[idx], run.last[idx], run.arrive[idx]
            d = (f >= 0) & (l_ > f)
            q = (f >= 0) & (f - a > quick)
            for n, s in _step_hist(f[d], l_[d], (a + quick)[q], f[q]).items():
                hist[n] = hist.get(n, 0.0) + s
    total = sum(hist.values())
    if total < MIN_QUEUED_S or not hist:
        return SlotsSeen(None, False, 0.0, total,
                         f"requests queued (waited longer than {quick / 1e6:.0f} ms for their first token) for "
                         f"{total:.1f} s in all: too little to see a slot limit", tuple(sorted(hist.items())))
    ns = np.array(sorted(hist))
    secs = np.array([hist[n] for n in ns])
    tail = np.cumsum(secs[::-1])[::-1] / total  # share of queued time at ≥ n
    top = int(ns[np.flatnonzero(tail >= MIN_TOP_SHARE)[-1]])
    share = float(secs[ns >= top - 1].sum() / total)
    binds = share >= BIND_SHARE
    how = (f"requests queued (waited longer than {quick / 1e6:.0f} ms, 3 × the 10 % quantile of TTFT, for their "
           f"first token) for {total:.0f} s; at most {top} sequences decoded together then (for ≥ "
           f"{MIN_TOP_SHARE:.0%} of that time), and {share:.0%} of it ran with {top - 1}–{top}: ")
    how += ("a slot limit of " + str(top) + " held them back") if binds else (
        f"below {BIND_SHARE:.0%}, so no fixed limit held them back (at least {top} sequences can decode together)")
    return SlotsSeen(top, binds, share, total, how, tuple((int(n), round(float(s), 3)) for n, s in zip(ns, secs)))


# ------------------------------------------------------------------------------ engine config

_ARG_PATTERNS = (
    (r"--max-num-seqs[ =](\d+)", "vLLM --max-num-seqs"),
    (r"--max-running-requests[ =](\d+)", "SGLang --max-running-requests"),
    (r"(?:^|\s)-np[ =](\d+)", "llama.cpp -np"),
    (r"--parallel[ =](\d+)", "llama.cpp --parallel"),
)
_CONFIG_KEYS = (("max_num_seqs", "vLLM max_num_seqs"), ("max_running_requests", "SGLang max_running_requests"),
                ("n_parallel", "llama.cpp n_parallel"), ("parallel", "llama.cpp --parallel"),
                ("np", "llama.cpp -np"), ("total_slots", "llama.cpp /props total_slots"))
_METRIC_KEYS = (("total_slots", "llama.cpp /props total_slots"),
                ("vllm:max_num_seqs", "vLLM /metrics max_num_seqs"),
                ("llamacpp:n_parallel", "llama.cpp /metrics n_parallel"))


def _posint(v) -> int | None:
    try:
        x = int(v)
    except (TypeError, ValueError):
        return None
    return x if x >= 1 and float(v) == x else None


def slots_from_engine(system: dict) -> tuple[int, str] | None:
    """(slots, where) from study.yaml ``system.engine_config`` / ``engine_metrics``, if there."""
    cfg = (system or {}).get("engine_config")
    if isinstance(cfg, dict):
        for key, label in _CONFIG_KEYS:
            v = _posint(cfg.get(key))
            if v:
                return v, f"the engine's configuration ({label} = {v}, study.yaml system.engine_config.{key})"
        args = cfg.get("args")
        if isinstance(args, (list, tuple)):
            args = " ".join(map(str, args))
        if isinstance(args, str):
            for pat, label in _ARG_PATTERNS:
                m = re.search(pat, args)
                if m:
                    return int(m.group(1)), f"the engine's command line ({label} {m.group(1)}, system.engine_config.args)"
    met = (system or {}).get("engine_metrics")
    if isinstance(met, dict):
        for key, label in _METRIC_KEYS:
            v = _posint(met.get(key))
            if v:
                return v, f"the engine's metrics ({label} = {v}, study.yaml system.engine_metrics)"
    return None


def slots_from_manifest(system: dict) -> tuple[int, str] | None:
    for key in ("max_batch", "slots", "max_num_seqs"):
        v = _posint((system or {}).get(key))
        if v:
            return v, f"study.yaml system.{key} = {v}"
    return None


# ------------------------------------------------------------------------------ prefill lanes

@dataclass(frozen=True)
class LanesSeen:
    value: int | None
    pairs: int  # prompts that queued behind another prompt's computation
    overlap_share: float  # of those, first tokens sooner than (1 − LANE_SHRINK) prefill after the previous
    how: str


def lanes_from_data(data: StudyData, prefill_ms) -> LanesSeen:
    """Prefill lanes from first tokens and the fitted prefill line (module docstring).
    ``prefill_ms(prompt_tokens) -> ms`` is the fitted prefill line."""
    ratios: list[np.ndarray] = []
    n_came = 0
    for run in data.runs:
        for idx in _groups(data, run):
            ok = idx[(run.first[idx] >= 0) & (run.status[idx] == OK)]
            if len(ok) < 2:
                continue
            o = ok[np.argsort(run.first[ok], kind="stable")]
            f = run.first[o].astype(np.float64)
            dur = np.asarray(prefill_ms(run.inp[o].astype(float)), float) * 1e6
            a = run.arrive[o].astype(np.float64)
            # a prompt that arrived before the previous first token and waited longer than its own
            # prefill queued for a lane (or a slot): with L busy lanes prompts complete every
            # prefill / L. Without a lane limit prompts do not wait, and nothing is read
            came = np.r_[False, a[1:] < f[:-1] - dur[1:] * LANE_SHRINK]
            q = came & np.r_[False, f[1:] - a[1:] > dur[1:] * (1 + LANE_SHRINK)]
            n_came += int(came.sum())
            if q.any():
                ratios.append((np.diff(f) / np.maximum(dur[1:], 1.0))[q[1:]])
    r = np.concatenate(ratios) if ratios else np.zeros(0)
    pairs = int(len(r))
    if pairs < MIN_LANE_PAIRS:
        return LanesSeen(None, pairs, math.nan,
                         f"only {pairs} prompt(s) waited behind another prompt (need {MIN_LANE_PAIRS}): no lane limit "
                         "held prompts back; any number at once (default)")
    if pairs < MIN_WAIT_SHARE * n_came:
        return LanesSeen(None, pairs, math.nan,
                         f"of {n_came:,} prompts that arrived while another was computing, only {pairs:,} waited longer "
                         f"than their own prefill (a lane limit makes nearly all of them wait; < {MIN_WAIT_SHARE:.0%}): "
                         "no lane limit held prompts back; any number at once (default)")
    med = float(np.median(r))
    lanes = max(1, int(round(1.0 / med))) if med > 0 else None
    share = float(np.mean(r < 1.0 - LANE_SHRINK))
    if lanes is None:
        return LanesSeen(None, pairs, share, f"{pairs:,} prompts queued behind another, but their first tokens came "
                         "together: prompts are not computed one after another on lanes; any number (default)")
    how = (f"{pairs:,} prompts arrived before the previous prompt's first token and waited longer than their own "
           f"prefill; the time from that first token to "
           f"theirs is {med:.2f} × their fitted prefill time (median; {share:.0%} below {1 - LANE_SHRINK:.1f}): "
           f"prompts complete every prefill / {lanes}, ")
    how += "one prefill at a time" if lanes == 1 else f"{lanes} prefill lanes"
    return LanesSeen(lanes, pairs, share, how)
