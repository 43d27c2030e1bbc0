"""Per-run diagnostics a careful reader expects beside a capacity number
(docs/statistics.md#diagnostics and docs/statistics.md#degenerate-runs).

Pure functions over small arrays (time-bin or block means that the reduction already computed),
plus ``run_diagnostics`` which combines them into one verdict per run:

- **warm-up**: MSER-5 truncation (White 1997; Franklin & White 2008) on time-bin TTFT means,
  unless the manifest's ``warmup_s`` says. A truncation in the run's second half is only a
  suspicion on a short run (its point is noise there): the run is unusable for lack of a steady
  state only when TTFT or attainment also drifts over it (``drift``, Mann–Kendall), and the
  reason names that trend; otherwise the whole run is used.
- **overload / non-stationarity**: one-sided OLS slope test on batch means of TTFT over the
  measurement window. An overloaded run stays in the fit (it fails the SLO, which is the
  truth at that rate) but is flagged: its attainment depends on the run length.
- **too short**: TTFT still trending upward over the last half of the window — a short run
  started on an empty server is optimistic near saturation
  (docs/statistics.md#what-a-within-run-bootstrap-cannot-see). Flagged beside the capacity.
- **coordinated omission**: generator lag (sent − scheduled) p99 above a threshold means the
  client, not the server, was the bottleneck; the offered rate was not delivered ⇒ unusable.
- **Little's law**: in-window time in flight against λ·W̄ (sojourns spilling past the window);
  from events alone it cannot see lost events (that needs an independent in-flight count).
- **offered rate**: measured from scheduled timestamps, against the nominal one. A Poisson or
  constant-rate run whose measured rate is further from the asked one than a Poisson client's
  count scatter allows (``RATE_Z`` SDs of a run of its length, and more than ``RATE_TOL``) did
  not carry the asked load ⇒ unusable: its failures say nothing about the asked level. Same when
  the tool itself says a share of the requests was dispatched off the asked schedule
  (``off_schedule`` requests, e.g. GuideLLM 0.8.1's start-up race, docs/importers.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used: the reduction's path stays light (test_cli_basic)
    import pandas as pd

#: thresholds (documented in docs/envelope.md)
TREND_P = 0.01          # one-sided p-value of the upward slope
TREND_REL = 0.20        # fitted rise over the window, relative to the mean
ATT_DRIFT = 0.02        # fitted change of attainment over a run (points) that is a drift
LITTLE_TOL = 0.10       # |L / (λW) − 1|
RATE_TOL = 0.10         # |measured / nominal − 1|
RATE_Z = 4.0            # SDs of a Poisson count, beyond which a run did not carry its asked rate
OFF_SCHEDULE_SHARE = 0.05  # share of requests the tool sent off the asked schedule, above which likewise
#: arrival processes whose count scatter is at most a Poisson process's
SCHEDULED_ARRIVALS = ("poisson", "constant")
LAG_P99_MS = 50.0       # default generator-lag p99 limit
MSER_MIN_TAIL = 10      # batches that must remain after an MSER truncation point
MIN_REQUESTS = 20       # below this a run says nothing
TREND_BATCHES = 20


@dataclass(frozen=True)
class MSERResult:
    """Truncation point of MSER-m: ``index`` observations (``batch``·d*) are warm-up."""

    index: int
    batches: int
    statistic: float
    in_second_half: bool


def mser(x, batch: int = 5) -> MSERResult:
    """MSER-m truncation (White 1997): batch means Z_j of ``batch`` consecutive values, then
    d* = argmin_d Σ_{j≥d}(Z_j − Z̄_d)² / (m−d)², searched over d ≤ m − k with k =
    min(MSER_MIN_TAIL, max(2, m // 2)) batches left; a d* in the second half of the series
    means no steady state was found.

    Why at least 10 batches left: near the end the statistic rests on k batch means and its
    sampling spread explodes (relative SD of their variance √(2/(k−1)): 141 % at k = 2, 47 % at
    k = 10). On a stationary series E[stat(d)] ≈ σ²/k, and the last two batches beat stat(0) ≈
    σ²/m by chance whenever χ²₁ < 2/m; with the other late d, 16 % of iid-normal series of 100
    batches (2 000 simulations) got d* in the second half — "no steady state" for a perfectly
    stable run, dropped from the fit. With k ≥ 10: 0.1 %, while a series that never settles
    still has its minimum in the second half."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    m = x.size // batch
    if m < 4:
        return MSERResult(0, 0, math.nan, False)
    z = x[: m * batch].reshape(m, batch).mean(axis=1)
    # suffix sums give every d in O(m)
    rz = z[::-1]
    cnt = np.arange(1, m + 1, dtype=np.float64)
    s1 = np.cumsum(rz)[::-1]
    s2 = np.cumsum(rz * rz)[::-1]
    k = cnt[::-1]  # m − d
    sse = s2 - s1 * s1 / k
    stat = sse / (k * k)
    k_min = min(MSER_MIN_TAIL, max(2, m // 2))
    d = int(np.argmin(stat[: m - k_min + 1]))
    return MSERResult(d * batch, d, float(stat[d]), d > m / 2)


def mser5(x) -> MSERResult:
    """MSER-5 (batches of five)."""
    return mser(x, 5)


@dataclass(frozen=True)
class TrendResult:
    slope: float
    p_value: float
    rel_increase: float
    trending: bool


def trend_test(y, *, p: float = TREND_P, rel: float = TREND_REL) -> TrendResult:
    """One-sided OLS slope test on batch means (upward trend ⇒ queue still growing).
    ``trending`` needs both significance (p-value < p) and size (fitted rise > rel·mean)."""
    y = np.asarray(y, dtype=np.float64)
    ok = ~np.isnan(y)
    y = y[ok]
    if y.size < 4 or np.allclose(y, y[0]):
        return TrendResult(0.0, 1.0, 0.0, False)
    t = np.arange(y.size, dtype=np.float64)
    slope, p_value = _ols_slope_greater(t, y)
    mean = float(np.mean(y))
    rise = float(slope * (y.size - 1))
    rel_inc = rise / mean if mean > 0 else math.inf
    return TrendResult(float(slope), float(p_value), rel_inc, bool(p_value < p and rel_inc > rel))


def _ols_slope_greater(x, y) -> tuple[float, float]:
    """(slope, one-sided p-value for slope > 0): ``scipy.stats.linregress(x, y,
    alternative="greater")``'s own arithmetic, step for step (tests/test_diagnostics.py checks
    them equal). Written out because every run's diagnostics call it, and importing
    ``scipy.stats`` took 0.35–0.6 s of ``capplan envelope``'s start (benchmarks/README.md)."""
    from scipy.special import stdtr
    ssxm, ssxym, _, ssym = np.cov(x, y, bias=1).flat
    if ssxm == 0.0 or ssym == 0.0:
        r = math.nan if ssxym == 0 else 0.0
    else:
        r = min(max(ssxym / np.sqrt(ssxm * ssym), -1.0), 1.0)
    slope = ssxym / ssxm
    df = x.size - 2
    tiny = 1.0e-20
    t = r * np.sqrt(df / ((1.0 - r + tiny) * (1.0 + r + tiny)))
    return float(slope), float(stdtr(df, -t))


@dataclass(frozen=True)
class Drift:
    """A trend of one metric over a run (Mann–Kendall on batch means, Sen's slope for its size):
    ``change`` is the fitted change over the run — relative to the mean for a latency, in
    attainment points for attainment; ``trending`` needs both p < ``TREND_P`` (two-sided) and a
    change larger than the metric's threshold."""

    metric: str                  # "TTFT" | "attainment"
    direction: str               # "rises" | "falls" | "flat"
    change: float
    tau: float                   # Kendall's τ of the batch means against time
    p_value: float
    trending: bool

    def sentence(self) -> str:
        size = (f"{abs(self.change):.0%} of its mean" if self.metric != "attainment"
                else f"{abs(self.change):.3f}")
        return (f"{self.metric} {self.direction} {size} over the run (Mann–Kendall "
                f"τ = {self.tau:+.2f}, p = {self.p_value:.1g})")


def drift(y, metric: str = "TTFT", *, p: float = TREND_P, rel: float = TREND_REL,
          points: float = ATT_DRIFT) -> Drift:
    """Two-sided Mann–Kendall trend test (Kendall's τ of the batch means against their order;
    Mann 1945, Kendall 1975) with Sen's slope (Sen 1968) for its size. Why rank-based: per-bin
    TTFT on a short run is heavy-tailed (one congested bin is 10× the others), which a
    least-squares slope reads as a trend; ranks do not. Batch means (``TREND_BATCHES``) keep
    the serial correlation of adjacent bins small. A latency drifts when p < ``p`` and the
    fitted change exceeds ``rel`` of its mean; attainment when it exceeds ``points``."""
    y = np.asarray(y, dtype=np.float64)
    y = y[~np.isnan(y)]
    if y.size < 4 or np.allclose(y, y[0]):
        return Drift(metric, "flat", 0.0, 0.0, 1.0, False)
    from scipy import stats as _st  # here: only a run whose MSER-5 cut fell late gets here

    t = np.arange(y.size, dtype=np.float64)
    kt = _st.kendalltau(t, y)
    tau, pv = float(kt.statistic), float(kt.pvalue)
    change = float(_st.theilslopes(y, t).slope * (y.size - 1))
    if metric != "attainment":
        mean = float(np.mean(y))
        change = change / mean if mean > 0 else math.inf
        big = abs(change) > rel
    else:
        big = abs(change) > points
    direction = "rises" if tau > 0 else "falls" if tau < 0 else "flat"
    return Drift(metric, direction, change, tau, pv, bool(pv < p and big))


def batch_means(values, weights, n_batches: int = TREND_BATCHES) -> np.ndarray:
    """Combine consecutive per-unit means (with their counts as weights) into n_batches."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    ok = ~np.isnan(v) & (w > 0)
    v, w = v[ok], w[ok]
    if v.size == 0:
        return np.zeros(0)
    nb = min(n_batches, v.size)
    edges = np.linspace(0, v.size, nb + 1).round().astype(int)
    out = np.empty(nb)
    for i in range(nb):
        sl = slice(edges[i], edges[i + 1])
        out[i] = np.sum(v[sl] * w[sl]) / np.sum(w[sl])
    return out


def littles_ratio(mean_in_flight: float, rate_rps: float, mean_sojourn_s: float) -> float:
    """L̄ / (λ·W̄): 1 in a steady state whose events are all present."""
    denom = rate_rps * mean_sojourn_s
    return float(mean_in_flight / denom) if denom > 0 else math.nan


@dataclass(frozen=True)
class RunDiagnostics:
    run_id: str
    n: int
    warmup_s: float
    warmup_source: str           # "manifest" | "mser5" | "none" | "given"
    mser_in_second_half: bool
    measured_rps: float
    nominal_rps: float | None
    rate_ratio: float
    gen_lag_p99_ms: float
    rate_z: float                # (measured − asked) in SDs of a Poisson count over the window
    off_schedule: int            # requests the tool says it sent off the asked schedule
    littles_ratio: float
    trend_p_value: float
    trend_rel_increase: float
    overloaded: bool
    too_short: bool
    duplicates: int
    usable: bool
    reason: str
    warnings: str


#: why a run is excluded for lack of a steady state: MSER-5's warm-up ended in the second half
#: *and* a trend confirms it (``drift``: the metric, direction, size and p follow the colon)
NO_STEADY_STATE = "no steady state (MSER-5's warm-up ended in the second half, and a trend)"
#: the warm-up source of a run whose MSER-5 cut fell in its second half with no trend in TTFT
#: or attainment (the whole run is used)
MSER_LATE_FLAT = "mser5 (second half, no trend: not cut)"


#: the warm-up source of a run whose MSER-5 cut fell in its second half while its queue grew
#: (TTFT rises or attainment falls) and it fails the target: kept, as an overloaded run
MSER_LATE_OVERLOADED = "mser5 (second half, overloaded: kept)"


def late_warmup_verdict(ttft_mean, ttft_n, n_good, n, target: float) -> tuple[str, bool]:
    """(warm-up source, excluded) of a run whose MSER-5 cut fell in its second half, from the
    trends over the whole run (per-unit TTFT means and SLO-good shares, ``TREND_BATCHES``
    batch means, ``drift``). TTFT first, then attainment:

    - no trend: ``MSER_LATE_FLAT``, used whole (MSER's point is noise on a short run);
    - the warm-up still decaying (TTFT falls, attainment rises): excluded, the trend named;
    - the queue still growing (TTFT rises, attainment falls): a run that fails ``target`` is
      kept as an overloaded run (it fails the SLO, the truth at that rate, and a longer run
      would fail more: ``MSER_LATE_OVERLOADED``); one that passes is excluded, the trend named —
      it passed only because it ended before its queue settled."""
    n = np.asarray(n, dtype=np.float64)
    g = np.asarray(n_good, dtype=np.float64)
    checks = (drift(batch_means(ttft_mean, ttft_n), "TTFT"),
              drift(batch_means(g / np.maximum(n, 1.0), n), "attainment"))
    hit = next((d for d in checks if d.trending), None)
    if hit is None:
        return MSER_LATE_FLAT, False
    growing = (hit.metric == "attainment") == (hit.direction == "falls")
    if not growing:
        return f"mser5: {hit.sentence()}: the warm-up was still decaying", True
    if n.sum() and g.sum() / n.sum() < target:
        return f"{MSER_LATE_OVERLOADED}: {hit.sentence()}", False
    return (f"mser5: {hit.sentence()}: it met the target only because it ended before its "
            "queue settled"), True


def rate_z(measured_rps: float, nominal_rps: float | None, span_s: float) -> float:
    """How far the measured rate lies from the asked one, in SDs of the request count a Poisson
    client asked for ``nominal_rps`` realises over ``span_s`` (nan when either is unknown)."""
    if not nominal_rps or not (span_s == span_s and span_s > 0) or measured_rps != measured_rps:
        return math.nan
    expect = nominal_rps * span_s
    return float((measured_rps - nominal_rps) * span_s / math.sqrt(expect))


def run_diagnostics(*, run_id: str, n: int, warmup_s: float, warmup_source: str,
                    mser_second_half: bool, measured_rps: float, nominal_rps: float | None,
                    gen_lag_p99_ms: float, littles: float, trend_all: TrendResult,
                    trend_end: TrendResult, duplicates: int = 0,
                    lag_limit_ms: float = LAG_P99_MS, closed_loop: bool = False,
                    span_s: float = math.nan, arrival: str = "unknown",
                    off_schedule: int = 0) -> RunDiagnostics:
    """One verdict per run: which flags make it unusable (excluded, with the reason) and
    which are warnings shown beside the result."""
    reasons, warns = [], []
    if n < MIN_REQUESTS:
        reasons.append(f"only {n} requests in the measurement window (need ≥ {MIN_REQUESTS})")
    if duplicates:
        reasons.append(f"{duplicates} duplicated request_id(s): events recorded twice")
    if mser_second_half:
        reasons.append(f"{NO_STEADY_STATE}: {warmup_source.removeprefix('mser5: ')}")
    elif warmup_source == MSER_LATE_FLAT:
        warns.append("MSER-5 put the end of the warm-up in the second half, but neither TTFT "
                     "nor attainment shows a trend over the run: the whole run is used")
    elif warmup_source.startswith(MSER_LATE_OVERLOADED):
        warns.append("MSER-5 found no steady state and "
                     f"{warmup_source.removeprefix(MSER_LATE_OVERLOADED + ': ')}: overloaded, "
                     "kept (it fails the target, the truth at that rate); the whole run is used")
    if not closed_loop and gen_lag_p99_ms == gen_lag_p99_ms and gen_lag_p99_ms > lag_limit_ms:
        reasons.append(f"generator lag p99 {gen_lag_p99_ms:.0f} ms > {lag_limit_ms:.0f} ms: "
                       "the client, not the server, was the bottleneck (coordinated omission)")
    rate_ratio = (measured_rps / nominal_rps) if nominal_rps else math.nan
    z = rate_z(measured_rps, nominal_rps, span_s)
    off_rate = (not closed_loop and arrival in SCHEDULED_ARRIVALS and abs(z) > RATE_Z
                and abs(rate_ratio - 1) > RATE_TOL)
    if off_rate:
        reasons.append(f"the client did not send at the asked rate: {measured_rps:.3g} req/s "
                       f"measured vs {nominal_rps:.3g} asked ({rate_ratio - 1:+.0%}, {z:+.1f} SDs "
                       f"of a Poisson client over {span_s:.0f} s): its load is not the asked "
                       "level; rerun it (a busy load-generator machine, or a client bug)")
    total = max(n, off_schedule)  # the off-schedule ones may lie in the cut warm-up
    if not closed_loop and off_schedule and off_schedule / total > OFF_SCHEDULE_SHARE:
        reasons.append(f"{off_schedule} requests (against {n} in the window) were sent off the "
                       "asked schedule, by the tool's own record (dispatched at once): its load "
                       "is not the asked level; rerun it")
    elif off_schedule:
        warns.append(f"{off_schedule} request(s) sent off the asked schedule by the tool's own "
                     f"record (≤ {OFF_SCHEDULE_SHARE:.0%}: kept)")
    if (not closed_loop and not off_rate and rate_ratio == rate_ratio
            and abs(rate_ratio - 1) > RATE_TOL):
        warns.append(f"measured rate {measured_rps:.3g} req/s vs nominal {nominal_rps:.3g} "
                     f"({(rate_ratio - 1):+.0%}); the measured rate is used")
    if trend_all.trending:
        warns.append(f"overloaded / non-stationary: TTFT rises {trend_all.rel_increase:+.0%} "
                     f"over the run (p = {trend_all.p_value:.1g}); attainment depends on run length")
    too_short = bool(trend_end.trending)
    if too_short:
        warns.append("too short to reach steady state: TTFT still trending at the end")
    if littles == littles and abs(littles - 1) > LITTLE_TOL and not trend_all.trending:
        warns.append(f"Little's law mismatch: L/(λW) = {littles:.2f} (sojourns spill past the "
                     "window, or clock problems)")
    return RunDiagnostics(
        run_id=run_id, n=int(n), warmup_s=float(warmup_s), warmup_source=warmup_source,
        mser_in_second_half=bool(mser_second_half), measured_rps=float(measured_rps),
        nominal_rps=nominal_rps, rate_ratio=float(rate_ratio),
        gen_lag_p99_ms=float(gen_lag_p99_ms), rate_z=float(z), off_schedule=int(off_schedule),
        littles_ratio=float(littles),
        trend_p_value=trend_all.p_value, trend_rel_increase=trend_all.rel_increase,
        overloaded=trend_all.trending, too_short=too_short, duplicates=int(duplicates),
        usable=not reasons, reason="; ".join(reasons), warnings="; ".join(warns))


def to_frame(diags) -> pd.DataFrame:
    """Diagnostics of all runs as a frame (one row per run)."""
    import pandas as pd
    from dataclasses import asdict

    return pd.DataFrame([asdict(d) for d in diags])
