"""The comparison table: one row per metric and run family, each a difference candidate −
baseline with its bootstrap interval; the gate of every row; the verdict.

Families (docs/compare.md §3). The *steady* runs are those where the baseline was stationary
and within its SLO capacity (its fitted attainment meets the target): what a release must not
break. The *saturated* runs (the baseline at or over its SLO capacity, overloaded, not
stationary or unusable) are gated separately — their run-to-run spread is far larger than
what one run shows, so their intervals include it (repeats, or the widening factor). Which
family a run belongs to is decided by the baseline alone, so a candidate that falls over at a
load the baseline handled is judged among the steady runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import bootstrap as boot
from .. import contract as C
from ..slo import SLO
from .gates import Gates
from .result import METRICS, Q_METRICS, Verdict
from .sampling import Draws, quantile
from .sides import Arrays, Side, energy_per_good, telemetry
from .stats import judge, simultaneous_ci
from .workload import RunPair

STEADY, SATURATED, SWEEP = "steady runs", "saturated runs", "sweep"
FAMILIES = {"steady": STEADY, "saturated": SATURATED}


@dataclass
class Ctx:
    """Everything the tables are computed from (internal, one per compare call)."""

    b: Side
    c: Side
    ab: Arrays
    ac: Arrays
    db: Draws
    dc: Draws
    g: Gates
    slo: SLO
    conf: float
    conf_family: float
    cells: pd.DataFrame
    pairs: list[RunPair]
    pairing: pd.DataFrame
    paired: bool
    blocks: pd.DataFrame  # per pair: units, unit seconds, block units and requests
    regimes: pd.DataFrame  # per pair: family, why
    in_edges: tuple
    out_edges: tuple
    out_col: str
    split: tuple
    seed: int
    envs: tuple | None = None  # (baseline, candidate) envelopes from the same statistics
    notes: list[str] = field(default_factory=list)

    @property
    def n_units(self) -> int:
        return int(self.db.offsets[-1])

    def family(self, name: str) -> list[int]:
        return [int(p) for p, f in zip(self.regimes["pair"], self.regimes["family"]) if f == name]

    def detail(self) -> tuple[list[int], str]:
        """The runs of the fairness table, and their scope: the steady runs, or — when the
        baseline has none — the saturated ones (their intervals widened as above)."""
        steady = self.family("steady")
        if steady:
            return steady, STEADY
        if not any("fairness" in n for n in self.notes):
            self.notes.append("the baseline has no steady run within its SLO capacity: the "
                              "fairness rows are over the saturated runs")
        return self.family("saturated"), SATURATED


# ============================================================================ run families


def classify_runs(b: Side, env_b, pairs: list[RunPair], slo: SLO) -> pd.DataFrame:
    """Per pair: family ("steady" / "saturated") and why, from the baseline only: its
    diagnostics (usable, overloaded, no steady state, too short) and its attainment on the
    envelope's monotone fit (the raw run attainment where the fit has none) against the SLO
    target — the fit, not the raw value, so one unlucky violation in a 100-request light-load
    run does not make it "beyond capacity"."""
    diag = b.stats.diagnostics.set_index("run_id")
    fitted = {}
    if env_b is not None and "fitted" in env_b.runs:
        fitted = dict(zip(env_b.runs["run_id"], env_b.runs["fitted"]))
    rows = []
    for p in pairs:
        r = b.stats.run(p.baseline)
        att = r.n_good / r.n if r.n else math.nan
        n_err = r.n - float(r.units["n_ok"].sum()) if r.n_units else 0.0
        f = fitted.get(p.baseline, math.nan)
        level = f if np.isfinite(f) else att
        d = diag.loc[p.baseline] if p.baseline in diag.index else None
        why = ""
        if d is None or not bool(d["usable"]):
            why = "baseline run unusable: " + (str(d["reason"]) if d is not None else "no data")
        elif bool(d["overloaded"]):
            why = "baseline not stationary (TTFT trend: rising through the run)"
        elif bool(d["mser_in_second_half"]):
            why = "baseline has no steady state (warm-up reaches the second half)"
        elif bool(d["too_short"]):
            why = "baseline still trending at the end of the run (not steady yet)"
        elif not level >= slo.attainment:
            why = (f"baseline beyond its SLO capacity: attainment {att:.4f}"
                   + (f" (monotone fit {f:.4f})" if np.isfinite(f) else "")
                   + f" < target {slo.attainment:g}")
        elif slo.max_error_rate is not None and r.n and n_err / r.n > slo.max_error_rate:
            why = (f"baseline beyond its SLO capacity: error rate {n_err / r.n:.4f} > "
                   f"{slo.max_error_rate:g}")
        rows.append({"pair": p.index, "family": "saturated" if why else "steady", "why": why})
    return pd.DataFrame(rows)


# ============================================================================ rows


def make_row(metric: str, scope: str, base: float, cand: float, reps_b=None, reps_c=None,
             note: str = "") -> dict:
    spec = METRICS[metric]
    d = cand - base if np.isfinite(base) and np.isfinite(cand) else float("nan")
    reps = None
    if reps_b is not None and reps_c is not None:
        reps = np.asarray(reps_c, dtype=np.float64) - np.asarray(reps_b, dtype=np.float64)
    return {"metric": metric, "label": spec.label, "scope": scope, "unit": spec.unit,
            "better": spec.better, "kind": spec.kind, "baseline": float(base),
            "candidate": float(cand), "delta": d,
            "delta_pct": 100.0 * d / abs(base) if np.isfinite(d) and base != 0 else float("nan"),
            "_reps": reps, "note": note}


def _window_s(off, runs) -> float:
    """Σ over ``runs`` of the steady window's scheduled span (s)."""
    f = off.facts.iloc[list(runs)]
    span = (f["last_ns"] - f["first_ns"]).clip(lower=0).fillna(0).sum() / C.NS_PER_S
    return float(span) if span > 0 else float("nan")


def _ratio(ctx: Ctx, num: str | tuple, den: str, runs) -> tuple:
    """Point and replicate Σnum / Σden over ``runs`` for both sides (num may be a tuple of
    sums added together)."""
    out = []
    for a, d in ((ctx.ab, ctx.db), (ctx.ac, ctx.dc)):
        names = (num,) if isinstance(num, str) else num
        x = sum(a.sums[k].sum(axis=1) for k in names)
        y = a.sums[den].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append((float(d.point(x, runs) / d.point(y, runs)),
                        d.replicates(x, runs) / d.replicates(y, runs)))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def _rate_per_gpu(ctx: Ctx, num: str, runs) -> tuple:
    """Σnum / Σwindow / GPUs: replicates resample the count (arrival noise included; it
    cancels when paired), the window is held fixed."""
    out = []
    for a, d, side in ((ctx.ab, ctx.db, ctx.b), (ctx.ac, ctx.dc, ctx.c)):
        x = a.sums[num].sum(axis=1)
        w = _window_s(side.offered, runs) * side.gpus
        out.append((float(d.point(x, runs)) / w, d.replicates(x, runs) / w))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def family_rows(ctx: Ctx, name: str) -> list[dict]:
    """Rows of one run family (see the module docstring for which rows where)."""
    runs = ctx.family(name)
    scope = FAMILIES[name]
    if not runs:
        return []
    rows = []
    Ab, Ac, rb, rc = _ratio(ctx, "n_good", "n", runs)
    rows.append(make_row("attainment", scope, Ab, Ac, rb, rc))
    if name == "steady":
        p = ctx.g.percentile
        for metric, hkey in Q_METRICS.items():
            if hkey == "itl" and not (ctx.b.has_itl and ctx.c.has_itl):
                if ctx.b.has_itl != ctx.c.has_itl:
                    ctx.notes.append("ITL p99 not compared: only one study recorded itl_ns")
                continue
            out = []
            for a, d in ((ctx.ab, ctx.db), (ctx.ac, ctx.dc)):
                u, _, k, cnt = a.hist[hkey]
                out.append(quantile(d, runs, u, k, cnt, p, ctx.n_units))
            (pb, qb), (pc, qc) = out
            rows.append(make_row(metric, scope, pb, pc, qb, qc))
            rows[-1]["label"] = rows[-1]["label"].replace("p99", C.pct_label(p))
    rows.append(make_row("goodput_rps_per_gpu", scope, *_rate_per_gpu(ctx, "n_good", runs)))
    if name == "saturated":
        rows.append(make_row("throughput_rps_per_gpu", scope, *_rate_per_gpu(ctx, "n_ok", runs)))
    failures = ("st_timeout", "st_error", "st_cancelled")
    rows.append(make_row("error_rate", scope, *_ratio(ctx, failures, "n", runs)))
    rows.append(make_row("reject_rate", scope, *_ratio(ctx, "st_rejected", "n", runs)))
    if name == "steady":  # errors at steady load are a bug, not noise: no interval needed
        Eb, Ec, _, _ = _ratio(ctx, "st_error", "n", runs)
        rows.append(make_row("server_error_rate", scope, Eb, Ec))
    return rows


def cslo_rows(ctx: Ctx) -> list[dict]:
    """C_SLO of each study from ``capplan.envelope.fit_from_stats`` on the same reduced
    statistics (so the same steady windows) as every other row; the CI of the difference from
    the two fits' replicate crossings (the same resample streams when the trace is paired)."""
    levels = {p.level for p in ctx.pairs}
    if ctx.b.study.load_model != C.LoadModel.OPEN.value or len(levels) < 2:
        ctx.notes.append("C_SLO not compared: it needs an open-loop sweep of at least two "
                         "offered rates")
        return []
    if ctx.envs is None or any(e is None for e in ctx.envs):
        ctx.notes.append("C_SLO not compared: the envelope could not be fitted on one side "
                         "(see `capplan envelope`)")
        return []
    reps = ctx.db.reps
    vals = [float(env.cslo.estimate) for env in ctx.envs]
    reps_ = [np.asarray(env.crossing_replicates, dtype=np.float64) for env in ctx.envs]

    def one(name, cs):
        return (f"{name} {cs.estimate:.4g} [{cs.ci_low:.4g}, {cs.ci_high:.4g}], lower bound "
                f"{cs.lower_bound:.4g} ({cs.status})")

    note = "; ".join(one(n, env.cslo) for n, env in zip(("baseline", "candidate"), ctx.envs))
    usable = all(r.size == reps and np.isfinite(r).mean() >= 0.95 for r in reps_)
    if not usable:
        ctx.notes.append("C_SLO difference has no CI: the capacity is not bracketed by the "
                         "tested rates in too many replicates (see `capplan envelope`)")
        r = make_row("cslo_rps", SWEEP, vals[0], vals[1], note=note)
        r["kind"] = "info"
        return [r]
    return [make_row("cslo_rps", SWEEP, vals[0], vals[1], reps_[0], reps_[1], note=note)]


def sweep_rows(ctx: Ctx) -> list[dict]:
    """Missing requests (paired), peak GPU memory; energy and cost per SLO-meeting request
    over the steady runs (energy held fixed, the SLO-good count resampled: E/good scales with
    1/good; cost = $/GPU-h ÷ (goodput per GPU × 3.6))."""
    rows = []
    if ctx.paired:
        miss = float(ctx.pairing["missing"].sum())
        extra = float(ctx.pairing["extra"].sum())
        rows.append(make_row("missing_requests", SWEEP, 0.0, miss,
                             note=f"{extra:,.0f} extra in the candidate" if extra else ""))
    tb, tc = telemetry(ctx.b.study), telemetry(ctx.c.study)
    if "peak_gpu_mem_gib" in tb and "peak_gpu_mem_gib" in tc:
        rows.append(make_row("peak_gpu_mem_gib", SWEEP, tb["peak_gpu_mem_gib"],
                             tc["peak_gpu_mem_gib"]))
    elif tb or tc:
        ctx.notes.append("peak GPU memory not compared: only one study has mem_used_bytes "
                         "telemetry")
    steady = ctx.family("steady")
    if not steady:
        return rows
    gpb, gpc, gprb, gprc = _rate_per_gpu(ctx, "n_good", steady)
    levels = [{ctx.b.stats.run(ctx.pairs[p].baseline).load_level for p in steady},
              {ctx.c.stats.run(ctx.pairs[p].candidate).load_level for p in steady}]
    eb, _ = energy_per_good(ctx.b, ctx.slo, levels[0])
    ec, _ = energy_per_good(ctx.c, ctx.slo, levels[1])
    with np.errstate(divide="ignore", invalid="ignore"):
        if np.isfinite(eb) and np.isfinite(ec):
            rows.append(make_row("energy_j_per_good_request", STEADY, eb, ec,
                                 eb * gpb / gprb, ec * gpc / gprc))
        elif np.isfinite(eb) or np.isfinite(ec):
            ctx.notes.append("energy per SLO-meeting request not compared: power telemetry in "
                             "one study only")
        if ctx.g.baseline_usd_per_gpu_hour is not None:
            pb, pc = ctx.g.baseline_usd_per_gpu_hour, ctx.g.candidate_usd_per_gpu_hour
            rows.append(make_row("cost_usd_per_1k_good", STEADY, pb / (gpb * 3.6),
                                 pc / (gpc * 3.6), pb / (gprb * 3.6), pc / (gprc * 3.6),
                                 note="price per GPU-hour from the gates file (cost:)"))
    return rows


def run_rows(ctx: Ctx) -> list[dict]:
    """Per matched run (info): the measured offered rate and the attainment with a pointwise
    interval; the note says the run's family and why."""
    rows = []
    why = dict(zip(ctx.regimes["pair"], ctx.regimes["why"]))
    for p in ctx.pairs:
        fb, fc = ctx.b.offered.facts.iloc[p.index], ctx.c.offered.facts.iloc[p.index]
        rows.append(make_row("offered_rps", f"run {p.baseline}", fb["rate_rps"], fc["rate_rps"]))
    if len(ctx.pairs) < 2:
        return rows
    for p in ctx.pairs:
        Ab, Ac, rb, rc = _ratio(ctx, "n_good", "n", [p.index])
        r = make_row("attainment", f"run {p.baseline}", Ab, Ac, rb, rc,
                     note=why[p.index] or "steady")
        r["kind"] = "info"
        rows.append(r)
    return rows


# ============================================================================ table, verdict


def gate_applies(ctx: Ctx, row: dict) -> bool:
    if row["scope"] == SATURATED:
        return ctx.g.runs.gate_saturated
    return row["scope"] in (STEADY, SWEEP)


def finish_table(rows: list[dict], ctx: Ctx) -> pd.DataFrame:
    """CIs: one simultaneous family over the gated stat rows; pointwise for the rest; then the
    verdict of every row."""
    def gated(r):
        return ctx.g.gate(r["metric"]).enabled and gate_applies(ctx, r)

    fam = [i for i, r in enumerate(rows) if r["kind"] == "stat" and r["_reps"] is not None
           and gated(r) and np.isfinite(r["delta"])]
    lo = np.full(len(rows), np.nan)
    hi = np.full(len(rows), np.nan)
    kinds = [""] * len(rows)
    if fam:
        D = np.column_stack([rows[i]["_reps"] for i in fam])
        l_, h_ = simultaneous_ci(D, [rows[i]["delta"] for i in fam], ctx.conf_family)
        lo[fam], hi[fam] = l_, h_
        for i in fam:
            kinds[i] = "simultaneous"
    for i, r in enumerate(rows):
        if i in fam or r["_reps"] is None or not np.isfinite(r["delta"]):
            continue
        lo[i], hi[i] = boot.percentile_ci(r["_reps"], ctx.conf)
        kinds[i] = "pointwise"
    for i, r in enumerate(rows):
        r["ci_low"], r["ci_high"], r["ci_kind"] = lo[i], hi[i], kinds[i]
        gate = ctx.g.gate(r["metric"]) if r["scope"] in (STEADY, SATURATED, SWEEP) else None
        use = gate if gate is not None and gated(r) else None
        if r["kind"] == "deterministic":
            change, verdict = judge(r["better"], r["baseline"], r["candidate"], np.nan, np.nan,
                                    use, deterministic=True)
        elif kinds[i]:
            change, verdict = judge(r["better"], r["baseline"], r["candidate"], lo[i], hi[i],
                                    use if i in fam else None)
        else:
            change = ""
            verdict = "info" if np.isfinite(r["delta"]) else "n/a"
        r["change"], r["verdict"] = change, verdict
        if gate is None or r["kind"] == "info":
            r["gate"] = ""
        elif gate.enabled and not gate_applies(ctx, r):
            r["gate"] = f"not gated here ({gate.describe()}; runs.gate_saturated: false)"
        else:
            r["gate"] = gate.describe()
    cols = ["metric", "label", "scope", "unit", "better", "kind", "baseline", "candidate", "delta",
            "delta_pct", "ci_low", "ci_high", "ci_kind", "change", "gate", "verdict", "note"]
    return pd.DataFrame([{k: r[k] for k in cols} for r in rows], columns=cols)


def verdict(table: pd.DataFrame, buckets: pd.DataFrame, g: Gates, notes: list[str]) -> Verdict:
    failed = []
    for r in table[table["verdict"] == "FAIL"].itertuples():
        failed.append(f"{r.metric} ({r.scope}): baseline {r.baseline:.6g}, candidate "
                      f"{r.candidate:.6g}, delta {r.delta:+.6g} [{r.ci_low:.4g}, {r.ci_high:.4g}]"
                      if r.kind == "stat" else
                      f"{r.metric} ({r.scope}): baseline {r.baseline:.6g}, candidate "
                      f"{r.candidate:.6g} (deterministic; {r.gate})")
    flagged = []
    if len(buckets):
        for r in buckets[buckets["flag"] != ""].itertuples():
            flagged.append(f"{r.scope}, {r.dimension} {r.bucket}: {r.metric} {r.baseline:.4g} → "
                           f"{r.candidate:.4g} (CI of delta [{r.ci_low:.4g}, {r.ci_high:.4g}], "
                           f"n = {r.n_baseline:,}/{r.n_candidate:,})")
    vnotes = list(notes)
    top = table[table["scope"].isin((STEADY, SATURATED, SWEEP))]
    improved = top[top["change"] == "improvement"]
    if flagged and len(improved):
        vnotes.append("the aggregate improved (" + ", ".join(
            f"{m} ({s})" for m, s in zip(improved["metric"], improved["scope"])) + ") while "
            f"{len(flagged)} bucket(s) regressed — see the buckets above")
    elif flagged and not len(top[top["change"] == "regression"]):
        vnotes.append(f"no aggregate regression is significant, but {len(flagged)} bucket(s) "
                      "regressed")
    passed = not failed and not (flagged and g.buckets.fail_on_regression)
    return Verdict(passed=passed, failed=tuple(failed), flagged_buckets=tuple(flagged),
                   notes=tuple(vnotes))


def workload_frame(ctx: Ctx) -> pd.DataFrame:
    """Per matched run: offered facts of both sides, pairing counts, the time units and
    blocks, the family."""
    rows = []
    fam = ctx.regimes.set_index("pair")
    diag_c = ctx.c.stats.diagnostics.set_index("run_id")
    for p in ctx.pairs:
        fb, fc = ctx.b.offered.facts.iloc[p.index], ctx.c.offered.facts.iloc[p.index]
        pr = ctx.pairing.iloc[p.index]
        cand_over = bool(diag_c.loc[p.candidate, "overloaded"]) \
            if p.candidate in diag_c.index else False
        rows.append({"run_baseline": p.baseline, "run_candidate": p.candidate,
                     "load_level": p.level, "warmup_s": p.warmup_s,
                     "family": fam.loc[p.index, "family"], "why": fam.loc[p.index, "why"],
                     "candidate_overloaded": cand_over,
                     "offered_rps_baseline": fb["rate_rps"],
                     "offered_rps_candidate": fc["rate_rps"],
                     "n_baseline": int(fb["n"]), "n_candidate": int(fc["n"]),
                     "arrival_cv_baseline": fb["cv"], "arrival_cv_candidate": fc["cv"],
                     "matched_requests": int(pr["matched"]),
                     "missing_in_candidate": int(pr["missing"]),
                     "extra_in_candidate": int(pr["extra"]),
                     "block_requests": ctx.blocks["block_requests"].iat[p.index],
                     "unit_s": ctx.blocks["unit_s"].iat[p.index],
                     "units": int(ctx.blocks["units"].iat[p.index]),
                     "block_units": ctx.blocks["block_units"].iat[p.index],
                     "sd_factor": float(ctx.db.sd_factor[p.index])})
    return pd.DataFrame(rows)
