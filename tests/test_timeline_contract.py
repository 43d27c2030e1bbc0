"""The optional timeline/ table: opened as a view, checked by `capplan validate` (every bad
row named with file, column, example and fix; exit 2), hashed with the study."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from capplan import contract as C
from capplan.cli import main
from capplan.errors import StudyError
from capplan.study import open_study
from capplan.validate import validate_path

from conftest import ev

S = C.NS_PER_S


def _events():
    return [ev("r1", scheduled_ms=i * 100.0, replica_group=f"rep-{i % 2}") for i in range(50)]


RUNS = [{"run_id": "r1", "offered_rps": 10.0, "duration_s": 5}]


def test_good_timeline_opens_as_a_view_with_every_column(make_study):
    tl = [{"run_id": "r1", "t_ns": 1 * S, "event": "replica_failed", "replica": "rep-1"},
          {"run_id": "r1", "t_ns": 2 * S, "event": "replica_added", "replica": "rep-2"},
          {"run_id": "r1", "t_ns": 3 * S, "event": "replica_ready", "replica": "rep-2"},
          {"run_id": "r1", "t_ns": 3 * S, "event": "scale_decision", "desired": 2, "ready": 1}]
    path = make_study(_events(), runs=RUNS, timeline=tl)
    problems, st = validate_path(path)
    assert not problems.errors, [p.format() for p in problems.errors]
    df = st.sql("SELECT * FROM timeline ORDER BY t_ns, event").df()
    assert list(df.columns) == [c.name for c in C.TIMELINE_COLUMNS]
    assert len(df) == 4 and df["detail"].isna().all()
    assert open_study(path).timeline_files
    assert main(["validate", str(path)]) == 0


def test_a_study_without_timeline_has_no_view(make_study):
    st = open_study(make_study(_events(), runs=RUNS))
    assert st.timeline_files == ()
    assert not st.sql("SELECT count(*) FROM duckdb_views() WHERE view_name = 'timeline'").fetchone()[0]


@pytest.mark.parametrize("row, code, words", [
    ({"event": "replica_exploded", "replica": "rep-1"}, "timeline_unknown_event", "unknown event"),
    ({"event": "replica_ready", "replica": "rep-1", "t_ns": 99 * S}, "timeline_time_outside_run",
     "outside its run"),
    ({"event": "replica_ready", "replica": "rep-1", "t_ns": -5}, "timeline_time_outside_run",
     "outside its run"),
    ({"event": "replica_failed", "replica": "rep-7"}, "timeline_unknown_replica", "unknown replica"),
    ({"event": "scale_decision"}, "timeline_decision_without_desired", "without desired"),
    ({"event": "scale_decision", "desired": 2, "run_id": "r9"}, "timeline_unknown_run",
     "not a run of study.yaml"),
])
def test_bad_timeline_rows_are_named(make_study, capsys, row, code, words):
    full = {"run_id": "r1", "t_ns": 1 * S, **row}
    good = {"run_id": "r1", "t_ns": 2 * S, "event": "replica_failed", "replica": "rep-0"}
    path = make_study(_events(), runs=RUNS, timeline=[good, full])
    problems, _ = validate_path(path)
    bad = [p for p in problems.errors if p.code == code]
    assert len(bad) == 1, [p.format() for p in problems.errors]
    p = bad[0]
    assert words in p.message and "1 of 2 rows" in p.message
    assert p.file.endswith("timeline.parquet") and p.column and p.fix
    assert p.example.startswith("row 1:")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_unknown_replica_fix_lists_the_known_ones(make_study):
    path = make_study(_events(), runs=RUNS,
                      timeline=[{"run_id": "r1", "t_ns": S, "event": "replica_failed", "replica": "rep-7"}])
    p = [p for p in validate_path(path)[0].errors if p.code == "timeline_unknown_replica"][0]
    assert "rep-0, rep-1" in p.fix


def test_a_replica_added_in_the_timeline_is_known(make_study):
    tl = [{"run_id": "r1", "t_ns": S, "event": "replica_added", "replica": "new"},
          {"run_id": "r1", "t_ns": 2 * S, "event": "replica_ready", "replica": "new"}]
    assert not validate_path(make_study(_events(), runs=RUNS, timeline=tl))[0].errors


def test_timeline_schema_problems_stop_the_open(make_study, tmp_path):
    path = make_study(_events(), runs=RUNS)
    (path / C.TIMELINE_DIR).mkdir()
    pq.write_table(pa.table({"run_id": ["r1"], "t_ns": [1.5], "what": ["x"]}),
                   path / C.TIMELINE_DIR / "t.parquet")
    problems, _ = validate_path(path)
    codes = sorted(p.code for p in problems.errors)
    assert codes == ["missing_column", "wrong_dtype"], codes
    with pytest.raises(StudyError) as exc:
        open_study(path)
    assert "event" in exc.value.format() and "t_ns" in exc.value.format()


def test_timeline_is_part_of_the_content_hash(make_study):
    rows = _events()
    a = make_study(rows, runs=RUNS)
    assert open_study(a).content_hash() == open_study(make_study(rows, runs=RUNS)).content_hash()
    b = make_study(rows, runs=RUNS, timeline=pd.DataFrame(
        [{"run_id": "r1", "t_ns": S, "event": "replica_failed", "replica": "rep-0"}]))
    assert open_study(a).content_hash() != open_study(b).content_hash()
