"""Capacity plans: from a capacity (C_SLO) and a demand to groups, GPUs, nodes, cost and energy.

A plan is a pure function of a validated :class:`PlanSpec` (see ``templates/plan.yaml``), a
capacity per replica group, and optionally per-level facts of the study it was measured on.
The spec itself (its sections, YAML loading and validation) lives in :mod:`capplan.plan.spec`;
its public names are re-exported here, so ``from capplan.plan import PlanSpec`` keeps working.
Every number is a :class:`LineItem` carrying its formula and the inputs used, so a finance
reader can redo it by hand and a test can check it. Given a capacity number (or precomputed
``facts``/``forecast``), :func:`make_plan` runs in about a millisecond, so the what-if panel
calls it on every slider move::

    spec = load_plan_spec("templates/plan.yaml")
    plan = make_plan(spec, capacity=42.0)                 # req/s per replica group
    plan2 = make_plan(spec.with_(peak_rps=500, policy="zone", price_usd_per_gpu_hour=2.1),
                      capacity=42.0)

``PlanSpec.with_`` takes the flat names listed in ``PlanSpec.ALIASES`` (or nested sections via
``dataclasses.replace``) and validates again.

Sizing (all in whole replica groups; D = λ_peak·(1+u), C = C_SLO per group):

1. traffic groups            N1 = ⌈D / C⌉
2. failure reserve           N2 = smallest N ≥ N1 with (N − L(N))·C ≥ D, L(N) = groups lost
                              with the largest allowed failure domain (groups spread evenly over
                              zones, then evenly over the nodes of a zone; a group spanning
                              several nodes is lost with any of them)
3. rollout overlap           N3 = smallest N ≥ N2 + r with (N − L(N) − r)·C ≥ D, r = groups out
                              of service in the worst rollout step = max(max_unavailable,
                              canary_groups − max_surge); surge groups are temporary extra GPUs
4. cold-start reserve        N4 = smallest N ≥ N3 + ⌈b·T / C⌉ with (N − L(N) − r)·C ≥ D + b·T,
                              b = burst growth (req/s per s), T = replica ready time (sum of parts)
5. warm floor                N  = max(N4, warm floor)

Each later step keeps the earlier conditions (a domain may fail during a rollout while demand
grows), so adding groups that enlarge the largest zone is accounted for.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .. import cost as K
from . import bounds as plan_bounds
from ..errors import CapplanError, SpecError
from .periods import Period, next_quarter_start, quarter_from_label, reference_day
from .periods import quarters as quarters_from
from . import contract as plan_contract, text as plan_text
from .text import plural, policy_text  # noqa: F401  (policy_text re-exported)
from .text import assumptions as assumption_rows
from .spec import (  # noqa: F401  (the spec names are re-exported from capplan.plan)
    BILLING, CAPACITY_USES, POLICIES, READY_PARTS, AutoscalingSpec, CapacitySpec, DemandSpec,
    FailureSpec, GroupSpec, PlanSpec, PriceSpec, RolloutSpec, load_plan_spec)
from ..slo import SLO
from ..spec import number

_EPS = 1e-9  # relative tolerance when dividing rates (380/47.5 must be 8, not 8.000000001)
_MAX_GROUPS = 10_000_000


# ----------------------------------------------------------------------------- results


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
class CapacityInfo:
    """The capacity a plan uses, with its CI when it came from a study."""

    rps_per_group: float
    source: str  # "given" | "study lower bound" | "study estimate" | "envelope ..."
    unit: str = "req/s"
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    lower_bound: float | None = None
    confidence: float | None = None
    status: str | None = None
    study_replicas: int = 1
    study_name: str | None = None
    study_hash: str | None = None
    notes: tuple[str, ...] = ()
    #: extra tables for the export, (sheet name, frame): SLO classes, production mix (docs/mix.md)
    tables: tuple = field(default=(), compare=False, hash=False)
    #: which C_SLO the plan stands on: "tested mix", "target mix (reweighted, peak_hour)",
    #: "target mix (twin, peak_hour)", "SLO classes" (empty for a given number)
    basis: str = ""
    #: the honesty verdict on that number (``Honesty.to_dict`` + "basis"; docs/plan.md,
    #: "Honest numbers only"); None for a given number or an envelope without a verdict
    honesty: dict | None = field(default=None, compare=False, hash=False)
    #: the study's other C_SLO numbers for this plan (tested vs production mix), per group:
    #: ({"basis", "rps_per_group", "status", "sentence"}, …); ``make_plan`` re-sizes the plan on each
    alternatives: tuple = field(default=(), compare=False, hash=False)

    def to_frame(self):
        import pandas as pd

        r = self.study_replicas or 1
        conf = f"{self.confidence:.0%}" if self.confidence else ""
        rows = [("capacity per replica group C (used by the plan)", self.rps_per_group, self.unit,
                 self.source)]
        if self.estimate is not None or self.lower_bound is not None:
            rows += [
                ("C_SLO estimate (study system)", self.estimate, self.unit,
                 f"status: {self.status}" if self.status else ""),
                (f"C_SLO {conf} interval, low end (study system)", self.ci_low, self.unit,
                 f"two-sided: 2.5th percentile of the bootstrap" if conf == "95%" else "two-sided"),
                (f"C_SLO {conf} interval, high end (study system)", self.ci_high, self.unit, "two-sided"),
                ("C_SLO lower bound (study system)", self.lower_bound, self.unit,
                 f"one-sided {conf}: the planning number; above the interval's low end because only "
                 "one side is excluded"),
                ("replicas in the study system", float(r), "replicas",
                 "study system values ÷ replicas = per replica group"),
            ]
        return pd.DataFrame(rows, columns=["quantity", "value", "unit", "note"])


@dataclass(frozen=True)
class Sizing:
    """The integer sizing of one demand (shared by the main plan and each quarter)."""

    demand_rps: float
    need_traffic: int
    n_failure: int
    n_rollout: int
    n_cold: int
    total: int
    loss_failure: int
    loss_rollout: int
    nodes: int
    zone_groups: tuple[int, ...]


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
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return f"{v:d}"
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        if v.is_integer() and abs(v) < 1e15:
            return f"{v:.0f}"
        if abs(v) >= 1e5:
            return f"{v:.0f}"
        return f"{v:.6g}"
    return str(v)


# ----------------------------------------------------------------------------- sizing


def _ceil_div(a: float, b: float) -> int:
    """⌈a/b⌉ tolerant to float noise (380/47.5 → 8)."""
    q = a / b
    return int(math.ceil(q - _EPS * max(1.0, abs(q))))


def zone_spread(groups: int, zones: int) -> tuple[int, ...]:
    """Groups spread evenly over zones; the first ``groups mod zones`` zones hold one more."""
    base, extra = divmod(groups, zones)
    return tuple(base + (1 if i < extra else 0) for i in range(zones))


def nodes_for(groups_in_zone: int, gpus_per_group: int, gpus_per_node: int) -> int:
    """Nodes of one zone. Groups that fit on a node share nodes (⌊n/g⌋ per node); a group
    larger than a node takes ⌈g/n⌉ nodes of its own."""
    if groups_in_zone <= 0:
        return 0
    if gpus_per_group <= gpus_per_node:
        return -(-groups_in_zone // (gpus_per_node // gpus_per_group))
    return groups_in_zone * -(-gpus_per_group // gpus_per_node)


def failure_loss(groups: int, failure: FailureSpec, gpus_per_group: int, gpus_per_node: int) -> int:
    """Groups lost with the largest allowed failure domain when ``groups`` are spread evenly
    over the zones and, within the largest zone, evenly over its nodes."""
    if groups <= 0 or failure.policy == "none":
        return 0
    if failure.policy == "n_plus_k":
        return min(failure.k, groups)
    z = len(failure.zones)
    gmax = -(-groups // z)
    if failure.policy == "zone":
        return gmax
    if gpus_per_group > gpus_per_node:  # spans nodes exclusively: one node takes one group
        return 1
    nodes = nodes_for(gmax, gpus_per_group, gpus_per_node)
    return -(-gmax // nodes)


def size(demand_rps: float, capacity_rps: float, spec: PlanSpec, gpus_per_group: int) -> Sizing:
    """Integer sizing for one planned demand D (req/s, uncertainty included)."""
    n = spec.group.gpus_per_node
    fail, roll, auto = spec.failure, spec.rollout, spec.autoscaling
    r = roll.loss_groups
    burst = auto.burst_growth_rps_per_s * auto.ready_s

    def loss(N):
        return failure_loss(N, fail, gpus_per_group, n)

    def smallest(start, need):
        N = max(start, need)
        if fail.policy == "zone":  # N − ⌈N/Z⌉ = ⌊N(Z−1)/Z⌋ ≥ need  ⇔  N ≥ need·Z/(Z−1)
            z = len(fail.zones)
            N = max(N, -(-need * z // (z - 1)) - 1)
        while N - loss(N) < need:
            N += 1
            if N > _MAX_GROUPS:
                raise SpecError("the plan needs more than 10 million replica groups", field="demand.peak_rps",
                                fix="check the peak rate and the capacity units (req/s per group)")
        return N

    need = _ceil_div(demand_rps, capacity_rps)
    n1 = need
    n2 = smallest(n1, need)
    n3 = smallest(n2 + r, need + r)
    cold = _ceil_div(burst, capacity_rps) if burst > 0 else 0
    n4 = smallest(n3 + cold, _ceil_div(demand_rps + burst, capacity_rps) + r)
    total = max(n4, auto.warm_floor_groups)
    zg = zone_spread(total, len(fail.zones))
    nodes = sum(nodes_for(g, gpus_per_group, n) for g in zg)
    return Sizing(demand_rps=demand_rps, need_traffic=n1, n_failure=n2, n_rollout=n3, n_cold=n4, total=total,
                  loss_failure=loss(total), loss_rollout=r, nodes=nodes, zone_groups=zg)


# ----------------------------------------------------------------------------- capacity


def capacity_from_envelope(envelope, spec: PlanSpec, *, replicas: int = 1, study_name=None,
                           study_hash=None, basis: str = "tested mix") -> CapacityInfo:
    """Per-group capacity from a fitted envelope's ``cslo`` (lower bound by default) — the
    headline envelope, the target mix's reweighted one or an SLO-class fit (``basis`` names it).

    A lower bound the study cannot support honestly (``envelope.honesty.status`` not
    "honest") is refused unless ``capacity.accept_optimistic`` — then the plan says so. The
    same rule for every path (docs/plan.md, "Honest numbers only")."""
    c = envelope.cslo
    use = spec.capacity.use
    value = getattr(c, use, None)
    at = f" at the {basis}" if basis.startswith("target") else (" with every SLO class" if basis == "SLO classes"
                                                                  else "")
    if value is None or not (value > 0) or not math.isfinite(value):
        status = getattr(c, "status", "unknown")
        h = getattr(envelope, "honesty", None)
        runs = "; ".join(r.describe() for r in h.runs_to_add) if h is not None else ""
        raise SpecError(
            f"the study gives no usable C_SLO {use.replace('_', ' ')}{at} (status: {status}, value: {value})"
            + (": this sweep cannot support a lower bound here" if h is not None and not h.honest else ""),
            field="capacity.use",
            fix=(f"add these runs ({runs}; `capplan design` costs them), " if runs else
                 "test lower and higher offered rates so the SLO crossing is bracketed, ")
            + "or plan on the estimate (--use estimate / capacity.use: estimate, which makes no "
              "lower-bound claim), or pass --capacity-rps / capacity.rps_per_group")
    h = getattr(envelope, "honesty", None)
    notes = tuple(getattr(envelope, "notes", ()) or ())
    label = f"study C_SLO {'lower bound' if use == 'lower_bound' else 'estimate'}"
    if use == "lower_bound" and h is not None and not h.honest:
        add = "; ".join(r.describe() for r in h.runs_to_add)
        if not spec.capacity.accept_optimistic:
            raise SpecError(
                f"the study's C_SLO lower bound{at} ({value:.4g} {getattr(c, 'unit', 'req/s')}) is "
                f"not an honest lower bound ({h.status}): {h.sentence}. "
                + " ".join(f"Why: {r}." for r in h.reasons),
                field="capacity.accept_optimistic",
                fix=("add these runs (capplan design plans them): " + add + "; or " if add
                     else "") + "plan with it anyway: --accept-optimistic (capplan plan / "
                "report) or capacity.accept_optimistic: true — the plan then says so")
        label += f" ({h.status}: accepted with accept_optimistic)"
        notes = notes + (f"the C_SLO lower bound{at} is {h.status} — {h.sentence}; planned with "
                         "it anyway (accept_optimistic)",) + tuple(h.reasons)
    return CapacityInfo(
        basis=basis, honesty=None if h is None else {**h.to_dict(), "basis": basis},
        notes=notes,
        rps_per_group=float(value) / replicas,
        source=label + (f" ÷ {replicas} replicas" if replicas != 1 else ""),
        unit=getattr(c, "unit", "req/s") or "req/s",
        estimate=_opt(getattr(c, "estimate", None)), ci_low=_opt(getattr(c, "ci_low", None)),
        ci_high=_opt(getattr(c, "ci_high", None)), lower_bound=_opt(getattr(c, "lower_bound", None)),
        confidence=_opt(getattr(c, "confidence", None)), status=str(getattr(c, "status", "") or ""),
        study_replicas=replicas, study_name=study_name, study_hash=study_hash)


def _opt(v):
    return None if v is None else float(v)


def resolve_capacity(spec: PlanSpec, capacity=None, *, study=None, envelope=None,
                     slo: SLO | None = None) -> CapacityInfo:
    """Capacity per group: an explicit number (or CapacityInfo) wins; then the number the spec
    plans on — SLO classes, the target mix reweighted (``mix.plan_on: target``) or through the
    twin (``twin``), fitted on the study — else ``envelope`` or a fit on the study (the tested
    mix), else ``capacity.rps_per_group``. Every study number carries its honesty verdict and
    is refused when not honest (``capacity_from_envelope``); with a target mix the other mix's
    number rides along (``CapacityInfo.alternatives``) so the plan can say what it would cost."""
    if isinstance(capacity, CapacityInfo):
        return capacity
    if capacity is not None:
        v = number(capacity, "capacity.rps_per_group", above=0.0, example="42")
        return CapacityInfo(rps_per_group=v, source="given")
    replicas = study.manifest.replicas if study is not None else 1
    name = study.name if study is not None else None
    classes = spec.slo_classes is not None and slo is None
    on_mix = spec.mix.target is not None and spec.mix.plan_on in ("target", "twin")
    if spec.capacity.source == "study" and (classes or on_mix) and study is None:
        raise SpecError(f"planning on {'the SLO classes' if classes else 'the target mix'} needs the study",
                        field="mix.plan_on" if on_mix else "slo_classes",
                        fix="pass the study directory, or plan on the tested mix (mix.plan_on: tested)")
    if spec.capacity.source == "study" and study is not None and (classes or on_mix):
        if classes:
            if on_mix:
                raise SpecError("planning at a target mix with SLO classes is not supported yet",
                                field="mix.plan_on", fix="plan the classes at the tested mix (mix.plan_on: "
                                                         "tested), or one SLO at the target mix")
            return capacity_for_classes(spec, study)
        if slo is None:
            raise SpecError("a capacity from a study needs an SLO", field="slo",
                            fix="add slo: 'ttft_ms=2000,attainment=0.99' to the spec or pass --slo")
        if spec.mix.plan_on == "twin":
            return capacity_at_twin(spec, study, slo)
        return capacity_at_mix(spec, study, slo)
    if envelope is not None:
        cap = capacity_from_envelope(envelope, spec, replicas=replicas, study_name=name)
        return _with_target_alternative(cap, spec, study, slo)
    if spec.capacity.source == "number":
        return CapacityInfo(rps_per_group=float(spec.capacity.rps_per_group), source="given in the spec")
    if study is None:
        raise SpecError("capacity.source is study but no study was given", field="capacity.source",
                        fix="pass a study directory (capplan plan STUDY ...), or a number with "
                            "--capacity-rps / capacity.rps_per_group")
    if slo is None:
        raise SpecError("a capacity from a study needs an SLO", field="slo",
                        fix="add slo: 'ttft_ms=2000,attainment=0.99' to the spec or pass --slo")
    from ..envelope import fit_envelope  # built by the envelope module

    env = fit_envelope(study, slo, confidence=spec.capacity.confidence, reps=spec.capacity.reps,
                       seed=spec.capacity.seed)
    cap = capacity_from_envelope(env, spec, replicas=replicas, study_name=name)
    return _with_target_alternative(cap, spec, study, slo)


def _mix_fit(spec: PlanSpec, study, slo: SLO):
    """The study reweighted to the spec's target mix (``capplan.mix.reweight.fit_mix``)."""
    from ..mix import Buckets, load_target
    from ..mix.reweight import fit_mix

    m, c = spec.mix, spec.capacity
    b = Buckets(input_edges=m.input_edges, output_edges=m.output_edges, tenant="tenant" in m.by,
                slo_class="slo_class" in m.by)
    target = load_target(m.target, b, period=m.period)
    return fit_mix(study, slo, target, confidence=c.confidence, reps=c.reps, seed=c.seed,
                   drop_untested=m.drop_untested)


def _alternative(basis: str, cslo, honesty, spec: PlanSpec, replicas: int) -> dict | None:
    """Another C_SLO of this plan (per group, the number ``capacity.use`` names) with its
    verdict (a ``capplan.honesty.Honesty`` or None)."""
    v = getattr(cslo, spec.capacity.use, None)
    if v is None or not (v > 0) or not math.isfinite(v):
        return None
    return {"basis": basis, "rps_per_group": float(v) / (replicas or 1), "rps_system": float(v),
            "status": honesty.status if honesty is not None else "no verdict",
            "sentence": honesty.sentence if honesty is not None else ""}


def _with_target_alternative(cap: CapacityInfo, spec: PlanSpec, study, slo) -> CapacityInfo:
    """A tested-mix capacity with the target mix's reweighted number beside it (``mix.target``
    set, ``plan_on: tested``); a target the study cannot reweight to is said in the notes."""
    if spec.mix.target is None or study is None or slo is None or spec.capacity.source != "study":
        return cap
    try:
        fit = _mix_fit(spec, study, slo)
    except CapplanError as exc:  # the tested-mix plan stands; why the other number is missing is said
        return dataclasses.replace(cap, notes=tuple(cap.notes) + (
            f"the target mix ({spec.mix.target}) was not reweighted: {getattr(exc, 'message', exc)}",))
    alt = _alternative(f"target mix (reweighted, {fit.target.period})", fit.cslo, fit.envelope.honesty, spec,
                       study.manifest.replicas)
    return dataclasses.replace(cap, alternatives=tuple(a for a in (alt,) if a))


def capacity_for_classes(spec: PlanSpec, study, fit=None) -> CapacityInfo:
    """Per-group capacity where every SLO class meets its own target (docs/mix.md, "SLO
    classes"): the joint C_SLO of ``capplan.mix.classes.fit_classes``, binding class named,
    refused like any other number when its bound is not honest (``ClassFit.honesty``)."""
    if fit is None:
        from ..mix.classes import fit_classes

        c = spec.capacity
        fit = fit_classes(study, spec.slo_classes, confidence=c.confidence, reps=c.reps, seed=c.seed)
    cap = capacity_from_envelope(fit, spec, replicas=study.manifest.replicas, study_name=study.name,
                                 basis="SLO classes")
    binding = f"; binding class {fit.binding_class}" if fit.binding_class else ""
    return dataclasses.replace(cap, source=cap.source + f" (every SLO class meets its target{binding})",
                               tables=(("SLO classes", fit.to_frame()),))


def capacity_at_mix(spec: PlanSpec, study, slo: SLO, fit=None) -> CapacityInfo:
    """Per-group capacity at production's mix (``mix:`` in the spec): the study's per-cell
    attainment reweighted to the target (docs/mix.md, "Reweighting"), with the run-to-run
    variation and honesty verdict of the headline envelope; the tested mix rides along."""
    if fit is None:
        fit = _mix_fit(spec, study, slo)
    basis = f"target mix (reweighted, {fit.target.period})"
    cap = capacity_from_envelope(fit.envelope, spec, replicas=study.manifest.replicas, study_name=study.name,
                                 basis=basis)
    t = fit.base.cslo
    r = study.manifest.replicas or 1
    notes = tuple(cap.notes) + tuple(fit.notes) + (
        f"C_SLO at the tested mix: {t.estimate:.4g} req/s (lower bound {t.lower_bound:.4g}) for the study system; "
        f"at the target mix ({fit.target.period}): {fit.cslo.estimate:.4g} (lower bound {fit.cslo.lower_bound:.4g}); "
        f"effective sample size {fit.ess:,.0f} requests ({fit.ess_share:.0%} of those tested)",)
    mix_table = fit.cells.drop(columns=["cell"]).copy()
    mix_table["tested_mix_cslo_per_group"] = t.lower_bound / r if spec.capacity.use == "lower_bound" else t.estimate / r
    alt = _alternative("tested mix", t, fit.base.honesty, spec, r)
    return dataclasses.replace(cap, source=cap.source + f" at the target mix ({fit.target.period} of "
                                                        f"{fit.target.source})", notes=notes,
                               tables=(("Production mix", mix_table),), alternatives=tuple(a for a in (alt,) if a))


@dataclass(frozen=True)
class _Fitted:
    """A fitted C_SLO in the shape ``capacity_from_envelope`` reads (the twin's)."""

    cslo: Any
    honesty: Any
    notes: tuple = ()


def twin_bound(steady, confidence: float = 0.95) -> float:
    """One-sided lower bound of a twin's C_SLO: estimate − z·SE, the SE read back from its
    ± 1.96 SE interval (docs/mix.md, "The twin at the target mix")."""
    from scipy.stats import norm

    se = (steady.ci_high - steady.estimate) / 1.959964
    return float(steady.estimate - norm.ppf(confidence) * se) if math.isfinite(se) else math.nan


def capacity_at_twin(spec: PlanSpec, study, slo: SLO, fit=None, twinmix=None) -> CapacityInfo:
    """Per-group capacity at production's mix through the calibrated twin (``mix.plan_on:
    twin``, ``mix.twin``): the twin's C_SLO at the target mix, load effect included. Its bound
    is **unsupported** as a lower bound (docs/mix.md: its interval covered 18 of 20 sweeps, CP
    0.68–0.99, and leaves out the cells' length sampling error), so the plan refuses it without
    ``capacity.accept_optimistic``, as any other unsupported number."""
    from .. import honesty as hon

    if fit is None:
        fit = _mix_fit(spec, study, slo)
    if twinmix is None:
        from ..mix.loadeffect import twin_mix

        c = spec.capacity
        twinmix = twin_mix(spec.mix.twin, study, slo, fit.target, mixfit=fit, seed=c.seed,
                           drop_untested=spec.mix.drop_untested)
    w = twinmix.at_target
    lb = twin_bound(w, spec.capacity.confidence)
    from ..envelope import CSLO

    cslo = CSLO(estimate=w.estimate, ci_low=w.ci_low, ci_high=w.ci_high, lower_bound=lb, status="simulated",
                confidence=spec.capacity.confidence)
    h = hon.Honesty(hon.UNSUPPORTED, f"the twin's C_SLO at the target mix ({fit.target.period}) under the study's "
                                     "run protocol", "the twin's interval is not a measured, honest lower bound",
                    ("the twin's interval holds its Monte-Carlo error and parameter uncertainty, not the sampling "
                     "error of the cells' lengths nor what the twin cannot model; it covered the truth in 18 of 20 "
                     "sweeps (Clopper–Pearson 0.68–0.99): docs/mix.md, \"The twin at the target mix\"",), ())
    src = _Fitted(cslo=cslo, honesty=h, notes=tuple(twinmix.notes))
    basis = f"target mix (twin, {fit.target.period})"
    r = study.manifest.replicas or 1
    cap = capacity_from_envelope(src, spec, replicas=r, study_name=study.name, basis=basis)
    alts = [_alternative("tested mix", fit.base.cslo, fit.base.honesty, spec, r),
            _alternative(f"target mix (reweighted, {fit.target.period})", fit.cslo, fit.envelope.honesty, spec, r)]
    words = twinmix.in_words()
    return dataclasses.replace(cap, source=cap.source + f" from the twin {twinmix.twin_name!r} at the target mix "
                                                        f"({fit.target.period} of {fit.target.source})",
                               notes=tuple(cap.notes) + (words,), alternatives=tuple(a for a in alts if a))


# ----------------------------------------------------------------------------- the plan


def make_plan(spec: PlanSpec, capacity=None, *, study=None, envelope=None, slo=None, facts=None,
              forecast=None, gpus_per_group: int | None = None, system: dict | None = None,
              as_of=None, burst_inputs: tuple | None = None) -> Plan:
    """Build the plan. ``capacity``: req/s per replica group (number or CapacityInfo);
    otherwise from ``envelope`` or a fit on ``study``. ``facts`` (``cost.study_facts``) and
    ``forecast`` (``forecast.forecast_peaks``) may be passed precomputed so repeated calls
    (what-if sliders) stay fast; otherwise they are computed from ``study`` / the history.
    ``system``: the study's ``system`` mapping (model, gpu) when ``study`` is not passed.
    Quarters are dated from the spec's ``start``, else from the calendar quarter after
    ``as_of`` (date or ISO time, e.g. the export time; default today, UTC). ``burst_inputs``:
    (production's ``BurstMeasure``, tested runs' dispersions, where from) for
    ``demand.arrivals``, precomputed by :func:`prepare_plan` (or ``Plan.burst_inputs`` for a
    re-plan); otherwise measured from the spec and ``study``."""
    spec = load_plan_spec(spec)
    slo = _plan_slo(spec, slo, envelope)
    cap = resolve_capacity(spec, capacity, study=study, envelope=envelope, slo=slo)
    C = cap.rps_per_group
    notes: list[str] = [f"C_SLO: {n}" for n in cap.notes]

    g = _gpus_per_group(spec, study) if gpus_per_group is None or study is not None else int(gpus_per_group)
    if spec.group.gpus is not None and study is None and gpus_per_group is not None and spec.group.gpus != g:
        raise SpecError(f"replica_group says {spec.group.gpus} GPUs per replica but the capacity was measured "
                        f"with {g}", field="replica_group.gpus_per_replica",
                        fix="remove gpus_per_replica/tp/pp from the spec or plan with a matching study")
    n_node = spec.group.gpus_per_node
    if g > n_node and g % n_node:
        notes.append(f"a group of {g} GPUs spans {-(-g // n_node)} nodes of {n_node} GPUs and leaves "
                     f"{-(-g // n_node) * n_node - g} GPUs of them idle (nodes are not shared by spanning groups)")
    if g <= n_node and n_node % g:
        notes.append(f"{n_node // g} groups of {g} GPUs fit a node of {n_node}; {n_node % g} GPUs per node stay idle")

    if facts is None and study is not None and (slo is not None or spec.slo_classes is not None):
        facts = K.study_facts(study, slo if slo is not None else spec.slo_classes)
    if facts is not None:
        notes.extend(facts.notes)

    # demand per quarter
    d = spec.demand
    if d.history:
        if forecast is None:
            from .forecast import forecast_peaks_from_file

            forecast = forecast_peaks_from_file(d.history, time_column=d.history_time_column,
                                                rate_column=d.history_rate_column,
                                                horizon_quarters=d.horizon_quarters, interval=d.interval)
        q_labels = list(forecast.labels)
        q_periods = [quarter_from_label(x) for x in q_labels]
        q_peaks = [float(x) for x in forecast.upper]
        q_means = [float(x) for x in forecast.mean]
        q_lows = [float(x) for x in forecast.lower]
        peak_formula = (f"upper bound of the {d.interval:.0%} forecast interval of the quarter's peak "
                        f"(statsmodels {forecast.model})")
        peak_inputs = {"quarter": q_labels[0], "forecast_mean_rps": q_means[0], "interval": d.interval}
        mean_to_peak_default = forecast.mean_to_peak
    else:
        first = spec.start or next_quarter_start(reference_day(as_of))
        if spec.start is None:
            notes.append(f"the plan starts on {first.isoformat()}, the first day of the calendar quarter "
                         f"after {reference_day(as_of).isoformat()} (set start: in the spec to choose)")
        q_periods = list(quarters_from(first, d.horizon_quarters))
        q_labels = [q.label for q in q_periods]
        base_peak = d.total_peak_rps
        if d.tokens_per_day:  # work units: a daily token volume → requests (docs/mix.md)
            base_peak, peak_formula, peak_inputs, tok_notes = plan_bounds.peak_from_tokens(d, facts)
            notes.extend(tok_notes)
        elif len(d.peak_rps) > 1:
            peak_formula = "Σ class peaks (" + " + ".join(f"{c} {r:g}" for c, r in d.peak_rps) + ")"
            peak_inputs = {f"peak_rps.{c}": r for c, r in d.peak_rps}
        else:
            peak_formula = "peak demand from the spec"
            peak_inputs = {"peak_rps": d.total_peak_rps}
        q_peaks = [base_peak * (1.0 + d.growth_per_quarter) ** i for i in range(d.horizon_quarters)]
        q_means = [None] * d.horizon_quarters
        q_lows = [None] * d.horizon_quarters
        mean_to_peak_default = None

    if system is None and study is not None:
        system = dict(study.manifest.system or {})
    bursts = _bursts(spec, study, burst_inputs, q_peaks)
    if bursts[0] is not None:
        notes.append("arrivals: " + bursts[0].sentence)
    ctx = _Ctx(spec=spec, cap=cap, g=g, slo=slo, facts=facts, system=system, burst=bursts[0])
    items, checks = _items_for(ctx, q_peaks[0], peak_formula, peak_inputs, notes,
                                     mean_to_peak_default)
    quarters = []
    for period, peak, mean, low, bq in zip(q_periods, q_peaks, q_means, q_lows, bursts):
        D_q = peak * (1 + d.uncertainty) * (bq.factor if bq is not None else 1.0)
        s = size(D_q, C, spec, g)
        c = _costs(ctx, s, peak, mean_to_peak_default)
        quarters.append(QuarterPlan(label=period.label, peak_rps=peak, forecast_mean_rps=mean, groups=s.total,
                                    gpus=s.total * g, nodes=s.nodes, billed_gpus=c["billed_gpus"],
                                    cost_usd_per_quarter=c["cost_month"] * K.MONTHS_PER_QUARTER,
                                    cost_usd_per_1k_good_requests=c["per_1k"], forecast_lower_rps=low,
                                    start=period.start, end=period.end, demand_rps=D_q,
                                    cost_usd_per_month=c["cost_month"]))
    assumptions = assumption_rows(spec, cap, facts, mean_to_peak_default)
    plan = Plan(spec=spec, capacity=cap, items=tuple(items), checks=tuple(checks), quarters=tuple(quarters),
                assumptions=tuple(assumptions), notes=tuple(dict.fromkeys(notes)), slo=slo, forecast=forecast,
                facts=facts, gpus_per_group=g, as_of=reference_day(as_of), burst=bursts[0],
                workload=plan_contract.study_workload(study) if study is not None else None)
    if cap.alternatives and not isinstance(capacity, CapacityInfo):  # a given CapacityInfo: a re-plan
        plan = dataclasses.replace(plan, mix_comparison=compare_numbers(plan))
    return plan


def burst_inputs_for(spec: PlanSpec, study) -> tuple | None:
    """(production's ``BurstMeasure``, tested runs' dispersions, where from) for
    ``demand.arrivals``; None without it."""
    if not spec.demand.arrivals:
        return None
    from .. import burst as BU

    prod = BU.production_from_spec(dict(spec.demand.arrivals))
    return (prod, *BU.sweep_dispersions(study, prod.window_s))


def _bursts(spec: PlanSpec, study, burst_inputs, q_peaks) -> list:
    """Production's burstiness against the sweep's at each quarter's peak × (1 + u)
    (``capplan.burst.compare``), or Nones without ``demand.arrivals``."""
    d = spec.demand
    if not d.arrivals:
        return [None] * len(q_peaks)
    from .. import burst as BU

    prod, sweep_d, sweep_src = burst_inputs if burst_inputs is not None else burst_inputs_for(spec, study)
    q = dict(d.arrivals)["quantile"]
    return [BU.compare(prod, list(sweep_d), sweep_src, p * (1 + d.uncertainty), q) for p in q_peaks]


def _tested_and_production(cap: CapacityInfo) -> tuple[float | None, list[float]]:
    nums = [(cap.basis, cap.rps_per_group)] + [(a["basis"], a["rps_per_group"]) for a in cap.alternatives]
    tested = next((v for b, v in nums if b == "tested mix"), None)
    return tested, [v for b, v in nums if b.startswith("target")]


def compare_numbers(plan: Plan) -> tuple[dict, ...]:
    """The plan re-sized on each of the capacity's other numbers (``CapacityInfo.alternatives``):
    first quarter's groups, GPUs, billed GPUs, nodes and cost, the difference in cost, and a
    sentence that says which number the plan used, whether production's mix gives less than the
    tested mix, and what the other number would cost (docs/plan.md, "Honest numbers only")."""
    cap = plan.capacity
    q = plan.quarters[0]
    tested, production = _tested_and_production(cap)
    lower = tested is not None and any(v < tested * (1 - 1e-9) for v in production)
    used_status = (cap.honesty or {}).get("status", "no verdict")
    out = []
    for a in cap.alternatives:
        alt = dataclasses.replace(cap, rps_per_group=float(a["rps_per_group"]), alternatives=(), basis=a["basis"])
        p = make_plan(plan.spec, alt, slo=plan.slo, facts=plan.facts, forecast=plan.forecast,
                      gpus_per_group=plan.gpus_per_group, as_of=plan.as_of, burst_inputs=plan.burst_inputs)
        o = p.quarters[0]
        cost, base = float(o.cost_usd_per_month), float(q.cost_usd_per_month)
        d = cost - base
        head = (f"Production's mix gives a lower capacity than the tested mix ({_prod_text(cap, tested)}). "
                if lower else "")
        sentence = (head + f"This plan is sized on the {cap.basis} ({cap.rps_per_group:.4g} req/s per group, "
                    f"{used_status}); on the {a['basis']} ({a['rps_per_group']:.4g} req/s per group, {a['status']}) "
                    f"it would need {plural(o.groups, 'replica group')} = {o.gpus:,} GPUs ({o.billed_gpus:,} billed), "
                    f"${cost:,.0f} per month ({'+' if d >= 0 else '−'}${abs(d):,.0f}).")
        out.append({"basis": a["basis"], "rps_per_group": float(a["rps_per_group"]), "status": a["status"],
                    "groups": int(o.groups), "gpus": int(o.gpus), "billed_gpus": int(o.billed_gpus),
                    "nodes": int(o.nodes), "cost_usd_per_month": cost, "delta_cost_usd_per_month": d,
                    "used_basis": cap.basis, "used_status": used_status, "production_lower": lower,
                    "sentence": sentence})
    return tuple(out)


def _prod_text(cap: CapacityInfo, tested: float) -> str:
    nums = [(cap.basis, cap.rps_per_group)] + [(a["basis"], a["rps_per_group"]) for a in cap.alternatives]
    return "; ".join(f"{b} {v:.4g}" for b, v in nums if b.startswith("target")) + \
        f" against {tested:.4g} req/s per group"


def prepare_plan(spec: PlanSpec, *, capacity=None, study=None, envelope=None, slo=None) -> dict:
    """The slow parts of a plan done once (C_SLO fit, study facts, demand forecast), returned as
    keyword arguments for :func:`make_plan`, so a what-if panel re-plans in about a millisecond::

        pre = prepare_plan(spec, study=study)
        make_plan(spec.with_(peak_rps=500, pue=1.4), **pre)

    ``capacity`` stays fixed across calls (pass ``capacity=`` explicitly to move it)."""
    spec = load_plan_spec(spec)
    slo = _plan_slo(spec, slo, envelope)
    cap = resolve_capacity(spec, capacity, study=study, envelope=envelope, slo=slo)
    judge = slo if slo is not None else spec.slo_classes
    facts = K.study_facts(study, judge) if study is not None and judge is not None else None
    fc = None
    d = spec.demand
    if d.history:
        from .forecast import forecast_peaks_from_file

        fc = forecast_peaks_from_file(d.history, time_column=d.history_time_column,
                                      rate_column=d.history_rate_column, horizon_quarters=d.horizon_quarters,
                                      interval=d.interval)
    gpus = _gpus_per_group(spec, study)
    system = dict(study.manifest.system or {}) if study is not None else None
    return {"capacity": cap, "facts": facts, "forecast": fc, "slo": slo, "gpus_per_group": gpus,
            "system": system, "burst_inputs": burst_inputs_for(spec, study)}


def _plan_slo(spec: PlanSpec, slo, envelope) -> SLO | None:
    """The single SLO a plan uses: the one passed, else — unless the spec has SLO classes and no
    envelope was given (then every class is judged by its own SLO) — the spec's."""
    if slo is not None:
        return SLO.parse(slo)
    if spec.slo_classes is not None and envelope is None:
        return None
    return spec.slo


@dataclass(frozen=True)
class _Ctx:
    spec: PlanSpec
    cap: CapacityInfo
    g: int
    slo: SLO | None
    facts: Any
    system: dict | None = None  # the study's system (model, gpu) for the KV and power bounds
    burst: Any = None  # capplan.burst.BurstComparison at the first quarter's peak, or None


def gpus_per_group(spec: PlanSpec, study) -> int:
    """GPUs per replica group: the study's (a spec that says otherwise is a SpecError naming the
    field), else the spec's. ``capplan report`` calls it before any notebook starts."""
    return _gpus_per_group(spec, study)


def _gpus_per_group(spec: PlanSpec, study) -> int:
    g_spec = spec.group.gpus
    if study is not None:
        g_study = study.manifest.gpus_per_replica
        if g_spec is not None and g_spec != g_study:
            raise SpecError(f"replica_group says {g_spec} GPUs per replica but the study measured "
                            f"{g_study} (system.gpus_per_replica / tp × pp in study.yaml)",
                            field="replica_group.gpus_per_replica",
                            fix="remove gpus_per_replica/tp/pp from the spec to use the study's, or plan "
                                "with a study of that configuration")
        return g_study
    if g_spec is None:
        raise SpecError("replica_group.gpus_per_replica is missing (there is no study to take it from)",
                        field="replica_group.gpus_per_replica", fix="add gpus_per_replica: 4 (or tp: 4, pp: 1)")
    return g_spec


def _slo_text(slo: SLO | None) -> str:
    return f" at {slo.describe()}" if slo is not None else ""


def _costs(ctx: _Ctx, s: Sizing, peak: float, mean_to_peak_default) -> dict:
    """Cost arithmetic of one sizing (numbers only; the main plan turns them into items)."""
    spec, p = ctx.spec, ctx.spec.prices
    billed = s.nodes * spec.group.gpus_per_node if p.billing == "node" else s.total * ctx.g
    gpu_month = K.gpu_cost_usd_per_month(billed, p.usd_per_gpu_hour, p.overhead_pct)
    fa = _facts_at(ctx, peak, s.total)
    power_w = fa.mean_power_w_per_gpu if fa is not None and fa.mean_power_w_per_gpu is not None else p.gpu_power_w
    power_src = ("study telemetry" if fa is not None and fa.mean_power_w_per_gpu is not None
                 else ("prices.gpu_power_w" if p.gpu_power_w is not None else None))
    powered = s.total * ctx.g  # GPUs in replica groups draw power; unused billed GPUs are not counted
    fleet_kw = power_w * powered * p.pue / 1000.0 if power_w else 0.0
    energy_month = K.energy_cost_usd_per_month(power_w * powered, p.pue, p.usd_per_kwh) if power_w else 0.0
    cost_month = gpu_month + energy_month
    mtp = spec.demand.mean_to_peak or mean_to_peak_default or 1.0
    mean_rps = peak * mtp
    good_fraction, gf_src = _good_fraction(ctx, fa)
    good_month = K.requests_per_month(mean_rps) * good_fraction
    per_1k = K.usd_per_unit(cost_month, good_month, 1000.0)
    tokens, tok_src = _good_tokens(ctx, fa)
    per_1m = K.usd_per_unit(cost_month, good_month * tokens, 1e6) if tokens else None
    return dict(billed_gpus=billed, gpu_month=gpu_month, power_w=power_w, power_src=power_src, fleet_kw=fleet_kw,
                energy_month=energy_month, cost_month=cost_month, mtp=mtp, mean_rps=mean_rps,
                good_fraction=good_fraction, gf_src=gf_src, good_month=good_month, per_1k=per_1k,
                tokens=tokens, tok_src=tok_src, per_1m=per_1m, facts_at=fa)


def _facts_at(ctx: _Ctx, peak: float, groups: int):
    """Study facts at the planned operating point: the peak spread over all groups, in the
    study system's units (per-group load × replicas of the study system)."""
    if ctx.facts is None or not ctx.facts.levels:
        return None
    per_group = peak / groups
    return ctx.facts.at(per_group * (ctx.facts.replicas or 1))


def _good_fraction(ctx: _Ctx, fa) -> tuple[float, str]:
    if fa is not None:
        return fa.good_fraction, f"study, SLO-meeting share of offered requests ({fa.how})"
    if ctx.spec.capacity.good_fraction is not None:
        return ctx.spec.capacity.good_fraction, "capacity.good_fraction from the spec"
    if ctx.slo is not None:
        return ctx.slo.attainment, "assumed = SLO attainment target (no study; at or below C_SLO at least this share meets the SLO)"
    return 1.0, "assumed 1.0: no study, no SLO, no capacity.good_fraction (optimistic)"


def _good_tokens(ctx: _Ctx, fa) -> tuple[float | None, str]:
    if fa is not None and fa.good_output_tokens_per_good_request:
        return fa.good_output_tokens_per_good_request, f"study, mean output tokens of SLO-meeting requests ({fa.how})"
    if ctx.spec.demand.output_tokens_per_request is not None:
        return ctx.spec.demand.output_tokens_per_request, "demand.output_tokens_per_request from the spec"
    return None, "unknown"


def _items_for(ctx: _Ctx, peak: float, peak_formula: str, peak_inputs: dict, notes: list[str],
               mean_to_peak_default):
    spec, cap, g = ctx.spec, ctx.cap, ctx.g
    C = cap.rps_per_group
    u = spec.demand.uncertainty
    f_burst = ctx.burst.factor if ctx.burst is not None else 1.0
    D = peak * (1 + u) * f_burst
    s = size(D, C, spec, g)
    fail, roll, auto, prices = spec.failure, spec.rollout, spec.autoscaling, spec.prices
    n = spec.group.gpus_per_node
    T = auto.ready_s
    b = auto.burst_growth_rps_per_s
    items: list[LineItem] = []

    def add(key, name, value, unit, formula, inputs):
        items.append(LineItem(name, value, unit, formula, inputs, key))

    add("peak_rps", "peak demand λ_peak", peak, "req/s", peak_formula, peak_inputs)
    if ctx.burst is not None:
        bc = ctx.burst
        add("burst_factor", "burst factor f (production's burstiness against the sweep's)", f_burst, "×",
            "(1 + z_p·sqrt(D_prod/μ)) / (1 + z_p·sqrt(D_sweep/μ)), at least 1; μ = λ_peak·(1 + u)·w "
            "(docs/plan.md, \"Production burstiness\")",
            {"D_prod": bc.production.dispersion, "D_sweep": bc.sweep_max_dispersion, "w_s": bc.production.window_s,
             "μ": bc.peak_rps * bc.production.window_s, "p": bc.quantile, "production from": bc.production.source,
             "sweep from": bc.sweep_source})
        add("demand_rps", "planned demand D (peak + uncertainty, × burst factor)", D, "req/s",
            "λ_peak × (1 + u) × f",
            {"λ_peak": peak, "u": u, "f": f_burst,
             **({"u from": spec.demand.uncertainty_source} if spec.demand.backtested else {})})
    else:
        add("demand_rps", "planned demand D (peak + uncertainty)", D, "req/s", "λ_peak × (1 + u)",
            {"λ_peak": peak, "u": u, **({"u from": spec.demand.uncertainty_source} if spec.demand.backtested else {})})
    cap_inputs = {"source": cap.source}
    if cap.lower_bound is not None or cap.estimate is not None:
        cap_inputs.update({"estimate": cap.estimate, "ci_low": cap.ci_low, "ci_high": cap.ci_high,
                           "lower_bound": cap.lower_bound, "replicas_in_study": cap.study_replicas})
    r_study = cap.study_replicas or 1
    add("capacity_rps_per_group", "capacity per replica group C", C, "req/s",
        (("C_SLO " + ("lower bound" if "lower" in cap.source else "estimate") + " of the study system"
          + (f" ÷ its {r_study} replicas" if r_study != 1 else " (one replica group)"))
         if cap.estimate is not None or cap.lower_bound is not None else "given"), cap_inputs)
    add("gpus_per_group", "GPUs per replica group", float(g), "GPUs",
        "TP × PP (gpus_per_replica)", {"gpus_per_replica": g, "gpus_per_node": n})
    add("traffic_groups", "traffic groups R_traffic", float(s.need_traffic), "groups", "⌈D / C⌉",
        {"D": D, "C": C})
    fail_desc = _failure_desc(fail)
    add("failure_reserve_groups", "failure reserve", float(s.n_failure - s.need_traffic), "groups",
        f"smallest N ≥ R_traffic with (N − L(N))·C ≥ D, L(N) = groups lost with {fail_desc} "
        "(groups spread evenly over zones, then over the nodes of a zone; a group spanning several "
        "nodes is lost with any of them); reserve = N − R_traffic",
        {"R_traffic": s.need_traffic, "N": s.n_failure, "L(N)": failure_loss(s.n_failure, fail, g, n),
         "policy": fail.policy, "zones": len(fail.zones), "k": fail.k, "gpus_per_group": g, "gpus_per_node": n})
    add("rollout_overlap_groups", "rollout overlap", float(s.n_rollout - s.n_failure), "groups",
        "smallest N ≥ N_failure + r with (N − L(N) − r)·C ≥ D, r = max(max_unavailable, canary_groups − "
        "max_surge) groups out of service in the worst rollout step; overlap = N − N_failure",
        {"N_failure": s.n_failure, "r": roll.loss_groups, "max_unavailable": roll.max_unavailable,
         "max_surge": roll.max_surge, "canary_groups": roll.canary_groups, "N": s.n_rollout})
    add("rollout_surge_gpus", "rollout surge GPUs (temporary, during rollouts only)",
        float(roll.max_surge * g), "GPUs", "max_surge × GPUs per group (not in the monthly cost)",
        {"max_surge": roll.max_surge, "gpus_per_group": g})
    add("ready_time_s", "replica ready time T", T, "s",
        "Σ " + " + ".join(p for p, _ in auto.ready_time_s) if auto.ready_time_s else "no parts given (0 s)",
        {f"{p}_s": x for p, x in auto.ready_time_s})
    cold_seed = _ceil_div(b * T, C) if b * T > 0 else 0
    add("cold_start_reserve_groups", "cold-start reserve", float(s.n_cold - s.n_rollout), "groups",
        "⌈b·T / C⌉ (demand growth while a new replica starts), more if the bigger fleet enlarges the "
        "largest failure domain: smallest N ≥ N_rollout + ⌈b·T/C⌉ with (N − L(N) − r)·C ≥ D + b·T",
        {"b_rps_per_s": b, "T_s": T, "b·T": b * T, "C": C, "⌈b·T/C⌉": cold_seed, "N_rollout": s.n_rollout,
         "N": s.n_cold})
    add("warm_floor_topup_groups", "warm-floor top-up", float(s.total - s.n_cold), "groups",
        "max(0, warm_floor − N_cold)", {"warm_floor": auto.warm_floor_groups, "N_cold": s.n_cold})
    add("total_groups", "total replica groups N", float(s.total), "groups",
        "R_traffic + failure reserve + rollout overlap + cold-start reserve + warm-floor top-up",
        {"R_traffic": s.need_traffic, "failure": s.n_failure - s.need_traffic,
         "rollout": s.n_rollout - s.n_failure, "cold_start": s.n_cold - s.n_rollout,
         "warm_floor": s.total - s.n_cold})
    add("total_gpus", "total GPUs", float(s.total * g), "GPUs", "N × GPUs per group", {"N": s.total, "g": g})
    add("nodes", "nodes", float(s.nodes), "nodes",
        "Σ over zones of ⌈groups in zone / ⌊n/g⌋⌉ (groups fit a node) or groups in zone × ⌈g/n⌉ (groups span nodes)",
        {"groups_per_zone": ", ".join(f"{z}: {k}" for z, k in zip(fail.zones, s.zone_groups)),
         "g": g, "n": n})
    add("capacity_total_rps", "fleet capacity N·C", s.total * C, "req/s", "N × C", {"N": s.total, "C": C})
    add("utilisation_at_peak_pct", "utilisation at peak", 100.0 * peak / (s.total * C), "%",
        "100 × λ_peak / (N·C)", {"λ_peak": peak, "N": s.total, "C": C})
    add("headroom_at_peak_rps", "headroom at peak", s.total * C - peak, "req/s", "N·C − λ_peak",
        {"N·C": s.total * C, "λ_peak": peak})

    c = _costs(ctx, s, peak, mean_to_peak_default)
    billed = c["billed_gpus"]
    add("billed_gpus", "billed GPUs", float(billed), "GPUs",
        "nodes × GPUs per node (whole nodes are paid)" if prices.billing == "node" else "N × GPUs per group",
        {"nodes": s.nodes, "gpus_per_node": n} if prices.billing == "node" else {"N": s.total, "g": g})
    add("gpu_cost_usd_per_month", "GPU cost per month (incl. overhead)", c["gpu_month"], "USD/month",
        f"billed GPUs × $/GPU-h × {K.HOURS_PER_MONTH:g} h × (1 + overhead/100)",
        {"billed_gpus": billed, "usd_per_gpu_hour": prices.usd_per_gpu_hour, "hours": K.HOURS_PER_MONTH,
         "overhead_pct": prices.overhead_pct})
    if c["power_w"]:
        powered = s.total * g
        unused = f"; the {billed - powered} billed GPUs outside any group are not counted" if billed > powered else ""
        add("fleet_power_kw", "fleet facility power", c["fleet_kw"], "kW",
            "mean board power per GPU at the operating point × GPUs in replica groups × PUE / 1000" + unused,
            {"power_w_per_gpu": c["power_w"], "source": c["power_src"], "gpus_in_groups": powered,
             "pue": prices.pue})
        add("energy_cost_usd_per_month", "energy cost per month", c["energy_month"], "USD/month",
            f"fleet facility power (kW) × {K.HOURS_PER_MONTH:g} h × $/kWh",
            {"fleet_power_kw": c["fleet_kw"], "hours": K.HOURS_PER_MONTH,
             "usd_per_kwh": prices.usd_per_kwh})
    else:
        notes.append("energy cost not included: the study has no power samples and prices.gpu_power_w "
                     "is not set (the $/GPU-hour price is taken to include power)")
    add("cost_usd_per_month", "total cost per month", c["cost_month"], "USD/month",
        "GPU cost per month + energy cost per month", {"gpu": c["gpu_month"], "energy": c["energy_month"]})
    add("cost_usd_per_quarter", "total cost per quarter", c["cost_month"] * K.MONTHS_PER_QUARTER, "USD/quarter",
        "cost per month × 3", {"cost_usd_per_month": c["cost_month"]})
    add("cost_usd_per_year", "total cost per year (at this size)", c["cost_month"] * 12, "USD/year",
        "cost per month × 12 (the first quarter's fleet kept a whole year; the plan's quarters are in "
        "the cost-by-quarter table)", {"cost_usd_per_month": c["cost_month"]})
    add("mean_offered_rps", "mean offered rate", c["mean_rps"], "req/s", "λ_peak × mean_to_peak",
        {"λ_peak": peak, "mean_to_peak": c["mtp"]})
    add("good_fraction", "SLO-meeting fraction of offered requests", c["good_fraction"], "fraction",
        c["gf_src"], {"operating_point_rps_per_group": peak / s.total})
    add("good_requests_per_month", "SLO-meeting requests per month", c["good_month"], "requests",
        f"mean offered rate × {K.SECONDS_PER_MONTH:g} s × good fraction",
        {"mean_offered_rps": c["mean_rps"], "seconds": K.SECONDS_PER_MONTH, "good_fraction": c["good_fraction"]})
    add("cost_usd_per_1k_good_requests", "cost per 1 000 SLO-meeting requests", c["per_1k"], "USD",
        "total cost per month / SLO-meeting requests per month × 1 000 (all provisioned capacity, "
        "including what rejected or late requests used, over SLO-meeting requests only)",
        {"cost_usd_per_month": c["cost_month"], "good_requests_per_month": c["good_month"]})
    if c["tokens"]:
        add("good_output_tokens_per_good_request", "output tokens per SLO-meeting request", c["tokens"], "tokens",
            c["tok_src"], {})
        add("cost_usd_per_1m_good_output_tokens", "cost per 1 M SLO-meeting output tokens", c["per_1m"], "USD",
            "total cost per month / (SLO-meeting requests per month × output tokens per SLO-meeting request) × 10⁶",
            {"cost_usd_per_month": c["cost_month"], "good_requests_per_month": c["good_month"],
             "tokens_per_good_request": c["tokens"]})
    else:
        notes.append("cost per 1 M SLO-meeting output tokens not computed: no study and no "
                     "demand.output_tokens_per_request")
    fa = c["facts_at"]
    if fa is not None and fa.energy_j_per_good_request is not None:
        e_wh = fa.energy_j_per_good_request * prices.pue / K.J_PER_WH
        add("energy_wh_per_good_request", "energy per SLO-meeting request, measured at the operating point",
            e_wh, "Wh",
            "∫ GPU power dt over the study's run windows / SLO-meeting requests in them × PUE / 3600 "
            f"({fa.how}): the energy the tested GPUs used per good request at this load, without "
            "reserve groups, idle hours or unused GPUs", {"board_j_per_good_request": fa.energy_j_per_good_request,
                                                         "pue": prices.pue})
    elif ctx.facts is not None:
        notes.append("energy per SLO-meeting request not computed: the study has no usable power samples")
    if c["power_w"] and c["good_month"] > 0:
        add("fleet_energy_wh_per_good_request", "fleet energy per SLO-meeting request",
            c["fleet_kw"] * K.HOURS_PER_MONTH * 1000.0 / c["good_month"], "Wh",
            "fleet facility power (kW) × 730 h × 1000 / SLO-meeting requests per month: everything the "
            "energy cost pays for (reserve groups, off-peak hours at peak power) per good request",
            {"fleet_power_kw": c["fleet_kw"], "good_requests_per_month": c["good_month"]})

    # checks
    checks = _checks(ctx, s, peak, D, C, c)
    # work units, KV memory and power (capplan.plan.bounds; docs/mix.md)
    extra = plan_bounds.bounds(spec, g=g, capacity_rps=C, groups=s.total, nodes=s.nodes, facts=ctx.facts,
                               facts_at_peak=c["facts_at"], study_replicas=cap.study_replicas,
                               peak_rps=peak, system=ctx.system)
    for row in extra["items"]:
        add(*row)
    checks += [Check(*row) for row in extra["checks"]]
    notes.extend(extra["notes"])
    return items, checks


def _failure_desc(fail: FailureSpec) -> str:
    return {"node": "the largest node", "zone": "the largest zone",
            "n_plus_k": f"any {fail.k} group(s) (N+{fail.k})", "none": "nothing (no failure policy)"}[fail.policy]


def _checks(ctx: _Ctx, s: Sizing, peak, D, C, c) -> list[Check]:
    spec = ctx.spec
    fail, roll, auto = spec.failure, spec.rollout, spec.autoscaling
    at = _slo_text(ctx.slo) if ctx.slo is not None or spec.slo_classes is None else \
        " with every SLO class meeting its own SLO"
    N = s.total
    L = s.loss_failure
    r = s.loss_rollout
    out = []
    need = f"planned demand {D:.4g} req/s"
    if ctx.burst is not None:
        out.append(Check("burstiness", ctx.burst.sentence, ctx.burst.covered))
    out.append(Check("traffic", f"{plural(N, 'group')} × {C:.4g} req/s = {N * C:.4g} req/s ≥ {need}{at}",
                     N * C >= D * (1 - _EPS)))
    if fail.policy == "zone":
        what = f"losing zone {fail.zones[0]} ({L} of {plural(N, 'group')})"
    elif fail.policy == "node":
        what = f"losing one node ({L} of {plural(N, 'group')})"
    elif fail.policy == "n_plus_k":
        what = f"losing any {L} of {plural(N, 'group')}"
    else:
        what = None
    if what:
        out.append(Check("failure", f"after {what}, capacity {(N - L) * C:.4g} req/s ≥ {need}{at}",
                         (N - L) * C >= D * (1 - _EPS)))
    lost = L + r
    out.append(Check("rollout",
                     f"during the worst rollout step ({plural(r, 'group')} out of service; max surge {roll.max_surge}, "
                     f"max unavailable {roll.max_unavailable}, canary {roll.canary_groups}"
                     + (f"; while {what}" if what else "")
                     + f"), capacity {(N - lost) * C:.4g} req/s ≥ {need}{at}",
                     (N - lost) * C >= D * (1 - _EPS)))
    bT = auto.burst_growth_rps_per_s * auto.ready_s
    if bT > 0:
        out.append(Check("cold_start",
                         f"while a new replica starts ({auto.ready_s:g} s), demand can grow by "
                         f"{bT:.4g} req/s to {D + bT:.4g} req/s and capacity {(N - lost) * C:.4g} req/s "
                         f"still covers it{at}", (N - lost) * C >= (D + bT) * (1 - _EPS)))
    if auto.warm_floor_groups:
        out.append(Check("warm_floor", f"{plural(N, 'group')} ≥ warm floor {plural(auto.warm_floor_groups, 'group')}",
                         N >= auto.warm_floor_groups))
    if fail.nodes_available is not None:
        out.append(Check("nodes_available", f"planned nodes {s.nodes} ≤ nodes available {fail.nodes_available}",
                         s.nodes <= fail.nodes_available))
    if roll.max_surge > N:
        raise SpecError(f"rollout.max_surge ({roll.max_surge}) is larger than the planned fleet ({N} groups)",
                        field="rollout.max_surge", fix=f"use max_surge ≤ {N}")
    status = ctx.cap.status
    caveat = "; ".join(n for n in ctx.cap.notes if "bracket" in n or "too high" in n)
    if status:
        if status == "bracketed":
            out.append(Check("capacity_status", "the study's C_SLO is bracketed by the tested offered rates", True,
                             caveat=caveat))
        elif status.startswith("≥"):
            out.append(Check("capacity_status", "every tested rate met the SLO, so C_SLO is at least the largest "
                                                "tested rate: the plan is conservative (test higher rates to tighten it)",
                             True))
        else:
            out.append(Check("capacity_status", f"the study's C_SLO is bracketed by the tested rates (status: {status})",
                             False))
    return out
