"""How sure is the plan: the capacity range over which it does not change, and what the next
step up or down costs.

A plan is a step function of the capacity per replica group C: whole groups, so a range of C
gives the same groups, GPUs, nodes and cost. :func:`sensitivity` finds that range around the C
the plan used (bisection on the sizing rule, exact to ~1e-9 relative), the plan just below it
(more groups: what a capacity overestimate would cost) and at its top (fewer groups: what a
better-measured capacity could save), and the plan on the other C_SLO number (the estimate
when the plan uses the lower bound, and vice versa). The range is also given in the study
system's units (× the study's replicas), so it reads beside the C_SLO interval::

    s = sensitivity(plan)
    print(s.to_text())      # 'The plan (8 groups) holds for a C_SLO between 4.8 and 5.63 req/s …'
    s.to_frame(); s.figure()

When the C_SLO interval reaches past the range, the plan is *knife-edge*: a capacity the data
cannot rule out gives a different plan (``Sensitivity.knife_edge``).

Every quarter of the plan has its own band (``Sensitivity.quarters``, one :class:`QuarterBand`
each): later quarters plan a larger demand, so the same C_SLO interval can sit safely inside
the first quarter's band and reach past a later one's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .fleet_steps import fleet_steps
from ..present import fmt_num, is_missing, json_text
from .make import make_plan
from .result import Plan
from .sizing import size
from .text import plural

_REL = 1e-10


@dataclass(frozen=True)
class Step:
    """The plan at one capacity: groups, GPUs, billed GPUs, nodes, cost."""

    capacity_rps_per_group: float
    groups: int
    gpus: int
    billed_gpus: int
    nodes: int
    cost_usd_per_month: float


class _Band:
    """A per-group capacity band [low, high) and the study system's C_SLO at its ends."""

    low_rps_per_group: float
    high_rps_per_group: float
    replicas: int

    @property
    def low_system(self) -> float:
        return self.low_rps_per_group * self.replicas

    @property
    def high_system(self) -> float:
        return self.high_rps_per_group * self.replicas


@dataclass(frozen=True)
class QuarterBand(_Band):
    """One quarter's band: the per-group capacities [low, high) over which that quarter keeps
    its groups, the groups just below it, and the groups on the other C_SLO number."""

    quarter: str
    start: object  # datetime.date
    demand_rps: float
    groups: int
    low_rps_per_group: float
    high_rps_per_group: float  # ∞ when no capacity gives fewer groups (a floor binds)
    replicas: int
    groups_below: int
    other_groups: int | None = None  # on the other C_SLO number (None without one)
    knife_edge: bool = False


    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["start"] = self.start.isoformat() if hasattr(self.start, "isoformat") else self.start
        d.update(low_system=self.low_system, high_system=_json_num(self.high_system),
                 high_rps_per_group=_json_num(self.high_rps_per_group))
        return d


@dataclass(frozen=True)
class Sensitivity(_Band):
    """The capacity band [low, high) over which the plan keeps its groups, and the plans just
    outside it. Per-group capacities in req/s; ``replicas`` converts to the study system's
    C_SLO. ``high`` is ∞ when no capacity gives fewer groups (e.g. a warm floor binds)."""

    plan_step: Step
    low_rps_per_group: float
    high_rps_per_group: float
    replicas: int
    up: Step  # just below the band: more groups
    down: Step | None  # at the band's top: fewer groups (None when high is ∞)
    other: Step | None  # on the other C_SLO number (estimate ↔ lower bound)
    other_name: str = ""
    uses: str = "lower bound"
    estimate: float | None = None  # study system, req/s
    lower_bound: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float | None = None
    unit: str = "req/s"
    #: the band of every quarter of the plan (the first is the band above)
    quarters: tuple[QuarterBand, ...] = ()

    # ------------------------------------------------------------------ views
    @property
    def used_system(self) -> float:
        return self.plan_step.capacity_rps_per_group * self.replicas

    @property
    def margin_below(self) -> float:
        """How far (fraction) the capacity may fall below the number used before the plan needs
        more groups."""
        return 1.0 - self.low_rps_per_group / self.plan_step.capacity_rps_per_group

    @property
    def margin_above(self) -> float:
        """How much more capacity (fraction) would already drop a group (∞: none would)."""
        return self.high_rps_per_group / self.plan_step.capacity_rps_per_group - 1.0

    @property
    def knife_edge(self) -> bool:
        """True when a capacity inside the C_SLO interval (or the estimate) gives another plan."""
        vals = [v for v in (self.ci_low, self.ci_high, self.estimate, self.lower_bound) if v is not None]
        return any(not (self.low_system * (1 - _REL) <= v < self.high_system) for v in vals)

    def sentences(self) -> list[str]:
        """The band and the steps, in words (the report's 'how sure' section)."""
        u, p = self.unit, self.plan_step
        hi = "and above" if math.isinf(self.high_rps_per_group) else f"to {self.high_system:.4g} {u}"
        out = [f"The plan ({plural(p.groups, 'replica group')}, ${p.cost_usd_per_month:,.0f} per month) stays "
               f"the same for any C_SLO from {self.low_system:.4g} {hi} (per replica group "
               f"{self.low_rps_per_group:.4g}–{_num(self.high_rps_per_group)} {u}). It plans on the "
               f"{self.uses} {self.used_system:.4g} {u}: the true capacity may be {self.margin_below:.0%} "
               "lower before the plan is short"
               + ("." if math.isinf(self.margin_above) else
                  f"; {_pct(self.margin_above)} more capacity would already save a group.")]
        out.append(f"Below {self.low_system:.4g} {u} the plan needs {plural(self.up.groups, 'replica group')} "
                   f"({self.up.gpus} GPUs, {self.up.billed_gpus} billed): ${self.up.cost_usd_per_month:,.0f} "
                   f"per month ({_delta(self.up.cost_usd_per_month, p.cost_usd_per_month)}).")
        if self.down is not None:
            out.append(f"From {self.high_system:.4g} {u} it needs {plural(self.down.groups, 'replica group')} "
                       f"({self.down.gpus} GPUs, {self.down.billed_gpus} billed): "
                       f"${self.down.cost_usd_per_month:,.0f} per month "
                       f"({_delta(self.down.cost_usd_per_month, p.cost_usd_per_month)}).")
        else:
            out.append("No higher capacity gives fewer groups (a floor on the group count binds).")
        if self.other is not None:
            o = self.other
            same = o.groups == p.groups
            out.append(f"Planning on the {self.other_name} ({o.capacity_rps_per_group * self.replicas:.4g} {u}) "
                       f"instead would give " + ("the same plan." if same else
                                                 f"{plural(o.groups, 'replica group')} ({o.gpus} GPUs): "
                                                 f"${o.cost_usd_per_month:,.0f} per month "
                                                 f"({_delta(o.cost_usd_per_month, p.cost_usd_per_month)})."))
        if self.knife_edge:
            out.append("Knife-edge: capacities inside the C_SLO interval give a different plan, so the "
                       "number of groups depends on where in its interval the true capacity lies.")
        later = self.quarters[1:]
        if later:
            out.append("Later quarters: " + "; ".join(
                f"{q.quarter} ({plural(q.groups, 'group')}) holds for C_SLO {q.low_system:.4g}–"
                + (f"{q.high_system:.4g}" if math.isfinite(q.high_system) else "any higher value")
                + (" — knife-edge" if q.knife_edge else "") for q in later) + ".")
        return out

    def quarters_frame(self):
        """One row per quarter: its planned demand and groups, the C_SLO band over which it keeps
        them (study system and per group), the groups just below, on the other number, and
        whether the C_SLO interval reaches past its band."""
        import pandas as pd

        return pd.DataFrame([{"quarter": q.quarter, "demand_rps": q.demand_rps, "groups": q.groups,
                              "c_slo_low_rps": q.low_system, "c_slo_high_rps": q.high_system,
                              "capacity_low_rps_per_group": q.low_rps_per_group,
                              "capacity_high_rps_per_group": q.high_rps_per_group,
                              "groups_below_band": q.groups_below,
                              f"groups_on_the_{self.other_name.replace(' ', '_') or 'other_number'}": q.other_groups,
                              "knife_edge": q.knife_edge} for q in self.quarters])

    def to_text(self) -> str:
        return "\n".join(self.sentences())

    def to_frame(self):
        """One row per plan: this one, just below the band, at its top, on the other number."""
        import pandas as pd

        rows = [("this plan", self.plan_step), (f"C_SLO below {self.low_system:.4g}", self.up)]
        if self.down is not None:
            rows.append((f"C_SLO from {self.high_system:.4g}", self.down))
        if self.other is not None:
            rows.append((f"on the {self.other_name}", self.other))
        return pd.DataFrame([{"case": name, "c_slo_rps": s.capacity_rps_per_group * self.replicas,
                              "capacity_rps_per_group": s.capacity_rps_per_group, "groups": s.groups,
                              "gpus": s.gpus, "billed_gpus": s.billed_gpus, "nodes": s.nodes,
                              "cost_usd_per_month": s.cost_usd_per_month} for name, s in rows])

    def figure(self):
        """Monthly cost against the study system's C_SLO (a step: whole groups), with the band,
        the C_SLO interval, the lower bound and the estimate."""
        import plotly.graph_objects as go

        pts = sorted({(s.capacity_rps_per_group * self.replicas, s.cost_usd_per_month, s.groups)
                      for s in (self.up, self.plan_step, self.down) if s is not None})
        xs = [v for v in (self.low_system, self.used_system, self.ci_low, self.ci_high, self.estimate)
              if v is not None]
        if not math.isinf(self.high_system):
            xs.append(self.high_system)
        x0, x1 = min(xs) * 0.9, max(xs) * 1.1
        sx, sy, st = [x0], [self.up.cost_usd_per_month], [self.up.groups]
        for cut, step in ((self.low_system, self.plan_step), (self.high_system, self.down)):
            if step is None or math.isinf(cut):
                continue
            sx += [cut, cut]
            sy += [sy[-1], step.cost_usd_per_month]
            st += [st[-1], step.groups]
        sx.append(x1)
        sy.append(sy[-1])
        st.append(st[-1])
        fig = go.Figure()
        if self.ci_low is not None and self.ci_high is not None:
            top = max(sy) * 1.08
            fig.add_trace(go.Scatter(x=[self.ci_low, self.ci_high, self.ci_high, self.ci_low, self.ci_low],
                                     y=[0, 0, top, top, 0], fill="toself", fillcolor="rgba(31,119,180,0.15)",
                                     line={"width": 0}, hoverinfo="skip",
                                     name=f"C_SLO {self.confidence or 0.95:.0%} interval"))
        fig.add_trace(go.Scatter(x=sx, y=sy, mode="lines", line={"shape": "linear", "width": 3},
                                 name="monthly cost of the plan", customdata=st,
                                 hovertemplate="C_SLO %{x:.3f} req/s<br>%{customdata} groups<br>"
                                               "$%{y:,.0f} per month<extra></extra>"))
        for v, name, dash in ((self.lower_bound, "lower bound", "dot"), (self.estimate, "estimate", "solid")):
            if v is not None:
                fig.add_trace(go.Scatter(x=[v, v], y=[0, max(sy) * 1.08], mode="lines",
                                         line={"dash": dash, "color": "black", "width": 1.5},
                                         name=f"C_SLO {name} {v:.3g}"))
        fig.update_layout(template="plotly_white", height=360, margin=dict(l=70, r=20, t=50, b=50),
                          title="Monthly cost if the true C_SLO were elsewhere (whole replica groups)",
                          xaxis_title=f"C_SLO of the study system ({self.unit})",
                          yaxis_title="cost per month (USD)", legend=dict(orientation="h", y=-0.25))
        fig.update_yaxes(rangemode="tozero", tickprefix="$", tickformat=",.0f")
        return fig


def _num(v: float) -> str:
    return "∞" if not is_missing(v) and math.isinf(v) else fmt_num(v)


def _pct(x: float) -> str:
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def _delta(new: float, old: float) -> str:
    d = new - old
    sign = "+" if d >= 0 else "−"
    return f"{sign}${abs(d):,.0f}, {sign}{abs(d) / old:.0%}" if old else f"{sign}${abs(d):,.0f}"


def _groups_at(plan: Plan, c: float, demand_rps: float | None = None) -> int:
    D = plan.value("demand_rps") if demand_rps is None else demand_rps
    return size(D, c, plan.spec, plan.gpus_per_group or int(plan.value("gpus_per_group"))).total


def _edge(plan: Plan, lo: float, hi: float, below: int, demand_rps: float | None = None) -> float:
    """Smallest capacity in (lo, hi] with at most ``below`` groups (groups fall with capacity)."""
    for _ in range(200):
        if hi - lo <= _REL * hi:
            break
        mid = 0.5 * (lo + hi)
        if _groups_at(plan, mid, demand_rps) <= below:
            hi = mid
        else:
            lo = mid
    return hi


def _band(plan: Plan, C: float, N: int, demand_rps: float | None = None) -> tuple[float, float]:
    """[low, high): the per-group capacities around C that keep N groups at this demand."""
    lo = C
    while _groups_at(plan, lo, demand_rps) <= N:
        lo *= 0.5
    low = _edge(plan, lo, C, N, demand_rps)
    hi = C
    while _groups_at(plan, hi, demand_rps) >= N and hi < C * 1e6:
        hi *= 2.0
    high = _edge(plan, C, hi, N - 1, demand_rps) if _groups_at(plan, hi, demand_rps) < N else math.inf
    return low, high


def _outside(values, low_system: float, high_system: float) -> bool:
    return any(not (low_system * (1 - _REL) <= v < high_system) for v in values if v is not None)


def quarter_bands(plan: Plan, other_rps_per_group: float | None = None) -> tuple[QuarterBand, ...]:
    """The band of each quarter of ``plan`` at its planned demand (see :class:`QuarterBand`);
    ``other_rps_per_group``: the other C_SLO number per group, to count its groups too."""
    C = plan.capacity.rps_per_group
    cap = plan.capacity
    r = cap.study_replicas or 1
    vals = (cap.ci_low, cap.ci_high, cap.estimate, cap.lower_bound)
    out = []
    for q in plan.quarters:
        D = q.demand_rps if q.demand_rps is not None else plan.value("demand_rps")
        low, high = _band(plan, C, int(q.groups), D)
        out.append(QuarterBand(
            quarter=q.label, start=q.start, demand_rps=float(D), groups=int(q.groups), low_rps_per_group=low,
            high_rps_per_group=high, replicas=r, groups_below=_groups_at(plan, low * (1 - 1e-6), D),
            other_groups=None if other_rps_per_group is None else _groups_at(plan, other_rps_per_group, D),
            knife_edge=_outside(vals, low * r, high * r)))
    return tuple(out)


def _step(plan: Plan, c: float) -> Step:
    cap = dataclasses.replace(plan.capacity, rps_per_group=float(c))
    p = make_plan(plan.spec, cap, slo=plan.slo, facts=plan.facts, forecast=plan.forecast,
                  gpus_per_group=plan.gpus_per_group or int(plan.value("gpus_per_group")), as_of=plan.as_of,
                  burst_inputs=plan.burst_inputs)
    return Step(capacity_rps_per_group=float(c), groups=int(p.value("total_groups")),
                gpus=int(p.value("total_gpus")), billed_gpus=int(p.value("billed_gpus")),
                nodes=int(p.value("nodes")), cost_usd_per_month=float(p.value("cost_usd_per_month")))


def sensitivity(plan: Plan) -> Sensitivity:
    """The band of per-group capacity over which ``plan`` keeps its group count, and the plans
    just below it, at its top and on the other C_SLO number (see the module docstring)."""
    C = plan.capacity.rps_per_group
    N = int(plan.value("total_groups"))
    # the band: the capacities that need no more than N groups and not fewer (high ∞: a floor binds)
    low, high = _band(plan, C, N)
    cap = plan.capacity
    r = cap.study_replicas or 1
    uses_lb = "lower" in cap.source
    other_value, other_name = ((cap.estimate, "estimate") if uses_lb else (cap.lower_bound, "lower bound"))
    other = None
    if cap.estimate is not None and other_value is not None and other_value > 0 and math.isfinite(other_value):
        other = _step(plan, other_value / r)
    bands = quarter_bands(plan, other.capacity_rps_per_group if other is not None else None)
    return Sensitivity(
        plan_step=_step(plan, C), low_rps_per_group=low, high_rps_per_group=high, replicas=r,
        up=_step(plan, low * (1 - 1e-6)), down=None if math.isinf(high) else _step(plan, high * (1 + 1e-9)),
        other=other, other_name=other_name if other is not None else "",
        uses="lower bound" if uses_lb else ("estimate" if cap.estimate is not None else "given capacity"),
        estimate=cap.estimate, lower_bound=cap.lower_bound, ci_low=cap.ci_low, ci_high=cap.ci_high,
        confidence=cap.confidence, unit=cap.unit or "req/s", quarters=bands)


def _step_dict(s: Step | None) -> dict | None:
    return None if s is None else dataclasses.asdict(s)


def _json_num(v):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def plan_record(plan: Plan, sens: Sensitivity | None = None) -> dict:
    """What a report's index shows of a plan, JSON-ready (numbers unrounded, dates ISO): what
    the plan is (``about``), the summary line items, the dated quarters and years, the checks
    (failing first, then caveated), the capacity with its interval, the notes, and the
    sensitivity (band, steps, sentences)."""
    sens = sens or sensitivity(plan)

    def rows(df):
        return [{k: (v.isoformat() if hasattr(v, "isoformat") else _json_num(v)) for k, v in r.items()}
                for r in df.to_dict("records")]

    checks = sorted(plan.checks, key=lambda c: (c.ok, not c.caveat))
    cap = plan.capacity
    return {
        "about": [list(x) for x in plan.about()],
        "contract": plan.contract().to_dict(),
        "summary": plan.summary,
        "items": {it.key: {"name": it.name, "value": _json_num(it.value), "unit": it.unit}
                  for it in plan.items},
        "quarters": rows(plan.quarters_frame()),
        "years": rows(plan.years_frame()),
        "checks": [{"key": c.key, "sentence": c.sentence, "ok": c.ok, "caveat": c.caveat} for c in checks],
        "ok": plan.ok,
        "capacity": {"rps_per_group": cap.rps_per_group, "source": cap.source, "unit": cap.unit,
                     "estimate": cap.estimate, "ci_low": cap.ci_low, "ci_high": cap.ci_high,
                     "lower_bound": cap.lower_bound, "confidence": cap.confidence, "status": cap.status,
                     "replicas": cap.study_replicas, "uses": sens.uses, "basis": cap.basis,
                     "honesty": cap.honesty},
        "mix_comparison": [dict(c) for c in plan.mix_comparison],
        "notes": list(plan.notes),
        "sensitivity": {"low_rps_per_group": sens.low_rps_per_group,
                        "high_rps_per_group": _json_num(sens.high_rps_per_group),
                        "low_system": sens.low_system, "high_system": _json_num(sens.high_system),
                        "used_system": sens.used_system, "margin_below": sens.margin_below,
                        "margin_above": _json_num(sens.margin_above), "knife_edge": sens.knife_edge,
                        "plan": _step_dict(sens.plan_step), "up": _step_dict(sens.up),
                        "down": _step_dict(sens.down), "other": _step_dict(sens.other),
                        "other_name": sens.other_name, "sentences": sens.sentences(),
                        "quarters": [q.to_dict() for q in sens.quarters]},
        "fleet_steps": [st.to_dict() for st in fleet_steps(plan)],
    }


def write_plan_record(plan: Plan, path, sens: Sensitivity | None = None) -> dict:
    """Write :func:`plan_record` as JSON (atomically, ``present.json_text``); returns it."""
    rec = plan_record(plan, sens)
    json_text(rec, path)
    return rec
