"""Inputs every command checks the same way: a study whose study.yaml lists runs without events
is refused (exit 2, naming the runs, the file and the fix) by every command that reads a study,
not only by `capplan validate`; an SLO limit whose size suggests the wrong unit (seconds or
microseconds typed as ms) is said in one WARNING line, with the value meant, by every command
that takes an SLO."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from capplan import report as R
from capplan.cli import main
from capplan.errors import SLOUnitWarning, SpecError, StudyError
from capplan.slo import SLO, unit_warnings
from capplan.study import open_study, runs_without_events
from conftest import ev, events_frame

SECONDS = "ttft_ms=0.5 looks like seconds: did you mean ttft_ms=500?"


def _rows(run_id: str, rate_rps: float, n: int = 30) -> list[dict]:
    return [ev(run_id, f"{run_id}-{i}", scheduled_ms=i * 1000.0 / rate_rps, ttft_ms=150.0,
               e2e_ms=900.0) for i in range(n)]


@pytest.fixture
def sweep(make_study):
    """Three runs with events, one file per run (how importers and synth write them)."""
    rows = _rows("r1", 2.0) + _rows("r2", 4.0) + _rows("r3", 8.0)
    frame = events_frame(rows)
    files = {f"{r}.parquet": frame[frame.run_id == r] for r in ("r1", "r2", "r3")}
    return make_study(files, runs=[{"run_id": r, "offered_rps": x, "duration_s": 30}
                                   for r, x in (("r1", 2.0), ("r2", 4.0), ("r3", 8.0))],
                      system={"gpus_per_replica": 4})  # as the bundled plan spec says


@pytest.fixture
def partial(make_study):
    """study.yaml lists five runs; only r1 and r3 have events (the others' files were lost)."""
    rows = _rows("r1", 2.0) + _rows("r3", 8.0)
    frame = events_frame(rows)
    files = {f"{r}.parquet": frame[frame.run_id == r] for r in ("r1", "r3")}
    return make_study(files, runs=[{"run_id": r, "offered_rps": x, "duration_s": 30} for r, x in
                                   (("r1", 2.0), ("r2", 4.0), ("r3", 8.0), ("r4", 12.0), ("r5", 16.0))])


# -- runs without events ------------------------------------------------------------------------

def test_open_study_refuses_runs_without_events_naming_them(partial):
    with pytest.raises(StudyError) as err:
        open_study(partial)
    (p,) = err.value.problems
    assert p.code == "run_without_events" and p.file == str(partial / "study.yaml")
    assert p.message.startswith("3 of the 5 runs of study.yaml have no events: r2, r4, r5;")
    assert "remove the runs from study.yaml" in p.fix and str(partial / "events") in p.fix


def test_runs_without_events_reads_footers_or_scans(tmp_path, sweep):
    """One run per row group: the footers settle it. Several runs in one row group (r1..r3 in
    one range, r2 absent but inside it) or no statistics: a scan of run_id settles it."""
    assert runs_without_events(open_study(sweep)) == ()
    mixed = events_frame(_rows("r1", 2.0) + _rows("r3", 8.0))
    table = pa.Table.from_pandas(mixed, preserve_index=False)
    for stats, name in ((True, "stats"), (False, "nostats")):
        root = tmp_path / name
        (root / "events").mkdir(parents=True)
        (root / "study.yaml").write_text(
            "contract: capplan-study/1\nname: m\nsystem: {}\nload_model: open\nruns:\n"
            "  - {run_id: r1, offered_rps: 2.0}\n  - {run_id: r2, offered_rps: 4.0}\n"
            "  - {run_id: r3, offered_rps: 8.0}\n  - {run_id: r9, offered_rps: 9.0}\n",
            encoding="utf-8")
        pq.write_table(table, root / "events" / "all.parquet", write_statistics=stats)
        st = open_study(root, check_runs=False)
        assert runs_without_events(st) == ("r2", "r9"), name


def test_spark_engine_refuses_it_before_spark_starts(partial, monkeypatch):
    """The Spark engine's local checks (before any JVM) refuse the same study the same way."""
    from capplan import sparkstudy

    def no_spark(*_a, **_k):
        raise AssertionError("Spark was started for a study that should be refused")

    monkeypatch.setattr(sparkstudy, "spark_session", no_spark)
    with pytest.raises(StudyError) as err:
        sparkstudy.open_spark_study(str(partial))
    assert err.value.problems[0].code == "run_without_events"
    assert "r2, r4, r5" in err.value.problems[0].message


@pytest.mark.parametrize("args", [
    ["plan", "{s}", "--spec", "{spec}", "--out", "{tmp}/plan"],
    ["report", "{s}", "--out", "{tmp}/report"],
    ["envelope", "{s}", "--slo", "ttft_ms=2000"],
    ["design", "{s}", "--slo", "ttft_ms=2000"],
    ["mix", "{s}", "--slo", "ttft_ms=2000", "--target", "{s}/events/r1.parquet"],
    ["twin", "fit", "{s}", "--out", "{tmp}/twin.yaml"],
    ["twin", "check", "{s}", "--holdout", "1", "--slo", "ttft_ms=2000"],
    ["whatif", "{s}"],
    ["compare", "{s}", "{s}", "--slo", "ttft_ms=2000"],
    ["summarize", "{s}"],
    ["timeline", "{s}", "--slo", "ttft_ms=2000"],
    ["cache", "{s}", "--slo", "ttft_ms=2000"],
    ["validate", "{s}"],
], ids=lambda a: " ".join(a[:2]) if a[0] == "twin" else a[0])
def test_every_command_refuses_a_study_with_runs_without_events(args, partial, tmp_path, capsys,
                                                                monkeypatch):
    def no_kernel():
        raise AssertionError("a kernel was started for a study that should be refused")

    monkeypatch.setattr(R, "ensure_kernel", no_kernel)
    monkeypatch.chdir(tmp_path)
    spec = R.default_spec_path()
    rc = main([a.format(s=partial, spec=spec, tmp=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "r2" in err and "r4" in err and "r5" in err and str(partial / "study.yaml") in err
    assert "remove the run" in err and "Traceback" not in err


# -- SLO units ----------------------------------------------------------------------------------

@pytest.mark.parametrize("slo, lines", [
    ("ttft_ms=0.5", [SECONDS]),
    ("ttft_ms=2000,tpot_ms=0.05", ["tpot_ms=0.05 looks like seconds: did you mean tpot_ms=50?"]),
    ("ttft_ms=2000,itl_ms=0.2,itl_stat=max", ["itl_ms=0.2 looks like seconds: did you mean itl_ms=200?"]),
    ("e2e_ms=3", ["e2e_ms=3 looks like seconds: did you mean e2e_ms=3000?"]),
    ("ttft_ms=2000000", ["ttft_ms=2000000 looks like microseconds: did you mean ttft_ms=2000?"]),
    ("ttft_ms=0.3,tpot_ms=120000", ["ttft_ms=0.3 looks like seconds: did you mean ttft_ms=300?",
                                    "tpot_ms=120000 looks like microseconds: did you mean tpot_ms=120?"]),
    # the edges of the plausible ranges, and ordinary SLOs: nothing said
    ("ttft_ms=10,tpot_ms=1,itl_ms=1,e2e_ms=10", []),
    ("ttft_ms=600000,tpot_ms=60000,e2e_ms=3600000", []),
    ("ttft_ms=2000,tpot_ms=100,attainment=0.99", []),
])
def test_unit_warnings_name_the_likely_mistake(slo, lines):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = unit_warnings(SLO.parse(slo))
    assert [s.split(" (")[0] for s in said] == lines
    assert [str(w.message) for w in caught if w.category is SLOUnitWarning] == list(said)


def _stop(*_a, **_k):
    raise SpecError("stopped by the test after the inputs were read")


@pytest.mark.parametrize("args", [
    ["plan", "--spec", "{spec}", "--out", "{tmp}/plan", "--capacity-rps", "5", "--slo", "{slo}"],
    ["report", "{s}", "--out", "{tmp}/report", "--slo", "{slo}"],
    ["whatif", "{s}", "--slo", "{slo}"],
    ["envelope", "{s}", "--slo", "{slo}", "--reps", "50"],
    ["design", "{s}", "--slo", "{slo}", "--reps", "50"],
    ["mix", "{s}", "--slo", "{slo}", "--target", "{s}/events/r1.parquet", "--reps", "50"],
    ["twin", "check", "{s}", "--twin", "{tmp}/none.yaml", "--slo", "{slo}"],
    ["compare", "{s}", "{s}", "--slo", "{slo}", "--reps", "100"],
    ["summarize", "{s}", "--slo", "{slo}"],
    ["timeline", "{s}", "--slo", "{slo}"],
    ["cache", "{s}", "--slo", "{slo}"],
], ids=lambda a: " ".join(a[:2]) if a[0] == "twin" else a[0])
def test_every_command_taking_an_slo_warns_of_an_implausible_unit(args, sweep, tmp_path, capsys,
                                                                   monkeypatch):
    """Whatever the command then does (the report and what-if are stopped before any kernel),
    the unit warning is on stderr exactly once, before anything else fails."""
    monkeypatch.setattr(R, "ensure_kernel", _stop)
    monkeypatch.chdir(tmp_path)  # design writes design.yaml where it runs
    main([a.format(s=sweep, spec=R.default_spec_path(), tmp=tmp_path, slo="ttft_ms=0.5")
          for a in args])
    err = capsys.readouterr().err
    assert err.count("WARNING: " + SECONDS) == 1, err


def test_the_spec_slo_is_checked_too(tmp_path, capsys, monkeypatch):
    """An SLO written in plan.yaml (not on the command line) gets the same warning."""
    monkeypatch.chdir(tmp_path)
    text = R.default_spec_path().read_text(encoding="utf-8")
    spec = tmp_path / "plan.yaml"
    doc = yaml.safe_load(text)
    doc["slo"] = {"ttft_ms": 0.5, "attainment": 0.99}
    doc.pop("slo_classes", None)
    spec.write_text(yaml.safe_dump(doc), encoding="utf-8")
    main(["plan", "--spec", str(spec), "--out", str(tmp_path / "p"), "--capacity-rps", "5"])
    assert capsys.readouterr().err.count("WARNING: " + SECONDS) == 1


def test_plausible_slo_says_nothing(sweep, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["summarize", str(sweep), "--slo", "ttft_ms=2000,tpot_ms=100"]) == 0
    assert "WARNING" not in capsys.readouterr().err

