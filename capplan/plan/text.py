"""The words of a plan: its failure policy in a sentence, and the Assumptions sheet (the spec
values the plan used, in words with their units, then the conventions it relies on). Pure
functions of the spec; ``capplan.plan`` calls them."""

from __future__ import annotations

from typing import Any

from .. import cost as K


def plural(count, noun: str) -> str:
    """'1 group', '8 groups'."""
    c = int(count) if float(count).is_integer() else count
    return f"{c:g} {noun}" + ("" if c == 1 else "s")


def policy_text(spec) -> str:
    """The failure policy in words: 'survive losing one of 3 zones (a, b, c)'."""
    f = spec.failure
    zones = f"{plural(len(f.zones), 'zone')} ({', '.join(f.zones)})"
    return {"zone": f"survive losing the largest of {zones}",
            "node": f"survive losing one node; groups spread over {zones}",
            "n_plus_k": f"survive losing any {plural(f.k, 'replica group')} (N + {f.k}); spread over {zones}",
            "none": f"no failure reserve; groups spread over {zones}"}[f.policy]



#: spec fields in words, with their unit (the Assumptions sheet)
_FIELD_TEXT = {
    "start": ("first day of the plan", ""),
    "demand.peak_rps": ("peak demand", "req/s"),
    "demand.uncertainty": ("demand uncertainty u (plan for peak × (1 + u))", "fraction"),
    "demand.horizon_quarters": ("quarters planned", "quarters"),
    "demand.growth_per_quarter": ("peak growth per quarter", "fraction"),
    "demand.mean_to_peak": ("mean demand / peak demand", "fraction"),
    "demand.output_tokens_per_request": ("output tokens per request", "tokens"),
    "demand.history": ("demand history file", ""), "demand.interval": ("forecast interval", "fraction"),
    "demand.backtest_quantile": ("back-test quantile u is read at", "fraction"),
    "capacity.source": ("capacity from", ""), "capacity.use": ("plan on the C_SLO", ""),
    "capacity.rps_per_group": ("capacity per replica group (given)", "req/s"),
    "capacity.confidence": ("confidence of the C_SLO interval", "fraction"),
    "capacity.reps": ("bootstrap replicates", "replicates"), "capacity.seed": ("bootstrap seed", ""),
    "capacity.good_fraction": ("SLO-meeting share of offered requests (given)", "fraction"),
    "replica_group.gpus_per_replica": ("GPUs per replica group", "GPUs"),
    "replica_group.tp": ("tensor parallelism", "GPUs"), "replica_group.pp": ("pipeline parallelism", "GPUs"),
    "replica_group.gpus_per_node": ("GPUs per node", "GPUs"),
    "failure.policy": ("failure policy", ""), "failure.zones": ("zones", ""),
    "failure.k": ("groups that may fail at once (N + k)", "groups"),
    "failure.nodes_available": ("nodes available", "nodes"),
    "rollout.max_surge": ("rollout: extra groups started first (max surge)", "groups"),
    "rollout.max_unavailable": ("rollout: groups down at once (max unavailable)", "groups"),
    "rollout.canary_groups": ("rollout: canary groups", "groups"),
    "autoscaling.burst_growth_rps_per_s": ("demand growth while scaling up", "req/s per s"),
    "autoscaling.warm_floor_groups": ("warm floor", "groups"),
    "prices.usd_per_gpu_hour": ("price per GPU-hour", "USD"),
    "prices.overhead_pct": ("overhead on the GPU cost", "%"),
    "prices.usd_per_kwh": ("electricity price", "USD/kWh"), "prices.pue": ("PUE (facility / IT power)", ""),
    "prices.billing": ("billing", ""), "prices.gpu_power_w": ("mean board power per GPU (given)", "W"),
}


def _unused_fields(spec, cap, facts) -> set[str]:
    """Spec fields this plan did not use (left out of the Assumptions, so finance does not read
    a number that changes nothing)."""
    d = spec.demand
    out = set()
    if not d.backtested:
        out.add("demand.backtest_quantile")
    if not d.history:
        out |= {"demand.history", "demand.history_time_column", "demand.history_rate_column", "demand.interval"}
    else:
        out.add("demand.growth_per_quarter")
    if d.horizon_quarters == 1:
        out.add("demand.growth_per_quarter")
    if facts is not None:
        out |= {"demand.output_tokens_per_request", "capacity.good_fraction"}
        if facts.has_energy:
            out.add("prices.gpu_power_w")
    if spec.capacity.source == "study" or cap.source.startswith("given"):
        out.add("capacity.rps_per_group")
    if cap.estimate is None and cap.lower_bound is None:
        out |= {"capacity.use", "capacity.confidence", "capacity.reps", "capacity.seed"}
    if spec.failure.policy != "n_plus_k":
        out.add("failure.k")
    if not spec.prices.usd_per_kwh:
        out |= {"prices.pue", "prices.gpu_power_w"}
    out.add("demand.mean_to_peak")  # stated once below, as used
    return out


def _assumption_value(v):
    """A number, or readable text (lists joined: 'a, b, c'), never a Python repr."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k} {x:g}" if isinstance(x, (int, float)) else f"{k} {x}" for k, x in v.items())
    return str(v)


def assumptions(spec, cap, facts, mean_to_peak_default) -> list[tuple[str, Any, str, str]]:
    """(assumption, value, unit, note): the spec values a plan used (``cap``: its CapacityInfo,
    ``facts``: the study facts or None), then the conventions it relies on."""
    unused = _unused_fields(spec, cap, facts)
    out: list[tuple[str, Any, str, str]] = []
    for k, v in spec.flat().items():
        if v is None or k in unused or k in ("name", "tenant", "slo"):
            continue
        head = k.rsplit(".", 1)[0]
        label, unit = _FIELD_TEXT.get(k, _FIELD_TEXT.get(head, (k, "")))
        if k not in _FIELD_TEXT and head in _FIELD_TEXT:  # one class of a per-class field
            label = f"{label}: {k.rsplit('.', 1)[1]}"
        if k.startswith("autoscaling.ready_time_s."):
            label, unit = f"replica ready time: {k.rsplit('.', 1)[1]}", "s"
        note = f"spec field {k}"
        if k == "demand.uncertainty" and spec.demand.backtested:  # u measured, not typed: say how
            note = f"demand.uncertainty: backtest, {spec.demand.uncertainty_source}"
        out.append((label, _assumption_value(v), unit, note))
    mtp = spec.demand.mean_to_peak or mean_to_peak_default or 1.0
    out += [
        ("hours per month", K.HOURS_PER_MONTH, "h", "8 760 h / 12"),
        ("fleet provisioning", "peak all month", "", "the planned fleet is paid for all month (reserved capacity)"),
        ("mean demand / peak demand (used)", mtp, "fraction",
         "from the spec (demand.mean_to_peak)" if spec.demand.mean_to_peak else
         ("mean / peak of the demand history" if mean_to_peak_default else
          "not given: the fleet is assumed busy at peak all month (optimistic cost per request)")),
    ]
    if getattr(spec, "slo_classes", None) is not None:
        out.append(("SLO classes", spec.slo_classes.describe(), "",
                    "one pool sized so that every class meets its own SLO at the study's tested class mix; "
                    "peak demand = Σ class peaks"))
    elif len(spec.demand.peak_rps) > 1:
        out.append(("SLO classes", "one pool", "",
                    "all SLO classes share one pool sized at the spec's SLO; peak demand = Σ class peaks"))
    if facts is not None:
        out.append(("operating point", "peak ÷ groups", "",
                    "good fraction, tokens and energy are read from the study at the peak spread over all groups"))
    return out


def months_frame(plan):
    """One row per month of the horizon (the fleet of its quarter): month, first day,
    quarter, billed GPUs, cost."""
    import pandas as pd

    from .periods import Period, months_of

    rows = []
    for q in plan.quarters:
        if q.start is None:
            continue
        month = q.cost_usd_per_month if q.cost_usd_per_month is not None else q.cost_usd_per_quarter / 3
        for m in months_of(Period(q.label, q.start, q.end)):
            rows.append([m.label, m.start, m.end, q.label, q.billed_gpus, month])
    return pd.DataFrame(rows, columns=["month", "start", "end", "quarter", "billed_gpus",
                                       "cost_usd_per_month"])


def years_frame(plan):
    """Totals per plan year (4 quarters from the start; a shorter last year is labelled
    "year 2 (2 quarters of 4)") and over the whole horizon."""
    import pandas as pd

    rows = []
    qs = list(plan.quarters)
    for i in range(0, len(qs), 4):
        part = qs[i:i + 4]
        label = f"year {i // 4 + 1}" + ("" if len(part) == 4 else f" ({plural(len(part), 'quarter')} of 4)")
        rows.append([label, part[0].start, part[-1].end, len(part),
                     sum(q.cost_usd_per_quarter for q in part)])
    if len(rows) > 1:
        rows.append(["whole horizon", qs[0].start, qs[-1].end, len(qs),
                     sum(q.cost_usd_per_quarter for q in qs)])
    return pd.DataFrame(rows, columns=["period", "start", "end", "quarters", "cost_usd"])


def assumptions_frame(plan):
    """assumption, value (a number or text), unit, note."""
    import pandas as pd

    return pd.DataFrame([{"assumption": a, "value": v, "unit": u, "note": n} for a, v, u, n in plan.assumptions],
                        columns=["assumption", "value", "unit", "note"])


def about(plan) -> list[tuple[str, str]]:
    """What the plan is, in words (label, text): name, tenant, period, SLO, capacity used,
    failure policy, rollout, prices, checks. Each report and export states these, so two
    plans with different specs never look alike."""
    sp = plan.spec
    p = sp.prices
    out = [("plan", sp.name)]
    if sp.tenant:
        out.append(("tenant", sp.tenant))
    if plan.quarters and plan.quarters[0].start is not None:
        q0, qn = plan.quarters[0], plan.quarters[-1]
        out.append(("period", f"{q0.label} to {qn.label} ({q0.start.isoformat()} to {qn.end.isoformat()}, "
                              f"{plural(len(plan.quarters), 'quarter')})" if len(plan.quarters) > 1
                    else f"{q0.label} ({q0.start.isoformat()} to {q0.end.isoformat()})"))
    if plan.slo is not None:
        out.append(("SLO", plan.slo.describe()))
    out.append(("capacity used", f"{plan.capacity.rps_per_group:.4g} req/s per replica group "
                                 f"({plan.capacity.source})"))
    out.append(("failure policy", policy_text(sp)))
    r = sp.rollout
    out.append(("rollout", f"max surge {plural(r.max_surge, 'group')}, max unavailable "
                           f"{plural(r.max_unavailable, 'group')}, canary {plural(r.canary_groups, 'group')}"))
    price = (f"${p.usd_per_gpu_hour:,.2f} per GPU-hour + {p.overhead_pct:g} % overhead; "
             + ("whole nodes billed" if p.billing == "node" else "only the groups' GPUs billed"))
    if p.usd_per_kwh:
        price += f"; electricity ${p.usd_per_kwh:,.3g}/kWh at PUE {p.pue:g}"
    out.append(("prices", price))
    out.append(("checks", "all pass" if plan.ok else
                "FAILED: " + "; ".join(c.sentence for c in plan.checks if not c.ok)))
    return out
