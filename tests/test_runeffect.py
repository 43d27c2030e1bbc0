"""capplan.runeffect: the between-run model (marginal attainment, τ estimate, rate noise)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import expit

from capplan import runeffect as rfx


def test_marginal_matches_numeric_integral():
    for y, tau in ((4.6, 0.0), (4.6, 0.8), (-1.0, 1.5), (7.0, 2.0)):
        want = integrate.quad(lambda z: expit(y + tau * z) * stats.norm.pdf(z), -12, 12)[0]
        assert rfx.marginal(y, tau) == pytest.approx(want, abs=1e-6)
    # hand case: τ = 0 is the logistic itself; the mean run is below the median run up high
    assert rfx.marginal(0.0, 0.0) == pytest.approx(0.5)
    assert rfx.marginal(4.6, 0.8) < expit(4.6)
    assert rfx.marginal(-4.6, 0.8) > expit(-4.6)
    # symmetric: m(−y) = 1 − m(y)
    assert rfx.marginal(-2.0, 1.1) == pytest.approx(1 - rfx.marginal(2.0, 1.1), abs=1e-12)


def _runs(tau, n_runs, seed, n=3000):
    rng = np.random.default_rng(seed)
    x = np.repeat(np.linspace(5.0, 6.5, n_runs // 3 if n_runs >= 3 else 1), 3)[:n_runs]
    eta = 4.6 - 4.0 * (x - 5.7) + tau * rng.standard_normal(x.size)
    v = rng.binomial(n, 1 - expit(eta))
    return np.full(x.size, float(n)), v.astype(float), x


def test_estimate_recovers_tau_from_many_runs():
    n, v, x = _runs(0.8, 45, seed=1)
    e = rfx.estimate(n, v, np.ones_like(n), x)
    assert e.source == "sweep"
    assert 0.55 <= e.tau <= 1.1
    assert e.tau_low < 0.8 < e.tau_high
    assert e.slope == pytest.approx(-4.0, abs=0.6)


def test_estimate_finds_no_run_effect_in_binomial_runs():
    n, v, x = _runs(0.0, 45, seed=2)
    e = rfx.estimate(n, v, np.ones_like(n), x)
    assert e.tau <= 0.15


def test_estimate_falls_back_to_the_prior_with_two_runs():
    e = rfx.estimate([3000, 3000], [10, 200], [1, 1], [5.5, 6.0])
    assert e.source == "prior"
    # half-normal(0.7): median 0.674 × 0.7 = 0.472
    assert e.tau == pytest.approx(0.674 * rfx.PRIOR_SCALE, abs=0.05)
    assert rfx.PRIOR_SCALE == 0.7


def test_dispersion_index_poisson_and_gamma():
    rng = np.random.default_rng(3)
    for cv, want in ((1.0, 1.0), (2.0, 4.0)):
        idc = []
        for _ in range(30):
            shape = 1 / cv**2
            t = np.cumsum(rng.gamma(shape, 1 / shape, 20_000))
            units = np.arange(1024) * t.size // 1024
            idc.append(rfx.dispersion_index(t[units], np.diff(np.append(units, t.size))))
        assert np.mean(idc) == pytest.approx(want, rel=0.2)
    assert math.isnan(rfx.dispersion_index([], []))
    v = rfx.realized_rate_var(1.0, [5.0, 6.0], [600.0, 600.0])
    assert v == pytest.approx([5 / 600, 6 / 600])


def test_from_samples_subtracts_the_binomial_part():
    rng = np.random.default_rng(4)
    att = {}
    nn = {}
    for rate, eta in ((5.5, 5.0), (6.0, 3.0)):
        e = eta + 0.7 * rng.standard_normal(400)
        n = np.full(400, 4000.0)
        att[rate] = 1 - rng.binomial(4000, 1 - expit(e)) / 4000
        nn[rate] = n
    r = rfx.RunEffect.from_samples(att, nn)
    assert r.source == "twin"
    assert r.tau == pytest.approx(0.7, abs=0.1)


def test_from_samples_keeps_runs_without_violations():
    """Near the crossing some simulated runs have no violation at all; they enter with the
    same (k + ½) / (n + 1) point as their logit, not as infinitely noisy (which zeroed τ at
    every rate that had one: a twin of one replica gave τ = 0)."""
    rng = np.random.default_rng(4)
    att, nn = {}, {}
    for rate, eta in ((5.5, 5.5), (6.0, 4.5)):
        e = eta + 0.7 * rng.standard_normal(200)
        att[rate] = 1 - rng.binomial(1000, 1 - expit(e)) / 1000
        nn[rate] = np.full(200, 1000.0)
    assert all(np.any(a == 1.0) for a in att.values())
    r = rfx.RunEffect.from_samples(att, nn)
    assert r.tau == pytest.approx(0.7, abs=0.15)


def test_apply_targets_the_mean_run():
    """The marginal attainment of an informative run is below its own (median-run) value;
    runs below the window and without violations keep their replicates."""
    n = np.full(5, 3000.0)
    k = np.array([3000, 3000, 2990, 2880, 2400], float)
    x = np.array([3.0, 4.0, 5.0, 6.0, 7.0])
    reps = 200
    rep = np.clip(k / n + 0.002 * np.random.default_rng(0).standard_normal((reps, 5)), 0, 1)
    fit = rfx.apply(n, k, x, x, rep, np.ones(5), 0.99, rng=np.random.default_rng(1),
                    effect=rfx.RunEffect.fixed(0.8))
    assert not fit.applied[0] and not fit.applied[1]
    assert np.allclose(fit.replicates[:, 0], rep[:, 0])
    assert fit.marginal[2] < (k[2] + 0.5) / (n[2] + 1)
    assert fit.marginal[2] == pytest.approx(rfx.marginal(rfx.logit_point(k[2], n[2]), 0.8))
