"""The twin's fleet parts (capplan.twin.fleet): failure, rollout, demand and autoscaler parsed
with the spec kit (errors name the field), applied to the synth configuration, and a
`capplan twin run` whose study carries its timeline and SLO, analysed by `capplan timeline`;
the fluid check of a lost replica on a twin with deterministic service."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from capplan.cli import main
from capplan.errors import SpecError
from capplan.sim.config import ArrivalSpec, parse_config
from capplan.sim.engine import OK
from capplan.sim.events import token_times
from capplan.sim.sweep import generate_study, simulate_level
from capplan.timeline import analyse_timeline
from capplan.twin import fit_twin, parse_scenario, run_scenario, write_twin
from capplan.validate import validate_path

from conftest import fixed_service_raw

NS = 1_000_000_000


def _raw():
    """Deterministic service (fixed 128/64-token requests, batch ≤ 16) on one replica, a sweep
    to fit the twin on."""
    return fixed_service_raw(1, rates=(1.0, 3.0, 5.0, 6.5), duration_s=120.0, warmup_s=10.0)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    path, _ = generate_study(parse_config(_raw()), tmp_path_factory.mktemp("tw") / "s", workers=1)
    return fit_twin(path, reps=30)


def test_parts_errors_name_the_field():
    with pytest.raises(SpecError) as e:
        parse_scenario({"failure": {"at_s": 60, "loose": "zone"}})
    assert e.value.field == "failure.loose" and "lose" in str(e.value.format())
    with pytest.raises(SpecError) as e:
        parse_scenario({"failure": {"lose": "zone"}})
    assert e.value.field == "failure.at_s"
    with pytest.raises(SpecError) as e:
        parse_scenario({"failure": [{"at_s": 60}, {"at_s": 90, "in_flight": "maybe"}]})
    assert e.value.field == "failure[1].in_flight"
    with pytest.raises(SpecError) as e:
        parse_scenario({"rollout": {"at_s": 60, "max_surge": 0, "max_unavailable": 0}})
    assert e.value.field == "rollout.max_surge"
    with pytest.raises(SpecError, match="exactly one of"):
        parse_scenario({"demand": {"steps": [{"at_s": 1, "rate_rps": 2}], "ramps": []}})
    with pytest.raises(SpecError) as e:
        parse_scenario({"autoscaler": {"ready_s": 30}})
    assert e.value.field == "autoscaler.capacity_rps"
    with pytest.raises(SpecError) as e:
        parse_scenario({"autoscaler": {"capacity_rps": 2, "signal": "cpu"}})
    assert e.value.field == "autoscaler.signal"
    with pytest.raises(SpecError) as e:
        parse_scenario({"slo": "ttft_ms=-1"})
    assert e.value.field == "slo"


def test_parts_set_the_fleet_control_and_demand(twin):
    sc = parse_scenario({
        "system": {"replicas": 4}, "workload": {"rate_rps": 6}, "run": {"duration_s": 900},
        "failure": {"at_s": "5min", "lose": "zone", "zones": ["a", "b"], "detect_s": 10,
                    "ready_time_s": {"provision": 60, "weights": 30}},
        "rollout": {"at_s": 600, "max_surge": 2, "ready_s": 45},
        "demand": {"ramps": [{"from_s": 100, "to_s": 400, "to_rps": 12}]},
        "autoscaler": {"capacity_rps": 3.0, "signal": ["queue_work", "ttft_p99"], "warm_floor": 2,
                       "max_replicas": 8, "ready_s": 90, "ttft_target_ms": 1500}})
    cfg = sc.apply(twin).config
    c = cfg.control
    assert c.initial == 4 and c.placement.zones == ("a", "b")
    (f,) = c.failures
    assert (f.at_s, f.lose, f.detect_s, f.ready_s) == (300.0, "zone", 10.0, 90.0)
    assert c.rollout.max_surge == 2 and c.rollout.ready_s == 45.0
    assert c.autoscaler.signals == ("queue_work", "ttft_p99") and c.autoscaler.warm_floor == 2
    assert c.ttft_limit_ms == 1500
    assert cfg.demand.rate(0) == 6.0 and cfg.demand.rate(400) == 12.0 and cfg.rates == (12.0,)
    assert "failure: lose the largest zone" in sc.describe()


def test_twin_run_writes_the_timeline_and_the_slo(twin, tmp_path, capsys):
    tw = tmp_path / "twin.yaml"
    write_twin(twin, tw)
    sc = tmp_path / "scenario.yaml"
    sc.write_text(yaml.safe_dump({
        "name": "lose-one", "slo": "ttft_ms=5000,attainment=0.99",
        "system": {"replicas": 3}, "workload": {"rate_rps": 12, "arrival": {"process": "poisson"}},
        "run": {"duration_s": 400, "warmup_s": 30, "seed": 3},
        "failure": {"at_s": 150, "count": 1, "detect_s": 5, "route_removal_s": 2, "ready_s": 60}}))
    out = tmp_path / "study"
    assert main(["twin", "run", "--twin", str(tw), "--scenario", str(sc), "--out", str(out)]) == 0
    problems, _ = validate_path(out)
    assert not problems.errors, [p.format() for p in problems.errors]
    assert (out / "timeline" / "r01.parquet").is_file()
    meta = yaml.safe_load((out / "study.yaml").read_text())
    assert meta["slo"].startswith("ttft_ms=5000")
    capsys.readouterr()
    assert main(["timeline", str(out), "--window", "5s"]) == 0  # the SLO from study.yaml
    text = capsys.readouterr().out
    assert "Incident 1 at 150.0 s — failure" in text and "SLO from study.yaml" in text
    # same twin + scenario ⇒ the same timeline, byte for byte
    out2 = tmp_path / "study2"
    assert main(["twin", "run", "--twin", str(tw), "--scenario", str(sc), "--out", str(out2)]) == 0
    assert (out / "timeline" / "r01.parquet").read_bytes() == (out2 / "timeline" / "r01.parquet").read_bytes()


def test_fluid_check_on_a_twin(twin, tmp_path):
    """Lose 1 of 3 replicas of a twin with deterministic service at λ between C₂ and C₃,
    replaced after T_ready: the queue peaks at (λ − C₂)·T_ready and drains in Q / (C₃ − λ)."""
    # the batch limit the fit could only bound from below (the sweep never filled it) is set,
    # so a saturated replica serves at one rate C
    twin = twin.with_values(max_batch=16, queue_limit=None)
    # C: one replica overloaded by constant arrivals (admissions staggered as in the scenario;
    # a burst would admit whole batches at once and share their prefill iterations)
    cfg = twin.synth_config(rates=[9.0], duration_s=300.0, warmup_s=0.0, repeats=1)
    cfg = replace(cfg, replicas=1, itl=False, arrival=ArrivalSpec("constant"))
    res = simulate_level(cfg, 9.0, duration_s=300.0)
    _, _, last, _, _ = token_times(res, False)
    done = last[res.status == OK]
    C = float(((done > 100 * NS) & (done < 300 * NS)).sum() / 200.0)
    lam, T = 2.5 * C, 60.0
    sc = parse_scenario({"system": {"replicas": 3},
                         "workload": {"rate_rps": lam, "arrival": {"process": "constant"}},
                         "run": {"duration_s": 900, "warmup_s": 60, "seed": 1},
                         "failure": {"at_s": 300, "count": 1, "ready_s": T}})
    path, _, _ = run_scenario(twin, sc, tmp_path / "fluid")
    inc = analyse_timeline(path, "ttft_ms=5000,attainment=0.99", window_s=1.0).incidents.iloc[0]
    q = (lam - 2 * C) * T
    drain = q / (3 * C - lam)
    assert abs(inc["queue_peak"] / q - 1) < 0.10, (inc["queue_peak"], q, C)
    assert abs(inc["drain_s"] / drain - 1) < 0.10, (inc["drain_s"], drain)


def test_retry_policy_and_work_units_in_the_scenario(twin, tmp_path, capsys):
    sc = parse_scenario({
        "system": {"replicas": 3}, "workload": {"rate_rps": 6}, "run": {"duration_s": 300},
        "failure": {"at_s": 100, "retry": {"max_retries": 2, "backoff_s": "200ms", "budget": 0.1}},
        "rollout": {"at_s": 200, "retry": {"max_retries": 2, "backoff_s": 0.2, "budget": 0.1}},
        "autoscaler": {"capacity_rps": 3.0, "request_work": 900, "decode_token_weight": 6.5}})
    c = sc.apply(twin).config.control
    assert c.failures[0].in_flight == "retried"  # a retry policy implies it
    assert (c.retry.max_retries, c.retry.backoff_s, c.retry.budget) == (2, 0.2, 0.1)
    assert c.autoscaler.request_work == 900 and c.autoscaler.decode_token_weight == 6.5
    assert "clients retry up to 2×" in sc.describe()
    for bad, fld in (({"at_s": 1, "retry": {"jitter": "fulll"}}, "failure.retry.jitter"),
                     ({"at_s": 1, "in_flight": "lost", "retry": {}}, "failure.retry"),
                     ({"at_s": 1, "retry_delay_s": 2, "retry": {}}, "failure.retry"),
                     ({"at_s": 1, "retry": {"budget": -0.5}}, "failure.retry.budget")):
        with pytest.raises(SpecError) as e:
            parse_scenario({"failure": bad})
        assert e.value.field == fld, (bad, e.value.field)
    with pytest.raises(SpecError) as e:
        parse_scenario({"autoscaler": {"capacity_rps": 2, "request_work": 0}})
    assert e.value.field == "autoscaler.request_work"
    with pytest.raises(SpecError) as e:  # two parts, two policies for the same clients
        parse_scenario({"failure": {"at_s": 1, "retry": {"max_retries": 1}},
                        "rollout": {"at_s": 2, "retry": {"max_retries": 5}}}).apply(twin)
    assert "different client retry policies" in str(e.value)
    # on the command line: a bad value names the field, exit 2, no traceback
    tw = tmp_path / "twin.yaml"
    write_twin(twin, tw)
    scf = tmp_path / "scenario.yaml"
    scf.write_text(yaml.safe_dump({"failure": {"at_s": 10, "retry": {"max_retries": -1}}}))
    capsys.readouterr()
    assert main(["twin", "run", "--twin", str(tw), "--scenario", str(scf), "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "failure.retry.max_retries" in err and "Traceback" not in err
