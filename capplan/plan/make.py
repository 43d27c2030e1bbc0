"""Capacity plans: from a capacity (C_SLO) and a demand to groups, GPUs, nodes, cost and energy.

A plan is a pure function of a validated :class:`PlanSpec` (see ``templates/plan.yaml``), a
capacity per replica group, and optionally per-level facts of the study it was measured on.
The spec itself (its sections, YAML loading and validation) lives in :mod:`capplan.plan.spec`;
the package re-exports its public names, so ``from capplan.plan import PlanSpec`` works.
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

The parts, one module each: the capacity (``capacity``), the sizing rule (``sizing``), the line
items and checks (``items``), the result (``result``); this module puts them together per
quarter and prepares the slow parts once (:func:`prepare_plan`).
"""

from __future__ import annotations

import dataclasses

from .. import cost as K
from ..errors import SpecError
from ..slo import SLO
from . import bounds as plan_bounds
from . import contract as plan_contract
from .capacity import CapacityInfo, resolve_capacity
from .items import PlanContext, costs, line_items
from .periods import next_quarter_start, quarter_from_label, reference_day
from .periods import quarters as quarters_from
from .result import Plan, QuarterPlan
from .sizing import size
from .spec import PlanSpec, load_plan_spec
from .text import assumptions as assumption_rows
from .text import plural


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
    ctx = PlanContext(spec=spec, cap=cap, g=g, slo=slo, facts=facts, system=system, burst=bursts[0])
    items, checks = line_items(ctx, q_peaks[0], peak_formula, peak_inputs, notes,
                                     mean_to_peak_default)
    quarters = []
    for period, peak, mean, low, bq in zip(q_periods, q_peaks, q_means, q_lows, bursts):
        D_q = peak * (1 + d.uncertainty) * (bq.factor if bq is not None else 1.0)
        s = size(D_q, C, spec, g)
        c = costs(ctx, s, peak, mean_to_peak_default)
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
    (``capplan.burst.compare_burstiness``), or Nones without ``demand.arrivals``."""
    d = spec.demand
    if not d.arrivals:
        return [None] * len(q_peaks)
    from .. import burst as BU

    prod, sweep_d, sweep_src = burst_inputs if burst_inputs is not None else burst_inputs_for(spec, study)
    q = dict(d.arrivals)["quantile"]
    return [BU.compare_burstiness(prod, list(sweep_d), sweep_src, p * (1 + d.uncertainty), q) for p in q_peaks]


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
