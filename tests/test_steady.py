"""The one evaluator of the simulated side (capplan.sim.evaluate): counts at a rate on a case
decided by hand, the same counts as the SQL predicate over a written study of the same runs
(ttft_from and ITL included), the seed map, and the one bisection on a known crossing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capplan.errors import SpecError
from capplan.metrics import Window, good_predicate, request_view
from capplan.slo import SLO
from capplan.study import open_study
from capplan.sim.config import PRESETS, parse_config
from capplan.sim.evaluate import TRUTH_SEED_OFFSET, bisect_crossing, bracket_crossing, steady
from capplan.sim.sweep import RunPlan, generate_study


def _alone() -> "SynthConfig":  # noqa: F821
    """One replica, a request every 2 s (constant arrivals), 100-token prompts, 11-token
    answers: each request is served alone, so its times follow from the service model."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS["small"].items()}
    raw["workload"] = {"arrival": {"process": "constant"}, "lengths": {"kind": "fixed", "input": 100, "output": 11}}
    raw.pop("power")
    return parse_config(raw)


def test_counts_decided_by_hand():
    cfg = _alone()
    sm = cfg.replica.service
    step = float(sm.step_ms(1))  # one sequence decoding alone: every later token one step apart
    ttft = step + sm.prefill_ms_per_token * 100 + sm.prefill_overhead_ms  # its first, mixed iteration
    assert 29 < step < 30 and 39.9 < ttft < 40  # the limits below sit on either side
    # 0.5 req/s for 20 s: requests at 0, 2, …, 18 s; a 5-s warm-up leaves 6, 8, …, 18 s: 7 of 10
    kw = dict(rate_rps=0.5, runs=3, duration_s=20.0, warmup_s=5.0)
    for slo, good in (("ttft_ms=40", 7), ("ttft_ms=39.9", 0), ("tpot_ms=30", 7), ("tpot_ms=29", 0),
                      ("itl_ms=30,itl_stat=max", 7), ("itl_ms=29", 0), ("ttft_ms=40,ttft_from=sent", 7),
                      ("e2e_ms=340", 7), ("e2e_ms=330", 0)):  # E2E = TTFT + 10 steps ≈ 334 ms
        st = steady(cfg, None, slo, **kw)
        assert st.n == (7, 7, 7) and st.good == (good,) * 3, slo
        assert st.attainment == good / 7 and st.n_requests == 21 and st.n_good == 3 * good
    # the warm-up boundary is inclusive (scheduled at or after it), as in the study's window
    assert steady(cfg, None, "ttft_ms=40", rate_rps=0.5, duration_s=20.0, warmup_s=6.0).n == (7,)
    st = steady(cfg, None, "ttft_ms=40", rate_rps=0.5, duration_s=20.0, warmup_s=5.0, input_edges=(50, 100, 200),
                outcomes=True)
    assert st.cell_n == ((0, 0, 7, 0),) and st.cell_good == ((0, 0, 7, 0),)  # 100 tokens: two edges ≤ it
    o, res = st.outcomes[0]
    assert (o.first - o.sched)[0] == pytest.approx(ttft * 1e6, abs=1e3)  # ns, rounded to the µs
    with pytest.raises(SpecError, match="warm-up"):
        steady(cfg, None, "ttft_ms=40", rate_rps=0.5, duration_s=5.0, warmup_s=5.0)


SLOS = ["ttft_ms=2000,tpot_ms=100", "ttft_ms=1200,ttft_from=sent", "ttft_ms=1500,itl_ms=150",
        "tpot_ms=80,itl_ms=200,itl_stat=max,e2e_ms=20000"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Three runs at 7 req/s on the evaluator's streams, written as an ordinary study."""
    cfg = parse_config(PRESETS["small"]).with_(rates=(7.0,), repeats=3, duration_s=60.0, warmup_s=10.0, itl=True,
                                               power=None)
    plans = tuple(RunPlan(TRUTH_SEED_OFFSET + i, f"t{i}", 7.0, i, 60.0) for i in range(3))
    path, _ = generate_study(cfg, tmp_path_factory.mktemp("steady") / "s", workers=1, plans=plans)
    return cfg, open_study(path)


@pytest.mark.parametrize("slo_text", SLOS)
def test_counts_equal_the_sql_predicate_over_a_written_study(written, slo_text):
    cfg, study = written
    slo = SLO.parse(slo_text)
    view = request_view(study, Window.of(study))
    pred, params = good_predicate(slo)
    rows = study.sql(f"SELECT run_id, count(*), count(*) FILTER (WHERE {pred}) FROM {view} WHERE in_window "
                     "GROUP BY run_id ORDER BY run_id", params).fetchall()
    st = steady(cfg, None, slo, rate_rps=7.0, runs=3, duration_s=60.0, warmup_s=10.0)
    assert [(r[1], r[2]) for r in rows] == list(zip(st.n, st.good))
    assert 0 < st.n_good < st.n_requests  # a case where the rule decides something


def test_seed_map_is_per_run_and_rate_free():
    cfg = parse_config(PRESETS["small"])
    kw = dict(duration_s=40.0, warmup_s=5.0)
    three = steady(cfg, None, "ttft_ms=2000", rate_rps=6.0, runs=3, **kw)
    one = steady(cfg, None, "ttft_ms=2000", rate_rps=6.0, first_run=2, **kw)
    assert one.n[0] == three.n[2] and one.good[0] == three.good[2]
    assert steady(cfg, None, "ttft_ms=2000", rate_rps=6.0, runs=3, **kw).good == three.good
    other = steady(cfg, None, "ttft_ms=2000", rate_rps=6.0, runs=3, seed=cfg.seed + 1, **kw)
    assert other.n != three.n  # another workload seed, other arrivals
    # common random numbers: the same run at a higher rate has more, never fewer, arrivals
    assert all(a > b for a, b in zip(steady(cfg, None, "ttft_ms=2000", rate_rps=9.0, runs=3, **kw).n, three.n))


def test_bisection_finds_a_known_crossing():
    seen = []

    def passes(x):
        seen.append(x)
        return x <= math.pi

    lo, hi = bisect_crossing(passes, 1.0, 10.0, tol_rps=0.01)
    assert lo <= math.pi < hi and hi - lo <= 0.01
    assert len(seen) == math.ceil(math.log2(9.0 / 0.01))  # one halving per evaluation
    lo, hi = bisect_crossing(lambda x: x <= math.pi, 1.0, 10.0, rel_tol=1e-3)
    assert lo <= math.pi < hi and (hi - lo) / hi <= 1e-3
    with pytest.raises(ValueError):
        bisect_crossing(passes, 1.0, 10.0)


@pytest.mark.parametrize("start", [0.05, 3.0, 200.0])
def test_bracket_search_from_either_side(start):
    est, note = bracket_crossing(lambda x: 1 - 1 / (1 + math.exp(-(x - 2.5))) >= 0.9, start, rel_tol=1e-4)
    truth = 2.5 - math.log(9)  # where the logistic tail falls to 0.9
    assert note == "" and est == pytest.approx(truth, rel=1e-4)


def test_bracket_search_says_when_there_is_no_crossing():
    assert bracket_crossing(lambda x: False, 1.0, rel_tol=0.01)[0] == 0.0
    # a crossing more than 1000× below the guess is not searched for
    assert "misses the SLO even at" in bracket_crossing(lambda x: x <= 0.3, 500.0, rel_tol=0.01)[1]
    est, note = bracket_crossing(lambda x: True, 1.0, rel_tol=0.01)
    assert est == math.inf and "meets the SLO even at" in note


def test_a_twin_and_its_scenario_go_through_the_same_evaluator():
    """A scenario is anything whose apply(system) gives a context with the changed config."""
    cfg = _alone()

    class Faster:
        def apply(self, system):
            from types import SimpleNamespace

            return SimpleNamespace(config=system.with_(replicas=2))

    base = steady(cfg, None, "ttft_ms=40", rate_rps=0.5, duration_s=20.0, warmup_s=5.0)
    two = steady(cfg, Faster(), "ttft_ms=40", rate_rps=0.5, duration_s=20.0, warmup_s=5.0)
    assert base.n == two.n == (7,) and two.good == (7,)
    assert np.isfinite(two.attainment)


def test_run_study_is_the_protocol_written_as_a_study(tmp_path):
    """The study evaluator: ``system`` on the protocol given, written by ``generate_study`` as
    an ordinary study (the same runs as the config built by hand); a config alone is
    simulated as configured."""
    from capplan.reduce import reduce_study
    from capplan.sim import run_study
    from capplan.sim.evaluate import system_config

    cfg = parse_config(PRESETS["small"])
    kw = dict(rates=(3.0,), duration_s=60.0, warmup_s=10.0, repeats=2, seed=5)
    path, stats = run_study(cfg, None, tmp_path / "a", **kw)
    hand, hand_stats = generate_study(system_config(cfg, **kw), tmp_path / "b", workers=1)
    a, b = reduce_study(path, "ttft_ms=2000"), reduce_study(hand, "ttft_ms=2000")
    assert [(r.n, r.n_good) for r in a.runs] == [(r.n, r.n_good) for r in b.runs]
    assert len(a.runs) == 2 and stats == hand_stats
    as_is, _ = run_study(system_config(cfg, **kw), None, tmp_path / "c")
    assert [(r.n, r.n_good) for r in reduce_study(as_is, "ttft_ms=2000").runs] == \
        [(r.n, r.n_good) for r in a.runs]
    with pytest.raises(SpecError, match="output folder"):
        run_study(cfg, None, None, **kw)
