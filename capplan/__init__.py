"""capplan: SLO capacity envelopes with honest confidence intervals, and plans, for LLM serving."""

from __future__ import annotations

from .version import __version__
from .contract import CONTRACT_VERSION, Status
from .errors import CapplanError, SpecError, StudyError
from .slo import SLO
from .study import Study, open_study


def __getattr__(name: str):
    # Heavier entry points are imported lazily so `import capplan` stays fast.
    lazy = {
        "fit_envelope": ("capplan.envelope", "fit_envelope"),
        "summarize": ("capplan.metrics", "summarize"),
        "validate_study": ("capplan.validate", "validate_study"),
        "open_checked": ("capplan.validate", "open_checked"),
        "make_plan": ("capplan.plan", "make_plan"),
        "load_plan_spec": ("capplan.plan", "load_plan_spec"),
        "compare": ("capplan.compare", "compare"),
    }
    if name in lazy:
        import importlib

        mod, attr = lazy[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(name)


__all__ = ["CONTRACT_VERSION", "Status", "CapplanError", "SpecError", "StudyError", "SLO",
           "Study", "open_study", "__version__"]
