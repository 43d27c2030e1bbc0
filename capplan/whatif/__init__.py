"""The what-if panel: controls for the SLO, demand, uncertainty, failure policy and price that
redraw the plan table, the quarters and the chart live.

Two layers, so the arithmetic is testable without a browser:

- :mod:`capplan.whatif.model` — :class:`WhatIfModel` (the slow part once, optionally cached on
  disk) and the pure :func:`whatif_state` (plan table, quarters, figure for one position);
- :mod:`capplan.whatif.panel` — :class:`WhatIfPanel`, the ipywidgets wiring (progress while
  loading, no stale plan on errors, round slider values, save scenario).

``capplan whatif`` serves notebooks/04-whatif.ipynb with Voila (docs/report.md).
"""

from __future__ import annotations

from .model import (ATTAINMENT_CHOICES, CAPACITY_USES, POLICY_LABELS, TABLE_KEYS, NoCapacity,  # noqa: F401
                    WhatIfModel, WhatIfParams, WhatIfState, cache_dir, nice_values, plan_table,
                    quarters_view, save_scenario, scenario_spec, spec_yaml, whatif_figure, whatif_state)
from .panel import WhatIfPanel, slider_range, quarters_html, table_html  # noqa: F401


def model_settings(environ, *, study_path: str = "", spec_path: str = "", slo=None,
                   seed: int = -1, reps: int = 0, confidence: float = 0.0) -> dict:
    """Keyword arguments for :meth:`WhatIfModel.build` from the notebook's parameters and the
    CAPPLAN_* environment variables that ``capplan whatif`` sets (they win: Voila cannot pass
    parameters). Empty / zero / negative values mean "the spec's"."""
    from ..errors import SpecError

    env = {k: v for k, v in environ.items() if k.startswith("CAPPLAN_") and v != ""}

    def num(key: str, value, cast, is_set):
        raw = env.get(key)
        if raw is not None:
            try:
                return cast(raw)
            except ValueError:
                raise SpecError(f"environment variable {key}={raw!r} is not a number",
                                field=key) from None
        return cast(value) if value is not None and is_set(value) else None

    return {"study": env.get("CAPPLAN_STUDY") or study_path or None,
            "spec": env.get("CAPPLAN_SPEC") or spec_path or None,
            "slo": env.get("CAPPLAN_SLO") or (slo or None),
            "seed": num("CAPPLAN_SEED", seed, int, lambda v: v >= 0),
            "reps": num("CAPPLAN_REPS", reps, int, lambda v: v > 0),
            "confidence": num("CAPPLAN_CONFIDENCE", confidence, float, lambda v: v > 0)}
