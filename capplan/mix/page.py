"""The report page on the production mix, SLO classes, KV memory and power
(``notebooks/07-mix.ipynb``): everything it shows and exports, computed here so the notebook
stays a list of displays (docs/mix.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ..errors import CapplanError, SpecError
from ..slo import SLO

#: plan line items and checks this page shows (capplan.plan.bounds)
BOUND_KEYS = ("prefill_tokens_per_s_per_group", "decode_tokens_per_s_per_group", "prefill_tokens_per_s_fleet",
              "decode_tokens_per_s_fleet", "energy_wh_per_1k_input_tokens", "energy_wh_per_1k_output_tokens",
              "energy_wh_per_1k_tokens", "kv_bytes_per_token", "weight_gib_per_replica", "memory_gib_per_replica",
              "kv_gib_per_replica", "kv_tokens_per_replica", "kv_max_sequences", "kv_sequences_needed",
              "kv_bound_rps_per_group", "gpu_peak_w", "node_peak_kw", "peak_it_power_kw",
              "peak_it_power_rollout_kw", "peak_facility_power_kw", "racks")
BOUND_CHECKS = ("weights_fit", "kv_bound", "rack_power", "row_power")


@dataclass(frozen=True)
class MixPage:
    study: object = field(repr=False)
    spec: object = field(repr=False)
    slo: SLO
    classes: object = field(repr=False, default=None)   # ClassFit
    mixes: dict = field(repr=False, default_factory=dict)  # period → MixFit
    plan: object = field(repr=False, default=None)
    target_source: str | None = None
    facts: object = field(repr=False, default=None)
    #: why the classes or the mix could not be fitted on this study (a refusal, said on the page)
    problems: tuple[str, ...] = ()
    twins: dict = field(repr=False, default_factory=dict)  # period → TwinMix (the target mix through the twin)
    twin_source: str | None = None
    #: the headline envelope (run-to-run variation included): the plan's number, as on the plan page
    envelope: object = field(repr=False, default=None)
    #: said on the page: a default that changed a number, a period the target could not give
    notes: tuple[str, ...] = ()

    @classmethod
    def build(cls, study, spec, slo=None, *, slo_file=None, target=None, reps: int | None = None,
              seed: int | None = None, confidence: float | None = None, twin=None,
              twin_runs: int | None = None, twin_draws: int = 10) -> "MixPage":
        """The page's fits. The SLO, bootstrap, SLO classes (``slo_file``), target mix and twin
        are those given, else the plan spec's (``capplan.plan.inputs``, as on every page)."""
        from ..cost import study_facts
        from ..envelope import fit_envelope, fit_from_stats
        from ..plan import make_plan
        from ..plan.inputs import resolve_inputs
        from .classes import fit_classes
        from .loadeffect import twin_periods
        from .reweight import fit_periods

        inputs = resolve_inputs(spec, slo=slo, reps=reps, seed=seed, confidence=confidence,
                                slo_file=slo_file or None, target=target or None, twin=twin or None,
                                option_prefix="")
        spec, slo, classes = inputs.spec, inputs.slo, inputs.slo_classes
        reps, seed, confidence = inputs.reps, inputs.seed, inputs.confidence
        kw = dict(reps=reps, seed=seed, confidence=confidence)
        problems = []
        cfit = None
        if classes is not None:
            try:
                cfit = fit_classes(study, classes, **kw)
            except SpecError as exc:  # a report page states the refusal instead of failing the report
                problems.append(f"SLO classes: {exc.message}" + (f" — {exc.fix}" if exc.fix else ""))
        path = inputs.target
        mixes, notes = {}, ()
        m = spec.mix
        try:
            if path:  # the day's and the peak hour's mix, as `capplan mix` fits them
                mixes, notes = fit_periods(study, slo, path, m.buckets(), drop_untested=m.drop_untested, **kw)
        except SpecError as exc:
            problems.append(f"target mix {path}: {exc.message}" + (f" — {exc.fix}" if exc.fix else ""))
        twin_path = inputs.twin
        twins = {}
        if twin_path and mixes:
            try:  # the twin's warning is on the page (headline and each result)
                twins = twin_periods(twin_path, study, slo, mixes, seed=seed, runs=twin_runs, draws=twin_draws,
                                     drop_untested=m.drop_untested)
            except CapplanError as exc:  # a bad twin file or a refused cell: said on the page
                msg, fix = getattr(exc, "message", str(exc)), getattr(exc, "fix", None)
                problems.append(f"twin {twin_path}: {msg}" + (f" — {fix}" if fix else ""))
        # the plan page's number: the headline envelope (run-to-run variation included), from
        # the mix's reduction where there is one
        first = next(iter(mixes.values())).base if mixes else None
        env = (fit_from_stats(first.stats, slo, **kw) if first is not None and first.stats is not None
               else fit_envelope(study, slo, **kw))
        facts = study_facts(study, slo)
        try:
            plan = make_plan(replace(spec, slo=slo, slo_classes=None,
                                     mix=replace(spec.mix, target=None, plan_on="tested")),
                             study=study, envelope=env, slo=slo, facts=facts)
        except SpecError as exc:  # a refused plan (e.g. no honest lower bound) is said on the page
            plan = None
            problems.append(f"plan bounds: {exc.message}" + (f" — {exc.fix}" if exc.fix else ""))
        return cls(study=study, spec=spec, slo=slo, classes=cfit, mixes=mixes, plan=plan,
                   target_source=str(path) if path else None, facts=facts, problems=tuple(problems),
                   twins=twins, twin_source=str(twin_path) if twin_path else None, envelope=env,
                   notes=inputs.notes + notes)

    def vs_plan(self, *, twins_only: bool = False) -> list[dict]:
        """Production's mix — each period reweighted and, with a twin, through the twin —
        costed as a plan beside the tested-mix plan (``capplan.plan.compare_numbers``). Only
        when the spec plans on the tested mix (a plan on the target mix or the twin carries its
        own comparison). ``twins_only``: the twin's rows, which the report's index cannot get
        from the plan record."""
        from ..plan import compare_numbers, twin_bound

        if self.plan is None or self.spec.mix.plan_on != "tested" or not (self.twins or self.mixes):
            return []
        cap = self.plan.capacity
        r = self.study.manifest.replicas or 1
        use = self.spec.capacity.use
        alts = []
        for m in ([] if twins_only else self.mixes.values()):
            v = getattr(m.cslo, use)
            if v == v and v > 0:
                h = m.envelope.honesty
                alts.append({"basis": f"target mix (reweighted, {m.target.period})", "rps_per_group": float(v) / r,
                             "rps_system": float(v), "status": h.status if h is not None else "no verdict",
                             "sentence": h.sentence if h is not None else ""})
        for t in self.twins.values():
            w = t.at_target
            v = twin_bound(w, self.spec.capacity.confidence) if use == "lower_bound" else w.estimate
            if v == v and v > 0:
                alts.append({"basis": f"target mix (twin, {t.mix.target.period})", "rps_per_group": float(v) / r,
                             "rps_system": float(v), "status": "unsupported",
                             "sentence": "the twin's interval is not a measured, honest lower bound"})
        if not alts:
            return []
        return list(compare_numbers(replace(self.plan, capacity=replace(cap, alternatives=tuple(alts)))))

    def plan_words(self) -> str:
        """Which number the plan stands on, and what production's mix would cost (said on the
        page, as the report's index says it)."""
        return "  \n".join(r["sentence"] for r in self.vs_plan())

    @property
    def kv(self):
        from ..plan.bounds import kv_items

        if self.plan is None:
            return None
        _, _, _, budget = kv_items(self.spec, g=int(self.plan.value("gpus_per_group")),
                                   capacity_rps=self.plan.capacity.rps_per_group, facts=self.facts,
                                   facts_at_capacity=None, system=dict(self.study.manifest.system or {}))
        return budget

    def headline(self) -> str:
        out = [f"**Study** `{self.study.name}` · **SLO** {self.slo.describe()}"]
        out += [f"**Not fitted** — {p}" for p in self.problems]
        out += [f"**Note** — {n}" for n in self.notes]
        if self.classes is not None:
            c = self.classes.cslo
            out.append(f"**Every SLO class**: C_SLO {c.estimate:.4g} req/s, lower bound {c.lower_bound:.4g} "
                       f"({c.status}" + (f"; binding class **{self.classes.binding_class}**" if
                                         self.classes.binding_class else "") + ")")
        for m in self.mixes.values():
            what = "bucket table" if m.target.period == "table" else m.target.period
            h = m.envelope.honesty
            out.append(f"**Target mix ({what})**: C_SLO {m.cslo.estimate:.4g} req/s, lower bound "
                       f"{m.cslo.lower_bound:.4g}" + (f" ({h.status})" if h is not None else "")
                       + f" (tested mix {m.base.cslo.estimate:.4g}, lower bound "
                       f"{m.base.cslo.lower_bound:.4g}); effective sample size {m.ess_share:.0%} of the tested requests")
        for t in self.twins.values():
            what = "bucket table" if t.mix.target.period == "table" else t.mix.target.period
            d = t.disagreement
            out.append(f"**The twin at the target mix ({what})**: C_SLO {t.at_target.estimate:.4g} req/s "
                       f"[{t.at_target.ci_low:.4g}, {t.at_target.ci_high:.4g}]"
                       + (f", {d:+.0%} from reweighting — " + ("they agree" if t.agree else "they disagree")
                          if d == d else ""))
        words = self.plan_words()
        if words:
            out.append(f"**The plan** (`mix.plan_on: {self.spec.mix.plan_on}`): {words}")
        if any(t.warning for t in self.twins.values()):
            out.append("**" + next(t.warning for t in self.twins.values() if t.warning) + "**")
        return "  \n".join(out)

    def no_twin_text(self) -> str:
        failed = [p for p in self.problems if p.startswith("twin ")]
        if failed:
            return "The target mix was not run through the twin: " + failed[0]
        if self.twin_source and not self.mixes:
            return "The twin needs a target mix: the plan spec has none (or it was not fitted)."
        return ("No twin: give one (`capplan report --twin twin.yaml`, or `mix.twin` in the plan spec) to run the "
                "target mix through it — the load effect reweighting cannot see.")

    def no_classes_text(self) -> str:
        failed = [p for p in self.problems if p.startswith("SLO classes")]
        if failed:
            return "The SLO classes were not fitted: " + failed[0]
        return ("No SLO classes: the plan spec has no `slo_file` / `slo_classes` (templates/slo.yaml is an "
                "example).")

    def no_mix_text(self) -> str:
        failed = [p for p in self.problems if p.startswith("target mix")]
        if failed:
            return "The target mix was not fitted: " + failed[0]
        return ("No target mix: the plan spec has no `mix.target` (a production trace or a bucket "
                "table).")

    def bounds_frame(self) -> pd.DataFrame:
        if self.plan is None:  # refused: the reason is in ``problems``
            return pd.DataFrame(columns=["item", "value", "unit", "formula", "inputs"])
        df = self.plan.to_frame()
        return df[df["key"].isin(BOUND_KEYS)][["item", "value", "unit", "formula", "inputs"]].reset_index(drop=True)

    def bounds_checks(self) -> pd.DataFrame:
        if self.plan is None:
            return pd.DataFrame(columns=["check", "ok"])
        df = self.plan.checks_frame()
        df = df[df["key"].isin(BOUND_CHECKS)].copy()
        df["ok"] = df["ok"].map({True: "holds", False: "FAILS"})
        return df[["check", "ok"]].reset_index(drop=True)

    def panel(self):
        """The what-if controls on the first mix (or the classes), or None without either."""
        from .panel import MixModel, MixPanel

        if self.classes is None and not self.mixes:
            return None
        m = next(iter(self.mixes.values()), None)
        model = MixModel(self.study, self.spec, self.slo, target=m.target if m else None,
                         stats=m.base.stats if m else None, mixfit=m, classfit=self.classes,
                         envelope=self.envelope)
        return MixPanel(model)

    def export(self, out_dir, *, time: str | None = None) -> Path:
        """JSON and CSV of the class fit and the mix fits, written atomically as one folder."""
        from ..io import atomic_dir, check_out

        out = check_out(out_dir, "mix.json", "mix export")
        with atomic_dir(out) as tmp:
            meta = {"study": self.study.name, "slo": str(self.slo), "time": time,
                    "target": self.target_source, "periods": list(self.mixes), "twin": self.twin_source}
            if self.classes is not None:
                (tmp / "slo_classes.json").write_text(self.classes.to_json(), encoding="utf-8")
                self.classes.to_frame().to_csv(tmp / "slo_classes.csv", index=False, lineterminator="\r\n")
                self.classes.per_run().to_csv(tmp / "slo_classes_per_run.csv", index=False, lineterminator="\r\n")
            for period, m in self.mixes.items():
                (tmp / f"mix_{period}.json").write_text(m.to_json(), encoding="utf-8")
                m.cells.to_csv(tmp / f"mix_{period}_cells.csv", index=False, lineterminator="\r\n")
            for period, t in self.twins.items():
                (tmp / f"mix_{period}_twin.json").write_text(t.to_json(), encoding="utf-8")
                t.to_frame().to_csv(tmp / f"mix_{period}_twin.csv", index=False, lineterminator="\r\n")
            self.bounds_frame().to_csv(tmp / "bounds.csv", index=False, lineterminator="\r\n")
            (tmp / "plan_vs_mix.json").write_text(json.dumps(self.vs_plan(twins_only=True), indent=2), encoding="utf-8")
            (tmp / "mix.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        return out
