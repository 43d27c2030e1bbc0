"""The report page on the production mix, SLO classes, KV memory and power
(``notebooks/07-mix.ipynb``): everything it shows and exports, computed here so the notebook
stays a list of displays (docs/mix.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ..errors import SpecError
from ..slo import SLO, load_slo_file

#: plan line items and checks this page shows (capplan.plan_bounds)
BOUND_KEYS = ("prefill_tokens_per_s_per_group", "decode_tokens_per_s_per_group", "prefill_tokens_per_s_fleet",
              "decode_tokens_per_s_fleet", "energy_wh_per_1k_input_tokens", "energy_wh_per_1k_output_tokens",
              "energy_wh_per_1k_tokens", "kv_bytes_per_token", "weight_gib_per_replica", "memory_gib_per_replica",
              "kv_gib_per_replica", "kv_tokens_per_replica", "kv_max_sequences", "kv_sequences_needed",
              "kv_bound_rps_per_group", "gpu_peak_w", "node_peak_kw", "peak_it_power_kw",
              "peak_it_power_rollout_kw", "peak_facility_power_kw", "racks")
BOUND_CHECKS = ("weights_fit", "kv_bound", "rack_power", "row_power")


def _mixes(study, slo, spec, path, kw) -> dict:
    """The target's day and peak-hour mixes (a table: one), each reweighted."""
    from .reweight import fit_mix
    from .target import Buckets, load_target

    m = spec.mix
    b = Buckets(input_edges=m.input_edges, output_edges=m.output_edges, tenant="tenant" in m.by,
                slo_class="slo_class" in m.by)
    stats, mixes = None, {}
    for period in ("day", "peak_hour"):
        try:
            tg = load_target(path, b, period=period)
        except SpecError as exc:  # no timestamps: the day's mix only
            if period == "peak_hour" and exc.field == "time_column":
                break
            raise
        mf = fit_mix(study, slo, tg, stats=stats, drop_untested=m.drop_untested, **kw)
        stats = mf.base.stats
        mixes[period] = mf
        if tg.period == "table":
            break
    return mixes


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

    @classmethod
    def build(cls, study, spec, slo, *, slo_file=None, target=None, reps: int = 1000, seed: int = 0,
              confidence: float = 0.95) -> "MixPage":
        from ..cost import study_facts
        from ..envelope import fit_envelope
        from ..plan import load_plan_spec, make_plan
        from .classes import fit_classes

        spec = load_plan_spec(spec)
        slo = SLO.parse(slo)
        spec = replace(spec, capacity=replace(spec.capacity, reps=reps, seed=seed, confidence=confidence))
        classes = load_slo_file(slo_file) if slo_file else spec.slo_classes
        kw = dict(reps=reps, seed=seed, confidence=confidence)
        problems = []
        cfit = None
        if classes is not None:
            try:
                cfit = fit_classes(study, classes, **kw)
            except SpecError as exc:  # a report page states the refusal instead of failing the report
                problems.append(f"SLO classes: {exc.message}" + (f" — {exc.fix}" if exc.fix else ""))
        path = target or spec.mix.target
        mixes = {}
        try:
            mixes = _mixes(study, slo, spec, path, kw) if path else {}
        except SpecError as exc:
            problems.append(f"target mix {path}: {exc.message}" + (f" — {exc.fix}" if exc.fix else ""))
        base = next(iter(mixes.values())).base if mixes else fit_envelope(study, slo, **kw)
        facts = study_facts(study, slo)
        plan = make_plan(replace(spec, slo=slo, slo_classes=None, mix=replace(spec.mix, target=None)),
                         study=study, envelope=base, slo=slo, facts=facts)
        return cls(study=study, spec=spec, slo=slo, classes=cfit, mixes=mixes, plan=plan,
                   target_source=str(path) if path else None, facts=facts, problems=tuple(problems))

    @property
    def kv(self):
        from ..plan_bounds import kv_items

        if self.plan is None:
            return None
        _, _, _, budget = kv_items(self.spec, g=int(self.plan.value("gpus_per_group")),
                                   capacity_rps=self.plan.capacity.rps_per_group, facts=self.facts,
                                   facts_at_capacity=None, system=dict(self.study.manifest.system or {}))
        return budget

    def headline(self) -> str:
        out = [f"**Study** `{self.study.name}` · **SLO** {self.slo.describe()}"]
        out += [f"**Not fitted** — {p}" for p in self.problems]
        if self.classes is not None:
            c = self.classes.cslo
            out.append(f"**Every SLO class**: C_SLO {c.estimate:.4g} req/s, lower bound {c.lower_bound:.4g} "
                       f"({c.status}" + (f"; binding class **{self.classes.binding_class}**" if
                                         self.classes.binding_class else "") + ")")
        for m in self.mixes.values():
            what = "bucket table" if m.target.period == "table" else m.target.period
            out.append(f"**Target mix ({what})**: C_SLO {m.cslo.estimate:.4g} req/s, lower bound "
                       f"{m.cslo.lower_bound:.4g} (tested mix {m.base.cslo.estimate:.4g}, lower bound "
                       f"{m.base.cslo.lower_bound:.4g}); effective sample size {m.ess_share:.0%} of the tested requests")
        return "  \n".join(out)

    def no_classes_text(self) -> str:
        failed = [p for p in self.problems if p.startswith("SLO classes")]
        if failed:
            return "The SLO classes were not fitted: " + failed[0]
        return ("No SLO classes: the plan spec has no `slo_file` / `slo_classes` (see templates/slo.yaml and "
                "docs/mix.md, \"SLO classes\").")

    def no_mix_text(self) -> str:
        failed = [p for p in self.problems if p.startswith("target mix")]
        if failed:
            return "The target mix was not fitted: " + failed[0]
        return ("No target mix: the plan spec has no `mix.target` (a production trace or a bucket table; "
                "docs/mix.md, \"Target mix\").")

    def bounds_frame(self) -> pd.DataFrame:
        df = self.plan.to_frame()
        return df[df["key"].isin(BOUND_KEYS)][["item", "value", "unit", "formula", "inputs"]].reset_index(drop=True)

    def bounds_checks(self) -> pd.DataFrame:
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
                         stats=m.base.stats if m else None, mixfit=m, classfit=self.classes)
        return MixPanel(model)

    def export(self, out_dir, *, time: str | None = None) -> Path:
        """JSON and CSV of the class fit and the mix fits, written atomically as one folder."""
        from ..io import atomic_dir

        out = Path(out_dir)
        with atomic_dir(out) as tmp:
            meta = {"study": self.study.name, "slo": str(self.slo), "time": time,
                    "target": self.target_source, "periods": list(self.mixes)}
            if self.classes is not None:
                (tmp / "slo_classes.json").write_text(self.classes.to_json(), encoding="utf-8")
                self.classes.to_frame().to_csv(tmp / "slo_classes.csv", index=False, lineterminator="\r\n")
                self.classes.per_run().to_csv(tmp / "slo_classes_per_run.csv", index=False, lineterminator="\r\n")
            for period, m in self.mixes.items():
                (tmp / f"mix_{period}.json").write_text(m.to_json(), encoding="utf-8")
                m.cells.to_csv(tmp / f"mix_{period}_cells.csv", index=False, lineterminator="\r\n")
            self.bounds_frame().to_csv(tmp / "bounds.csv", index=False, lineterminator="\r\n")
            (tmp / "mix.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        return out
