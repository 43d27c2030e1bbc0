"""Study output of `capplan synth`: validation, determinism, CLI, ground truth."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from capplan import open_study
from capplan.cli import main
from capplan.sim.config import PRESETS, parse_config
from capplan.sim.sweep import generate_study
from capplan.sim.truth import true_attainment
from capplan.validate import validate_path

REPO = Path(__file__).resolve().parents[1]


def _small_demo(**sweep) -> dict:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS["demo"].items()}
    raw["sweep"] = {**raw["sweep"], "rates": [1.0, 5.0, 12.0], "duration_s": 80.0, "warmup_s": 10.0,
                    "repeats": 1, **sweep}
    return raw


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_scaled_down_demo_passes_validation_with_no_problems(tmp_path):
    out = tmp_path / "demo"
    path, stats = generate_study(parse_config(_small_demo()), out)
    problems, study = validate_path(path)
    assert [p.format() for p in problems.items] == []
    st = open_study(path)
    assert st.has("itl_ns") and st.has("tenant") and st.resource_files
    m = st.manifest
    assert m.load_model == "open" and [r.offered_rps for r in m.runs] == [1.0, 5.0, 12.0]
    assert all(r.warmup_s == 10.0 and r.duration_s == 80.0 and r.arrival == "poisson" for r in m.runs)
    for k in ("gpu", "gpus_per_replica", "tp", "pp", "replicas", "engine", "model"):
        assert k in m.system
    assert m.workload["service_model"]["prefill_ms_per_token"] > 0
    tenants = {t for (t,) in st.sql("SELECT DISTINCT tenant FROM events").fetchall()}
    assert tenants == {"acme", "globex"}
    statuses = dict(st.sql("SELECT status, count(*) FROM events GROUP BY 1").fetchall())
    assert statuses.get("timeout", 0) + statuses.get("rejected", 0) > 0  # overload fails requests
    cols = {r[0] for r in st.sql("DESCRIBE resources").fetchall()}
    assert {"t_ns", "gpu_index", "power_w", "run_id"} <= cols
    pw = st.sql("SELECT min(power_w), max(power_w) FROM resources").fetchone()
    assert 100.0 <= pw[0] <= pw[1] <= 650.0
    assert (path / "README.md").is_file()
    assert sum(s["requests"] for s in stats) == st.sql("SELECT count(*) FROM events").fetchone()[0]


def test_same_seed_is_byte_identical_other_seed_differs(tmp_path):
    cfg = parse_config(_small_demo(rates=[2.0, 9.0], duration_s=40.0))
    a, _ = generate_study(cfg, tmp_path / "a", workers=1)
    b, _ = generate_study(cfg, tmp_path / "b", workers=2)  # parallel workers change nothing
    c, _ = generate_study(cfg.with_(seed=cfg.seed + 1), tmp_path / "c", workers=1)
    fa, fb, fc = _files(a), _files(b), _files(c)
    assert fa == fb
    assert fa.keys() == fc.keys()
    assert fa["events/r01.parquet"] != fc["events/r01.parquet"]


def test_committed_demo_study_is_valid_and_brackets_the_slo():
    sample = REPO / "data" / "sample"
    if not (sample / "study.yaml").is_file():
        pytest.skip("data/sample not generated in this checkout")
    problems, _ = validate_path(sample)
    assert [p.format() for p in problems.items] == []
    from capplan.metrics import Window, good_predicate, request_view
    from capplan.slo import SLO

    st = open_study(sample)
    assert len(st.manifest.runs) >= 8
    assert sum(f.stat().st_size for f in sample.rglob("*") if f.is_file()) < 10 * 2**20
    view = request_view(st, Window.of(st))
    pred, params = good_predicate(SLO.parse("ttft_ms=2000,tpot_ms=100,attainment=0.99"))
    rows = st.sql(f"SELECT offered_rps, avg(CASE WHEN {pred} THEN 1.0 ELSE 0.0 END) FROM {view} "
                  "WHERE in_window GROUP BY 1 ORDER BY 1", params).fetchall()
    att = [a for _, a in rows]
    assert att[0] >= 0.99 and att[1] >= 0.99 and att[-1] < 0.99 and att[-2] < 0.99


def test_cli_writes_study_and_reports_bad_config(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_small_demo(rates=[2.0], duration_s=30.0)))
    assert main(["synth", "--config", str(cfg), "--out", str(tmp_path / "s"), "--no-progress", "--seed", "4"]) == 0
    assert yaml.safe_load((tmp_path / "s" / "study.yaml").read_text())["workload"]["seed"] == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text("replica: {max_batch: -1}\nsweep: {rates: [1]}\n")
    capsys.readouterr()
    assert main(["synth", "--config", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "replica.max_batch" in err and str(bad) in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()  # nothing half-written
    assert main(["synth", "--preset", "nope", "--out", str(tmp_path / "y")]) == 2
    assert "demo" in capsys.readouterr().err
    assert main(["synth", "--preset", "demo"]) == 2
    assert "--out" in capsys.readouterr().err


def test_closed_loop_study_validates(tmp_path):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS["small"].items()}
    raw["sweep"] = {"load_model": "closed", "concurrency": [2, 16], "duration_s": 40.0, "warmup_s": 5.0}
    path, stats = generate_study(parse_config(raw), tmp_path / "closed")
    problems, _ = validate_path(path)
    assert [p.format() for p in problems.items] == []
    st = open_study(path)
    assert st.manifest.load_model == "closed" and [r.concurrency for r in st.manifest.runs] == [2, 16]
    n2, n16 = (s["requests"] for s in stats)
    assert n16 > 3 * n2


def test_truth_attainment_is_high_below_and_low_above_capacity(capsys):
    cfg = parse_config(PRESETS["small"])
    lo = true_attainment(cfg, 1.0, "ttft_ms=2000,tpot_ms=100", replications=3, duration_s=40.0, warmup_s=5.0)
    hi = true_attainment(cfg, 12.0, "ttft_ms=2000,tpot_ms=100", replications=3, duration_s=40.0, warmup_s=5.0)
    assert lo.attainment > 0.99 and hi.attainment < 0.3
    assert lo.ci_low <= lo.attainment <= lo.ci_high and lo.replications == 3
    assert hi.n_requests > lo.n_requests
    # same seed ⇒ same truth
    again = true_attainment(cfg, 12.0, "ttft_ms=2000,tpot_ms=100", replications=3, duration_s=40.0, warmup_s=5.0)
    assert again == hi
    assert main(["synth", "--truth", "--preset", "small", "--rate", "1", "--slo", "ttft_ms=2000",
                 "--replications", "2", "--duration-s", "30"]) == 0
    out = capsys.readouterr().out
    assert "offered_rps" in out and "yes" in out


def test_true_capacity_brackets_the_crossing():
    from capplan.errors import SpecError
    from capplan.sim.truth import true_capacity

    cfg = parse_config(PRESETS["small"])
    kw = dict(replications=2, duration_s=40.0, warmup_s=5.0, tol_rps=0.5)
    c = true_capacity(cfg, "ttft_ms=2000,tpot_ms=100,attainment=0.99", 1.0, 12.0, **kw)
    lo, hi = c.bracket
    assert 1.0 < c.capacity_rps < 12.0 and hi - lo <= 0.5 and lo < c.capacity_rps < hi
    by_rate = {e.offered_rps: e.attainment for e in c.evaluations}
    assert by_rate[lo] >= 0.99 > by_rate[hi]
    with pytest.raises(SpecError):
        true_capacity(cfg, "ttft_ms=2000,tpot_ms=100", 11.0, 12.0, **kw)


def test_bench_preset_is_twelve_runs_of_a_million_requests_without_itl():
    from capplan.sim.config import preset
    from capplan.sim.sweep import manifest_for, plan_runs

    cfg = preset("bench")
    plans = plan_runs(cfg)
    assert len(plans) == 12 and not cfg.itl
    assert all(abs(p.duration_s * p.level - 1_000_000) < 1e-6 for p in plans)
    assert cfg.lengths.kind == "fixed" and int(cfg.lengths.output.median) == 200
    m = manifest_for(cfg, plans)
    assert [r["offered_rps"] for r in m["runs"]] == list(cfg.rates)


def test_out_never_replaces_a_folder_that_is_not_a_study(tmp_path, capsys):
    keep = tmp_path / "work"
    keep.mkdir()
    (keep / "precious.txt").write_text("x")
    assert main(["synth", "--preset", "small", "--out", str(keep), "--no-progress"]) == 2
    assert "not a capplan study" in capsys.readouterr().err
    assert (keep / "precious.txt").read_text() == "x"


def test_replay_config_runs_the_trace_rows(tmp_path):
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for k in range(60):
        rows.append(f"2023-11-16 18:17:{k:02d}.5000000,{100 + 10 * k},{5 + k}")
    rows.append("2023-11-16 18:18:00.5000000,20000,10")  # longer than max_model_len → error
    (tmp_path / "tr.csv").write_text("\n".join(rows))
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS["small"].items()}
    raw["workload"] = {"arrival": {"process": "replay", "path": "tr.csv"}}
    raw["sweep"] = {"rates": [2.0], "duration_s": 30.5, "warmup_s": 0.0}
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(raw))
    assert main(["synth", "--config", str(cfg_file), "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    st = open_study(tmp_path / "s")
    got = st.sql("SELECT input_tokens, output_tokens, status FROM events ORDER BY scheduled_ns, request_id").fetchall()
    assert len(got) == 61  # 61 rows at 1 req/s in the trace → 30.5 s at 2 req/s
    assert [(a, b) for a, b, _ in got[:60]] == [(100 + 10 * k, 5 + k) for k in range(60)]
    assert got[60][2] == "error" and all(s == "ok" for *_, s in got[:60])
