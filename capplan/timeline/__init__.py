"""Timelines: what a failure, a rollout, a burst or the autoscaler did to the SLO, window by
window on a run's clock (docs/timeline.md).

``analyse_timeline(study, slo)`` reads the study's system events (``timeline/``, plus those
the requests show — ``events``), reduces the requests to per-window figures through the one
reduction (``windows``), groups the events into incidents and measures each (``incidents``),
and returns a frozen :class:`Timeline` that prints, tabulates, draws and writes itself::

    tl = analyse_timeline("studies/zone-loss", "ttft_ms=2000,tpot_ms=100,attainment=0.99",
                          window_s=1.0, capacity_rps=2.8)
    print(tl.to_text()); tl.figure(); tl.incidents_frame(); tl.write("out/timeline")

It works alike on measured studies and on those the twin's scenarios write.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from .. import spec as S
from ..earlystop import n_min
from ..errors import SpecError
from ..reduce import Occupancy, activity
from ..slo import SLO
from ..study import Study, open_study
from .events import (EVENT_FRAME_COLUMNS, ReplicaSeries, StepRule, derive_events,
                     derive_load_steps, load_steps, recorded_events, replica_series,
                     step_integral, system_events, with_events)
from .incidents import (CAUSES, INCIDENT_COLUMNS, IncidentParams, group_incidents,
                        measure_incidents)
from .result import Timeline, decision_counts, incident_lines
from .windows import (CONFIDENCE, TTFT_P, WINDOW_COLUMNS, reduce_windows, window_frame,
                      windows_needed)

__all__ = ["analyse_timeline", "Timeline", "system_events", "recorded_events", "derive_events",
           "derive_load_steps", "load_steps", "StepRule",
           "replica_series", "ReplicaSeries", "step_integral", "group_incidents",
           "measure_incidents", "IncidentParams", "decision_counts", "incident_lines",
           "WINDOW_COLUMNS", "INCIDENT_COLUMNS", "EVENT_FRAME_COLUMNS", "CAUSES"]


def analyse_timeline(study, slo=None, *, run: str | None = None, window_s: float = 1.0,
                     recover_windows: int = 5, pre_s: float = 60.0,
                     capacity_rps: float | None = None, derive: bool = True,
                     silence_s: float = 10.0, rate_smooth_s: float = 10.0,
                     step: StepRule = StepRule()) -> Timeline:
    """The timeline of a study's runs (all, or ``run``). ``slo``: an SLO or its text; default
    the study's own (study.yaml ``slo``, which ``capplan twin run`` records). ``window_s``:
    window width; ``recover_windows``: windows in a row at or above the target that count as
    recovered; ``pre_s``: how far back the pre-event baseline reaches; ``capacity_rps``: req/s
    one replica serves within the SLO (default study.yaml ``timeline.capacity_rps_per_replica``
    when a scenario wrote it) — needed for the replicas needed, decision delays and overshoot;
    ``derive``: add the events the requests show (a replica silent for ``silence_s``; a step
    in the offered rate by the ``step`` rule, docs/timeline.md "Load steps")."""
    st = open_study(study) if not isinstance(study, Study) else study
    raw = st.manifest.raw or {}
    notes: list[str] = []
    if slo is None:
        if not raw.get("slo"):
            raise SpecError("a timeline needs an SLO and study.yaml names none", field="--slo",
                            fix="pass --slo ttft_ms=2000,tpot_ms=100,attainment=0.99")
        slo = raw["slo"]
        notes.append(f"SLO from study.yaml: {SLO.parse(slo)}")
    slo = SLO.parse(slo)
    width = S.number(window_s, "--window", above=0.0, example="1s")
    K = S.number(recover_windows, "--recover-windows", integer=True, minimum=1, example="5")
    pre = S.number(pre_s, "--pre-s", above=0.0, example="60")
    silence = S.number(silence_s, "--silence-s", above=0.0, example="10")
    step = StepRule(span_s=S.number(step.span_s, "--step-span", above=0.0, example="30s"),
                    z_min=S.number(step.z_min, "--step-z", above=0.0, example="5"),
                    min_change=S.number(step.min_change, "--step-change", minimum=0.0,
                                        example="0.25"))
    if capacity_rps is None:
        capacity_rps, where = recorded_capacity(raw)
        if capacity_rps is not None:
            notes.append(f"replica capacity {capacity_rps:.4g} req/s from study.yaml ({where})")
    if capacity_rps is not None:
        capacity_rps = S.number(capacity_rps, "--capacity-rps", above=0.0, example="2.8")
    runs = st.manifest.run_ids
    if run is not None:
        if run not in runs:
            near = S.did_you_mean(run, runs)
            raise SpecError(f"run {run!r} is not in the study" + (f" (did you mean {near!r}?)" if near else ""),
                            field="--run", fix="runs: " + ", ".join(runs[:20]))
        runs = (run,)

    act = activity(st)
    events = system_events(st, derive=derive, silence_s=silence, act=act)
    events = events[events["run_id"].isin(runs)].reset_index(drop=True)
    n_derived = int((events["source"] == "derived").sum()) if len(events) else 0
    if n_derived:
        notes.append(f"{n_derived} event(s) derived from the requests (a replica group silent "
                     f"for {silence:g} s while the run went on, or serving late): source = derived")
    if not st.timeline_files:
        notes.append("the study has no timeline/ table: only events the requests show are marked")
    whole = act[act["whole_run"]].set_index("run_id")
    ends, n_units = {}, {}
    for r in st.manifest.runs:
        end = max([float(whole.at[r.run_id, c]) for c in ("last_service_s", "last_scheduled_s")
                   if r.run_id in whole.index and pd.notna(whole.at[r.run_id, c])]
                  + [float(r.duration_s or 0.0)])
        ends[r.run_id] = end
        n_units[r.run_id] = windows_needed(end, width)
    timeout = ((raw.get("workload") or {}).get("client") or {}).get("timeout_s")
    waiting = Occupancy(open_for_s=float(timeout) if timeout else None)
    if not (st.has("admitted_ns") or st.has("prefill_start_ns")):
        notes.append("the server's admission is not stamped (admitted_ns, prefill_start_ns): a "
                     "request counts as waiting until its first token, prefill included")
    notes.append("requests never served wait until " + (
        f"their client gave up ({float(timeout):g} s, study.yaml workload.client.timeout_s) or "
        "the run ended" if timeout else "the run's last stamp (no client timeout in study.yaml)")
        + "; rejected and failed-at-once requests do not wait")
    bs, occ = reduce_windows(st, slo, width, n_units, waiting)
    replicas = {}
    served = act[~act["whole_run"] & act["value"].notna()]
    for rid in runs:
        names = [str(v) for v in served[served["run_id"] == rid]["value"]]
        replicas[rid] = replica_series(rid, events, names, st.manifest.replicas)
    windows = window_frame(bs, occ, replicas, width, tuple(runs))
    if derive:
        steps = derive_load_steps(windows, events, width, step)
        if len(steps):
            events = with_events(events, steps, st)
            notes.append(f"{len(steps)} load step(s) derived from the offered rate: "
                         + step.describe(width) + " (source = derived)")
    gpr = st.manifest.gpus_per_replica
    inc_frames = []
    for r in st.manifest.runs:
        if r.run_id not in runs:
            continue
        ev = events[events["run_id"] == r.run_id]
        p = IncidentParams(target=slo.attainment, width_s=width, recover_windows=int(K), pre_s=pre,
                           warmup_s=float(r.warmup_s or 0.0), capacity_rps=capacity_rps,
                           gpus_per_replica=gpr, rate_smooth_s=rate_smooth_s,
                           last_arrival_s=float(whole.at[r.run_id, "last_scheduled_s"])
                           if r.run_id in whole.index else math.inf)
        rs = bs.run(r.run_id)
        e2e = rs.percentile("e2e", 0.99, bs.alpha) / 1000.0
        p = replace(p, guard_s=width * math.ceil(e2e / width) if math.isfinite(e2e) else width)
        w = windows[windows["run_id"] == r.run_id].reset_index(drop=True)
        inc_frames.append(measure_incidents(r.run_id, group_incidents(ev, width), w, p))
    incidents = (pd.concat([f for f in inc_frames if len(f)], ignore_index=True)
                 if any(len(f) for f in inc_frames) else pd.DataFrame(columns=list(INCIDENT_COLUMNS)))
    notes += _window_notes(windows, slo, width, capacity_rps, incidents)
    headline = "" if len(events) else no_events_text(bool(st.timeline_files), derive, silence)
    return Timeline(study=st.name, slo=slo, width_s=width, recover_windows=int(K), pre_s=pre,
                    capacity_rps=capacity_rps, gpus_per_replica=gpr, windows=windows,
                    events=events,
                    incidents=incidents, replicas=replicas, notes=tuple(notes),
                    run_ids=tuple(runs), headline=headline)


def no_events_text(has_table: bool, derive: bool, silence_s: float) -> str:
    """Why a timeline has no incidents and what would give it some: said first, so an empty
    per-event section is not read as "nothing went wrong"."""
    where = ("its timeline/ table records none for these runs" if has_table
             else "it has no timeline/ table")
    shown = (f"and the requests show none (no replica went silent for {silence_s:g} s or started "
             "late)" if derive else "and events derived from the requests were turned off (--no-derive)")
    return ("No system events: the study records no failure, rollout, burst or scale decision ("
            f"{where}) {shown}, so there is no incident to measure — the lines below only sum up "
            "each run's windows against the SLO. Events come from a timeline/ table written by the "
            "serving system or the load harness (replica_failed, rollout_step, scale_decision, …: "
            "the study contract, section 9), or from a scenario on the twin: `capplan twin run "
            "--twin twin.yaml --scenario s.yaml --out STUDY2` writes a study with its timeline, "
            "and `capplan report STUDY --twin twin.yaml` simulates the plan's failure, rollout and "
            "burst checks.")


def _window_notes(windows: pd.DataFrame, slo: SLO, width: float, capacity_rps, incidents) -> list[str]:
    notes = []
    busy = windows[windows["offered"] > 0]
    if len(busy):
        med = float(busy["offered"].median())
        need = 1.0 / (1.0 - slo.attainment)
        if med < need:
            wider = math.ceil(need / max(med, 1e-9) * width)
            notes.append(f"a {width:g}-s window holds a median of {med:.0f} requests: one SLO miss "
                         f"takes a window below the {slo.attainment:.4g} target, so short breaches "
                         f"are noisy (windows of ≥ {wider:g} s hold {need:.0f})")
    if (windows["ttft_n"] > 0).any() and windows["ttft_p99_ms"].isna().all():
        notes.append(f"TTFT p99 per window is not shown: no window holds the {n_min(TTFT_P, 1, CONFIDENCE):,} "
                     "completed requests the early-stopping rule needs for a p99 (use a wider "
                     "window)")
    if capacity_rps is None and len(incidents) and incidents["kind"].str.startswith("scale").any():
        notes.append("no replica capacity given (--capacity-rps): replicas needed, decision "
                     "delays against the need and overshoot GPU-hours are not computed; "
                     "decision delays count from the first breached window instead")
    if len(incidents) > 1:
        notes.append("each incident is measured from its own time on; incidents that overlap "
                     "share windows, so their losses are not additive")
    return notes



def recorded_capacity(raw: dict) -> tuple[float | None, str]:
    """The req/s one replica serves within the SLO, as study.yaml records it: ``timeline:
    {capacity_rps_per_replica}``, or the autoscaler of the scenario a twin ran."""
    tl = raw.get("timeline") if isinstance(raw.get("timeline"), dict) else {}
    if tl.get("capacity_rps_per_replica"):
        return float(tl["capacity_rps_per_replica"]), "timeline.capacity_rps_per_replica"
    sc = raw.get("scenario") if isinstance(raw.get("scenario"), dict) else {}
    auto = (sc.get("spec") or {}).get("autoscaler") if isinstance(sc.get("spec"), dict) else None
    if isinstance(auto, dict) and auto.get("capacity_rps"):
        return float(auto["capacity_rps"]), "scenario.spec.autoscaler.capacity_rps"
    return None, ""
