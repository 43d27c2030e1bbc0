"""The target mix run through a calibrated twin (docs/mix.md, "The twin at the target mix";
the full-size figure is benchmarks/twin_mix.py).

A small sweep of templates/synth-mix.yaml (5 rates × 150 s, per-token stamps recorded so the twin
takes its server path) is fitted by a twin; the twin then serves the study's cells at the tested
shares and at twice the long-prompt share under the benchmark's protocol (300-s runs, 30 s
warm-up). Its target-mix C_SLO must land near the simulated truth of that mix (2.546 req/s,
benchmarks/coverage_mix.py, 100 runs per rate), which reweighting — blind to the load effect —
overshoots.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capplan.cli import main
from capplan.errors import SpecError
from capplan.mix import load_target
from capplan.mix.loadeffect import cell_lengths, twin_mix
from capplan.mix.reweight import fit_mix
from capplan.study import open_study
from capplan.twin import TwinWarning, fit_twin, write_twin

from test_mix_coverage import SYNTH_TESTED_TRUTH

ROOT = Path(__file__).resolve().parents[1]
SLO = "ttft_ms=1000,attainment=0.9"
#: the target mix (30 % prompts ≥ 2048 tokens) really simulated: benchmarks/coverage_mix.py, 100 runs per rate
SYNTH_TARGET_MIX_TRUTH = 2.546
TOLERANCE = 0.10  # the small test's bound; benchmarks/twin_mix.py measures the full-size error


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    from capplan.sim import generate_study, load_config

    tmp = tmp_path_factory.mktemp("mixtwin")
    cfg = load_config(ROOT / "templates" / "synth-mix.yaml").with_(
        seed=1, itl=True, rates=(1.0, 2.5, 3.5, 4.5, 5.5), duration_s=150.0, warmup_s=15.0)
    path, _ = generate_study(cfg, tmp / "study", workers=1)
    twin = fit_twin(path, reps=30)
    tfile = tmp / "twin.yaml"
    write_twin(twin, tfile)
    table = tmp / "target.csv"
    pd.DataFrame({"input_min": [0, 2048], "input_max": [2048, None], "share": [0.7, 0.3]}).to_csv(table, index=False)
    target = load_target(table)
    study = open_study(path)
    m = fit_mix(study, SLO, target, reps=100, seed=0)
    r = twin_mix(twin, study, SLO, target, mixfit=m, runs=8, draws=0, duration_s=300.0, warmup_s=30.0, workers=1)
    return {"tmp": tmp, "path": path, "study": study, "twin": twin, "twin_file": tfile, "table": table,
            "target": target, "mix": m, "result": r}


def test_the_twin_predicts_the_simulated_target_mix(case):
    r = case["result"]
    t, rw = r.at_target.estimate, r.reweighted.estimate
    truth = SYNTH_TARGET_MIX_TRUTH
    assert abs(t / truth - 1) <= TOLERANCE, (t, truth)
    assert abs(t - truth) < abs(rw - truth)  # the twin sees the load effect, reweighting does not
    assert rw > truth and r.disagreement < -0.2
    # where it can be checked, the twin reproduces the tested mix's truth
    assert abs(r.tested.estimate / SYNTH_TESTED_TRUTH - 1) <= TOLERANCE, r.tested.estimate
    assert r.at_target.ci_low <= t <= r.at_target.ci_high
    assert r.runs == 8 and r.duration_s == 300.0 and r.warmup_s == 30.0 and r.warning == ""


def test_the_result_prints_tabulates_draws_and_serialises(case):
    r = case["result"]
    df = r.to_frame()
    assert list(df["source"]) == ["measured", "measured", "twin", "twin"]
    assert list(df["mix"]) == ["tested", "target", "tested", "target"]
    assert df.loc[3, "cslo_estimate"] == r.at_target.estimate
    assert df.loc[1, "cslo_estimate"] == r.reweighted.estimate == r.mix.cslo.estimate
    assert "95 % low" in r.display_frame().columns  # headers for people
    words = r.in_words()
    assert f"the twin {r.at_target.estimate:.4g} req/s" in words
    assert ("they agree" in words) == r.agree
    if not r.agree:
        assert "load effect" in words and f"{-r.disagreement:.0%} lower" in words
    assert f"{r.twin_change:+.0%}" in words and "At the tested mix the twin gives" in words
    text = r.to_text()
    assert words in text and "input ≥2048" in text and "pooled per rate" in text
    d = json.loads(r.to_json())
    assert d["twin_target"]["estimate"] == pytest.approx(r.at_target.estimate, abs=1e-6)
    assert d["disagreement"] == pytest.approx(r.disagreement) and d["warning"] is None
    fig = r.figure()
    assert len(fig.data) == 2 and list(fig.data[1].x) == [r.tested.estimate, r.at_target.estimate]
    # a twin that misses the SLO at every rate it tried: said, not compared
    from capplan.twin import SteadyCSLO

    none = replace(r, at_target=SteadyCSLO(0.0, 0.0, 0.0, (), 300.0, 30.0, 10, ("misses the SLO even at 0.01 req/s",)))
    assert "could not place C_SLO there (misses the SLO even at 0.01 req/s)" in none.in_words()
    assert none.to_frame().loc[3, "status"] == "misses the SLO at every simulated rate" and not none.agree


def test_cells_carry_their_own_lengths_and_shares(case):
    m = case["mix"]
    tested, target, cells, notes = cell_lengths(case["study"], m, wait_s=case["twin"].timeout_s)
    assert [t.name for t in tested] == [t.name for t in target] == ["input <2048", "input ≥2048"]
    share = m.cells.set_index("label")
    for t in tested:
        assert t.share == pytest.approx(share.loc[t.name, "tested_share"])
    assert [t.share for t in target] == pytest.approx([0.7, 0.3])
    rng = np.random.default_rng(0)
    short, _ = tested[0].lengths.sample(2000, rng)
    long, _ = tested[1].lengths.sample(2000, rng)
    assert short.max() < 2048 <= long.min()  # each cell's lengths stay in its bucket
    # the medians shown are the completed requests' of that cell (hand check against the events)
    ev = case["study"].sql("SELECT input_tokens FROM events WHERE status = 'ok' AND input_tokens >= 2048").df()
    assert cells.set_index("label").loc["input ≥2048", "input_median"] == np.median(ev["input_tokens"])
    assert cells["completed_requests"].sum() == case["study"].sql(
        "SELECT count(*) FROM events WHERE status = 'ok' AND output_tokens >= 1").fetchall()[0][0]
    with pytest.raises(SpecError, match="too few completed requests.*input ≥2048"):
        cell_lengths(case["study"], m, wait_s=60.0, min_completed=int(cells["completed_requests"].min()) + 1)


def test_a_disagreeing_twin_warns_and_every_output_repeats_it(case, capsys):
    bad = replace(case["twin"], last_check={"verdict": "disagrees", "study": "s", "where": "TTFT p99: 3 of 5 runs"})
    with pytest.warns(TwinWarning, match="DISAGREED"):
        r = twin_mix(bad, case["study"], SLO, case["target"], mixfit=case["mix"], runs=4, draws=0, duration_s=60.0,
                     warmup_s=10.0, workers=1)
    assert r.warning.startswith("WARNING: this twin DISAGREED") and "TTFT p99" in r.warning
    assert r.warning in r.in_words() and r.to_text().startswith(r.warning)
    assert json.loads(r.to_json())["warning"] == r.warning
    # the command line: the warning on stderr, both answers on stdout, JSON beside the reweighting
    tfile = case["tmp"] / "bad-twin.yaml"
    write_twin(bad, tfile)
    out = case["tmp"] / "mix.json"
    rc = main(["mix", str(case["path"]), "--slo", SLO, "--target", str(case["table"]), "--reps", "50",
               "--twin", str(tfile), "--twin-runs", "4", "--twin-draws", "0", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "DISAGREED" in cap.err
    assert "At the target mix, reweighting gives" in cap.out and "twin, target mix" in cap.out
    doc = json.loads(out.read_text())
    (entry,) = doc.values()
    assert entry["twin"]["warning"].startswith("WARNING") and math.isfinite(entry["twin"]["twin_target"]["estimate"])


def test_a_bad_twin_file_fails_before_any_fit(case, tmp_path, capsys):
    bad = tmp_path / "twin.yaml"
    bad.write_text("format: capplan-twin/1\nparameters: {}\n")
    rc = main(["mix", str(case["path"]), "--slo", SLO, "--target", str(case["table"]), "--twin", str(bad)])
    assert rc == 2
    assert str(bad) in capsys.readouterr().err


def test_plan_spec_twin_path_is_relative_to_the_spec(tmp_path):
    from capplan.plan import load_plan_spec

    spec = tmp_path / "plan.yaml"
    spec.write_text("demand: {peak_rps: 5}\nprices: {usd_per_gpu_hour: 2.0}\nmix: {target: mix.csv, twin: twin.yaml}\n")
    s = load_plan_spec(spec)
    assert s.mix.twin == str(tmp_path / "twin.yaml") and s.mix.target == str(tmp_path / "mix.csv")
    with pytest.raises(SpecError, match="mix.twin"):
        load_plan_spec({"demand": {"peak_rps": 5}, "prices": {"usd_per_gpu_hour": 2.0}, "mix": {"twin": 3}})


def test_mix_page_states_a_missing_twin_and_the_report_passes_the_twin(case):
    from capplan import report as R
    from capplan.mix.page import MixPage

    # a missing twin file is said on the page, not a failed report
    page = MixPage.build(case["study"], R.default_spec_path(), SLO, target=str(case["table"]), reps=20,
                         twin=str(case["tmp"] / "nope.yaml"))
    assert not page.twins and "The target mix was not run through the twin" in page.no_twin_text()
    assert "nope.yaml" in page.no_twin_text()
    # the page's what-if plans "tested" on the headline envelope, the one the page's plan uses
    assert page.envelope is not None and page.envelope.method == "run-effect"
    assert page.panel().model.envelope is page.envelope
    params = R.ReportParams(study=case["path"], spec=R.default_spec_path(), slo=SLO, twin=case["twin_file"])
    assert params.parameters_for("07-mix.ipynb", case["tmp"])["twin_path"] == str(case["twin_file"])
    assert "twin_path" not in R.ReportParams(study=case["path"], spec=R.default_spec_path()).parameters_for(
        "07-mix.ipynb", case["tmp"])


def test_the_mix_notebook_shows_the_twin(case):
    import nbformat

    from capplan import report as R

    params = R.ReportParams(study=case["path"], spec=R.default_spec_path(), slo=SLO, reps=50, twin=case["twin_file"])
    p = params.parameters_for("07-mix.ipynb", case["tmp"] / "data")
    p.update(target_path=str(case["table"]), twin_runs=4)
    nb = R.execute_notebook(R.notebooks_dir() / "07-mix.ipynb", p, cwd=case["tmp"])
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    text = json.dumps(nbformat.v4.new_notebook(cells=nb.cells))
    assert "The twin at the target mix (bucket table)" in text and "At the target mix, reweighting gives" in text
    assert "95 % low" in text  # headers for people
    titles = [o["data"]["application/vnd.plotly.v1+json"]["layout"]["title"]["text"] for c in nb.cells
              for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert any(t.startswith("C_SLO at the tested and the target mix: reweighting vs the twin") for t in titles)
    assert "**The twin at the target mix (bucket table)**: C_SLO" in text  # the headline
    exported = case["tmp"] / "data" / "mix"
    assert {"mix_day_twin.json", "mix_day_twin.csv"} <= {x.name for x in exported.iterdir()}
    assert json.loads((exported / "mix.json").read_text())["twin"] == str(case["twin_file"])
    t = json.loads((exported / "mix_day_twin.json").read_text())
    assert t["twin_target"]["estimate"] > 0 and t["warning"] is None
