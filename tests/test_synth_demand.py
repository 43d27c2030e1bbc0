"""Rate profiles and their arrivals (capplan.sim.demand): Λ and Λ⁻¹ by hand, arrival counts
against the expected number per segment, builders."""

from __future__ import annotations

import numpy as np
import pytest

from capplan.errors import SpecError
from capplan.sim.arrivals import Trace
from capplan.sim.demand import RateProfile, from_trace, oscillation, ramps, steps


def test_cumulative_and_inverse_by_hand():
    p = ramps(2.0, [(100, 200, 6.0)])  # 2 until 100, linear to 6 at 200, flat after
    t = np.array([0, 50, 100, 150, 200, 300.0])
    assert p.cumulative(t).tolist() == [0, 100, 200, 350, 600, 1200]
    np.testing.assert_allclose(p.inverse(p.cumulative(t)), t)
    q = steps(2.0, [(100, 8.0), (200, 1.0)])
    assert q.cumulative(t).tolist() == [0, 100, 200, 600, 1000, 1100]
    np.testing.assert_allclose(q.inverse([100, 200, 600, 1000, 1100]), [50, 100, 150, 200, 300])
    assert q.peak_rps == 8.0 and q.rate([50, 150, 250]).tolist() == [2, 8, 1]


def test_arrivals_follow_the_profile():
    q = steps(5.0, [(200, 20.0), (400, 5.0)])
    rng = np.random.default_rng(11)
    counts = np.zeros(3)
    for _ in range(20):
        a = q.arrivals_ns(600, rng) / 1e9
        counts += np.histogram(a, bins=[0, 200, 400, 600])[0]
    expected = 20 * np.array([1000, 4000, 1000])
    assert np.all(np.abs(counts - expected) < 4 * np.sqrt(expected))
    c = q.arrivals_ns(600, rng, process="constant") / 1e9
    assert len(c) == 6000 and np.diff(c[(c > 250) & (c < 350)]).std() < 1e-6


def test_same_seed_same_schedule_and_gamma_is_burstier():
    p = steps(10.0, [])
    a = p.arrivals_ns(300, np.random.default_rng(3))
    assert (a == p.arrivals_ns(300, np.random.default_rng(3))).all()
    g = p.arrivals_ns(3000, np.random.default_rng(3), process="gamma", cv=3.0)
    cv = np.diff(g).std() / np.diff(g).mean()
    assert 2.5 < cv < 3.5


def test_oscillation_and_trace_shapes():
    sq = oscillation(2.0, 6.0, 120.0, 600.0)
    assert sq.rate([10, 70, 130]).tolist() == [6, 2, 6]
    tr = Trace("x", np.r_[np.linspace(0, 50, 50), np.linspace(50.1, 100, 450)],
               np.ones(500, int), np.ones(500, int))
    day = from_trace(tr, span_s=86_400, peak_rps=12.0, bin_s=10.0)
    assert day.peak_rps == pytest.approx(12.0)
    assert day.rate(86_400 * 0.25) < day.rate(86_400 * 0.75)


def test_bad_profiles():
    with pytest.raises(SpecError):
        RateProfile((0.0, 10.0, 5.0), (1.0, 1.0, 1.0))
    with pytest.raises(SpecError):
        ramps(1.0, [(10, 5, 2.0)])
    with pytest.raises(SpecError):
        steps(1.0, []).arrivals_ns(10, np.random.default_rng(0), process="replay")
