"""The plan as a result: auditable line items and checks, dated quarters, and how the plan
prints (``to_text``), tabulates (``to_frame`` and friends) and draws (``figure``) itself.

Every number is a :class:`LineItem` carrying its formula and the inputs used, so a finance
reader can redo it by hand and a test can check it; the items are made in ``capplan.plan.items``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..present import MISSING, is_missing
from ..slo import SLO
from . import contract as plan_contract, text as plan_text
from .capacity import CapacityInfo
from .periods import Period
from .spec import PlanSpec
from .text import plural


@dataclass(frozen=True)
class LineItem:
    """One auditable plan number: value, unit, formula (readable text) and the inputs used."""

    name: str
    value: float
    unit: str
    formula: str
    inputs: dict = field(default_factory=dict, compare=False, hash=False)
    key: str = ""

    def inputs_text(self) -> str:
        return "; ".join(f"{k} = {_fmt(v)}" for k, v in self.inputs.items())


@dataclass(frozen=True)
class Check:
    """A condition the plan must meet, stated as a sentence. ``caveat``: why a check that holds
    may still mislead (e.g. a capacity bound that can be too high), shown beside it."""

    key: str
    sentence: str
    ok: bool
    caveat: str = ""


@dataclass(frozen=True)
class QuarterPlan:
    """The plan of one quarter (dated: ``start``/``end``, the first and last day)."""

    label: str
    peak_rps: float
    forecast_mean_rps: float | None
    groups: int
    gpus: int
    nodes: int
    billed_gpus: int
    cost_usd_per_quarter: float
    cost_usd_per_1k_good_requests: float
    forecast_lower_rps: float | None = None  # lower end of the forecast interval of the peak
    start: Any = None  # datetime.date
    end: Any = None  # datetime.date (inclusive)
    demand_rps: float | None = None  # planned demand: peak × (1 + uncertainty)
    cost_usd_per_month: float | None = None


@dataclass(frozen=True)
class Plan:
    """A capacity plan. ``items`` (LineItem), ``checks`` (Check), ``quarters`` (QuarterPlan),
    ``assumptions`` (name, value, note), ``notes`` (what could not be computed and why)."""

    spec: PlanSpec
    capacity: CapacityInfo
    items: tuple[LineItem, ...]
    checks: tuple[Check, ...]
    quarters: tuple[QuarterPlan, ...]
    assumptions: tuple[tuple[str, Any, str], ...]
    notes: tuple[str, ...] = ()
    slo: SLO | None = None
    forecast: Any = None
    #: what a re-plan needs (study facts, GPUs per group, the day the dates count from), so
    #: ``capplan.plan.sensitivity`` can redo this plan at other capacities
    facts: Any = field(default=None, repr=False, compare=False)
    gpus_per_group: int | None = None
    as_of: Any = None  # datetime.date the default start was counted from
    #: the plan on the study's other C_SLO numbers (tested vs production mix), each with its
    #: first quarter's size and cost and a sentence (``compare_numbers``); empty without a target mix
    mix_comparison: tuple = ()
    #: production's burstiness against the sweep's at the first quarter's peak
    #: (``capplan.burst.BurstComparison``); None without ``demand.arrivals``
    burst: Any = None

    @property
    def burst_inputs(self) -> tuple | None:
        """What a re-plan at another capacity needs to keep this plan's burst factor
        (``make_plan(burst_inputs=…)``) without reading the trace or the study again."""
        b = self.burst
        return None if b is None else (b.production, [b.sweep_max_dispersion], b.sweep_source)

    @property
    def burstier_than_tested(self) -> bool:
        """Is production burstier than any tested run (the plan's peak then extrapolates)?"""
        return self.burst is not None and not self.burst.covered

    #: what the study offered (``plan_contract.StudyWorkload``): the contract's workload clause
    #: and the chargeback's token shares; None for a plan from a given capacity number
    workload: Any = field(default=None, repr=False, compare=False)

    def contract(self):
        """What the capacity holds for (``plan_contract.CapacityContract``)."""
        return plan_contract.capacity_contract(self)

    def chargeback(self, output_weight: float = 1.0):
        """Monthly cost per tenant / SLO class (``plan_contract.Chargeback``)."""
        return plan_contract.chargeback(self, output_weight)

    @property
    def production_mix_lower(self) -> bool:
        """Does production's mix (reweighted or through the twin) give less than the tested mix?"""
        return any(c.get("production_lower") for c in self.mix_comparison)

    def item(self, key: str) -> LineItem:
        for it in self.items:
            if it.key == key:
                return it
        raise KeyError(key)

    def value(self, key: str) -> float:
        return self.item(key).value

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_frame(self):
        """Line items: item, value, unit, formula, inputs, key."""
        import pandas as pd

        return pd.DataFrame(
            [{"item": it.name, "value": it.value, "unit": it.unit, "formula": it.formula,
              "inputs": it.inputs_text(), "key": it.key} for it in self.items],
            columns=["item", "value", "unit", "formula", "inputs", "key"])

    def checks_frame(self):
        import pandas as pd

        return pd.DataFrame([{"check": c.sentence, "ok": c.ok, "caveat": c.caveat, "key": c.key}
                             for c in self.checks], columns=["check", "ok", "caveat", "key"])

    def quarters_frame(self):
        """One row per quarter, dated: peak and planned demand, groups, GPUs (in groups and
        billed), nodes, cost per month/quarter/year (the year at this quarter's size), cost per
        1 000 SLO-meeting requests; with a forecast also its mean and interval low."""
        import pandas as pd

        cols = ["quarter", "start", "end", "peak_rps", "demand_rps", "groups", "gpus", "billed_gpus",
                "nodes", "cost_usd_per_month", "cost_usd_per_quarter", "cost_usd_per_year",
                "cost_usd_per_1k_good_requests"]
        if self.forecast is not None:
            cols += ["forecast_mean_rps", "forecast_lower_rps"]
        rows = []
        for q in self.quarters:
            month = q.cost_usd_per_month if q.cost_usd_per_month is not None else q.cost_usd_per_quarter / 3
            row = [q.label, q.start, q.end, q.peak_rps, q.demand_rps, q.groups, q.gpus, q.billed_gpus,
                   q.nodes, month, q.cost_usd_per_quarter, 12 * month, q.cost_usd_per_1k_good_requests]
            if self.forecast is not None:
                row += [q.forecast_mean_rps, q.forecast_lower_rps]
            rows.append(row)
        return pd.DataFrame(rows, columns=cols)

    def months_frame(self):
        """One row per month of the horizon (the fleet of its quarter): month, first day,
        quarter, billed GPUs, cost."""
        return plan_text.months_frame(self)

    def years_frame(self):
        """Totals per plan year (4 quarters from the start; a shorter last year is labelled
        so) and over the horizon."""
        return plan_text.years_frame(self)

    def assumptions_frame(self):
        """assumption, value (a number or text), unit, note."""
        return plan_text.assumptions_frame(self)

    @property
    def summary(self) -> str:
        """A few sentences a reviewer reads first."""
        g = self.value("total_groups")
        billed, gpus = self.value("billed_gpus"), self.value("total_gpus")
        when = ""
        if self.quarters and self.quarters[0].start is not None:
            q = self.quarters[0]
            when = f" in {q.label} ({_period(q).text})"
        lines = [
            f"{self.spec.name}{when}: {plural(g, 'replica group')} of {self.value('gpus_per_group'):.0f} GPUs = "
            f"{gpus:.0f} GPUs on {plural(self.value('nodes'), 'node')}"
            + (f" ({billed:.0f} GPUs billed: whole nodes)" if billed != gpus else "")
            + f", for a peak demand of {self.value('peak_rps'):.4g} req/s planned at "
            f"{self.value('demand_rps'):.4g} req/s (+{self.spec.demand.uncertainty:.0%} uncertainty"
            + (f", {self.spec.demand.uncertainty_source}" if self.spec.demand.backtested else "")
            + (f", × burst factor {self.burst.factor:.4g}" if self.burst is not None else "") + "), "
            f"at {self.capacity.rps_per_group:.4g} req/s per group ({self.capacity.source}).",
            f"Cost ${self.value('cost_usd_per_month'):,.0f} per month, "
            f"${self.value('cost_usd_per_quarter'):,.0f} per quarter, "
            f"${self.value('cost_usd_per_year'):,.0f} per year at this size; "
            f"${self.value('cost_usd_per_1k_good_requests'):,.2f} per 1 000 SLO-meeting requests.",
            f"Utilisation at peak {self.value('utilisation_at_peak_pct'):.1f} %; "
            + ("all checks pass." if self.ok else
               "FAILED checks: " + "; ".join(c.sentence for c in self.checks if not c.ok)),
        ]
        mix = [c["sentence"] for c in self.mix_comparison]
        if self.burstier_than_tested:  # said first: the peak is sized beyond anything tested
            lines = ["Production is burstier than the sweep — " + self.burst.sentence + "."] + lines
        if self.production_mix_lower:  # said first: the plan may be sized on the higher number
            return "\n".join(mix + lines)
        return "\n".join(lines + mix)

    def summary_frame(self):
        import pandas as pd

        rows = []
        for k in SUMMARY_KEYS:
            try:
                it = self.item(k)
            except KeyError:
                continue
            rows.append({"quantity": it.name, "value": it.value, "unit": it.unit, "key": it.key})
        return pd.DataFrame(rows, columns=["quantity", "value", "unit", "key"])

    def about(self) -> list[tuple[str, str]]:
        """What the plan is, in words (label, text): name, tenant, period, SLO, capacity used,
        failure policy, rollout, prices, checks. Each report and export states these, so two
        plans with different specs never look alike."""
        return plan_text.about(self)

    def figure(self):
        """Waterfall of replica groups: traffic, failure, rollout, cold start, warm floor."""
        import plotly.graph_objects as go

        parts = [("traffic", "traffic_groups"), ("failure reserve", "failure_reserve_groups"),
                 ("rollout overlap", "rollout_overlap_groups"), ("cold start", "cold_start_reserve_groups"),
                 ("warm floor", "warm_floor_topup_groups")]
        x = [p for p, _ in parts] + ["total"]
        y = [self.value(k) for _, k in parts] + [self.value("total_groups")]
        fig = go.Figure(go.Waterfall(x=x, y=y, measure=["relative"] * len(parts) + ["total"],
                                     text=[f"{v:.0f}" for v in y], textposition="outside"))
        fig.update_layout(title=f"{self.spec.name}: replica groups at peak "
                                f"{self.value('peak_rps'):.4g} req/s", yaxis_title="replica groups",
                          showlegend=False, template="plotly_white")
        return fig

    def to_text(self) -> str:
        """Plain-text plan for the terminal: summary, line items, checks, notes."""
        w = max(len(it.name) for it in self.items)
        out = [self.contract().to_text(), "", self.summary, "", "Line items:"]
        for it in self.items:
            out.append(f"  {it.name:<{w}}  {_fmt(it.value):>14} {it.unit:<16} = {it.formula}")
        out += ["", "Checks:"]
        out += [f"  [{'ok' if c.ok else 'FAIL'}] {c.sentence}" + (f" (caveat: {c.caveat})" if c.caveat else "")
                for c in self.checks]
        if self.quarters:
            out += ["", "By quarter:"]
            for q in self.quarters:
                dates = f" ({_period(q).text})" if q.start is not None else ""
                out.append(f"  {q.label}{dates}: peak {q.peak_rps:.4g} req/s → {plural(q.groups, 'group')}, "
                           f"{q.gpus} GPUs ({q.billed_gpus} billed), {plural(q.nodes, 'node')}, "
                           f"${q.cost_usd_per_quarter:,.0f} per quarter")
        if self.notes:
            out += ["", "Notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(out)


#: the line items of the Summary sheet and the plan's headline, in order
SUMMARY_KEYS = ("peak_rps", "demand_rps", "capacity_rps_per_group", "total_groups", "total_gpus",
                "billed_gpus", "nodes", "utilisation_at_peak_pct", "cost_usd_per_month",
                "cost_usd_per_quarter", "cost_usd_per_year", "cost_usd_per_1k_good_requests",
                "cost_usd_per_1m_good_output_tokens", "energy_wh_per_good_request",
                "fleet_energy_wh_per_good_request")


def _period(q: QuarterPlan) -> Period:
    return Period(q.label, q.start, q.end)


def _fmt(v) -> str:
    """A line item's value or input: integers whole, others to 6 significant digits, a missing
    one as ``present.MISSING``."""
    if is_missing(v):
        return MISSING
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return f"{v:d}"
    if isinstance(v, float):
        if math.isinf(v):
            return str(v)
        if v.is_integer() and abs(v) < 1e15:
            return f"{v:.0f}"
        if abs(v) >= 1e5:
            return f"{v:.0f}"
        return f"{v:.6g}"
    return str(v)
