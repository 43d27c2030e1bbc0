"""The Spark engine of the reduction gives the DuckDB engine's statistics: counts, grids and
histograms exactly, floating sums within 1e-9, the same block lengths — hence the same
envelope with the same seed — on a study with unequal run lengths, ties in scheduled_ns,
events recorded twice, failed and unfinished requests, ITL lists, tenants, and warm-up from the
manifest and from MSER; a study read as a file:// URI or from a catalog table; bad input with
the DuckDB path's messages. One local Spark session for all (conftest ``spark``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from capplan import contract as C
from capplan.envelope import fit_from_stats
from capplan.errors import StudyError
from capplan.io import manifest_dict, write_study
from capplan.reduce import FINE_UNITS, Cells, CountUnits, TimeUnits, reduce_study

SLO_TT = "ttft_ms=300,tpot_ms=40,attainment=0.95"


def make_events(seed: int = 0, sizes=(300, 1500, FINE_UNITS + 700, 80)) -> tuple[list, pd.DataFrame]:
    """Unequal runs; scheduled times on a 10-ms grid (ties); integer-ms TTFTs (values on grid
    limits); errors, rejects (no first token), timeouts (no last token); two events recorded
    twice; ITL gap lists (some empty); tenants with gaps; rows shuffled."""
    rng = np.random.default_rng(seed)
    frames, runs = [], []
    for k, n in enumerate(sizes):
        rid = f"r{k}"
        rate = 20.0 * (k + 1)
        sched = (np.round(np.cumsum(rng.exponential(1 / rate, n)) * 100) * 1e7).astype(np.int64)
        z = np.zeros(n)
        e = rng.standard_normal(n)
        for i in range(1, n):
            z[i] = 0.9 * z[i - 1] + 0.44 * e[i]
        ttft = (np.round(200 * np.exp(0.6 * z + 0.2 * k)) * 1e6).astype(np.int64)
        out = rng.integers(1, 200, n)
        tpot = rng.lognormal(np.log(30), 0.3, n) * 1e6
        first = sched + ttft
        last = first + (tpot * np.maximum(out - 1, 0)).astype(np.int64)
        st = rng.choice(list(C.STATUSES), n, p=[0.93, 0.02, 0.02, 0.02, 0.01])
        no_first = np.isin(st, ["rejected", "error"])
        no_last = no_first | (st == "timeout")
        df = pd.DataFrame({
            "run_id": rid, "request_id": [f"{rid}-{v:x}" for v in rng.integers(0, 1 << 40, n)],
            "scheduled_ns": sched, "sent_ns": sched + rng.integers(0, 3_000_000, n),
            "first_token_ns": pd.array(np.where(no_first, pd.NA, first), dtype="Int64"),
            "last_token_ns": pd.array(np.where(no_last, pd.NA, last), dtype="Int64"),
            "input_tokens": rng.integers(10, 3000, n), "output_tokens": out, "status": st,
            "tenant": rng.choice(["acme", "globex", None], n),
            "itl_ns": [list(rng.integers(1_000_000, 60_000_000, rng.integers(0, 5)))
                       for _ in range(n)]})
        if k == 1:
            df = pd.concat([df, df.iloc[[3, 4]]])  # recorded twice
        frames.append(df.sample(frac=1.0, random_state=k))
        run = {"run_id": rid, "offered_rps": rate}
        if k % 2 == 0:
            run["warmup_s"] = 1.0  # the others: MSER under warmup="manifest"
        runs.append(run)
    return runs, pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def study_path(tmp_path_factory):
    runs, events = make_events()
    dest = tmp_path_factory.mktemp("spark") / "mixed"
    return write_study(dest, manifest_dict("mixed", runs),
                       {"events/a.parquet": events.iloc[: len(events) // 2],
                        "events/b.parquet": events.iloc[len(events) // 2:]})


def assert_same(a, b):
    """Every statistic of two BlockStats: integers exactly, floats within 1e-9 (relative)."""
    def same(x, y, where):
        if isinstance(x, dict):
            assert set(x) == set(y), f"{where}: keys {set(x) ^ set(y)}"
            for k in x:
                same(x[k], y[k], f"{where}.{k}")
        elif isinstance(x, (tuple, list)):
            assert len(x) == len(y), where
            for i, (u, v) in enumerate(zip(x, y)):
                same(u, v, f"{where}[{i}]")
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            assert x.shape == y.shape, where
            if x.dtype.kind == "f" or y.dtype.kind == "f":
                assert np.allclose(x, y, rtol=1e-9, atol=0, equal_nan=True), where
            else:
                assert np.array_equal(x, y), where
        elif isinstance(x, float):
            assert x == pytest.approx(y, rel=1e-9, nan_ok=True), where
        else:
            assert x == y, f"{where}: {x!r} != {y!r}"

    assert a.grid_spec == b.grid_spec
    assert a.window == b.window
    pd.testing.assert_frame_equal(a.diagnostics, b.diagnostics, rtol=1e-9)
    for ra, rb in zip(a.runs, b.runs, strict=True):
        assert ra.block_len == rb.block_len and ra.block_metric == rb.block_metric
        assert ra.block_len_good == rb.block_len_good
        assert ra.block_len_latency == rb.block_len_latency
        same(ra.units, rb.units, f"{ra.run_id}.units")
        same(ra.grid, rb.grid, f"{ra.run_id}.grid")
        same(ra.hist, rb.hist, f"{ra.run_id}.hist")
        same(ra.tail, rb.tail, f"{ra.run_id}.tail")
        assert (ra.cells is None) == (rb.cells is None)
        if ra.cells is not None:
            same(ra.cells.sums, rb.cells.sums, f"{ra.run_id}.cells.sums")
            same(ra.cells.hist, rb.cells.hist, f"{ra.run_id}.cells.hist")
    if a.cell_index is not None:
        pd.testing.assert_frame_equal(a.cell_index, b.cell_index)


def test_manifest_warmup_with_mser_fallback_cells_and_the_envelope(study_path, spark):
    cells = Cells(input_edges=(256, 1024), tenant=True, hist=("ttft", "tpot"))
    d = reduce_study(study_path, SLO_TT, cells=cells)
    s = reduce_study(study_path, SLO_TT, cells=cells, engine="spark", spark=spark)
    assert [r.n for r in d.runs] == [r.n for r in s.runs]
    assert set(d.diagnostics["warmup_source"]) == {"manifest", "mser5"}
    assert d.diagnostics["duplicates"].tolist() == [0, 2, 0, 0]
    assert d.runs[2].n > FINE_UNITS  # the block length from fine units, not requests
    assert_same(d, s)
    ed = fit_from_stats(d, d.slo, reps=200, seed=7)
    es = fit_from_stats(s, s.slo, reps=200, seed=7)
    assert dataclasses.asdict(ed.cslo) == dataclasses.asdict(es.cslo)
    pd.testing.assert_frame_equal(ed.runs, es.runs)


def test_mser_window_ttft_only_slo_and_itl_axis(study_path, spark):
    # a TTFT-only SLO: the TPOT axis of the grid is anchored on the pooled p90 bucket
    d = reduce_study(study_path, "ttft_ms=250,attainment=0.9", warmup="mser")
    s = reduce_study(study_path, "ttft_ms=250,attainment=0.9", warmup="mser",
                     engine="spark", spark=spark)
    assert_same(d, s)
    # ITL limit without TPOT: the grid's second axis is the ITL statistic (type-7 p99 of
    # the gap list, computed by each engine's own list function)
    slo = "ttft_ms=300,itl_ms=45,e2e_ms=9000,attainment=0.9"
    assert_same(reduce_study(study_path, slo, warmup="none"),
                reduce_study(study_path, slo, warmup="none", engine="spark", spark=spark))


def test_time_units(study_path, spark):
    units = TimeUnits({"r0": 0.1, "r1": 2.0, "r2": 5.0, "r3": 0.05})
    d = reduce_study(study_path, SLO_TT, units=units)
    s = reduce_study(study_path, SLO_TT, units=units, engine="spark", spark=spark)
    assert any(np.any(r.units["n"] == 0) for r in d.runs)  # empty units too
    assert_same(d, s)


def test_file_uri_and_a_catalog_table(study_path, spark):
    from capplan.sparkstudy import open_spark_study

    ref = reduce_study(study_path, SLO_TT, units=CountUnits(50))
    uri = open_spark_study(study_path.resolve().as_uri(), spark=spark)
    assert_same(ref, reduce_study(uri, SLO_TT, units=CountUnits(50)))
    spark.read.parquet(*(p.resolve().as_uri() for p in sorted(
        (study_path / C.EVENTS_DIR).rglob("*.parquet")))).createOrReplaceTempView("mixed_events")
    tab = open_spark_study(study_path / C.MANIFEST_NAME, spark=spark, table="mixed_events")
    assert tab.root == "mixed_events"
    assert_same(ref, reduce_study(tab, SLO_TT, units=CountUnits(50)))


def _messages(exc: StudyError) -> list[tuple]:
    return [(p.message, p.column, p.code) for p in exc.problems]


def test_bad_input_gets_the_duckdb_messages(tmp_path, spark, capsys):
    from capplan.cli import main

    import pyarrow.parquet as pq

    runs, events = make_events(1, sizes=(50,))

    def broken(name, frame):  # a valid study whose events file is then replaced
        path = write_study(tmp_path / name, manifest_dict(name, runs), events)
        for f in (path / C.EVENTS_DIR).rglob("*.parquet"):
            f.unlink()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False),
                       path / C.EVENTS_DIR / "part.parquet")
        return path

    cases = {"missing": tmp_path / "nope",
             "no_column": broken("nc", events.drop(columns=["scheduled_ns"])),
             "wrong_type": broken("wt", events.astype({"scheduled_ns": "float64"}))}
    for name, path in cases.items():
        with pytest.raises(StudyError) as d:
            reduce_study(path, SLO_TT)
        with pytest.raises(StudyError) as s:
            reduce_study(path, SLO_TT, engine="spark", spark=spark)
        assert _messages(d.value) == _messages(s.value), name
        capsys.readouterr()
        assert main(["envelope", str(path), "--slo", SLO_TT, "--engine", "spark"]) == 2
        err = capsys.readouterr().err
        assert d.value.problems[0].message in err and "Traceback" not in err
    # a catalog table without a column: the message names the table and the column
    spark.createDataFrame(events.drop(columns=["itl_ns", "scheduled_ns"])
                          ).createOrReplaceTempView("no_sched")
    from capplan.sparkstudy import open_spark_study

    with pytest.raises(StudyError) as t:
        open_spark_study(cases["no_column"], spark=spark, table="no_sched")
    assert t.value.problems[0].column == "scheduled_ns"
    assert t.value.problems[0].file == "no_sched"
    # a catalog table of the wrong type: the type named as DuckDB names it, read from the
    # schema Spark sees (the path a remote folder takes too)
    spark.createDataFrame(events.drop(columns=["itl_ns"]).astype({"scheduled_ns": "float64"})
                          ).createOrReplaceTempView("float_sched")
    with pytest.raises(StudyError) as t:
        open_spark_study(cases["no_column"], spark=spark, table="float_sched")
    with pytest.raises(StudyError) as d:
        reduce_study(cases["wrong_type"], SLO_TT)
    assert _messages(t.value) == _messages(d.value)
    assert t.value.problems[0].file == "float_sched"
    # a table the catalog does not hold, from the command line: exit 2, no traceback
    assert main(["envelope", str(cases["no_column"] / C.MANIFEST_NAME), "--slo", SLO_TT,
                 "--engine", "spark", "--events-table", "no_such_table"]) == 2
    err = capsys.readouterr().err
    assert "table not found" in err and "no_such_table" in err and "Traceback" not in err


def test_cloud_scheme_without_its_connector_is_a_clear_error(spark):
    from capplan.sparkstudy import open_spark_study

    with pytest.raises(StudyError) as e:
        open_spark_study("s3a://some-bucket/study", spark=spark)
    assert "connector" in str(e.value) and "hadoop-aws" in e.value.problems[0].fix


def test_the_commands_give_the_same_output_on_both_engines(study_path, spark, tmp_path, capsys):
    """`capplan envelope` (JSON) and `capplan summarize` (text and CSV) with --engine spark
    print and write what the DuckDB engine does (the study's exact type-7 percentiles too)."""
    import json

    from capplan.cli import main

    out = {}
    for engine in ("duckdb", "spark"):
        js = tmp_path / f"{engine}.json"
        assert main(["envelope", str(study_path), "--slo", SLO_TT, "--reps", "100",
                     "--engine", engine, "--out", str(js)]) == 0
        text = capsys.readouterr().out.replace(str(js), "OUT")
        csv = tmp_path / f"{engine}.csv"
        # --no-check: the study holds events recorded twice on purpose (validate rejects it)
        assert main(["summarize", str(study_path), "--slo", SLO_TT, "--engine", engine,
                     "--no-check", "--out", str(csv)]) == 0
        summ = capsys.readouterr().out.replace(str(csv), "OUT")
        out[engine] = (json.loads(js.read_text()), text, summ, pd.read_csv(csv))
    assert out["duckdb"][:3] == out["spark"][:3]
    # the exact percentiles may differ in the last bit (two interpolation codes): the CSV
    # keeps every digit, the printed table does not
    pd.testing.assert_frame_equal(out["duckdb"][3], out["spark"][3], rtol=1e-12)


def test_a_local_master_gets_two_shuffle_partitions_per_core():
    """Spark's 200 default shuffle partitions are for a cluster; on one machine the reduction
    uses two per local thread (a cluster master keeps Spark's default)."""
    import os

    from capplan.sparkstudy import _local_cores

    assert _local_cores("local") == 1 and _local_cores("local[3]") == 3
    assert _local_cores("local[4,2]") == 4 and _local_cores("local[*]") == os.cpu_count()
    assert _local_cores("spark://host:7077") is None and _local_cores("yarn") is None
