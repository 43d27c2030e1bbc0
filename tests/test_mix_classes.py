"""SLO classes: per-class attainment and the joint C_SLO against hand computation
(docs/mix.md, "SLO classes")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capplan.cli import main
from capplan.errors import SpecError
from capplan.mix.classes import class_counts, fit_classes

from conftest import ev


def _logit(p):
    return math.log(p / (1 - p))


def _crossing(x0, x1, a0, a1, t):
    return x0 + (_logit(a0) - _logit(t)) / (_logit(a0) - _logit(a1)) * (x1 - x0)


# good requests out of 100 per class and run, at 1, 2, 3 req/s
INTERACTIVE = (98, 92, 80)   # TTFT ≤ 500 ms
BATCH = (99, 97, 90)         # E2E ≤ 5 s


def _study(make_study, with_default=False):
    rows, runs = [], []
    for j, rate in enumerate((1.0, 2.0, 3.0)):
        rid = f"r{j + 1}"
        runs.append({"run_id": rid, "offered_rps": rate, "warmup_s": 0.0})
        n = 200 + (20 if with_default else 0)
        # spread the failures: every k-th request of its class
        bad_i = {2 * (k * 100 // max(1, 100 - INTERACTIVE[j])) for k in range(100 - INTERACTIVE[j])}
        bad_b = {2 * (k * 100 // max(1, 100 - BATCH[j])) + 1 for k in range(100 - BATCH[j])}
        for i in range(n):
            t = i * 1000.0 / rate  # evenly spaced: the measured rate is the offered rate
            if i >= 200:
                rows.append(ev(rid, scheduled_ms=t, ttft_ms=100.0, e2e_ms=1000.0))  # no class
            elif i % 2 == 0:
                rows.append(ev(rid, scheduled_ms=t, ttft_ms=900.0 if i in bad_i else 100.0, e2e_ms=1000.0,
                               slo_class="interactive"))
            else:
                rows.append(ev(rid, scheduled_ms=t, ttft_ms=3000.0, e2e_ms=9000.0 if i in bad_b else 4000.0,
                               slo_class="batch"))
    return make_study(rows, runs=runs)


SLOS = {"classes": {"interactive": {"ttft_ms": 500, "attainment": 0.9},
                    "batch": {"e2e_ms": 5000, "attainment": 0.8}}}


def test_per_class_attainment_by_hand(make_study):
    path = _study(make_study)
    df = class_counts(path, SLOS).set_index(["run_id", "slo_class"])
    for j in range(3):
        assert df.loc[(f"r{j + 1}", "interactive"), "good"] == INTERACTIVE[j]
        assert df.loc[(f"r{j + 1}", "batch"), "good"] == BATCH[j]
        assert df.loc[(f"r{j + 1}", "batch"), "requests"] == 100
    # batch requests all have TTFT 3 s: under one SLO they would all fail; under their own they do not
    assert df.loc[("r3", "batch"), "attainment"] == pytest.approx(0.90)
    assert not df.loc[("r3", "interactive"), "meets"] and df.loc[("r3", "batch"), "meets"]


def test_batch_passes_and_interactive_binds(make_study):
    path = _study(make_study)
    # the raw (typical-run) crossings by hand; the default method's mean-run estimand below
    fit = fit_classes(path, SLOS, reps=200, seed=1, method="within-run")
    # interactive crosses 0.9 between 2 (0.92) and 3 req/s (0.80), on the logit scale
    want = _crossing(2.0, 3.0, 0.92, 0.80, 0.9)
    assert fit.envelopes["interactive"].cslo.estimate == pytest.approx(want, rel=1e-6)
    assert fit.envelopes["batch"].cslo.status == "≥ max tested"
    assert fit.binding_class == "interactive"
    assert fit.cslo.estimate == pytest.approx(want, rel=1e-6)
    assert fit.cslo.status == "bracketed"
    assert "class interactive binds" in fit.notes[0]
    pr = fit.per_run().set_index(["run_id", "slo_class"])
    assert pr.loc[("r2", "interactive"), "attainment"] == pytest.approx(0.92)
    assert pr.loc[("r2", "batch"), "attainment"] == pytest.approx(0.97)
    # one joint bootstrap: the joint replicate is the smaller of the classes' replicates
    ri = fit.envelopes["interactive"].crossing_replicates
    rb = fit.envelopes["batch"].crossing_replicates
    assert np.allclose(fit.joint.replicates, np.minimum(ri, rb))
    assert fit.cslo.lower_bound <= fit.cslo.estimate <= fit.cslo.ci_high
    # the default (run-effect) method: the mean run sits below the typical run near the
    # crossing, so the estimate is at most the raw crossing; the same class binds
    fit_re = fit_classes(path, SLOS, reps=200, seed=1)
    assert fit_re.binding_class == "interactive"
    assert fit_re.cslo.estimate <= want + 1e-9
    assert fit_re.cslo.lower_bound <= fit_re.cslo.estimate <= fit_re.cslo.ci_high


def test_a_tighter_batch_target_binds_instead(make_study):
    path = _study(make_study)
    slos = {"classes": {"interactive": {"ttft_ms": 500, "attainment": 0.9},
                        "batch": {"e2e_ms": 5000, "attainment": 0.98}}}
    fit = fit_classes(path, slos, reps=200, seed=1, method="within-run")
    assert fit.binding_class == "batch"
    assert fit.cslo.estimate == pytest.approx(_crossing(1.0, 2.0, 0.99, 0.97, 0.98), rel=1e-6)


def test_the_same_draws_serve_every_class(make_study):
    # two classes with the same SLO and the same outcomes: identical replicates
    path = _study(make_study)
    same = {"classes": {"interactive": {"e2e_ms": 5000, "attainment": 0.8},
                        "batch": {"e2e_ms": 5000, "attainment": 0.8}}}
    fit = fit_classes(path, same, reps=100, seed=3)
    a = fit.envelopes["interactive"].runs.set_index("run_id")
    assert (a["attainment"] == 1.0).all()  # interactive requests all end within 1 s
    ri = fit.envelopes["interactive"]
    # the per-run resamples are the same objects' draws: block lengths agree across classes
    assert list(ri.runs["block_len"]) == list(fit.envelopes["batch"].runs["block_len"])


def test_default_class_and_missing_default(make_study):
    path = _study(make_study, with_default=True)
    with pytest.raises(SpecError, match="have no SLO and the SLO file has no default"):
        fit_classes(path, SLOS, reps=50)
    slos = dict(SLOS, default={"ttft_ms": 500, "attainment": 0.99})
    df = class_counts(path, slos)
    d = df[df["slo_class"] == "default"]
    assert list(d["requests"]) == [20, 20, 20] and (d["attainment"] == 1.0).all()


def test_envelope_command_with_an_slo_file(make_study, tmp_path, capsys):
    path = _study(make_study)
    f = tmp_path / "slo.yaml"
    f.write_text("classes:\n  interactive: {ttft_ms: 500, attainment: 0.9}\n"
                 "  batch: {e2e_ms: 5000, attainment: 0.8}\n")
    out = tmp_path / "c.json"
    assert main(["envelope", str(path), "--slo-file", str(f), "--reps", "100", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "binding class: interactive" in text and "batch" in text
    assert out.is_file()
    assert main(["envelope", str(path), "--reps", "100"]) == 2
    assert "--slo-file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes:\n  interactive: {ttft_ms: -5}\n")
    assert main(["envelope", str(path), "--slo-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "classes.interactive.ttft_ms" in err and "line 2" in err


def test_retarget_refits_from_the_cached_draws(make_study):
    path = _study(make_study)
    fit = fit_classes(path, SLOS, reps=200, seed=1)
    tight = fit.retarget({"batch": 0.98})
    # the same as fitting the tighter SLO file from scratch (same seed, same draws)
    fresh = fit_classes(path, {"classes": {"interactive": {"ttft_ms": 500, "attainment": 0.9},
                                           "batch": {"e2e_ms": 5000, "attainment": 0.98}}}, reps=200, seed=1)
    assert tight.binding_class == fresh.binding_class == "batch"
    assert tight.cslo.estimate == pytest.approx(fresh.cslo.estimate)
    assert tight.cslo.lower_bound == pytest.approx(fresh.cslo.lower_bound)
    with pytest.raises(SpecError, match="unknown SLO class"):
        fit.retarget({"gold": 0.9})


def test_summarize_with_an_slo_file(make_study, tmp_path, capsys):
    path = _study(make_study)
    f = tmp_path / "slo.yaml"
    f.write_text("classes:\n  interactive: {ttft_ms: 500, attainment: 0.9}\n"
                 "  batch: {e2e_ms: 5000, attainment: 0.8}\n")
    assert main(["summarize", str(path), "--slo-file", str(f), "--no-check"]) == 0
    out = capsys.readouterr().out
    assert "attainment per SLO class" in out
    lines = [ln.split() for ln in out.splitlines() if ln.strip().startswith("r3")]
    rows = {ln[2]: ln for ln in lines if len(ln) > 5 and ln[2] in ("interactive", "batch")}
    assert rows["interactive"][4] == "80" and rows["batch"][4] == "90"  # good requests in r3


def test_joint_honesty_is_the_worst_of_the_classes_that_bind(make_study):
    """docs/mix.md, "SLO classes" step 5: the joint bound is honest only when every class that
    binds in some replicate is; a class that never binds does not matter."""
    from dataclasses import replace

    from capplan import honesty as hon

    fit = fit_classes(_study(make_study), SLOS, reps=200, seed=0)
    # one run per rate: each class's own (run-effect) envelope is unsupported, so is the joint
    assert {fit.envelopes[c].method for c in fit.names} == {"run-effect"}
    assert fit.honesty.status == "unsupported"
    assert any(r.startswith("class interactive (unsupported): ") for r in fit.honesty.reasons)
    assert fit.to_dict()["honesty"]["status"] == "unsupported"
    share = fit.joint.binding_share
    assert share["interactive"] > 0 and share.get("batch", 0.0) == 0.0  # batch never fails
    ok = hon.Honesty(hon.HONEST, "e", "fine")
    bad = hon.Honesty(hon.OPTIMISTIC, "e", "too high", ("why",))
    envs = {c: replace(e, honesty=ok) for c, e in fit.envelopes.items()}
    assert replace(fit, envelopes=envs).honesty.status == "honest"
    # the class that never binds may be anything …
    assert replace(fit, envelopes={**envs, "batch": replace(envs["batch"], honesty=bad)}).honesty.honest
    # … one that binds in some replicate decides
    j = replace(fit, envelopes={**envs, "interactive": replace(envs["interactive"], honesty=bad)}).honesty
    assert j.status == "optimistic" and j.reasons == ("class interactive (optimistic): why",)
