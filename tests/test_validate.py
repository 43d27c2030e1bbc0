"""Every bad-input case of the study contract: message text, file/column/example, exit code 2."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from capplan.cli import main
from capplan.errors import StudyError
from capplan.io import manifest_dict
from capplan.study import open_study
from capplan.validate import open_checked
from capplan.validate import validate_path
from conftest import ev, events_frame


def good_rows(run="r1", n=20, rate=2.0, **kw):
    return [ev(run, f"{run}-{i}", scheduled_ms=i * 1000 / rate, **kw) for i in range(n)]


def runs(*ids, rate=2.0):
    return [{"run_id": r, "offered_rps": rate} for r in ids]


def write_raw(dest, tables: dict, manifest: dict | str):
    """A study written without the contract coercion of io.write_study (for bad dtypes etc.)."""
    (dest / "events").mkdir(parents=True)
    for name, t in tables.items():
        if isinstance(t, (bytes, str)):
            (dest / "events" / name).write_bytes(t if isinstance(t, bytes) else t.encode())
        else:
            pq.write_table(t if isinstance(t, pa.Table) else pa.Table.from_pandas(t, preserve_index=False),
                           dest / "events" / name)
    text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest, sort_keys=False)
    (dest / "study.yaml").write_text(text)
    return dest


def run_validate(path, capsys):
    rc = main(["validate", str(path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_error(path, capsys, *needles):
    rc, out, err = run_validate(path, capsys)
    assert rc == 2, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, f"{n!r} not in:\n{err}"
    return err


def test_valid_study_ok_line(make_study, capsys):
    path = make_study(good_rows("r1") + good_rows("r2"), runs=runs("r1", "r2"))
    rc, out, err = run_validate(path, capsys)
    assert rc == 0, err
    assert out.strip() == "OK: 2 runs, 40 events"
    assert err == ""


def test_corrupt_parquet(make_study, capsys, tmp_path):
    path = make_study(good_rows(), runs=runs("r1"))
    (path / "events" / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    good = path / "events" / "events.parquet"
    data = good.read_bytes()
    (path / "events" / "truncated.parquet").write_bytes(data[: len(data) // 2])
    err = assert_error(path, capsys, "cannot read parquet file", "broken.parquet",
                       "truncated.parquet", "re-export it", "row-level checks were skipped")
    assert err.count("cannot read parquet file") == 2
    with pytest.raises(StudyError, match="cannot read parquet file"):
        open_study(path)


def test_corrupt_data_pages_name_the_file(make_study, capsys):
    rows = good_rows(n=2000)
    path = make_study({"a.parquet": events_frame(rows[:1000]), "b.parquet": events_frame(rows[1000:])},
                      runs=runs("r1"))
    bad = path / "events" / "b.parquet"
    data = bytearray(bad.read_bytes())
    for i in range(100, len(data) // 2, 7):  # smash the data pages, keep the footer
        data[i] = 0xFF
    bad.write_bytes(bytes(data))
    err = assert_error(path, capsys, "cannot read parquet data", "b.parquet", "re-export it")
    assert "a.parquet" not in err
    assert main(["summarize", str(path), "--no-check"]) == 2
    err = capsys.readouterr().err
    assert "cannot read parquet data" in err and "b.parquet" in err and "Traceback" not in err


def test_bad_yaml(tmp_path, capsys):
    path = write_raw(tmp_path / "s", {"e.parquet": events_frame(good_rows())},
                     "contract: capplan-study/1\nruns: [ {run_id: r1\n  name: x\n")
    assert_error(path, capsys, "study.yaml is not valid YAML at line", "study.yaml",
                 "check indentation and quoting")
    with pytest.raises(StudyError, match="not valid YAML"):
        open_study(path)


def test_missing_manifest_fields(tmp_path, capsys):
    m = manifest_dict("x", runs("r1"))
    del m["name"], m["system"]
    m["runs"] = [{"run_id": "r1"}, {"offered_rps": 3}]
    path = write_raw(tmp_path / "s", {"e.parquet": events_frame(good_rows())}, m)
    assert_error(path, capsys, "missing the required field 'name'",
                 "missing the required field 'system'", "run r1: open-loop runs need 'offered_rps'",
                 "runs[1] has no run_id", "fix:     add offered_rps: 4.0")


def test_missing_required_column(tmp_path, capsys):
    df = events_frame(good_rows()).drop(columns=["status", "input_tokens"])
    path = write_raw(tmp_path / "s", {"part-0.parquet": df}, manifest_dict("x", runs("r1")))
    err = assert_error(path, capsys, "required column 'status' is missing",
                       "required column 'input_tokens' is missing", "part-0.parquet",
                       "column:  status", "columns present: run_id, request_id")
    assert "add 'status' (string)" in err


def test_wrong_dtype(tmp_path, capsys):
    df = events_frame(good_rows())
    df["scheduled_ns"] = df["scheduled_ns"].astype("float64") / 1e9
    df["output_tokens"] = df["output_tokens"].astype(str)
    path = write_raw(tmp_path / "s", {"e.parquet": df}, manifest_dict("x", runs("r1")))
    assert_error(path, capsys, "column 'scheduled_ns' has type double, expected int64",
                 "cast it to int64 nanoseconds", "example: row 0: scheduled_ns=0.0",
                 "column 'output_tokens' has type large_string, expected int64",
                 "example: row 0: output_tokens='10'")


def test_nulls_in_required_columns(tmp_path, capsys):
    df = events_frame(good_rows())
    df.loc[3, "input_tokens"] = None
    df.loc[5, "request_id"] = None
    path = write_raw(tmp_path / "s", {"e.parquet": df}, manifest_dict("x", runs("r1")))
    assert_error(path, capsys, "required column 'input_tokens' is null in 1 of 20 rows",
                 "example: row 3: run_id='r1', request_id='r1-3'",
                 "required column 'request_id' is null in 1 of 20 rows",
                 "write 0 when there are none")


def test_unknown_status(make_study, capsys):
    rows = good_rows()
    rows[7]["status"] = "success"
    rows[9]["status"] = "OK"
    path = make_study(rows, runs=runs("r1"))
    assert_error(path, capsys, "unknown status in 2 of 20 rows", "column:  status",
                 "row 7: run_id='r1', request_id='r1-7', status='success'",
                 "use one of ok, rejected, timeout, error, cancelled")


def test_run_absent_from_manifest_and_run_without_events(make_study, capsys):
    path = make_study(good_rows("r1") + good_rows("rX", n=3), runs=runs("r1", "r2"))
    assert_error(path, capsys, "run_id is not a run of study.yaml in 3 of 23 rows",
                 "request_id='rX-0'", "run 'r2' of study.yaml has no events",
                 "remove the run from study.yaml")


def test_duplicate_request_id_across_files(make_study, capsys):
    a = events_frame(good_rows(n=10))
    b = events_frame(good_rows(n=10)).iloc[[4]]  # r1-4 again, in a second file
    path = make_study({"a.parquet": a, "sub/b.parquet": b}, runs=runs("r1"))
    err = assert_error(path, capsys, "run 'r1': request_id is not unique (1 duplicate rows)",
                       "request_id='r1-4' appears 2 times", "row 4 of ", "a.parquet",
                       "sub/b.parquet", "column:  request_id")
    assert "one row per offered request" in err


def test_first_token_before_scheduled_and_last_before_first(make_study, capsys):
    rows = good_rows()
    rows[2]["first_token_ns"] = rows[2]["scheduled_ns"] - 5
    rows[4]["last_token_ns"] = rows[4]["first_token_ns"] - 1
    path = make_study(rows, runs=runs("r1"))
    assert_error(path, capsys, "first_token_ns is before scheduled_ns in 1 of 20 rows",
                 "request_id='r1-2'", "last_token_ns is before first_token_ns in 1 of 20 rows",
                 "request_id='r1-4'", "share one monotonic clock")


def test_negative_token_counts(make_study, capsys):
    rows = good_rows()
    rows[1]["output_tokens"] = -3
    rows[2]["input_tokens"] = -1
    rows[3]["max_output_tokens"] = -8
    path = make_study(rows, runs=runs("r1"))
    assert_error(path, capsys, "output_tokens is negative in 1 of 20 rows",
                 "input_tokens is negative in 1 of 20 rows",
                 "max_output_tokens is negative in 1 of 20 rows", "write 0 or more")


def test_ok_without_first_token(make_study, capsys):
    rows = good_rows()
    rows[6].update(first_token_ns=None, last_token_ns=None)
    path = make_study(rows, runs=runs("r1"))
    assert_error(path, capsys, "status is 'ok' but first_token_ns is null in 1 of 20 rows",
                 "request_id='r1-6'", "give the request a failure status")


@pytest.mark.parametrize("unit,factor,needle", [
    ("milliseconds", 1e-6, "multiply every *_ns column by 1,000,000 (ms → ns)"),
    ("seconds", 1e-9, "multiply every *_ns column by 1,000,000,000 (s → ns)"),
])
def test_timestamps_in_seconds_or_ms(make_study, capsys, unit, factor, needle):
    rows = good_rows(n=20, rate=2.0)  # a 10 s run
    for r in rows:
        for c in ("scheduled_ns", "sent_ns", "first_token_ns", "last_token_ns"):
            r[c] = int(round(r[c] * factor))
    path = make_study(rows, runs=[{"run_id": "r1", "offered_rps": 2.0, "duration_s": 10}])
    assert_error(path, capsys, f"run 'r1': timestamps look like {unit}, not nanoseconds", needle,
                 "for a 10 s run", "column:  scheduled_ns")
    # without duration_s the latency scale still gives it away
    path2 = make_study(rows, runs=runs("r1"))
    assert_error(path2, capsys, f"timestamps look like {unit}")


def test_offered_rate_warning_exit_zero(make_study, capsys):
    # nominal 2 req/s, but the generator offered 20 requests in 4.75 s (4 req/s: +100 %)
    path = make_study(good_rows(n=20, rate=4.0), runs=runs("r1", rate=2.0))
    rc, out, err = run_validate(path, capsys)
    assert rc == 0
    assert "WARNING: run 'r1': offered rate measured from scheduled_ns is 4 req/s, +100% off " \
           "the nominal offered_rps 2" in err
    assert "OK: 1 runs, 20 events (1 warning(s) above)" in out
    # within 10 %: no warning
    path = make_study(good_rows(n=20, rate=2.1), runs=runs("r1", rate=2.0))
    rc, out, err = run_validate(path, capsys)
    assert rc == 0 and "WARNING" not in err


def test_epoch_clock_warning(make_study, capsys):
    rows = good_rows()
    base = 1_760_000_000 * 10**9
    for r in rows:
        for c in ("scheduled_ns", "sent_ns", "first_token_ns", "last_token_ns"):
            r[c] += base
    rc, out, err = run_validate(make_study(rows, runs=runs("r1")), capsys)
    assert rc == 0 and "looks like wall-clock epoch time" in err


def test_lists_every_problem_not_just_the_first(make_study, capsys):
    rows = good_rows()
    rows[0]["status"] = "weird"
    rows[1]["output_tokens"] = -1
    rows[2]["first_token_ns"] = None
    rows[2]["last_token_ns"] = None
    rows += [dict(rows[5])]  # duplicate
    path = make_study(rows + good_rows("zz", n=2), runs=runs("r1", "r9"))
    err = assert_error(path, capsys, "unknown status", "output_tokens is negative",
                       "first_token_ns is null", "request_id is not unique",
                       "run_id is not a run of study.yaml", "run 'r9' of study.yaml has no events",
                       "FAILED: 6 error(s), 0 warning(s)")
    problems, _ = validate_path(path)
    assert {p.code for p in problems.errors} == {
        "unknown_status", "negative_output_tokens", "ok_without_first_token",
        "duplicate_request_id", "unknown_run", "run_without_events"}
    for p in problems.errors:
        assert p.fix and p.column


def test_open_checked_raises_every_error(make_study):
    rows = good_rows()
    rows[0]["status"] = "weird"
    rows[1]["input_tokens"] = -1
    path = make_study(rows, runs=runs("r1"))
    open_study(path)  # schema is fine: opening without the row checks works
    with pytest.raises(StudyError) as ei:
        open_checked(path)
    text = ei.value.format()
    assert "unknown status" in text and "input_tokens is negative" in text


def test_missing_study_dir_and_events(tmp_path, capsys):
    assert_error(tmp_path / "nope", capsys, "study directory does not exist")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "study.yaml").write_text(yaml.safe_dump(manifest_dict("x", runs("r1"))))
    assert_error(tmp_path / "s", capsys, "no event files: events/ holds no .parquet file")


def test_summarize_refuses_invalid_study(make_study, capsys):
    rows = good_rows()
    rows[3]["status"] = "weird"
    path = make_study(rows, runs=runs("r1"))
    rc = main(["summarize", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown status" in err and "Traceback" not in err


def test_contract_doc_documents_every_contract_name():
    from pathlib import Path

    from capplan import contract as C

    doc = (Path(__file__).resolve().parents[1] / "docs" / "study-contract.md").read_text()
    for c in C.EVENT_COLUMNS + C.RESOURCE_COLUMNS:
        assert f"| `{c.name}` |" in doc, c.name
        assert c.meaning in doc, c.name
    for s in C.STATUSES:
        assert f"| `{s}` |" in doc, s
    for c in C.TIMELINE_COLUMNS + C.ENGINE_METRIC_COLUMNS:
        assert f"| `{c.name}` |" in doc and c.meaning in doc, c.name
    for e in C.TIMELINE_EVENTS:
        assert f"| `{e}` |" in doc, e
    for k in C.MANIFEST_REQUIRED + C.SYSTEM_KEYS + C.RUN_OPTIONAL + C.ARRIVALS:
        assert f"`{k}`" in doc, k
    assert C.CONTRACT_VERSION in doc and C.PERCENTILE_DEFINITION in doc
