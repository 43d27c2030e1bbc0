"""Notebook 10-loadtest executed with papermill against the synth model of the test fixtures:
clean run, a live chart widget in the running cell, and the same load test (same runs, seeds
and final bound) as ``capplan.loadtest.run_loadtest`` with the same settings."""

from __future__ import annotations

from pathlib import Path

from capplan import report as R
import yaml

from capplan.loadtest import Spec, SynthTarget, load_record, run_loadtest
from capplan.resources import bundled
from capplan.twin import load_system

FIXTURE = Path(__file__).parent / "fixtures" / "synth_small_sweep.yaml"
MODEL = bundled("templates/loadtest-demo.synth.yaml")  # the notebook's default model
WIDGET = "application/vnd.jupyter.widget-view+json"
PLOTLY = "application/vnd.plotly.v1+json"
SLO = {"ttft_ms": 2000.0, "tpot_ms": 100.0, "attainment": 0.99}


def test_bundled_model_is_the_fixture_whose_truth_is_known():
    """docs/loadtest.md quotes the fixture's true C_SLO for the notebook's default model."""
    assert yaml.safe_load(MODEL.read_text()) == yaml.safe_load(FIXTURE.read_text())


def test_notebook_runs_the_load_test_with_a_live_chart(tmp_path):
    params = {"slo": SLO, "rates": [1.0, 2.0, 3.0, 4.0],
              "duration_s": 300.0, "budget_minutes": 40.0, "round_minutes": 20.0,
              "out_dir": str(tmp_path / "nb"), "seed": 1, "reps": 60, "design_reps": 30}
    nb = R.execute_notebook(Path("notebooks/10-loadtest.ipynb"), params, cwd=tmp_path)
    outs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert not [o for o in outs if o.get("output_type") == "error"]
    run_cell = next(c for c in nb.cells if "LiveChart(" in c.source)
    assert any(WIDGET in o.get("data", {}) for o in run_cell.outputs)  # the live chart
    # its progress lines, as the CLI prints them on stderr
    printed = "".join(o.get("text", "") for o in run_cell.outputs if o.get("name") == "stdout")
    assert "[probe]" in printed and "[fit] round 0" in printed and "[stop]" in printed
    assert any(PLOTLY in o.get("data", {}) for o in nb.cells[-1].outputs)  # the static copy

    spec = Spec(slo="ttft_ms=2000,tpot_ms=100,attainment=0.99", coarse_rates=(1.0, 2.0, 3.0, 4.0),
                duration_s=300.0, budget_minutes=40.0, round_minutes=20.0, seed=1, reps=60,
                design_reps=30)
    res = run_loadtest(SynthTarget(load_system(MODEL), name=MODEL.name, seed=1), spec,
                       tmp_path / "lib")
    text = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outs)
    assert res.to_text().replace(str(tmp_path / "lib"), str(tmp_path / "nb")) in text
    a, b = load_record(tmp_path / "nb" / "loadtest.json"), load_record(tmp_path / "lib" / "loadtest.json")
    assert a["rounds"] == b["rounds"] and a["stop"] == b["stop"]
