"""`capplan report --engine spark`: the envelope and plan pages reduce the events on Spark and
give the DuckDB report's numbers with the same seed (envelope.json, the plan's exports and its
summary); the engine is recorded (report.json, the index's provenance, the pages' header); a
remote study, a master without Spark, and a custom notebook that cannot take the engine exit 2
with nothing written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from capplan import report as R
from capplan.cli import main
from conftest import need_spark
from test_report import CMP_SLO, TIME, _quick_notebooks, estimate_spec, small_sweeps  # noqa: F401

REPS = 40  # the engines, not the statistics, are under test
ENGINE_PAGES = ("02-envelope.ipynb", "03-plan.ipynb")


def _plan_summary(out: Path) -> str:
    """The plan summary the plan page shows (its first markdown output)."""
    nb = nbformat.read(str(out / "notebooks" / "03-plan.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if "plan.summary" in c.source)
    texts = [o["data"]["text/markdown"] for o in cell.outputs if "text/markdown" in o.get("data", {})]
    assert texts and "GPU" in texts[0], texts
    return texts[0]


def test_spark_report_gives_the_duckdb_numbers(small_sweeps, tmp_path, capsys):
    """One small sweep, both engines, the same seed: the same C_SLO (the whole envelope.json),
    the same plan (every exported CSV and the summary shown). Only the envelope and plan pages
    run for real (the others: their parameters cell), to keep the test short."""
    need_spark()
    nbs = _quick_notebooks(tmp_path / "nbs", real=ENGINE_PAGES)
    spec = estimate_spec(tmp_path)
    out = {}
    for engine in ("duckdb", "spark"):
        out[engine] = tmp_path / engine
        extra = ["--engine", "spark", "--spark-master", "local[2]"] if engine == "spark" else []
        rc = main(["report", str(small_sweeps["a"]), "--out", str(out[engine]), "--spec", str(spec),
                   "--slo", CMP_SLO, "--reps", str(REPS), "--seed", "0", "--time", TIME,
                   "--notebooks", str(nbs), *extra])
        err = capsys.readouterr().err
        assert rc == 0, err
    assert "reduce the events on Spark (master local[2])" in err  # the note, said out loud
    d, s = out["duckdb"], out["spark"]
    env_d = json.loads((d / "data" / "envelope.json").read_text(encoding="utf-8"))
    env_s = json.loads((s / "data" / "envelope.json").read_text(encoding="utf-8"))
    assert env_d["cslo"] == env_s["cslo"] and env_d["cslo"]["estimate"] > 0
    assert env_d == env_s
    csvs = sorted(p.name for p in (d / "data" / "plan").glob("*.csv"))
    assert "summary.csv" in csvs and "line_items.csv" in csvs
    for name in csvs:
        assert (d / "data" / "plan" / name).read_bytes() == \
            (s / "data" / "plan" / name).read_bytes(), name
    assert _plan_summary(d) == _plan_summary(s)
    # the engine is recorded: report.json, the parameters of the pages, the index, the header
    meta = json.loads((s / "report.json").read_text(encoding="utf-8"))
    assert (meta["engine"], meta["spark_master"]) == ("spark", "local[2]")
    assert json.loads((d / "report.json").read_text(encoding="utf-8"))["engine"] == "duckdb"
    for name in ENGINE_PAGES:
        p = nbformat.read(str(s / "notebooks" / name), as_version=4).metadata["papermill"]["parameters"]
        assert (p["engine"], p["spark_master"]) == ("spark", "local[2]")
    index = re.sub(r"<[^>]+>", " ", (s / "index.html").read_text(encoding="utf-8"))
    assert "reduction engine" in index and "Spark (master local[2])" in index
    assert "statistics reduced on Spark (master local[2])" in \
        (s / "02-envelope.html").read_text(encoding="utf-8")
    assert "--engine spark" in (s / "reproduce.md").read_text(encoding="utf-8")


def test_remote_study_is_refused_with_the_commands_that_take_it(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", "s3a://bucket/studies/soak", "--engine", "spark", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "reads a study on this machine's disk" in err and "s3a://bucket/studies/soak" in err
    assert "capplan envelope, summarize or plan STUDY --engine spark" in err
    assert "Traceback" not in err and not out.exists()


def test_a_master_needs_spark_and_a_file_uri_is_a_local_study(small_sweeps, tmp_path):
    from capplan.errors import SpecError

    with pytest.raises(SpecError, match="--spark-master"):
        R.resolve_params(small_sweeps["a"], spark_master="local[2]")
    with pytest.raises(SpecError, match="unknown engine"):
        R.resolve_params(small_sweeps["a"], engine="polars")
    params, _ = R.resolve_params(f"file://{small_sweeps['a']}")
    assert params.study == Path(small_sweeps["a"]).resolve() and params.engine == "duckdb"
    assert ("reduction engine", "DuckDB, this machine") in params.provenance_rows("a", "0" * 64)


def test_a_notebook_without_the_engine_parameter_is_refused(small_sweeps, tmp_path, capsys):
    """An older 02-envelope in --notebooks would silently reduce on DuckDB: exit 2 instead."""
    need_spark()
    nbs = _quick_notebooks(tmp_path / "nbs")
    nb = nbformat.read(str(nbs / "02-envelope.ipynb"), as_version=4)
    nb.cells[0].source = "\n".join(line for line in nb.cells[0].source.splitlines()
                                   if not line.startswith(("engine", "spark_master")))
    nbformat.write(nb, str(nbs / "02-envelope.ipynb"))
    out = tmp_path / "rep"
    assert main(["report", str(small_sweeps["a"]), "--engine", "spark", "--notebooks", str(nbs),
                 "--out", str(out), "--spec", str(estimate_spec(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "02-envelope.ipynb has no engine parameter" in err and not out.exists()
