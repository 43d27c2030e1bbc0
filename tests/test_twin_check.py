"""Checking a twin: the per-run metrics equal capplan summarize's, a fitted twin agrees with its
own synthetic study, a twin with a 30 % slower decode is caught — on synthetic and on real
client data — and check.json holds what the issue lists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from capplan import open_study
from capplan.cli import main
from capplan.importers import import_paths, write_import
from capplan.metrics import summarize
from capplan.twin import check_holdout, check_twin, fit_twin, load_twin, write_twin
from capplan.twin.data import load_study
from capplan.sim.evaluate import run_metrics
from capplan.twin.replay import measured_outcome
from tests.test_twin_fit import small_study, small_twin  # noqa: F401  (shared fixtures)

FIX = Path(__file__).parent / "fixtures"
SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
QUICK = {"runs": 2, "duration_s": 600.0, "warmup_s": 100.0}


@pytest.fixture(scope="module")
def study(small_study):  # noqa: F811
    return small_study


@pytest.fixture(scope="module")
def twin(small_twin):  # noqa: F811
    return small_twin


def test_run_metrics_equal_capplan_summarize(study):
    from capplan.slo import SLO as S

    summ = summarize(open_study(study), SLO).to_frame().set_index("run_id")
    for run in load_study(study).runs:
        m = run_metrics(measured_outcome(run), S.parse(SLO), run.warmup_ns)
        row = summ.loc[run.run_id]
        assert m["n"] == row["n_offered"] and m["n_good"] == row["n_good"]
        assert m["attainment"] == pytest.approx(row["attainment_offered"], abs=1e-12)
        assert m["ttft_p50_ms"] == pytest.approx(row["ttft_p50_ms"], rel=1e-9)
        assert m["achieved_rps"] == pytest.approx(row["achieved_rps"], rel=1e-9)
        if not np.isnan(row["tpot_p99_ms"]):
            assert m["tpot_p99_ms"] == pytest.approx(row["tpot_p99_ms"], rel=1e-9)


def test_fitted_twin_agrees_and_slower_decode_disagrees(study, twin, tmp_path):
    chk = check_twin(twin, study, SLO, replays=10, reps=50, steady_draws=2, steady_options=QUICK, workers=1)
    assert chk.verdict == "agrees", chk.to_text()
    d = json.loads(chk.to_json(tmp_path / "check.json"))
    assert d["verdict"] == "agrees"
    for k in ("estimate", "ci_low", "ci_high"):
        assert isinstance(d["cslo"]["twin"][k], float)
    assert d["cslo"]["twin"]["ci_low"] <= d["cslo"]["twin"]["estimate"] <= d["cslo"]["twin"]["ci_high"]
    assert "estimate" in d["cslo"]["measured"] and len(d["runs"]) == 4
    assert {"run_id", "attainment_measured", "attainment_pi_low", "tpot_p99_ms_inside"} <= set(d["runs"][0])
    slow = check_twin(twin.scaled(decode=1.3), study, SLO, replays=10, reps=50, steady=False)
    assert slow.verdict == "disagrees"
    # the text never says ok for a value outside what it prints: each row shows the band the
    # verdict used (the 95 % interval widened by the margin), and the margins are stated
    for c in (chk, slow):
        text = c.to_text()
        assert "ok = the measured value lies in the band" in text and "±10 %" in text
        for r in c.long_frame().itertuples():
            if r.inside and np.isfinite(r.measured):
                assert r.band_low <= r.measured <= r.band_high
                assert r.band_low <= r.pi_low and r.pi_high <= r.band_high
        assert "Inside the band" in c.display_frame().columns
    assert any(w.startswith("TPOT p50") for w in slow.where), slow.where
    assert "decode steps scaled by 1.3 by hand" in " ".join(slow.notes + twin.scaled(decode=1.3).notes)


def test_holdout_predicts_the_runs_above_the_rate(study):
    tw, chk = check_holdout(study, SLO, 10.0, replays=5, reps=50, steady=False, fit_reps=30)
    assert tw.source["fitted_below_rps"] == 10.0 and tw.source["runs"] == ["r01", "r02", "r03"]
    h = chk.holdout
    assert h["predicted_runs"] == ["r04"]
    assert h["errors"]["tpot_p50_ms"]["mean_abs_error"] < 0.05  # decode extrapolated from lower load
    assert "off by" in h["summary"]


def _fixture_study(tmp_path, tool, *paths):
    return write_import(import_paths(tool, [str(p) for p in paths]), tmp_path / tool)


@pytest.mark.parametrize("tool,paths", [("aiperf", [FIX / "aiperf" / "artifacts"]),
                                        ("guidellm", [FIX / "guidellm" / "poisson_v2.json.gz"])])
def test_real_client_fixtures_fit_check_and_catch_a_slower_decode(tmp_path, tool, paths):
    st = _fixture_study(tmp_path, tool, *paths)
    tw = fit_twin(st, reps=50)
    assert tw.source["method"].startswith("client path")
    assert tw.value("prefill_mode") == "separate"  # the mock server does not batch
    slo = "ttft_ms=2000,tpot_ms=80,attainment=0.9"
    ok = check_twin(tw, st, slo, replays=10, steady=False)
    assert ok.metrics.set_index("metric").loc["tpot_p50_ms", "agrees"]
    slow = check_twin(tw.scaled(decode=1.3), st, slo, replays=10, steady=False)
    assert slow.verdict == "disagrees"
    assert any(w.startswith("TPOT p50") for w in slow.where)


def test_cli_fit_check_records_the_verdict_and_repeats_the_warning(study, tmp_path, capsys):
    tfile = tmp_path / "twin.yaml"
    assert main(["twin", "fit", str(study), "--out", str(tfile), "--reps", "30"]) == 0
    assert "decode step, batch 1" in capsys.readouterr().out
    slow = load_twin(tfile).scaled(decode=1.3)
    write_twin(slow, tfile)
    out = tmp_path / "check.json"
    assert main(["twin", "check", str(study), "--twin", str(tfile), "--slo", SLO, "--replays", "4",
                 "--no-steady", "--reps", "20", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "DISAGREES" in text
    assert json.loads(out.read_text())["verdict"] == "disagrees"
    again = load_twin(tfile)
    assert again.last_check["verdict"] == "disagrees" and "TPOT" in again.warning
    assert main(["twin", "check", str(study), "--twin", str(tfile), "--slo", SLO, "--replays", "2",
                 "--no-steady", "--reps", "20"]) == 0
    assert "DISAGREED" in capsys.readouterr().err


def test_cli_bad_input_exits_2_without_traceback(study, tmp_path, capsys):
    assert main(["twin", "fit", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "ERROR" in err and "Traceback" not in err
    assert main(["twin", "check", str(study), "--slo", SLO]) == 2
    assert "--twin" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("my notes")
    assert main(["twin", "fit", str(study), "--out", str(tmp_path / "notes.txt")]) == 2
    assert (tmp_path / "notes.txt").read_text() == "my notes"
