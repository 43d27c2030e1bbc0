"""What-if controls for SLO classes and the production mix (docs/mix.md, "What-if").

As the main what-if panel (``capplan.whatif``) it has two layers: :class:`MixModel` does the
slow part once (the reductions and the fits), :func:`mix_state` is a pure function of the model
and a :class:`MixParams` (per-class attainment targets; the target mix's shares; which C_SLO the
plan uses) that re-fits from cached statistics and draws and re-plans; :class:`MixPanel` wires
ipywidgets to it (every control ``continuous_update=False``).
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field, replace

import pandas as pd

from ..errors import SpecError
from ..present import MISSING
from ..viz import FigureArea

ATTAINMENT_CHOICES = (0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
PLAN_ON = {"tested": "tested mix", "target": "target mix", "classes": "every class"}


@dataclass(frozen=True)
class MixParams:
    """One position of every control."""

    class_targets: tuple[tuple[str, float], ...] = ()
    shares: tuple[tuple[str, float], ...] = ()  # cell label → share (renormalised)
    plan_on: str = "tested"

    def with_(self, **kw) -> "MixParams":
        return replace(self, **kw)


@dataclass(frozen=True)
class MixState:
    params: MixParams
    table: pd.DataFrame
    figure: object = field(repr=False)
    plan: object = field(repr=False)
    mix: object = field(repr=False, default=None)
    classes: object = field(repr=False, default=None)
    seconds: float = 0.0


class MixModel:
    """The cached, slow part: study, plan spec, the class fit and the reduction with the target's
    cells (read-only after build)."""

    def __init__(self, study, spec, slo, *, target=None, stats=None, mixfit=None, classfit=None,
                 envelope=None):
        self.study, self.spec, self.slo = study, spec, slo
        self.target, self.stats, self.mixfit, self.classfit = target, stats, mixfit, classfit
        #: the headline envelope (run-to-run variation included): what "tested" plans on, as the
        #: plan page does; the reweighting compares like with like on ``mixfit.base``
        self.envelope = envelope
        from ..cost import study_facts

        self.facts = study_facts(study, slo)

    @classmethod
    def build(cls, study, spec, slo=None, *, target=None, classes=None, reps: int | None = None,
              seed: int | None = None, confidence: float | None = None) -> "MixModel":
        from ..envelope import fit_envelope, fit_from_stats
        from ..plan.inputs import resolve_inputs
        from ..study import open_study
        from ..reduce import reduce_study
        from .classes import fit_classes
        from .reweight import target_cells, fit_mix

        study = open_study(study) if not hasattr(study, "manifest") else study
        # given, else the spec's (capplan.plan.inputs); no built-in SLO: the panel asks for one
        inputs = resolve_inputs(spec, slo=slo, reps=reps, seed=seed, confidence=confidence, builtin_slo=False,
                                option_prefix="")
        spec, slo = inputs.spec, inputs.slo
        if slo is None:
            raise SpecError("the mix panel needs an SLO", field="slo", fix="e.g. ttft_ms=2000,attainment=0.99")
        kw = dict(reps=inputs.reps, seed=inputs.seed, confidence=inputs.confidence)
        stats = mixfit = classfit = None
        if target is not None:
            stats = reduce_study(study, slo, cells=target_cells(target.buckets))
            mixfit = fit_mix(study, slo, target, stats=stats, **kw)
        classes = classes if classes is not None else inputs.slo_classes
        if classes is not None:
            classfit = fit_classes(study, classes, **kw)
        envelope = (fit_from_stats(stats, slo, **kw) if stats is not None else fit_envelope(study, slo, **kw))
        return cls(study, spec, slo, target=target, stats=stats, mixfit=mixfit, classfit=classfit,
                   envelope=envelope)

    def defaults(self) -> MixParams:
        ct = tuple((c, self.classfit.slos[c].attainment) for c in self.classfit.names) if self.classfit else ()
        sh = tuple((r["label"], float(r["share"])) for _, r in self.target.frame.iterrows()) if self.target else ()
        return MixParams(class_targets=ct, shares=sh,
                         plan_on="target" if self.target is not None else "classes" if self.classfit else "tested")


def _target_with(target, shares: tuple[tuple[str, float], ...]):
    f = target.frame.copy()
    by = dict(shares)
    f["share"] = [float(by.get(lab, s)) for lab, s in zip(f["label"], f["share"])]
    tot = float(f["share"].sum())
    if not tot > 0:
        raise SpecError("the target shares add up to 0", field="shares", fix="give some cell a share")
    f["share"] = f["share"] / tot
    return replace(target, frame=f, period=target.period + " (edited)" if shares else target.period)


def mix_state(model: MixModel, params: MixParams) -> MixState:
    """Re-fit from cached statistics and re-plan for one position of the controls."""
    from ..plan import capacity_from_envelope, make_plan
    from .reweight import fit_mix

    t0 = time.perf_counter()
    mf = cf = None
    if model.target is not None:
        base_shares = tuple((r["label"], float(r["share"])) for _, r in model.target.frame.iterrows())
        mf = model.mixfit
        if params.shares and params.shares != base_shares:  # re-weight from the cached statistics
            e = model.mixfit.envelope
            mf = fit_mix(model.study, model.slo, _target_with(model.target, params.shares), stats=model.stats,
                         reps=e.reps, seed=e.seed, confidence=e.confidence,
                         drop_untested=model.spec.mix.drop_untested)
    if model.classfit is not None:
        cf = model.classfit.retarget(dict(params.class_targets)) if params.class_targets else model.classfit
    if params.plan_on not in PLAN_ON:
        raise SpecError(f"unknown plan_on {params.plan_on!r}", field="plan_on", fix="one of " + ", ".join(PLAN_ON))
    source = {"tested": model.envelope if model.envelope is not None else (mf.base if mf is not None else None),
              "target": mf.envelope if mf is not None else None,
              "classes": cf}[params.plan_on]
    if source is None:
        raise SpecError(f"nothing to plan on for {PLAN_ON[params.plan_on]!r}", field="plan_on",
                        fix="build the model with a target mix or SLO classes")
    basis = {"tested": "tested mix", "classes": "SLO classes",
             "target": f"target mix (reweighted, {mf.target.period})" if mf is not None else ""}[params.plan_on]
    cap = capacity_from_envelope(source, model.spec, replicas=model.study.manifest.replicas,
                                 study_name=model.study.name, basis=basis)
    cap = replace(cap, source=cap.source + f" ({PLAN_ON[params.plan_on]})")
    plan = make_plan(model.spec, capacity=cap, study=model.study, facts=model.facts, slo=model.slo)
    rows = []

    def add(key, name, v, unit="req/s"):
        rows.append({"key": key, "quantity": name, "value": float(v) if v is not None else math.nan, "unit": unit})

    if mf is not None:
        add("tested_cslo", "C_SLO at the tested mix", mf.base.cslo.estimate)
        add("tested_lb", "lower bound at the tested mix", mf.base.cslo.lower_bound)
        add("target_cslo", f"C_SLO at the target mix ({mf.target.period})", mf.cslo.estimate)
        add("target_lb", "lower bound at the target mix", mf.cslo.lower_bound)
        add("ess", "effective sample size of the reweighting", mf.ess, "requests")
    if cf is not None:
        add("classes_cslo", "C_SLO, every class meets its target", cf.cslo.estimate)
        add("classes_lb", "lower bound, every class", cf.cslo.lower_bound)
        rows.append({"key": "binding", "quantity": "binding class", "value": math.nan, "unit": cf.binding_class or "—"})
    for key in ("capacity_rps_per_group", "total_groups", "total_gpus", "cost_usd_per_month"):
        it = plan.item(key)
        add(key, it.name, it.value, it.unit)
    table = pd.DataFrame(rows, columns=["key", "quantity", "value", "unit"])
    fig = (mf.figure() if mf is not None and params.plan_on != "classes" else cf.figure() if cf is not None
           else mf.figure())
    return MixState(params=params, table=table, figure=fig, plan=plan, mix=mf, classes=cf,
                    seconds=time.perf_counter() - t0)


def _html(table: pd.DataFrame) -> str:
    e = html.escape

    def shown(r):
        if r.key == "binding":
            return e(r.unit)
        v = r.value
        return MISSING if not (isinstance(v, float) and math.isfinite(v)) else (
            f"{v:,.0f}" if abs(v) >= 1000 or float(v).is_integer() else f"{v:,.4g}")

    rows = "".join(f'<tr data-key="{e(r.key)}"><th>{e(r.quantity)}</th><td class="value">{shown(r)}</td>'
                   f'<td class="unit">{"" if r.key == "binding" else e(r.unit)}</td></tr>'
                   for r in table.itertuples())
    return f'<table class="capplan-mix">{rows}</table>'


class MixPanel:
    """ipywidgets: one attainment slider per SLO class, one share slider per target cell, and
    which C_SLO the plan uses; a table and a figure redrawn on every change."""

    def __init__(self, model: MixModel, params: MixParams | None = None):
        import ipywidgets as W

        self.model = model
        p = params or model.defaults()
        style = {"description_width": "220px"}
        layout = W.Layout(width="520px")
        self.class_sliders = {
            c: W.SelectionSlider(options=[(f"{a:.4g}", a) for a in sorted(set(ATTAINMENT_CHOICES) | {t})],
                                 value=t, description=f"{c} target", continuous_update=False,
                                 style=style, layout=layout)
            for c, t in p.class_targets}
        self.share_sliders = {
            lab: W.FloatSlider(value=round(s, 3), min=0.0, max=1.0, step=0.01, description=f"share {lab}",
                               continuous_update=False, readout_format=".0%", style=style, layout=layout)
            for lab, s in p.shares}
        opts = [(v, k) for k, v in PLAN_ON.items()
                if (k != "classes" or model.classfit is not None) and (k == "classes" or model.target is not None)]
        self.plan_on = W.ToggleButtons(options=opts, value=p.plan_on, description="plan on", style=style)
        self.status, self.table = W.HTML(), W.HTML()
        self.state = self._state(p)
        self.plot = FigureArea(self.state.figure if self.state is not None else None)
        self._show(self.state)
        self.controls = [*self.class_sliders.values(), *self.share_sliders.values(), self.plan_on]
        for c in self.controls:
            c.observe(self._on_change, names="value")
        self.widget = W.VBox([W.HBox([W.VBox(self.controls), W.VBox([self.table, self.status])]), self.plot.widget])

    @property
    def figure(self):
        """The figure on screen."""
        return self.plot.figure

    def params(self) -> MixParams:
        return MixParams(class_targets=tuple((c, float(s.value)) for c, s in self.class_sliders.items()),
                         shares=tuple((lab, float(s.value)) for lab, s in self.share_sliders.items()),
                         plan_on=self.plan_on.value)

    def _state(self, params):
        from ..errors import CapplanError

        try:
            return mix_state(self.model, params)
        except CapplanError as exc:
            self.status.value = f"<pre style='color:#b00;white-space:pre-wrap'>{html.escape(exc.format())}</pre>"
            return None

    def _show(self, state) -> None:
        if state is None:
            return
        self.table.value = _html(state.table)
        self.status.value = (f"<small>capacity: {html.escape(state.plan.capacity.source)} · redrawn in "
                             f"{state.seconds * 1000:.0f} ms</small>")

    def _on_change(self, change) -> None:
        state = self._state(self.params())
        if state is None:
            return
        self.state = state
        self.plot.show(state.figure)
        self._show(state)
