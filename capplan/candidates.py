"""Candidates: the same demand planned on several serving configurations (TP2 vs TP4, two GPU
types), the cheapest per SLO-meeting request that meets every check, and whether that choice
is settled given each candidate's C_SLO interval (docs/plan.md "Candidates")::

    from capplan.candidates import Candidate, compare_candidates
    cmp = compare_candidates([Candidate("TP2", spec2, envelope=env2), Candidate("TP4", spec4, study=s4)])
    cmp.verdict; cmp.to_frame(); cmp.figure()
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from . import cost as K
from .errors import SpecError
from .plan import CapacityInfo, PlanSpec, load_plan_spec, make_plan
from .slo import SLO


@dataclass(frozen=True)
class Candidate:
    """One serving configuration to compare (e.g. TP2 vs TP4, two GPU types): its own spec
    (prices, replica group) and capacity (a number, an envelope, or a study to fit)."""

    name: str
    spec: PlanSpec
    capacity: Any = None  # req/s per group or CapacityInfo
    study: Any = None
    envelope: Any = None
    facts: Any = None


@dataclass(frozen=True)
class Comparison:
    """Candidates side by side. ``best``: the cheapest per 1 000 SLO-meeting requests among
    those whose plan meets every check; ``settled``: False when another passing candidate's
    cost interval (the plan redone at the ends of its capacity CI) overlaps the best's."""

    rows: tuple[dict, ...]
    best: str | None
    settled: bool
    verdict: str
    plans: dict = field(default_factory=dict, compare=False, hash=False)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(list(self.rows))

    def figure(self):
        import plotly.graph_objects as go

        rows = [r for r in self.rows if r.get("cost_usd_per_1k_good_requests") is not None]
        y = [r["cost_usd_per_1k_good_requests"] for r in rows]
        fig = go.Figure(go.Bar(
            x=[r["candidate"] for r in rows], y=y,
            error_y={"type": "data", "symmetric": False,
                     "array": [r["cost_high_usd_per_1k"] - v for r, v in zip(rows, y)],
                     "arrayminus": [v - r["cost_low_usd_per_1k"] for r, v in zip(rows, y)]},
            marker_color=["#2ca02c" if r["candidate"] == self.best else "#1f77b4" for r in rows]))
        fig.update_layout(title="Cost per 1 000 SLO-meeting requests (bars: planned at the C_SLO lower bound; "
                                "whiskers: plan at the CI ends)", yaxis_title="USD", template="plotly_white")
        return fig


def simulated_candidate(name: str, spec, *, estimate: float, ci_low: float, ci_high: float, gpus_per_group: int,
                        usd_per_gpu_hour: float | None = None, source: str = "simulated steady-state C_SLO",
                        notes: tuple[str, ...] = ()) -> Candidate:
    """A candidate whose capacity was simulated (a twin's C_SLO of a colocated replica group, or
    of one disaggregated prefill + decode unit — ``capplan.twin.pd``): the group is
    ``gpus_per_group`` GPUs at ``usd_per_gpu_hour`` (a GPU-weighted mean price for pools of
    different GPU types), planned at the lower end of the C_SLO interval, its cost interval from
    the two ends as for a measured candidate."""
    spec = load_plan_spec(spec)
    changes = {"gpus_per_replica": int(gpus_per_group)}
    if usd_per_gpu_hour is not None:
        changes["price_usd_per_gpu_hour"] = float(usd_per_gpu_hour)
    cap = CapacityInfo(rps_per_group=float(ci_low if ci_low and ci_low > 0 else estimate), source=source,
                       estimate=float(estimate), ci_low=float(ci_low), ci_high=float(ci_high),
                       lower_bound=float(ci_low), confidence=0.95, status="bracketed", notes=tuple(notes))
    return Candidate(name, spec.with_(**changes), capacity=cap)


def sweep_candidates(sweep, spec) -> list[Candidate]:
    """One candidate per row of a prefill:decode sweep (``capplan.twin.pd.PDSweep``):
    disaggregated units and the colocated system, each a group of its GPUs at its price."""
    out = []
    for r in sweep.rows.to_dict("records"):
        cost = r.get("cost_usd_per_hour")
        price = cost / r["gpus"] if cost is not None and math.isfinite(cost) else None
        what = "disaggregated prefill:decode unit" if r["kind"] == "disaggregated" else "colocated replicas"
        out.append(simulated_candidate(r["configuration"], spec, estimate=r["cslo_rps"], ci_low=r["cslo_ci_low_rps"],
                                       ci_high=r["cslo_ci_high_rps"], gpus_per_group=int(r["gpus"]),
                                       usd_per_gpu_hour=price,
                                       source=f"simulated steady-state C_SLO of one {what} ({r['gpus']} GPUs)"))
    return out


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def compare_candidates(candidates, *, slo=None) -> Comparison:
    """Plan every candidate; pick the cheapest per SLO-meeting request that meets the SLO and
    every plan check, and say when the choice is not settled because the capacity intervals
    (translated into cost by re-planning at each CI end) overlap."""
    rows, plans = [], {}
    for cand in candidates:
        row: dict = {"candidate": cand.name}
        try:
            c_slo = SLO.parse(slo) if slo is not None else load_plan_spec(cand.spec).slo
            facts = cand.facts
            if facts is None and cand.study is not None and c_slo is not None:
                facts = K.study_facts(cand.study, c_slo)
            plan = make_plan(cand.spec, cand.capacity, study=cand.study, envelope=cand.envelope, slo=slo,
                             facts=facts)
        except SpecError as exc:
            row.update({"meets_slo": False, "reason": str(exc)})
            rows.append(row)
            continue
        plans[cand.name] = plan
        cap = plan.capacity
        r = cap.study_replicas or 1
        lo_c = cap.ci_low / r if cap.ci_low and cap.ci_low > 0 and math.isfinite(cap.ci_low) else cap.rps_per_group
        hi_c = cap.ci_high / r if cap.ci_high and math.isfinite(cap.ci_high) else cap.rps_per_group
        lo_c = min(lo_c, cap.rps_per_group)
        hi_c = max(hi_c, cap.rps_per_group)
        at = {}
        for tag, c in (("pessimistic", lo_c), ("optimistic", hi_c)):
            p = make_plan(plan.spec, dataclasses.replace(cap, rps_per_group=c), study=cand.study, slo=slo,
                          facts=facts, forecast=plan.forecast)
            at[tag] = p.value("cost_usd_per_1k_good_requests")
        g = plan.value("gpus_per_group")
        row.update({
            "meets_slo": plan.ok,
            "reason": "" if plan.ok else "; ".join(c.sentence for c in plan.checks if not c.ok),
            "capacity_rps_per_group": cap.rps_per_group,
            "capacity_ci_low_rps_per_group": lo_c, "capacity_ci_high_rps_per_group": hi_c,
            "capacity_per_gpu_low_rps": lo_c / g, "capacity_per_gpu_high_rps": hi_c / g,
            "gpus_per_group": g, "total_gpus": plan.value("total_gpus"),
            "cost_usd_per_month": plan.value("cost_usd_per_month"),
            "cost_usd_per_1k_good_requests": plan.value("cost_usd_per_1k_good_requests"),
            "cost_low_usd_per_1k": min(at["optimistic"], at["pessimistic"]),
            "cost_high_usd_per_1k": max(at["optimistic"], at["pessimistic"]),
        })
        rows.append(row)
    passing = [r for r in rows if r.get("meets_slo")]
    if not passing:
        return Comparison(rows=tuple(rows), best=None, settled=False, plans=plans,
                          verdict="no candidate meets the SLO and every plan check")
    best = min(passing, key=lambda r: (r["cost_usd_per_1k_good_requests"], r["candidate"]))
    b_int = (best["cost_low_usd_per_1k"], best["cost_high_usd_per_1k"])
    b_cap = (best["capacity_per_gpu_low_rps"], best["capacity_per_gpu_high_rps"])
    rivals = []
    for r in rows:
        r["cost_interval_overlaps_best"] = None
        r["capacity_per_gpu_overlaps_best"] = None
        if r is best or not r.get("meets_slo"):
            continue
        r["cost_interval_overlaps_best"] = _overlap(b_int, (r["cost_low_usd_per_1k"], r["cost_high_usd_per_1k"]))
        r["capacity_per_gpu_overlaps_best"] = _overlap(b_cap, (r["capacity_per_gpu_low_rps"],
                                                              r["capacity_per_gpu_high_rps"]))
        if r["cost_interval_overlaps_best"]:
            rivals.append(r)
    settled = not rivals
    head = (f"{best['candidate']} is cheapest: ${best['cost_usd_per_1k_good_requests']:.4g} per 1 000 SLO-meeting "
            f"requests (${b_int[0]:.4g}–{b_int[1]:.4g} across its C_SLO interval)")
    if settled:
        verdict = head + "; the choice is settled: no other passing candidate's interval overlaps it"
    else:
        parts = []
        for r in rivals:
            cap_note = (" (their capacity-per-GPU intervals overlap too)" if r["capacity_per_gpu_overlaps_best"]
                        else "")
            parts.append(f"{r['candidate']} ${r['cost_low_usd_per_1k']:.4g}–{r['cost_high_usd_per_1k']:.4g}{cap_note}")
        verdict = (head + "; NOT settled: its interval overlaps " + ", ".join(parts)
                   + " — run longer or repeat the sweeps near C_SLO to narrow the intervals")
    for r in rows:
        r["best"] = r is best
    return Comparison(rows=tuple(rows), best=best["candidate"], settled=settled, verdict=verdict, plans=plans)

