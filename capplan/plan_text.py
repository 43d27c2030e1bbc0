"""The words of a plan: its failure policy in a sentence, and the Assumptions sheet (the spec
values the plan used, in words with their units, then the conventions it relies on). Pure
functions of the spec; ``capplan.plan`` calls them."""

from __future__ import annotations

from typing import Any

from . import cost as K


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
        out.append((label, _assumption_value(v), unit, f"spec field {k}"))
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
