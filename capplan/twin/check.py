"""``Twin.check``: does the twin reproduce the measured runs?

Every run's actual schedule and lengths are replayed ``replays`` times through the twin (each
replay with its own draw of the service parameters and of the unknown answer lengths,
:mod:`capplan.twin.replay`). Per run and metric, the measured value is compared with the
twin's 95 % prediction interval (2.5–97.5 % of the replays), widened by a practical margin
(``MARGINS``: differences smaller than these do not matter for a plan). A metric *disagrees*
when more runs fall outside than chance explains: under agreement each run is outside with
probability ≤ 5 %, so k of n outside with P(Binomial(n, 0.05) ≥ k) < 1 % is a disagreement.
The twin also *disagrees* when the measured envelope's C_SLO lies outside the C_SLO of the
replays (the same protocol, the twin's answers) widened by 5 %.

Beside it, the twin's steady-state C_SLO (:mod:`capplan.twin.capacity`) and the measured
envelope's (``capplan.fit_envelope``). docs/twin.md "Checking a twin" has the details.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.stats import binom

from ..errors import StudyError
from ..present import MISSING, fmt, fmt_num, json_text
from ..slo import CSLO_REPS, SLO
from .capacity import steady_cslo
from .data import StudyData, load_study
from .limits_fit import stall_masks, timeout_bounds
from .params import notes_text
from ..sim.evaluate import METRICS, run_metrics
from .replay import METRIC_LABELS, carried, measured_outcome, replay_run, run_end_ns

#: metric → (absolute margin, relative margin): a run agrees when the measured value lies
#: within the replays' 95 % interval widened by max(absolute, relative × measured).
MARGINS: dict[str, tuple[float, float]] = {
    "attainment": (0.01, 0.0), "ttft_p50_ms": (0.1, 0.10), "ttft_p99_ms": (0.1, 0.10),
    "tpot_p50_ms": (0.01, 0.10), "tpot_p99_ms": (0.01, 0.10), "achieved_rps": (0.0, 0.05),
    "share_rejected": (0.01, 0.0), "share_timed_out": (0.01, 0.0),
}
#: the check's C_SLOs: key in ``TwinCheck.cslo`` → (label, why it is the number it is). Only the
#: first is "the measured C_SLO" (docs/envelope.md, "One measured C_SLO"); the others are other
#: quantities and say so.
CSLO_ROWS: dict[str, tuple[str, str]] = {
    "measured": ("C_SLO measured (capplan envelope)",
                 "the study's C_SLO as capplan envelope, the plan and the report give it: runs pooled with "
                 "the run-to-run variation"),
    "measured_within_run": ("within-run crossing of the measured runs",
                            "each measured run read on its own, without the run-to-run variation (the "
                            "envelope's within-run method): the quantity a replay gives, so the replays are "
                            "compared with it, not with the measured C_SLO"),
    "replay": ("twin's crossing, replaying the measured runs",
               "the same within-run crossing on the twin's replays of the measured runs (median and 2.5–97.5 % "
               "over the replays)"),
    "twin": ("twin's steady-state C_SLO",
             "the twin's long Poisson runs at the measured mix, not the measured runs' protocol"),
}
RUN_MISS_RATE = 0.05
TEST_LEVEL = 0.01
CSLO_MARGIN = 0.05
NOISE_CV_LIMIT = 0.1  # decode-step spread (CV around the curve) above which the runs are noisier than a twin
BURST_LIMIT = 0.01  # share of decode tokens received in bursts after a stall, above which likewise
POOL_MIN_REQUESTS = 300_000  # replayed requests from which check_twin uses 2 processes by default


def _disagree(k: int, n: int) -> tuple[bool, float]:
    if n == 0:
        return False, 1.0
    p = float(binom.sf(k - 1, n, RUN_MISS_RATE)) if k > 0 else 1.0
    return p < TEST_LEVEL, p


def margin_text(absolute: float, relative: float) -> str:
    """'±0.01', '±10 %' or 'max(±0.1, ±10 %)': a metric's margin in words."""
    parts = ([f"±{absolute:g}"] if absolute else []) + ([f"±{relative * 100:g} %"] if relative else [])
    return parts[0] if len(parts) == 1 else f"max({', '.join(parts)})" if parts else "none"


def json_number(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else (
        round(float(x), 6) if isinstance(x, (float, np.floating)) else x)


@dataclass(frozen=True)
class TwinCheck:
    """The result of checking a twin against a measured study."""

    twin: str
    study: str
    slo: str
    replays: int
    seed: int
    verdict: str  # agrees | disagrees
    where: tuple[str, ...]
    runs: pd.DataFrame = field(repr=False)  # one row per run, measured / twin / interval per metric
    metrics: pd.DataFrame = field(repr=False)  # one row per metric: runs outside, p-value, agrees
    cslo: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    holdout: dict | None = None
    replay_values: dict = field(default_factory=dict, repr=False)  # (run_id, metric) → replay values

    def to_frame(self) -> pd.DataFrame:
        return self.runs.copy()

    def long_frame(self) -> pd.DataFrame:
        """One row per (run, metric): measured, twin median, interval, band, inside."""
        rows = []
        for r in self.runs.to_dict("records"):
            for m in METRICS:
                rows.append({"run_id": r["run_id"], "offered_rps": r["offered_rps"], "metric": m,
                             "label": METRIC_LABELS[m], "measured": r[f"{m}_measured"], "twin": r[f"{m}_twin"],
                             "pi_low": r[f"{m}_pi_low"], "pi_high": r[f"{m}_pi_high"],
                             "band_low": r[f"{m}_band_low"], "band_high": r[f"{m}_band_high"],
                             "inside": r[f"{m}_inside"]})
        return pd.DataFrame(rows)

    def display_frame(self):
        """long_frame() for people: readable headers, the band the verdict used (the 95 % interval
        widened by MARGINS) beside the interval, yes/NO for inside that band."""
        lf = self.long_frame()
        return pd.DataFrame({"Run": lf["run_id"], "Offered (req/s)": lf["offered_rps"], "Metric": lf["label"],
                             "Measured": lf["measured"], "Twin (median of replays)": lf["twin"],
                             "Twin 95 % low": lf["pi_low"], "Twin 95 % high": lf["pi_high"],
                             "Band low (with margin)": lf["band_low"], "Band high (with margin)": lf["band_high"],
                             "Inside the band": np.where(lf["inside"], "yes", "NO")})

    def to_dict(self) -> dict:
        runs = [{k: json_number(v) if not isinstance(v, (bool, np.bool_)) else bool(v) for k, v in r.items()}
                for r in self.runs.to_dict("records")]
        mets = [{k: json_number(v) if not isinstance(v, (bool, np.bool_)) else bool(v) for k, v in r.items()}
                for r in self.metrics.to_dict("records")]
        return {"verdict": self.verdict, "where": list(self.where), "twin": self.twin, "study": self.study,
                "slo": self.slo, "replays": self.replays, "seed": self.seed, "cslo": self.cslo,
                "metrics": mets, "runs": runs, "holdout": self.holdout, "notes": list(self.notes),
                "margins": {k: {"absolute": a, "relative": r} for k, (a, r) in MARGINS.items()}}

    def to_json(self, path=None) -> str:
        return json_text(self.to_dict(), path)

    def cslo_frame(self) -> pd.DataFrame:
        """The C_SLOs of the check, one row each, labelled as the quantity they are (``CSLO_ROWS``):
        the measured C_SLO (the one ``capplan envelope`` prints) and, beside it, the within-run
        crossing of the same runs and the twin's, each with why it is another number. The CLI
        and the report's twin page print these rows."""
        rows = []
        for key, (label, why) in CSLO_ROWS.items():
            d = self.cslo.get(key) or {}
            if not d:
                continue
            if key == "measured" and d.get("settings_note"):
                label, why = "C_SLO measured, approximate", d["settings_note"]
            rows.append({"key": key, "label": label, "estimate": d.get("estimate"), "ci_low": d.get("ci_low"),
                         "ci_high": d.get("ci_high"), "lower_bound": d.get("lower_bound"),
                         "status": d.get("status"), "why": why})
        return pd.DataFrame(rows, columns=["key", "label", "estimate", "ci_low", "ci_high", "lower_bound", "status",
                                           "why"])

    def to_text(self) -> str:
        lines = [f"Twin check: {self.twin} against {self.study} — SLO {SLO.parse(self.slo).describe()}; "
                 f"{self.replays} replays per run",
                 f"VERDICT: the twin {self.verdict.upper()} with the measured runs"]
        lines += [f"  - {w}" for w in self.where]
        lines.append("")
        lf = self.long_frame()
        lines.append("ok = the measured value lies in the band: the twin's 95 % interval widened by the "
                     "margin that does not matter for a plan, max(absolute, relative × measured): "
                     + "; ".join(f"{METRIC_LABELS[k]} {margin_text(a, r)}" for k, (a, r) in MARGINS.items()
                                 if k in METRIC_LABELS))
        hdr = (f"{'run':<10} {'rate':>6}  {'metric':<30} {'measured':>11} {'twin 95 % interval':>25} "
               f"{'band (with margin)':>25}  ok")
        lines.append(hdr)
        for r in lf.itertuples():
            lines.append(f"{r.run_id:<10} {fmt_num(r.offered_rps):>6}  {r.label:<30} {fmt_num(r.measured):>11} "
                         f"{'[' + fmt_num(r.pi_low) + ', ' + fmt_num(r.pi_high) + ']':>25} "
                         f"{'[' + fmt_num(r.band_low) + ', ' + fmt_num(r.band_high) + ']':>25}  "
                         f"{'yes' if r.inside else 'NO'}")
        lines.append("")
        for r in self.cslo_frame().to_dict("records"):
            r = {k: json_number(v) for k, v in r.items()}  # the frame's NaN for "none" back to None
            if r["estimate"] is not None:
                lb = f", lower bound {fmt(r['lower_bound'], '.3f')}" if r["lower_bound"] is not None else ""
                lines.append(f"{r['label']:<58} {r['estimate']:.3f} req/s  95 % interval "
                             f"[{fmt(r['ci_low'], '.3f')}, {fmt(r['ci_high'], '.3f')}]{lb}")
            else:
                lines.append(f"{r['label']:<58} {MISSING} ({r['status'] or 'not bracketed'})")
            lines.append(f"    {r['why']}")
        if self.holdout:
            h = self.holdout
            lines.append("")
            lines.append(f"Held out: fitted on runs below {h['below_rps']:g} req/s, predicted "
                         f"{len(h.get('predicted_runs', []))} run(s) at or above it: " + h.get("summary", ""))
        lines += notes_text(self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def figure(self, metrics=("attainment", "ttft_p99_ms", "tpot_p99_ms", "achieved_rps")):
        """Measured (points) vs the twin's 95 % prediction band per offered rate."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        lf = self.long_frame()
        fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[METRIC_LABELS[m] for m in metrics])
        for j, m in enumerate(metrics, 1):
            d = lf[lf.metric == m].sort_values("offered_rps")
            x = d["offered_rps"].astype(float)
            fig.add_trace(go.Scatter(x=x, y=d["pi_high"], mode="lines", line=dict(width=0), showlegend=False,
                                     hoverinfo="skip"), row=1, col=j)
            fig.add_trace(go.Scatter(x=x, y=d["pi_low"], mode="lines", line=dict(width=0), fill="tonexty",
                                     fillcolor="rgba(31,119,180,0.25)", name="twin 95 % prediction",
                                     showlegend=j == 1), row=1, col=j)
            fig.add_trace(go.Scatter(x=x, y=d["twin"], mode="lines", line=dict(color="rgb(31,119,180)"),
                                     name="twin (median of replays)", showlegend=j == 1), row=1, col=j)
            fig.add_trace(go.Scatter(x=x, y=d["measured"], mode="markers",
                                     marker=dict(color=np.where(d["inside"], "black", "red"), size=8),
                                     name="measured (red: outside)", showlegend=j == 1), row=1, col=j)
            fig.update_xaxes(title_text="offered req/s", row=1, col=j)
        fig.update_layout(title=f"Measured vs twin — verdict: {self.verdict}", template="plotly_white",
                          height=380)
        return fig


def _replays_of_run(args) -> list[dict]:
    """All replays of one run (a process-pool job): metrics per replay."""
    run, twin, slo, keep, end, tenants, seed, ri, replays = args
    out = []
    for k in range(replays):
        rng = np.random.default_rng([int(seed), ri, k])
        o = replay_run(run, twin.draw(rng), slo, keep=keep, rng=rng, end_ns=end, tenant_names=tenants)
        out.append(run_metrics(o, slo, run.warmup_ns))
    return out


def replay_study(twin: "Twin", data: StudyData, slo: SLO, *, replays: int = 20, seed: int = 0, executor=None):
    """Replay every open-loop run ``replays`` times (runs spread over ``executor``'s processes
    when given; the numbers do not depend on it). Returns (rows, values, counts, notes): rows
    has the measured metrics per run, values[(run_id, metric)] the replays' values, counts the
    per-replay (n, n_good) for the C_SLO of the replays."""
    wait_s = float(timeout_bounds(data, None).lo or 0.0)
    stalls = stall_masks(data, wait_s)
    notes, jobs, meta = [], [], []
    need_itl = slo.itl_ms is not None
    for ri, run in enumerate(data.runs):
        if run.offered_rps is None:
            notes.append(f"run {run.run_id}: closed loop (fixed concurrency) — not replayed (the twin replays "
                         "open-loop schedules)")
            continue
        if run.n < 2:
            notes.append(f"run {run.run_id}: fewer than 2 requests — not replayed")
            continue
        keep = carried(run, stalls[run.run_id])
        end = run_end_ns(run, twin.timeout_s, stalls[run.run_id])
        meas = run_metrics(measured_outcome(run, need_itl), slo, run.warmup_ns)
        light = run if need_itl else replace(run, itl_off=None, itl_has=None, itl_val=None)  # less to ship
        jobs.append((light, twin, slo, keep, end, data.tenants, seed, ri, replays))
        meta.append((run, keep, meas))
    results = list(executor.map(_replays_of_run, jobs)) if executor is not None else \
        [_replays_of_run(j) for j in jobs]
    rows, values, counts = [], {}, []
    for (run, keep, meas), reps in zip(meta, results):
        counts.append((run.run_id, run.measured_rate_rps(), [(m["n"], m["n_good"]) for m in reps], meas["n"],
                       meas["n_good"]))
        rows.append({"run_id": run.run_id, "offered_rps": run.offered_rps, "requests": meas["n"],
                     "carried_over": int(keep[run.in_window].sum()), **{f"{k}": meas[k] for k in METRICS}})
        for key in METRICS:
            values[(run.run_id, key)] = np.asarray([m[key] for m in reps], float)
    return rows, values, counts, notes


def _replay_cslo(counts, target: float, seed: int) -> dict:
    """C_SLO of each replay (the envelope's crossing rule on the replayed runs), as an interval."""
    from ..envelope import fit_summary_table

    if len(counts) < 2:
        return {}
    reps = len(counts[0][2])
    ests = []
    for k in range(reps):
        df = pd.DataFrame({"offered_rps": [c[1] for c in counts], "requests": [c[2][k][0] for c in counts],
                           "good_requests": [c[2][k][1] for c in counts]})
        df = df[df["requests"] > 0]
        env = fit_summary_table(df, target, reps=20, seed=seed)
        e = env.cslo.estimate
        ests.append(e if e is not None and math.isfinite(e) else np.nan)
    ests = np.asarray(ests, float)
    ok = ests[np.isfinite(ests)]
    if len(ok) == 0:
        return {"estimate": None, "ci_low": None, "ci_high": None,
                "status": "the replays do not cross the target inside the tested rates"}
    return {"estimate": json_number(float(np.median(ok))), "ci_low": json_number(float(np.percentile(ok, 2.5))),
            "ci_high": json_number(float(np.percentile(ok, 97.5))), "replays_bracketed": int(len(ok)),
            "kind": "the envelope's crossing on each replay of the measured runs"}


def check_twin(twin: "Twin", study, slo: SLO | str, *, replays: int = 20, seed: int = 0, envelope=None,
               reps: int = CSLO_REPS, steady: bool = True, steady_draws: int = 10, workers: int | None = None,
               data: StudyData | None = None, steady_options: dict | None = None) -> TwinCheck:
    """Check ``twin`` against ``study`` (see the module docstring). ``envelope``: the measured
    envelope if already fitted (else fitted here with ``reps`` replicates: by default the measured
    C_SLO's, so the check prints the number ``capplan envelope`` does); ``steady=False``
    skips the steady-state C_SLO; ``workers`` processes (default: 2 for checks of ≥ 300 k
    replayed requests, else 1; the numbers do not depend on it); ``steady_options`` are passed
    to ``steady_cslo`` (runs, duration_s, warmup_s)."""
    s = SLO.parse(slo)
    if replays < 2:
        raise StudyError("--replays must be at least 2", fix="e.g. --replays 20")
    data = data or load_study(study)
    if workers is None:  # a pool pays off only for big checks (starting one costs seconds)
        big = replays * sum(r.n for r in data.runs) >= POOL_MIN_REQUESTS
        workers = min(2, os.cpu_count() or 1) if big else 1
    workers = max(1, min(int(workers), len(data.runs)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) if workers > 1 \
            else contextlib.nullcontext() as ex:
        return _check(twin, data, s, replays=replays, seed=seed, envelope=envelope, reps=reps, steady=steady,
                      steady_draws=steady_draws, executor=ex, steady_options=steady_options)


def measured_noise(twin: "Twin", data: StudyData) -> dict:
    """Spread of the measured decode-only steps around the twin's batch curve (per-token stamps
    needed): {cv, share_off, by_run, noisiest, how}; {} without per-token stamps."""
    from .timeline import DECODE, build_timeline

    if not data.has("itl_ns"):
        return {}
    try:
        tl = build_timeline(data)
        if tl is not None and tl.first_on_grid < 0.5:
            tl = build_timeline(data, separate=True)
    except (ValueError, IndexError):
        return {}
    if tl is None or not (tl.kind == DECODE).any():
        return {}
    m = tl.kind == DECODE
    curve = np.asarray(twin.service.step_ms(tl.n_dec[m]), float)
    rel = tl.dur_ns[m] / 1e6 / curve - 1.0
    by_run = {}
    for ri in np.unique(tl.run[m]):
        r = rel[tl.run[m] == ri]
        if len(r) >= 20:
            by_run[data.runs[int(ri)].run_id] = round(float(np.std(r)), 4)
    worst = sorted(by_run.items(), key=lambda kv: -kv[1])[:3]
    cv = float(np.std(rel))
    off = float(np.mean(np.abs(rel) > 0.25))
    return {"cv": round(cv, 4), "share_off": round(off, 4), "iterations": int(m.sum()), "by_run": by_run,
            "burst_share": round(float(tl.burst_share), 4),
            "noisiest": ", ".join(f"{k} {v:.2f}" for k, v in worst),
            "how": f"decode noise: {int(m.sum()):,} measured decode-only steps vary by CV {cv:.3f} around the twin's "
                   f"batch curve ({off:.1%} more than 25 % off"
                   + (f"; {tl.burst_share:.1%} of decode tokens came in bursts after a stall, their steps left out"
                      if tl.burst_share > 0 else "")
                   + f"); the twin's steps are exact (its fit saw CV {float(twin.value('decode_noise_cv')):.3f})"}


def _check(twin, data, s, *, replays, seed, envelope, reps, steady, steady_draws, executor, steady_options):
    rows, values, counts, notes = replay_study(twin, data, s, replays=replays, seed=seed, executor=executor)
    if not rows:
        raise StudyError("no open-loop run to replay", file=data.root,
                         fix="the twin check replays open-loop runs (offered_rps in study.yaml)")
    out_rows = []
    for r in rows:
        row = {"run_id": r["run_id"], "offered_rps": r["offered_rps"], "requests": r["requests"],
               "carried_over": r["carried_over"]}
        for m in METRICS:
            v = values[(r["run_id"], m)]
            meas = r[m]
            fin = v[np.isfinite(v)]
            if len(fin):
                lo, med, hi = np.percentile(fin, [2.5, 50, 97.5])
            else:
                lo = med = hi = float("nan")
            a, rel = MARGINS[m]
            tol = max(a, rel * abs(meas)) if math.isfinite(meas) else a
            blo, bhi = lo - tol, hi + tol
            # a metric the measured run does not define (e.g. no completed request) is not compared
            inside = (not math.isfinite(meas)) or (len(fin) > 0 and blo <= meas <= bhi)
            row.update({f"{m}_measured": meas, f"{m}_twin": med, f"{m}_pi_low": lo, f"{m}_pi_high": hi,
                        f"{m}_band_low": blo, f"{m}_band_high": bhi, f"{m}_inside": bool(inside)})
        out_rows.append(row)
    runs = pd.DataFrame(out_rows)
    met_rows, where = [], []
    for m in METRICS:
        defined = runs[f"{m}_measured"].notna()
        n = int(defined.sum())
        out = runs[defined & ~runs[f"{m}_inside"]]
        bad, p = _disagree(len(out), n)
        met_rows.append({"metric": m, "label": METRIC_LABELS[m], "runs": n, "outside": int(len(out)),
                         "p_value": p, "agrees": not bad})
        if bad:
            hi_side = (out[f"{m}_measured"] > out[f"{m}_band_high"]).sum()
            direction = ("measured above the twin" if hi_side == len(out) else
                         "measured below the twin" if hi_side == 0 else "on both sides")
            rates = ", ".join(f"{x:g}" for x in out["offered_rps"])
            where.append(f"{METRIC_LABELS[m]}: {len(out)} of {n} runs outside the twin's 95 % prediction "
                         f"({direction}) at {rates} req/s")
    metrics = pd.DataFrame(met_rows)
    # C_SLO: the measured envelope (the one `capplan envelope` gives the user), replays, steady state
    cslo: dict = {}
    within = None
    from ..envelope import fit_envelope

    try:
        if envelope is None:
            envelope = fit_envelope(data.root, s, reps=reps, seed=seed)
        # the replays' crossing rule: each run's own attainment (no run effect), so the replayed
        # C_SLO is compared with the same quantity of the measured runs (the envelope's settings)
        within = fit_envelope(data.root, s, confidence=envelope.confidence, reps=envelope.reps,
                              seed=envelope.seed, stats=envelope.stats, method="within-run")
    except StudyError as exc:
        notes.append(f"measured envelope not available: {exc}")
    if envelope is not None:
        c = envelope.cslo
        cslo["measured"] = {"estimate": json_number(c.estimate), "ci_low": json_number(c.ci_low),
                            "ci_high": json_number(c.ci_high), "lower_bound": json_number(c.lower_bound),
                            "status": c.status, "reps": int(envelope.reps), "seed": int(envelope.seed),
                            "settings_note": envelope.settings_note(),
                            "kind": "the study's envelope, as `capplan envelope` computes it "
                            f"({envelope.reps} bootstrap replicates, seed {envelope.seed})"}
    if within is not None:
        w = within.cslo
        cslo["measured_within_run"] = {"estimate": json_number(w.estimate), "ci_low": json_number(w.ci_low),
                                       "ci_high": json_number(w.ci_high), "status": w.status,
                                       "kind": "each run's own attainment (the envelope's within-run method): the "
                                               "quantity the replays give, compared with them below"}
        me_u, me_w = c.estimate, w.estimate
        if me_u is not None and me_w is not None and math.isfinite(me_u) and math.isfinite(me_w) \
                and abs(me_u - me_w) > 0.005 * max(abs(me_u), 1e-9):
            notes.append(f"C_SLO: the envelope (as `capplan envelope` gives it) is {me_u:.3f} req/s; the replays are "
                         f"compared with the within-run crossing of the same runs, {me_w:.3f} req/s — the envelope "
                         "pools the runs with a between-run effect, the replays read each run on its own")
    cslo["replay"] = _replay_cslo(counts, s.attainment, seed)
    me = (cslo.get("measured") or {}).get("estimate")
    cmp_ = cslo.get("measured_within_run") or cslo.get("measured") or {}
    mw = cmp_.get("estimate")
    rp = cslo.get("replay") or {}
    if mw is not None and rp.get("estimate") is not None and cmp_.get("status") == "bracketed":
        me_txt = me if me is not None else mw
        lo, hi = rp["ci_low"] * (1 - CSLO_MARGIN), rp["ci_high"] * (1 + CSLO_MARGIN)
        if not (lo <= mw <= hi):
            where.append(f"C_SLO: the measured runs cross at {mw:.3f} req/s (each run's own attainment; the "
                         f"envelope gives {me_txt:.3f}), the twin replaying the same runs "
                         f"{rp['estimate']:.3f} [{rp['ci_low']:.3f}, {rp['ci_high']:.3f}] req/s (beyond 5 %)")
    if steady:
        start = me if me is not None and me > 0 else None
        st = steady_cslo(twin, s, start=start, draws=steady_draws, seed=seed, executor=executor,
                         workers=1 if executor is None else None, **(steady_options or {}))
        cslo["twin"] = st.to_dict()
        if me is not None and st.estimate > 0 and math.isfinite(st.estimate):
            cslo["twin"]["vs_measured"] = json_number(st.estimate / me - 1.0)
    noise = measured_noise(twin, data)
    if noise.get("cv") is not None:
        notes.append(noise["how"])
        if where and (noise["cv"] > NOISE_CV_LIMIT or noise["burst_share"] > BURST_LIMIT):
            where.append(f"contention: the measured runs are noisier than any fitted twin can be — decode steps vary "
                         f"by CV {noise['cv']:.2f} around the twin's batch curve ({noise['share_off']:.0%} of them more "
                         f"than 25 % off; noisiest runs: {noise['noisiest']}; {noise['burst_share']:.1%} of decode "
                         "tokens in bursts after a stall), the twin's steps are exact; tails outside its band may come "
                         "from a shared or busy machine rather than from the fitted parameters")
    verdict = "disagrees" if where else "agrees"
    if twin.edited:
        notes.append("the twin was edited by hand: " + ", ".join(twin.edited))
    if twin.warning:
        notes.append(twin.warning)
    if noise:
        cslo = {**cslo, "decode_noise": {k: v for k, v in noise.items() if k != "how"}}
    return TwinCheck(twin=twin.name, study=data.name, slo=str(s), replays=replays, seed=seed, verdict=verdict,
                     where=tuple(where), runs=runs, metrics=metrics, cslo=cslo, notes=tuple(notes),
                     replay_values={k: v.tolist() for k, v in values.items()})
