"""SLO classes: one SLO per ``slo_class``, attainment per class per run, and C_SLO = the largest
rate at which every class meets its own target, with the binding class named and one joint
bootstrap for the interval (docs/mix.md, "SLO classes").

How (no second reduction, no second resampler):

1. The study is reduced once per *distinct* SLO of the file by the one reduction
   (``capplan.reduce.reduce_study``) with the ``slo_class`` cell dimension, all over the same
   steady window and the same units, so each class's per-(run, unit) counts — requests, good
   under the class's own SLO, statuses — are columns of those cells.
2. Each class becomes a set of block statistics of its own (its cells summed per unit) with the
   run's **joint** block length (the largest over the reductions), and is fitted by the
   envelope (``capplan.envelope.fit_from_stats``): attainment per run with its interval,
   degenerate runs, the isotonic curve, its crossing.
3. Because every class uses the same units, the same block length and the same random stream
   per run (``default_rng([seed, run_index])``), replicate r of every class comes from the
   *same* block draw of every run — one joint bootstrap. C_SLO of replicate r is the smallest
   of the classes' crossings in r; the estimate is the smallest of the classes' estimates and
   its class is the **binding class**; the interval and the one-sided lower bound are the
   percentiles of the joint replicates (``capplan.mix.core.joint_crossing``).

Requests whose class the file does not name share the ``default`` SLO and are one curve,
"default". A run in which a class has no request is left out for every class (said in the
notes), so all curves keep the same runs and the same picks of repeats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from .. import bootstrap as boot
from ..envelope import CSLO, STATUS_ABOVE, STATUS_BELOW, STATUS_BRACKETED, Envelope, fit_from_stats
from ..errors import SpecError, StudyError
from ..reduce import Cells, reduce_study
from ..slo import DEFAULT_CLASS, SLO, SLOClasses, load_slo_file
from ..study import Study, open_study
from ..present import fmt_num, json_text, records
from .core import JointCrossing, joint_crossing

_FLAG = {STATUS_BRACKETED: 0, STATUS_ABOVE: 1, STATUS_BELOW: -1}
_CELL_SUMS = ("n", "n_good", "n_ok")


@dataclass(frozen=True)
class ClassFit:
    """Per-class envelopes and the joint C_SLO. ``cslo`` is the joint one (what a plan uses);
    ``binding_class`` names the class whose crossing it is."""

    classes: SLOClasses
    names: tuple[str, ...]
    envelopes: dict = field(repr=False)          # curve name → Envelope
    members: dict = field(repr=False)            # curve name → slo_class values in it
    slos: dict = field(repr=False)               # curve name → SLO
    cslo: CSLO = None
    joint: JointCrossing = field(repr=False, default=None)
    binding_class: str = ""
    notes: tuple[str, ...] = ()
    confidence: float = 0.95
    reps: int = 1000
    seed: int = 0
    #: notes of the reduction step (absent classes, runs left out), kept for ``retarget``
    base_notes: tuple[str, ...] = ()

    @property
    def slo(self) -> SLOClasses:
        return self.classes

    @property
    def honesty(self):
        """The joint lower bound's honesty (``capplan.honesty``): honest only when every class
        that binds in some bootstrap replicate has an honest bound of its own — the joint bound
        is a percentile of the smallest crossing, so one optimistic class's crossings pull it
        up. Otherwise the worst status among those classes, with their reasons and runs to add
        named by class. None when the classes' envelopes carry no verdict."""
        from .. import honesty as hon

        share = self.joint.binding_share if self.joint is not None else {}
        binding = [c for c in self.names if share.get(c, 0.0) > 0 or c == self.binding_class] or list(self.names)
        hs = {c: self.envelopes[c].honesty for c in binding}
        if any(h is None for h in hs.values()):
            return None
        rank = {hon.HONEST: 0, hon.UNSUPPORTED: 1, hon.OPTIMISTIC: 2}
        worst = max(hs.values(), key=lambda h: rank.get(h.status, 1))
        lead = hs.get(self.binding_class) or worst
        if worst.honest:
            return hon.Honesty(hon.HONEST, lead.estimand,
                               "every class that binds (" + ", ".join(binding) + ") has an honest lower bound: "
                               + lead.sentence, (), ())
        bad = [c for c in binding if not hs[c].honest]
        reasons = tuple(f"class {c} ({hs[c].status}): {r}" for c in bad for r in (hs[c].reasons or (hs[c].sentence,)))
        runs = tuple(dict.fromkeys(r for c in bad for r in hs[c].runs_to_add))
        return hon.Honesty(worst.status, lead.estimand,
                           f"class(es) {', '.join(bad)} bind(s) in some bootstrap replicates and cannot support an "
                           f"honest lower bound ({worst.sentence})", reasons, runs)

    def retarget(self, targets: dict) -> "ClassFit":
        """The same fit with some classes' attainment targets changed ({class: target}): each
        class re-fits from its cached statistics and draws (no events are read), and the joint
        C_SLO is recombined — what the what-if panel's class sliders call."""
        unknown = sorted(set(targets) - set(self.names))
        if unknown:
            raise SpecError(f"unknown SLO class(es): {', '.join(unknown)}", field="targets",
                            fix="classes: " + ", ".join(self.names))
        envs, slos = dict(self.envelopes), dict(self.slos)
        for c, t in targets.items():
            if float(t) != slos[c].attainment:
                slos[c] = slos[c].with_(attainment=float(t))
                envs[c] = envs[c].refit(attainment=float(t))
        named = tuple((c, slos.get(c, s)) for c, s in self.classes.classes)
        classes = SLOClasses(classes=named, default=slos.get(DEFAULT_CLASS, self.classes.default),
                             source=self.classes.source)
        return _combine(classes, envs, self.members, slos, list(self.base_notes), confidence=self.confidence,
                        reps=self.reps, seed=self.seed)

    def to_frame(self) -> pd.DataFrame:
        """One row per class: its SLO, C_SLO with interval and status, and how often it binds."""
        rows = []
        for c in self.names:
            e = self.envelopes[c]
            rows.append({"slo_class": c, "members": ", ".join(self.members[c]), "slo": self.slos[c].describe(),
                         "target": self.slos[c].attainment, "requests": int(e.runs.loc[e.runs["usable"], "n"].sum()),
                         "cslo_estimate": e.cslo.estimate, "ci_low": e.cslo.ci_low, "ci_high": e.cslo.ci_high,
                         "lower_bound": e.cslo.lower_bound, "status": e.cslo.status,
                         "honesty": e.honesty.status if e.honesty is not None else "",
                         "binds_in_share_of_replicates": self.joint.binding_share.get(c, 0.0),
                         "binding": c == self.binding_class})
        return pd.DataFrame(rows)

    def per_run(self) -> pd.DataFrame:
        """Attainment per class per run (with its interval): one row per (run, class)."""
        cols = ["run_id", "load_level", "x", "n", "n_good", "attainment", "att_ci_low", "att_ci_high",
                "n_eff", "usable", "reason"]
        parts = []
        for c in self.names:
            r = self.envelopes[c].runs
            d = r[[k for k in cols if k in r.columns]].copy()
            d.insert(1, "slo_class", c)
            d["target"] = self.slos[c].attainment
            parts.append(d)
        return pd.concat(parts, ignore_index=True)

    def to_dict(self) -> dict:
        h = self.honesty
        return {"slo_classes": self.classes.to_dict(), "cslo": self.cslo.to_dict(),
                "binding_class": self.binding_class, "honesty": None if h is None else h.to_dict(),
                "classes": records(self.to_frame()), "per_run": records(self.per_run()),
                "notes": list(self.notes),
                "settings": {"confidence": self.confidence, "reps": self.reps, "seed": self.seed}}

    def to_json(self, path=None) -> str:
        return json_text(self.to_dict(), path)

    def to_text(self) -> str:
        c = self.cslo
        out = [f"SLO classes: {self.classes.describe()}",
               f"C_SLO (every class meets its target): {fmt_num(c.estimate)} req/s   status: {c.status}"
               + (f"   binding class: {self.binding_class}" if self.binding_class else ""),
               f"{c.confidence:.0%} CI: [{fmt_num(c.ci_low)}, {fmt_num(c.ci_high)}] req/s   one-sided lower bound: "
               f"{fmt_num(c.lower_bound)} req/s (one joint bootstrap over the classes)", ""]
        h = self.honesty
        if h is not None:
            out += [h.to_text(), ""]
        df = self.to_frame()
        w = max(len(n) for n in df["slo_class"])
        for _, r in df.iterrows():
            out.append(f"  {r['slo_class']:<{w}}  C_SLO {fmt_num(r['cslo_estimate']):>7} [{fmt_num(r['ci_low'])}, "
                       f"{fmt_num(r['ci_high'])}]  {r['status']:<13} binds in {r['binds_in_share_of_replicates']:.0%} "
                       f"of replicates  ({r['slo']}; {r['requests']:,} requests)")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def figure(self):
        """Attainment per class against the offered rate, each with its target, and the joint
        C_SLO with its interval."""
        import plotly.graph_objects as go
        from plotly.colors import qualitative

        fig = go.Figure()
        for i, c in enumerate(self.names):
            e = self.envelopes[c]
            col = qualitative.Plotly[i % len(qualitative.Plotly)]
            r = e.runs[e.runs["usable"]]
            fig.add_trace(go.Scatter(x=r["x"], y=r["attainment"], mode="markers", name=f"{c} runs",
                                     marker={"color": col},
                                     error_y={"type": "data", "symmetric": False,
                                              "array": (r["att_ci_high"] - r["attainment"]).clip(lower=0),
                                              "arrayminus": (r["attainment"] - r["att_ci_low"]).clip(lower=0)}))
            fig.add_trace(go.Scatter(x=e.levels["x"], y=e.levels["fitted"], mode="lines", name=f"{c} fit",
                                     line={"color": col}))
            fig.add_hline(y=e.target, line_dash="dot", line_color=col,
                          annotation_text=f"{c} target {e.target:g}")
        c = self.cslo
        if c.estimate == c.estimate:
            fig.add_vline(x=c.estimate, line_color="green",
                          annotation_text=f"C_SLO {c.estimate:.3g} req/s ({self.binding_class or c.status})")
        if c.ci_low == c.ci_low:
            fig.add_vrect(x0=c.ci_low, x1=c.ci_high, fillcolor="green", opacity=0.1, line_width=0)
        fig.update_layout(title="SLO attainment per class", xaxis_title="offered rate (req/s)",
                          yaxis_title="attainment", template="plotly_white")
        return fig



def _curves(classes: SLOClasses, values: list[str]) -> tuple[dict, dict, list[str]]:
    """Curve name → slo_class values, curve name → SLO, and the named classes absent from the
    data. Named classes present in the data are their own curves; every other value (and
    requests without a class) is "default"."""
    members, slos = {}, {}
    for c in classes.names:
        if c in values:
            members[c], slos[c] = (c,), classes.slo_for(c)
    rest = tuple(v for v in values if v not in classes.names)
    if rest:
        if classes.default is None:
            raise SpecError("requests of class(es) " + ", ".join(repr(v) for v in rest) + " have no SLO and the "
                            "SLO file has no default", field=DEFAULT_CLASS, file=classes.source,
                            fix=f"add '{DEFAULT_CLASS}: {{ttft_ms: 2000, attainment: 0.99}}' or an SLO for "
                                "each of those classes")
        members[DEFAULT_CLASS], slos[DEFAULT_CLASS] = rest, classes.default
    missing = [c for c in classes.names if c not in values]
    if not members:
        raise StudyError("no request of any class of the SLO file in the study", fix="check slo_class values")
    return members, slos, missing


def _class_stats(stats, cells: list[int], joint_bl: list, drop: set[str], reason: dict[str, str]):
    """Block statistics of one class: its cells summed per unit, the joint block lengths,
    runs where any class is absent marked unusable."""
    runs = []
    for r, bl in zip(stats.runs, joint_bl):
        sums = r.cells.sums
        units = {k: sums[k][:, cells].sum(axis=1) for k in sums if k in _CELL_SUMS or k.startswith("st_")}
        runs.append(replace(r, units=units, block_len=bl, tail={}, hist={}, cells=None,
                            grid=np.zeros((r.n_units, 1, 1), dtype=np.int32)))
    diag = stats.diagnostics.copy()
    if drop:
        sel = diag["run_id"].isin(drop)
        diag.loc[sel, "usable"] = False
        diag.loc[sel, "reason"] = [reason[r] for r in diag.loc[sel, "run_id"]]
    return replace(stats, runs=tuple(runs), cells=None, cell_index=None, diagnostics=diag, _cache={})


def _reduce_classes(st: Study, classes: SLOClasses, warmup):
    """One reduction per distinct SLO of the file, with the slo_class cells, over one window;
    the curves (class → values, class → SLO) and the data's class values."""
    distinct: dict[str, SLO] = {}
    for s in [s for _, s in classes.classes] + ([classes.default] if classes.default else []):
        distinct.setdefault(str(s), s)
    cells = Cells(slo_class=True, hist=())
    reduced, window = {}, warmup
    for key, s in distinct.items():
        reduced[key] = reduce_study(st, s, warmup=window, cells=cells)
        window = reduced[key].window
    first = next(iter(reduced.values()))
    values = [str(v) for v in first.cell_index["slo_class"]]
    members, slos, missing = _curves(classes, values)
    notes = []
    if missing:
        notes.append("class(es) in the SLO file with no request in the study: " + ", ".join(missing))
    return reduced, members, slos, values, notes


def class_counts(study, classes, *, warmup="manifest") -> pd.DataFrame:
    """Attainment per class per run, counted exactly (no bootstrap): run_id, load_level,
    slo_class, requests, good (under the class's own SLO), attainment, target, meets."""
    classes = load_slo_file(classes)
    st = study if isinstance(study, Study) else open_study(study)
    reduced, members, slos, values, _ = _reduce_classes(st, classes, warmup)
    rows = []
    for name, vals in members.items():
        red = reduced[str(slos[name])]
        idx = [j for j, v in enumerate(values) if v in vals]
        for r in red.runs:
            n = float(r.cells.sums["n"][:, idx].sum()) if r.cells is not None else 0.0
            g = float(r.cells.sums["n_good"][:, idx].sum()) if r.cells is not None else 0.0
            a = g / n if n else math.nan
            rows.append({"run_id": r.run_id, "load_level": r.load_level, "slo_class": name, "requests": int(n),
                         "good": int(g), "attainment": a, "target": slos[name].attainment,
                         "meets": bool(a >= slos[name].attainment) if n else None})
    return pd.DataFrame(rows)


def fit_classes(study, classes, *, confidence: float = 0.95, reps: int = 1000, seed: int = 0,
                scheme: str = "circular", block_len: float | None = None, warmup="manifest",
                method: str = "run-effect") -> ClassFit:
    """Fit C_SLO under one SLO per class (module docstring). ``classes``: an ``SLOClasses``, an
    SLO-file path or mapping. ``method``: the envelope's interval method (docs/envelope.md;
    ``"within-run"`` gives each class's raw, typical-run crossing)."""
    classes = load_slo_file(classes)
    st = study if isinstance(study, Study) else open_study(study)
    if st.manifest.load_model == "closed":
        raise SpecError("SLO classes need an open-loop sweep (offered rates); this study is closed-loop",
                        fix="fit each class's SLO separately with capplan envelope --slo")
    scheme_obj = boot.scheme_from_name(scheme, block_len)
    reduced, members, slos, values, notes = _reduce_classes(st, classes, warmup)
    first = next(iter(reduced.values()))
    # 2. joint block length per run; runs where a class is absent leave every curve
    joint_bl = []
    for i in range(len(first.runs)):
        bls = [red.runs[i].block_len for red in reduced.values()]
        joint_bl.append(boot.BlockLength(max(b.stationary for b in bls), max(b.circular for b in bls)))
    drop, reason = set(), {}
    for name, vals in members.items():
        red = reduced[str(slos[name])]
        idx = [j for j, v in enumerate(values) if v in vals]
        for r in red.runs:
            if r.cells is None or r.cells.sums["n"][:, idx].sum() == 0:
                drop.add(r.run_id)
                reason[r.run_id] = reason.get(r.run_id, "") or f"class {name} has no request in this run"
    for rid in sorted(drop):
        notes.append(f"run {rid} left out for every class: {reason[rid]}")
    # 3. per-class envelopes on the same draws
    envs = {}
    for name, vals in members.items():
        red = reduced[str(slos[name])]
        idx = [j for j, v in enumerate(values) if v in vals]
        cs = _class_stats(red, idx, joint_bl, drop, reason)
        envs[name] = fit_from_stats(cs, slos[name], confidence=confidence, reps=reps, seed=seed, scheme=scheme_obj,
                                    method=method)
    return _combine(classes, envs, members, slos, notes, confidence=confidence, reps=reps, seed=seed)


def _combine(classes: SLOClasses, envs: dict, members: dict, slos: dict, notes: list, *, confidence: float,
             reps: int, seed: int) -> ClassFit:
    """The joint C_SLO of per-class envelopes fitted on the same draws."""
    base_notes = tuple(notes)
    notes = list(notes)
    names = tuple(members)
    x_max = max(float(e.levels["x"].max()) for e in envs.values())
    jc = joint_crossing(names, [envs[n].cslo.estimate for n in names],
                        [_FLAG.get(envs[n].cslo.status, 0) for n in names],
                        np.vstack([envs[n].crossing_replicates for n in names]),
                        np.vstack([envs[n].crossing_flags for n in names]), x_max=x_max, confidence=confidence)
    status = {0: STATUS_BRACKETED, 1: STATUS_ABOVE, -1: STATUS_BELOW}[jc.flag]
    bind_env = envs[jc.binding] if jc.binding else None
    cslo = CSLO(estimate=jc.estimate, ci_low=jc.ci_low, ci_high=jc.ci_high, lower_bound=jc.lower_bound,
                status=status, confidence=confidence,
                suggested_rates=bind_env.cslo.suggested_rates if bind_env is not None else
                tuple(float(f"{x_max * f:.3g}") for f in (1.25, 1.5, 2.0)),
                binding=bind_env.cslo.binding if bind_env is not None else "")
    if jc.binding:
        others = ", ".join(f"{n} {s:.0%}" for n, s in jc.binding_share.items() if n != jc.binding and s > 0)
        notes.insert(0, f"class {jc.binding} binds: it fails its target first (in "
                        f"{jc.binding_share[jc.binding]:.0%} of bootstrap replicates"
                        + (f"; {others}" if others else "") + ")")
    elif jc.flag == 1:
        notes.insert(0, "every class meets its target at every tested rate: C_SLO is at least the largest "
                        "tested rate; test higher rates to bracket it")
    for n in names:
        notes += [f"{n}: {x}" for x in envs[n].notes if not x.startswith("run ")]
    run_notes = dict.fromkeys(x for n in names for x in envs[n].notes if x.startswith("run "))
    notes += list(run_notes)
    return ClassFit(classes=classes, names=names, envelopes=envs, members=members, slos=slos, cslo=cslo,
                    joint=jc, binding_class=jc.binding, notes=tuple(dict.fromkeys(notes)),
                    confidence=confidence, reps=reps, seed=seed, base_notes=base_notes)
