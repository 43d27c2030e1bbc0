"""reduce.occupancy: requests in a part of their life, by time unit (area, value at the
unit's end, peak inside it), against a hand count and a brute-force sweep."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capplan.errors import SpecError
from capplan.reduce import Occupancy, TimeUnits, occupancy

from conftest import ev


def _study(make_study):
    # waiting = scheduled → first token (no admission stamps); times in seconds
    rows = [
        ev("r1", "a", scheduled_ms=0, ttft_ms=2500, e2e_ms=3000),      # waits [0, 2.5)
        ev("r1", "b", scheduled_ms=500, ttft_ms=1000, e2e_ms=2000),    # [0.5, 1.5)
        ev("r1", "c", scheduled_ms=1500, ttft_ms=None, e2e_ms=None, status="rejected"),  # none
        ev("r1", "d", scheduled_ms=1500, ttft_ms=None, e2e_ms=None, status="timeout"),   # [1.5, 1.5+open)
        ev("r1", "e", scheduled_ms=3200, ttft_ms=300, e2e_ms=800),     # [3.2, 3.5); run ends 4.0
    ]
    return make_study(rows, runs=[{"run_id": "r1", "offered_rps": 1.0}])


def test_hand_computed_waiting(make_study):
    path = _study(make_study)
    (o,) = occupancy(path, TimeUnits(1.0, {"r1": 0.0}, {"r1": 4}), what=Occupancy(open_for_s=2.0))
    # intervals: a [0,2.5) b [0.5,1.5) d [1.5,3.5) e [3.2,3.5)
    assert o.area_s.tolist() == pytest.approx([1.5, 2.0, 1.5, 0.8])
    assert o.at_end.tolist() == [2, 2, 1, 0]
    assert o.peak.tolist() == [2, 2, 2, 2]
    assert o.peak_t_s.tolist() == pytest.approx([0.5, 1.0, 2.0, 3.2])
    assert (o.n, o.n_open) == (5, 1) and o.run_end_s == pytest.approx(4.0)
    # without open_for_s the timed-out request waits until the run's end (4.0 s)
    (o2,) = occupancy(path, TimeUnits(1.0, {"r1": 0.0}, {"r1": 4}))
    assert o2.area_s.tolist() == pytest.approx([1.5, 2.0, 1.5, 1.3])


def test_against_a_brute_force_sweep(make_study):
    rng = np.random.default_rng(5)
    n = 400
    sched = np.sort(rng.uniform(0, 60_000, n))
    wait = rng.exponential(3000, n)
    status = np.where(rng.random(n) < 0.1, "rejected", "ok")
    rows = [ev("r1", scheduled_ms=float(s), ttft_ms=None if st != "ok" else float(w),
               e2e_ms=None if st != "ok" else float(w) + 100.0, status=str(st))
            for s, w, st in zip(sched, wait, status)]
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 6.0}])
    (o,) = occupancy(path, TimeUnits(2.5, {"r1": 0.0}))
    ok = status == "ok"
    s_ns = np.round(sched[ok] * 1e6).astype(np.int64)
    e_ns = s_ns + np.round(wait[ok] * 1e6).astype(np.int64)
    step = 1_000_000  # 1 ms grid
    grid = np.arange(0, int(e_ns.max()) + step, step)
    counts = (np.searchsorted(np.sort(s_ns), grid, "right") - np.searchsorted(np.sort(e_ns), grid, "right"))
    unit = grid // 2_500_000_000
    df = pd.DataFrame({"u": unit, "c": counts})
    brute_area = df.groupby("u")["c"].sum().to_numpy() * step / 1e9
    brute_peak = df.groupby("u")["c"].max().to_numpy()
    k = min(brute_area.size, o.area_s.size)
    assert o.area_s.size == int(e_ns.max() // 2_500_000_000) + 1
    np.testing.assert_allclose(o.area_s[:k - 1], brute_area[:k - 1], atol=0.05 * 2.5)
    assert (o.peak[:k - 1] == brute_peak[:k - 1]).all()
    assert o.area_s.sum() == pytest.approx((e_ns - s_ns).sum() / 1e9)


def test_bad_occupancy_specs():
    with pytest.raises(SpecError):
        Occupancy(start="t_s")
    with pytest.raises(SpecError):
        Occupancy(instant=("gone",))


def test_activity_by_replica(make_study):
    from capplan.reduce import activity

    rows = [ev("r1", "a", scheduled_ms=0, ttft_ms=100, e2e_ms=900, replica_group="x"),
            ev("r1", "b", scheduled_ms=1000, ttft_ms=200, e2e_ms=5000, replica_group="y"),
            ev("r1", "c", scheduled_ms=2000, ttft_ms=None, e2e_ms=None, status="error",
               replica_group="x"),
            ev("r1", "d", scheduled_ms=3000, ttft_ms=None, e2e_ms=None, status="rejected")]
    df = activity(make_study(rows, runs=[{"run_id": "r1", "offered_rps": 1.0}]))
    run = df[df["whole_run"]].iloc[0]
    assert df[~df["whole_run"] & df["value"].isna()]["n"].tolist() == [1]
    x = df[df["value"] == "x"].iloc[0]
    y = df[df["value"] == "y"].iloc[0]
    assert (run["n"], run["n_ok"], run["last_scheduled_s"]) == (4, 2, 3.0)
    assert run["last_service_s"] == pytest.approx(6.0)
    assert (x["n"], x["first_service_s"], x["last_service_s"], x["last_failed_s"]) == (2, 0.1, 0.9, 2.0)
    assert (y["first_service_s"], y["last_service_s"]) == (1.2, 6.0) and np.isnan(y["last_failed_s"])
    with pytest.raises(SpecError):
        activity(make_study(rows, runs=[{"run_id": "r1", "offered_rps": 1.0}]), by="status")
