"""The twin page: notebook 06 executed with papermill on a small study and a twin (as
`capplan report --twin` runs it), and a bad twin file refused before any kernel starts."""

from __future__ import annotations

import json

import nbformat
import pytest

from capplan import report as R
from capplan.cli import main
from capplan.sim.sweep import generate_study
from capplan.twin import fit_twin, write_twin
from tests.test_twin_fit import small_cfg


@pytest.fixture(scope="module")
def twin_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twinpage")
    study, _ = generate_study(small_cfg(), tmp / "s", workers=1)
    tfile = tmp / "twin.yaml"
    write_twin(fit_twin(study, reps=30), tfile)
    params = R.ReportParams(study=study, spec=R.default_spec_path(), slo="ttft_ms=2000,tpot_ms=100,attainment=0.99",
                            reps=50, twin=tfile)
    # the twin page, then the timelines page that simulates the plan's checks on the twin
    assert params.notebooks()[-2:] == (R.TWIN_NOTEBOOK, R.TIMELINE_NOTEBOOK)
    p = params.parameters_for(R.TWIN_NOTEBOOK[0], tmp / "data")
    p.update(replays=4, steady=False)
    nb = R.execute_notebook(R.notebooks_dir() / R.TWIN_NOTEBOOK[0], p, cwd=tmp)
    return nb, tmp


def test_twin_notebook_shows_parameters_check_and_exports(twin_page):
    nb, tmp = twin_page
    text = json.dumps(nbformat.v4.new_notebook(cells=nb.cells))
    assert "decode step at batch 1" in text and "VERDICT: the twin AGREES" in text
    assert "95 % low" in text and "ci95_low" not in text  # headers for people
    titles = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            fig = o.get("data", {}).get("application/vnd.plotly.v1+json")
            if fig:
                titles.append(fig["layout"]["title"]["text"])
    assert any(t.startswith("Decode step vs running batch") for t in titles)
    assert any(t.startswith("Measured vs twin") for t in titles)
    chk = json.loads((tmp / "data" / "twin" / "check.json").read_text())
    assert chk["verdict"] == "agrees" and chk["replays"] == 4


def test_report_refuses_a_bad_twin_before_any_kernel(tmp_path, capsys):
    bad = tmp_path / "twin.yaml"
    bad.write_text("format: capplan-twin/1\nparameters: {}\n")
    rc = main(["report", "--twin", str(bad), "--out", str(tmp_path / "rep")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "parameters lack" in err and str(bad) in err
    assert not (tmp_path / "rep").exists()
