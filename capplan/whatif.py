"""The what-if panel: sliders for the SLO, demand, uncertainty, failure policy and price that
redraw the plan table and chart live.

Two layers, so the arithmetic is testable without a browser:

- :class:`WhatIfModel` does the slow part ONCE (open the study, fit the envelope — the only
  step that reads events — and read the plan spec). :func:`whatif_state` is then a pure
  function of the model and a :class:`WhatIfParams`: ``Envelope.refit`` (from the cached
  per-block statistics) + ``make_plan`` → (plan table, figure). Study facts per SLO are
  memoised, so revisiting an SLO costs nothing.
- :class:`WhatIfPanel` only wires ipywidgets: every control has ``continuous_update=False``
  and ``.observe(..., names="value")``; a change recomputes the state and updates an HTML
  table and a ``go.FigureWidget`` in place. The FigureWidget is built with its data at
  construction (Voila renders a FigureWidget that was modified before display inside a VBox
  as an empty box).
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .errors import SpecError
from .slo import SLO

#: Attainment targets offered by the slider.
ATTAINMENT_CHOICES = (0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
POLICY_LABELS = {"none": "no reserve", "node": "lose a node", "zone": "lose a zone",
                 "n_plus_k": "N + k groups"}
CAPACITY_USES = {"lower_bound": "C_SLO lower bound", "estimate": "C_SLO estimate"}
#: Plan line items shown in the panel's table, in order.
TABLE_KEYS = ("peak_rps", "demand_rps", "capacity_rps_per_group", "traffic_groups",
              "failure_reserve_groups", "rollout_overlap_groups", "cold_start_reserve_groups",
              "total_groups", "total_gpus", "nodes", "utilisation_at_peak_pct",
              "cost_usd_per_month", "cost_usd_per_1k_good_requests")


@dataclass(frozen=True)
class WhatIfParams:
    """One position of every control."""

    ttft_ms: float | None
    tpot_ms: float | None
    attainment: float
    peak_rps: float
    uncertainty: float
    policy: str
    price_usd_per_gpu_hour: float
    capacity_use: str = "lower_bound"

    def slo(self, base: SLO) -> SLO:
        return base.with_(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms, attainment=self.attainment)

    def with_(self, **kw) -> "WhatIfParams":
        return replace(self, **kw)


@dataclass(frozen=True)
class WhatIfState:
    """What the panel shows for one WhatIfParams."""

    params: WhatIfParams
    table: pd.DataFrame
    figure: go.Figure
    plan: object = field(repr=False)
    envelope: object = field(repr=False)
    seconds: float = 0.0


class WhatIfModel:
    """The cached, slow part: study, fitted envelope, base plan spec (read-only after build)."""

    def __init__(self, study, envelope, spec, slo: SLO):
        self.study = study
        self.envelope = envelope
        self.spec = spec
        self.slo = slo
        self._facts = lru_cache(maxsize=64)(self._facts_for)

    @classmethod
    def build(cls, study=None, spec=None, slo=None, *, confidence: float | None = None,
              reps: int | None = None, seed: int | None = None) -> "WhatIfModel":
        """Open the study (default: the bundled demo), read the spec (default:
        templates/plan.yaml), fit the envelope once (the slow reduction). SLO, confidence,
        reps and seed default to the spec's, as in ``capplan plan`` and ``capplan report``."""
        from .study import open_study
        from .envelope import fit_envelope
        from .plan import load_plan_spec
        from .report import DEFAULT_SLO, default_spec_path, demo_study_path

        study = open_study(study or demo_study_path())
        spec = load_plan_spec(spec or default_spec_path())
        slo = SLO.parse(slo) if slo else (spec.slo or SLO.parse(DEFAULT_SLO))
        cap = spec.capacity
        env = fit_envelope(study, slo,
                           confidence=cap.confidence if confidence is None else confidence,
                           reps=cap.reps if reps is None else reps,
                           seed=cap.seed if seed is None else seed)
        return cls(study, env, spec, slo)

    def defaults(self) -> WhatIfParams:
        s = self.spec
        return WhatIfParams(
            ttft_ms=self.slo.ttft_ms, tpot_ms=self.slo.tpot_ms, attainment=self.slo.attainment,
            peak_rps=s.demand.total_peak_rps, uncertainty=s.demand.uncertainty,
            policy=s.failure.policy, price_usd_per_gpu_hour=s.prices.usd_per_gpu_hour or 0.0,
            capacity_use=s.capacity.use)

    def limit_choices(self, axis: str, value: float) -> list[float] | None:
        """The SLO limits the cached statistics serve exactly on ``axis`` ("x" = TTFT,
        "y" = TPOT or ITL), with ``value`` among them; None without a grid."""
        stats = getattr(self.envelope, "stats", None)
        grid = getattr(stats, "grid_spec", None)
        if grid is None or (axis == "y" and grid.y_metric != "tpot"):
            return None
        limits = [float(v) for v in grid.limits(axis) if math.isfinite(v)]
        i = grid.index(axis, value)
        if 0 <= i < len(limits):
            limits[i] = float(value)
        return sorted(set(limits) | {float(value)})

    def _facts_for(self, slo_text: str):
        from .cost import study_facts

        return study_facts(self.study, SLO.parse(slo_text))

    def facts(self, slo: SLO):
        return self._facts(str(slo))


def model_settings(environ, *, study_path: str = "", spec_path: str = "", slo=None,
                   seed: int = -1, reps: int = 0, confidence: float = 0.0) -> dict:
    """Keyword arguments for :meth:`WhatIfModel.build` from the notebook's parameters and the
    CAPPLAN_* environment variables that ``capplan whatif`` sets (they win: Voila cannot pass
    parameters). Empty / zero / negative values mean "the spec's"."""
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


def _fmt_value(v, unit: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if unit.startswith("USD") or unit.startswith("$"):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    if float(v).is_integer():
        return f"{v:,.0f}"
    return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def plan_table(plan, envelope) -> pd.DataFrame:
    """The panel's table: key, quantity, value, unit, shown (formatted value)."""
    rows = []
    c = envelope.cslo
    for key, name, v in (("cslo_estimate", "C_SLO estimate (study system)", c.estimate),
                         ("cslo_lower_bound", "C_SLO lower bound (study system)", c.lower_bound)):
        rows.append({"key": key, "quantity": name, "value": _num(v), "unit": "req/s"})
    for key in TABLE_KEYS:
        try:
            it = plan.item(key)
        except KeyError:
            continue
        rows.append({"key": key, "quantity": it.name, "value": float(it.value), "unit": it.unit})
    rows.append({"key": "checks", "quantity": "all plan checks pass",
                 "value": 1.0 if plan.ok else 0.0, "unit": "yes/no"})
    df = pd.DataFrame(rows, columns=["key", "quantity", "value", "unit"])
    df["shown"] = [("yes" if r.value else "NO") if r.key == "checks" else _fmt_value(r.value, r.unit)
                   for r in df.itertuples()]
    return df


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def table_html(table: pd.DataFrame, plan=None) -> str:
    """HTML of the plan table; each row carries ``data-key`` so a browser test can read it."""
    e = html.escape
    rows = "\n".join(
        f'<tr data-key="{e(r.key)}"><th>{e(r.quantity)}</th>'
        f'<td class="value">{e(r.shown)}</td><td class="unit">{e(r.unit)}</td></tr>'
        for r in table.itertuples())
    failed = ""
    if plan is not None and not plan.ok:
        failed = "<ul class='failed'>" + "".join(
            f"<li>{e(c.sentence)}</li>" for c in plan.checks if not c.ok) + "</ul>"
    return ("<style>.capplan-whatif td.value{text-align:right;font-variant-numeric:tabular-nums;"
            "padding:0 .6em}.capplan-whatif th{text-align:left;font-weight:500;padding-right:1em}"
            ".capplan-whatif .failed{color:#b00}</style>"
            f'<table class="capplan-whatif">{rows}</table>{failed}')


def whatif_figure(plan, envelope, params: WhatIfParams) -> go.Figure:
    """Left: attainment vs offered rate with the target and C_SLO (from the refit envelope).
    Right: replica groups by reason (traffic, failure, rollout, cold start, warm floor)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=("SLO attainment vs offered rate", "Replica groups at peak"))
    env_fig = envelope.figure()
    for tr in env_fig.data:
        fig.add_trace(tr, row=1, col=1)
    fig.add_hline(y=params.attainment, line_dash="dash", line_color="crimson", row=1, col=1)
    c = envelope.cslo
    for v, name, dash in ((c.estimate, "C_SLO", "solid"), (c.lower_bound, "lower bound", "dot")):
        if v is not None and math.isfinite(_num(v)):
            fig.add_vline(x=float(v), line_dash=dash, line_color="black", row=1, col=1)
    parts = [("traffic", "traffic_groups"), ("failure", "failure_reserve_groups"),
             ("rollout", "rollout_overlap_groups"), ("cold start", "cold_start_reserve_groups"),
             ("warm floor", "warm_floor_topup_groups")]
    x, y = [], []
    for label, key in parts:
        try:
            x.append(label)
            y.append(float(plan.value(key)))
        except KeyError:
            x.pop()
    x.append("total")
    y.append(float(plan.value("total_groups")))
    fig.add_trace(go.Waterfall(x=x, y=y, measure=["relative"] * (len(x) - 1) + ["total"],
                               text=[f"{v:.0f}" for v in y], textposition="outside",
                               showlegend=False, name="groups"), row=1, col=2)
    fig.update_xaxes(title_text="offered rate (req/s)", row=1, col=1)
    fig.update_yaxes(title_text="attainment", row=1, col=1)
    fig.update_yaxes(title_text="replica groups", row=1, col=2)
    fig.update_layout(template="plotly_white", height=420, margin=dict(l=60, r=20, t=60, b=50),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def whatif_state(model: WhatIfModel, params: WhatIfParams) -> WhatIfState:
    """Pure re-plan for one slider position: refit from cached stats + make_plan."""
    from .plan import capacity_from_envelope, make_plan

    t0 = time.perf_counter()
    if params.policy not in POLICY_LABELS:
        raise SpecError(f"unknown failure policy {params.policy!r}", field="policy",
                        fix="one of " + ", ".join(POLICY_LABELS))
    slo = params.slo(model.slo)
    env = model.envelope.refit(slo=slo)
    spec = model.spec.with_(peak_rps=params.peak_rps, uncertainty=params.uncertainty,
                            policy=params.policy,
                            price_usd_per_gpu_hour=params.price_usd_per_gpu_hour,
                            capacity_use=params.capacity_use, slo=slo)
    replicas = model.study.manifest.replicas
    cap = capacity_from_envelope(env, spec, replicas=replicas, study_name=model.study.name)
    plan = make_plan(spec, capacity=cap, study=model.study, facts=model.facts(slo), slo=slo)
    table = plan_table(plan, env)
    fig = whatif_figure(plan, env, params)
    return WhatIfState(params=params, table=table, figure=fig, plan=plan, envelope=env,
                       seconds=time.perf_counter() - t0)


def _slider_range(value: float, lo_factor: float = 0.25, hi_factor: float = 3.0,
                  steps: int = 40) -> tuple[float, float, float]:
    """(min, max, step) around a default: a round step so ArrowRight moves by a round amount."""
    span = value * (hi_factor - lo_factor)
    raw = span / steps
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=mag)
    lo = max(step, math.floor(value * lo_factor / step) * step)
    hi = math.ceil(value * hi_factor / step) * step
    return lo, hi, step


class WhatIfPanel:
    """The ipywidgets panel. ``panel.widget`` is what a notebook displays; controls are
    attributes (``panel.peak``, ``panel.ttft`` …) so a test can set ``.value`` headless."""

    def __init__(self, model: WhatIfModel, params: WhatIfParams | None = None):
        import ipywidgets as W

        self.model = model
        p = params or model.defaults()
        style = {"description_width": "210px"}
        layout = W.Layout(width="520px")

        def fslider(desc, value, lo_f=0.25, hi_f=3.0, fmt=".4g"):
            lo, hi, step = _slider_range(value, lo_f, hi_f)
            return W.FloatSlider(value=value, min=lo, max=hi, step=step, description=desc,
                                 continuous_update=False, readout_format=fmt, style=style,
                                 layout=layout)

        def limit_slider(desc, value, axis):
            """Limits on the reduction's grid, so every position is an exact refit."""
            if not value:
                return None
            options = model.limit_choices(axis, value)
            if options is None:
                return fslider(desc, value)
            return W.SelectionSlider(options=[(f"{v:.4g}", v) for v in options], value=value,
                                     description=desc, continuous_update=False, style=style,
                                     layout=layout)

        self.ttft = limit_slider("TTFT limit (ms)", p.ttft_ms, "x")
        self.tpot = limit_slider("TPOT limit (ms)", p.tpot_ms, "y")
        choices = sorted(set(ATTAINMENT_CHOICES) | {p.attainment})
        self.attainment = W.SelectionSlider(
            options=[(f"{a:.4g}", a) for a in choices], value=p.attainment,
            description="attainment target", continuous_update=False, style=style, layout=layout)
        self.peak = fslider("peak demand (req/s)", p.peak_rps, 0.1, 3.0)
        self.uncertainty = W.FloatSlider(value=p.uncertainty, min=0.0, max=1.0, step=0.05,
                                         description="demand uncertainty (+fraction)",
                                         continuous_update=False, readout_format=".2f",
                                         style=style, layout=layout)
        self.policy = W.Dropdown(options=[(v, k) for k, v in POLICY_LABELS.items()],
                                 value=p.policy, description="failure policy", style=style,
                                 layout=layout)
        price = p.price_usd_per_gpu_hour or 2.0
        self.price = fslider("price (USD per GPU-hour)", price, 0.25, 3.0, ".2f")
        self.capacity_use = W.ToggleButtons(options=[(v, k) for k, v in CAPACITY_USES.items()],
                                            value=p.capacity_use, description="plan on",
                                            style=style)
        self.status = W.HTML()
        self.table = W.HTML()
        state = self._state(p)
        self.state = state
        # data at construction: see the module docstring (Voila pitfall)
        self.figure = go.FigureWidget(state.figure if state is not None else go.Figure())
        self._show(state)
        self.controls = [c for c in (self.ttft, self.tpot, self.attainment, self.peak,
                                     self.uncertainty, self.policy, self.price,
                                     self.capacity_use) if c is not None]
        for c in self.controls:
            c.observe(self._on_change, names="value")
        self.widget = W.VBox([
            W.HBox([W.VBox(self.controls), W.VBox([self.table, self.status])]),
            self.figure,
        ])

    def params(self) -> WhatIfParams:
        return WhatIfParams(
            ttft_ms=self.ttft.value if self.ttft else None,
            tpot_ms=self.tpot.value if self.tpot else None,
            attainment=float(self.attainment.value), peak_rps=float(self.peak.value),
            uncertainty=float(self.uncertainty.value), policy=self.policy.value,
            price_usd_per_gpu_hour=float(self.price.value),
            capacity_use=self.capacity_use.value)

    def _state(self, params: WhatIfParams):
        from .errors import CapplanError

        try:
            return whatif_state(self.model, params)
        except CapplanError as exc:
            self.status.value = (f"<pre style='color:#b00;white-space:pre-wrap'>"
                                 f"{html.escape(exc.format())}</pre>")
            return None

    def _show(self, state: WhatIfState | None) -> None:
        if state is None:
            return
        slo = getattr(state.envelope, "slo", None)
        self.status.value = (f"<small>SLO: {html.escape(slo.describe() if slo else '')} · "
                             f"capacity: {html.escape(state.plan.capacity.source)} · "
                             f"redrawn in {state.seconds * 1000:.0f} ms</small>")
        self.table.value = table_html(state.table, state.plan)

    def _on_change(self, change) -> None:
        state = self._state(self.params())
        if state is None:
            return
        self.state = state
        new = state.figure
        with self.figure.batch_update():
            if len(self.figure.data) == len(new.data) and all(
                    a.type == b.type for a, b in zip(self.figure.data, new.data)):
                for old, tr in zip(self.figure.data, new.data):
                    old.update(tr.to_plotly_json(), overwrite=True)
            else:
                self.figure.data = ()
                self.figure.add_traces(list(new.data))
            self.figure.layout = new.layout
        self._show(state)
