"""The one reduction: units by count or by time (a grid shared by two studies), cells summed
in the same pass, the window passed in, ties and duplicates, the grid of an SLO axis without a
limit, and the cached resample — each against a hand count."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capplan import bootstrap as B
from capplan import open_study, sketch
from capplan.errors import SpecError
from capplan.metrics import Window, good_predicate, request_view
from capplan.reduce import (CountUnits, Cells, TimeUnits, bucket_labels, reduce_study,
                            time_units_for)
from capplan.slo import SLO

from conftest import ev

SLO_TEXT = "ttft_ms=500,attainment=0.9"


def _rows(run_id="r1", n=40, *, gap_ms=250.0, start_ms=0.0, slow_every=5, prefix="q"):
    """n requests gap_ms apart; every slow_every-th one misses TTFT ≤ 500 ms; tokens and
    tenants vary by index so that cells have known counts."""
    rows = []
    for i in range(n):
        rows.append(ev(run_id, f"{prefix}{run_id}-{i}", scheduled_ms=start_ms + gap_ms * i,
                       ttft_ms=900.0 if i % slow_every == 0 else 100.0 + i,
                       e2e_ms=2000.0, input_tokens=100 if i % 2 else 3000,
                       output_tokens=10 + i, status="timeout" if i == 7 else "ok",
                       tenant="acme" if i % 3 else "globex",
                       slo_class=None if i % 4 == 0 else "interactive"))
    return rows


def test_count_units_by_hand(make_study):
    path = make_study(_rows(n=40), runs=[{"run_id": "r1", "offered_rps": 4.0,
                                          "warmup_s": 0.0}])
    st = reduce_study(path, SLO_TEXT, units=CountUnits(max_units=8))
    r = st.runs[0]
    assert r.n_units == 8 and r.unit_size == 5.0
    assert list(r.units["n"]) == [5] * 8
    # unit u holds requests 5u … 5u+4; slow: i % 5 == 0 (one per unit); i = 7 timed out
    good = [4, 3, 4, 4, 4, 4, 4, 4]
    assert list(r.units["n_good"]) == good and r.n_good == 31
    assert r.units["st_timeout"].sum() == 1 and r.units["st_timeout"][1] == 1
    assert isinstance(st.unit_rule, CountUnits) and st.cells is None and r.cells is None
    # a request per unit for a run of at most max_units requests
    assert reduce_study(path, SLO_TEXT).runs[0].n_units == 40


def test_time_units_by_hand_with_empty_units(make_study):
    rows = _rows(n=20, gap_ms=250.0) + _rows(n=8, gap_ms=250.0, start_ms=10_000.0, prefix="z")
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 2.0, "warmup_s": 0.0}])
    st = reduce_study(path, SLO_TEXT, units=TimeUnits(width_s=1.0))
    r = st.runs[0]
    # 20 requests in [0, 4.75] s → units 0–4 (4 each); nothing in 5–9 s; 8 in [10, 11.75] s
    assert r.n_units == 12
    assert list(r.units["n"]) == [4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 4, 4]
    assert r.unit_size == pytest.approx(28 / 12)
    assert np.isnan(r.units["t0"][6]) and r.units["t0"][10] == pytest.approx(10.0)
    # the unit count can be fixed (later requests clip into the last unit)
    st2 = reduce_study(path, SLO_TEXT, units=TimeUnits(2.0, n_units={"r1": 3}))
    assert list(st2.runs[0].units["n"]) == [8, 8, 12]
    with pytest.raises(SpecError, match="width"):
        reduce_study(path, SLO_TEXT, units=TimeUnits(0.0))


def test_time_grid_shared_by_two_studies(make_study):
    """Different run ids, warm-ups and last requests: one grid per matched run, and the same
    scheduled time falls in the same unit on both sides."""
    a = open_study(make_study(_rows("a1", n=40), runs=[{"run_id": "a1", "offered_rps": 4.0,
                                                         "warmup_s": 1.0}]))
    b = open_study(make_study(_rows("b1", n=36), runs=[{"run_id": "b1", "offered_rps": 4.0,
                                                         "warmup_s": 2.0}]))
    wa, wb = Window.of(a, {"a1": 2.0}), Window.of(b)  # the caller aligns the windows
    ua, ub = time_units_for([(a, wa, ["a1"]), (b, wb, ["b1"])], max_units=9)
    assert ua.width_s["a1"] == ub.width_s["b1"] and ua.origin_s["a1"] == ub.origin_s["b1"] == 2.0
    assert ua.n_units["a1"] == ub.n_units["b1"] <= 9
    sa = reduce_study(a, SLO_TEXT, warmup=wa, units=ua)
    sb = reduce_study(b, SLO_TEXT, warmup=wb, units=ub)
    ra, rb = sa.runs[0], sb.runs[0]
    assert ra.n_units == rb.n_units
    # the 36 common requests (8 … 35: scheduled ≥ 2 s) sit in the same units
    common = rb.units["n"]
    assert np.all(ra.units["n"][: common.size] >= common)
    assert ra.units["n"].sum() - common.sum() == 4  # a's requests 36–39, all in the last unit
    # one resample serves both sides of a paired comparison
    R = sa.resample(ra, B.Circular(block_len=8.0), reps=50, seed=3)
    d = R.sums(ra.units["n_good"]) - R.sums(rb.units["n_good"])
    assert d.shape == (50,)


def test_cells_by_hand_and_sums_over_cells(make_study):
    path = make_study(_rows(n=40), runs=[{"run_id": "r1", "offered_rps": 4.0,
                                          "warmup_s": 0.0}])
    cells = Cells(input_edges=(1000,), output_edges=(20, 40), quadrant_split=(500, 25),
                  tenant=True, slo_class=True, hist=("ttft", "e2e"))
    st = reduce_study(path, SLO_TEXT, units=CountUnits(4), cells=cells)
    r = st.runs[0]
    ci = st.cell_index
    assert list(ci.columns[:1]) == ["cell"]
    for dim in cells.dims:
        assert dim in ci.columns
    # by hand from the rows
    df = pd.DataFrame(_rows(n=40))
    df["input_bucket"] = (df["input_tokens"] >= 1000).astype(int)
    df["output_bucket"] = (df["output_tokens"] >= 20).astype(int) + (df["output_tokens"] >= 40)
    df["input_long"] = df["input_tokens"] > 500
    df["output_long"] = df["output_tokens"] > 25
    df["slo_class"] = df["slo_class"].fillna("(none)")
    df["good"] = ((df["status"] == "ok") & ((df["first_token_ns"] - df["scheduled_ns"]) / 1e6
                                             <= 500)).astype(int)
    df["unit"] = np.arange(40) * 4 // 40
    keys = list(cells.dims)
    want = df.groupby(["unit"] + keys).agg(n=("good", "size"), n_good=("good", "sum"),
                                           out_tok=("output_tokens", "sum")).reset_index()
    got = ci.merge(want, on=keys)
    assert len(got) == len(want)  # every observed (unit, cell) is there
    assert len(ci) == len(want.drop_duplicates(keys))  # and only observed cells
    for row in got.itertuples():
        assert r.cells.sums["n"][row.unit, row.cell] == row.n
        assert r.cells.sums["n_good"][row.unit, row.cell] == row.n_good
        assert r.cells.sums["output_tokens"][row.unit, row.cell] == row.out_tok
    assert r.cells.sums["n"].sum() == 40
    # the per-unit arrays are the sums over cells
    for name in ("n", "n_good", "n_ok", "st_timeout"):
        assert np.array_equal(r.cells.sums[name].sum(axis=1), r.units[name])
    assert set(ci["tenant"]) == {"acme", "globex"}
    assert set(ci["slo_class"]) == {"(none)", "interactive"}
    assert set(ci["output_bucket_label"]) <= set(bucket_labels((20, 40)))
    # per-(unit, cell) histograms of ok requests: TTFT counts per cell add up
    u, c, k, cnt = r.cells.hist["ttft"]
    assert cnt.sum() == 39  # 40 requests, one timed out
    ok = df[df["status"] == "ok"]
    cell_of = ci.set_index(keys)["cell"]
    for (unit, *dims), grp in ok.groupby(["unit"] + keys):
        cell = cell_of.loc[tuple(dims)]
        sel = (u == unit) & (c == cell)
        exp = sketch.keys((grp["first_token_ns"] - grp["scheduled_ns"]) / 1e6)
        assert sorted(np.repeat(k[sel], cnt[sel])) == sorted(exp)
    assert "e2e" in r.cells.hist and "tpot" not in r.cells.hist


def test_window_is_passed_in_and_each_view_keeps_its_window(make_study):
    path = make_study(_rows(n=40), runs=[{"run_id": "r1", "offered_rps": 4.0,
                                          "warmup_s": 0.0}])
    study = open_study(path)
    w = Window.of(study, {"r1": 2.0})
    st = reduce_study(study, SLO_TEXT, warmup=w)
    assert st.window == w and st.runs[0].n == 32 and st.runs[0].warmup_s == 2.0
    assert st.diagnostics.iloc[0]["warmup_source"] == "given"
    # a reduction with another window leaves the first view as it was
    view = request_view(study, w)
    reduce_study(study, SLO_TEXT, warmup=0.0)
    assert study.sql(f"SELECT count(*) FROM {view} WHERE in_window").fetchall()[0][0] == 32
    assert request_view(study, Window.of(study, 2.0)) == view  # same window, same view
    assert request_view(study, Window.of(study)) != view


def test_ties_and_duplicates(make_study):
    """Requests at the same scheduled time: the order among them is made deterministic from
    request_id, and a request recorded twice is found."""
    rows = []
    for i in range(30):
        for j in range(2):  # two requests per scheduled time
            rows.append(ev("r1", f"q{i}-{j}", scheduled_ms=100.0 * i,
                           ttft_ms=900.0 if (i + j) % 3 == 0 else 100.0))
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 10.0, "warmup_s": 0.0}])
    a = reduce_study(path, SLO_TEXT, units=CountUnits(7))
    b = reduce_study(path, SLO_TEXT, units=CountUnits(7))
    assert np.array_equal(a.runs[0].units["n_good"], b.runs[0].units["n_good"])
    assert a.diagnostics.iloc[0]["duplicates"] == 0
    dup = make_study(rows + [dict(rows[10])], runs=[{"run_id": "r1", "offered_rps": 10.0,
                                                      "warmup_s": 0.0}])
    d = reduce_study(dup, SLO_TEXT)
    assert d.diagnostics.iloc[0]["duplicates"] == 1
    assert not d.diagnostics.iloc[0]["usable"]


def test_grid_axis_without_a_limit_is_exact_at_bucket_edges(make_study):
    rng = np.random.default_rng(4)
    rows = [ev("r1", f"q{i}", scheduled_ms=50.0 * i, ttft_ms=float(rng.lognormal(5.5, 0.6)),
               e2e_ms=None, output_tokens=int(rng.integers(1, 40)))
            for i in range(600)]
    for r, d in zip(rows, rng.lognormal(3.3, 0.4, 600)):
        r["last_token_ns"] = r["first_token_ns"] + int(d * 1e6 * max(r["output_tokens"] - 1, 1))
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 20.0, "warmup_s": 0.0}])
    st = reduce_study(path, SLO_TEXT)  # TTFT-only: the TPOT axis has no limit
    g = st.grid_spec
    study = open_study(path)
    view = request_view(study, st.window)
    for j in (g.half - 5, g.half, g.half + 3):
        lim = float(g.limits("y")[j])
        pred, params = good_predicate(SLO.parse(f"ttft_ms=500,tpot_ms={lim!r},attainment=0.9"))
        exact = study.sql(f"SELECT count_if({pred}) FROM {view} WHERE in_window",
                          params).fetchall()[0][0]
        assert st.runs[0].grid[:, g.half, j].sum() == exact
    # the anchor is the pooled 90th-percentile bucket edge of TPOT
    k = sketch.keys(study.sql(f"SELECT tpot_ms FROM {view} WHERE status = 'ok' AND tpot_ms "
                              "IS NOT NULL").df()["tpot_ms"])
    assert g.y_keys[0] == int(np.sort(k)[int(np.ceil(0.9 * k.size)) - 1])


def test_resample_is_cached_and_uses_the_run_stream(make_study):
    path = make_study(_rows(n=40), runs=[{"run_id": "r1", "offered_rps": 4.0,
                                          "warmup_s": 0.0}])
    st = reduce_study(path, SLO_TEXT)
    r = st.runs[0]
    s = B.Stationary(block_len=6.0)
    R = st.resample(r, s, reps=30, seed=2)
    assert st.resample(r, s, reps=30, seed=2) is R
    fresh = s.resample(r.n_units, s.block_units(r.block_len, r.unit_size), 30,
                       np.random.default_rng([2, r.run_idx]))
    assert np.array_equal(fresh.counts(), R.counts())


def test_one_run_at_a_time_gives_the_same_statistics(make_study):
    """Past the fetch budget DuckDB reads one run at a time (a first SQL pass for the pooled
    histogram of an axis the SLO does not limit, and for the observed cells): the same
    statistics as the one fetch of every run."""
    rows = _rows("r1", 60) + _rows("r2", 25, gap_ms=100.0, prefix="b")
    rows += [ev("r2", "tie-b", scheduled_ms=500.0), ev("r2", "tie-a", scheduled_ms=500.0,
                                                        ttft_ms=950.0)]
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 4.0},
                                  {"run_id": "r2", "offered_rps": 10.0, "warmup_s": 0.0}])
    cells = Cells(input_edges=(1000,), tenant=True)
    for slo in (SLO_TEXT, "ttft_ms=500,tpot_ms=20,attainment=0.9"):
        a = reduce_study(path, slo, cells=cells, units=CountUnits(9))
        b = reduce_study(path, slo, cells=cells, units=CountUnits(9), fetch_mb=1e-6)
        assert a.grid_spec == b.grid_spec
        for ra, rb in zip(a.runs, b.runs):
            assert ra.block_len == rb.block_len
            for k in ra.units:
                assert np.array_equal(ra.units[k], rb.units[k], equal_nan=True), k
            assert np.array_equal(ra.grid, rb.grid)
            for m in ra.tail:
                assert all(np.array_equal(x, y) for x, y in zip(ra.tail[m], rb.tail[m]))
            for k in ra.cells.sums:
                assert np.array_equal(ra.cells.sums[k], rb.cells.sums[k]), k
        pd.testing.assert_frame_equal(a.diagnostics, b.diagnostics)


def test_run_by_run_gives_the_one_fetch_statistics(make_study, monkeypatch):
    """Event files whose row groups hold one run each are fetched run by run on two threads
    (``engine._counts_by_run``, here whatever the runs' length); one file with every run is
    fetched at once. The same events in either layout give the same statistics, bit for bit:
    with ties in one run and not in the other, an event recorded twice, rows out of
    scheduled order, an axis without a limit, cells and time units."""
    from capplan.reduce import engine

    from conftest import events_frame

    r1 = _rows("r1", 60)
    r2 = _rows("r2", 25, gap_ms=100.0, prefix="b")
    r2 += [ev("r2", "tie-b", scheduled_ms=500.0), ev("r2", "tie-a", scheduled_ms=500.0,
                                                      ttft_ms=950.0)]
    r2.append(dict(r2[3]))  # recorded twice
    runs = [{"run_id": "r1", "offered_rps": 4.0}, {"run_id": "r2", "offered_rps": 10.0,
                                                   "warmup_s": 0.0}]
    one = make_study(r1 + r2, runs=runs)
    apart = make_study({"r1.parquet": events_frame(r1[::-1]), "r2.parquet": events_frame(r2)},
                       runs=runs)
    n = len(r1) + len(r2)
    assert not engine._by_run(open_study(apart), n)  # short runs: one query
    monkeypatch.setattr(engine, "BY_RUN_ROWS_PER_FILE", 0)
    assert engine._by_run(open_study(apart), n) and not engine._by_run(open_study(one), n)
    cells = Cells(input_edges=(1000,), tenant=True)
    for slo, kw in ((SLO_TEXT, {}), ("ttft_ms=500,tpot_ms=20,attainment=0.9", {}),
                    (SLO_TEXT, {"cells": cells, "units": CountUnits(9)}),
                    ("ttft_ms=500,tpot_ms=20,attainment=0.9", {"units": TimeUnits(1.0)})):
        a, b = reduce_study(one, slo, **kw), reduce_study(apart, slo, **kw)
        assert a.grid_spec == b.grid_spec
        for ra, rb in zip(a.runs, b.runs, strict=True):
            assert ra.block_len == rb.block_len and ra.hist.keys() == rb.hist.keys()
            for k in ra.units:
                assert np.array_equal(ra.units[k], rb.units[k], equal_nan=True), k
                assert ra.units[k].dtype == rb.units[k].dtype, k
            assert np.array_equal(ra.grid, rb.grid) and ra.grid.dtype == rb.grid.dtype
            for m in ra.hist:
                assert ra.hist[m][0] == rb.hist[m][0]
                assert np.array_equal(ra.hist[m][1], rb.hist[m][1])
            for m in ra.tail:
                assert all(np.array_equal(x, y) for x, y in zip(ra.tail[m], rb.tail[m]))
            assert (ra.cells is None) == (rb.cells is None)
            if ra.cells is not None:
                for k in ra.cells.sums:
                    assert np.array_equal(ra.cells.sums[k], rb.cells.sums[k]), k
                for m in ra.cells.hist:
                    assert all(np.array_equal(x, y) for x, y in
                               zip(ra.cells.hist[m], rb.cells.hist[m]))
        pd.testing.assert_frame_equal(a.diagnostics, b.diagnostics)
        assert a.diagnostics["duplicates"].tolist() == [0, 1]
    for path in (one, apart):  # the study's connection is left free for the caller's queries
        study = open_study(path)  # and with its own thread setting (run by run: 1 meanwhile)
        study.con.sql("SET threads = 3")
        reduce_study(study, SLO_TEXT)
        assert study.con.sql("SELECT 1").fetchall() == [(1,)]
        assert study.con.sql("SELECT current_setting('threads')").fetchall() == [(3,)]
    study = open_study(apart)
    study.con.sql("SET threads = 2")
    with pytest.raises(RuntimeError), engine._one_query_thread(study):  # restored on an error
        assert study.con.sql("SELECT current_setting('threads')").fetchall() == [(1,)]
        raise RuntimeError
    assert study.con.sql("SELECT current_setting('threads')").fetchall() == [(2,)]


def test_ties_are_ordered_by_request_id(make_study):
    """Two requests at one scheduled time: the one whose request_id sorts first (byte order,
    the same in DuckDB and Spark) is the earlier, whatever the file order."""
    rows = [ev("r1", "q2", scheduled_ms=0.0, ttft_ms=100.0),
            ev("r1", "b", scheduled_ms=100.0, ttft_ms=900.0),   # bad, sorts first
            ev("r1", "a9", scheduled_ms=100.0, ttft_ms=100.0),  # wait: "a9" < "b"
            ev("r1", "q4", scheduled_ms=200.0, ttft_ms=100.0)]
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 10.0, "warmup_s": 0.0}])
    st = reduce_study(path, SLO_TEXT, units=CountUnits(4))
    # scheduled order q2, a9, b, q4: only unit 2 (request "b") misses the 500-ms TTFT
    assert st.runs[0].units["n_good"].tolist() == [1.0, 1.0, 0.0, 1.0]


def test_block_length_from_fine_units():
    """With n ≤ FINE_UNITS the rule is Politis–White on the per-request series; beyond it,
    PW on per-fine-unit means times n/F — close to the per-request figure for a strongly
    dependent series, and capped as PW caps a series of n."""
    from scipy import signal

    from capplan.reduce import FINE_UNITS, block_length

    rng = np.random.default_rng(3)
    short = signal.lfilter([1.0], [1.0, -0.9], rng.standard_normal(4000))
    good = (short < 1.0).astype(float)
    bl_good, bl_lat, metric = block_length(good, {"ttft": np.exp(short)})
    assert bl_good == B.optimal_block_length(good)
    logged = np.log(np.maximum(np.exp(short), sketch.MIN_VALUE))  # clamped as keys are
    assert bl_lat == B.optimal_block_length(logged) and metric == "ttft"
    n = 8 * FINE_UNITS
    x = signal.lfilter([1.0], [1.0, -0.999], rng.standard_normal(n))
    exact = B.optimal_block_length(x).circular
    fine = block_length(x > 0, {"v": np.exp(x)})[1].circular
    assert 0.5 * exact < fine < 2.0 * exact
    assert fine <= np.ceil(min(3 * np.sqrt(n), n / 3))


@pytest.mark.parametrize("half", [14, 0])
def test_numpy_grid_codes_match_the_sql_ones_on_every_edge(half):
    """The numpy executor's grid codes (``count.grid_codes``) are those of
    ``sql.grid_code_sql`` on the values where they could part: missing, 0, negative, below
    the clamp, exactly on the anchor and on grid limits a·s^j, one ulp either side of them,
    and beyond the grid at both ends; with the full grid and with the one-limit grid
    (``half`` 0, the comparison the envelope command counts)."""
    import math

    import duckdb

    from capplan.reduce.count import grid_codes
    from capplan.reduce.sql import grid_code_params, grid_code_sql

    anchor, step = 2000.0, 1.1
    lim = [anchor * step ** j for j in range(-20, 21)] + [math.exp(math.log(anchor) + j *
                                                              math.log(step))
                                                     for j in range(-20, 21)]
    near = [np.nextafter(v, d) for v in lim for d in (0.0, np.inf)]
    x = np.array([np.nan, 0.0, -5.0, 1e-4, sketch.MIN_VALUE, 1.0, anchor, 1e9, *lim, *near])
    con = duckdb.connect()
    con.register("t", pd.DataFrame({"v": x}))
    got_sql = con.execute(f"SELECT {grid_code_sql('v')} AS c FROM t",
                          grid_code_params(anchor, step, half)).fetchnumpy()["c"]
    got_np = grid_codes(x, sketch.log_clamped(x), anchor, step, half)
    assert got_np.dtype == np.int16
    assert np.array_equal(np.asarray(got_sql, dtype=np.int16), got_np)
    assert got_np[0] == 0 and got_np[list(x).index(anchor)] == half  # missing; the anchor meets


def _sql_and_numpy_columns(study, slo_text: str, warmup: str) -> tuple[dict, dict]:
    """The per-request columns of a reduction as SQL computes them (``request_columns``) and
    as the numpy executor does (``engine._fetch``: DuckDB's latencies, numpy's codes), in the
    same scheduled order."""
    from capplan.reduce import engine as E
    from capplan.reduce.plan import reduction_plan, resolve_window
    from capplan.reduce.sql import request_columns

    slo = SLO.parse(slo_text)
    window, _, _ = resolve_window(study, warmup, E.TTFT_COL[slo.ttft_from])
    plan = reduction_plan(study, slo, window, cells=None, alpha=sketch.DEFAULT_ALPHA,
                          grid_step=E.GRID_STEP, grid_half=E.GRID_HALF)
    cols, params = request_columns(plan)
    want = E.fetch_arrays(study, f"SELECT {', '.join(cols)} FROM {plan.view} m "
                          "WHERE m.in_window ORDER BY m.run_idx, m.scheduled_ns", params)
    return want, E._fetch(study, plan, tie_break=False)


@pytest.mark.parametrize("slo_text", ["ttft_ms=2000,tpot_ms=100,attainment=0.99",
                                      "tpot_ms=80,attainment=0.9",
                                      "ttft_ms=2000,itl_ms=150,attainment=0.99",
                                      "ttft_ms=2000,e2e_ms=20000,ttft_from=sent,attainment=0.95"])
def test_the_numpy_codes_are_the_sql_columns(slo_text):
    """DuckDB fetches the latencies and numpy codes them (``request_columns(values=True)``,
    ``count.request_codes``): every column equals the one SQL computes, dtype included, on
    the bundled sample study (17 runs)."""
    from pathlib import Path

    study = open_study(Path(__file__).resolve().parents[1] / "data" / "sample")
    want, got = _sql_and_numpy_columns(study, slo_text, "manifest")
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert np.array_equal(got[k], want[k], equal_nan=want[k].dtype.kind == "f"), k


@pytest.mark.parametrize("slo_text", ["ttft_ms=500,tpot_ms=50,attainment=0.9",
                                      "ttft_ms=500,e2e_ms=2000,ttft_from=sent,attainment=0.9",
                                      "tpot_ms=50,itl_ms=60,e2e_ms=2000,attainment=0.9",
                                      "ttft_ms=500,itl_ms=60,itl_stat=max,attainment=0.9"])
def test_numpy_slo_good_and_base_are_the_sql_predicates_on_their_edges(make_study, slo_text):
    """SLO-good and grid eligibility (``base``) computed in numpy from the fetched latencies
    (``count.request_codes``, ``slo.good_array``) equal the SQL predicates request by request
    where they are hard: a latency exactly at its limit and just above it, an ok request
    without a first token or a last one, a failed request with fine latencies, one output
    token (no TPOT: passes), a late send (TTFT from sent), ITL gaps and none."""
    ms = 1_000_000
    rows = [ev("r1", scheduled_ms=0.0, ttft_ms=500.0, e2e_ms=1000.0, output_tokens=11),  # both at limit
            ev("r1", scheduled_ms=10.0, ttft_ms=500.000001, e2e_ms=900.0),
            ev("r1", scheduled_ms=20.0, ttft_ms=None, e2e_ms=None),                      # ok, no token
            ev("r1", scheduled_ms=30.0, ttft_ms=100.0, e2e_ms=None),                     # no last token
            ev("r1", scheduled_ms=40.0, ttft_ms=100.0, e2e_ms=300.0, status="error"),
            ev("r1", scheduled_ms=50.0, ttft_ms=100.0, e2e_ms=2000.0, output_tokens=1),  # no TPOT
            ev("r1", scheduled_ms=60.0, ttft_ms=100.0, e2e_ms=2000.000001, output_tokens=0),
            ev("r1", scheduled_ms=70.0, ttft_ms=550.0, e2e_ms=1500.0, sent_ms=120.0),    # late send
            ev("r1", scheduled_ms=80.0, ttft_ms=100.0, e2e_ms=600.0, output_tokens=11),  # TPOT 50
            ev("r1", scheduled_ms=90.0, ttft_ms=100.0, e2e_ms=601.0, output_tokens=11),
            ev("r1", scheduled_ms=100.0, ttft_ms=None, e2e_ms=None, status="timeout")]
    for i, r in enumerate(rows):  # ITL gaps: none, within 60 ms, at it, above it
        r["itl_ns"] = [None, [40 * ms, 50 * ms], [60 * ms], [30 * ms, 61 * ms]][i % 4]
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 10.0, "warmup_s": 0.0}])
    want, got = _sql_and_numpy_columns(open_study(path), slo_text, "none")
    for k in ("good", "base"):
        assert got[k].dtype == want[k].dtype == np.bool_, k
        assert got[k].tolist() == want[k].tolist(), k
    assert 0 < want["good"].sum() < len(rows) - 1  # the edges split both ways


def test_a_latency_beyond_the_key_range_is_a_clear_error(make_study):
    """A key the SQL cast to SMALLINT would refuse (a TTFT of 10^200 ms: key ≈ 46 000) is an
    error that names the latency, not a wrapped-around key."""
    from capplan.errors import StudyError

    rows = [ev("r1", f"x{i}", scheduled_ms=100.0 * i, ttft_ms=100.0) for i in range(20)]
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 10.0, "warmup_s": 0.0}])
    st = open_study(path)
    from capplan.reduce import engine as E
    from capplan.reduce.count import request_codes
    from capplan.reduce.plan import reduction_plan, resolve_window
    from capplan.reduce.sql import request_columns

    slo = SLO.parse("ttft_ms=500,attainment=0.9")
    window, _, _ = resolve_window(st, "none", "ttft_ms")
    plan = reduction_plan(st, slo, window, cells=None, alpha=sketch.DEFAULT_ALPHA,
                          grid_step=E.GRID_STEP, grid_half=E.GRID_HALF)
    cols, params = request_columns(plan, values=True)
    a = E.fetch_arrays(st, f"SELECT {', '.join(cols)} FROM {plan.view} m WHERE m.in_window",
                       params)
    a["v_ttft_ms"] = a["v_ttft_ms"].copy()
    a["v_ttft_ms"][3] = 1e200
    with pytest.raises(StudyError, match="ttft_ms of 1e\\+200 is beyond"):
        request_codes(a, plan)
