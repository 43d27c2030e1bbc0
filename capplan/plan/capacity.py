"""The capacity a plan stands on: C_SLO per replica group, from a number given, a fitted
envelope, the SLO classes, production's mix (reweighted, or through the twin), each with its
honesty verdict; a number the study cannot support honestly is refused unless the spec accepts
it (docs/plan.md, "Honest numbers only")."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import CapplanError, SpecError
from ..slo import SLO
from ..spec import number
from .spec import PlanSpec


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
    from ..mix import load_target
    from ..mix.reweight import fit_mix

    m, c = spec.mix, spec.capacity
    target = load_target(m.target, m.buckets(), period=m.period)
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
