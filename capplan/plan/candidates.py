"""Candidates: the same demand planned on several serving configurations (TP2 vs TP4, two GPU
types, an fp8 or speculative-decoding build), the cheapest per SLO-meeting request among those
that meet every check *and answer as well as the baseline*, and whether that choice is settled
given each candidate's C_SLO interval (docs/plan.md "Candidates")::

    from capplan.plan.candidates import Candidate, compare_candidates
    cmp = compare_candidates([Candidate("bf16", spec, study=s_bf16), Candidate("fp8", spec, study=s_fp8)],
                             baseline="bf16")
    cmp.verdict; cmp.to_frame(); cmp.figure()

Quality before cost: a build that changes the answers (quantisation, speculative decoding) is
ranked only with a quality result (``quality:`` in its study.yaml, or ``Candidate.quality``) on
the baseline's eval that is not worse than the baseline's by more than the margin, judged with
both standard errors (:func:`quality_verdict`); the others are "not comparable", with the reason.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from .. import cost as K
from ..contract import QualityResult
from ..errors import SpecError
from ..slo import SLO
from ..spec import number
from .capacity import CapacityInfo
from .make import make_plan
from .spec import PlanSpec, load_plan_spec


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
    #: the build's eval result; None: the study's ``quality`` block, if it has one
    quality: QualityResult | None = None
    #: serves the baseline's build (same weights, dtype and decoding; only the serving topology
    #: differs: TP, a prefill:decode split, replicas), so its answers are the baseline's
    same_outputs: bool = False

    @property
    def quality_result(self) -> QualityResult | None:
        if self.quality is not None:
            return self.quality
        manifest = getattr(self.study, "manifest", None)
        return getattr(manifest, "quality", None)


@dataclass(frozen=True)
class QualityVerdict:
    """May a candidate be ranked against the baseline? ``delta`` is its score minus the
    baseline's (turned so that > 0 is better), ``delta_low``/``delta_high`` the one-sided bounds
    at the confidence, ``margin`` the largest loss accepted (score units)."""

    comparable: bool
    reason: str
    delta: float | None = None
    delta_low: float | None = None
    delta_high: float | None = None
    margin: float | None = None


def quality_verdict(cand: QualityResult | None, base: QualityResult | None, *, margin: float = 0.01,
                    confidence: float = 0.95, same_outputs: bool = False, baseline_name: str = "the baseline"
                    ) -> QualityVerdict:
    """The quality rule (docs/plan.md "Candidates"): with Δ = candidate − baseline score (sign
    turned for lower-is-better evals), SE_Δ = √(SE_c² + SE_b²) and m = ``margin`` × |baseline
    score|, a candidate is ranked when Δ − z·SE_Δ ≥ −m (z the one-sided ``confidence`` quantile
    of the normal: it is shown to lose at most m). Refused as worse when even Δ + z·SE_Δ < −m,
    and as unproven when the bounds straddle −m; refused without a result or on another eval."""
    if same_outputs:
        return QualityVerdict(True, f"same build as {baseline_name} (only the serving topology differs): "
                                    "its answers are the baseline's")
    if cand is None:
        return QualityVerdict(False, "no quality result: a build that may answer worse (fp8, speculative "
                                     "decoding) is not ranked on cost alone; add quality: {eval, score, se}, measured "
                                     "on this build, to its study.yaml")
    if base is None:
        return QualityVerdict(False, f"{baseline_name} has no quality result to compare {cand.eval} with")
    if cand.eval != base.eval:
        return QualityVerdict(False, f"evaluated on {cand.eval!r}, {baseline_name} on {base.eval!r}: not the same eval")
    if cand.higher_is_better != base.higher_is_better:
        return QualityVerdict(False, f"its {cand.eval} result and {baseline_name}'s disagree on whether higher is "
                                     "better: fix higher_is_better in one of the study.yaml files")
    sign = 1.0 if base.higher_is_better else -1.0
    d = sign * (cand.score - base.score)
    se = math.hypot(cand.se, base.se)
    z = NormalDist().inv_cdf(confidence)
    lo, hi = d - z * se, d + z * se
    m = margin * abs(base.score)
    words = (f"{cand.eval} {cand.score:.4g} ± {cand.se:.2g} against {base.score:.4g} ± {base.se:.2g}: "
             f"Δ {d:+.4g} (one-sided {confidence:.0%} bounds {lo:+.4g}, {hi:+.4g}), margin −{m:.4g}")
    if lo >= -m:
        return QualityVerdict(True, f"quality within the margin ({words})", d, lo, hi, m)
    if hi < -m:
        return QualityVerdict(False, f"worse than {baseline_name} by more than the margin ({words})", d, lo, hi, m)
    return QualityVerdict(False, f"not shown to be within the margin: the evals are too uncertain to tell ({words})",
                          d, lo, hi, m)


@dataclass(frozen=True)
class CandidateComparison:
    """Candidates side by side. ``best``: the cheapest per 1 000 SLO-meeting requests among
    those whose plan meets every check and whose quality is comparable with the baseline's
    (``rank`` 1, 2, … in ``rows``; None for the others, ``quality_reason`` says why);
    ``settled``: False when another ranked candidate's cost interval (the plan redone at the
    ends of its capacity CI) overlaps the best's."""

    rows: tuple[dict, ...]
    best: str | None
    settled: bool
    verdict: str
    plans: dict = field(default_factory=dict, compare=False, hash=False)
    baseline: str | None = None  # the candidate the others' quality is judged against

    def to_frame(self):
        import pandas as pd

        df = pd.DataFrame(list(self.rows))
        if "rank" in df:
            df["rank"] = df["rank"].astype("Int64")  # 1, 2, … and <NA> for the unranked
        return df

    def figure(self):
        import plotly.graph_objects as go

        rows = [r for r in self.rows if r.get("cost_usd_per_1k_good_requests") is not None]
        y = [r["cost_usd_per_1k_good_requests"] for r in rows]
        fig = go.Figure(go.Bar(
            x=[r["candidate"] for r in rows], y=y,
            error_y={"type": "data", "symmetric": False,
                     "array": [r["cost_high_usd_per_1k"] - v for r, v in zip(rows, y)],
                     "arrayminus": [v - r["cost_low_usd_per_1k"] for r, v in zip(rows, y)]},
            marker_color=["#2ca02c" if r["candidate"] == self.best else "#1f77b4" if r.get("comparable", True)
                          else "#bbbbbb" for r in rows],
            hovertext=[r.get("quality_reason", "") for r in rows]))
        fig.update_layout(title="Cost per 1 000 SLO-meeting requests (bars: planned at the C_SLO lower bound; "
                                "whiskers: plan at the CI ends; grey: not comparable on quality)",
                          yaxis_title="USD", template="plotly_white")
        return fig


def simulated_candidate(name: str, spec, *, estimate: float, ci_low: float, ci_high: float, gpus_per_group: int,
                        usd_per_gpu_hour: float | None = None, source: str = "simulated steady-state C_SLO",
                        notes: tuple[str, ...] = (), same_outputs: bool = True) -> Candidate:
    """A candidate whose capacity was simulated (a twin's C_SLO of a colocated replica group, or
    of one disaggregated prefill + decode unit — ``capplan.twin.pd``): the group is
    ``gpus_per_group`` GPUs at ``usd_per_gpu_hour`` (a GPU-weighted mean price for pools of
    different GPU types), planned at the lower end of the C_SLO interval, its cost interval from
    the two ends as for a measured candidate. ``same_outputs``: a twin runs the measured build
    in another topology, so its answers are the measured system's (say False for a twin of
    another build)."""
    spec = load_plan_spec(spec)
    changes = {"gpus_per_replica": int(gpus_per_group)}
    if usd_per_gpu_hour is not None:
        changes["price_usd_per_gpu_hour"] = float(usd_per_gpu_hour)
    cap = CapacityInfo(rps_per_group=float(ci_low if ci_low and ci_low > 0 else estimate), source=source,
                       estimate=float(estimate), ci_low=float(ci_low), ci_high=float(ci_high),
                       lower_bound=float(ci_low), confidence=0.95, status="bracketed", notes=tuple(notes))
    return Candidate(name, spec.with_(**changes), capacity=cap, same_outputs=same_outputs)


def sweep_candidates(sweep, spec) -> list[Candidate]:
    """One candidate per row of a prefill:decode sweep (``capplan.twin.pd.pd_sweep``, a ``ScenarioTable``):
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


def compare_candidates(candidates, *, slo=None, baseline: str | None = None, quality_margin: float = 0.01,
                       quality_confidence: float = 0.95) -> CandidateComparison:
    """Plan every candidate; judge its quality against the ``baseline`` (a candidate's name;
    default the first) with :func:`quality_verdict`; rank by cost per SLO-meeting request those
    that meet the SLO, every plan check and the quality rule, and say when the choice is not
    settled because the capacity intervals (translated into cost by re-planning at each CI end)
    overlap. The others get no rank and their reason in words."""
    candidates = list(candidates)
    names = [c.name for c in candidates]
    if baseline is None and candidates:
        baseline = candidates[0].name
    if candidates and baseline not in names:
        raise SpecError(f"baseline {baseline!r} is not a candidate ({', '.join(names)})", field="baseline",
                        fix="name one of the candidates as the baseline")
    number(quality_margin, "quality_margin", minimum=0.0, maximum=1.0, example="0.01")
    number(quality_confidence, "quality_confidence", above=0.5, below=1.0, example="0.95")
    base_q = next((c.quality_result for c in candidates if c.name == baseline), None)
    rows, plans = [], {}
    for cand in candidates:
        row: dict = {"candidate": cand.name, "baseline": cand.name == baseline}
        q = cand.quality_result
        qv = (QualityVerdict(True, "the baseline" + (f" ({q})" if q is not None else ""))
              if cand.name == baseline else
              quality_verdict(q, base_q, margin=quality_margin, confidence=quality_confidence,
                              same_outputs=cand.same_outputs, baseline_name=f"the baseline {baseline}"))
        row.update({"quality_eval": q.eval if q is not None else None,
                    "quality_score": q.score if q is not None else None,
                    "quality_se": q.se if q is not None else None, "quality_delta": qv.delta,
                    "quality_delta_low": qv.delta_low, "quality_margin": qv.margin,
                    "comparable": qv.comparable, "quality_reason": qv.reason})
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
    ranked = sorted((r for r in rows if r.get("meets_slo") and r["comparable"]),
                    key=lambda r: (r["cost_usd_per_1k_good_requests"], r["candidate"]))
    for r in rows:
        r["rank"] = None
        r["cost_interval_overlaps_best"] = None
        r["capacity_per_gpu_overlaps_best"] = None
        r["best"] = False
    for i, r in enumerate(ranked, start=1):
        r["rank"] = i
    refused = [r for r in rows if not r["comparable"]]
    refused_text = "; ".join(f"{r['candidate']} is not comparable: {r['quality_reason']}" for r in refused)
    if not ranked:
        verdict = "no candidate meets the SLO, every plan check and the quality rule"
        if refused:
            verdict += "; " + refused_text
        return CandidateComparison(rows=tuple(rows), best=None, settled=False, plans=plans, verdict=verdict,
                          baseline=baseline)
    best = ranked[0]
    b_int = (best["cost_low_usd_per_1k"], best["cost_high_usd_per_1k"])
    b_cap = (best["capacity_per_gpu_low_rps"], best["capacity_per_gpu_high_rps"])
    rivals = []
    for r in ranked[1:]:
        r["cost_interval_overlaps_best"] = _overlap(b_int, (r["cost_low_usd_per_1k"], r["cost_high_usd_per_1k"]))
        r["capacity_per_gpu_overlaps_best"] = _overlap(b_cap, (r["capacity_per_gpu_low_rps"],
                                                              r["capacity_per_gpu_high_rps"]))
        if r["cost_interval_overlaps_best"]:
            rivals.append(r)
    settled = not rivals
    head = (f"{best['candidate']} is cheapest: ${best['cost_usd_per_1k_good_requests']:.4g} per 1 000 SLO-meeting "
            f"requests (${b_int[0]:.4g}–{b_int[1]:.4g} across its C_SLO interval)")
    if settled:
        verdict = head + "; the choice is settled: no other ranked candidate's interval overlaps it"
    else:
        parts = []
        for r in rivals:
            cap_note = (" (their capacity-per-GPU intervals overlap too)" if r["capacity_per_gpu_overlaps_best"]
                        else "")
            parts.append(f"{r['candidate']} ${r['cost_low_usd_per_1k']:.4g}–{r['cost_high_usd_per_1k']:.4g}{cap_note}")
        verdict = (head + "; NOT settled: its interval overlaps " + ", ".join(parts)
                   + " — run longer or repeat the sweeps near C_SLO to narrow the intervals")
    cheaper = [r for r in refused if r.get("meets_slo")
               and r["cost_usd_per_1k_good_requests"] < best["cost_usd_per_1k_good_requests"]]
    if cheaper:  # said first: the cheapest build on paper is not the one recommended
        verdict = ("; ".join(f"{r['candidate']} would cost less (${r['cost_usd_per_1k_good_requests']:.4g}) but is "
                             f"not comparable: {r['quality_reason']}" for r in cheaper) + ". " + verdict)
        refused = [r for r in refused if r not in cheaper]
        refused_text = "; ".join(f"{r['candidate']} is not comparable: {r['quality_reason']}" for r in refused)
    if refused:
        verdict += ". " + refused_text
    best["best"] = True
    return CandidateComparison(rows=tuple(rows), best=best["candidate"], settled=settled, verdict=verdict, plans=plans,
                      baseline=baseline)
