"""Scenarios on a twin: parsing (errors name the field), the part registry, `capplan twin run`
writing an ordinary study that every command reads, and the in-memory protocol simulator that
a parametric bootstrap uses (same numbers as a written study)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import yaml

from capplan import open_study
from capplan.cli import main
from capplan.errors import SpecError
from capplan.metrics import summarize
from capplan.sim.sweep import generate_study
from capplan.twin import PARTS, Part, fit_twin, parse_scenario, register_part, run_scenario, write_twin
from capplan.twin.data import load_study
from capplan.validate import validate_study
from tests.test_twin_fit import small_cfg

SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    path, _ = generate_study(small_cfg(), tmp_path_factory.mktemp("sc") / "s", workers=1)
    return fit_twin(path, reps=30)


def test_scenario_errors_name_the_field():
    with pytest.raises(SpecError, match="unknown scenario part"):
        parse_scenario({"sytem": {"replicas": 2}})
    with pytest.raises(SpecError) as e:
        parse_scenario({"system": {"replicas": 0}})
    assert e.value.field == "system.replicas"
    with pytest.raises(SpecError) as e:
        parse_scenario({"workload": {"arrival": {"process": "bursty"}}})
    assert e.value.field == "workload.arrival.process"
    with pytest.raises(SpecError, match="rate_rps or workload.rates"):
        parse_scenario({"workload": {"rate_rps": 2, "rates": [1]}})
    with pytest.raises(SpecError) as e:
        parse_scenario({"run": {"duration_s": 60, "warmup_s": 5, "colour": "red"}})
    assert "colour" in str(e.value)


def test_scenario_changes_system_workload_and_run(twin):
    sc = parse_scenario({"name": "x", "system": {"replicas": 3, "speed": 2.0, "max_batch": 16, "queue_limit": None},
                         "workload": {"rates": [5, 10], "mix": {"acme": 1, "globex": 0},
                                      "arrival": {"process": "gamma", "cv": 2.5}, "output_scale": 2},
                         "run": {"duration_s": 120, "warmup_s": 10, "repeats": 2, "seed": 4}})
    ctx = sc.apply(twin)
    cfg = ctx.config
    assert cfg.replicas == 3 and cfg.replica.max_batch == 16 and cfg.replica.queue_limit is None
    assert cfg.replica.service.step_ms(1) == pytest.approx(twin.service.step_ms(1) / 2)
    assert cfg.replica.service.prefill_ms_per_token == pytest.approx(twin.value("prefill_ms_per_token") / 2)
    assert cfg.rates == (5.0, 10.0) and cfg.repeats == 2 and cfg.duration_s == 120 and cfg.seed == 4
    assert [t.name for t in cfg.tenants] == ["acme"]
    assert cfg.arrival.process == "gamma" and cfg.arrival.cv == 2.5
    assert cfg.lengths.output.median == pytest.approx(2 * twin.workload.lengths.output.median, rel=0.01)
    with pytest.raises(SpecError, match="does not know"):
        parse_scenario({"workload": {"mix": {"initech": 1}}}).apply(twin)


def test_a_new_part_registers_once_and_applies_in_order(twin):
    @dataclass(frozen=True)
    class Brownout(Part):
        key: ClassVar[str] = "brownout_test"
        factor: float = 1.0

        @classmethod
        def parse(cls, raw, fld):
            return cls(float(raw["factor"]))

        def apply(self, ctx):
            return ctx.with_twin(ctx.twin.scaled(decode=self.factor))

    try:
        register_part(Brownout)
        with pytest.raises(ValueError):
            register_part(Brownout)
        ctx = parse_scenario({"brownout_test": {"factor": 2.0}}).apply(twin)
        assert ctx.config.replica.service.step_ms(1) == pytest.approx(2 * twin.service.step_ms(1))
    finally:
        PARTS.pop("brownout_test", None)


def test_twin_run_writes_an_ordinary_study(twin, tmp_path, capsys):
    tfile = tmp_path / "twin.yaml"
    write_twin(replace(twin, last_check={"verdict": "disagrees", "where": "TPOT p99 at 8 req/s", "study": "s"}), tfile)
    sfile = tmp_path / "scenario.yaml"
    sfile.write_text(yaml.safe_dump({"name": "two-replicas", "system": {"replicas": 2},
                                     "workload": {"rates": [6, 12]}, "run": {"duration_s": 60, "warmup_s": 5}}))
    out = tmp_path / "study2"
    assert main(["twin", "run", "--twin", str(tfile), "--scenario", str(sfile), "--out", str(out),
                 "--no-progress", "--workers", "1"]) == 0
    assert "DISAGREED" in capsys.readouterr().err  # every use repeats the warning
    st = open_study(out)
    assert not validate_study(st).errors
    man = yaml.safe_load((out / "study.yaml").read_text())
    assert man["twin"]["last_check"]["verdict"] == "disagrees" and man["twin"]["sha256"]
    assert man["scenario"]["name"] == "two-replicas" and man["scenario"]["spec"]["system"] == {"replicas": 2}
    assert man["system"]["replicas"] == 2
    assert "DISAGREED" in (out / "README.md").read_text()
    s = summarize(st, SLO).to_frame()
    assert list(s["offered_rps"]) == [6.0, 12.0]
    # the same twin + scenario again: the same bytes
    out2 = tmp_path / "study3"
    assert main(["twin", "run", "--twin", str(tfile), "--scenario", str(sfile), "--out", str(out2),
                 "--no-progress", "--workers", "1"]) == 0
    for f in ("events/r01.parquet", "events/r02.parquet"):
        assert (out / f).read_bytes() == (out2 / f).read_bytes()
    bad = tmp_path / "bad.yaml"
    bad.write_text("system: {replicas: two}\n")
    assert main(["twin", "run", "--twin", str(tfile), "--scenario", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "system.replicas" in err and str(bad) in err and not (tmp_path / "x").exists()


def test_protocol_simulation_matches_a_written_study(twin, tmp_path):
    runs = twin.simulate(rates=[3.0, 9.0], duration_s=60, warmup_s=5, repeats=2, seed=3)
    assert [r.run_id for r in runs] == ["r01", "r02", "r03", "r04"] and runs[2].offered_rps == 9.0
    path = twin.simulate(rates=[3.0, 9.0], duration_s=60, warmup_s=5, repeats=2, seed=3, out=tmp_path / "p", workers=1)
    data = load_study(path)
    for sim, meas in zip(runs, data.runs):
        np.testing.assert_array_equal(sim.sched, meas.sched)
        np.testing.assert_array_equal(sim.first, meas.first)
        np.testing.assert_array_equal(sim.status, meas.status)
    s = summarize(open_study(path), SLO).to_frame()
    for sim, (_, row) in zip(runs, s.iterrows()):
        assert sim.metrics(SLO)["attainment"] == pytest.approx(row["attainment_offered"])
    ser = runs[1].series(SLO)
    from capplan.reduce import stats_from_series

    from capplan.envelope import fit_from_stats

    stats = stats_from_series([r.series(SLO) for r in runs], SLO)
    assert len(stats.runs) == 4 and len(ser["good"]) == int(runs[1].in_window.sum())
    env = fit_from_stats(stats, SLO, reps=50, seed=0)  # one draw of a parametric bootstrap
    assert len(env.runs) == 4
    assert yaml.safe_load((Path(path) / "study.yaml").read_text())["twin"]["name"] == twin.name


def test_steady_runs_a_twin_under_a_scenario(twin):
    """The one evaluator takes a twin and a scenario built from parts: the same counts as the
    changed twin itself, on the same streams; more replicas serve more of the same requests."""
    from capplan.sim.evaluate import steady

    kw = dict(rate_rps=9.0, runs=2, duration_s=60.0, warmup_s=5.0, seed=4)
    two = steady(twin, parse_scenario({"system": {"replicas": 2}}), SLO, **kw)
    same = steady(twin.with_values(replicas=2), None, SLO, **kw)
    one = steady(twin, None, SLO, **kw)
    assert (two.n, two.good) == (same.n, same.good)
    assert two.n == one.n and two.n_good > one.n_good  # same arrivals, more served within the SLO
