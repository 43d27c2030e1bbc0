"""The report's production-mix page (notebooks/07-mix.ipynb) on the demo study, checked against
the library's own numbers (docs/mix.md)."""

from __future__ import annotations

import re

import nbformat
import pytest

from capplan import report as R
from test_report import REPS, compare_report, demo_report, small_sweeps  # noqa: F401  (shared session fixtures)


def _text(nb) -> str:
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            d = o.get("data", {})
            out.append(d.get("text/markdown", "") + d.get("text/html", "")[:100_000] + o.get("text", ""))
    return "\n".join(out)


def test_mix_page_matches_the_library(demo_report):  # noqa: F811
    import capplan
    from capplan.mix import load_target
    from capplan.mix.reweight import fit_mix
    from capplan.plan import load_plan_spec

    nb = nbformat.read(str(demo_report / "notebooks" / "07-mix.ipynb"), as_version=4)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    p = nb.metadata["papermill"]["parameters"]
    spec = load_plan_spec(R.default_spec_path())
    m = fit_mix(capplan.open_study(R.demo_study_path()), p["slo"], load_target(spec.mix.target),
                reps=p["reps"], seed=p["seed"], confidence=p["confidence"])
    text = _text(nb)
    hit = re.search(r"\*\*Target mix \(bucket table\)\*\*: C_SLO ([0-9.]+) req/s, lower bound ([0-9.]+) "
                    r"\((honest|unsupported|optimistic)\) \(tested mix ([0-9.]+)", text)
    assert hit, "mix headline missing"
    est, lb, verdict, tested = hit.groups()
    assert [float(x) for x in (est, lb, tested)] == [float(f"{v:.4g}") for v in
                                                     (m.cslo.estimate, m.cslo.lower_bound, m.base.cslo.estimate)]
    assert verdict == m.envelope.honesty.status  # the target mix's bound has its own verdict
    # the reweighted demo mix gives less than the tested mix: the page says which number the
    # plan (plan_on: tested) stands on and what the target mix's would cost, as the index does
    if m.cslo.lower_bound < m.base.cslo.lower_bound:
        index = (demo_report / "index.html").read_text(encoding="utf-8")
        answer = index[index.index('<section id="answer">'):]
        assert 'id="production-mix"' in answer
        assert answer.index('id="production-mix"') < answer.index('id="answer-text"')
        assert "This plan is sized on the tested mix" in answer
        assert "**The plan** (`mix.plan_on: tested`): Production's mix gives a lower capacity" in text
    assert "No SLO classes" in text  # the template spec has none
    assert "KV cache per token" in text and "peak IT power of the plan" in text
    exports = {x.name for x in (demo_report / "data" / "mix").iterdir()}
    assert {"mix.json", "mix_day.json", "mix_day_cells.csv", "bounds.csv"} <= exports


def test_mix_page_states_a_refusal_instead_of_failing(compare_report):  # noqa: F811
    # the template's demo mix has a ≥ 4096-token bucket the small sweeps barely test: the page
    # says why it was not fitted, and the report still renders
    d = compare_report["dir"]
    assert compare_report["rc"] == 0, compare_report["err"]
    nb = nbformat.read(str(d / "notebooks" / "07-mix.ipynb"), as_version=4)
    text = _text(nb)
    assert "The target mix was not fitted" in text and "input ≥4096" in text
