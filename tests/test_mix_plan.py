"""Plans with SLO classes and at a target mix; the export's extra sheets (docs/mix.md)."""

from __future__ import annotations

import re

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


# ----------------------------------------------------------------------------- honest numbers only
# docs/plan.md, "Honest numbers only": every path from a fitted capacity to a plan carries an
# honesty verdict and is refused when it is not honest, unless --accept-optimistic. The small
# studies here have one run per rate, so every lower bound is unsupported.


def _spec_file(tmp_path, body: str):
    spec = tmp_path / "plan.yaml"
    spec.write_text("demand: {peak_rps: 4}\nreplica_group: {gpus_per_node: 8}\nfailure: {policy: none}\n"
                    "prices: {usd_per_gpu_hour: 2}\ncapacity: {reps: 100, seed: 1}\n" + body)
    return spec


def _mix_table(tmp_path, long_share=0.5):
    table = tmp_path / "mix.csv"
    _target(long_share).frame[["share"]].assign(input_min=[0, 1024], input_max=[1024, None]).to_csv(table,
                                                                                                   index=False)
    return table


@pytest.mark.parametrize("path_kind", ["tested", "target", "classes"])
def test_plan_refuses_an_unsupported_number_on_every_path(make_study, tmp_path, capsys, path_kind):
    import json

    from capplan.report_index import IndexInputs, index_html
    from capplan.plan.sensitivity import plan_record

    if path_kind == "classes":
        study = class_study(make_study)
        (tmp_path / "slo.yaml").write_text("classes:\n  interactive: {ttft_ms: 500, attainment: 0.9}\n"
                                          "  batch: {e2e_ms: 5000, attainment: 0.8}\n")
        body, basis, words = "slo_file: slo.yaml\n", "SLO classes", "with every SLO class"
    else:
        study = mix_study(make_study)
        table = _mix_table(tmp_path)
        body = f"slo: '{SLO}'\n" + (f"mix: {{target: {table}, plan_on: target}}\n" if path_kind == "target" else "")
        basis = "target mix (reweighted, table)" if path_kind == "target" else "tested mix"
        words = "at the target mix" if path_kind == "target" else "lower bound ("
    spec = _spec_file(tmp_path, body)
    rc = main(["plan", str(study), "--spec", str(spec), "--out", str(tmp_path / "o1"),
               "--time", "2026-01-01T00:00:00+00:00"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "not an honest lower bound (unsupported)" in err and words in err
    assert "--accept-optimistic" in err and "Traceback" not in err
    # accepted: the plan says so, and records which number it stands on and its verdict
    rc = main(["plan", str(study), "--spec", str(spec), "--out", str(tmp_path / "o2"), "--accept-optimistic",
               "--time", "2026-01-01T00:00:00+00:00"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "(unsupported: accepted with accept_optimistic)" in out
    spec_obj = load_plan_spec(spec)
    import dataclasses

    spec_obj = dataclasses.replace(spec_obj, capacity=dataclasses.replace(spec_obj.capacity, accept_optimistic=True))
    plan = make_plan(spec_obj, study=open_study(study), as_of="2026-01-01")
    assert plan.capacity.basis == basis
    assert plan.capacity.honesty["status"] == "unsupported" and plan.capacity.honesty["basis"] == basis
    rec = json.loads(json.dumps(plan_record(plan)))
    assert rec["capacity"]["basis"] == basis and rec["capacity"]["honesty"]["status"] == "unsupported"
    # the report's index says which number the plan stands on and that it is not honest
    page = re.sub(r"<a [^>]*>|</a>", "", index_html(IndexInputs("s", "h", (), (), ()), rec, None, None))
    said = {"tested": "at the tested mix", "target": "at the target mix (reweighted, table)",
            "classes": "with every SLO class meeting its own SLO"}[path_kind]
    assert f"Planned on the C_SLO lower bound {said}; the lower bound is <b>unsupported</b>" in page
    assert "<b>Status: unsupported</b>" in page


def test_a_lower_production_mix_is_said_first_with_what_it_would_cost(make_study, tmp_path):
    """Plan on the tested mix while the target mix (twice the long prompts) gives less: the
    plan's summary and the index say so first, which number the plan used, and what the
    production mix's number would cost — the sizing at it, as a plan at that capacity gives."""
    import dataclasses

    from capplan.report_index import IndexInputs, index_html
    from capplan.plan.sensitivity import plan_record

    study = open_study(mix_study(make_study))
    table = _mix_table(tmp_path)
    spec = _spec(slo=SLO, mix={"target": str(table), "plan_on": "tested"}, demand={"peak_rps": 40.0})
    plan = make_plan(spec, study=study, as_of="2026-01-01")
    assert plan.capacity.basis == "tested mix" and plan.production_mix_lower
    (c,) = plan.mix_comparison
    assert c["basis"] == "target mix (reweighted, table)" and c["rps_per_group"] < plan.capacity.rps_per_group
    # the cost on the other number is the plan at that capacity
    other = make_plan(spec, capacity=c["rps_per_group"], study=study, as_of="2026-01-01")
    assert c["groups"] == other.quarters[0].groups > plan.quarters[0].groups
    assert c["cost_usd_per_month"] == pytest.approx(other.quarters[0].cost_usd_per_month)
    assert c["delta_cost_usd_per_month"] == pytest.approx(other.quarters[0].cost_usd_per_month
                                                          - plan.quarters[0].cost_usd_per_month)
    first = plan.summary.splitlines()[0]
    assert first.startswith("Production's mix gives a lower capacity than the tested mix")
    assert "This plan is sized on the tested mix" in first and f"{c['groups']} replica groups" in first
    page = index_html(IndexInputs("s", "h", (), (), ()), plan_record(plan), None, None)
    answer = page[page.index('<section id="answer">'):]
    assert answer.index('id="production-mix"') < answer.index('id="answer-text"')
    # planned on the target mix instead: sized for it, the tested mix's cost beside it
    on_target = make_plan(dataclasses.replace(spec, mix=dataclasses.replace(spec.mix, plan_on="target")),
                          study=study, as_of="2026-01-01")
    assert on_target.quarters[0].groups == c["groups"]
    assert on_target.mix_comparison[0]["basis"] == "tested mix"
    assert "This plan is sized on the target mix (reweighted, table)" in on_target.summary.splitlines()[0]


def test_plan_on_twin_is_validated_and_refused_as_unsupported(make_study, tmp_path):
    """``mix.plan_on: twin`` needs ``mix.twin`` and ``mix.target``; the twin's number is an
    unsupported lower bound (its interval's coverage is not measured honest), refused without
    accept_optimistic; its bound is estimate − 1.645·SE, SE read back from the ± 1.96 SE interval."""
    from types import SimpleNamespace

    from capplan.errors import SpecError
    from capplan.plan import capacity_at_twin

    with pytest.raises(SpecError, match="no mix.twin"):
        _spec(slo=SLO, mix={"target": "x.csv", "plan_on": "twin"})
    study = open_study(mix_study(make_study))
    table = _mix_table(tmp_path)
    tm = SimpleNamespace(at_target=SimpleNamespace(estimate=3.0, ci_low=3.0 - 1.959964 * 0.1,
                                                   ci_high=3.0 + 1.959964 * 0.1),
                         notes=(), twin_name="t", in_words=lambda: "the twin is lower: the load effect")
    spec = _spec(slo=SLO, mix={"target": str(table), "plan_on": "twin", "twin": "t.yaml"})
    strict = dataclasses_replace_accept(spec, False)
    with pytest.raises(SpecError, match=r"at the target mix \(twin, table\).*not an honest lower bound"):
        capacity_at_twin(strict, study, SLO, twinmix=tm)
    cap = capacity_at_twin(spec, study, SLO, twinmix=tm)
    assert cap.rps_per_group == pytest.approx((3.0 - 1.644854 * 0.1) / study.manifest.replicas, rel=1e-5)
    assert cap.basis == "target mix (twin, table)" and cap.honesty["status"] == "unsupported"
    assert {a["basis"] for a in cap.alternatives} == {"tested mix", "target mix (reweighted, table)"}


def dataclasses_replace_accept(spec, accept: bool):
    import dataclasses

    return dataclasses.replace(spec, capacity=dataclasses.replace(spec.capacity, accept_optimistic=accept))


def test_the_twin_lower_than_the_tested_mix_is_said_first_on_the_index(make_study, tmp_path):
    """Issue 27, item 6: with a twin on the mix page and ``plan_on: tested``, the twin's C_SLO
    at the target mix is costed as a plan (``MixPage.vs_plan``, exported as
    data/mix/plan_vs_mix.json) and the index says it first when it is lower than the tested mix.
    The twin result is given (a twin run is the twin tests' job); its bound is estimate − 1.645·SE."""
    import dataclasses
    import json
    from types import SimpleNamespace

    from capplan.mix.page import MixPage
    from capplan.report_index import IndexInputs, index_html, read_mix_record
    from capplan.plan.sensitivity import plan_record

    study = open_study(mix_study(make_study))
    spec = _spec(slo=SLO, mix={"target": str(_mix_table(tmp_path)), "plan_on": "tested"},
                 demand={"peak_rps": 40.0})
    page = MixPage.build(study, spec, SLO, reps=100, seed=1)
    r = study.manifest.replicas
    tested = page.plan.capacity.rps_per_group * r
    est, se = 0.8 * tested, 0.02 * tested
    tw = SimpleNamespace(at_target=SimpleNamespace(estimate=est, ci_low=est - 1.959964 * se, ci_high=est + 1.959964 * se),
                         mix=SimpleNamespace(target=SimpleNamespace(period="table")))
    page = dataclasses.replace(page, twins={"table": tw})
    (row,) = page.vs_plan(twins_only=True)
    assert row["basis"] == "target mix (twin, table)" and row["status"] == "unsupported"
    assert row["rps_per_group"] == pytest.approx((est - 1.644854 * se) / r, rel=1e-5)
    assert row["production_lower"] and row["groups"] > page.plan.quarters[0].groups
    assert "target mix (twin, table)" in page.plan_words()
    (tmp_path / "data" / "mix").mkdir(parents=True)
    (tmp_path / "data" / "mix" / "plan_vs_mix.json").write_text(json.dumps(page.vs_plan(twins_only=True)))
    html = index_html(IndexInputs("s", "h", (), (), ()), plan_record(page.plan), None, None,
                      read_mix_record(tmp_path / "data"))
    answer = re.sub(r"<a [^>]*>|</a>", "", html[html.index('<section id="answer">'):])
    assert answer.index('id="production-mix"') < answer.index('id="answer-text"')
    assert "This plan is sized on the tested mix" in answer and "on the target mix (twin, table)" in answer
