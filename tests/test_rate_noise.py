"""The realised-rate noise of each level's x in the C_SLO replicates (issue 32): a level's x is
the mean *measured* rate of its runs, itself a draw around the asked rate the truth is defined
at; held fixed, 60-s Poisson sweeps' two-sided interval covered 0.75 (docs/envelope.md, "Short
runs from real clients"). Hand-checked small cases here; the coverage itself in the slow test
and benchmarks/coverage_short_runs.py."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.special import logit

from capplan.envelope import core as ev

ROOT = Path(__file__).parents[1]


def _points(level, rate_var):
    n = np.full(len(level), 600.0)
    return ev.Points(run_id=np.array([f"r{i}" for i in range(len(level))]),
                      level=np.asarray(level, float), x_rate=np.asarray(level, float), n=n,
                      n_good=n, good_rep=np.ones((4, len(level))) * 600.0,
                      n_rep=np.ones((4, len(level))) * 600.0, n_eff=n,
                      rate_var=np.asarray(rate_var, float))


def test_level_x_noise_sd_by_hand():
    """Level 10 has two runs with realised-rate variances 0.04 and 0.12 (req/s)²: the mean run
    variance 0.08 over 2 runs, SD √0.04 = 0.2; level 11 one run, 0.09: SD 0.3. The draws are
    those SDs times the generator's normals, in level order."""
    pts = _points([10.0, 10.0, 11.0], [0.04, 0.12, 0.09])
    got = ev._x_noise(pts, np.array([10.0, 11.0]), np.random.default_rng(3), 5)
    z = np.random.default_rng(3).standard_normal((5, 2))
    assert np.allclose(got, z * np.array([0.2, 0.3]))
    # no realised-rate variance (in-memory series without times): no noise
    assert not ev._x_noise(_points([10.0, 11.0], [0.0, 0.0]), np.array([10.0, 11.0]),
                           np.random.default_rng(3), 5).any()


def test_crossing_interpolates_between_each_replicates_own_positions():
    """Attainment 0.995 then 0.985 around a 0.99 target: the logit fraction
    f = (logit .995 − logit .99) / (logit .995 − logit .985) of the way between the two
    levels — from 10 to 11 in one replicate, from 9 to 12 in another."""
    F = np.array([[0.995, 0.985], [0.995, 0.985]])
    X = np.array([[10.0, 11.0], [9.0, 12.0]])
    f = (logit(0.995) - logit(0.99)) / (logit(0.995) - logit(0.985))
    out, flag, i = ev._crossing(F, X, 0.99, np.full(2, 1e-4))
    assert np.allclose(out, [10.0 + f, 9.0 + 3.0 * f]) and (flag == 0).all() and (i == 0).all()
    # every level passes: the replicate's own last position
    out, flag, _ = ev._crossing(np.full((2, 2), 0.999), X, 0.99, np.full(2, 1e-4))
    assert np.allclose(out, [11.0, 12.0]) and (flag == 1).all()
    # a shared x still works (the estimate's row)
    out, _, _ = ev._crossing(F[:1], np.array([10.0, 11.0]), 0.99, np.full(2, 1e-4))
    assert out[0] == pytest.approx(10.0 + f)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "coverage_short_runs", ROOT / "benchmarks" / "coverage_short_runs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["coverage_short_runs"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_wilson_interval_by_hand(bench):
    # 91 of 100: p = .91, z = 1.96: centre (.91 + 1.9208/100) / 1.038415 = .89485,
    # half-width 1.96·√(.0819/100 + .00009604)/1.038415 = .05729 — (0.838, 0.952)
    lo, hi = bench.wilson(91, 100)
    assert lo == pytest.approx(0.8376, abs=5e-4) and hi == pytest.approx(0.9521, abs=5e-4)
    assert bench.wilson(0, 10)[0] == 0.0 and math.isnan(bench.wilson(0, 0)[0])


def test_the_rate_noise_widens_the_interval_and_keeps_the_estimate(bench):
    """One sweep of the benchmark's shape, fitted with and without the rule: the same estimate,
    an interval at least as wide with it, and both contain their estimate."""
    r = bench.one_sweep((0, 9000, 200, 0, ("new", "old")))
    new, old = r["new"], r["old"]
    assert new["estimate"] == pytest.approx(old["estimate"])
    assert new["ci_high"] - new["ci_low"] >= 0.9 * (old["ci_high"] - old["ci_low"])
    for c in (new, old):
        assert c["ci_low"] <= c["estimate"] <= c["ci_high"]
    assert len(r["n"]) == 12 and min(r["n"]) >= 100


@pytest.mark.slow
def test_short_run_coverage_in_miniature(bench):
    """30 sweeps of the benchmark (≈ 1 min): the two-sided interval with the rule covers the
    60-s protocol's truth in at least 80 % of them (0.91 measured on 100), more often than
    without it (0.75)."""
    results = [bench.one_sweep((k, 9000, 200, 0, ("new", "old"))) for k in range(30)]
    cap = bench.cs.truth(bench.design(), 200)["capacity"]
    s = bench.summarize(results, cap)
    assert s["new"]["two_sided"] >= 0.8
    assert s["new"]["two_sided"] >= s["old"]["two_sided"]
    assert s["new"]["median_width"] > s["old"]["median_width"]
