"""The plan and explore pages show issue 30's answers, executed with papermill as `capplan
report` runs them: the capacity contract, the chargeback (rows summing to the plan's monthly
cost), production burstiness (with `demand.arrivals` given, and said plainly without it) and
the engine's pressure per run."""

from __future__ import annotations

import json
import re

import nbformat
import pytest
import yaml

from capplan import report as R
from capplan.resources import default_spec_path

pytestmark = pytest.mark.slow


def _text(nb) -> str:
    text = json.dumps(nbformat.v4.new_notebook(cells=nb.cells))
    assert '"output_type": "error"' not in text
    return text


def test_plan_page_shows_contract_chargeback_and_burstiness(tmp_path):
    raw = yaml.safe_load(default_spec_path().read_text(encoding="utf-8"))
    raw.setdefault("demand", {})["arrivals"] = {"dispersion": 4.0, "window_s": 1.0}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    nb = R.execute_notebook(R.notebooks_dir() / "03-plan.ipynb",
                            {"spec_path": str(tmp_path / "plan.yaml"), "reps": 50, "seed": 0}, cwd=tmp_path)
    text = _text(nb)
    assert "Capacity contract" in text and "overload" in text.lower()
    assert "Chargeback" in text and "Weight:" in text
    total = re.search(r"Total: \$([0-9,]+\.[0-9]{2}) per month", text)
    assert total, "the chargeback states its total"
    # production four times as dispersed as the Poisson sweep: burstier than anything tested,
    # said as such, with the factor it adds to the peak
    assert "production is burstier (D=4 at 1 s) than anything tested" in text
    assert re.search(r"burst factor of 1\.[0-9]+", text)


def test_plan_page_says_when_no_production_arrivals_or_fanout_are_given(tmp_path):
    nb = R.execute_notebook(R.notebooks_dir() / "03-plan.ipynb", {"reps": 50, "seed": 0}, cwd=tmp_path)
    text = _text(nb)
    assert "gives no production arrivals" in text
    assert "No fan-out: the study has no `agent_root` column" in text


def test_plan_page_shows_root_capacity_for_a_given_fanout(tmp_path):
    from capplan.fanout import fanout_capacity, given_fanout
    from capplan.resources import demo_study_path

    nb = R.execute_notebook(R.notebooks_dir() / "03-plan.ipynb", {"reps": 50, "seed": 0, "fanout": "4"},
                            cwd=tmp_path)
    text = _text(nb)
    want = fanout_capacity(demo_study_path(), "ttft_ms=2000,tpot_ms=100,attainment=0.99",
                           fanout=given_fanout(4), reps=50, seed=0)
    line = next(x for x in want.to_text().splitlines() if x.startswith("Root capacity:"))
    assert json.dumps(line)[1:-1] in text  # the page prints the library's root capacity


def test_explore_page_shows_engine_pressure(tmp_path):
    nb = R.execute_notebook(R.notebooks_dir() / "01-explore.ipynb", {}, cwd=tmp_path)
    text = _text(nb)
    assert "Engine pressure per run" in text and "not recorded" in text
