"""One mark for a missing value (capplan.present.MISSING, "—"): the kit's formatters against hand
cases, and a walk over the result classes (frozen dataclasses with ``to_text``, found by
importing capplan's modules) checking that a missing value never prints as "n/a", "nan", "NaN",
"None", "<NA>" or "NaT".

Covered from the demo study (data/sample), with missing values put in where the demo has none:
RunSummary (rates, attainment, goodput and meets-SLO blanked), Timeline (no system events: the
replicas are unknown), Honesty, MixFit (a target cell the sweep never tested, dropped), Plan,
Sensitivity, KVBudget, TargetMix, Envelope (its interval blanked), Bound, ScenarioTable (the
serving-policy sweeps' one result, from rows written by hand). NOT_COVERED names every other result class
and why (each needs a twin fit, a second study or a simulation); a new result class fails
``test_every_result_class_is_covered_or_named`` until it is put in one list or the other.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import pkgutil
import re

import numpy as np
import pandas as pd
import pytest

import capplan
from capplan import present as P

SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
BAD = re.compile(r"(?<![\w.])(nan|NaN|None|n/a|<NA>|NaT)(?!\w)")


# ----------------------------------------------------------------------------- the kit


def test_missing_values_are_recognised():
    for v in (None, math.nan, np.nan, np.float32("nan"), pd.NA, pd.NaT, np.datetime64("NaT")):
        assert P.is_missing(v), repr(v)
    for v in (0, 0.0, -1.5, math.inf, "", "nan", False, np.int64(3), pd.Timestamp("2026-01-01")):
        assert not P.is_missing(v), repr(v)


def test_formatters_by_hand():
    assert P.MISSING == "—"
    assert [P.fmt_num(v) for v in (1234.5678, 0.000123456, 3, None, math.nan, pd.NA)] == \
        ["1235", "0.0001235", "3", "—", "—", "—"]
    assert P.fmt_num(2.71828, 3) == "2.72" and P.fmt_num(math.inf) == "inf"
    assert P.fmt_pct(0.98765, 2) == "98.77 %" and P.fmt_pct(0.5) == "50.0 %" and P.fmt_pct(None) == "—"
    assert P.fmt(12345.6, ",.0f") == "12,346" and P.fmt(np.nan, ",.0f") == "—"


def test_json_writer_nan_to_null(tmp_path):
    doc = {"a": math.nan, "b": math.inf, "c": np.int64(3), "d": (1.5, np.float64("nan")),
           "e": {"f": pd.NA, "g": np.bool_(True)}, "h": "—", "i": -math.inf}
    text = P.json_text(doc, tmp_path / "x.json")
    assert text.endswith("}\n") and (tmp_path / "x.json").read_text(encoding="utf-8") == text
    assert json.loads(text) == {"a": None, "b": "inf", "c": 3, "d": [1.5, None], "e": {"f": None, "g": True},
                                "h": "—", "i": "-inf"}
    assert "NaN" not in text and '"—"' in text  # UTF-8, not \u2014
    df = pd.DataFrame({"x": [1.0, np.nan], "y": ["a", None]})
    assert P.records(df) == [{"x": 1.0, "y": "a"}, {"x": None, "y": None}]


# ----------------------------------------------------------------------------- the result classes


def result_classes() -> dict[str, type]:
    """Every frozen dataclass with a ``to_text`` defined in capplan (by class name)."""
    found: dict[str, type] = {}
    for m in pkgutil.walk_packages(capplan.__path__, "capplan."):
        if m.name.startswith(("capplan.commands", "capplan.cli", "capplan.__main__", "capplan.sparkstudy",
                              "capplan.reduce.spark")):
            continue
        try:
            mod = importlib.import_module(m.name)
        except ImportError:  # an optional dependency (pyspark, pynvml) that is not installed
            continue
        for name, c in vars(mod).items():
            if (isinstance(c, type) and c.__module__ == m.name and dataclasses.is_dataclass(c)
                    and c.__dataclass_params__.frozen and callable(getattr(c, "to_text", None))):
                found[name] = c
    return found


#: result classes this test does not build, and why
NOT_COVERED = {
    "CacheEffect": "needs a study with computed_input_tokens (the demo has none)",
    "Comparison": "needs a second study and a comparison (tests/test_compare.py)",
    "Verdict": "part of a Comparison",
    "Design": "needs simulated candidate outcomes (tests/test_design.py)",
    "FanOutCapacity": "needs a fan-out study (tests/test_fanout.py)",
    "BackTest": "needs a demand history (tests/test_forecast_backtest.py)",
    "ToolCommands": "load-tool command lines: no numbers that can be missing",
    "ToolPlan": "load-tool command lines: no numbers that can be missing",
    "ClassFit": "needs a study with SLO classes (tests/test_mix_classes.py)",
    "TwinMix": "needs a twin fit and simulations (tests/test_mix_twin.py)",
    "CapacityContract": "built inside a plan with a study (tests/test_plan_contract.py)",
    "BudgetSearch": "needs twin simulations (tests/test_plan_dynamics.py)",
    "PlanDynamics": "needs twin simulations (tests/test_plan_dynamics.py)",
    "TwinCheck": "needs a twin fit and replays (tests/test_twin_check.py)",
    "Twin": "needs a twin fit (tests/test_twin_fit.py)",
    "LoadtestResult": "needs a load-test loop (tests/test_loadtest.py); its rounds print through Bound",
    "ProbeResult": "the probe's counts and times: no value that can be missing",
}


@pytest.fixture(scope="module")
def demo():
    return capplan.open_study(capplan.demo_study_path())


@pytest.fixture(scope="module")
def envelope(demo):
    return capplan.fit_envelope(demo, SLO, reps=20)


def _run_summary(demo, envelope):
    from capplan.metrics import summarize

    rs = summarize(demo, SLO)
    return dataclasses.replace(rs, table=rs.table.assign(achieved_rps=np.nan, attainment_offered=np.nan,
                                                         goodput_rps=np.nan, meets_slo=None)), True


def _timeline(demo, envelope):
    from capplan.timeline import analyse_timeline

    return analyse_timeline(demo, SLO, window_s=10), True  # no system events: replicas unknown


def _envelope(demo, envelope):
    c = envelope.cslo
    return dataclasses.replace(envelope, cslo=dataclasses.replace(c, ci_low=math.nan, ci_high=math.nan)), True


def _honesty(demo, envelope):
    return envelope.honesty, False


def _mixfit(demo, envelope):
    from capplan.mix import target_from_table
    from capplan.mix.reweight import fit_mix

    # a third of the traffic in prompts of ≥ 100 k tokens, which the sweep never sent
    tg = target_from_table({"input_min": [0, 1024, 100_000], "input_max": [1024, 100_000, 1e9],
                            "share": [0.4, 0.3, 0.3]})
    return fit_mix(demo, SLO, tg, reps=20, drop_untested=True), False


def _target(demo, envelope):
    from capplan.mix import target_from_table

    return target_from_table({"input_min": [0, 1024], "input_max": [1024, 1e9], "share": [0.5, 0.5]}), False


def _plan(demo, envelope):
    return capplan.make_plan(capplan.load_plan_spec(capplan.default_spec_path()), capacity=3.0), False


def _sensitivity(demo, envelope):
    from capplan.plan.sensitivity import sensitivity

    return sensitivity(_plan(demo, envelope)[0]), False


def _kv(demo, envelope):
    from capplan.kv import kv_budget

    return kv_budget("llama-3.1-70b", "h100-80gb", 4, context_tokens=8192), False


def _bound(demo, envelope):
    from capplan.loadtest import Bound

    nan = float("nan")
    return Bound(nan, nan, nan, nan, "unsupported"), True  # a round whose fit gave no crossing


def _scenario_table(demo, envelope):
    from capplan.slo import SLO as SLOCls
    from capplan.twin import ScenarioTable
    from capplan.twin.fairsim import POLICIES_LAYOUT

    # the policy comparison's layout (rows and a tenant detail) with a policy nobody was offered under
    nan = float("nan")
    rows = pd.DataFrame([{"policy": "FIFO", "goodput_rps": nan, "attainment": nan, "rejected_share": nan,
                          "timeout_share": nan, "jain_index": 1.0, "fair_share_deviation": 0.0}])
    detail = pd.DataFrame([{"policy": "FIFO", "tenant": "acme", "offered": 0, "good": 0, "attainment": nan,
                            "ttft_p99_ms": nan, "service_share": 1.0, "fair_share": 1.0}])
    return ScenarioTable("policies", SLOCls.parse(SLO), rows, POLICIES_LAYOUT, detail=detail, rate_rps=2.0), True


def _steady(demo, envelope):
    from capplan.sim.evaluate import Steady

    return Steady(6.0, "ttft_ms=2000", 40.0, 5.0, 3, 0, (0, 0), (0, 0)), True  # no in-window request: no attainment


#: class name → builder(demo, envelope) → (instance, whether it holds a missing value)
COVERED = {
    "Steady": _steady,
    "Bound": _bound,
    "RunSummary": _run_summary,
    "Timeline": _timeline,
    "Envelope": _envelope,
    "Honesty": _honesty,
    "MixFit": _mixfit,
    "TargetMix": _target,
    "Plan": _plan,
    "Sensitivity": _sensitivity,
    "KVBudget": _kv,
    "ScenarioTable": _scenario_table,
}

#: covered classes whose text still prints a missing value its own way (files of other changes)
KNOWN_GAPS: dict[str, str] = {}  # result class → why it still prints a missing value wrongly


def test_every_result_class_is_covered_or_named():
    found = set(result_classes())
    assert len(found) >= 20, sorted(found)
    assert not set(COVERED) & set(NOT_COVERED)
    new = sorted(found - set(COVERED) - set(NOT_COVERED))
    gone = sorted((set(COVERED) | set(NOT_COVERED)) - found)
    assert not new, f"result classes neither covered nor named in NOT_COVERED: {new}"
    assert not gone, f"named here but no longer a frozen result class with to_text: {gone}"


@pytest.mark.parametrize("name", sorted(COVERED))
def test_a_missing_value_prints_as_the_mark(name, demo, envelope, request):
    if name in KNOWN_GAPS:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_GAPS[name], strict=True))
    obj, has_missing = COVERED[name](demo, envelope)
    assert type(obj).__name__ == name
    text = obj.to_text()
    bad = [ln.strip() for ln in text.splitlines() if BAD.search(ln)]
    assert not bad, f"{name}.to_text() prints a missing value as n/a / nan / None:\n" + "\n".join(bad[:5])
    if has_missing:
        assert P.MISSING in text, f"{name}.to_text() holds a missing value but shows no {P.MISSING!r}"
