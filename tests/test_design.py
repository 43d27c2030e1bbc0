"""capplan design: next runs, design.yaml, and running a design on a model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from capplan.design import (design_plans, load_design, propose, write_design)
from capplan.twin import load_system
from capplan.envelope import fit_envelope
from capplan.errors import SpecError
from capplan.sim import generate_study, load_config

FIX = Path(__file__).parent / "fixtures"
SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"


@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    cfg = load_config(FIX / "synth_small_sweep.yaml").with_(seed=3)
    p, _ = generate_study(cfg, tmp_path_factory.mktemp("d") / "s", workers=1)
    return p


@pytest.fixture(scope="module")
def design(small_study):
    env = fit_envelope(small_study, SLO, reps=100, seed=0)
    return env, propose(env, budget_minutes=15, sims=2, reps=60, seed=0)


def test_proposal_fits_the_budget_and_targets_the_crossing(design):
    env, d = design
    assert d.runs, d.notes
    # the fewest runs that make the bound honest come first, even past the budget (said)
    assert d.minutes <= 15 + 1e-9 or any("more than the budget" in n for n in d.notes)
    assert all(r.duration_s == 300.0 for r in d.runs)
    lv = env.levels["x"].to_numpy()
    lo, hi = lv[0], lv[-1]
    assert all(lo <= r.rate_rps <= hi for r in d.runs)
    # the sweep's bound is unsupported (one informative run each side, a 47 % bracket): the
    # design starts from the runs the honesty rule names and says how often its simulated
    # outcomes came out honest (with 2 simulations the median outcome may still fall short)
    assert d.current["honesty"] == "unsupported"
    assert any("came out honest in" in n for n in d.notes)
    assert d.expected["lower_bound"] is not None and d.expected["lower_bound"] > 0


def test_commands_and_manifest_stub(design, small_study):
    """The printed commands come from capplan.loadtools (tests/test_loadtools.py runs them
    verbatim): one per run, fresh seeds starting above every earlier round's, the study's
    import step; the synth line names the design file actually written."""
    _, d = design
    tc = d.commands(url="http://127.0.0.1:9000", model="m", tokenizer="/tok",
                    design_path="/tmp/x/design.yaml")
    assert {"guidellm", "aiperf", "vllm", "inference-perf", "capplan synth"} <= set(tc.tools)
    n = sum(r.repeats for r in d.runs)
    assert len(tc.runs) == n and d.runs_in_study == 6
    assert tc.seed_base == 1000 * (6 + 1)
    assert len({r.seed for r in tc.runs}) == n
    assert d.study_path == str(small_study)
    for p in tc.plans:
        if p.tool == "capplan synth":
            assert "--design /tmp/x/design.yaml" in p.commands[0]
        elif p.ok:
            assert len(p.commands) == n and "--into" in p.import_command
    stub = d.manifest_stub()
    assert len(stub) == n
    assert {"run_id", "offered_rps", "duration_s", "warmup_s", "repeat"} <= set(stub[0])
    text = d.to_text()
    assert "expected:" in text and "# aiperf" in text


def test_design_file_round_trip_and_synth(design, tmp_path):
    from capplan.cli import main

    _, d = design
    path = write_design(d, tmp_path / "design.yaml")
    raw = load_design(path)
    plans = design_plans(raw)
    existing = sum(e["runs"] for e in raw["existing"])
    assert len(plans) == existing + sum(r.repeats for r in d.runs)
    # run the design against a model (a synth config stands in for a twin)
    assert main(["synth", "--design", str(path), "--twin", str(FIX / "synth_small_sweep.yaml"),
                 "--out", str(tmp_path / "preview"), "--no-progress"]) == 0
    man = yaml.safe_load((tmp_path / "preview" / "study.yaml").read_text())
    assert len(man["runs"]) == len(plans)
    assert sorted({r["offered_rps"] for r in man["runs"]}) == sorted({p.level for p in plans})


def test_bad_inputs(tmp_path):
    with pytest.raises(SpecError):
        load_design(tmp_path / "missing.yaml")
    (tmp_path / "x.yaml").write_text("format: nope\n")
    with pytest.raises(SpecError):
        load_design(tmp_path / "x.yaml")
    (tmp_path / "y.yaml").write_text("not_a_model_key: 1\n")
    with pytest.raises(SpecError):
        load_system(tmp_path / "y.yaml")


def test_cli_design(small_study, tmp_path):
    from capplan.cli import main

    out = tmp_path / "d.yaml"
    assert main(["design", str(small_study), "--slo", SLO, "--budget-minutes", "5",
                 "--sims", "1", "--reps", "30", "--out", str(out)]) == 0
    assert load_design(out)["budget_minutes"] == 5.0
    assert main(["design", str(small_study), "--slo", SLO, "--budget-minutes", "0",
                 "--out", str(out)]) == 2


def test_a_round_stops_adding_runs_only_where_the_bound_is_honest(tmp_path):
    """``enough_gap_rel`` (the load test's tolerance) ends the greedy search once the expected
    sweep meets the stop rule — but only where the bound is honest already. Where the trial fit
    reads it unsupported, the proposal is the same as without it: the honesty package is the
    smallest set whose median outcome is honest, and stopping there left real AIPerf sweeps
    unsupported round after round. The rule itself: honest, and (estimate − lower bound) /
    estimate ≤ the tolerance."""
    from capplan.design import model_config
    from capplan.honesty import within_tolerance
    from capplan.sim.sweep import generate_study as sweep_study

    model = load_system(FIX / "synth_small_sweep.yaml")
    cfg = model_config(model, rates=(1.5, 2.0, 2.3, 2.5, 2.7, 3.0), duration_s=300.0,
                       warmup_s=0.0, repeats=1, seed=1)
    sweep_study(cfg, tmp_path / "s", workers=1)
    env = fit_envelope(tmp_path / "s", SLO, reps=100, seed=0)
    free = propose(env, budget_minutes=60, sims=2, reps=60, seed=0)
    d = propose(env, budget_minutes=60, sims=2, reps=60, seed=0, enough_gap_rel=0.5)
    assert free.trial_now["honesty"] != "honest"  # the trial fit reads it unsupported
    assert [(r.rate_rps, r.repeats) for r in d.runs] == [(r.rate_rps, r.repeats) for r in free.runs]
    assert d.runs and not any(n.startswith("stopped adding runs") for n in d.notes)
    assert env.honesty.honest
    gap = (env.cslo.estimate - env.cslo.lower_bound) / env.cslo.estimate
    c = env.cslo
    assert within_tolerance(env.honesty.status, c.estimate, c.lower_bound, gap + 1e-9)
    assert not within_tolerance(env.honesty.status, c.estimate, c.lower_bound, gap - 1e-9)


def test_an_unsupported_wide_bracket_is_spread_with_single_runs_first(small_study):
    """Where an unsupported estimate is interpolated across a bracket wider than the honesty rule
    allows, the design proposes single runs ≤ 10 % apart across it, nearest the estimate first
    (a fine grid's levels, only where the crossing is), and nothing else: the fit after them
    decides whether repeats are needed."""
    from capplan.design import _spread
    from capplan.honesty import MAX_BRACKET_REL

    env = fit_envelope(small_study, SLO, reps=100, seed=0)  # one run at 1, 2, 3, 4 req/s
    c = env.cslo
    x = env.levels["x"].tolist()
    lo = max(v for v in x if v <= c.estimate)
    hi = min(v for v in x if v > c.estimate)
    assert hi - lo > MAX_BRACKET_REL * c.estimate
    runs, _ = _spread(env, 300.0, 0.0)
    rates = [r.rate_rps for r in runs]
    nominal = env.levels["load_level"].tolist()
    nlo, nhi = nominal[x.index(lo)], nominal[x.index(hi)]
    # runs too short to realise their rate within 10 % are spaced more than 1.1 × their own
    # precision (1/√(λT)) apart, or they would merge into one level; the runs and the note say so
    short, spacing = _spread(env, 15.0, 0.0)
    noise = 1 / (nlo * 15.0) ** 0.5
    assert short and spacing.endswith(f"% apart (a 15-s run realises its rate ± {100 * noise:.0f} "
                                      "%: closer levels would be one)")
    assert {r.why for r in short} == {f"across the bracket, {spacing}: runs on both sides of "
                                      "the crossing"}
    steps = sorted([nlo, nhi, *(r.rate_rps for r in short)])
    assert all(b / a - 1 > 1.1 * noise - 0.01 for a, b in zip(steps, steps[1:]))
    assert all(nlo < r < nhi for r in rates) and len(rates) >= 2
    assert [abs(r - c.estimate) for r in rates] == sorted(abs(r - c.estimate) for r in rates)
    ladder = sorted([nlo, nhi, *rates])
    assert all(b / a - 1 <= MAX_BRACKET_REL + 0.01 for a, b in zip(ladder, ladder[1:]))
    assert {(r.repeats, r.duration_s) for r in runs} == {(1, 300.0)}
    # a bound of 0 (replicates fail at the lowest rate) needs runs below the range: no spread
    from dataclasses import replace
    assert _spread(replace(env, cslo=replace(c, lower_bound=0.0)), 300.0, 0.0) == ([], "")
    assert env.honesty.status == "unsupported"
    d = propose(env, budget_minutes=60, sims=2, reps=60, seed=0)
    assert list(d.runs) == runs, d.to_text()
    assert any("single run(s) across it first" in n for n in d.notes), d.notes
    assert d.expected["lower_bound"] == d.expected["lower_bound"]  # the trial fits' median
    short = propose(env, budget_minutes=5, sims=2, reps=60, seed=0)  # kept whole, said
    assert list(short.runs) == runs and any("kept whole" in n for n in short.notes)
