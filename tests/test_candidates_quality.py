"""Quality before cost: a candidate is ranked only with a quality result not worse than the
baseline's by more than the margin, judged with both standard errors (docs/plan.md
"Candidates"); the study's ``quality:`` block and its errors."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from capplan.plan.candidates import Candidate, compare_candidates, quality_verdict
from capplan.cli import main
from capplan.contract import QualityResult
from capplan.errors import SpecError, StudyError
from capplan.plan import load_plan_spec
from capplan.study import parse_manifest
from conftest import ev

Z95 = 1.6448536269514722  # one-sided 95 % normal quantile


def spec():
    return load_plan_spec({"demand": {"peak_rps": 100.0, "mean_to_peak": 1.0}, "capacity": {"good_fraction": 0.99},
                           "replica_group": {"gpus_per_replica": 4, "gpus_per_node": 8},
                           "failure": {"policy": "none"}, "prices": {"usd_per_gpu_hour": 2.0, "billing": "gpu"}})


BASE = QualityResult(eval="mmlu-pro", score=0.700, se=0.002)


def pair(fp8_quality, **kw):
    """bf16 at 25 req/s per group (4 groups = 16 GPUs) against a cheaper fp8 build at 40 (3 groups = 12 GPUs)."""
    return compare_candidates([Candidate("bf16", spec(), capacity=25.0, quality=BASE),
                               Candidate("fp8", spec(), capacity=40.0, quality=fp8_quality)], **kw)


def test_no_quality_result_is_not_comparable_however_cheap():
    cmp = pair(None)
    df = cmp.to_frame().set_index("candidate")
    assert df.loc["fp8", "cost_usd_per_1k_good_requests"] < df.loc["bf16", "cost_usd_per_1k_good_requests"]
    assert not df.loc["fp8", "comparable"] and pd.isna(df.loc["fp8", "rank"])
    assert "no quality result" in df.loc["fp8", "quality_reason"]
    assert cmp.best == "bf16" and df.loc["bf16", "rank"] == 1 and cmp.baseline == "bf16"
    assert cmp.verdict.startswith("fp8 would cost less") and "not comparable: no quality result" in cmp.verdict
    # a baseline without a result leaves nothing to compare with
    no_base = compare_candidates([Candidate("bf16", spec(), capacity=25.0),
                                  Candidate("fp8", spec(), capacity=40.0, quality=BASE)])
    assert no_base.best == "bf16" and "has no quality result" in no_base.to_frame()["quality_reason"].iloc[1]


def test_within_the_margin_is_ranked():
    # Δ = 0.698 − 0.700 = −0.002; SE_Δ = √(0.002² + 0.002²) = 0.0028284; lower bound
    # −0.002 − 1.645 × 0.0028284 = −0.0066523 ≥ −m = −0.01 × 0.700 = −0.007 → ranked
    fp8 = QualityResult(eval="mmlu-pro", score=0.698, se=0.002)
    cmp = pair(fp8)
    df = cmp.to_frame().set_index("candidate")
    assert df.loc["fp8", "comparable"] and cmp.best == "fp8" and df.loc["fp8", "rank"] == 1
    assert df.loc["bf16", "rank"] == 2
    assert df.loc["fp8", "quality_delta"] == pytest.approx(-0.002)
    assert df.loc["fp8", "quality_delta_low"] == pytest.approx(-0.002 - Z95 * 0.002 * 2 ** 0.5)
    assert df.loc["fp8", "quality_delta_low"] == pytest.approx(-0.0066523, abs=1e-7)
    assert df.loc["fp8", "quality_margin"] == pytest.approx(0.007)
    assert "within the margin" in df.loc["fp8", "quality_reason"]
    # a stricter margin (0.5 % = 0.0035) refuses the same result as unproven
    strict = pair(fp8, quality_margin=0.005).to_frame().set_index("candidate")
    assert not strict.loc["fp8", "comparable"] and "not shown" in strict.loc["fp8", "quality_reason"]


def test_worse_beyond_the_margin_with_uncertainties_is_refused():
    # Δ = 0.680 − 0.700 = −0.020; upper bound −0.020 + 1.645 × 0.0028284 = −0.015348 < −0.007
    worse = pair(QualityResult(eval="mmlu-pro", score=0.680, se=0.002)).to_frame().set_index("candidate")
    assert not worse.loc["fp8", "comparable"] and "worse than the baseline bf16" in worse.loc["fp8", "quality_reason"]
    # Δ = −0.005 with SEs 0.004: bounds −0.005 ∓ 1.645 × 0.0056569 = [−0.0143, +0.0043] straddle −0.007
    base = QualityResult(eval="mmlu-pro", score=0.700, se=0.004)
    v = quality_verdict(QualityResult(eval="mmlu-pro", score=0.695, se=0.004), base)
    assert not v.comparable and "too uncertain" in v.reason
    assert (v.delta_low, v.delta_high) == pytest.approx((-0.005 - Z95 * 0.004 * 2 ** 0.5, -0.005 + Z95 * 0.004 * 2 ** 0.5))
    # lower is better (a perplexity): 7.9 against 8.0 is a gain, 8.5 a loss beyond 1 %
    ppl = QualityResult(eval="wikitext-ppl", score=8.0, se=0.02, higher_is_better=False)
    assert quality_verdict(QualityResult(eval="wikitext-ppl", score=7.9, se=0.02, higher_is_better=False), ppl).comparable
    assert not quality_verdict(QualityResult(eval="wikitext-ppl", score=8.5, se=0.02, higher_is_better=False),
                               ppl).comparable
    # another eval is not evidence
    other = quality_verdict(QualityResult(eval="gsm8k", score=0.9, se=0.001), BASE)
    assert not other.comparable and "not the same eval" in other.reason
    flipped = quality_verdict(QualityResult(eval="mmlu-pro", score=0.71, se=0.002, higher_is_better=False), BASE)
    assert not flipped.comparable and "disagree on whether higher is better" in flipped.reason


def test_same_build_needs_no_eval_and_the_baseline_can_be_named():
    cmp = compare_candidates([Candidate("TP2", spec(), capacity=12.0),
                              Candidate("TP4", spec(), capacity=25.0, same_outputs=True)])
    assert cmp.best == "TP4" and "same build" in cmp.to_frame()["quality_reason"].iloc[1]
    named = compare_candidates([Candidate("fp8", spec(), capacity=40.0),
                                Candidate("bf16", spec(), capacity=25.0, quality=BASE)], baseline="bf16")
    assert named.best == "bf16" and not named.to_frame().set_index("candidate").loc["fp8", "comparable"]
    with pytest.raises(SpecError, match="not a candidate"):
        compare_candidates([Candidate("a", spec(), capacity=1.0)], baseline="b")


MANIFEST = {"contract": "capplan-study/1", "name": "fp8", "system": {"gpu": "H100", "tp": 4, "model": "m"},
            "load_model": "open", "runs": [{"run_id": "r1", "offered_rps": 1.0}]}


def test_study_quality_block_is_read_and_used(tmp_path):
    m = dict(MANIFEST, quality={"eval": "mmlu-pro", "score": 0.698, "se": 0.002, "n": 12032,
                                "notes": "lm-eval-harness, 5-shot, same vLLM build"})
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(m))
    got = parse_manifest(tmp_path / "study.yaml").quality
    assert got == QualityResult(eval="mmlu-pro", score=0.698, se=0.002, higher_is_better=True, n=12032,
                                notes="lm-eval-harness, 5-shot, same vLLM build")
    cand = Candidate("fp8", spec(), capacity=40.0, study=SimpleNamespace(manifest=SimpleNamespace(quality=got)))
    assert cand.quality_result is got
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(MANIFEST))
    assert parse_manifest(tmp_path / "study.yaml").quality is None


@pytest.mark.parametrize("block, words", [
    ({"eval": "mmlu-pro", "score": "high", "se": 0.01}, "quality.score must be a number"),
    ({"eval": "mmlu-pro", "score": 0.7, "se": -0.01}, "quality.se"),
    ({"score": 0.7, "se": 0.01}, "quality is missing 'eval'"),
    ({"eval": "mmlu-pro", "score": 0.7}, "quality is missing 'se'"),
    ({"eval": "mmlu-pro", "score": 0.7, "se": 0.01, "stderr": 0.01}, "stderr"),
    ({"eval": "mmlu-pro", "score": 0.7, "se": 0.01, "higher_is_better": "yes"}, "quality.higher_is_better"),
    ({"eval": " ", "score": 0.7, "se": 0.01}, "quality.eval is empty"),
    ("mmlu 0.7", "quality must be a mapping"),
])
def test_malformed_quality_is_a_clear_error(tmp_path, block, words):
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(dict(MANIFEST, quality=block)))
    with pytest.raises(StudyError) as exc:
        parse_manifest(tmp_path / "study.yaml")
    text = exc.value.format()
    assert words in text and "study.yaml" in text
    assert len(exc.value.problems) == 1  # one problem, said once


def test_validate_names_the_quality_field(make_study, capsys):
    path = make_study([ev("r1", f"q{i}", scheduled_ms=i * 500) for i in range(5)],
                      quality={"eval": "mmlu-pro", "score": 0.7, "se": "small"})
    rc = main(["validate", str(path)])
    err = capsys.readouterr()
    text = err.out + err.err
    assert rc == 2 and "quality.se" in text and "Traceback" not in text
