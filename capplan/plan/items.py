"""The line items and checks of one plan: demand, capacity, the sizing steps, cost, energy, and
the work-unit, KV and power bounds (``capplan.plan.bounds``), each with its formula and inputs.

Adding a line item is one ``add(key, name, value, unit, formula, inputs)`` call here; the text,
the frame, the XLSX/CSV export and the what-if panel pick it up by themselves. A condition the
plan must meet is a :class:`~capplan.plan.result.Check` beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import cost as K
from ..errors import SpecError
from ..slo import SLO
from . import bounds as plan_bounds
from .capacity import CapacityInfo
from .result import Check, LineItem
from .sizing import EPS, Sizing, ceil_div, failure_loss, size
from .spec import FailureSpec, PlanSpec
from .text import plural


@dataclass(frozen=True)
class PlanContext:
    """What every line item of one plan reads: the spec, the capacity, GPUs per group, the SLO,
    the study facts, the system and the burst comparison."""

    spec: PlanSpec
    cap: CapacityInfo
    g: int
    slo: SLO | None
    facts: Any
    system: dict | None = None  # the study's system (model, gpu) for the KV and power bounds
    burst: Any = None  # capplan.burst.BurstComparison at the first quarter's peak, or None


def _slo_text(slo: SLO | None) -> str:
    return f" at {slo.describe()}" if slo is not None else ""


def costs(ctx: PlanContext, s: Sizing, peak: float, mean_to_peak_default) -> dict:
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


def _facts_at(ctx: PlanContext, peak: float, groups: int):
    """Study facts at the planned operating point: the peak spread over all groups, in the
    study system's units (per-group load × replicas of the study system)."""
    if ctx.facts is None or not ctx.facts.levels:
        return None
    per_group = peak / groups
    return ctx.facts.at(per_group * (ctx.facts.replicas or 1))


def _good_fraction(ctx: PlanContext, fa) -> tuple[float, str]:
    if fa is not None:
        return fa.good_fraction, f"study, SLO-meeting share of offered requests ({fa.how})"
    if ctx.spec.capacity.good_fraction is not None:
        return ctx.spec.capacity.good_fraction, "capacity.good_fraction from the spec"
    if ctx.slo is not None:
        return ctx.slo.attainment, "assumed = SLO attainment target (no study; at or below C_SLO at least this share meets the SLO)"
    return 1.0, "assumed 1.0: no study, no SLO, no capacity.good_fraction (optimistic)"


def _good_tokens(ctx: PlanContext, fa) -> tuple[float | None, str]:
    if fa is not None and fa.good_output_tokens_per_good_request:
        return fa.good_output_tokens_per_good_request, f"study, mean output tokens of SLO-meeting requests ({fa.how})"
    if ctx.spec.demand.output_tokens_per_request is not None:
        return ctx.spec.demand.output_tokens_per_request, "demand.output_tokens_per_request from the spec"
    return None, "unknown"


def line_items(ctx: PlanContext, peak: float, peak_formula: str, peak_inputs: dict, notes: list[str],
               mean_to_peak_default):
    """The plan's line items and checks at ``peak`` (the first quarter's), in the order the text,
    the frame and the export show them: demand and capacity, the sizing steps, cost and energy,
    then the bounds. What could not be computed is said in ``notes``."""
    spec, C = ctx.spec, ctx.cap.rps_per_group
    f_burst = ctx.burst.factor if ctx.burst is not None else 1.0
    D = peak * (1 + spec.demand.uncertainty) * f_burst
    s = size(D, C, spec, ctx.g)
    items: list[LineItem] = []

    def add(key, name, value, unit, formula, inputs):
        items.append(LineItem(name, value, unit, formula, inputs, key))

    _demand_items(add, ctx, peak, peak_formula, peak_inputs, D)
    _sizing_items(add, ctx, s, peak, D)
    c = costs(ctx, s, peak, mean_to_peak_default)
    _cost_items(add, ctx, s, c, peak, notes)

    # checks
    checks = _checks(ctx, s, peak, D, C, c)
    # work units, KV memory and power (capplan.plan.bounds; docs/mix.md)
    extra = plan_bounds.bounds(spec, g=ctx.g, capacity_rps=C, groups=s.total, nodes=s.nodes, facts=ctx.facts,
                               facts_at_peak=c["facts_at"], study_replicas=ctx.cap.study_replicas,
                               peak_rps=peak, system=ctx.system)
    for row in extra["items"]:
        add(*row)
    checks += [Check(*row) for row in extra["checks"]]
    notes.extend(extra["notes"])
    return items, checks


def _demand_items(add, ctx: PlanContext, peak: float, peak_formula: str, peak_inputs: dict, D: float) -> None:
    """Peak, burst factor, planned demand D, capacity per group C, GPUs per group."""
    spec, cap, g = ctx.spec, ctx.cap, ctx.g
    C = cap.rps_per_group
    u = spec.demand.uncertainty
    f_burst = ctx.burst.factor if ctx.burst is not None else 1.0
    n = spec.group.gpus_per_node
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


def _sizing_items(add, ctx: PlanContext, s: Sizing, peak: float, D: float) -> None:
    """The sizing steps (traffic, failure, rollout, cold start, warm floor), the fleet and its
    headroom at peak."""
    spec, g, C = ctx.spec, ctx.g, ctx.cap.rps_per_group
    fail, roll, auto = spec.failure, spec.rollout, spec.autoscaling
    n = spec.group.gpus_per_node
    T = auto.ready_s
    b = auto.burst_growth_rps_per_s
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
    cold_seed = ceil_div(b * T, C) if b * T > 0 else 0
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


def _cost_items(add, ctx: PlanContext, s: Sizing, c: dict, peak: float, notes: list[str]) -> None:
    """Billed GPUs, cost per month, quarter, year and per SLO-meeting request or token; fleet
    power and energy per SLO-meeting request where the study or the spec gives power."""
    prices, g, n = ctx.spec.prices, ctx.g, ctx.spec.group.gpus_per_node
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


def _failure_desc(fail: FailureSpec) -> str:
    return {"node": "the largest node", "zone": "the largest zone",
            "n_plus_k": f"any {fail.k} group(s) (N+{fail.k})", "none": "nothing (no failure policy)"}[fail.policy]


def _checks(ctx: PlanContext, s: Sizing, peak, D, C, c) -> list[Check]:
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
                     N * C >= D * (1 - EPS)))
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
                         (N - L) * C >= D * (1 - EPS)))
    lost = L + r
    out.append(Check("rollout",
                     f"during the worst rollout step ({plural(r, 'group')} out of service; max surge {roll.max_surge}, "
                     f"max unavailable {roll.max_unavailable}, canary {roll.canary_groups}"
                     + (f"; while {what}" if what else "")
                     + f"), capacity {(N - lost) * C:.4g} req/s ≥ {need}{at}",
                     (N - lost) * C >= D * (1 - EPS)))
    bT = auto.burst_growth_rps_per_s * auto.ready_s
    if bT > 0:
        out.append(Check("cold_start",
                         f"while a new replica starts ({auto.ready_s:g} s), demand can grow by "
                         f"{bT:.4g} req/s to {D + bT:.4g} req/s and capacity {(N - lost) * C:.4g} req/s "
                         f"still covers it{at}", (N - lost) * C >= (D + bT) * (1 - EPS)))
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
