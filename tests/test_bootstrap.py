"""Block bootstrap engine against the reference (``arch.bootstrap``, a test-only dependency)
and against exact computations."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from arch.bootstrap import CircularBlockBootstrap, StationaryBootstrap, optimal_block_length
from scipy import signal

from capplan import bootstrap as B
from capplan import sketch
from capplan.envelope import fit_envelope
from capplan.errors import SpecError
from capplan.io import manifest_dict, write_study


def ar1(n, phi, seed):
    rng = np.random.default_rng(seed)
    z = signal.lfilter([1.0], [1.0, -phi], rng.standard_normal(n) * math.sqrt(1 - phi**2))
    return z


@pytest.mark.parametrize("n,phi,thr", [(60, 0.5, 0.0), (500, 0.9, 1.0), (5000, 0.95, 1.5),
                                       (20000, 0.0, 1.0), (3000, 0.7, -2.0)])
def test_politis_white_equals_arch(n, phi, thr):
    x = (ar1(n, phi, n) > thr).astype(float)  # the 0/1 indicator series
    ref = optimal_block_length(x)
    got = B.optimal_block_length(x)
    assert got.stationary == pytest.approx(ref["stationary"].iloc[0], rel=1e-9)
    assert got.circular == pytest.approx(ref["circular"].iloc[0], rel=1e-9)


def test_politis_white_constant_series_is_one():
    assert B.optimal_block_length(np.ones(1000)) == B.BlockLength(1.0, 1.0)


@pytest.mark.parametrize("n", [300, 70_000])  # one transform; overlap-save blocks (n ≥ 2^16)
def test_autocovariances_by_fft_equal_direct(n):
    x = ar1(n, 0.6, 3)
    e = x - x.mean()
    max_lag = min(333, n // 2)
    lags = [k for k in (0, 1, 2, 7, 19, 150, 333) if k <= max_lag]
    direct = [e[k:] @ e[: x.size - k] / x.size for k in lags]
    got = B.autocovariances(x, max_lag)
    assert got[lags] == pytest.approx(direct, rel=1e-9, abs=1e-12)


def test_politis_white_equals_arch_on_a_long_series():
    x = (ar1(70_000, 0.97, 8) > 1.0).astype(float)  # the blocked autocovariances
    ref = optimal_block_length(x)
    got = B.optimal_block_length(x)
    assert got.circular == pytest.approx(ref["circular"].iloc[0], rel=1e-9)
    assert got.stationary == pytest.approx(ref["stationary"].iloc[0], rel=1e-9)


@pytest.mark.parametrize("scheme,cls", [(B.Circular(), CircularBlockBootstrap),
                                        (B.Stationary(), StationaryBootstrap)])
def test_replicates_identical_to_arch(scheme, cls):
    x = (ar1(700, 0.8, 5) < 1.2).astype(float)
    reps, b = 120, 9
    ref = cls(b, x, seed=np.random.default_rng(11)).apply(np.mean, reps).ravel()
    R = scheme.resample(x.size, b, reps, np.random.default_rng(11))
    assert np.array_equal(R.sums(x) / x.size, ref) or np.allclose(R.sums(x) / x.size, ref,
                                                                  rtol=0, atol=1e-15)
    # the count matrix equals how often arch draws each observation
    idx = np.arange(x.size, dtype=float)
    ref_counts = cls(b, idx, seed=np.random.default_rng(11)).apply(
        lambda v: np.bincount(v.astype(int), minlength=x.size), reps)
    C = R.counts()
    assert np.array_equal(C, ref_counts)
    assert C.dtype == np.float64 and np.all(C.sum(axis=1) == x.size)


def test_schemes_from_names_once_at_the_edge():
    assert B.scheme_from_name("circular") == B.Circular()
    assert B.scheme_from_name("Stationary", block_len=12) == B.Stationary(12.0)
    assert isinstance(B.scheme_from_name("iid"), B.IID)
    s = B.Stationary(7.0)
    assert B.scheme_from_name(s) is s
    with pytest.raises(SpecError, match="unknown bootstrap scheme"):
        B.scheme_from_name("bogus")
    with pytest.raises(SpecError, match="block length"):
        B.scheme_from_name("circular", block_len=0.5)
    # block lengths: the override, else the run's Politis–White length for the scheme
    pw = B.BlockLength(stationary=30.0, circular=24.0)
    assert B.Circular().block_requests(pw) == 24.0
    assert B.Stationary().block_requests(pw) == 30.0
    assert B.Circular(50.0).block_requests(pw) == 50.0
    assert B.IID().block_requests(pw) == 1.0 and B.IID().block_units(pw, 4.0) == 1.0
    assert B.Circular().block_units(pw, 4.0) == 6.0  # lattice sub-blocks of 4 requests
    assert B.Circular().block_units(pw, 100.0) == 1.0  # never below one unit
    # Stationary changes only the draws (arch: one method overridden)
    own = [k for k, v in vars(B.Stationary).items() if callable(v) and not k.startswith("__")]
    assert own == ["_draw"]


def test_block_sums_equal_count_matrix_products():
    rng = np.random.default_rng(0)
    V = rng.random((257, 6))
    for scheme in (B.Circular(), B.Stationary(), B.IID()):
        R = scheme.resample(257, 5.5, 40, 3)
        C = R.counts()
        assert R.sums(V) == pytest.approx(C @ V)
        assert R.sums(V, chunk=50) == pytest.approx(C @ V)
        assert B.ratio_replicates(R, V[:, 0], V[:, 1]) == pytest.approx(
            B.ratio_replicates(C, V[:, 0], V[:, 1]))


def test_count_matrix_exact_above_2_pow_24():
    # float32 cannot hold 2^24 + 1; our counts and sums stay float64 by default
    R = B.Circular().resample(4, 1, 2, 0)
    v = np.full(4, 2.0**24 + 1)
    assert np.all(R.sums(v) == 4 * (2.0**24 + 1))
    assert R.counts().dtype == np.float64


def test_attainment_ci_equals_arch_end_to_end(tmp_path):
    """Oracle (issue 4): the per-run attainment CI of fit_envelope equals arch's
    CircularBlockBootstrap percentile CI with the same block length and the same draws."""
    n, reps, seed, b = 900, 300, 7, 12
    z = ar1(n, 0.9, 42)
    ttft = 800 * np.exp(0.6 * z)
    sched = (np.arange(n) * 2.5e8).astype(np.int64)
    ev = pd.DataFrame({
        "run_id": "r0", "request_id": [f"q{i}" for i in range(n)], "scheduled_ns": sched,
        "sent_ns": sched, "first_token_ns": sched + (ttft * 1e6).astype(np.int64),
        "last_token_ns": sched + (ttft * 1e6).astype(np.int64) + 10**9,
        "input_tokens": 10, "output_tokens": 20, "status": "ok"})
    path = write_study(tmp_path / "s", manifest_dict("o", [{"run_id": "r0", "offered_rps": 4.0,
                                                              "warmup_s": 0.0}]), ev)
    env = fit_envelope(path, "ttft_ms=1000,attainment=0.9", reps=reps, seed=seed, block_len=b)
    row = env.runs.iloc[0]
    assert row["unit_size"] == 1
    good = (np.rint(ttft * 1e6) / 1e6 <= 1000).astype(float)  # ns-rounded, as stored
    assert row["n_good"] == good.sum()
    # the run's stream is default_rng([seed, run_index])
    bs = CircularBlockBootstrap(b, good, seed=np.random.default_rng([seed, 0]))
    lo, hi = bs.conf_int(np.mean, reps, method="percentile").ravel()
    assert row["att_ci_low"] == pytest.approx(lo, abs=1e-12)
    assert row["att_ci_high"] == pytest.approx(hi, abs=1e-12)
    # with Politis–White chosen automatically, b = max(arch's optimal_block_length on the 0/1
    # good series, arch's on the log-TTFT series as log-bucket keys — the log up to α)
    env2 = fit_envelope(path, "ttft_ms=1000,attainment=0.9", reps=50, seed=seed)
    r2 = env2.runs.iloc[0]
    b_good = optimal_block_length(good)["circular"].iloc[0]
    ttft_stored = np.rint(ttft * 1e6) / 1e6
    b_lat = optimal_block_length(sketch.keys(ttft_stored).astype(float))["circular"].iloc[0]
    assert r2["block_len_good"] == pytest.approx(b_good, rel=1e-9)
    assert r2["block_len_latency"] == pytest.approx(b_lat, rel=1e-9)
    assert r2["block_metric"] == "ttft"
    assert r2["block_len"] == pytest.approx(max(b_good, b_lat), rel=1e-9)
    assert b_lat != pytest.approx(b_good, rel=0.01)  # the two really differ here


def test_histogram_p99_ci_close_to_exact():
    """Oracle (issue 4): p99 CI read from per-unit log-bucket histograms is within 0.2 % of
    the exact CI computed from the raw values with the very same replicates."""
    n, units, reps = 60_000, 600, 200
    x = 400 * np.exp(0.5 * ar1(n, 0.95, 9))
    s = n // units
    unit = np.arange(n) // s
    # per-unit histograms (tail above the 95th percentile, plus a below count)
    k = sketch.keys(x)
    k_lo = int(np.quantile(k, 0.95, method="inverted_cdf"))
    k_hi = int(k.max())
    H = np.zeros((units, k_hi - k_lo + 1))
    tail = k >= k_lo
    np.add.at(H, (unit[tail], k[tail] - k_lo), 1.0)
    below = np.bincount(unit, minlength=units) - H.sum(axis=1)
    R = B.Circular().resample(units, 8, reps, np.random.default_rng(1))
    q_hist = B.quantile_replicates(R, H, k_lo, 0.99, below=below)
    # exact: weighted inverse-CDF p99 of the raw values with each unit's replicate count
    C = R.counts()
    order = np.argsort(x)
    W = C[:, unit[order]]
    cw = np.cumsum(W, axis=1)
    idx = (cw < 0.99 * cw[:, -1:]).sum(axis=1)
    q_exact = x[order][idx]
    lo_h, hi_h = B.percentile_ci(q_hist)
    lo_e, hi_e = B.percentile_ci(q_exact)
    assert lo_h == pytest.approx(lo_e, rel=2e-3)
    assert hi_h == pytest.approx(hi_e, rel=2e-3)


def test_clopper_pearson_closed_forms():
    # zero failures: lower = (α/2)^(1/n); zero successes: upper = 1 − (α/2)^(1/n)
    lo, hi = B.clopper_pearson(1000, 1000, 0.95)
    assert lo == pytest.approx(0.025 ** (1 / 1000)) and hi == 1.0
    lo, hi = B.clopper_pearson(0, 100, 0.95)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 100))
    # rule of three, one-sided 95 %: 1 − 0.05^(1/n) ≈ 3/n
    lo1, _ = B.clopper_pearson(300, 300, 0.90)
    assert 1 - lo1 == pytest.approx(3 / 300, rel=0.02)


def test_design_effect_and_n_eff():
    assert B.design_effect(0.09 / 100, 0.9, 100) == pytest.approx(1.0)
    assert B.design_effect(5 * 0.09 / 100, 0.9, 100) == pytest.approx(5.0)
    assert math.isnan(B.design_effect(0.0, 1.0, 100))
    assert B.n_effective(1000, 4.0) == 250.0
    assert B.n_effective(1000, 0.5) == 1000.0  # never inflates the sample
    assert B.n_effective(1000, math.nan) == 1000.0


def test_percentile_ci_and_lower_bound_match_numpy():
    v = np.arange(1001, dtype=float)
    assert B.percentile_ci(v, 0.9) == pytest.approx((50.0, 950.0))
    assert B.lower_bound(v, 0.95) == pytest.approx(50.0)


def test_seed_reproducible():
    for scheme in (B.Circular(), B.Stationary()):
        a = scheme.resample(100, 4, 10, 5).counts()
        b = scheme.resample(100, 4, 10, 5).counts()
        assert np.array_equal(a, b)


def test_ratio_replicates_shapes_with_2d_denominator():
    """A 2-D denominator used to be broadcast as (reps × 1 × k) against the numerator; every
    num/den shape combination is checked here against explicit column-by-column ratios."""
    rng = np.random.default_rng(3)
    units, reps, k = 50, 30, 3
    num = rng.random((units, k))
    den = 1.0 + rng.random((units, k))
    for counts in (B.Circular().resample(units, 4, reps, 1),
                   B.Circular().resample(units, 4, reps, 1).counts()):
        C = counts if isinstance(counts, np.ndarray) else counts.counts()
        both = B.ratio_replicates(counts, num, den)
        assert both.shape == (reps, k)
        assert both == pytest.approx((C @ num) / (C @ den))
        one_num = B.ratio_replicates(counts, num[:, 0], den)
        assert one_num.shape == (reps, k)
        assert one_num == pytest.approx((C @ num[:, 0])[:, None] / (C @ den))
        one_den = B.ratio_replicates(counts, num, den[:, 0])
        assert one_den.shape == (reps, k)
        assert one_den == pytest.approx((C @ num) / (C @ den[:, 0])[:, None])
        flat = B.ratio_replicates(counts, num[:, 1], den[:, 1])
        assert flat.shape == (reps,)
        assert flat == pytest.approx(both[:, 1])
    with pytest.raises(ValueError):
        B.ratio_replicates(C, num, den[:, :2])


def test_block_length_is_the_max_over_good_and_log_latencies():
    """Rare violations in bursts: PW on the 0/1 series is far too short (its autocorrelations
    are mostly noise), PW on the log latency series sees the dependence; the run's block length
    is the largest over good and every latency series given (TTFT and TPOT in reduce_study),
    missing values reading as the series' largest."""
    from capplan.reduce import FINE_UNITS, block_length, max_length

    n = 16000  # per-request series up to FINE_UNITS (past it: test_reduce's fine-unit test)
    assert n <= FINE_UNITS
    z = ar1(n, 0.97, 5)
    ttft = 500 * np.exp(0.5 * z)
    lim = float(np.quantile(ttft, 0.995))  # 0.5 % violations, clustered in the AR(1) peaks
    good = (ttft <= lim).astype(float)
    bg, bl, m = block_length(good, {"ttft": ttft})
    ref_g = optimal_block_length(good)["circular"].iloc[0]
    ref_l = optimal_block_length(np.log(ttft))["circular"].iloc[0]
    assert bg.circular == pytest.approx(ref_g, rel=1e-9)
    assert bl.circular == pytest.approx(ref_l, rel=1e-9) and m == "ttft"
    assert bl.circular > 2 * bg.circular  # the 0/1 series underestimates
    assert bl.circular <= math.ceil(min(3 * math.sqrt(n), n / 3))  # PW's cap
    assert max_length(bg, bl).circular == bl.circular
    # with log-bucket keys: every series counts, whichever limit binds; a strongly dependent
    # TPOT (no limit of its own) sets the block when it is the most dependent
    kt = sketch.keys(ttft)
    tpot = 40 * np.exp(0.3 * ar1(n, 0.995, 6))
    kp = sketch.keys(tpot)
    kp[::500] = 32767  # failed: no TPOT
    _, b2, m2 = block_length(good, {"ttft": kt, "tpot": kp})
    filled = np.where(kp == 32767, kp[kp != 32767].max(), kp).astype(float)
    ref_p = optimal_block_length(filled)["circular"].iloc[0]
    ref_t = optimal_block_length(kt.astype(float))["circular"].iloc[0]
    assert ref_p > ref_t and m2 == "tpot"
    assert b2.circular == pytest.approx(ref_p, rel=1e-9)
    assert b2.stationary == pytest.approx(max(
        optimal_block_length(filled)["stationary"].iloc[0],
        optimal_block_length(kt.astype(float))["stationary"].iloc[0]), rel=1e-9)


def test_bias_corrected_interval_hand_computed():
    """Replicates exactly N(0, 1) (quantile grid) and an estimate of 0.5: z0 = Φ⁻¹(Φ(0.5)) =
    0.5, so the BC ends are the replicates' quantiles at Φ(2·0.5 ∓ 1.96), i.e. −0.96 and 2.96;
    at an estimate equal to the replicates' median BC is the percentile interval."""
    from scipy.stats import norm

    v = norm.ppf((np.arange(200_000) + 0.5) / 200_000)
    lo, hi = B.bias_corrected_ci(v, 0.5, 0.95)
    assert lo == pytest.approx(1.0 - 1.959964, abs=2e-3)
    assert hi == pytest.approx(1.0 + 1.959964, abs=2e-3)
    assert B.bias_corrected_ci(v, 0.0, 0.95) == pytest.approx(B.percentile_ci(v, 0.95), abs=1e-3)
    assert all(math.isnan(x) for x in B.bias_corrected_ci([], 0.0))


def test_special_functions_equal_the_scipy_stats_distributions():
    """The envelope's path reads the normal, beta and binomial quantiles from scipy.special
    (importing scipy.stats takes 0.35–0.6 s of `capplan envelope`'s start): the same numbers as the
    distributions' methods, bit for bit for the beta quantiles (Clopper–Pearson) and the normal,
    and the same early-stopping N for every (p, t, confidence) the product asks."""
    import itertools
    from scipy import stats

    from capplan.earlystop import n_min

    rng = np.random.default_rng(3)
    a = 1.0 - 0.95
    for _ in range(500):
        n = float(rng.uniform(1, 1e6))
        k = float(rng.uniform(0, n))
        lo, hi = B.clopper_pearson(k, n, 0.95)
        assert lo == (0.0 if k <= 0 else float(stats.beta.ppf(a / 2, k, n - k + 1)))
        assert hi == (1.0 if k >= n else float(stats.beta.ppf(1 - a / 2, k + 1, n - k)))
    v = rng.normal(size=5000)
    p0 = float(np.mean(v < 0.1))
    z0, za = stats.norm.ppf(p0), stats.norm.ppf(0.975)
    ref = np.percentile(v, [100 * stats.norm.cdf(2 * z0 - za), 100 * stats.norm.cdf(2 * z0 + za)])
    assert B.bias_corrected_ci(v, 0.1, 0.95) == (float(ref[0]), float(ref[1]))

    def by_stats(p, t, c):  # the smallest N with P[Binomial(N, 1 − p) ≤ t] ≤ 1 − c, by bisection
        alpha, q = 1 - c, 1 - p
        if t == 0:
            return math.ceil(math.log(alpha) / math.log(p))
        lo, hi = t + 1, t + 1
        while stats.binom.cdf(t, hi, q) > alpha:
            hi *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if stats.binom.cdf(t, mid, q) <= alpha else (mid + 1, hi)
        return lo

    for p, t, c in itertools.product((0.5, 0.9, 0.95, 0.99, 0.999), (0, 1, 2, 5, 17), (0.95, 0.99)):
        assert n_min(p, t, c) == by_stats(p, t, c), (p, t, c)
