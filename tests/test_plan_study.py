"""Plans from a study: good fraction, tokens and energy at the operating point; the CLI on a study."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from capplan.cli import main
from capplan.cost import integrate_power_j, study_facts
from capplan.io import manifest_dict, write_study
from capplan.plan import load_plan_spec, make_plan
from capplan.study import open_study
from conftest import ev, events_frame

SLO = "ttft_ms=2000,attainment=0.9"


def _events():
    rows = []
    # run r2 (2 req/s offered): 10 requests over 10 s, 8 good (2 time out), 10 output tokens each
    for i in range(10):
        bad = i in (3, 7)
        rows.append(ev("r2", scheduled_ms=i * 1000.0, ttft_ms=None if bad else 100.0,
                       e2e_ms=None if bad else 1000.0, status="timeout" if bad else "ok", output_tokens=10))
    # run r4 (4 req/s): 10 requests, 6 good, 4 with TTFT 3 s (late), 20 output tokens each
    for i in range(10):
        late = i < 4
        rows.append(ev("r4", scheduled_ms=i * 1000.0, ttft_ms=3000.0 if late else 100.0,
                       e2e_ms=3500.0 if late else 1000.0, output_tokens=20))
    return events_frame(rows)


def _power():
    # two GPUs per run, one sample per second over the run's 0–10 s window (event clock);
    # r2's GPUs are GPU 0 of two hosts (must not be merged), r4's are GPUs 0 and 1 of one host
    rows = []
    for run, watts, gpus in (("r2", 100.0, (("h0", 0), ("h1", 0))), ("r4", 200.0, (("h0", 0), ("h0", 1)))):
        for host, gpu in gpus:
            for s in range(11):
                rows.append({"t_ns": s * 1_000_000_000, "gpu_index": gpu, "power_w": watts, "run_id": run,
                             "host": host})
    return pd.DataFrame(rows)


@pytest.fixture
def study_dir(tmp_path):
    runs = [{"run_id": "r2", "offered_rps": 2.0, "duration_s": 10.0},
            {"run_id": "r4", "offered_rps": 4.0, "duration_s": 10.0}]
    m = manifest_dict("tiny", runs, system={"gpu": "H200", "gpus_per_replica": 2, "tp": 2, "pp": 1, "replicas": 1})
    return write_study(tmp_path / "study", m, _events(), resources=_power())


def test_integrate_power_trapezoid():
    assert integrate_power_j([0, 1_000_000_000, 3_000_000_000], [100.0, 200.0, 200.0]) == pytest.approx(550.0)
    assert integrate_power_j([5], [100.0]) == 0.0
    # clipped to [0.5 s, 2 s]: power 150 W at 0.5 s → 0.5 s × (150+200)/2 + 1 s × 200 = 287.5 J
    assert integrate_power_j([0, 1_000_000_000, 3_000_000_000], [100.0, 200.0, 200.0],
                             500_000_000, 2_000_000_000) == pytest.approx(287.5)


def test_study_facts_per_level(study_dir):
    facts = study_facts(open_study(study_dir), SLO)
    lv2, lv4 = facts.levels
    assert (lv2.offered_requests, lv2.good_requests, lv2.good_fraction) == (10, 8, 0.8)
    assert (lv4.good_requests, lv4.good_output_tokens_per_good_request) == (6, 20.0)
    # 2 GPUs × 100 W × 10 s = 2 000 J over 8 good requests; 2 × 200 × 10 = 4 000 J over 6
    assert lv2.energy_j == pytest.approx(2000.0) and lv2.energy_j_per_good_request == pytest.approx(250.0)
    assert lv4.energy_j_per_good_request == pytest.approx(4000.0 / 6)
    assert lv2.mean_power_w_per_gpu == pytest.approx(100.0) and lv2.gpu_count == 2
    at3 = facts.at(3.0)
    assert at3.good_fraction == pytest.approx(0.7)
    assert at3.good_output_tokens_per_good_request == pytest.approx(15.0)
    assert at3.energy_j_per_good_request == pytest.approx((250.0 + 4000.0 / 6) / 2)
    assert "interpolated between tested levels 2 and 4" in at3.how
    assert "clamped to the highest" in facts.at(9.0).how and facts.at(9.0).good_fraction == pytest.approx(0.6)


def test_plan_reads_the_study_at_the_operating_point(study_dir):
    study = open_study(study_dir)
    spec = load_plan_spec({
        "slo": SLO,
        "demand": {"peak_rps": 6.0, "mean_to_peak": 0.5},
        "failure": {"policy": "none"},
        "rollout": {"max_surge": 1},
        "prices": {"usd_per_gpu_hour": 2.0, "usd_per_kwh": 0.1, "pue": 1.2},
    })
    # C = 3 req/s per group → 2 groups of 2 GPUs (from the study), operating point 3 req/s per group
    plan = make_plan(spec, capacity=3.0, study=study)
    assert plan.value("gpus_per_group") == 2 and plan.value("total_groups") == 2
    assert plan.value("good_fraction") == pytest.approx(0.7)
    assert plan.value("good_output_tokens_per_good_request") == pytest.approx(15.0)
    e_j = (250.0 + 4000.0 / 6) / 2
    assert plan.value("energy_wh_per_good_request") == pytest.approx(e_j * 1.2 / 3600)
    # one 8-GPU node billed; power 150 W per GPU (interpolated) × the 4 GPUs in groups × PUE 1.2
    # (the 4 billed GPUs outside any group are not counted in the energy)
    assert plan.value("billed_gpus") == 8
    assert plan.value("fleet_power_kw") == pytest.approx(150 * 4 * 1.2 / 1000)
    month = 8 * 2.0 * 730 + 150 * 4 * 1.2 / 1000 * 730 * 0.1
    assert plan.value("cost_usd_per_month") == pytest.approx(month)
    good = 6.0 * 0.5 * 730 * 3600 * 0.7
    assert plan.value("cost_usd_per_1k_good_requests") == pytest.approx(month / good * 1000)
    assert plan.value("cost_usd_per_1m_good_output_tokens") == pytest.approx(month / (good * 15) * 1e6)
    assert "interpolated" in plan.item("good_fraction").formula
    # a spec that disagrees with the study's GPUs per replica is refused
    from capplan.errors import SpecError

    with pytest.raises(SpecError, match="study measured 2"):
        make_plan(spec.with_(gpus_per_replica=4), capacity=3.0, study=study)


def test_cli_plan_on_a_study_with_capacity(study_dir, tmp_path, capsys):
    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump({"slo": SLO, "demand": {"peak_rps": 6.0}, "failure": {"policy": "none"},
                                    "prices": {"usd_per_gpu_hour": 2.0}}), encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["plan", str(study_dir), "--spec", str(spec), "--capacity-rps", "3", "--out", str(out),
               "--time", "2026-01-01T00:00:00+00:00"])
    assert rc == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "energy per SLO-meeting request" in text
    prov = pd.read_csv(out / "provenance.csv", encoding="utf-8-sig").set_index("Key")["Value"]
    assert prov["study content hash (sha256)"] == open_study(study_dir).content_hash()


@pytest.fixture
def sweep_dir(tmp_path):
    """Four open-loop levels, 60 requests each; the share of late requests grows with load."""
    rows, runs = [], []
    for rps, late_every in ((2.0, 0), (4.0, 0), (6.0, 12), (8.0, 2)):
        rid = f"r{rps:g}"
        runs.append({"run_id": rid, "offered_rps": rps, "duration_s": 60 / rps})
        for i in range(60):
            late = late_every and i % late_every == 0
            rows.append(ev(rid, scheduled_ms=i * 1000.0 / rps, ttft_ms=3000.0 if late else 150.0,
                           e2e_ms=4000.0 if late else 900.0, output_tokens=12))
    m = manifest_dict("sweep", runs, system={"gpu": "H200", "gpus_per_replica": 1, "tp": 1, "pp": 1, "replicas": 1})
    return write_study(tmp_path / "sweep", m, events_frame(rows))


def test_cli_plan_fits_the_envelope(sweep_dir, tmp_path, capsys):
    pytest.importorskip("capplan.envelope")
    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump({"slo": SLO, "demand": {"peak_rps": 20.0}, "failure": {"policy": "none"},
                                    "capacity": {"reps": 50, "seed": 1},
                                    "prices": {"usd_per_gpu_hour": 2.0}}), encoding="utf-8")
    out = tmp_path / "out"
    args = ["plan", str(sweep_dir), "--spec", str(spec), "--out", str(out), "--time", "2026-01-01T00:00:00+00:00"]
    # one 60-request run per rate: the bound rests on the prior alone, so it is refused …
    assert main(args) == 2 and "not an honest lower bound" in capsys.readouterr().err
    # … unless accepted, which the plan then says
    rc = main(args + ["--accept-optimistic"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "accept_optimistic" in captured.out
    from capplan.envelope import fit_envelope

    env = fit_envelope(open_study(sweep_dir), SLO, confidence=0.95, reps=50, seed=1)
    assert env.cslo.status == "bracketed"
    cap = pd.read_csv(out / "capacity.csv", encoding="utf-8-sig").set_index("Quantity")["Value"]
    # the CSV rounds req/s to 0.0001 (capplan.export.CSV_PRECISION)
    assert float(cap["capacity per replica group C (used by the plan)"]) == \
        pytest.approx(env.cslo.lower_bound, abs=5e-5)
    assert float(cap["C_SLO 95% interval, high end (study system)"]) == pytest.approx(env.cslo.ci_high, abs=5e-5)
    items = pd.read_csv(out / "line_items.csv", encoding="utf-8-sig").set_index("Key")["Value"]
    assert float(items["traffic_groups"]) == -(-20.0 // env.cslo.lower_bound)
    assert "[ok] the study's C_SLO is bracketed" in captured.out


def test_prepare_plan_makes_what_if_fast(study_dir):
    import time

    from capplan.plan import prepare_plan

    study = open_study(study_dir)
    spec = load_plan_spec({"slo": SLO, "demand": {"peak_rps": 6.0}, "failure": {"policy": "none"},
                           "capacity": {"source": "number", "rps_per_group": 3.0},
                           "prices": {"usd_per_gpu_hour": 2.0, "usd_per_kwh": 0.1}})
    pre = prepare_plan(spec, study=study)
    base = make_plan(spec, study=study)
    fast = make_plan(spec, **pre)
    assert fast.to_frame().equals(base.to_frame())
    t0 = time.perf_counter()
    for peak in (4.0, 6.0, 8.0, 10.0, 12.0):
        p = make_plan(spec.with_(peak_rps=peak, pue=1.5), **pre)
    assert (time.perf_counter() - t0) / 5 < 0.02
    assert p.value("total_groups") == 4 and p.value("good_fraction") == pytest.approx(0.7)


def test_demo_study_with_the_template(tmp_path, capsys):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / "data" / "sample" / "study.yaml").is_file():
        pytest.skip("bundled demo study not generated yet")
    out = tmp_path / "demo"
    rc = main(["plan", str(root / "data" / "sample"), "--spec", str(root / "templates" / "plan.yaml"),
               "--out", str(out), "--time", "2026-01-01T00:00:00+00:00"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "Line items:" in captured.out and "Checks:" in captured.out
    import openpyxl

    wb = openpyxl.load_workbook(out / "plan.xlsx")
    assert {"Summary", "Plan line items", "Assumptions", "Capacity with CI", "Cost by quarter",
            "Provenance"} <= set(wb.sheetnames)
    items = {r[5]: r[1] for r in list(wb["Plan line items"].iter_rows(values_only=True))[1:]}
    assert items["total_groups"] >= items["traffic_groups"] >= 1
    assert items["energy_wh_per_good_request"] > 0  # the demo has resources/ power samples
    # energy per 1 000 output tokens = energy per good request ÷ its output tokens × 1 000
    assert items["energy_wh_per_1k_output_tokens"] == pytest.approx(
        items["energy_wh_per_good_request"] / items["good_output_tokens_per_good_request"] * 1000)
    # the template's model section: the KV check runs against the study's time in system
    assert items["kv_max_sequences"] > 0 and items["kv_sequences_needed"] > 0


def test_operating_point_in_study_units_with_two_replicas(tmp_path):
    # the same events measured on a system of 2 replicas: a per-group load of 1.5 req/s is
    # 3 req/s for the study system (interpolated 0.7), not 1.5 (clamped to the 2 req/s level, 0.8)
    runs = [{"run_id": "r2", "offered_rps": 2.0}, {"run_id": "r4", "offered_rps": 4.0}]
    spec = load_plan_spec({"slo": SLO, "demand": {"peak_rps": 3.0}, "failure": {"policy": "none"},
                           "prices": {"usd_per_gpu_hour": 2.0}})
    for replicas, want in ((2, 0.7), (1, 0.8)):
        m = manifest_dict("r", runs, system={"gpu": "H200", "gpus_per_replica": 2, "replicas": replicas})
        study = open_study(write_study(tmp_path / f"s{replicas}", m, _events()))
        plan = make_plan(spec, capacity=2.0, study=study)  # 2 groups → 1.5 req/s per group
        assert plan.value("total_groups") == 2
        assert plan.value("good_fraction") == pytest.approx(want)
