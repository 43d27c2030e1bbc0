"""The target mix run through a calibrated twin: the load effect reweighting cannot see
(docs/mix.md, "The twin at the target mix").

Reweighting takes each cell's attainment at the *tested* load. A mix with more long prompts
also slows every other request (more prefill work at the same request rate); a twin
(capplan.twin) simulates that. Here the twin serves two workloads made of the study's own
cells — each cell a tenant whose lengths are the quantile table of the study's completed
requests in that cell (the pool the twin's own length fit uses), at the cell's tested share
and at its target share — and its C_SLO is found at each mix under the study's protocol (runs
as long as the measured ones, their warm-up left out, the attainment pooled over many runs:
``capplan.twin.steady_cslo`` with the protocol's duration). The same random streams serve both
mixes, so the difference is the mix. Shown beside the measured study's C_SLO at the tested mix
and reweighted to the target: both answers at the target mix, their disagreement in words,
and how well the twin reproduces the tested mix (how far to trust it).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from ..errors import SpecError
from ..reduce import NONE_LABEL
from ..slo import SLO
from ..study import Study, open_study
from ..sim.config import Tenant
from ..twin import SteadyCSLO, Twin, TwinWarning, load_twin, steady_cslo
from ..twin.data import load_study
from ..twin.params import notes_text
from ..twin.workload_fit import empirical_lengths, length_pool
from ..present import MISSING, fmt_num, is_missing, json_text, records
from .reweight import MIN_CELL_REQUESTS, MixFit, fit_mix
from .target import TargetMix

#: in-window requests pooled per evaluated rate by default (at the reweighted C_SLO): with 300-s runs of
#: templates/synth-mix.yaml this gave a Monte-Carlo SD of ≈ 3 % of C_SLO (docs/mix.md)
POOLED_REQUESTS = 20_000
MIN_RUNS, MAX_RUNS = 4, 64  # runs pooled per evaluated rate
POOL_FROM_RUNS = 8  # by default, simulate on 2 processes from this many runs per rate
#: the twin at the tested mix "reproduces the study" within the measured interval widened by this
#: share (the practical margin ``twin check`` allows for C_SLO, docs/twin.md)
CALIBRATION_MARGIN = 0.05


@dataclass(frozen=True)
class TwinMix:
    """Reweighting and the twin at the tested and the target mix (module docstring).
    ``tested`` / ``at_target``: the twin's C_SLO (capplan.twin.SteadyCSLO) at each mix;
    ``mix``: the measured study's fit (tested mix and reweighted); ``cells``: the workload the
    twin served (per cell: shares, completed requests behind its lengths, medians)."""

    twin_name: str
    mix: MixFit = field(repr=False)
    tested: SteadyCSLO = field(repr=False)
    at_target: SteadyCSLO = field(repr=False)
    cells: pd.DataFrame = field(repr=False)
    duration_s: float = math.nan
    warmup_s: float = math.nan
    runs: int = 0
    seed: int = 0
    warning: str = ""  # the twin's check warning ('' when its last check agreed)
    notes: tuple[str, ...] = ()

    # ------------------------------------------------------------------ the numbers
    @property
    def measured(self):
        """The measured study's C_SLO at the tested mix (the envelope)."""
        return self.mix.base.cslo

    @property
    def reweighted(self):
        """The measured study's C_SLO reweighted to the target mix."""
        return self.mix.cslo

    @property
    def disagreement(self) -> float:
        """(twin − reweighted) / reweighted at the target mix: < 0 when the twin sees a load effect."""
        return _rel(self.at_target.estimate, self.reweighted.estimate)

    @property
    def agree(self) -> bool:
        """Do the two target-mix intervals overlap?"""
        r, t = self.reweighted, self.at_target
        vals = (r.ci_low, r.ci_high, t.ci_low, t.ci_high)
        if any(v is None or not math.isfinite(v) for v in vals):
            return False
        return not (t.ci_high < r.ci_low or r.ci_high < t.ci_low)

    @property
    def calibration(self) -> float:
        """(twin − measured) / measured at the tested mix: how far the twin is off where it can be checked."""
        return _rel(self.tested.estimate, self.measured.estimate)

    @property
    def twin_change(self) -> float:
        """The twin's C_SLO at the target mix relative to its tested mix, − 1."""
        return _rel(self.at_target.estimate, self.tested.estimate)

    @property
    def reweighting_change(self) -> float:
        return _rel(self.reweighted.estimate, self.measured.estimate)

    def in_words(self) -> str:
        """Both answers at the target mix and what their disagreement means."""
        r, t, m, tt = self.reweighted, self.at_target, self.measured, self.tested
        if not (_finite(t.estimate) and _finite(r.estimate)) or r.estimate <= 0 or t.estimate <= 0:
            why = "; ".join(t.notes[:1]) or "no crossing"
            return (f"At the target mix reweighting gives {fmt_num(r.estimate)} req/s; the twin could not place "
                    f"C_SLO there ({why}), so the two cannot be compared.")
        d = self.disagreement
        out = [f"At the target mix, reweighting gives {fmt_num(r.estimate)} req/s {_ci(r)} and the twin "
               f"{fmt_num(t.estimate)} req/s {_ci(t)}"]
        if self.agree:
            out[0] += (f": they agree (the twin is {d:+.0%} from reweighting and the intervals overlap) — the load "
                       "effect of the new mix is within what the two can tell apart.")
        elif t.estimate < r.estimate:
            out[0] += (f": the twin is {-d:.0%} lower and the intervals do not overlap. This is the load effect: the "
                       "target mix carries more work per request, which slows every request, and reweighting (each "
                       "cell's attainment at the tested load) cannot see it. Plan on the lower figure, or test the "
                       "target mix.")
        else:
            out[0] += (f": the twin is {d:.0%} higher and the intervals do not overlap: the target mix carries less "
                       "work per request, so every request is served faster than at the tested load; reweighting, "
                       "which keeps the tested load, is the cautious figure.")
        if _finite(self.reweighting_change) and _finite(self.twin_change):
            out.append(f"From the tested mix, reweighting moves C_SLO by {_pct(self.reweighting_change)}, the twin "
                       f"by {_pct(self.twin_change)}.")
        if _finite(tt.estimate) and _finite(m.estimate):
            ok = _finite(m.ci_low) and _finite(m.ci_high)
            inside = ok and m.ci_low <= tt.estimate <= m.ci_high
            near = ok and m.ci_low * (1 - CALIBRATION_MARGIN) <= tt.estimate <= m.ci_high * (1 + CALIBRATION_MARGIN)
            s = (f"At the tested mix the twin gives {fmt_num(tt.estimate)} req/s against the measured "
                 f"{fmt_num(m.estimate)} {_ci(m)} ({_pct(self.calibration)}): ")
            if inside:
                s += "inside the measured interval, so the twin reproduces the study where it can be checked."
            elif near:
                s += (f"within {CALIBRATION_MARGIN:.0%} of the measured interval (the margin twin check allows for "
                      "C_SLO), so the twin reproduces the study where it can be checked, about that closely.")
            else:
                s += ("outside the measured interval: the twin is off by that much where it can be checked, so its "
                      "target-mix figure is at least as uncertain — check the twin (capplan twin check) before "
                      "relying on it.")
            out.append(s)
        if self.warning:
            out.append(self.warning)
        return " ".join(out)

    # ------------------------------------------------------------------ presentation
    def to_frame(self) -> pd.DataFrame:
        """One row per answer: the measured study at the tested mix and reweighted, the twin at both."""
        rows = []
        for source, mix, c, method in (
                ("measured", "tested", self.measured, "envelope of the measured runs"),
                ("measured", "target", self.reweighted, "per-cell attainment reweighted to the target shares"),
                ("twin", "tested", self.tested, "twin at the tested cell shares"),
                ("twin", "target", self.at_target, "twin at the target cell shares (load effect included)")):
            lb = getattr(c, "lower_bound", math.nan)
            rows.append({"source": source, "mix": mix, "cslo_estimate": c.estimate, "ci_low": c.ci_low,
                         "ci_high": c.ci_high, "lower_bound": lb, "status": getattr(c, "status", None)
                         or _twin_status(c.estimate), "method": method})
        return pd.DataFrame(rows)

    def display_frame(self) -> pd.DataFrame:
        """to_frame() for people: readable headers."""
        df = self.to_frame()
        df["source"] = df["source"].map({"measured": "measured study", "twin": "twin"})
        df["mix"] = df["mix"].map({"tested": "tested mix", "target": f"target mix ({self.mix.target.period})"})
        return df.rename(columns={"source": "Source", "mix": "Mix", "cslo_estimate": "C_SLO (req/s)",
                                  "ci_low": "95 % low", "ci_high": "95 % high", "lower_bound": "Lower bound",
                                  "status": "Status", "method": "How"})

    def to_dict(self) -> dict:
        c = self.mix.base.cslo
        return {"twin": self.twin_name, "warning": self.warning or None, "slo": self.mix.envelope.slo.to_dict(),
                "target": {"source": self.mix.target.source, "period": self.mix.target.period},
                "measured_tested": c.to_dict(), "reweighted": self.reweighted.to_dict(),
                "twin_tested": self.tested.to_dict(), "twin_target": self.at_target.to_dict(),
                "disagreement": _num(self.disagreement), "agree": self.agree,
                "calibration": _num(self.calibration), "twin_change": _num(self.twin_change),
                "reweighting_change": _num(self.reweighting_change), "in_words": self.in_words(),
                "protocol": {"duration_s": self.duration_s, "warmup_s": self.warmup_s, "runs": self.runs,
                             "seed": self.seed},
                "cells": records(self.cells), "notes": list(self.notes)}

    def to_json(self, path=None) -> str:
        return json_text(self.to_dict(), path)

    def to_text(self) -> str:
        tg = self.mix.target
        lines = []
        if self.warning:
            lines.append(self.warning)
        what = (tg.source if tg.source.startswith("bucket table") else f"bucket table {tg.source}") \
            if tg.period == "table" else f"{tg.period} of {tg.source}"
        lines.append(f"the twin {self.twin_name!r} at the target mix ({what}): "
                     f"{self.runs} runs of {self.duration_s:g} s (first {self.warmup_s:g} s left out) pooled per rate")
        for _, r in self.to_frame().iterrows():
            what = f"{'measured study' if r['source'] == 'measured' else 'twin'}, {r['mix']} mix"
            lines.append(f"  {what:<26} {fmt_num(r['cslo_estimate']):>8} req/s  CI [{fmt_num(r['ci_low'])}, "
                         f"{fmt_num(r['ci_high'])}]  ({r['status']}; {r['method']})")
        lines.append("")
        lines.append(self.in_words())
        lines.append("")
        lines.append("cells the twin served (tested share → target share; completed requests behind the lengths):")
        for _, r in self.cells.iterrows():
            lines.append(f"  {r['label']:<40} {r['tested_share']:6.1%} → {r['target_share']:6.1%}   "
                         f"{int(r['completed_requests']):>7,} completed, input median {r['input_median']:,.0f}, "
                         f"output median {r['output_median']:,.0f}")
        return "\n".join(lines + notes_text(self.notes))

    def figure(self):
        """The four C_SLOs with their intervals: measured and twin, at the tested and the target mix."""
        import plotly.graph_objects as go

        df = self.to_frame()
        names = {"tested": "tested mix", "target": f"target mix ({self.mix.target.period})"}
        fig = go.Figure()
        for source, label, color in (("measured", "measured study (reweighted at the target mix)", "#1f77b4"),
                                     ("twin", "twin (load effect included)", "#d62728")):
            g = df[df["source"] == source]
            fig.add_trace(go.Scatter(
                x=g["cslo_estimate"], y=[names[m] for m in g["mix"]], mode="markers", name=label,
                marker={"size": 12, "color": color},
                error_x={"type": "data", "symmetric": False,
                         "array": (g["ci_high"] - g["cslo_estimate"]).clip(lower=0).fillna(0),
                         "arrayminus": (g["cslo_estimate"] - g["ci_low"]).clip(lower=0).fillna(0)}))
        fig.update_layout(title="C_SLO at the tested and the target mix: reweighting vs the twin",
                          xaxis_title="C_SLO (req/s)", yaxis_title="", template="plotly_white",
                          yaxis={"categoryorder": "array", "categoryarray": list(names.values())[::-1]})
        return fig


def _twin_status(v) -> str:
    if v == 0:
        return "misses the SLO at every simulated rate"
    if v == math.inf:
        return "meets the SLO at every simulated rate"
    return "simulated" if _finite(v) else "no crossing"


def _pct(x) -> str:
    if is_missing(x):
        return MISSING
    t = f"{x:+.0%}"
    return "±0%" if t in ("+0%", "-0%") else t


def _rel(a, b) -> float:
    return a / b - 1.0 if _finite(a) and _finite(b) and b > 0 else math.nan


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float, np.floating)) and math.isfinite(v)


def _num(v):
    return float(v) if _finite(v) else None


def _ci(c) -> str:
    return f"[{fmt_num(c.ci_low)}, {fmt_num(c.ci_high)}]"


# ----------------------------------------------------------------------------- the cells as tenants


def cell_lengths(study: Study, mixfit: MixFit, *, wait_s: float, min_completed: int = MIN_CELL_REQUESTS,
                 drop_untested: bool = False) -> tuple[tuple[Tenant, ...], tuple[Tenant, ...], pd.DataFrame, list[str]]:
    """One synth tenant per cell the study tested, at its tested share and at its target share,
    with the lengths of the cell's completed requests (the twin's length pool: runs without
    load-related failures, see ``capplan.twin.workload_fit.length_pool``). A target cell with
    fewer than ``min_completed`` completed requests is refused (or dropped, said in the notes);
    a cell only the tested mix has is left out of the tested workload (said)."""
    b = mixfit.target.buckets
    dims = list(b.dims)
    pool, pool_note = length_pool(load_study(study), wait_s)
    notes = [pool_note] if pool_note else []
    rows = study.sql("SELECT input_tokens, output_tokens, tenant, slo_class FROM events WHERE status = 'ok' "
                     "AND input_tokens >= 1 AND output_tokens >= 1 AND list_contains(?, run_id)",
                     [[r.run_id for r in pool]]).df()
    ib, ob = b.index_of(rows["input_tokens"].to_numpy(), rows["output_tokens"].to_numpy())
    key = {"input_bucket": ib, "output_bucket": ob,
           "tenant": rows["tenant"].fillna(NONE_LABEL).astype(str).to_numpy(),
           "slo_class": rows["slo_class"].fillna(NONE_LABEL).astype(str).to_numpy()}
    inp, out = rows["input_tokens"].to_numpy(np.int64), rows["output_tokens"].to_numpy(np.int64)
    tested, target, table, short_target, short_tested = [], [], [], [], []
    for _, c in mixfit.cells.iterrows():
        sel = np.ones(len(rows), bool)
        for d in dims:
            v = c[d]
            sel &= (key[d] == int(v)) if d.endswith("_bucket") else (key[d] == str(v))
        n = int(sel.sum())
        ts, ws = float(c["tested_share"]), float(c["target_share"])
        if ts <= 0 and ws <= 0:
            continue
        if n < min_completed:
            (short_target if ws > 0 else short_tested).append((c["label"], ts, ws, n))
            continue
        lengths = empirical_lengths(inp[sel], out[sel])
        cls = str(c["slo_class"]) if "slo_class" in dims else None
        name = str(c["label"])
        if ts > 0:
            tested.append(Tenant(name, ts, cls, lengths))
        if ws > 0:
            target.append(Tenant(name, ws, cls, lengths))
        table.append({"label": name, "tested_share": ts, "target_share": ws, "completed_requests": n,
                      "input_median": float(np.median(inp[sel])), "output_median": float(np.median(out[sel])),
                      **{d: c[d] for d in dims}})
    if short_target:
        text = "; ".join(f"{lab} (target share {w:.1%}): {n} completed requests" for lab, _, w, n in short_target)
        if not drop_untested:
            raise SpecError("target cell(s) with too few completed requests in the study to give the twin their "
                            f"lengths (need {min_completed}): {text}", field="target",
                            fix="test requests of that shape, merge buckets (coarser edges), or drop them "
                                "(--drop-untested; the rest is rescaled and the dropped share reported)")
        notes.append(f"the twin's target workload leaves out {sum(w for _, _, w, _ in short_target):.1%} of the "
                     f"target mix (too few completed requests for their lengths: {text}); the rest was rescaled")
    if short_tested:
        notes.append("the twin's tested workload leaves out "
                     f"{sum(t for _, t, _, _ in short_tested):.1%} of the tested requests (cells with fewer than "
                     f"{min_completed} completed requests: " + ", ".join(lab for lab, *_ in short_tested) + ")")
    if not target or not tested:
        raise SpecError("no cell of the mix has enough completed requests to give the twin its lengths",
                        field="target", fix="check the buckets: the study and the target must share cells")
    tot_t, tot_w = sum(t.share for t in tested), sum(t.share for t in target)
    tested = tuple(replace(t, share=t.share / tot_t) for t in tested)
    target = tuple(replace(t, share=t.share / tot_w) for t in target)
    df = pd.DataFrame(table)
    df["tested_share"] = df["tested_share"] / df["tested_share"].sum()
    df["target_share"] = df["target_share"] / df["target_share"].sum()
    return tested, target, df, notes


# ----------------------------------------------------------------------------- the comparison


def twin_mix(twin: Twin | str, study, slo, target: TargetMix, *, mixfit: MixFit | None = None,
             confidence: float = 0.95, reps: int = 1000, seed: int = 0, runs: int | None = None,
             draws: int = 10, duration_s: float | None = None, warmup_s: float | None = None,
             workers: int | None = None, drop_untested: bool = False,
             min_cell_requests: int = MIN_CELL_REQUESTS, **fit_kw) -> TwinMix:
    """C_SLO at ``target`` by reweighting ``study`` and by running the mix through ``twin``
    (a Twin or a twin.yaml path), with the twin at the tested mix beside it (module docstring).

    ``mixfit``: an existing ``fit_mix`` of the same study, SLO and target (else fitted here with
    ``confidence``, ``reps``, ``seed``, ``drop_untested``, ``min_cell_requests`` and ``fit_kw``).
    The twin's runs: ``duration_s`` / ``warmup_s`` (default: the measured runs' median), ``runs``
    pooled per evaluated rate (default: enough for 20,000 in-window requests at the reweighted
    C_SLO, 4–64), ``draws`` parameter draws for its interval, ``seed`` the workload seed, on
    ``workers`` processes (default 2 from 8 runs per rate, else 1; the numbers do not depend on
    it). A twin whose last check disagreed warns (TwinWarning) and the result repeats the warning."""
    tw = load_twin(twin) if not isinstance(twin, Twin) else twin
    slo = SLO.parse(slo)
    st = study if isinstance(study, Study) else open_study(study)
    if mixfit is None:
        mixfit = fit_mix(st, slo, target, confidence=confidence, reps=reps, seed=seed, drop_untested=drop_untested,
                         min_cell_requests=min_cell_requests, **fit_kw)
    warning = tw.warning
    if warning:
        warnings.warn(warning, TwinWarning, stacklevel=2)
    quiet = replace(tw, last_check=None)  # warned once here, not in every simulated run
    proto = quiet.synth_config(itl=False)
    dur = float(proto.duration_s if duration_s is None else duration_s)
    warm = float(proto.warmup_s if warmup_s is None else warmup_s)
    if not 0 <= warm < dur:
        raise SpecError(f"the twin's warm-up ({warm:g} s) must be shorter than its runs ({dur:g} s)",
                        field="warmup_s", fix="give a shorter warm-up or longer runs")
    tested_t, target_t, cells, notes = cell_lengths(st, mixfit, wait_s=tw.timeout_s, min_completed=min_cell_requests,
                                                    drop_untested=drop_untested)
    start_t = _start(mixfit.base.cslo.estimate)
    start_w = _start(mixfit.cslo.estimate) or start_t
    if runs is None:  # enough runs for POOLED_REQUESTS in-window requests at the lower start
        lowest = min([x for x in (start_t, start_w) if x] or [1.0])
        runs = int(np.clip(math.ceil(POOLED_REQUESTS / max(lowest * (dur - warm), 1.0)), MIN_RUNS, MAX_RUNS))
    at_tested = replace(quiet, workload=replace(quiet.workload, tenants=tested_t))
    at_target = replace(quiet, workload=replace(quiet.workload, tenants=target_t))
    kw = dict(runs=runs, draws=draws, seed=seed, duration_s=dur, warmup_s=warm)
    if workers is None:  # a pool of processes pays off only for many runs (starting one costs seconds)
        workers = 1 if runs < POOL_FROM_RUNS else min(2, os.cpu_count() or 1)
    workers = max(1, min(int(workers), runs))
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
            s_t = steady_cslo(at_tested, slo, start=start_t, executor=ex, **kw)
            s_w = steady_cslo(at_target, slo, start=start_w, executor=ex, **kw)
    else:
        s_t = steady_cslo(at_tested, slo, start=start_t, workers=1, **kw)
        s_w = steady_cslo(at_target, slo, start=start_w, workers=1, **kw)
    notes += [f"twin at the tested mix: {n}" for n in s_t.notes]
    notes += [f"twin at the target mix: {n}" for n in s_w.notes]
    notes.append("the twin's C_SLO is the rate where its attainment, pooled over the runs, meets the target (under "
                 "the study's run length, so it is comparable with the measured one); its interval holds the "
                 "Monte-Carlo error and the twin's parameter uncertainty, not the sampling error of the cells' "
                 "lengths or what the twin cannot model (docs/twin.md, \"What the twin cannot see\")")
    if tw.edited:
        notes.append("the twin was edited by hand: " + ", ".join(tw.edited))
    return TwinMix(twin_name=tw.name, mix=mixfit, tested=s_t, at_target=s_w, cells=cells, duration_s=dur,
                   warmup_s=warm, runs=int(runs), seed=int(seed), warning=warning,
                   notes=tuple(dict.fromkeys(notes)))


def _start(v) -> float | None:
    return float(v) if _finite(v) and v > 0 else None


def twin_periods(twin: Twin | str, study, slo, fits: dict, **kw) -> dict[str, TwinMix]:
    """Each period's fitted mix (``reweight.fit_periods``) run through ``twin`` (:func:`twin_mix`
    with ``kw``). The TwinWarning of a twin whose last check disagreed is not raised: it is on
    every result (``TwinMix.warning``), for the caller to say once."""
    tw = load_twin(twin) if not isinstance(twin, Twin) else twin
    st = study if isinstance(study, Study) else open_study(study)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TwinWarning)
        return {period: twin_mix(tw, st, slo, m.target, mixfit=m, **kw) for period, m in fits.items()}
