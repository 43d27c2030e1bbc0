"""`capplan import ... --into STUDY` / `capplan.importers.append_import`: appending runs to a study.

Fixtures: real AIPerf 0.13.0 runs (tests/fixtures/aiperf/into/COMMAND.md): a Poisson sweep at
2, 4 and 6 rps with 32-token prompts, and one 4 rps run with 200-token prompts (`isl200`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from capplan import open_study
from capplan.cli import main
from capplan.errors import StudyError
from capplan.importers import append_import, import_paths, write_import
from capplan.validate import validate_study

FIX = Path(__file__).parent / "fixtures" / "aiperf" / "into"
SWEEP = FIX / "sweep"
ISL200 = FIX / "isl200"


def _manifest(study: Path) -> dict:
    return yaml.safe_load((study / "study.yaml").read_text())


def _base(tmp_path) -> Path:
    out = tmp_path / "S"
    assert main(["import", "aiperf", str(SWEEP / "rate_4.0"), "--out", str(out)]) == 0
    return out


def test_into_appends_two_runs_and_the_envelope_fits(tmp_path, capsys):
    study = _base(tmp_path)
    rc = main(["import", "aiperf", str(SWEEP / "rate_2.0"), str(SWEEP / "rate_6.0"),
               "--into", str(study)])
    o = capsys.readouterr().out
    assert rc == 0
    assert "appended 63 requests from aiperf" in o
    m = _manifest(study)
    assert [r["run_id"] for r in m["runs"]] == ["rate_4.0", "rate_2.0", "rate_6.0"]
    assert [r["offered_rps"] for r in m["runs"]] == [4.0, 2.0, 6.0]
    assert m["runs_added"][0]["runs"] == ["rate_2.0", "rate_6.0"]
    # the workload is the summary of every event (all 32-token prompts, 8 tokens asked)
    assert m["workload"]["input_tokens"]["p50"] == 32 and m["workload"]["input_tokens"]["sd"] == 0
    assert m["workload"]["output_tokens"]["from"] == "asked"
    s = open_study(study)
    assert not validate_study(s).errors
    assert s.sql("SELECT count(*) FROM events").fetchone()[0] == 31 + 13 + 50
    assert sorted(p.name for p in (study / "events").iterdir()) == ["events.parquet",
                                                                   "import-2.parquet"]
    capsys.readouterr()
    assert main(["envelope", str(study), "--slo", "ttft_ms=2000,attainment=0.9"]) == 0


def test_into_refuses_another_prompt_length_naming_both(tmp_path, capsys):
    study = _base(tmp_path)
    before = (study / "study.yaml").read_text()
    rc = main(["import", "aiperf", str(ISL200), "--into", str(study)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "prompt lengths: study 32 (fixed), new run isl200 200 (fixed)" in err
    assert "field:   workload.input_tokens" in err and "--allow-workload-change" in err
    assert "Traceback" not in err
    # nothing changed, nothing left behind
    assert (study / "study.yaml").read_text() == before
    assert [p.name for p in (study / "events").iterdir()] == ["events.parquet"]
    assert not any(p.name.startswith(".S") for p in tmp_path.iterdir())


def test_allow_workload_change_lets_it_through_with_a_warning(tmp_path, capsys):
    study = _base(tmp_path)
    rc = main(["import", "aiperf", str(ISL200), "--into", str(study), "--allow-workload-change"])
    io = capsys.readouterr()
    assert rc == 0
    assert "WARNING: workload change allowed: prompt lengths: study 32 (fixed), new run isl200 " \
           "200 (fixed)" in io.err
    wl = _manifest(study)["workload"]
    assert wl["input_tokens"]["min"] == 32 and wl["input_tokens"]["max"] == 200
    assert wl["mixed"] == ["asked.input_tokens"] and "input_tokens" not in wl["asked"]


def test_derived_prompt_length_change_is_refused_by_the_library(tmp_path):
    """A copy of a sweep run whose token counts were rewritten (mean 64 instead of 32): refused
    by `append_import`, the function notebooks call."""
    import gzip
    import json

    study = _base(tmp_path)
    d = tmp_path / "copy" / "rate_6.0"
    d.mkdir(parents=True)
    lines = gzip.open(SWEEP / "rate_6.0" / "profile_export.jsonl.gz", "rt").read().splitlines()
    out = []
    for i, line in enumerate(lines):
        r = json.loads(line)
        r["metrics"]["input_sequence_length"]["value"] = 48 + (i % 2) * 32  # 48 / 80, mean 64
        out.append(json.dumps(r))
    (d / "profile_export.jsonl").write_text("\n".join(out) + "\n")
    res = import_paths("aiperf", [d])
    with pytest.raises(StudyError) as e:
        append_import(res, study)
    msg = str(e.value)
    assert "prompt lengths: study 32 (fixed), new run rate_6.0 64 (mean, p90 80)" in msg
    out_ = append_import(res, study, allow_workload_change=True)
    assert any("prompt lengths" in w for w in out_.warnings)


def test_same_source_refused_and_clashing_ids_renamed(tmp_path, capsys):
    study = _base(tmp_path)
    assert main(["import", "aiperf", str(SWEEP / "rate_4.0"), "--into", str(study)]) == 2
    assert "already holds" in capsys.readouterr().err
    other = tmp_path / "elsewhere" / "rate_4.0"
    shutil.copytree(SWEEP / "rate_4.0", other)
    assert main(["import", "aiperf", str(other), "--into", str(study)]) == 0
    o = capsys.readouterr()
    assert "rate_4.0-2:" in o.out and "run id rate_4.0 is taken" in o.err
    m = _manifest(study)
    assert [r["run_id"] for r in m["runs"]] == ["rate_4.0", "rate_4.0-2"]
    s = open_study(study)
    assert not validate_study(s).errors
    assert dict(s.sql("SELECT run_id, count(*) FROM events GROUP BY 1").fetchall()) == \
        {"rate_4.0": 31, "rate_4.0-2": 31}


def test_out_and_into_exactly_one(tmp_path, capsys):
    assert main(["import", "aiperf", str(SWEEP / "rate_4.0")]) == 2
    assert "exactly one of --out" in capsys.readouterr().err
    assert main(["import", "aiperf", str(SWEEP / "rate_4.0"), "--out", str(tmp_path / "a"),
                 "--into", str(tmp_path / "b")]) == 2
    capsys.readouterr()
    assert main(["import", "aiperf", str(SWEEP / "rate_4.0"), "--into", str(tmp_path / "nope")]) == 2
    assert "no study.yaml" in capsys.readouterr().err


def test_into_keeps_other_study_files_and_load_model_change(tmp_path, capsys):
    """Appending a closed-loop AIPerf run to an open study is a load-model change: refused,
    and with --allow-workload-change placed at its measured rate. Files beside the events
    (resources, notes) are carried over."""
    study = _base(tmp_path)
    (study / "resources").mkdir()
    (study / "NOTES.txt").write_text("keep me")
    closed = Path(__file__).parent / "fixtures" / "aiperf" / "concurrency_sweep" / "concurrency_1"
    assert main(["import", "aiperf", str(closed), "--into", str(study)]) == 2
    assert "load model: study open loop, new run concurrency_1 closed loop" in capsys.readouterr().err
    assert main(["import", "aiperf", str(closed), "--into", str(study),
                 "--allow-workload-change"]) == 0
    capsys.readouterr()
    run = _manifest(study)["runs"][-1]
    assert run["run_id"] == "concurrency_1" and run["offered_rps_from"] == "measured"
    assert run["offered_rps"] == run["measured_rps"]
    assert (study / "NOTES.txt").read_text() == "keep me" and (study / "resources").is_dir()


def test_write_import_then_append_library(tmp_path):
    base = write_import(import_paths("aiperf", [SWEEP / "rate_4.0"]), tmp_path / "L")
    out = append_import(import_paths("aiperf", [SWEEP / "rate_6.0"]), base)
    assert out.renamed == {} and out.manifest["runs"][-1]["run_id"] == "rate_6.0"
    assert open_study(base).manifest.run_ids == ("rate_4.0", "rate_6.0")


def test_several_run_folders_make_a_study_named_after_out(tmp_path):
    """`capplan import auto r0/rate2_s1000 r0/rate4_s1001 … --out study` names the study after
    --out (the study), not after its first run; run ids are the folder names."""
    runs = sorted(p for p in SWEEP.iterdir() if p.is_dir())
    out = tmp_path / "llama70b-h100"
    assert main(["import", "auto", *map(str, runs), "--out", str(out)]) == 0
    m = _manifest(out)
    assert m["name"] == "llama70b-h100"
    assert [r["run_id"] for r in m["runs"]] == [p.name for p in runs]
