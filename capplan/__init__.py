"""capplan: SLO capacity envelopes with honest confidence intervals, and plans, for LLM serving.

The entry points, all reachable as ``capplan.<name>`` (the heavier ones are imported on first
use, so ``import capplan`` stays fast)::

    import capplan
    study = capplan.open_study(capplan.demo_study_path())      # or your study directory
    slo = capplan.SLO.parse("ttft_ms=2000,tpot_ms=100,attainment=0.99")
    capplan.summarize(study, slo)          # per-run funnel, rates, latency, attainment
    env = capplan.fit_envelope(study, slo, reps=200)           # C_SLO with its interval
    spec = capplan.load_plan_spec(capplan.default_spec_path())  # templates/plan.yaml
    plan = capplan.make_plan(spec, study=study, envelope=env)  # groups, GPUs, nodes, cost
    capplan.export_plan(plan, "plan-out/")                     # plan.xlsx + CSVs for finance

Also: ``validate_study``, ``reduce_study``, ``prepare_plan``, ``compare``, ``render_report``,
``WhatIfModel`` / ``WhatIfPanel`` (the what-if panel), ``baseline_study_path`` (a bundled
second study to try ``compare`` with). Every result prints itself (``to_text()``), tabulates
(``to_frame()``) and draws (``figure()``). Docs: docs/report.md, docs/plan.md,
docs/envelope.md, docs/glossary.md.
"""

from __future__ import annotations

from .version import __version__
from .errors import CapplanError, SpecError, StudyError

#: name → (module, attribute), imported on first use (module ``__getattr__``, PEP 562); the
#: study (DuckDB) too, so that ``capplan telemetry record`` runs on a GPU node without DuckDB,
#: and the contract and SLO (pyarrow, numpy), so that ``capplan --help`` imports neither
_LAZY = {
    "CONTRACT_VERSION": ("capplan.contract", "CONTRACT_VERSION"),
    "Status": ("capplan.contract", "Status"),
    "SLO": ("capplan.slo", "SLO"),
    "Study": ("capplan.study", "Study"),
    "open_study": ("capplan.study", "open_study"),
    "fit_envelope": ("capplan.envelope", "fit_envelope"),
    "Envelope": ("capplan.envelope", "Envelope"),
    "summarize": ("capplan.metrics", "summarize"),
    "validate_study": ("capplan.validate", "validate_study"),
    "open_checked": ("capplan.validate", "open_checked"),
    "reduce_study": ("capplan.reduce", "reduce_study"),
    "make_plan": ("capplan.plan", "make_plan"),
    "prepare_plan": ("capplan.plan", "prepare_plan"),
    "load_plan_spec": ("capplan.plan", "load_plan_spec"),
    "Plan": ("capplan.plan", "Plan"),
    "PlanSpec": ("capplan.plan", "PlanSpec"),
    "export_plan": ("capplan.export", "export_plan"),
    "compare": ("capplan.compare", "compare"),
    "render_report": ("capplan.report", "render_report"),
    "WhatIfModel": ("capplan.whatif", "WhatIfModel"),
    "WhatIfPanel": ("capplan.whatif", "WhatIfPanel"),
    "demo_study_path": ("capplan.resources", "demo_study_path"),
    "baseline_study_path": ("capplan.resources", "baseline_study_path"),
    "default_spec_path": ("capplan.resources", "default_spec_path"),
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'capplan' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value  # next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["CapplanError", "SpecError", "StudyError", "__version__", *_LAZY]
