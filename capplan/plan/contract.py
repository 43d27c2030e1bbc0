"""The plan's capacity contract and its chargeback (docs/plan.md, "Capacity contract" and
"Chargeback").

The contract says what the planned capacity holds *for*: the workload (lengths, arrival
process, cache condition of the study), the tail SLO, the goodput (the C_SLO it stands on),
the headroom (planned demand against the planned size, the reserves) and the overload response
(what the spec says happens past capacity). Each clause names its source (file and field), so
a reader can trace it.

The chargeback splits the planned monthly cost over tenants / SLO classes by the tokens each
consumed in the study (the GPU-seconds a continuously batched engine spends are shared by the
tokens of its batch), to the cent, summing exactly to the total (largest remainder).
Pure functions of the plan and a :class:`StudyWorkload` read once from the study."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import cost as K
from .text import plural

#: the event columns a chargeback groups by, in order, when the study has them
CHARGE_BY = ("tenant", "slo_class")


@dataclass(frozen=True)
class StudyWorkload:
    """What a study offered, read once for the contract and the chargeback: length summaries
    of the events, the runs' arrival processes and cache conditions, and the tokens per
    tenant / SLO class (``usage``: (key, requests, input_tokens, output_tokens), key a tuple
    over ``by``)."""

    study_name: str
    n_requests: int
    input_tokens: dict  # mean, p50, p90, p99, max
    output_tokens: dict
    input_column: str  # computed_input_tokens (prefix-cache misses) or input_tokens
    arrival: str
    cache_condition: str
    by: tuple[str, ...] = ()
    usage: tuple[tuple[tuple[str, ...], int, float, float], ...] = ()


def _arrival_text(manifest) -> str:
    runs = sorted({r.arrival for r in manifest.runs})
    wl = (manifest.workload or {}).get("arrival")
    text = "runs' arrival: " + ", ".join(runs)
    if isinstance(wl, dict) and wl.get("process"):
        text += f" (workload.arrival: {wl['process']}" + (f", CV {wl['cv']:g}" if "cv" in wl else "") + ")"
    elif isinstance(wl, str):
        text += f" (workload.arrival: {wl})"
    if manifest.load_model == "closed":
        text += "; closed loop (fixed concurrency)"
    return text


def study_workload(study) -> StudyWorkload:
    """Read the study once: length quantiles (type 7) of every event, the manifest's arrival and
    cache labels, and the tokens per tenant / SLO class."""
    m = study.manifest
    inp = "computed_input_tokens" if study.has("computed_input_tokens") else "input_tokens"
    q = study.sql(f"""select count(*), avg(input_tokens), quantile_cont(input_tokens, [0.5, 0.9, 0.99]),
                      max(input_tokens), avg(output_tokens), quantile_cont(output_tokens, [0.5, 0.9, 0.99]),
                      max(output_tokens) from {study.view_name('events')}""").fetchone()

    def summary(mean, qs, mx):
        return {"mean": float(mean or 0), "p50": float(qs[0]), "p90": float(qs[1]), "p99": float(qs[2]),
                "max": float(mx)} if qs is not None else {}

    by = tuple(c for c in CHARGE_BY if study.has(c))
    usage = ()
    if by:
        keys = ", ".join(f"coalesce({c}, '(none)')" for c in by)
        rows = study.sql(f"""select {keys}, count(*), sum(coalesce({inp}, input_tokens)), sum(output_tokens)
                             from {study.view_name('events')} group by all order by all""").fetchall()
        usage = tuple((tuple(str(x) for x in r[:len(by)]), int(r[-3]), float(r[-2] or 0), float(r[-1] or 0))
                      for r in rows)
    caches = sorted({r.cache_condition or "not labelled" for r in m.runs})
    return StudyWorkload(study_name=m.name, n_requests=int(q[0]), input_tokens=summary(q[1], q[2], q[3]),
                         output_tokens=summary(q[4], q[5], q[6]), input_column=inp,
                         arrival=_arrival_text(m), cache_condition=", ".join(caches), by=by, usage=usage)


# ----------------------------------------------------------------------------- the contract


@dataclass(frozen=True)
class Clause:
    name: str  # workload, tail SLO, goodput, headroom, overload response
    text: str
    source: str  # the file and field it comes from


@dataclass(frozen=True)
class CapacityContract:
    """What the planned capacity holds for: five clauses, each with its source."""

    clauses: tuple[Clause, ...]

    def to_text(self) -> str:
        return "Capacity contract:\n" + "\n".join(f"  {c.name}: {c.text} [{c.source}]" for c in self.clauses)

    def to_dict(self) -> list[dict]:
        return [{"clause": c.name, "text": c.text, "source": c.source} for c in self.clauses]

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([(c.name, c.text, c.source) for c in self.clauses],
                            columns=["Clause", "What the capacity holds for", "Source"])


def _len(d: dict) -> str:
    return f"mean {d['mean']:.0f}, p50 {d['p50']:.0f}, p90 {d['p90']:.0f}, p99 {d['p99']:.0f}, max {d['max']:.0f}"


def _value(plan, key: str, default=0.0) -> float:
    try:
        return plan.value(key)
    except KeyError:
        return default


def capacity_contract(plan) -> CapacityContract:
    """The contract of a plan (``plan.workload``: the :class:`StudyWorkload`, or None for a
    plan from a given capacity number — then the workload clause says it is not known)."""
    sp, cap, w = plan.spec, plan.capacity, plan.workload
    spec_file = sp.source or "the plan spec"
    if w is not None and w.input_tokens:
        inp = "input tokens computed (prefix-cache misses)" if w.input_column == "computed_input_tokens" \
            else "input tokens"
        work = Clause("workload", f"the study's tested mix ({w.n_requests:,} requests): {inp} {_len(w.input_tokens)}; "
                      f"output tokens {_len(w.output_tokens)}; {w.arrival}; cache condition: {w.cache_condition}",
                      f"study {w.study_name}: events ({w.input_column}, output_tokens); study.yaml runs[].arrival, "
                      "runs[].cache_condition, workload.arrival")
    else:
        work = Clause("workload", "not stated: the capacity is a given number, not measured on a study, so the "
                      "lengths, arrival process and cache condition it holds for are unknown",
                      f"{spec_file}: capacity.rps_per_group")
    if sp.slo_classes is not None:
        slo = Clause("tail SLO", sp.slo_classes.describe(), f"{spec_file}: slo_file / slo_classes")
    elif plan.slo is not None:
        slo = Clause("tail SLO", plan.slo.describe(), f"{spec_file}: slo (or --slo)")
    else:
        slo = Clause("tail SLO", "not stated: the plan has no SLO (a given capacity)", f"{spec_file}: slo")
    gf, good_month = _value(plan, "good_fraction", None), _value(plan, "good_requests_per_month", None)
    at_size = (f"; at the planned size {gf:.2%} of offered requests meet the SLO "
               f"({good_month:,.0f} SLO-meeting requests per month)" if gf is not None and good_month else "")
    if cap.lower_bound is not None or cap.estimate is not None:
        conf = f" at {cap.confidence:.0%} confidence" if cap.confidence else ""
        good = Clause("goodput", f"{cap.rps_per_group:.4g} {cap.unit} per replica group served within the tail SLO "
                      f"({cap.source}{conf}): the highest offered rate at which the SLO's attainment holds"
                      + at_size, f"study {cap.study_name}: C_SLO fit; {spec_file}: capacity.use, "
                      "capacity.confidence; line items good_fraction, good_requests_per_month")
    else:
        good = Clause("goodput", f"{cap.rps_per_group:.4g} {cap.unit} per replica group ({cap.source}), "
                      "not measured against the SLO" + at_size,
                      f"{spec_file}: capacity.rps_per_group, capacity.good_fraction")
    traffic, total = _value(plan, "traffic_groups"), _value(plan, "total_groups")
    demand = _value(plan, "demand_rps")
    reserves = [(n, _value(plan, k)) for n, k in (("failure", "failure_reserve_groups"),
                                                    ("rollout", "rollout_overlap_groups"),
                                                    ("cold start", "cold_start_reserve_groups"),
                                                    ("warm-floor top-up", "warm_floor_topup_groups"))]
    head = Clause("headroom", f"planned demand {demand:.4g} req/s (peak {_value(plan, 'peak_rps'):.4g} + "
                  f"{sp.demand.uncertainty:.0%} uncertainty) on {plural(traffic, 'traffic group')} "
                  f"({traffic * cap.rps_per_group:.4g} req/s at C); {plural(total, 'group')} in all with "
                  + ", ".join(f"{n} {v:g}" for n, v in reserves)
                  + f"; fleet capacity {_value(plan, 'capacity_total_rps'):.4g} req/s, headroom at peak "
                  f"{_value(plan, 'headroom_at_peak_rps'):.4g} req/s, utilisation at peak "
                  f"{_value(plan, 'utilisation_at_peak_pct'):.1f} %",
                  f"{spec_file}: demand.peak_rps, demand.uncertainty, failure, rollout, autoscaling; "
                  "line items traffic_groups … total_groups")
    a = sp.autoscaling
    ready = sum(x for _, x in a.ready_time_s)
    over = (f"autoscaler: a new group serves {ready:g} s after scale-up" if a.ready_time_s
            else "autoscaler: no ready time given")
    over += (f", demand growth while scaling {a.burst_growth_rps_per_s:g} req/s per s covered by the cold-start "
             f"reserve, warm floor {plural(a.warm_floor_groups, 'group')}")
    over += ("; admission control and queue cap: not stated — the plan spec has no admission or queue-cap "
             "setting, so past capacity requests queue and the tail SLO is breached rather than refused")
    overload = Clause("overload response", over, f"{spec_file}: autoscaling.ready_time_s, "
                      "autoscaling.burst_growth_rps_per_s, autoscaling.warm_floor_groups")
    return CapacityContract((work, slo, good, head, overload))


# ----------------------------------------------------------------------------- chargeback


def split_cents(total_usd: float, weights: list[float]) -> list[float]:
    """Shares of ``total_usd`` in proportion to ``weights``, rounded to the cent so they sum
    exactly to the total in cents (largest remainder; ties to the earlier row)."""
    cents = round(total_usd * 100)
    w = sum(weights)
    if w <= 0:
        raise ValueError("chargeback weights sum to zero")
    exact = [cents * x / w for x in weights]
    base = [int(e // 1) for e in exact]
    left = cents - sum(base)
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return [b / 100 for b in base]


#: the weight, in words (the sheet and docs say it)
WEIGHT_TEXT = ("tokens processed: input tokens ({inp}) + {ow:g} × output tokens; a continuously batched "
               "engine spends its GPU-seconds on the tokens of its batches, and the study does not time "
               "tenants apart, so each tenant's share of the GPU-seconds is its share of these tokens")


@dataclass(frozen=True)
class Chargeback:
    """Cost per tenant / SLO class at the planned size (first quarter's monthly cost)."""

    by: tuple[str, ...]
    rows: tuple[tuple[tuple[str, ...], int, float, float, float, float, float], ...]  # key, n, in, out, share, gpu_h, usd
    total_usd_per_month: float
    gpu_hours_per_month: float
    weight: str

    def to_frame(self):
        import pandas as pd

        cols = [c.replace("_", " ").capitalize() for c in self.by] or ["Traffic"]
        data = [list(k) + [n, i, o, s, g, u] for k, n, i, o, s, g, u in self.rows]
        return pd.DataFrame(data, columns=cols + ["Requests in study", "Input tokens", "Output tokens",
                                                  "Share of tokens", "GPU-hours per month",
                                                  "Cost per month (USD)"])


def chargeback(plan, output_weight: float = 1.0) -> Chargeback:
    """Split the plan's monthly cost (the first quarter's billed fleet) by token-weighted share
    of the study's traffic; one row for all traffic when the study names no tenant or class
    (or the plan has no study)."""
    w = plan.workload
    total = _value(plan, "cost_usd_per_month")
    gpu_h = _value(plan, "billed_gpus") * K.HOURS_PER_MONTH
    if w is None or not w.usage:
        why = "no study" if w is None else "the study's events name no tenant or slo_class"
        return Chargeback((), ((("all traffic",), w.n_requests if w else 0, 0.0, 0.0, 1.0, gpu_h, total),),
                          total, gpu_h, f"one row: {why}, so the whole cost is one charge")
    weights = [i + output_weight * o for _, _, i, o in w.usage]
    usd = split_cents(total, weights)
    s = sum(weights)
    rows = tuple((k, n, i, o, x / s, gpu_h * x / s, u) for (k, n, i, o), x, u in zip(w.usage, weights, usd))
    return Chargeback(w.by, rows, total, gpu_h, WEIGHT_TEXT.format(inp=w.input_column, ow=output_weight))
