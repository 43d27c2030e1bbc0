"""What-if for the fleet's dynamics: ready time, warm floor and burst growth (docs/timeline.md
"What-if: ready time, warm floor, burst").

A separate panel beside the main what-if (:mod:`capplan.whatif`), so either can change without
the other. :func:`fleet_state` is a pure function of a plan spec, a capacity per group and a
:class:`FleetParams`: it re-plans (``make_plan``: the cold-start reserve ⌈b·T / C⌉ and the
warm-floor top-up move with the controls) and, given a twin, simulates the burst at the
planned size (``capplan.plan.dynamics.cold_start_scenario``: SLO-minutes caused and good
requests lost against the same run on the full fleet). :class:`FleetWhatIfPanel` wires three
ipywidgets sliders to it; each change redraws a table (the replica groups by reason: the main
panel draws them as its chart) and, with a twin, the simulated burst in place.
"""

from __future__ import annotations

import html
import math
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .errors import SpecError
from .viz import FigureArea, format_number

#: the groups by reason are rows here, not a chart: the main panel above draws that chart
TABLE_KEYS = ("ready_time_s", "traffic_groups", "failure_reserve_groups", "rollout_overlap_groups",
              "cold_start_reserve_groups", "warm_floor_topup_groups", "total_groups", "total_gpus",
              "cost_usd_per_month")


@dataclass(frozen=True)
class FleetParams:
    """One position of the controls: replica ready time (s, all parts together), warm floor
    (groups kept warm), burst growth (req/s per s; inf: the burst arrives at once)."""

    ready_time_s: float
    warm_floor_groups: int
    burst_growth_rps_per_s: float

    def with_(self, **kw) -> "FleetParams":
        return replace(self, **kw)


@dataclass(frozen=True)
class FleetState:
    params: FleetParams
    table: pd.DataFrame
    figure: go.Figure | None  # the simulated burst; None without a twin
    plan: object = field(repr=False)
    burst: object = field(default=None, repr=False)  # capplan.plan.dynamics.DynamicCheck or None
    seconds: float = 0.0


def scaled_parts(parts: tuple[tuple[str, float], ...], total_s: float) -> dict:
    """The ready-time parts scaled to a new total, keeping their shares ({provision: T} when
    the spec gives none)."""
    if total_s < 0 or not math.isfinite(total_s):
        raise SpecError(f"ready time must be ≥ 0 s, got {total_s}", field="ready_time_s")
    s = sum(x for _, x in parts)
    if not parts or s <= 0:
        return {"provision": float(total_s)}
    return {k: float(x) * total_s / s for k, x in parts}


def fleet_defaults(spec) -> FleetParams:
    a = spec.autoscaling
    return FleetParams(ready_time_s=float(a.ready_s), warm_floor_groups=int(a.warm_floor_groups),
                       burst_growth_rps_per_s=float(a.burst_growth_rps_per_s))


def fleet_spec(spec, params: FleetParams):
    """The spec with the controls' values. A burst *at once* (growth inf) is the jump from the
    mean to the peak within one ready time: b = peak · (1 − mean_to_peak) / T for the plan's
    b·T (mean_to_peak 0.6 when the spec has none)."""
    b = params.burst_growth_rps_per_s
    if not math.isfinite(b):
        mtp = spec.demand.mean_to_peak if spec.demand.mean_to_peak is not None else 0.6
        T = max(params.ready_time_s, 1e-9)
        b = spec.demand.total_peak_rps * (1.0 - mtp) / T
    return spec.with_(ready_time_s=scaled_parts(spec.autoscaling.ready_time_s, params.ready_time_s),
                      warm_floor_groups=int(params.warm_floor_groups), burst_growth_rps_per_s=b)


def fleet_state(spec, capacity, params: FleetParams, *, gpus_per_group: int | None = None,
                study=None, system=None, quarter: int = 0, settings=None) -> FleetState:
    """Re-plan for one position of the controls; with ``system`` (a twin or a synth config)
    also simulate the burst at the planned size."""
    from .plan import make_plan
    from .plan.dynamics import SimSettings, cold_start_scenario

    t0 = time.perf_counter()
    s = fleet_spec(spec, params)
    plan = make_plan(s, capacity=capacity, study=study, gpus_per_group=gpus_per_group)
    burst = None
    if system is not None:
        with tempfile.TemporaryDirectory(prefix="capplan-fleet-") as d:
            burst = cold_start_scenario(plan, system, quarter=quarter,
                                        burst_rps_per_s=params.burst_growth_rps_per_s,
                                        settings=settings or SimSettings(), tmp=Path(d))
    table = fleet_table(plan, burst)
    fig = fleet_figure(plan, burst)
    return FleetState(params, table, fig, plan, burst, time.perf_counter() - t0)


def fleet_table(plan, burst=None) -> pd.DataFrame:
    rows = []
    for k in TABLE_KEYS:
        try:
            it = plan.item(k)
        except KeyError:
            continue
        rows.append({"key": k, "quantity": it.name, "value": float(it.value), "unit": it.unit})
    if burst is not None:
        rows += [{"key": "burst_slo_minutes", "quantity": "simulated burst: SLO-minutes caused",
                  "value": burst.slo_minutes, "unit": "min"},
                 {"key": "burst_good_lost", "quantity": "simulated burst: good requests lost",
                  "value": float(max(burst.good_lost, 0)), "unit": "requests"}]
    df = pd.DataFrame(rows, columns=["key", "quantity", "value", "unit"])
    # the report's number format: $85,632, not 8.56e+04
    df["shown"] = [format_number(float(v)) for v in df["value"]]
    return df


def fleet_figure(plan, burst=None) -> go.Figure | None:
    """The simulated burst — offered rate, goodput and groups ready — or None without one.
    The replica groups by reason are the main panel's chart (and this panel's table rows):
    drawing them here too put the same chart twice on the page."""
    if burst is None:
        return None
    fig = make_subplots(rows=1, cols=1, subplot_titles=("Simulated burst at the planned size",),
                        specs=[[{"secondary_y": True}]])
    w = burst.timeline.to_frame()
    t = (w["t_start_s"] + w["t_end_s"]) / 2
    fig.add_trace(go.Scatter(x=t, y=w["offered_rps"], name="offered", line=dict(color="#7f7f7f")), 1, 1)
    fig.add_trace(go.Scatter(x=t, y=w["goodput_rps"], name="goodput", line=dict(color="#2ca02c")), 1, 1)
    fig.add_trace(go.Scatter(x=w["t_start_s"], y=w["replicas_ready"], name="groups ready",
                             line=dict(shape="hv", color="#1f77b4")), 1, 1, secondary_y=True)
    fig.update_xaxes(title_text="seconds")
    fig.update_yaxes(title_text="req/s")
    fig.update_yaxes(title_text="groups", secondary_y=True)
    fig.update_layout(template="plotly_white", height=400, margin=dict(l=60, r=30, t=60, b=50),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def fleet_table_html(table: pd.DataFrame) -> str:
    """The panel's table; rows carry ``data-key="fleet-<key>"`` (distinct from the main
    panel's keys on the same page)."""
    e = html.escape
    rows = "".join(f'<tr data-key="fleet-{e(r.key)}"><th>{e(r.quantity)}</th><td class="value">'
                   f"{e(r.shown)}</td><td>{e(r.unit)}</td></tr>" for r in table.itertuples())
    return f'<table class="capplan-fleet">{rows}</table>'


class FleetWhatIfPanel:
    """Sliders for ready time, warm floor and burst growth (module docstring); the controls
    are attributes (``panel.ready``, ``panel.floor``, ``panel.burst``) so a test sets
    ``.value`` headless. ``from_model`` takes the main what-if's model (spec, envelope, study)."""

    BURST_CHOICES = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, math.inf)

    def __init__(self, spec, capacity, *, gpus_per_group: int | None = None, study=None,
                 system=None, params: FleetParams | None = None, quarter: int = 0, settings=None):
        import ipywidgets as W

        self.spec, self.capacity, self.study = spec, capacity, study
        self.gpus_per_group, self.system, self.quarter = gpus_per_group, system, quarter
        self.settings = settings
        p = params or fleet_defaults(spec)
        style = {"description_width": "200px"}
        layout = W.Layout(width="480px")
        self.ready = W.FloatSlider(value=p.ready_time_s, min=0.0, max=max(1800.0, 2 * p.ready_time_s),
                                   step=10.0, description="replica ready time (s)",
                                   continuous_update=False, style=style, layout=layout)
        self.floor = W.IntSlider(value=p.warm_floor_groups, min=0,
                                 max=max(20, 2 * p.warm_floor_groups), description="warm floor (groups)",
                                 continuous_update=False, style=style, layout=layout)
        choices = sorted(set(self.BURST_CHOICES) | {p.burst_growth_rps_per_s})
        self.burst = W.SelectionSlider(
            options=[("at once" if math.isinf(v) else f"{v:g}", v) for v in choices],
            value=p.burst_growth_rps_per_s, description="burst growth (req/s per s)",
            continuous_update=False, style=style, layout=layout)
        self.status = W.HTML()
        self.table = W.HTML()
        self.state = self._state(p)
        # a chart only for a simulated burst (a twin): the groups by reason are the main chart's
        fig = self.state.figure if self.state else None
        self.plot = FigureArea(fig, css_class="capplan-fleet-chart") if fig is not None else None
        self._show(self.state)
        for c in (self.ready, self.floor, self.burst):
            c.observe(self._on_change, names="value")
        self.widget = W.VBox([W.HBox([W.VBox([self.ready, self.floor, self.burst]),
                                      W.VBox([self.table, self.status])])]
                             + ([self.plot.widget] if self.plot is not None else []))

    @classmethod
    def from_model(cls, model, *, system=None, **kw) -> "FleetWhatIfPanel":
        """From the main what-if's model: its spec and the C_SLO its envelope gives per group."""
        from .plan import capacity_from_envelope

        cap = capacity_from_envelope(model.envelope, model.spec, replicas=model.study.manifest.replicas,
                                     study_name=model.study.name)
        return cls(model.spec, cap, study=model.study, system=system, **kw)

    @property
    def figure(self) -> go.Figure | None:
        """The figure on screen (None without a twin: no burst is simulated)."""
        return self.plot.figure if self.plot is not None else None

    def params(self) -> FleetParams:
        return FleetParams(float(self.ready.value), int(self.floor.value), float(self.burst.value))

    def _state(self, params: FleetParams):
        from .errors import CapplanError

        try:
            return fleet_state(self.spec, self.capacity, params, gpus_per_group=self.gpus_per_group,
                               study=self.study, system=self.system, quarter=self.quarter,
                               settings=self.settings)
        except CapplanError as exc:
            self.status.value = f"<pre style='color:#b00'>{html.escape(exc.format())}</pre>"
            return None

    def _show(self, state) -> None:
        if state is None:
            return
        self.table.value = fleet_table_html(state.table)
        sim = " · burst simulated on the twin" if state.burst is not None else ""
        self.status.value = f"<small>redrawn in {state.seconds * 1000:.0f} ms{sim}</small>"

    def _on_change(self, change) -> None:
        state = self._state(self.params())
        if state is None:
            return
        self.state = state
        if self.plot is not None and state.figure is not None:
            self.plot.show(state.figure)
        self._show(state)
