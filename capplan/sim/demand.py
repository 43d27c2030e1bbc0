"""Demand that changes over a run: a rate profile λ(t) and its arrivals (docs/timeline.md
"Scenario parts: demand").

A :class:`RateProfile` is piecewise linear between knots (a step is two knots at one time).
Arrivals are a renewal process in *operational time* Λ(t) = ∫₀ᵗ λ: gaps with mean 1 drawn on
the Λ axis (exponential: a non-homogeneous Poisson process; constant; gamma with a CV) and
mapped back through Λ⁻¹, so the local rate follows λ(t) and the burstiness is the process's.
Builders: ``steps`` and ``ramps`` on a base rate, ``oscillation`` (a square or sine wave, the
demand that makes a naive autoscaler thrash), ``diurnal`` (a working day) and ``from_trace`` (the shape of a request trace's
arrivals, its clock stretched to a span — a day, say — and its rate scaled to a peak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..contract import NS_PER_S
from ..errors import SpecError
from .arrivals import Trace


@dataclass(frozen=True)
class RateProfile:
    """λ(t) linear between ``(t_s[i], rps[i])`` knots, flat after the last; ``t_s[0]`` is 0."""

    t_s: tuple[float, ...]
    rps: tuple[float, ...]

    def __post_init__(self):
        t, r = np.asarray(self.t_s, float), np.asarray(self.rps, float)
        if t.size < 1 or t.size != r.size:
            raise SpecError("a rate profile needs matching knot times and rates", field="demand")
        if t[0] != 0.0 or np.any(np.diff(t) < 0) or not np.isfinite(t).all():
            raise SpecError("rate profile knots must start at 0 s and not go back in time",
                            field="demand", fix="sort the steps and ramps by time")
        if np.any(r < 0) or not np.isfinite(r).all():
            raise SpecError("rates must be ≥ 0 req/s", field="demand")

    def rate(self, t) -> np.ndarray:
        t = np.asarray(t, float)
        knots, r = np.asarray(self.t_s), np.asarray(self.rps)
        # np.interp takes the right value at a repeated knot: λ just after a step
        return np.interp(t, knots, r, right=r[-1])

    @property
    def peak_rps(self) -> float:
        return float(max(self.rps))

    def _segments(self):
        knots, r = np.asarray(self.t_s, float), np.asarray(self.rps, float)
        widths = np.diff(knots)
        slopes = np.r_[np.where(widths > 0, np.diff(r) / np.where(widths > 0, widths, 1.0), 0.0), 0.0]
        seg = np.r_[0.0, np.cumsum(0.5 * (r[1:] + r[:-1]) * widths)]
        return knots, r, slopes, seg

    def cumulative(self, t) -> np.ndarray:
        """Λ(t) = ∫₀ᵗ λ (expected arrivals by t)."""
        knots, r, slopes, seg = self._segments()
        t = np.asarray(t, float)
        i = np.clip(np.searchsorted(knots, t, side="right") - 1, 0, knots.size - 1)
        dt = t - knots[i]
        return seg[i] + r[i] * dt + 0.5 * slopes[i] * dt * dt

    def inverse(self, y) -> np.ndarray:
        """Λ⁻¹(y): the time by which y arrivals are expected (inf past a tail of rate 0)."""
        knots, r, slopes, seg = self._segments()
        y = np.asarray(y, float)
        i = np.clip(np.searchsorted(seg, y, side="right") - 1, 0, knots.size - 1)
        a, b, need = r[i], slopes[i], y - seg[i]
        with np.errstate(divide="ignore", invalid="ignore"):
            lin = np.where(a > 0, need / a, np.where(need > 0, np.inf, 0.0))
            quad = 2.0 * need / (a + np.sqrt(np.maximum(a * a + 2.0 * b * need, 0.0)))
        return knots[i] + np.where(b != 0, quad, lin)

    def arrivals_ns(self, duration_s: float, rng: np.random.Generator, *,
                    process: str = "poisson", cv: float = 1.0) -> np.ndarray:
        """Sorted intended send times in [0, duration_s) (int64 ns): gaps of mean 1 on the Λ
        axis (``poisson``: exponential; ``constant``; ``gamma`` with ``cv``), mapped through
        Λ⁻¹ (module docstring)."""
        if not (duration_s > 0):
            raise SpecError(f"duration_s must be > 0, got {duration_s}", field="run.duration_s")
        total = float(self.cumulative(duration_s))
        if total <= 0:
            return np.zeros(0, np.int64)
        chunk = int(total + 6.0 * math.sqrt(total) + 16)
        parts, acc = [], 0.0
        while acc < total:
            if process == "poisson":
                g = rng.exponential(1.0, chunk)
            elif process == "constant":
                g = np.ones(chunk)
            elif process == "gamma":
                if not (cv > 0):
                    raise SpecError("gamma arrivals need cv > 0", field="demand.arrival.cv")
                shape = 1.0 / (cv * cv)
                g = rng.gamma(shape, 1.0 / shape, chunk)
            else:
                raise SpecError(f"unknown arrival process {process!r} for a rate profile",
                                field="demand.arrival.process", fix="poisson, constant or gamma")
            parts.append(g)
            acc += float(g.sum())
        y = np.concatenate([[0.0], np.cumsum(np.concatenate(parts))])
        y = y[y < total]
        if process == "poisson":
            y = y[1:]  # a Poisson stream does not start with an arrival at 0
        t = self.inverse(y)
        ns = np.round(t * NS_PER_S).astype(np.int64)
        return np.sort(ns[(ns >= 0) & (ns < int(round(duration_s * NS_PER_S)))])


def steps(base_rps: float, changes: list[tuple[float, float]]) -> RateProfile:
    """``base_rps`` from 0, then each (at_s, rps) from its time on (a step)."""
    t, r = [0.0], [float(base_rps)]
    for at, rps in sorted(changes):
        t += [float(at), float(at)]
        r += [r[-1], float(rps)]
    return _clean(t, r)


def ramps(base_rps: float, segments: list[tuple[float, float, float]]) -> RateProfile:
    """``base_rps`` from 0, then each (from_s, to_s, to_rps): linear from the rate at
    ``from_s`` to ``to_rps`` at ``to_s``, flat after."""
    t, r = [0.0], [float(base_rps)]
    for a, b, rps in sorted(segments):
        if b <= a:
            raise SpecError(f"a ramp must end after it starts ({a:g} → {b:g} s)", field="demand.ramps")
        t += [float(a), float(b)]
        r += [r[-1], float(rps)]
    return _clean(t, r)


def oscillation(low_rps: float, high_rps: float, period_s: float, duration_s: float, *,
                shape: str = "square", start_s: float = 0.0) -> RateProfile:
    """Demand alternating between ``low_rps`` and ``high_rps`` every half ``period_s`` (square)
    or smoothly (sine, 16 knots per period), from ``start_s`` (``low_rps`` before)."""
    if not (period_s > 0):
        raise SpecError("oscillation period must be > 0 s", field="demand.oscillate.period_s")
    t, r = [0.0], [float(low_rps)]
    k = 0
    x = float(start_s)
    if shape == "square":
        while x < duration_s:
            rate = high_rps if k % 2 == 0 else low_rps
            t += [x, x]
            r += [r[-1], float(rate)]
            x += period_s / 2.0
            k += 1
    elif shape == "sine":
        n = 16
        mid, amp = (high_rps + low_rps) / 2.0, (high_rps - low_rps) / 2.0
        while x <= duration_s + period_s / n:
            t.append(x)
            r.append(mid - amp * math.cos(2 * math.pi * k / n))
            x += period_s / n
            k += 1
    else:
        raise SpecError(f"unknown oscillation shape {shape!r}", field="demand.oscillate.shape",
                        fix="square or sine")
    return _clean(t, r)


def diurnal(span_s: float, peak_rps: float) -> RateProfile:
    """A working day's shape when no trace is given: low at night, a morning rise and a larger
    afternoon peak (shares of the peak at 0, 3, 6, 9, 11, 13, 15, 17, 19, 21 and 24 h of the
    span: 0.25, 0.15, 0.25, 0.8, 0.9, 0.75, 1.0, 0.9, 0.6, 0.4, 0.25)."""
    hours = (0, 3, 6, 9, 11, 13, 15, 17, 19, 21, 24)
    share = (0.25, 0.15, 0.25, 0.8, 0.9, 0.75, 1.0, 0.9, 0.6, 0.4, 0.25)
    return RateProfile(tuple(h / 24 * span_s for h in hours), tuple(x * peak_rps for x in share))


def from_trace(trace: Trace, *, span_s: float, peak_rps: float, bin_s: float | None = None,
               start_s: float = 0.0) -> RateProfile:
    """The shape of a trace's arrival rate: arrivals counted in ``bin_s`` bins of trace time
    (default: 1/96 of the trace, a quarter-hour of a day), the trace's clock stretched onto
    [start_s, start_s + span_s] and the rate scaled so that its largest bin is ``peak_rps``;
    knots at the bin centres, linear in between, flat before the first and after the last."""
    if not (span_s > 0) or not (peak_rps > 0):
        raise SpecError("a trace day needs span_s > 0 and peak_rps > 0", field="demand.trace")
    width = trace.span_s / 96.0 if bin_s is None else float(bin_s)
    nb = max(1, int(math.ceil(trace.span_s / width)))
    counts = np.bincount(np.minimum((trace.t_s / width).astype(np.int64), nb - 1), minlength=nb)
    rate = counts / counts.max() * float(peak_rps)
    scale = span_s / (nb * width)
    centres = (np.arange(nb) + 0.5) * width * scale + start_s
    t = [0.0] + list(centres)
    r = [float(rate[0])] + [float(x) for x in rate]
    return _clean(t, r)


def _clean(t: list[float], r: list[float]) -> RateProfile:
    """Drop knots that repeat the one before (same time and rate)."""
    tt, rr = [t[0]], [r[0]]
    for a, b in zip(t[1:], r[1:]):
        if a == tt[-1] and b == rr[-1]:
            continue
        tt.append(a)
        rr.append(b)
    return RateProfile(tuple(tt), tuple(rr))
