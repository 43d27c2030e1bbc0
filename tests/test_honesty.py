"""Issue 12: an honest planning number — small sweeps, non-stationary runs near capacity, the
honesty status and the plan's refusal to call an unsupported number a lower bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capplan import bootstrap as boot
from capplan.envelope import fit_envelope, fit_from_stats
from capplan.errors import SpecError
from capplan.reduce import reduce_study, stats_from_series
from capplan.sim import generate_study, load_config

FIX = Path(__file__).parent / "fixtures"
SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
#: true C_SLO of the small-sweep protocol (fixture header; benchmarks/coverage_synth.py)
TRUTH_SMALL = 2.589
#: steady-state C_SLO of the AIPerf-shaped system (fixture header)
TRUTH_AIPERF = 10.0


@pytest.fixture(scope="module")
def small_sweeps(tmp_path_factory):
    cfg = load_config(FIX / "synth_small_sweep.yaml")
    out = []
    for seed in range(5):
        p, _ = generate_study(cfg.with_(seed=seed), tmp_path_factory.mktemp(f"s{seed}") / "s",
                              workers=1)
        out.append(reduce_study(p, SLO))
    return out


def test_small_sweep_bound_is_below_the_truth_and_useful(small_sweeps):
    """The case of issue 12: one replica, 300-s runs, one run per rate, light-load runs with no
    violations beside overloaded ones. Before, the light-load runs borrowed an overloaded
    run's design effect, the interval excluded its own estimate and the bound was 0."""
    old_excluded = 0
    for i, st in enumerate(small_sweeps):
        env = fit_from_stats(st, SLO, reps=400, seed=i)
        c = env.cslo
        assert c.status == "bracketed"
        assert c.ci_low <= c.estimate <= c.ci_high and c.lower_bound <= c.estimate
        assert 0.75 * TRUTH_SMALL <= c.lower_bound <= TRUTH_SMALL
        # one informative run on each side of the crossing: the bound rests on the stated
        # prior for run-to-run variation, and the envelope says so with the runs to add
        assert env.honesty.status == "unsupported"
        # three runs at each bracketing rate in all: two more beside the one it has
        assert {r.repeats for r in env.honesty.runs_to_add if "repeat" in r.why} == {2}
        old = fit_from_stats(st, SLO, reps=400, seed=i, method="within-run").cslo
        old_excluded += not (old.ci_low <= old.estimate <= old.ci_high)
    assert old_excluded >= 1  # the reproduced bug


def test_interval_upper_end_is_bias_corrected_and_the_planning_side_is_not(small_sweeps):
    """The run-effect interval: lower end and lower bound are the replicate crossings'
    percentiles (the planning side, whose coverage was measured); the upper end is the
    bias-corrected end, since the replicates sit mostly below the estimate near a steep
    crossing and leave the percentile interval short above."""
    widened = 0
    for i, st in enumerate(small_sweeps):
        env = fit_from_stats(st, SLO, reps=400, seed=i)
        c, v = env.cslo, env.crossing_replicates
        lo, hi = boot.percentile_ci(v, c.confidence)
        bc_hi = boot.bias_corrected_ci(v, c.estimate, c.confidence)[1]
        assert c.ci_low == pytest.approx(min(lo, c.estimate))
        assert c.lower_bound == pytest.approx(min(boot.lower_bound(v, c.confidence), c.estimate))
        assert c.ci_high == pytest.approx(max(bc_hi, c.estimate))
        widened += bc_hi > hi + 1e-9
    assert widened >= 1  # these sweeps' replicates are skewed below their estimates


def test_zero_violation_runs_keep_what_their_own_data_justify(small_sweeps):
    """A run with no violation and no lower-load run with violations is taken as independent
    requests (stated prior): N_eff = n and its attainment interval is Clopper–Pearson at n."""
    env = fit_from_stats(small_sweeps[2], SLO, reps=400, seed=2)
    r = env.runs
    light = r[(r["n_good"] == r["n"]) & (r["x"] < 2.5)]
    assert len(light) >= 2
    for _, row in light.iterrows():
        assert row["design_effect_used"] == 1.0
        assert row["n_eff"] == row["n"]
        lo, hi = boot.clopper_pearson(row["n"], row["n"], 0.95)
        assert row["att_ci_low"] == pytest.approx(lo)
        assert "none below" in row["design_effect_source"]
    # the old rule lent the overloaded run's design effect
    old = fit_from_stats(small_sweeps[2], SLO, reps=400, seed=2, method="within-run").runs
    assert old.loc[light.index, "design_effect_used"].max() > 10


def test_zero_violation_run_borrows_only_from_below():
    """With a lower-load run that has violations, a clean run borrows its design effect."""
    rng = np.random.default_rng(0)
    runs = []
    for j, (lv, p) in enumerate(((1.0, 0.995), (2.0, 1.0), (3.0, 0.95), (4.0, 0.6))):
        g = (rng.random(4000) < p).astype(float)
        runs.append({"run_id": f"r{j}", "load_level": lv, "good": g})
    st = stats_from_series(runs, "ttft_ms=1000,attainment=0.99")
    env = fit_from_stats(st, st.slo, reps=200, seed=0)
    row = env.runs.set_index("run_id").loc["r1"]
    assert row["design_effect_source"] == "nearest run r0"


@pytest.fixture(scope="module")
def aiperf_stats(tmp_path_factory):
    cfg = load_config(FIX / "synth_aiperf_shape.yaml").with_(seed=2)
    p, _ = generate_study(cfg, tmp_path_factory.mktemp("aip") / "s", workers=1)
    return reduce_study(p, SLO, warmup="mser")  # no manifest warm-up, as an AIPerf import


def test_failing_nonstationary_run_counts_against_capacity(aiperf_stats):
    """Real-client shape (8 rates × 40 s, MSER-5 warm-up): the run failing the target near the
    crossing once had "no steady state" by MSER-5 and was dropped, leaving the old fit's bound
    at ≈ 11 req/s against a true 10.0. A failing run is never dropped now — kept as evidence
    when its warm-up never ended, used whole when MSER's late cut had no trend behind it —
    and the bound is ≤ 10.1 (or the tool refuses)."""
    env = fit_from_stats(aiperf_stats, SLO, reps=400, seed=0)
    fails = env.runs[env.runs["attainment"] < 0.99]
    assert len(fails) >= 1 and fails["usable"].all()
    c = env.cslo
    assert c.lower_bound <= TRUTH_AIPERF + 0.1 or env.honesty.status == "unsupported"
    assert c.lower_bound > 0


def test_passing_nonstationary_run_stays_excluded(aiperf_stats):
    env = fit_from_stats(aiperf_stats, SLO, reps=200, seed=0)
    r = env.runs
    mser = r[r["reason"].str.contains("MSER")]
    assert (~mser["usable"]).all()
    assert (mser["attainment"] >= 0.99).all()


def _unsupported_stats():
    """Two informative runs in all (a single run on each side of the crossing)."""
    rng = np.random.default_rng(1)
    runs = []
    for j, (lv, p) in enumerate(((1.0, 1.0), (2.0, 1.0), (4.0, 0.995), (8.0, 0.3))):
        g = (rng.random(3000) < p).astype(float)
        runs.append({"run_id": f"r{j}", "load_level": lv, "good": g})
    return stats_from_series(runs, "ttft_ms=1000,attainment=0.99")


def test_single_run_bracket_is_unsupported_with_runs_to_add():
    st = _unsupported_stats()
    env = fit_from_stats(st, st.slo, reps=200, seed=0)
    h = env.honesty
    assert h.status == "unsupported"
    rep = [r for r in h.runs_to_add if "repeat" in r.why]
    assert rep and all(r.repeats == 2 for r in rep)  # 1 run each: 2 more
    rates = {r.rate_rps for r in rep}
    assert rates <= set(env.levels["load_level"].round(9))
    assert "estimates" not in h.estimand and "mean attainment" in h.estimand
    d = env.to_dict()
    assert d["honesty"]["status"] == "unsupported"
    assert d["run_effect"]["source"] == "prior"
    assert fit_from_stats(st, st.slo, reps=200, method="within-run").honesty.status == \
        "optimistic"


def test_plan_refuses_an_unsupported_bound_unless_accepted():
    from capplan.plan import load_plan_spec, make_plan

    st = _unsupported_stats()
    env = fit_from_stats(st, st.slo, reps=200, seed=0)
    spec = load_plan_spec(Path(__file__).parents[1] / "templates" / "plan.yaml")
    with pytest.raises(SpecError) as exc:
        make_plan(spec, envelope=env, slo=st.slo)
    assert "not an honest lower bound" in str(exc.value)
    assert "accept-optimistic" in exc.value.fix
    plan = make_plan(spec.with_(accept_optimistic=True), envelope=env, slo=st.slo)
    assert "accept_optimistic" in plan.capacity.source
    assert any("planned with it anyway" in n for n in plan.notes)
    # the estimate is no lower-bound claim: allowed
    make_plan(spec.with_(capacity_use="estimate"), envelope=env, slo=st.slo)


def test_cli_plan_accept_optimistic(tmp_path, monkeypatch):
    """capplan plan on a sweep that cannot support its bound: exit 2 with the runs to add;
    --accept-optimistic plans and says so."""
    from capplan.cli import main

    cfg = load_config(FIX / "synth_small_sweep.yaml").with_(
        rates=(0.5, 1.0, 6.0), seed=1)  # nothing near the crossing
    p, _ = generate_study(cfg, tmp_path / "s", workers=1)
    spec = Path(__file__).parents[1] / "templates" / "plan.yaml"
    args = ["plan", str(p), "--spec", str(spec), "--slo", SLO, "--reps", "100"]
    assert main(args + ["--out", str(tmp_path / "p1")]) == 2
    assert not (tmp_path / "p1").exists()
    assert main(args + ["--out", str(tmp_path / "p2"), "--accept-optimistic"]) == 0
    assert (tmp_path / "p2" / "plan.xlsx").is_file()


def test_envelope_json_carries_honesty(tmp_path):
    p = Path(__file__).parents[1] / "data" / "sample"
    env = fit_envelope(p, SLO, reps=100)
    d = env.to_dict()
    assert d["honesty"]["status"] in ("honest", "unsupported", "optimistic")
    assert d["settings"]["method"] == "run-effect"
    assert "runs like these" in d["honesty"]["estimand"]


def test_twin_supplies_the_run_to_run_variation(small_sweeps):
    """With a model of the system (here its own synth configuration standing in for a twin),
    the run-to-run variation is simulated, not assumed. With one run per rate the bound stays
    unsupported (the crossing rests on single runs; docs/envelope.md "Coverage": with the true
    system as the twin, one replica with a KV limit still covered 0.63), and says why; with
    repeats near the crossing the twin's variation makes it honest. A twin whose last check
    disagreed is not used."""
    from dataclasses import replace

    from capplan.design import twin_run_effect

    st = small_sweeps[0]
    env = fit_from_stats(st, SLO, reps=200, seed=0)
    assert env.honesty.status == "unsupported"
    model = load_config(FIX / "synth_small_sweep.yaml")
    eff, note = twin_run_effect(env, model, runs=12, seed=1)
    assert eff is not None and eff.source == "twin" and eff.tau > 0
    tw = fit_from_stats(st, SLO, reps=200, seed=0, run_effect=eff)
    assert tw.run_effect.source == "twin"
    assert tw.honesty.status == "unsupported"
    assert any("from a twin" in r for r in tw.honesty.reasons)
    assert tw.honesty.runs_to_add and all("more than one run" in r.why
                                          for r in tw.honesty.runs_to_add
                                          if "bracket" not in r.why)
    assert tw.cslo.lower_bound <= TRUTH_SMALL
    assert tw.refit(attainment=0.98).run_effect.source == "twin"  # a refit keeps it

    class Disagreeing:
        warning = "twin check: attainment disagrees in 4 of 6 runs"

        def synth_config(self, **kw):  # pragma: no cover - never reached
            raise AssertionError

    eff2, note2 = twin_run_effect(env, Disagreeing())
    assert eff2 is None and "disagreed" in note2


def test_envelope_with_twin_is_one_library_call(tmp_path):
    """`capplan envelope --twin` is a thin shell: the library call gives the same JSON, byte for
    byte, so a notebook reproduces the command (issue 29)."""
    from capplan.cli import main
    from capplan.design import fit_envelope_with_twin

    cfg = FIX / "synth_small_sweep.yaml"
    path, _ = generate_study(load_config(cfg), tmp_path / "s", workers=1)
    assert main(["envelope", str(path), "--slo", SLO, "--twin", str(cfg), "--reps", "50",
                 "--out", str(tmp_path / "cli.json")]) == 0
    env = fit_envelope_with_twin(path, SLO, cfg, reps=50)
    assert env.run_effect.source == "twin" and any("from the twin" in n for n in env.notes)
    assert env.to_json() == (tmp_path / "cli.json").read_text(encoding="utf-8")


def test_a_twin_counts_with_repeats_near_the_crossing():
    """The rule behind the twin case above, on the assessment alone: a twin's (or a given)
    run-to-run variation makes the bound honest once a rate bracketing C_SLO has repeats, even
    when too few of them have both outcomes to measure it from the sweep; without repeats it
    does not."""
    import pandas as pd

    from capplan.honesty import assess

    runs = pd.DataFrame({"x": [5.0, 5.5, 5.5, 6.0], "usable": True, "warnings": "",
                         "warmup_s": 30.0, "load_level": [5.0, 5.5, 5.5, 6.0],
                         "duration_s": 600.0})
    common = dict(method="run-effect", status="bracketed", iid=False, estimate=5.6,
                  lower_bound=5.3, runs=runs, near_rates=(5.5, 6.0), n_near=1, target=0.99)
    assert assess(effect_source="twin", repeats_near=2, **common).status == "honest"
    assert assess(effect_source="sweep", repeats_near=2, **common).status == "unsupported"
    single = assess(effect_source="twin", repeats_near=1, **common)
    assert single.status == "unsupported" and "from a twin" in single.reasons[0]


def test_a_twin_cannot_narrow_the_sweeps_own_run_to_run_variation(small_sweeps):
    """A twin's τ holds the sweep's estimate at or above it, never replaces it: a twin that
    shows almost no run-to-run variation leaves the bound where the sweep alone puts it (a twin
    fitted to the sweep's own events was too optimistic on the simulator: docs/envelope.md
    "Coverage"), one that shows more lowers it; a refit keeps the twin's value."""
    from capplan.runeffect import RunEffect

    st = small_sweeps[0]
    own = fit_from_stats(st, SLO, reps=200, seed=0)
    calm = fit_from_stats(st, SLO, reps=200, seed=0, run_effect=RunEffect.fixed(0.01, "twin"))
    wild = fit_from_stats(st, SLO, reps=200, seed=0, run_effect=RunEffect.fixed(2.0, "twin"))
    assert calm.run_effect.source == "twin" and calm.run_effect.twin_tau == 0.01
    assert calm.run_effect.tau == own.run_effect.tau
    assert calm.cslo.lower_bound == pytest.approx(own.cslo.lower_bound, rel=0.02)
    assert wild.run_effect.tau == 2.0
    assert wild.cslo.lower_bound < own.cslo.lower_bound
    assert "held at or above the twin's 0.01" in calm.run_effect.sentence()
    assert calm.refit(attainment=0.98).run_effect.twin_tau == 0.01


def test_a_bound_of_zero_asks_for_a_run_below_the_lowest_usable_level():
    """The failing real GuideLLM loop: its lowest run (5 req/s) was excluded for a lagging
    client, the lowest usable level (7 req/s) meets the target narrowly, replicates fail there
    and the lower bound is 0. Repeats near the crossing cannot lift that; a run a fifth below
    the lowest *usable* level can, and the honesty rule names it."""
    import pandas as pd

    from capplan.honesty import assess

    runs = pd.DataFrame({"run_id": ["r5", "r7", "r9a", "r9b", "r9c", "r11"],
                         "x": [18.2, 7.3, 8.5, 8.8, 9.1, 9.5],
                         "load_level": [5.0, 7.0, 9.0, 9.0, 9.0, 11.0],
                         "usable": [False, True, True, True, True, True],
                         "warnings": [""] * 6, "warmup_s": [0.0] * 6,
                         "duration": [15.0] * 6})
    kw = dict(method="run-effect", status="bracketed", iid=False, estimate=9.0, runs=runs,
              near_rates=(9.0, 11.0), near_levels=(9.0, 11.0), n_near=4, effect_source="sweep",
              repeats_near=3, target=0.95, level_runs={9.0: 3, 11.0: 1})
    h = assess(lower_bound=0.0, **kw)
    assert h.status == "unsupported"
    assert any("lower bound is 0" in r for r in h.reasons)
    below = [a for a in h.runs_to_add if a.rate_rps < 7.0]
    assert [(a.rate_rps, a.repeats) for a in below] == [(5.6, 1)], h.to_text()
    assert "below the lowest usable rate (7 req/s)" in below[0].why
    # with a bound above 0 the rule asks for nothing below the range
    assert not any(a.rate_rps < 7.0 for a in assess(lower_bound=7.5, **kw).runs_to_add)
