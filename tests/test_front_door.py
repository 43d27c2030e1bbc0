"""The front door (capplan/__init__.py): help(capplan) shows the map of verbs, every name in it
resolves, dir(capplan) lists no module, no front-door name is also a submodule's name (the
``capplan.compare`` clash), and a newcomer writes the demo's envelope, plan, twin fit and a
zone-failure timeline in at most 15 lines using only front-door names."""

from __future__ import annotations

import ast
import pkgutil
import pydoc
import subprocess
import sys
import types

import pytest

import capplan

GROUPS = ("Measured side", "Simulated side", "Plan —", "Presentation")
VERBS = ("open a study", "validate a study", "summarize", "fit_envelope", "compare_studies", "mix",
         "timeline", "kv", "fit_twin", "simulate", "plan", "design", "report")


def test_help_shows_the_map():
    text = pydoc.render_doc(capplan, renderer=pydoc.plaintext)
    for heading in GROUPS:
        assert heading in text, heading
    lines = [ln.strip() for ln in capplan.__doc__.splitlines()]
    for verb in VERBS:  # each verb opens a line of the map
        assert any(ln.startswith(verb + " ") for ln in lines), verb
    # every callable of the front door is named in the map
    for name in capplan.__all__:
        if not name.startswith("__") and name not in ("CapplanError", "SpecError", "StudyError"):
            assert name in capplan.__doc__, f"{name} is in __all__ but not in the docstring map"


@pytest.mark.parametrize("name", [n for n in capplan.__all__ if n != "__version__"])
def test_every_front_door_name_resolves(name):
    value = getattr(capplan, name)
    assert not isinstance(value, types.ModuleType), name
    assert name in dir(capplan)


def test_no_front_door_name_is_a_submodule():
    """A submodule imported later would replace the name (after ``from capplan.compare import
    compare``, ``capplan.compare`` was the module); so verbs are never submodule names."""
    subs = {m.name for m in pkgutil.iter_modules(capplan.__path__)}
    assert "compare" in subs and "timeline" in subs
    assert not subs & set(capplan.__all__), subs & set(capplan.__all__)


def test_dir_lists_no_module_after_submodules_are_imported():
    import capplan.compare  # noqa: F401
    import capplan.metrics  # noqa: F401
    import capplan.twin  # noqa: F401
    from capplan.compare import compare  # the import that used to take the name

    names = dir(capplan)
    assert sorted(names) == sorted(capplan.__all__)
    assert not [n for n in names if isinstance(getattr(capplan, n), types.ModuleType)]
    # the clash: the verb is compare_studies, whatever was imported first
    assert callable(capplan.compare_studies) and capplan.compare_studies is compare
    assert isinstance(capplan.compare, types.ModuleType) and capplan.compare.compare is compare


def test_compare_studies_first_then_the_module():
    """In a fresh interpreter: the verb first, then the module import, then both still right."""
    code = ("import types, capplan; f = capplan.compare_studies; import capplan.compare; "
            "from capplan.compare import compare; "
            "print(f is compare, capplan.compare_studies is compare, "
            "isinstance(capplan.compare, types.ModuleType))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True", "True"]


#: what a newcomer writes: the demo's envelope, plan, twin fit and a timeline of losing a zone
#: on the twin, front-door names only (``out`` is the folder it writes to)
NEWCOMER = '''
import capplan
demo, slo = capplan.demo_study_path(), "ttft_ms=2000,tpot_ms=100,attainment=0.99"
study = capplan.open_study(demo)
env = capplan.fit_envelope(study, slo, reps=50)
env.to_json(out / "envelope.json")
plan = capplan.make_plan(capplan.load_plan_spec(capplan.default_spec_path()), study=study, envelope=env)
capplan.export_plan(plan, out / "plan")
twin = capplan.fit_twin(demo, reps=20)
capplan.write_twin(twin, out / "twin.yaml")
zone = {"name": "lose-a-zone", "slo": slo, "system": {"replicas": 3}, "workload": {"rate_rps": 8},
        "run": {"duration_s": 240, "warmup_s": 20, "seed": 1},
        "failure": {"at_s": 120, "lose": "zone", "zones": 3, "detect_s": 5, "route_removal_s": 2}}
path, _, _ = capplan.run_scenario(twin, zone, out / "zone-loss", workers=1)
timeline = capplan.analyse_timeline(path, window_s=5)
timeline.write(out / "timeline")
'''


def test_newcomer_snippet_uses_only_the_front_door():
    lines = [ln for ln in NEWCOMER.splitlines() if ln.strip()]
    assert len(lines) <= 15, len(lines)
    used = {n.attr for n in ast.walk(ast.parse(NEWCOMER))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "capplan"}
    assert used <= set(capplan.__all__), used - set(capplan.__all__)
    imports = [n for n in ast.walk(ast.parse(NEWCOMER)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [a.name for n in imports for a in n.names] == ["capplan"]


def test_newcomer_writes_envelope_plan_twin_and_zone_failure_timeline(tmp_path):
    ns = {"out": tmp_path}
    exec(compile(NEWCOMER, "newcomer", "exec"), ns)  # noqa: S102
    assert (tmp_path / "envelope.json").is_file()
    assert (tmp_path / "plan" / "plan.xlsx").is_file()
    assert "capplan-twin/" in (tmp_path / "twin.yaml").read_text()
    text = (tmp_path / "timeline" / "timeline.txt").read_text()
    tl = ns["timeline"]
    assert isinstance(tl, capplan.Timeline)
    assert "Incident 1 at 120.0 s — failure" in text and "replica failed" in text
    inc = tl.incidents_frame()
    assert len(inc) >= 1 and (tmp_path / "timeline" / "incidents.csv").is_file()
    # one zone of three replicas is one replica: the zone that failed is named in the events
    assert "fault injected [a]" in text
