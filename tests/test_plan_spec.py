"""Every bad plan spec gets a clear error naming the field and a fix, exit 2, nothing written."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from capplan.cli import main
from capplan.errors import SpecError
from capplan.plan import load_plan_spec

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "name": "t",
    "demand": {"peak_rps": 100.0, "uncertainty": 0.1},
    "capacity": {"source": "number", "rps_per_group": 30.0},
    "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8},
    "failure": {"policy": "zone", "zones": ["a", "b", "c"]},
    "rollout": {"max_surge": 1, "max_unavailable": 0},
    "autoscaling": {"ready_time_s": {"provision": 60}, "burst_growth_rps_per_s": 0.1},
    "prices": {"usd_per_gpu_hour": 2.0},
}


def variant(path: str, value):
    d = copy.deepcopy(GOOD)
    keys = path.split(".")
    cur = d
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    if value is DELETE:
        del cur[keys[-1]]
    else:
        cur[keys[-1]] = value
    return d


DELETE = object()

BAD = [
    # (change, expected field, words in the message)
    (("demand.peak_rps", -5), "demand.peak_rps", "must be > 0"),
    (("demand.peak_rps", {"interactive": 10, "batch": -1}), "demand.peak_rps.batch", "must be > 0"),
    (("demand.peak_rps", "lots"), "demand.peak_rps", "must be a number, got text 'lots'"),
    (("demand.peak_rps", DELETE), "demand.peak_rps", "needs peak_rps"),
    (("demand.history", "d.csv"), "demand.history", "both peak_rps and history"),
    (("demand.uncertainty", -0.1), "demand.uncertainty", "must be ≥ 0"),
    (("demand.uncertainty", 20), "demand.uncertainty", "means planning for 21× the peak"),
    (("demand.horizon_quarters", 1.5), "demand.horizon_quarters", "whole number"),
    (("demand.horizon_quarters", 0), "demand.horizon_quarters", "must be ≥ 1"),
    (("demand.mean_to_peak", 1.5), "demand.mean_to_peak", "must be ≤ 1"),
    (("demand.peek_rps", 3), "demand.peek_rps", "unknown key(s) in demand: peek_rps"),
    (("capacity.rps_per_group", 0), "capacity.rps_per_group", "must be > 0"),
    (("capacity.rps_per_group", DELETE), "capacity.rps_per_group", "rps_per_group is missing"),
    (("capacity.use", "median"), "capacity.use", "unknown capacity.use 'median'"),
    (("capacity.source", "guess"), "capacity.source", "unknown capacity.source"),
    (("capacity.reps", 2), "capacity.reps", "must be ≥ 10"),
    (("replica_group.gpus_per_replica", 0), "replica_group.gpus_per_replica", "must be ≥ 1"),
    (("replica_group.gpus_per_node", True), "replica_group.gpus_per_node", "must be a whole number"),
    (("replica_group.tp", 2), "replica_group.gpus_per_replica", "≠ tp × pp = 2"),
    (("failure.policy", "rack"), "failure.policy", "unknown failure.policy 'rack'"),
    (("failure.zones", 1), "failure.zones", "policy zone needs at least 2 zones"),
    (("failure.zones", ["a", "a"]), "failure.zones", "duplicate zone names"),
    (("failure.nodes_available", 2), "failure.zones", "3 zones but only 2 nodes available"),
    (("failure.k", -1), "failure.k", "must be ≥ 0"),
    (("rollout.max_surge", -1), "rollout.max_surge", "must be ≥ 0"),
    (("rollout.max_surge", 0), "rollout.max_unavailable", "both 0"),
    (("autoscaling.ready_time_s", {"boot": 5}), "autoscaling.ready_time_s.boot", "unknown ready-time part 'boot'"),
    (("autoscaling.ready_time_s", {"image": -5}), "autoscaling.ready_time_s.image", "must be ≥ 0"),
    (("autoscaling.ready_time_s", 30), "autoscaling.ready_time_s", "mapping of parts to seconds"),
    (("autoscaling.burst_growth_rps_per_s", -1), "autoscaling.burst_growth_rps_per_s", "must be ≥ 0"),
    (("prices.usd_per_gpu_hour", DELETE), "prices.usd_per_gpu_hour", "usd_per_gpu_hour is missing"),
    (("prices.usd_per_gpu_hour", "2$"), "prices.usd_per_gpu_hour", "must be a number"),
    (("prices.pue", 0.8), "prices.pue", "must be ≥ 1"),
    (("prices.billing", "rack"), "prices.billing", "unknown prices.billing"),
    (("prices", DELETE), "prices", "missing the 'prices' section"),
    (("rollout", [1, 2]), "rollout", "rollout must be a mapping of keys, got a list"),
    (("budget", 5), "budget", "unknown key(s) in plan spec: budget"),
    (("slo", "ttft_ms=abc"), "slo.ttft_ms", "ttft_ms must be a number, got text 'abc'"),
    (("slo", "ttft=5"), "slo.ttft", "unknown SLO key(s): ttft (did you mean ttft_ms?)"),
    (("slo", "ttft_ms=100,attainment=1.2"), "slo.attainment", "attainment must be < 1, got 1.2"),
    (("slo", "ttft_ms=100,itl_stat=p90"), "slo.itl_stat", "unknown itl_stat 'p90'"),
]


@pytest.mark.parametrize("change, field, words", BAD, ids=[f"{c[0]}={c[1]!r}"[:40] for c, _, _ in BAD])
def test_bad_spec_library(change, field, words):
    with pytest.raises(SpecError) as exc:
        load_plan_spec(variant(*change))
    assert exc.value.field == field
    assert words in str(exc.value)
    assert exc.value.fix  # every error says how to fix it


@pytest.mark.parametrize("change, field, words", BAD[::3], ids=[f"{c[0]}" for c, _, _ in BAD[::3]])
def test_bad_spec_cli_exit_2_nothing_written(tmp_path, capsys, change, field, words):
    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump(variant(*change), allow_unicode=True), encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["plan", "--spec", str(spec), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert words in err and f"field:   {field}" in err and "fix:" in err and str(spec) in err
    assert "Traceback" not in err
    assert not out.exists()


def test_good_spec_loads_and_round_trips():
    spec = load_plan_spec(GOOD)
    assert spec.failure.zones == ("a", "b", "c")
    assert load_plan_spec(spec.to_dict()) == spec


@pytest.mark.parametrize("text, words", [
    ("demand: [1, 2\n", "not valid YAML at line"),
    ("- just\n- a list\n", "must be a mapping"),
])
def test_unreadable_yaml(tmp_path, capsys, text, words):
    p = tmp_path / "plan.yaml"
    p.write_text(text, encoding="utf-8")
    assert main(["plan", "--spec", str(p), "--out", str(tmp_path / "o"), "--capacity-rps", "3"]) == 2
    assert words in capsys.readouterr().err


def test_missing_spec_file(tmp_path, capsys):
    assert main(["plan", "--spec", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "plan spec file not found" in capsys.readouterr().err


def test_no_study_no_capacity(tmp_path, capsys):
    d = variant("capacity", {"source": "study"})
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(d), encoding="utf-8")
    assert main(["plan", "--spec", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "--capacity-rps" in capsys.readouterr().err


def test_missing_gpus_without_study(tmp_path, capsys):
    d = variant("replica_group", {"gpus_per_node": 8})
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(d), encoding="utf-8")
    assert main(["plan", "--spec", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "replica_group.gpus_per_replica is missing" in capsys.readouterr().err


def test_bad_cli_override(tmp_path, capsys):
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(GOOD), encoding="utf-8")
    assert main(["plan", "--spec", str(p), "--out", str(tmp_path / "o"), "--confidence", "1.5"]) == 2
    assert "--confidence must be between 0.5 and 1, got 1.5" in capsys.readouterr().err  # slo.check_confidence
    assert main(["plan", "--spec", str(p), "--out", str(tmp_path / "o"), "--confidence", "0.9995"]) == 2
    assert "capacity.confidence must be ≤ 0.999" in capsys.readouterr().err  # the spec's own check
    assert main(["plan", "--spec", str(p), "--out", str(tmp_path / "o"), "--capacity-rps", "-3"]) == 2
    assert "capacity.rps_per_group must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_template_is_valid():
    spec = load_plan_spec(ROOT / "templates" / "plan.yaml")
    assert spec.capacity.source == "study" and spec.slo is not None
    assert spec.autoscaling.ready_s > 0 and spec.prices.usd_per_gpu_hour > 0


def test_surge_larger_than_fleet_via_cli(tmp_path, capsys):
    # D = 110, C = 30 → 4 traffic groups; zone policy (3 zones) → 6; cold start b·T = 0.1 × 60 = 6 req/s
    # → ⌈6/30⌉ = 1 more → 7 (7 − ⌈7/3⌉ = 4 ≥ ⌈116/30⌉ = 4); surge 9 > 7
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(variant("rollout.max_surge", 9)), encoding="utf-8")
    out = tmp_path / "o"
    assert main(["plan", "--spec", str(p), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rollout.max_surge (9) is larger than the planned fleet (7 groups)" in err and "field:   rollout.max_surge" in err
    assert not out.exists()
