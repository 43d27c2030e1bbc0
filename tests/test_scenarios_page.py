"""The serving-policies page: notebook 09 executed with papermill (as `capplan report` runs it)
on a synth study with a prefix cache, and with a twin and a small sweeps file; a sweeps file
without a twin refused before any kernel starts."""

from __future__ import annotations

import copy
import json

import nbformat
import pytest

from capplan import report as R
from capplan.cli import main
from capplan.sim.config import PRESETS, parse_config
from capplan.sim.sweep import generate_study
from capplan.twin import fit_twin, write_twin
from tests.test_twin_fit import small_cfg

SWEEPS = """format: capplan-sweeps/1
protocol: {runs: 1, duration_s: 120}
cache:
  settings:
    no cache: {prefixes: {kind: system, groups: 2, tokens: 1500, share: 0.9}}
    cached: {prefixes: {kind: system, groups: 2, tokens: 1500, share: 0.9}, prefix_cache: {tokens: 50000}}
pd:
  ratios: [[1, 1]]
  prefill: {usd_per_gpu_hour: 2.0}
  decode: {usd_per_gpu_hour: 2.0}
policies:
  rate_rps: 8
  policies:
    FIFO: {}
    fair queuing: {scheduling: {policy: vtc}}
"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scpage")
    raw = copy.deepcopy(PRESETS["small"])
    raw["workload"]["prefixes"] = {"kind": "system", "groups": 3, "tokens": 1200, "share": 0.8}
    raw["prefix_cache"] = {"blocks": 400}
    raw["sweep"]["duration_s"] = 40
    raw["sweep"]["warmup_s"] = 5
    study, _ = generate_study(parse_config(raw), tmp / "s", workers=1)
    tstudy, _ = generate_study(small_cfg(), tmp / "t", workers=1)
    tfile = tmp / "twin.yaml"
    write_twin(fit_twin(tstudy, reps=30), tfile)
    sweeps = tmp / "sweeps.yaml"
    sweeps.write_text(SWEEPS)
    params, _ = R.resolve_params(study, slo="ttft_ms=2000,tpot_ms=200,attainment=0.99", reps=50, twin=tfile,
                                 sweeps=sweeps)
    assert params.cache and params.notebooks()[-1] == R.SCENARIOS_NOTEBOOK
    p = params.parameters_for(R.SCENARIOS_NOTEBOOK[0], tmp / "data")
    p.update(workers=1)
    nb = R.execute_notebook(R.notebooks_dir() / R.SCENARIOS_NOTEBOOK[0], p, cwd=tmp)
    return nb, tmp


def test_page_shows_measured_cache_and_simulated_sweeps(page):
    nb, tmp = page
    text = json.dumps(nbformat.v4.new_notebook(cells=nb.cells))
    assert "Request hit rate" in text and "request_hit_rate" not in text  # headers for people
    assert "Best split" in text and "Jain" in text and "Cost per 1 000 good requests" in text
    # the candidates are judged on quality first: the twin's configurations serve the measured build
    assert "Quality against the baseline" in text and "same build as the baseline" in text
    for f in ("cache_runs.csv", "cache_timeline.csv", "cache_sweep.csv", "pd_sweep.csv", "policies.csv"):
        assert (tmp / "data" / "scenarios" / f).is_file(), f


def test_sweeps_need_a_twin(tmp_path, capsys):
    sw = tmp_path / "sweeps.yaml"
    sw.write_text(SWEEPS)
    rc = main(["report", "--sweeps", str(sw), "--out", str(tmp_path / "rep")])
    assert rc == 2
    assert "--sweeps needs --twin" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_bad_sweeps_file_names_the_field(tmp_path):
    from capplan.errors import SpecError
    from capplan.twin.sweepfile import load_sweeps

    p = tmp_path / "s.yaml"
    p.write_text("pd: {total_replicas: 1}\n")
    with pytest.raises(SpecError) as e:
        load_sweeps(p)
    assert e.value.field == "pd.total_replicas"
