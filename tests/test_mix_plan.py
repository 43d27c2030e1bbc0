"""Plans with SLO classes and at a target mix; the export's extra sheets (docs/mix.md)."""

from __future__ import annotations

import openpyxl
import pytest

from capplan import open_study
from capplan.cli import main
from capplan.mix.classes import fit_classes
from capplan.plan import load_plan_spec, make_plan

from test_mix_classes import SLOS, _study as class_study
from test_mix_reweight import SLO, _study as mix_study, _target


def _spec(**extra):
    d = {"demand": {"peak_rps": 4.0}, "replica_group": {"gpus_per_node": 8}, "failure": {"policy": "none"},
         "prices": {"usd_per_gpu_hour": 2.0},
         # one run per rate: no honest lower bound (docs/envelope.md); these tests are about sizing
         "capacity": {"reps": 100, "seed": 1, "accept_optimistic": True}}
    d.update(extra)
    return load_plan_spec(d)


def test_plan_sizes_for_every_class(make_study):
    study = open_study(class_study(make_study))
    spec = _spec(slo_classes=SLOS)
    plan = make_plan(spec, study=study)
    fit = fit_classes(study, SLOS, reps=100, seed=1)
    assert plan.capacity.rps_per_group == pytest.approx(fit.cslo.lower_bound)
    assert "every SLO class meets its target; binding class interactive" in plan.capacity.source
    assert any("with every SLO class meeting its own SLO" in c.sentence for c in plan.checks)
    assert [s for s, _ in plan.capacity.tables] == ["SLO classes"]
    # an explicit single SLO plans with it instead
    single = make_plan(spec, study=study, slo="e2e_ms=5000,attainment=0.8")
    assert single.capacity.rps_per_group != plan.capacity.rps_per_group


def test_plan_at_the_target_mix_and_its_export(make_study, tmp_path):
    path = mix_study(make_study)
    study = open_study(path)
    table = tmp_path / "mix.csv"
    _target(0.5).frame[["share"]].assign(input_min=[0, 1024], input_max=[1024, None]).to_csv(table, index=False)
    spec = _spec(slo=SLO, mix={"target": str(table), "plan_on": "target"})
    plan = make_plan(spec, study=study)
    from capplan.mix import load_target
    from capplan.mix.reweight import fit_mix

    m = fit_mix(study, SLO, load_target(table), reps=100, seed=1)
    assert plan.capacity.rps_per_group == pytest.approx(m.cslo.lower_bound)
    assert "at the target mix (table of" in plan.capacity.source and "mix.csv" in plan.capacity.source
    # plan_on: tested — the ordinary C_SLO
    plan_t = make_plan(_spec(slo=SLO, mix={"target": str(table), "plan_on": "tested"}), study=study)
    from capplan.envelope import fit_envelope

    headline = fit_envelope(study, SLO, reps=100, seed=1)  # the ordinary C_SLO, as the plan page has it
    assert plan_t.capacity.rps_per_group == pytest.approx(headline.cslo.lower_bound)
    out = tmp_path / "p"
    from capplan.export import export_plan

    export_plan(plan, out, time="2026-01-01T00:00:00+00:00")
    wb = openpyxl.load_workbook(out / "plan.xlsx")
    assert "Production mix" in wb.sheetnames
    assert (out / "production_mix.csv").is_file()


def test_plan_command_with_an_slo_file(make_study, tmp_path, capsys):
    path = class_study(make_study)
    (tmp_path / "slo.yaml").write_text("classes:\n  interactive: {ttft_ms: 500, attainment: 0.9}\n"
                                      "  batch: {e2e_ms: 5000, attainment: 0.8}\n")
    spec = tmp_path / "plan.yaml"
    spec.write_text("slo_file: slo.yaml\ndemand: {peak_rps: 4}\nreplica_group: {gpus_per_node: 8}\n"
                    "failure: {policy: none}\nprices: {usd_per_gpu_hour: 2}\n"
                    "capacity: {reps: 100, accept_optimistic: true}\n")
    rc = main(["plan", str(path), "--spec", str(spec), "--out", str(tmp_path / "out"),
               "--time", "2026-01-01T00:00:00+00:00"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "binding class interactive" in text
    assert (tmp_path / "out" / "slo_classes.csv").is_file()
    bad = tmp_path / "bad.yaml"
    bad.write_text("slo_file: nope.yaml\ndemand: {peak_rps: 4}\nprices: {usd_per_gpu_hour: 2}\n")
    assert main(["plan", str(path), "--spec", str(bad), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "SLO classes file not found" in err and "nope.yaml" in err
