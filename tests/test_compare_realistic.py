"""capplan compare on realistic synth sweeps (capplan.sim): one replica of the demo model,
8 offered rates from light load into overload, 300-s runs — the setting where comparisons went
wrong before (same-system seed pairs refused or failed; a slower decode refused as "a different
workload"). Small versions here (a few pairs); the full rates over ≥ 40 pairs, with their
Clopper–Pearson intervals, come from benchmarks/compare_synth.py."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from capplan.cli import main
from capplan.compare import compare, ks_distance
from capplan.compare.workload import ks_critical
from capplan.envelope import fit_envelope
from capplan.errors import StudyError
from capplan.study import open_study

RATES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.5)
SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
LONG_ANSWER = 256  # requested output tokens at or above this are "long answers"


def sweep(seed: int, decode_slowdown: float = 1.0, *, rates=RATES, duration_s: float = 300.0,
          warmup_s: float = 30.0, output_median: float | None = None):
    """The demo model on one replica (capacity under the SLO ≈ 2.7 req/s), no ITL lists or
    power samples; ``decode_slowdown`` multiplies every decode step (the same seed offers the
    same trace: arrivals, prompts and requested answer lengths do not depend on the server)."""
    from capplan.sim import preset

    cfg = preset("demo")
    cfg = cfg.with_(seed=seed, replicas=1, system={**cfg.system, "replicas": 1}, rates=tuple(rates),
                    duration_s=duration_s, warmup_s=warmup_s, power=None, itl=False)
    if decode_slowdown != 1.0:
        sm = cfg.replica.service
        sm = replace(sm, decode_step_ms=tuple(decode_slowdown * v for v in sm.decode_step_ms))
        cfg = cfg.with_(replica=replace(cfg.replica, service=sm))
    if output_median is not None:  # the client asks for other answer lengths
        def longer(d):
            return replace(d, output=replace(d.output, median=output_median))

        cfg = cfg.with_(lengths=longer(cfg.lengths), tenants=tuple(
            replace(t, lengths=longer(t.lengths) if t.lengths else None) for t in cfg.tenants))
    return cfg


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    from capplan.sim import generate_study

    root = tmp_path_factory.mktemp("realistic")
    made = {}
    for name, cfg in {"base": sweep(100), "same": sweep(101), "base2": sweep(102),
                      "same2": sweep(103), "slow": sweep(100, 1.3)}.items():
        made[name] = generate_study(cfg, root / name, workers=1)[0]
    return made


def _lower(bucket: str) -> int:
    return int(re.match(r"\[([\d,]+),", bucket).group(1).replace(",", ""))


# ---------------------------------------------------------------- no false alarm


def test_same_system_seed_pairs_pass_every_gate(studies):
    """Two seed pairs of one system, from light load into overload: compared (not refused —
    the answers received differ by chance, the answers asked for do not), every gate passes,
    and the runs split into steady ones and saturated ones (overloaded or beyond the
    baseline's SLO capacity) whose intervals carry the run-to-run spread."""
    for b, c, seed in (("base", "same", 0), ("base2", "same2", 1)):
        cmp = compare(studies[b], studies[c], SLO, reps=200, seed=seed)
        assert not cmp.paired
        assert cmp.verdict.passed, cmp.verdict.to_text()
        fam = cmp.workload.set_index("run_baseline")["family"]
        assert fam["r01"] == fam["r02"] == "steady" and fam["r08"] == "saturated"
        assert any("widened ×2" in n for n in cmp.verdict.notes)
        assert (cmp.workload["sd_factor"] == 2.0).all()  # another trace: every run widened
        t = cmp.to_frame()
        kinds = dict(zip(t["metric"] + "/" + t["scope"], t["kind"]))
        # stochastic failures are judged with their interval; server errors at steady load are
        # the only failure that fails at once
        assert kinds["error_rate/saturated runs"] == kinds["error_rate/steady runs"] == "stat"
        assert kinds["server_error_rate/steady runs"] == "deterministic"


def test_same_trace_same_system_is_identical(studies):
    cmp = compare(studies["base"], studies["base"], SLO, reps=200, seed=0)
    assert cmp.paired and cmp.verdict.passed
    t = cmp.to_frame()
    assert np.allclose(t["delta"].fillna(0), 0)


# ---------------------------------------------------------------- detection


def test_slower_decode_fails_with_the_long_answer_buckets_named(studies, tmp_path, capsys):
    """The same offered trace on a replica whose decode is 30 % slower: compared (exit 1, not
    refused with exit 2 — the answers received are shorter because long answers time out, but
    that is the regression), and the long-answer buckets (by requested length) fail on their
    failure rate, while the shortest answers' failure rate does not move significantly."""
    rc = main(["compare", str(studies["base"]), str(studies["slow"]), "--slo", SLO,
               "--reps", "200", "--seed", "0", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "PAIRED" in out and re.search(r"bucket regressed: saturated runs, max_output_tokens "
                                         r"\[(256|512)", out)
    runs = pd.read_csv(tmp_path / "out" / "workload.csv", encoding="utf-8-sig")
    # the same trace: only the saturated runs are widened for the run-to-run spread
    assert ((runs["family"] == "saturated") == (runs["sd_factor"] == 2.0)).all()
    bk = pd.read_csv(tmp_path / "out" / "buckets.csv", encoding="utf-8-sig", keep_default_na=False)
    bk = bk[bk["dimension"] == "max_output_tokens"]
    fails = bk[bk["metric"] == "error_rate"]
    long_ = fails[fails["bucket"].map(_lower) >= LONG_ANSWER]
    short = fails[fails["bucket"].map(_lower) < 128]
    assert len(long_) and (long_["flag"] == "REGRESSED").any()
    assert (long_["candidate"].astype(float) > long_["baseline"].astype(float) + 0.1).all()
    assert len(short) and (short["flag"] == "").all()
    # the old rule (output tokens received) would have called it a different workload
    recv = {}
    for k in ("base", "slow"):
        t = pq.read_table(studies[k] / "events" / "r08.parquet",
                          columns=["status", "output_tokens"]).to_pandas()
        v, c = np.unique(t.loc[t["status"] == "ok", "output_tokens"], return_counts=True)
        recv[k] = (v, c)
    d = ks_distance(*recv["base"], *recv["slow"])
    assert d > ks_critical(recv["base"][1].sum(), recv["slow"][1].sum(), 1)


def test_different_requested_answer_lengths_are_refused(tmp_path):
    """What the client asked for is the offered workload: a candidate run with other requested
    answer lengths is refused, the difference named."""
    from capplan.sim import generate_study

    short = dict(rates=(1.0, 2.0), duration_s=120.0, warmup_s=10.0)
    a, _ = generate_study(sweep(7, **short), tmp_path / "a", workers=1)
    b, _ = generate_study(sweep(7, output_median=400.0, **short), tmp_path / "b", workers=1)
    with pytest.raises(StudyError) as ei:
        compare(a, b, SLO, reps=100, seed=0)
    text = ei.value.format()
    assert "requested output tokens (max_output_tokens) distribution differs" in text


def test_without_requested_lengths_the_output_check_is_skipped_and_said(tmp_path):
    """Studies that do not record max_output_tokens (vLLM, AIPerf, ...): the answer lengths
    are not compared (tokens received are an outcome), and the notes say so; output buckets
    then use the tokens received, said too."""
    from capplan.sim import generate_study

    short = dict(rates=(1.0, 2.0), duration_s=120.0, warmup_s=10.0)
    paths = []
    for name, seed in (("a", 7), ("b", 8)):
        p, _ = generate_study(sweep(seed, **short), tmp_path / name, workers=1)
        for f in (p / "events").glob("*.parquet"):
            t = pq.read_table(f)
            pq.write_table(t.drop_columns(["max_output_tokens"]), f)
        paths.append(p)
    cmp = compare(*paths, SLO, reps=100, seed=0)
    notes = " ".join(cmp.verdict.notes)
    assert "max_output_tokens) are not recorded" in notes and "tokens received" in notes
    assert "output_tokens" in set(cmp.buckets["dimension"])


def test_synth_records_the_requested_answer_length(studies):
    """max_output_tokens is the target length the request was drawn with: an ok request
    received exactly that many tokens, a failed one at most that many, and the same seed on a
    slower replica asked for the same lengths."""
    a = pq.read_table(studies["base"] / "events" / "r08.parquet").to_pandas()
    s = pq.read_table(studies["slow"] / "events" / "r08.parquet").to_pandas()
    ok = a["status"] == "ok"
    assert (a.loc[ok, "output_tokens"] == a.loc[ok, "max_output_tokens"]).all()
    assert (a["output_tokens"] <= a["max_output_tokens"]).all()
    assert (~ok).any() and (a.loc[~ok, "output_tokens"] < a.loc[~ok, "max_output_tokens"]).all()
    assert a["max_output_tokens"].tolist() == s["max_output_tokens"].tolist()
    # the reduction sums what was asked for per cell (a tenant's demand in compare)
    from capplan.reduce import Cells, reduce_study

    st = reduce_study(studies["slow"], SLO, warmup=30.0, cells=Cells(tenant=True))
    r = st.run("r08")
    win = s[s["scheduled_ns"] >= 30 * 10**9]
    assert r.cells.sums["output_tokens_asked"].sum() == win["max_output_tokens"].sum()
    assert r.cells.sums["output_tokens"].sum() == win["output_tokens"].sum()


# ---------------------------------------------------------------- one window for every row


def test_cslo_row_uses_the_same_window_as_every_other_row(tmp_path):
    """The manifests' warm-ups differ (baseline 0 s, candidate 60 s): the comparison uses the
    longer one for both sides, reduces each study once over it, and fits its C_SLO row on
    those very statistics — not on the baseline's own manifest warm-up, which counts the first
    minute (a server that started empty) and gives another capacity."""
    from capplan.metrics import Window
    from capplan.sim import generate_study

    short = dict(rates=(1.5, 2.5, 3.0, 4.5), duration_s=150.0)
    a, _ = generate_study(sweep(11, warmup_s=0.0, **short), tmp_path / "a", workers=1)
    b, _ = generate_study(sweep(12, warmup_s=60.0, **short), tmp_path / "b", workers=1)
    assert {r["warmup_s"] for r in yaml.safe_load((a / "study.yaml").read_text())["runs"]} == {0.0}
    cmp = compare(a, b, SLO, reps=200, seed=3)
    assert (cmp.workload["warmup_s"] == 60.0).all()
    env_b, env_c = cmp.envelopes
    stats = env_b.stats
    assert stats.window.as_dict() == {f"r0{i}": 60.0 for i in range(1, 5)}
    assert env_c.stats.window.as_dict() == stats.window.as_dict()
    row = cmp.to_frame().set_index(["metric", "scope"]).loc[("cslo_rps", "sweep")]
    assert np.allclose([row["baseline"], row["candidate"]],
                       [env_b.cslo.estimate, env_c.cslo.estimate], rtol=0, equal_nan=True)
    # every other row reads the same statistics: the per-run attainment rows, the blocks
    t = cmp.to_frame()
    for r in stats.runs:
        got = t[(t["metric"] == "attainment") & (t["scope"] == f"run {r.run_id}")]
        assert got["baseline"].iat[0] == pytest.approx(r.n_good / r.n, abs=1e-12)
    w = cmp.workload.set_index("run_baseline")
    for r, rc in zip(stats.runs, env_c.stats.runs):
        assert w.loc[r.run_id, "block_requests"] == max(r.block_len.circular,
                                                        rc.block_len.circular)
    # the baseline's own manifest window (0 s) gives another envelope
    own = fit_envelope(a, SLO, confidence=0.95, reps=200, seed=3)
    assert own.stats.window == Window.of(open_study(a), 0.0)
    assert not math.isclose(own.cslo.estimate, env_b.cslo.estimate, rel_tol=1e-6)
    same = fit_envelope(a, SLO, confidence=0.95, reps=200, seed=3, warmup=60.0)
    assert same.stats.window == stats.window
