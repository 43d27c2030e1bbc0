"""Arrival schedules (intended send times, int64 ns since the run's start) and trace replay.

Open-loop processes: ``constant`` (gaps 1/λ), ``poisson`` (exponential gaps, CV 1) and ``gamma``
(gamma gaps with mean 1/λ and a chosen coefficient of variation: CV > 1 gives bursts, CV < 1
smoother than Poisson). ``replay`` reads a public trace (Azure LLM inference CSV or Mooncake
JSONL) and rescales its clock so that its mean rate equals the target, keeping every row's
joint (input, output) lengths together.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..contract import NS_PER_S
from ..errors import SpecError

PROCESSES = ("constant", "poisson", "gamma", "replay")


def _gaps_s(process: str, rate_rps: float, n: int, rng: np.random.Generator, cv: float) -> np.ndarray:
    mean = 1.0 / rate_rps
    if process == "constant":
        return np.full(n, mean)
    if process == "poisson":
        return rng.exponential(mean, n)
    if process == "gamma":
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, mean / shape, n)
    raise SpecError(f"unknown arrival process {process!r}", field="workload.arrival.process",
                    fix="one of " + ", ".join(PROCESSES))


def arrival_times_ns(process: str, rate_rps: float, duration_s: float, rng: np.random.Generator,
                     cv: float = 1.0) -> np.ndarray:
    """Intended send times in [0, duration_s) as sorted int64 ns; the first request is at 0.

    Gaps are drawn in blocks until the horizon is passed, so the result depends only on
    (process, rate, duration, cv) and the generator state."""
    if not (rate_rps > 0) or not math.isfinite(rate_rps):
        raise SpecError(f"offered rate must be a positive number, got {rate_rps}", field="rates")
    if not (duration_s > 0):
        raise SpecError(f"duration_s must be > 0, got {duration_s}", field="sweep.duration_s")
    if process == "gamma" and not (cv > 0):
        raise SpecError(f"gamma arrivals need cv > 0, got {cv}", field="workload.arrival.cv",
                        fix="e.g. arrival: {process: gamma, cv: 2.0}")
    expected = rate_rps * duration_s
    chunk = int(expected + 6.0 * math.sqrt(expected) + 16)
    parts, total = [], 0.0
    while total < duration_s:
        g = _gaps_s(process, rate_rps, chunk, rng, cv)
        parts.append(g)
        total += float(g.sum())
    gaps = np.concatenate(parts)
    t = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    ns = np.round(t * NS_PER_S).astype(np.int64)
    return ns[ns < int(round(duration_s * NS_PER_S))]


@dataclass(frozen=True)
class Trace:
    """A request trace: arrival offsets (s from its first row) and joint token lengths."""

    path: str
    t_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    #: Mooncake: each row's ``hash_ids`` (512-token prompt blocks), in row order; None otherwise
    hash_ids: tuple | None = None

    @property
    def n(self) -> int:
        return int(len(self.t_s))

    @property
    def span_s(self) -> float:
        return float(self.t_s[-1] - self.t_s[0]) if self.n > 1 else 0.0

    @property
    def mean_rate_rps(self) -> float:
        """(rows − 1) / span: the rate a replay reproduces when scaled by 1."""
        return (self.n - 1) / self.span_s if self.span_s > 0 else float("nan")


def _detect_format(path: Path) -> str:
    with open(path, "rb") as fh:
        head = fh.read(256).lstrip()
    if head.startswith(b"{"):
        return "mooncake"
    if head.upper().startswith(b"TIMESTAMP"):
        return "azure"
    raise SpecError("cannot tell the trace format from its first line", file=str(path),
                    field="workload.arrival.format",
                    fix="set format: azure (CSV TIMESTAMP,ContextTokens,GeneratedTokens) "
                        "or format: mooncake (JSONL timestamp ms, input_length, output_length)")


def load_trace(path: str | os.PathLike, fmt: str = "auto") -> Trace:
    """Read an Azure LLM inference CSV or a Mooncake JSONL trace (rows kept in file order,
    sorted stably by time)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecError("trace file not found", file=str(p), field="workload.arrival.path",
                        fix="give the path of an Azure CSV or Mooncake JSONL trace")
    fmt = _detect_format(p) if fmt in ("auto", None) else fmt
    hashes = None
    if fmt == "azure":
        import pandas as pd

        try:
            df = pd.read_csv(p, dtype={"ContextTokens": "int64", "GeneratedTokens": "int64"})
        except Exception as exc:
            raise SpecError(f"cannot read Azure trace CSV: {exc}", file=str(p)) from None
        need = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
        miss = [c for c in need if c not in df.columns]
        if miss:
            raise SpecError(f"Azure trace lacks column(s) {', '.join(miss)}", file=str(p), field=miss[0],
                            fix="expected header TIMESTAMP,ContextTokens,GeneratedTokens")
        # naive datetimes with 7 decimals (100 ns): parse to ns exactly
        ts = pd.to_datetime(df["TIMESTAMP"], format="%Y-%m-%d %H:%M:%S.%f", errors="coerce")
        if ts.isna().any():
            bad = int(np.flatnonzero(ts.isna().to_numpy())[0])
            raise SpecError("unreadable TIMESTAMP in Azure trace", file=str(p), field="TIMESTAMP",
                            fix=f"row {bad + 2}: {df['TIMESTAMP'].iloc[bad]!r}; expected 2023-11-16 18:17:03.9799600")
        ns = ts.to_numpy().astype("datetime64[ns]").astype(np.int64)
        inp = df["ContextTokens"].to_numpy(np.int64)
        out = df["GeneratedTokens"].to_numpy(np.int64)
    elif fmt == "mooncake":
        t, inp_l, out_l, hid = [], [], [], []
        with open(p, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    t.append(int(rec["timestamp"]))
                    inp_l.append(int(rec["input_length"]))
                    out_l.append(int(rec["output_length"]))
                    hid.append(tuple(int(x) for x in rec.get("hash_ids") or ()))
                except (ValueError, KeyError, TypeError) as exc:
                    raise SpecError(f"bad Mooncake record at line {lineno}: {exc!r}", file=str(p),
                                    fix="each line: {\"timestamp\": ms, \"input_length\": n, \"output_length\": n}") from None
        ns = np.asarray(t, dtype=np.int64) * 1_000_000
        inp = np.asarray(inp_l, dtype=np.int64)
        out = np.asarray(out_l, dtype=np.int64)
        hashes = hid if any(hid) else None
    else:
        raise SpecError(f"unknown trace format {fmt!r}", field="workload.arrival.format",
                        fix="azure, mooncake or auto")
    if len(ns) < 2:
        raise SpecError("a replay trace needs at least 2 rows", file=str(p))
    order = np.argsort(ns, kind="stable")
    ns, inp, out = ns[order], inp[order], out[order]
    if hashes is not None:
        hashes = tuple(hashes[i] for i in order.tolist())
    if (inp < 1).any() or (out < 0).any():
        raise SpecError("trace has non-positive input or negative output lengths", file=str(p))
    t_s = (ns - ns[0]) / 1e9
    if t_s[-1] <= 0:
        raise SpecError("trace spans no time (all timestamps equal)", file=str(p))
    return Trace(str(p), t_s, inp, out, hashes)


def replay_schedule(trace: Trace, rate_rps: float, duration_s: float,
                    start_row: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scheduled_ns, input_tokens, output_tokens) of a replay (``replay_rows``)."""
    ns, rr, _ = replay_rows(trace, rate_rps, duration_s, start_row)
    # a completion emits at least one token: rows logged with 0 generated tokens replay as 1
    return ns, trace.input_tokens[rr].copy(), np.maximum(trace.output_tokens[rr], 1)


def replay_rows(trace: Trace, rate_rps: float, duration_s: float,
                start_row: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replay the trace's rows in order from ``start_row`` (wrapping to row 0 after the last,
    one mean gap later), its clock scaled so that the run holds exactly
    m = round(rate × duration) rows: the scale maps the first row time after row m−1 onto
    ``duration_s``. Every run thus offers the target rate on average, whatever part of an
    on/off trace it covers, while keeping the trace's burst shape and each row's joint
    (input, output) lengths. Returns (scheduled_ns, trace row of each request, pass over the
    trace of each request: 0 for the first time through, 1 after wrapping once, …); rows with 0
    generated tokens are replayed as 1-token requests (none in the public traces)."""
    if not (rate_rps > 0) or not math.isfinite(rate_rps):
        raise SpecError(f"offered rate must be a positive number, got {rate_rps}", field="rates")
    if not (duration_s > 0):
        raise SpecError(f"duration_s must be > 0, got {duration_s}", field="sweep.duration_s")
    m = max(1, int(round(rate_rps * duration_s)))
    s0 = start_row % trace.n
    period = trace.span_s + 1.0 / trace.mean_rate_rps  # raw seconds; one mean gap closes the loop
    t = trace.t_s - trace.t_s[s0]
    t = np.concatenate([t[s0:], t[:s0] + period])
    rows = np.concatenate([np.arange(s0, trace.n), np.arange(0, s0)])
    reps = m // trace.n + 2
    tt = np.concatenate([t + i * period for i in range(reps)])
    rr = np.tile(rows, reps)
    later = np.flatnonzero(tt > tt[m - 1])
    t_end = tt[later[0]]  # first row strictly after row m−1 (ties stay inside the window)
    scale = duration_s / t_end
    ns = np.round(tt[:m] * scale * NS_PER_S).astype(np.int64)
    ns = np.minimum(ns, int(round(duration_s * NS_PER_S)) - 1)  # rounding never pushes past the end
    passes = (np.arange(m) + s0) // trace.n
    return ns, rr[:m], passes
