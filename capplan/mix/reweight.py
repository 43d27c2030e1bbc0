"""C_SLO at a target mix: per-cell attainment of the tested study reweighted to production's
shares, inside the bootstrap (docs/mix.md, "Reweighting").

1. The one reduction (``capplan.reduce.reduce_study``) sums the study per (run, unit, cell),
   the cells being the target's buckets (input × output length, tenant, class).
2. The unweighted envelope is fitted from those statistics as usual (the tested mix).
3. Every target cell must have tested requests: a target cell with none — or too few, in the
   study or in any usable run — is refused by name (or dropped on request, said aloud).
4. Per usable run, the post-stratified attainment Σ_c w_c k_c / n_c and its replicates from the
   same block draws as the unweighted fit (``capplan.mix.core.reweight_run``); Kish's effective
   sample size of the reweighting, divided by the run's design effect, is the run's N_eff.
5. The isotonic curve, crossing, interval and lower bound are the envelope's
   (``capplan.envelope.envelope_from_points``), fed the reweighted replicates — with the
   headline envelope's between-run variation (``capplan.runeffect``: a random run effect on
   logit attainment, τ estimated from the reweighted runs near the crossing) and its honesty
   verdict (``capplan.honesty``), which a plan on the target mix must pass.

What this cannot see: per-cell attainment is taken from the tested load. A mix with more long
prompts also slows everybody else (more prefill work at the same request rate); reweighting
does not model that load effect — the twin does (docs/mix.md, "The twin at the target mix").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from .. import bootstrap as boot
from ..envelope import Envelope, RunPoints, envelope_from_points, fit_from_stats
from ..errors import SpecError
from ..reduce import Cells, reduce_study
from ..slo import SLO
from ..study import Study, open_study
from ..present import fmt_num, json_text, records
from .core import reweight_run
from .target import PERIODS, Buckets, TargetMix, load_target_periods

MIN_CELL_REQUESTS = 50   # a target cell needs this many tested requests over the usable runs …
MIN_RUN_REQUESTS = 5     # … and this many in every usable run
_SEED_MIX = 1_000_016    # stream id of the Beta-floor draws (apart from the envelope's streams)


def target_cells(buckets: Buckets) -> Cells:
    """The reduction's cell dimensions for a target's buckets."""
    return Cells(input_edges=buckets.input_edges, output_edges=buckets.output_edges,
                 tenant=buckets.tenant, slo_class=buckets.slo_class, hist=())


@dataclass(frozen=True)
class MixFit:
    """The study at its tested mix (``base``) and reweighted to ``target`` (``envelope``)."""

    target: TargetMix
    base: Envelope = field(repr=False)
    envelope: Envelope = field(repr=False)
    cells: pd.DataFrame = field(repr=False)    # per cell: label, tested, target share, ratio
    runs: pd.DataFrame = field(repr=False)     # per run: n, ESS, design effect, N_eff, attainments
    cell_runs: pd.DataFrame = field(repr=False)  # per (run, cell): n, good, attainment
    notes: tuple[str, ...] = ()

    @property
    def cslo(self):
        return self.envelope.cslo

    @property
    def ess(self) -> float:
        """Kish ESS of the reweighting over the usable runs (Σ of the runs' ESS)."""
        u = self.runs[self.runs["usable"]]
        return float(u["ess"].sum())

    @property
    def ess_share(self) -> float:
        u = self.runs[self.runs["usable"]]
        return float(u["ess"].sum() / u["n"].sum()) if len(u) else math.nan

    def to_frame(self) -> pd.DataFrame:
        """Tested mix vs target: C_SLO estimate, interval, lower bound, status, ESS."""
        rows = []
        for what, e, ess in (("tested mix", self.base, float(self.runs.loc[self.runs["usable"], "n"].sum())),
                             (f"target mix ({self.target.period})", self.envelope, self.ess)):
            c = e.cslo
            rows.append({"mix": what, "cslo_estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
                         "lower_bound": c.lower_bound, "status": c.status, "effective_requests": ess})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        rec = records
        return {"target": {"source": self.target.source, "period": self.target.period,
                           "buckets": self.target.buckets.describe(), "cells": rec(self.target.frame)},
                "tested": self.base.cslo.to_dict(), "reweighted": self.envelope.cslo.to_dict(),
                "ess": self.ess, "ess_share": self.ess_share, "cells": rec(self.cells), "runs": rec(self.runs),
                "notes": list(self.notes)}

    def to_json(self, path=None) -> str:
        return json_text(self.to_dict(), path)

    def to_text(self) -> str:
        b, w = self.base.cslo, self.envelope.cslo
        out = [f"SLO: {self.envelope.slo.describe()}",
               "target mix: " + (f"bucket table {self.target.source}" if self.target.period == "table" else
                                 f"{self.target.period} of {self.target.source}")
               + f" ({self.target.buckets.describe()})",
               f"C_SLO at the tested mix:  {fmt_num(b.estimate)} req/s  {b.confidence:.0%} CI [{fmt_num(b.ci_low)}, "
               f"{fmt_num(b.ci_high)}]  lower bound {fmt_num(b.lower_bound)}  ({b.status}; "
               + (self.base.settings_note() or "the measured C_SLO, as capplan envelope prints it") + ")",
               f"C_SLO at the target mix:  {fmt_num(w.estimate)} req/s  {w.confidence:.0%} CI [{fmt_num(w.ci_low)}, "
               f"{fmt_num(w.ci_high)}]  lower bound {fmt_num(w.lower_bound)}  ({w.status}; another quantity: each "
               "cell's tested attainment reweighted to the target's shares)",
               f"effective sample size of the reweighting: {self.ess:,.0f} requests "
               f"({self.ess_share:.0%} of the {int(self.runs.loc[self.runs['usable'], 'n'].sum()):,} tested)", "",
               "cells (tested share → target share, attainment over the study):"]
        for _, r in self.cells.iterrows():
            out.append(f"  {r['label']:<40} {r['tested_share']:6.1%} → {r['target_share']:6.1%}   "
                       f"{int(r['tested_requests']):>8,} requests   attainment {r['attainment']:.4f}")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def figure(self):
        """Attainment against the offered rate: each cell's runs, the tested mix's and the
        target mix's isotonic curves, the target, and both C_SLOs."""
        import plotly.graph_objects as go

        fig = go.Figure()
        for lab, g in self.cell_runs[self.cell_runs["usable"]].groupby("label", sort=False):
            fig.add_trace(go.Scatter(x=g["x"], y=g["attainment"], mode="markers", name=lab, opacity=0.6,
                                     marker={"size": 5 + 10 * np.sqrt(g["share_in_target"].iloc[0])}))
        # the two C_SLOs are often close: their labels go on opposite sides so they never overlap
        for what, e, dash, where in (("tested mix", self.base, "dot", "top left"),
                                     ("target mix", self.envelope, "solid", "bottom right")):
            fig.add_trace(go.Scatter(x=e.levels["x"], y=e.levels["fitted"], mode="lines", name=f"{what} fit",
                                     line={"dash": dash, "width": 3}))
            c = e.cslo
            if c.estimate == c.estimate:
                fig.add_vline(x=c.estimate, line_dash=dash, annotation_text=f"{what} C_SLO {c.estimate:.3g}",
                              annotation_position=where)
        fig.add_hline(y=self.envelope.target, line_dash="dash", annotation_text=f"target {self.envelope.target:g}")
        fig.update_layout(title=f"C_SLO at the tested mix and at the target mix ({self.target.period})",
                          xaxis_title="offered rate (req/s)", yaxis_title="attainment", template="plotly_white")
        return fig



def _weights(stats, target: TargetMix, *, usable: list, min_cell: int, min_run: int,
             drop_untested: bool) -> tuple[np.ndarray, pd.DataFrame, list[str]]:
    """Target share per study cell; refuse (or drop) target cells without enough tested requests."""
    dims = list(target.buckets.dims)
    ci = stats.cell_index
    key_of = {tuple(_key(r[d]) for d in dims): int(r["cell"]) for _, r in ci.iterrows()}
    n_cell = np.zeros(len(ci))
    per_run_min = np.full(len(ci), np.inf)
    for r in usable:
        nc = r.cells.sums["n"].sum(axis=0)
        n_cell += nc
        per_run_min = np.minimum(per_run_min, nc)
    w = np.zeros(len(ci))
    bad, notes = [], []
    for _, row in target.frame.iterrows():
        share = float(row["share"])
        if share <= 0:
            continue
        k = tuple(_key(row[d]) for d in dims)
        c = key_of.get(k)
        tested = 0 if c is None else n_cell[c]
        low_run = 0 if c is None else per_run_min[c]
        if tested < min_cell or low_run < min_run:
            why = ("no tested request" if tested == 0 else
                   f"{tested:,.0f} tested requests (need {min_cell})" if tested < min_cell else
                   f"only {low_run:.0f} in some usable run (need {min_run} per run)")
            bad.append((row["label"], share, why))
            continue
        w[c] = share
    if bad:
        text = "; ".join(f"{lab} (target share {s:.1%}): {why}" for lab, s, why in bad)
        if not drop_untested:
            raise SpecError("target bucket(s) with no or too few tested requests: " + text,
                            field="target",
                            fix="test requests of that shape, merge buckets (coarser --input-edges / "
                                "--output-edges), or drop them from the target (--drop-untested; the rest is "
                                "rescaled and the dropped share is reported)")
        dropped = sum(s for _, s, _ in bad)
        notes.append(f"dropped {dropped:.1%} of the target mix (cells without enough tested requests: {text}); "
                     "the rest was rescaled to 1 — C_SLO says nothing about the dropped traffic")
    if not (w > 0).any():
        raise SpecError("no cell of the target mix has tested requests", field="target",
                        fix="check the buckets: the study and the target must share cells")
    w = w / w.sum()
    tested_total = n_cell.sum()
    good = np.zeros(len(ci))
    for r in usable:
        good += r.cells.sums["n_good"].sum(axis=0)
    table = pd.DataFrame({
        "cell": ci["cell"].to_numpy(),
        "label": [target.buckets.label(r) for _, r in ci.iterrows()],
        "tested_requests": n_cell, "tested_share": n_cell / tested_total if tested_total else np.nan,
        "target_share": w, "attainment": np.where(n_cell > 0, good / np.maximum(n_cell, 1), np.nan)})
    table["weight_ratio"] = np.where(table["tested_share"] > 0, table["target_share"] / table["tested_share"], np.nan)
    for d in dims:
        table[d] = ci[d].to_numpy()
    return w, table, notes


def _key(v):
    return int(v) if isinstance(v, (int, np.integer, float, np.floating)) and not isinstance(v, bool) else str(v)


def fit_mix(study, slo, target: TargetMix, *, confidence: float = 0.95, reps: int = 1000, seed: int = 0,
            scheme: str = "circular", block_len: float | None = None, warmup="manifest", stats=None,
            min_cell_requests: int = MIN_CELL_REQUESTS, min_run_requests: int = MIN_RUN_REQUESTS,
            drop_untested: bool = False, method: str = "run-effect") -> MixFit:
    """C_SLO of ``study`` under ``slo`` at the tested mix and reweighted to ``target`` (module
    docstring). ``stats``: a reduction with the target's cells, to skip reading events;
    ``method``: the envelope's interval method (docs/envelope.md) for both fits."""
    slo = SLO.parse(slo)
    scheme_obj = boot.scheme_from_name(scheme, block_len)
    if stats is None:
        st = study if isinstance(study, Study) else open_study(study)
        if st.manifest.load_model == "closed":
            raise SpecError("reweighting needs an open-loop sweep (offered rates); this study is closed-loop")
        stats = reduce_study(st, slo, warmup=warmup, cells=target_cells(target.buckets))
    if stats.cell_index is None or list(c for c in stats.cell_index.columns if c in target.buckets.dims) \
            != list(target.buckets.dims):
        raise SpecError("the reduced statistics do not have the target's cells",
                        fix="reduce with cells=capplan.mix.reweight.target_cells(target.buckets)")
    # the tested mix is the headline envelope (``method``: run-effect by default, so both fits
    # carry the between-run variation and an honesty verdict; docs/mix.md, "Coverage")
    base = fit_from_stats(stats, slo, confidence=confidence, reps=reps, seed=seed, scheme=scheme_obj,
                          method=method)
    diag = stats.diagnostics.set_index("run_id")
    brow = base.runs.set_index("run_id")
    usable = [r for r in stats.runs if r.n_units and r.run_id in brow.index and bool(brow.loc[r.run_id, "usable"])]
    w, cells, notes = _weights(stats, target, usable=usable, min_cell=min_cell_requests,
                               min_run=min_run_requests, drop_untested=drop_untested)
    rng = np.random.default_rng([int(seed), _SEED_MIX])
    rows, good_rep, n_rep, cell_rows = [], [], [], []
    empty = degen = 0
    for r in usable:
        # the same block draws as the unweighted fit (iid: units drawn independently)
        R = stats.resample(r, scheme_obj, reps=reps, seed=seed)
        n_uc, g_uc = r.cells.sums["n"], r.cells.sums["n_good"]
        deff = float(brow.loc[r.run_id, "design_effect_used"])
        rw = reweight_run(R, n_uc, g_uc, w, deff=deff, rng=rng)
        empty += rw.empty_draws
        degen += rw.degenerate_cells
        b = brow.loc[r.run_id]
        lo, hi = boot.percentile_ci(rw.replicates, confidence)
        rows.append({"run_id": r.run_id, "load_level": b["load_level"], "offered_rps": r.offered_rps,
                     "measured_rps": r.measured_rps, "x": b["x"], "n": rw.n, "n_ok": b["n_ok"] * rw.n / b["n"],
                     "n_good": rw.point * rw.n, "attainment": rw.point, "att_ci_low": lo, "att_ci_high": hi,
                     "tested_attainment": b["attainment"], "ess": rw.ess, "ess_share": rw.ess / rw.n,
                     "design_effect_used": deff, "n_eff": rw.ess / max(deff, 1.0), "usable": True,
                     "reason": "", "warnings": b.get("warnings", ""), "duration_s": b.get("duration_s", math.nan),
                     "warmup_s": b.get("warmup_s", math.nan)})
        good_rep.append(rw.replicates * rw.n)
        n_rep.append(np.full(reps, rw.n))
        nc, kc = n_uc.sum(axis=0), g_uc.sum(axis=0)
        for _, c in cells.iterrows():
            j = int(c["cell"])
            if nc[j] > 0:
                cell_rows.append({"run_id": r.run_id, "x": b["x"], "label": c["label"], "n": nc[j], "good": kc[j],
                                  "attainment": kc[j] / nc[j], "share_in_target": c["target_share"],
                                  "usable": True})
    runs = pd.DataFrame(rows)
    for r in stats.runs:
        if r.run_id not in set(runs["run_id"]):
            notes.append(f"run {r.run_id} excluded: {diag.loc[r.run_id, 'reason'] if r.run_id in diag.index else 'no data'}")
    pts = RunPoints(run_id=runs["run_id"].to_numpy(), level=runs["load_level"].to_numpy(float),
                  x_rate=runs["measured_rps"].to_numpy(float), n=runs["n"].to_numpy(float),
                  n_good=runs["n_good"].to_numpy(float), good_rep=np.column_stack(good_rep),
                  n_rep=np.column_stack(n_rep), n_eff=runs["n_eff"].to_numpy(float))
    if slo.max_error_rate is not None:
        notes.append("the error-rate limit is applied to the tested mix only; the reweighted C_SLO uses "
                     "the attainment target")
    if degen:
        notes.append(f"{degen} (run, cell) pairs with no failure (or no success) got Clopper–Pearson-floor "
                     "replicates at N_eff = requests / the run's design effect")
    if empty:
        notes.append(f"{empty} (replicate, cell) draws held no request of a target cell and kept the run's "
                     "own ratio for it")
    ess_share = float(runs["ess"].sum() / runs["n"].sum())
    if ess_share < 0.25:
        notes.append(f"the reweighting keeps {ess_share:.0%} of the tested requests' worth of information "
                     "(effective sample size): the target leans on cells the study tested little")
    env = envelope_from_points(pts, runs, slo.with_(max_error_rate=None), slo.attainment, confidence=confidence,
                               seed=seed, closed=stats.closed_loop, method=method, stats=stats)
    env = replace(env, reps=reps, seed=seed, scheme=scheme_obj, diagnostics=stats.diagnostics.copy())
    notes.append("per-cell attainment comes from the tested load: a mix with more long prompts also slows "
                 "the other requests, which reweighting does not see (docs/mix.md, \"The twin at the target mix\")")
    if method == "within-run":
        notes.append("both C_SLO intervals here (tested and target mix) are the within-run block bootstrap "
                     "(method within-run): the run-to-run variation near the crossing is not in them, so "
                     "their lower bounds are optimistic (docs/envelope.md)")
    elif env.honesty is not None and not env.honesty.honest:
        notes.append(f"the target mix's lower bound is {env.honesty.status}: {env.honesty.sentence}")
    return MixFit(target=target, base=base, envelope=env, cells=cells, runs=runs,
                  cell_runs=pd.DataFrame(cell_rows), notes=tuple(dict.fromkeys(notes)))


def fit_periods(study, slo, path, buckets: Buckets = Buckets(), *, periods=PERIODS,
                **fit_kw) -> tuple[dict[str, MixFit], tuple[str, ...]]:
    """The target at ``path`` fitted for each period — the day's mix and the peak hour's
    (``load_target_periods``: a table has one, a trace without timestamps only the day's, said
    in the notes) — on one reduction of the study: the first fit's, reused by the next.
    ``fit_kw`` go to :func:`fit_mix` (``stats`` there skips the first reduction too)."""
    targets, notes = load_target_periods(path, buckets, periods)
    stats = fit_kw.pop("stats", None)
    fits = {}
    for period, target in targets.items():
        fits[period] = fit_mix(study, slo, target, stats=stats, **fit_kw)
        stats = fits[period].base.stats
    return fits, notes
