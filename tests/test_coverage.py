"""Coverage of the C_SLO interval on simulated sweeps with a known true capacity.

Model (vectorised, no synth simulator): at offered rate λ a request is SLO-good iff a latent
AR(1) Gaussian series Z_t (unit marginal variance, φ = 0.9: time-correlated requests) stays
below c(λ), so attainment(λ) = Φ(c(λ)). We pick c so that logit attainment is linear in λ:
logit a(λ) = logit(target) − β(λ − λ*). The true C_SLO is then exactly λ* — and the
logit-linear interpolation between any two tested rates around λ* reproduces it, so an interval
that misses λ* misses because of sampling error, not interpolation bias.

Claims checked (issue 4, "Done when"): the nominal 95 % block-bootstrap interval covers λ* in
90–98 % of ≥ 200 replicated sweeps, and an iid bootstrap on the *same* sweeps under-covers.
This model has no between-run variation (every run is an exact draw of the same stationary
process), so it checks the within-run part of the interval (``method="within-run"``); the
default interval adds the between-run variation a realistic sweep has (docs/envelope.md
"Coverage"), which here only widens it — its one-sided bound must still hold.
"""

from __future__ import annotations

import numpy as np
from scipy import signal, special, stats

from capplan.envelope import fit_from_stats
from capplan.reduce import stats_from_series

TARGET = 0.9
LAMBDA_STAR = 7.0
BETA = 0.5
RATES = np.array([2.0, 4.0, 6.0, 8.0, 10.0, 12.0])
N_PER_RUN = 5000
PHI = 0.8
N_SWEEPS = 200
REPS = 500


def true_attainment(lam):
    return special.expit(special.logit(TARGET) - BETA * (lam - LAMBDA_STAR))


def simulate_sweeps(n_sweeps: int, seed: int, latent: bool = False):
    """(sweeps × rates × n) 0/1 good indicators from AR(1) latents, all at once (and the
    latents, the log latency that drives them, when ``latent``)."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((n_sweeps, RATES.size, N_PER_RUN)) * np.sqrt(1 - PHI**2)
    z = signal.lfilter([1.0], [1.0, -PHI], e, axis=-1)
    z[..., :] += 0.0
    # start in the stationary distribution: add the decayed stationary initial value
    z0 = rng.standard_normal((n_sweeps, RATES.size, 1))
    z += z0 * PHI ** np.arange(1, N_PER_RUN + 1)
    c = stats.norm.ppf(true_attainment(RATES))[None, :, None]
    good = (z <= c).astype(np.float64)
    return (good, z) if latent else good


def _fit(good_runs, scheme, seed, z_runs=None, method="within-run"):
    # with the latent, the block length is max(PW on good, PW on log latency = z), as in
    # reduce_study
    runs = [{"run_id": f"r{j}", "load_level": lam, "good": g}
            for j, (lam, g) in enumerate(zip(RATES, good_runs))]
    if z_runs is not None:
        for r, z in zip(runs, z_runs):
            r["latency"] = np.exp(z)
    st = stats_from_series(runs, f"ttft_ms=1000,attainment={TARGET}")
    return fit_from_stats(st, st.slo, reps=REPS, seed=seed, scheme=scheme, method=method).cslo


def test_true_curve_crosses_at_lambda_star():
    # the simulation's own truth: a(λ*) = target, and the model marginal is right
    assert np.isclose(true_attainment(LAMBDA_STAR), TARGET)
    g = simulate_sweeps(20, seed=1)
    emp = g.mean(axis=(0, 2))
    assert np.allclose(emp, true_attainment(RATES), atol=0.02)


def test_block_bootstrap_covers_and_iid_undercovers():
    goods, zs = simulate_sweeps(N_SWEEPS, seed=2024, latent=True)
    hit_block, hit_iid, width_block, width_iid, lb_ok = [], [], [], [], []
    for s in range(N_SWEEPS):
        cb = _fit(goods[s], "circular", seed=s, z_runs=zs[s])
        ci = _fit(goods[s], "iid", seed=s)
        assert cb.status == "bracketed"
        hit_block.append(cb.ci_low <= LAMBDA_STAR <= cb.ci_high)
        hit_iid.append(ci.ci_low <= LAMBDA_STAR <= ci.ci_high)
        lb_ok.append(cb.lower_bound <= LAMBDA_STAR)
        width_block.append(cb.ci_high - cb.ci_low)
        width_iid.append(ci.ci_high - ci.ci_low)
    cov_block = float(np.mean(hit_block))
    cov_iid = float(np.mean(hit_iid))
    print(f"coverage block {cov_block:.3f} iid {cov_iid:.3f}; one-sided lb {np.mean(lb_ok):.3f}; "
          f"width block {np.mean(width_block):.3f} iid {np.mean(width_iid):.3f}")
    assert 0.90 <= cov_block <= 0.98
    assert cov_iid < 0.85
    assert cov_iid < cov_block - 0.08
    # the one-sided 95 % lower bound is below the truth about 95 % of the time
    assert 0.90 <= float(np.mean(lb_ok)) <= 0.99
    assert np.mean(width_iid) < 0.75 * np.mean(width_block)


def test_per_run_attainment_ci_covers():
    """Per-run 95 % attainment CIs (both schemes) cover the true attainment of an AR(1) run
    at about the nominal rate; the iid (binomial) interval does not."""
    from capplan import bootstrap as B

    n_runs, n, p_true = 300, 4000, 0.95
    rng = np.random.default_rng(77)
    e = rng.standard_normal((n_runs, n)) * np.sqrt(1 - PHI**2)
    z = signal.lfilter([1.0], [1.0, -PHI], e, axis=-1)
    z += rng.standard_normal((n_runs, 1)) * PHI ** np.arange(1, n + 1)
    good = (z <= stats.norm.ppf(p_true)).astype(float)
    hits = {"circular": 0, "stationary": 0, "iid": 0}
    for i in range(n_runs):
        g = good[i]
        bl = B.optimal_block_length(g)
        for scheme in (B.Circular(), B.Stationary()):
            R = scheme.resample(n, scheme.block_units(bl, 1.0), 300, np.random.default_rng([i, 1]))
            lo, hi = B.percentile_ci(R.sums(g) / n)
            hits[scheme.name] += lo <= p_true <= hi
        k = g.sum()
        lo, hi = B.percentile_ci(np.random.default_rng(i).binomial(n, k / n, 300) / n)
        hits["iid"] += lo <= p_true <= hi
    cov = {k: v / n_runs for k, v in hits.items()}
    print("per-run coverage", cov)
    assert 0.88 <= cov["circular"] <= 0.98
    assert 0.88 <= cov["stationary"] <= 0.98
    assert cov["iid"] < 0.75


def test_run_effect_interval_keeps_its_bound_without_between_run_variation():
    """The default (run-effect) interval on the same stylised sweeps: with no between-run
    variation to find it may only be wider, so its lower bound holds at least as often and
    every interval contains its estimate."""
    goods, zs = simulate_sweeps(40, seed=2025, latent=True)
    lb_ok, hit = [], []
    for s in range(40):
        c = _fit(goods[s], "circular", seed=s, z_runs=zs[s], method="run-effect")
        assert c.ci_low <= c.estimate <= c.ci_high and c.lower_bound <= c.estimate
        lb_ok.append(c.lower_bound <= LAMBDA_STAR)
        hit.append(c.ci_low <= LAMBDA_STAR <= c.ci_high)
    assert np.mean(lb_ok) >= 0.9
    assert np.mean(hit) >= 0.9
