"""capplan: SLO capacity envelopes with honest confidence intervals, and plans, for LLM serving."""

from __future__ import annotations

__version__ = "0.1.0"

from .contract import CONTRACT_VERSION, Status  # noqa: E402
from .errors import CapplanError, SpecError, StudyError  # noqa: E402
from .slo import SLO  # noqa: E402
from .study import Study, open_study  # noqa: E402


def __getattr__(name: str):
    # Heavier entry points are imported lazily so `import capplan` stays fast.
    lazy = {
        "fit_envelope": ("capplan.envelope", "fit_envelope"),
        "summarize": ("capplan.metrics", "summarize"),
        "validate_study": ("capplan.validate", "validate_study"),
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
