"""Price and energy arithmetic for plans, and the per-load-level facts a study gives a plan.

Pure arithmetic first (hours in a month, GPU cost, energy cost, power integration), then
``study_facts``: one SQL pass over a study that gives, per offered load level, the fraction of
offered requests that met the SLO, the output tokens of those good requests, and (when the
study has ``resources/`` power samples) the energy and mean GPU power of each run window.
A plan reads these at its operating point with ``StudyFacts.at(offered_rps)`` (linear
interpolation between tested levels, clamped at the ends), which is cheap enough for sliders.

Conventions (stated once, used everywhere):
- a month is 8 760 h / 12 = 730 h, a quarter 3 months = 2 190 h;
- the fleet is provisioned for the planned peak all month (reserved capacity), so the monthly
  cost does not shrink at night; cost per request therefore depends on the average offered
  rate (``mean_to_peak`` × peak), which the plan states as an assumption;
- overhead % (CPU, network, storage, control plane) applies to the GPU cost only; energy is
  priced separately as board power × PUE × $/kWh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import contract as C

HOURS_PER_YEAR = 8760.0
HOURS_PER_MONTH = HOURS_PER_YEAR / 12.0  # 730
MONTHS_PER_QUARTER = 3
HOURS_PER_QUARTER = HOURS_PER_MONTH * MONTHS_PER_QUARTER  # 2190
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600.0
J_PER_KWH = 3.6e6
J_PER_WH = 3600.0
#: the quantile of a request's context (input + output tokens) the KV bound sizes sequences at
#: (docs/mix.md, "KV memory"): the mean would let the long tail run out of cache
CONTEXT_QUANTILE = 0.99


def gpu_cost_usd_per_month(billed_gpus: float, usd_per_gpu_hour: float, overhead_pct: float) -> float:
    """GPUs × $/GPU-h × 730 h × (1 + overhead/100)."""
    return float(billed_gpus) * float(usd_per_gpu_hour) * HOURS_PER_MONTH * (1.0 + float(overhead_pct) / 100.0)


def energy_kwh_per_month(power_w: float, pue: float) -> float:
    """Facility energy of a constant board power over a month: W × PUE × 730 h / 1000."""
    return float(power_w) * float(pue) * HOURS_PER_MONTH / 1000.0


def energy_cost_usd_per_month(power_w: float, pue: float, usd_per_kwh: float) -> float:
    return energy_kwh_per_month(power_w, pue) * float(usd_per_kwh)


def requests_per_month(mean_rps: float) -> float:
    """Offered requests in a month at a mean offered rate."""
    return float(mean_rps) * SECONDS_PER_MONTH


def usd_per_unit(total_usd: float, units: float, per: float) -> float:
    """Cost per ``per`` units (e.g. per 1 000 requests); inf when no unit is delivered."""
    if units <= 0:
        return float("inf")
    return float(total_usd) / float(units) * float(per)


def integrate_power_j(t_ns, power_w, start_ns: float | None = None, end_ns: float | None = None) -> float:
    """Energy in joules of one GPU's power samples: trapezoid rule over the sample times,
    clipped to [start_ns, end_ns] when given (power linearly interpolated at the edges, never
    extrapolated beyond the first/last sample). Nulls dropped; < 2 samples give 0."""
    t = np.asarray(t_ns, dtype=np.float64)
    p = np.asarray(power_w, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(p)
    t, p = t[ok], p[ok]
    if t.size < 2:
        return 0.0
    order = np.argsort(t, kind="stable")
    t, p = t[order], p[order]
    lo = t[0] if start_ns is None else max(float(start_ns), t[0])
    hi = t[-1] if end_ns is None else min(float(end_ns), t[-1])
    if not hi > lo:
        return 0.0
    inner = (t > lo) & (t < hi)
    tt = np.concatenate(([lo], t[inner], [hi]))
    pp = np.concatenate(([np.interp(lo, t, p)], p[inner], [np.interp(hi, t, p)]))
    return float(np.sum((pp[1:] + pp[:-1]) * 0.5 * np.diff(tt)) / C.NS_PER_S)


@dataclass(frozen=True)
class LevelFacts:
    """Facts of one offered load level of a study (repeats pooled)."""

    offered_rps: float
    offered_requests: int
    good_requests: int
    good_output_tokens: int
    energy_j: float | None = None  # board energy of all GPUs over the in-window spans
    window_s: float | None = None  # summed span of the integrated power samples
    gpu_count: int | None = None
    good_requests_powered: int | None = None  # good requests of the runs with power samples
    good_input_tokens: int = 0
    #: mean scheduled → last-token time of ok requests (s): Little's law's W at this level
    mean_e2e_s: float | None = None

    @property
    def good_input_tokens_per_good_request(self) -> float:
        return self.good_input_tokens / self.good_requests if self.good_requests else 0.0

    @property
    def good_fraction(self) -> float:
        return self.good_requests / self.offered_requests if self.offered_requests else 0.0

    @property
    def good_output_tokens_per_good_request(self) -> float:
        return self.good_output_tokens / self.good_requests if self.good_requests else 0.0

    @property
    def energy_j_per_good_request(self) -> float | None:
        if self.energy_j is None or not self.good_requests_powered:
            return None
        return self.energy_j / self.good_requests_powered

    @property
    def mean_power_w_per_gpu(self) -> float | None:
        if self.energy_j is None or not self.window_s or not self.gpu_count:
            return None
        return self.energy_j / self.window_s / self.gpu_count


@dataclass(frozen=True)
class FactsAt:
    """Study facts read at one operating point (interpolated), with how they were read."""

    offered_rps: float
    good_fraction: float
    good_output_tokens_per_good_request: float
    energy_j_per_good_request: float | None
    mean_power_w_per_gpu: float | None
    how: str
    good_input_tokens_per_good_request: float = 0.0
    mean_e2e_s: float | None = None


@dataclass(frozen=True)
class StudyFacts:
    """Per-level facts of a study under one SLO. ``levels`` sorted by offered rate."""

    slo: str
    levels: tuple[LevelFacts, ...]
    replicas: int = 1
    notes: tuple[str, ...] = field(default=())
    #: highest power sample of any one GPU in the runs' windows (W), None without telemetry
    max_power_w_per_gpu: float | None = None
    #: mean input / output tokens of the ok requests of the whole study (the tested mix)
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None
    #: the CONTEXT_QUANTILE of input + output tokens over those requests (type 7): the context
    #: a KV bound sizes sequences at, so the long tail fits and not only the mean
    context_tokens_q: float | None = None
    context_quantile: float = CONTEXT_QUANTILE

    def to_frame(self):
        import pandas as pd

        rows = []
        for lv in self.levels:
            rows.append({
                "offered_rps": lv.offered_rps,
                "offered_requests": lv.offered_requests,
                "good_requests": lv.good_requests,
                "good_fraction": lv.good_fraction,
                "good_output_tokens_per_good_request": lv.good_output_tokens_per_good_request,
                "energy_j": lv.energy_j,
                "energy_j_per_good_request": lv.energy_j_per_good_request,
                "mean_power_w_per_gpu": lv.mean_power_w_per_gpu,
                "good_input_tokens_per_good_request": lv.good_input_tokens_per_good_request,
                "mean_e2e_s": lv.mean_e2e_s,
            })
        return pd.DataFrame(rows)

    def at(self, offered_rps: float) -> FactsAt:
        """Facts at an offered rate (in the study's own units, i.e. for its whole tested
        system): linear interpolation between the two nearest tested levels, clamped to the
        lowest/highest level outside the tested range (said in ``how``)."""
        if not self.levels:
            raise ValueError("study has no load levels")
        xs = np.array([lv.offered_rps for lv in self.levels])
        x = float(offered_rps)

        def interp(values):
            vals = [(xx, v) for xx, v in zip(xs, values) if v is not None and np.isfinite(v)]
            if not vals:
                return None
            vx = np.array([a for a, _ in vals])
            vy = np.array([b for _, b in vals])
            return float(np.interp(x, vx, vy))

        if x < xs[0]:
            how = f"clamped to the lowest tested level {xs[0]:g} req/s (operating point {x:.4g} req/s is below it)"
        elif x > xs[-1]:
            how = f"clamped to the highest tested level {xs[-1]:g} req/s (operating point {x:.4g} req/s is above it)"
        elif len(xs) == 1 or x in xs:
            how = f"read at the tested level {x:.4g} req/s"
        else:
            hi = int(np.searchsorted(xs, x))
            how = f"interpolated between tested levels {xs[hi - 1]:g} and {xs[hi]:g} req/s at {x:.4g} req/s"
        return FactsAt(
            offered_rps=x,
            good_fraction=interp([lv.good_fraction for lv in self.levels]) or 0.0,
            good_output_tokens_per_good_request=interp(
                [lv.good_output_tokens_per_good_request if lv.good_requests else None
                 for lv in self.levels]) or 0.0,
            energy_j_per_good_request=interp([lv.energy_j_per_good_request for lv in self.levels]),
            mean_power_w_per_gpu=interp([lv.mean_power_w_per_gpu for lv in self.levels]),
            how=how,
            good_input_tokens_per_good_request=interp(
                [lv.good_input_tokens_per_good_request if lv.good_requests else None
                 for lv in self.levels]) or 0.0,
            mean_e2e_s=interp([lv.mean_e2e_s for lv in self.levels]),
        )

    @property
    def has_energy(self) -> bool:
        return any(lv.energy_j is not None for lv in self.levels)


def study_facts(study, slo, *, warmup_s: dict[str, float] | None = None) -> StudyFacts:
    """Good fraction, good output tokens and energy per load level of an open-loop study.
    ``slo``: an SLO, or ``SLOClasses`` (each request judged by its own class's SLO).

    Counts in-window offered requests (every status; unfinished ones are violations) per run.
    Energy: power samples of ``resources/`` that carry the run's ``run_id`` are integrated per
    GPU (trapezoid) over the run's in-window span [warm-up, last event] when the samples fall
    in it (same run clock as the events); when none fall in it (e.g. epoch timestamps) the
    whole run's samples are used with the whole run's good requests, and a note says so.
    ``warmup_s`` overrides the manifest's warm-up per run (``metrics.Window.of``), so a caller
    that aligned steady windows (compare) keeps them.
    """
    from .metrics import Window, class_good_predicate, good_predicate, request_view
    from .slo import SLO, SLOClasses

    classes = slo if isinstance(slo, SLOClasses) else None
    slo = classes if classes is not None else SLO.parse(slo)
    view = request_view(study, Window.of(study, warmup_s))
    pred, params = class_good_predicate(classes) if classes is not None else good_predicate(slo)
    q = f"""
        SELECT run_id, any_value(offered_rps) AS offered_rps,
               count(*) FILTER (WHERE in_window) AS offered,
               count(*) FILTER (WHERE in_window AND {pred}) AS good,
               coalesce(sum(output_tokens) FILTER (WHERE in_window AND {pred}), 0) AS good_tokens,
               coalesce(sum(input_tokens) FILTER (WHERE in_window AND {pred}), 0) AS good_in_tokens,
               sum(e2e_ms) FILTER (WHERE in_window AND status = 'ok') AS e2e_sum_ms,
               coalesce(sum(input_tokens) FILTER (WHERE in_window AND status = 'ok'), 0) AS in_ok,
               coalesce(sum(output_tokens) FILTER (WHERE in_window AND status = 'ok'), 0) AS out_ok,
               count(e2e_ms) FILTER (WHERE in_window AND status = 'ok') AS e2e_n,
               count(*) FILTER (WHERE {pred}) AS good_all,
               min(scheduled_ns) FILTER (WHERE in_window) AS w0,
               max(greatest(scheduled_ns, coalesce(last_token_ns, first_token_ns, sent_ns, scheduled_ns)))
                   AS w1,
               min(scheduled_ns) AS r0
        FROM {view} GROUP BY run_id ORDER BY run_id
    """
    rows = study.sql(q, params * 4).fetchall()
    notes: list[str] = []
    per_run = {}
    for (run_id, rps, offered, good, good_tokens, good_in, e2e_sum, in_ok, out_ok, e2e_n, good_all,
         w0, w1, r0) in rows:
        if rps is None:
            notes.append(f"run {run_id} has no offered_rps (closed loop): left out of plan facts")
            continue
        spec = study.manifest.run(run_id)
        warm = (warmup_s or {}).get(run_id, spec.warmup_s)
        warm_ns = int(round((warm or 0.0) * C.NS_PER_S))
        per_run[run_id] = dict(rps=float(rps), offered=int(offered), good=int(good),
                               good_tokens=int(good_tokens), good_all=int(good_all),
                               good_in=int(good_in), e2e_sum=float(e2e_sum or 0.0), e2e_n=int(e2e_n),
                               in_ok=int(in_ok), out_ok=int(out_ok),
                               w0=max(warm_ns, int(w0)) if w0 is not None else None,
                               w1=int(w1) if w1 is not None else None)
    energy = _run_energy(study, per_run, notes) if study.resource_files else {}
    if not study.resource_files:
        notes.append("the study has no resources/ power samples: energy per request not measured")
    by_level: dict[float, list] = {}
    for run_id, r in per_run.items():
        by_level.setdefault(r["rps"], []).append((run_id, r))
    levels = []
    for rps in sorted(by_level):
        runs = by_level[rps]
        e_runs = [(rid, r) for rid, r in runs if rid in energy]
        levels.append(LevelFacts(
            offered_rps=rps,
            offered_requests=sum(r["offered"] for _, r in runs),
            good_requests=sum(r["good"] for _, r in runs),
            good_output_tokens=sum(r["good_tokens"] for _, r in runs),
            energy_j=sum(energy[rid][0] for rid, _ in e_runs) if e_runs else None,
            window_s=sum(energy[rid][1] for rid, _ in e_runs) if e_runs else None,
            gpu_count=max(energy[rid][2] for rid, _ in e_runs) if e_runs else None,
            good_requests_powered=sum(energy[rid][3] for rid, _ in e_runs) if e_runs else None,
            good_input_tokens=sum(r["good_in"] for _, r in runs),
            mean_e2e_s=(sum(r["e2e_sum"] for _, r in runs) / sum(r["e2e_n"] for _, r in runs) / 1e3
                        if sum(r["e2e_n"] for _, r in runs) else None),
        ))
    peaks = [energy[rid][4] for rid in energy if energy[rid][4] is not None]
    n_ok = sum(r["e2e_n"] for r in per_run.values())
    ctx_q = None
    if n_ok:
        open_runs = list(per_run)
        marks = ", ".join("?" * len(open_runs))
        (qs,), = study.sql(f"SELECT {study.dialect.quantiles('input_tokens + output_tokens')} FROM {view} "
                           f"WHERE in_window AND status = 'ok' AND e2e_ms IS NOT NULL AND run_id IN ({marks})",
                           [[CONTEXT_QUANTILE]] + open_runs).fetchall()
        ctx_q = float(qs[0]) if qs is not None and qs[0] is not None else None
    return StudyFacts(slo=str(slo), levels=tuple(levels), replicas=study.manifest.replicas,
                      notes=tuple(notes), max_power_w_per_gpu=max(peaks) if peaks else None,
                      mean_input_tokens=sum(r["in_ok"] for r in per_run.values()) / n_ok if n_ok else None,
                      mean_output_tokens=sum(r["out_ok"] for r in per_run.values()) / n_ok if n_ok else None,
                      context_tokens_q=ctx_q)


def _run_energy(study, per_run: dict, notes: list[str]) -> dict:
    """run_id -> (energy_j, window_s, gpu_count, good_requests, max sample W) from resources/
    samples."""
    cols = {r[0] for r in study.sql("DESCRIBE resources").fetchall()}
    if "run_id" not in cols:
        notes.append("resources/ samples have no run_id column: energy cannot be attributed to runs")
        return {}
    host = "coalesce(CAST(host AS VARCHAR), '')" if "host" in cols else "''"
    # one GPU = (host, gpu_index): several hosts each have a GPU 0
    samples = study.sql(
        f"SELECT run_id, dense_rank() OVER (ORDER BY {host}, gpu_index) AS gpu_key, t_ns, power_w "
        "FROM resources WHERE run_id IS NOT NULL AND power_w IS NOT NULL ORDER BY run_id, gpu_key, t_ns"
    ).fetchnumpy()
    out = {}
    run_ids = samples["run_id"]
    for run_id, r in per_run.items():
        sel = run_ids == run_id
        if not np.any(sel):
            notes.append(f"run {run_id} has no power samples")
            continue
        t = np.asarray(samples["t_ns"][sel], dtype=np.int64)
        p = np.asarray(samples["power_w"][sel], dtype=np.float64)
        g = np.asarray(samples["gpu_key"][sel], dtype=np.int64)
        w0, w1 = r["w0"], r["w1"]
        overlaps = (w0 is not None and w1 is not None and t.min() < w1 and t.max() > w0)
        if overlaps:
            lo, hi, good = max(w0, int(t.min())), min(w1, int(t.max())), r["good"]
        else:
            lo, hi, good = int(t.min()), int(t.max()), r["good_all"]
            notes.append(f"run {run_id}: power samples do not overlap the run's window on the "
                         "event clock; used all of its samples and all its good requests")
        gpus = np.unique(g)
        span = (hi - lo) / C.NS_PER_S  # the span actually integrated
        e = sum(integrate_power_j(t[g == k], p[g == k], lo, hi) for k in gpus)
        inside = (t >= lo) & (t <= hi)
        peak = float(p[inside].max()) if inside.any() else float(p.max())
        out[run_id] = (e, span, int(gpus.size), int(good), peak)
    return out
