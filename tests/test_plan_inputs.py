"""One inputs resolver (capplan.plan.inputs): a given value wins, else the spec's, else capplan's
built-in default, and each resolved value says which of the three it is; ``capplan plan``,
``capplan report``, the notebooks and the mix page resolve through it."""

from __future__ import annotations

import pytest
import yaml

from capplan.errors import SpecError
from capplan.plan import load_plan_spec
from capplan.plan.inputs import BUILTIN_SLO, resolve_inputs
from capplan.slo import SLO

#: a spec that sets the SLO and capacity.reps, and leaves seed and confidence to capplan
SPEC = {"slo": "ttft_ms=1500,tpot_ms=80,attainment=0.95",
        "demand": {"peak_rps": 10.0}, "prices": {"usd_per_gpu_hour": 2.0},
        "capacity": {"reps": 500}, "replica_group": {"tp": 2, "pp": 2, "gpus_per_node": 8},
        "mix": {"target": "prod.parquet", "plan_on": "tested"}}


def _spec(tmp_path, **changes):
    doc = {**SPEC, **changes}
    doc = {k: v for k, v in doc.items() if v is not None}
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return p


def test_spec_values_win_over_builtin_defaults_and_the_defaults_are_named(tmp_path):
    inp = resolve_inputs(_spec(tmp_path))
    assert inp.slo == SLO.parse("ttft_ms=1500,tpot_ms=80,attainment=0.95") and inp.source("slo") == "spec"
    assert (inp.reps, inp.source("reps")) == (500, "spec")  # the spec's 500, not the built-in 1000
    assert (inp.seed, inp.source("seed")) == (0, "default")
    assert (inp.confidence, inp.source("confidence")) == (0.95, "default")
    assert (inp.gpus_per_replica, inp.source("gpus_per_replica")) == (4, "spec")  # tp 2 × pp 2
    assert inp.target == str(tmp_path / "prod.parquet") and inp.source("target") == "spec"  # beside the spec
    assert (inp.twin, inp.source("twin")) == (None, "default")
    assert set(inp.defaults) == {"seed", "confidence", "use", "accept_optimistic", "slo_classes", "twin"}
    assert inp.notes == ()  # nothing a reader must be told: the spec gave the SLO
    # the spec make_plan takes carries them
    assert inp.spec.slo == inp.slo and inp.spec.capacity.reps == 500 and inp.spec.capacity.seed == 0


def test_given_values_win_and_what_a_given_slo_drops_is_said(tmp_path):
    inp = resolve_inputs(_spec(tmp_path), slo="ttft_ms=1000,attainment=0.9", reps=200, seed=7,
                         confidence=0.9, use="estimate", gpus_per_replica=4, twin="t.yaml")
    assert inp.slo == SLO.parse("ttft_ms=1000,attainment=0.9")
    assert (inp.reps, inp.seed, inp.confidence, inp.use) == (200, 7, 0.9, "estimate")
    assert all(inp.source(n) == "given" for n in ("slo", "reps", "seed", "confidence", "use",
                                                   "gpus_per_replica", "twin"))
    c = inp.spec.capacity
    assert (c.reps, c.seed, c.confidence, c.use) == (200, 7, 0.9, "estimate")
    assert inp.spec.slo == inp.slo and inp.spec.group.gpus == 4 and inp.twin == "t.yaml"
    # the given SLO replaces the spec's whole: its TPOT limit is not used, and that is said
    assert len(inp.notes) == 1 and "tpot_ms=80 is not used" in inp.notes[0]
    assert inp.parameters() == {"slo": str(inp.slo), "reps": 200, "seed": 7, "confidence": 0.9,
                                "use": "estimate", "accept_optimistic": False}


def test_a_spec_without_an_slo_gets_the_builtin_one_said_out_loud(tmp_path):
    inp = resolve_inputs(_spec(tmp_path, slo=None))
    assert inp.slo == SLO.parse(BUILTIN_SLO) and inp.source("slo") == "default"
    assert "slo" in inp.defaults and inp.spec.slo == inp.slo
    assert len(inp.notes) == 1 and "capplan's default SLO is used" in inp.notes[0]
    # capplan plan asks for no built-in SLO: the SLO stays unset (make_plan then refuses)
    bare = resolve_inputs(_spec(tmp_path, slo=None), builtin_slo=False)
    assert bare.slo is None and bare.spec.slo is None and bare.notes == ()


def test_bad_given_values_are_refused_in_the_options_words(tmp_path):
    p = _spec(tmp_path)
    with pytest.raises(SpecError, match="--reps must be ≥ 10, got 5"):
        resolve_inputs(p, reps=5)
    with pytest.raises(SpecError, match="^reps must be ≥ 10"):  # a notebook's parameter
        resolve_inputs(p, reps=5, option_prefix="")
    with pytest.raises(SpecError, match="--seed must be ≥ 0"):
        resolve_inputs(p, seed=-1)
    with pytest.raises(SpecError, match="--confidence must be between 0.5 and 1"):
        resolve_inputs(p, confidence=1.5)
    with pytest.raises(SpecError) as e:  # within (0.5, 1) but above what a spec takes
        resolve_inputs(p, confidence=0.9995)
    assert e.value.field == "capacity.confidence" and e.value.file == str(p)


def test_with_records_the_keys_it_sets(tmp_path):
    spec = load_plan_spec(_spec(tmp_path))
    assert resolve_inputs(spec).source("seed") == "default"
    changed = spec.with_(confidence=0.9)
    inp = resolve_inputs(changed)
    assert (inp.confidence, inp.source("confidence")) == (0.9, "spec")
    assert spec == changed.with_(confidence=0.95)  # the record of keys takes no part in equality


def test_the_notebooks_and_the_report_resolve_alike(tmp_path):
    """A notebook's "not set" parameters (empty, 0, negative) mean the spec's; the report's
    resolve_params and notebook.resolve agree, and a built-in SLO is said by both."""
    from capplan import notebook
    from capplan import report as R
    from capplan.resources import demo_study_path

    p = _spec(tmp_path, slo=None, replica_group=None)
    nb = notebook.resolve(None, p, {}, seed=-1, reps=0, confidence=0.0)
    assert (nb.reps, nb.seed, nb.confidence) == (500, 0, 0.95)
    assert nb.slo == SLO.parse(BUILTIN_SLO) and nb.spec.slo == nb.slo
    assert "capplan's default SLO is used" in nb.header()
    params, _ = R.resolve_params(demo_study_path(), p)
    assert (params.reps, params.seed, params.confidence) == (500, 0, 0.95)
    assert SLO.parse(params.slo) == nb.slo
    assert any("capplan's default SLO is used" in n for n in params.notes)
    given = notebook.resolve(None, p, {"ttft_ms": 900.0, "attainment": 0.9}, seed=3, reps=50, confidence=0.8)
    assert (given.reps, given.seed, given.confidence) == (50, 3, 0.8)
    assert given.resolved.source("reps") == "given" and given.spec.capacity.reps == 50
