"""Notebook 08-timelines executed with papermill on a small simulated study whose runs lose a
replica, with a twin fitted to a small sweep of the same system: clean run, the page's numbers are
capplan.timeline's, the figures and exports are there."""

from __future__ import annotations

from pathlib import Path

import re
import pytest

from capplan import report as R
from capplan.sim.config import parse_config
from capplan.sim.control import ControlSpec, FailureEvent
from capplan.sim.sweep import generate_study
from capplan.timeline import analyse_timeline
from capplan.twin import fit_twin, write_twin

from conftest import fixed_service_raw

PLOTLY = "application/vnd.plotly.v1+json"
SLO = {"ttft_ms": 5000.0, "attainment": 0.99}


def _raw():
    return fixed_service_raw(3, timeout_s=120.0, rates=(14.0,), duration_s=420.0, warmup_s=30.0)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    d = tmp_path_factory.mktemp("nb07")
    cfg = parse_config(_raw()).with_(control=ControlSpec(
        initial=3, failures=(FailureEvent(at_s=200, count=1, ready_s=60, detect_s=5),)))
    study, _ = generate_study(cfg, d / "study", workers=1)
    # the twin the plan's checks are simulated on: fitted to a small sweep of the same system
    raw = _raw()
    raw["system"]["replicas"] = 1
    raw["sweep"] = {"load_model": "open", "rates": [1.0, 3.0, 5.0], "duration_s": 90.0, "warmup_s": 10.0}
    sweep, _ = generate_study(parse_config(raw), d / "sweep", workers=1)
    system = d / "twin.yaml"
    write_twin(fit_twin(sweep, reps=30), system)
    params = {"study_path": str(study), "slo": SLO, "window_s": 5.0, "twin_path": str(system),
              "capacity_rps": 6.0, "artifacts_dir": str(d / "data"), "seed": 0}
    nb = R.execute_notebook(Path("notebooks/08-timelines.ipynb"), params, cwd=d)
    return nb, study, d / "data"


def _outputs(nb):
    for c in nb.cells:
        yield from c.get("outputs", [])


def test_notebook_runs_clean_and_shows_capplans_numbers(executed):
    nb, study, data = executed
    assert not [o for o in _outputs(nb) if o.get("output_type") == "error"]
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    tl = analyse_timeline(study, SLO, window_s=5.0)
    text = "\n".join(o.get("data", {}).get("text/markdown", "") for o in _outputs(nb))
    assert tl.to_text() in text  # the same text `capplan timeline` prints
    inc = tl.incidents.iloc[0]
    assert inc["kind"] == "failure" and f"good requests lost against the pre-event rate: {inc['good_lost']:,.0f}" in text
    assert re.search(r"the plan's checks simulated at the (\d{4})?Q1 peak", text) and "losing" in text
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in _outputs(nb))
    assert "SLO-minutes broken" in html and "good requests lost" in html  # headers for people
    figs = [o["data"][PLOTLY] for o in _outputs(nb) if PLOTLY in o.get("data", {})]
    assert len(figs) >= 2
    names = {t.get("name") for f in figs for t in f["data"]}
    assert {"offered", "attainment", "replica failed"} <= names


def test_notebook_writes_the_exports(executed):
    _, _, data = executed
    got = sorted(p.name for p in (data / "timeline").iterdir())
    assert {"windows.csv", "incidents.csv", "events.csv", "summary.csv", "timeline.txt",
            "plan-simulated.csv"} <= set(got)
    assert any(n.startswith("timeline-") and n.endswith(".html") for n in got)


def test_the_report_adds_the_page_for_a_study_with_a_timeline(executed):
    _, study, _ = executed
    params, _ = R.resolve_params(study)
    assert R.TIMELINE_NOTEBOOK in params.notebooks()
    demo, _ = R.resolve_params(None)
    assert R.TIMELINE_NOTEBOOK not in demo.notebooks()


@pytest.mark.browser
def test_the_report_page_draws_offline(executed, tmp_path):
    from test_report import _assert_draws_offline

    nb, _, _ = executed
    page = tmp_path / "08-timelines.html"
    page.write_text(R.notebook_to_html(nb, "Timelines — test"), encoding="utf-8")
    _assert_draws_offline([page])


def test_a_report_with_a_twin_gets_the_page_with_the_twin(executed):
    _, study, _ = executed
    twin = study.parent / "twin.yaml"
    params, _ = R.resolve_params(None, twin=twin)
    assert R.TIMELINE_NOTEBOOK in params.notebooks()  # the demo has no timeline, the twin adds it
    p = params.parameters_for(R.TIMELINE_NOTEBOOK[0], study.parent / "data")
    assert p["twin_path"] == str(twin.resolve())
