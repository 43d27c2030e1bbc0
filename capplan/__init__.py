"""capplan: SLO capacity envelopes with honest confidence intervals, and plans, for LLM serving.

The front door: the verbs a planner uses, each reachable as ``capplan.<name>`` (imported on
first use, so ``import capplan`` stays fast). ``dir(capplan)`` lists exactly these names.

Measured side — a load sweep on disk (a study directory) and what it shows
    open a study        open_study(path) → Study;  open_checked(path): with every row check
    validate a study    validate_path(path) → (problems, Study or None);  validate_study(Study)
    summarize           summarize(study, slo) → per-run funnel, rates, latency, attainment
    fit_envelope        fit_envelope(study, slo, reps=1000) → Envelope: C_SLO, its interval, lower bound;
                        reduce_study(study, slo): the one reduction it reads, to share between fits;
                        fit_envelope_with_twin(study, slo, "twin.yaml"): the run-to-run variation
                        near the crossing at least the twin's (``capplan envelope --twin``)
    compare_studies     compare_studies(baseline, candidate, slo) → Comparison: gates, verdict
    mix                 fit_mix(study, slo, load_target(trace)) → C_SLO at production's mix
    timeline            analyse_timeline(study, slo) → Timeline: what each failure, rollout or
                        scale decision did to the SLO, window by window
    kv                  kv_budget(model, gpu, gpus, context_tokens=8192) → KVBudget of a replica

Simulated side — a twin fitted to the sweep; its output is just a study
    fit_twin            fit_twin(study) → Twin;  write_twin(twin, "twin.yaml"), load_twin(path)
    check the twin      check_twin(twin, study, slo) → TwinCheck: replays against the measured runs
    simulate            run_scenario(twin, scenario, out) → (study path, per-run stats, context);
                        the scenario a mapping, a Scenario or scenario.yaml (docs/twin.md)
    steady C_SLO        steady_cslo(twin, slo) → the twin's steady-state C_SLO with its interval

Plan — from capacity and demand to groups, GPUs, nodes and cost
    plan                make_plan(load_plan_spec(path), study=study, envelope=env) → Plan;
                        prepare_plan(spec, study=study): the slow parts once, then make_plan(spec, **pre)
    plan, simulated     simulate_plan(plan, twin) → the plan's failure, rollout and cold-start
                        checks run on the twin at the planned size
    design              propose(env, budget_minutes=60) → Design: the next runs of the sweep

Presentation — files and pages for people
    report              render_report(study, spec=...) → the offline HTML report and exports
    export              export_plan(plan, "plan-out/") → plan.xlsx + CSVs for finance
    what-if             WhatIfModel, WhatIfPanel: sliders that redraw the plan live
    bundled files       demo_study_path(), baseline_study_path(), default_spec_path()

Types: SLO (``SLO.parse("ttft_ms=2000,tpot_ms=100,attainment=0.99")``), Study, Envelope, Plan,
PlanSpec, Twin, Scenario, Timeline, Comparison, Status, CONTRACT_VERSION; errors CapplanError,
SpecError, StudyError.

A zone lost on the twin, end to end::

    import capplan
    demo = capplan.demo_study_path()
    env = capplan.fit_envelope(capplan.open_study(demo), "ttft_ms=2000,tpot_ms=100,attainment=0.99")
    twin = capplan.fit_twin(demo)
    zone = {"system": {"replicas": 3}, "workload": {"rate_rps": 8}, "run": {"duration_s": 600},
            "failure": {"at_s": 300, "lose": "zone", "zones": 3}}
    path, _, _ = capplan.run_scenario(twin, zone, "zone-loss")
    print(capplan.analyse_timeline(path, "ttft_ms=2000,tpot_ms=100,attainment=0.99").to_text())

Every result prints itself (``to_text()``), tabulates (``to_frame()``) and draws
(``figure()``). A front-door name is never also a submodule's name: ``capplan.compare``,
``capplan.timeline``, ``capplan.mix``, ``capplan.kv``, ``capplan.design`` and ``capplan.report``
are the modules (``from capplan.compare import compare`` still works); their verbs are the
names above. Deeper parts are imported from their modules (``capplan.twin``, ``capplan.mix``,
``capplan.sim``, …). Docs: docs/architecture.md (the map of modules), docs/report.md,
docs/plan.md, docs/envelope.md, docs/twin.md, docs/timeline.md, docs/glossary.md.
"""

from __future__ import annotations

from .version import __version__
from .errors import CapplanError, SpecError, StudyError

#: name → (module, attribute), imported on first use (module ``__getattr__``, PEP 562); the
#: study (DuckDB) too, so that ``capplan telemetry record`` runs on a GPU node without DuckDB,
#: and the contract and SLO (pyarrow, numpy), so that ``capplan --help`` imports neither.
#: A name here is never a submodule's name (the module would replace it once imported).
_LAZY = {
    # measured side
    "open_study": ("capplan.study", "open_study"),
    "open_checked": ("capplan.validate", "open_checked"),
    "validate_path": ("capplan.validate", "validate_path"),
    "validate_study": ("capplan.validate", "validate_study"),
    "summarize": ("capplan.metrics", "summarize"),
    "reduce_study": ("capplan.reduce", "reduce_study"),
    "fit_envelope": ("capplan.envelope", "fit_envelope"),
    "fit_envelope_with_twin": ("capplan.design", "fit_envelope_with_twin"),
    "compare_studies": ("capplan.compare", "compare"),
    "fit_mix": ("capplan.mix.reweight", "fit_mix"),
    "load_target": ("capplan.mix.target", "load_target"),
    "analyse_timeline": ("capplan.timeline", "analyse_timeline"),
    "kv_budget": ("capplan.kv", "kv_budget"),
    # simulated side
    "fit_twin": ("capplan.twin.fit", "fit_twin"),
    "load_twin": ("capplan.twin.twinfile", "load_twin"),
    "write_twin": ("capplan.twin.twinfile", "write_twin"),
    "check_twin": ("capplan.twin.check", "check_twin"),
    "run_scenario": ("capplan.twin.scenario", "run_scenario"),
    "steady_cslo": ("capplan.twin.capacity", "steady_cslo"),
    # plan
    "load_plan_spec": ("capplan.plan", "load_plan_spec"),
    "make_plan": ("capplan.plan", "make_plan"),
    "prepare_plan": ("capplan.plan", "prepare_plan"),
    "simulate_plan": ("capplan.plan.dynamics", "simulate_plan"),
    "propose": ("capplan.design", "propose"),
    # presentation
    "render_report": ("capplan.report", "render_report"),
    "export_plan": ("capplan.export", "export_plan"),
    "WhatIfModel": ("capplan.whatif", "WhatIfModel"),
    "WhatIfPanel": ("capplan.whatif", "WhatIfPanel"),
    "demo_study_path": ("capplan.resources", "demo_study_path"),
    "baseline_study_path": ("capplan.resources", "baseline_study_path"),
    "default_spec_path": ("capplan.resources", "default_spec_path"),
    # types
    "SLO": ("capplan.slo", "SLO"),
    "Study": ("capplan.study", "Study"),
    "Envelope": ("capplan.envelope", "Envelope"),
    "Plan": ("capplan.plan", "Plan"),
    "PlanSpec": ("capplan.plan", "PlanSpec"),
    "Twin": ("capplan.twin.model", "Twin"),
    "Scenario": ("capplan.twin.scenario", "Scenario"),
    "Timeline": ("capplan.timeline.result", "Timeline"),
    "Comparison": ("capplan.compare.result", "Comparison"),
    "Status": ("capplan.contract", "Status"),
    "CONTRACT_VERSION": ("capplan.contract", "CONTRACT_VERSION"),
}

__all__ = ["CapplanError", "SpecError", "StudyError", "__version__", *_LAZY]


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'capplan' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value  # next access is a plain attribute
    return value


def __dir__() -> list[str]:
    """The front door only: submodules imported along the way stay attributes (``capplan.twin``
    works once imported) but are not listed."""
    return sorted(__all__)
