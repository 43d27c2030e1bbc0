"""The frozen result of a timeline analysis: it prints (``to_text``), tabulates (``to_frame``,
``incidents_frame``, ``events_frame``, ``summary_frame``), draws (``figure``) and writes itself
(``write``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..present import fmt_num, fmt_pct, is_missing
from ..slo import SLO

EVENT_COLOURS = {"fault_injected": "#d62728", "replica_failed": "#d62728",
                 "replica_added": "#2ca02c", "replica_ready": "#1f77b4",
                 "replica_draining": "#ff7f0e", "replica_removed": "#7f7f7f",
                 "scale_decision": "#9467bd", "rollout_step": "#8c564b", "cache_flush": "#bcbd22",
                 "load_step": "#17becf"}


@dataclass(frozen=True)
class Timeline:
    """What happened during the runs of a study, window by window, and what each system
    event did to the SLO (docs/timeline.md). ``windows``: one row per (run, window);
    ``events``: recorded and derived system events; ``incidents``: the per-event figures;
    ``replicas``: run → ``ReplicaSeries``; ``notes``: every default and fallback in words."""

    study: str
    slo: SLO
    width_s: float
    recover_windows: int
    pre_s: float
    capacity_rps: float | None
    gpus_per_replica: int
    windows: pd.DataFrame = field(repr=False)
    events: pd.DataFrame = field(repr=False)
    incidents: pd.DataFrame = field(repr=False)
    replicas: dict = field(repr=False, default_factory=dict)
    notes: tuple[str, ...] = ()
    run_ids: tuple[str, ...] = ()
    #: said first when the runs have no system event (``no_events_text``), else empty
    headline: str = ""

    # -- tables --------------------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """The per-window figures (docs/timeline.md "Windows" names every column)."""
        return self.windows.copy()

    def incidents_frame(self) -> pd.DataFrame:
        return self.incidents.copy()

    def events_frame(self) -> pd.DataFrame:
        return self.events.copy()

    def run(self, run_id: str) -> pd.DataFrame:
        return self.windows[self.windows["run_id"] == run_id].reset_index(drop=True)

    def summary_frame(self) -> pd.DataFrame:
        """Per run: windows, windows in breach, SLO-minutes broken, incidents, scale
        decisions that changed the desired count and how often the direction reversed,
        overshoot GPU-hours, the longest queue."""
        rows = []
        for rid in self.run_ids:
            w = self.run(rid)
            inc = self.incidents[self.incidents["run_id"] == rid]
            ev = self.events[(self.events["run_id"] == rid) & (self.events["event"] == "scale_decision")]
            changes, reversals = decision_counts(ev["desired"].dropna().astype(int).tolist(),
                                                 self.replicas[rid].initial if rid in self.replicas else None)
            rows.append({
                "run_id": rid, "windows": len(w), "offered": int(w["offered"].sum()),
                "good": int(w["good"].sum()),
                "attainment": (w["good"].sum() / w["offered"].sum()) if w["offered"].sum() else math.nan,
                "windows_in_breach": int(w["in_breach"].sum()),
                "slo_minutes_broken": float(w["in_breach"].sum() * self.width_s / 60.0),
                "incidents": len(inc), "scale_decisions": changes, "reversals": reversals,
                "overshoot_gpu_h": float(inc["overshoot_gpu_h"].sum(min_count=1))
                if len(inc) else math.nan,
                "queue_peak": int(w["waiting_peak"].max()) if len(w) else 0,
                "replicas_min": float(w["replicas_ready"].min()) if len(w) else math.nan,
                "replicas_max": float(w["replicas_ready"].max()) if len(w) else math.nan})
        return pd.DataFrame(rows)

    def display_frame(self, what: str = "incidents") -> pd.DataFrame:
        """Readable headers for pages meant for people: ``incidents`` (the per-event figures)
        or ``summary`` (per run); numbers stay numbers."""
        if what == "summary":
            df = self.summary_frame()
            return df.rename(columns=SUMMARY_LABELS)[list(SUMMARY_LABELS.values())]
        if what != "incidents":
            raise ValueError(f"unknown table {what!r}: incidents or summary")
        df = self.incidents.copy()
        cols = [c for c in INCIDENT_LABELS if c in df.columns]
        return df[cols].rename(columns=INCIDENT_LABELS)

    # -- text ----------------------------------------------------------------------------
    def to_text(self, headline: bool = True) -> str:
        """What `capplan timeline` prints; ``headline=False`` leaves out the no-events sentence
        (a page that says it in its own words above)."""
        out = [f"Timeline of {self.study}: windows of {_dur(self.width_s)}; SLO {self.slo}; "
               f"recovered = {self.recover_windows} windows in a row at or above "
               f"{self.slo.attainment:.4g}"]
        if self.headline and headline:
            out += ["", self.headline]
        summ = self.summary_frame()
        for rid in self.run_ids:
            s = summ[summ["run_id"] == rid].iloc[0]
            rs = self.replicas.get(rid)
            out += ["", f"Run {rid}: {s['windows']:,} windows, {s['offered']:,} requests offered, "
                        f"{s['good']:,} good ({fmt_pct(s['attainment'], 2)})"
                        + (f"; {rs.how}" if rs is not None else "")]
            out.append(f"  SLO broken in {s['windows_in_breach']:,} windows "
                       f"({s['slo_minutes_broken']:.3g} SLO-minutes); longest queue "
                       f"{s['queue_peak']:,} waiting; replicas ready "
                       f"{fmt_num(s['replicas_min'], 3)}–{fmt_num(s['replicas_max'], 3)}")
            if s["scale_decisions"]:
                out.append(f"  autoscaler: {s['scale_decisions']} decision(s) changed the desired "
                           f"count, {s['reversals']} reversed the previous direction"
                           + (f"; overshoot {s['overshoot_gpu_h']:.3g} GPU-hours"
                              if not math.isnan(s["overshoot_gpu_h"]) else ""))
            inc = self.incidents[self.incidents["run_id"] == rid]
            for r in inc.to_dict("records"):
                out += incident_lines(r)
        if self.notes:
            out += ["", "Notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(out)

    # -- figure --------------------------------------------------------------------------
    def figure(self, run_id: str | None = None):
        """Four panels on the run's clock — offered rate and goodput; attainment against the
        target (windows in breach shaded); requests waiting and TTFT p99; replicas ready and
        provisioned — with every system event marked (hover for what it was)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        rid = run_id or self._default_run()
        w = self.run(rid)
        x = (w["t_start_s"] + w["t_end_s"]) / 2
        fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                            subplot_titles=("requests per second", "attainment per window",
                                            "requests waiting · TTFT p99", "replicas"),
                            specs=[[{}], [{}], [{"secondary_y": True}], [{}]])
        fig.add_trace(go.Scatter(x=x, y=w["offered_rps"], name="offered", line=dict(color="#7f7f7f")), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=w["goodput_rps"], name="goodput (SLO-good)",
                                 line=dict(color="#2ca02c")), 1, 1)
        fig.add_trace(go.Scatter(x=x, y=w["attainment"], name="attainment", mode="lines",
                                 line=dict(color="#1f77b4")), 2, 1)
        fig.add_hline(y=self.slo.attainment, line_dash="dot", line_color="#d62728", row=2, col=1)
        fig.add_trace(go.Scatter(x=x, y=w["waiting_mean"], name="waiting (mean)",
                                 line=dict(color="#ff7f0e")), 3, 1)
        fig.add_trace(go.Scatter(x=x, y=w["ttft_p99_ms"], name="TTFT p99 (ms)", mode="markers",
                                 marker=dict(size=4, color="#9467bd")), 3, 1, secondary_y=True)
        fig.add_trace(go.Scatter(x=w["t_start_s"], y=w["replicas_ready"], name="ready",
                                 line=dict(shape="hv", color="#1f77b4")), 4, 1)
        fig.add_trace(go.Scatter(x=w["t_start_s"], y=w["replicas_provisioned"], name="provisioned",
                                 line=dict(shape="hv", dash="dash", color="#8c564b")), 4, 1)
        ev = self.events[self.events["run_id"] == rid]
        dec = ev[ev["event"] == "scale_decision"]
        if len(dec):
            fig.add_trace(go.Scatter(x=dec["t_s"], y=dec["desired"].astype(float), mode="markers",
                                     name="desired", marker=dict(symbol="diamond", color="#9467bd")), 4, 1)
        for a, b in _spans(w["in_breach"].to_numpy(bool), w["t_start_s"].to_numpy(), self.width_s):
            fig.add_vrect(x0=a, x1=b, fillcolor="#d62728", opacity=0.08, line_width=0, row=2, col=1)
        shown = ev[ev["event"] != "scale_decision"]
        for e, g in shown.groupby("event", sort=False):
            fig.add_trace(go.Scatter(
                x=g["t_s"], y=[1.02] * len(g), yaxis="y2", mode="markers", name=e.replace("_", " "),
                marker=dict(symbol="triangle-down", size=10, color=EVENT_COLOURS.get(e, "#000")),
                hovertext=[_hover(r) for r in g.to_dict("records")], hoverinfo="text+x"), 2, 1)
        for t in sorted(set(shown["t_s"].round(3))):
            fig.add_vline(x=t, line_width=1, line_dash="dot", line_color="#999")
        fig.update_yaxes(range=[-0.02, 1.06], row=2, col=1)
        fig.update_yaxes(title_text="waiting", row=3, col=1)
        fig.update_yaxes(title_text="ms", row=3, col=1, secondary_y=True)
        fig.update_xaxes(title_text=f"seconds since the start of run {rid}", row=4, col=1)
        fig.update_layout(template="plotly_white", height=860,
                          title=f"{self.study}, run {rid}: windows of {_dur(self.width_s)}, SLO {self.slo}",
                          legend=dict(orientation="h", y=-0.08), margin=dict(l=60, r=30, t=80, b=60))
        return fig

    def _default_run(self) -> str:
        with_events = [r for r in self.run_ids if (self.events["run_id"] == r).any()]
        return (with_events or list(self.run_ids))[0]

    # -- files ---------------------------------------------------------------------------
    def write(self, out: str | os.PathLike) -> list[str]:
        """windows.csv, incidents.csv, events.csv, summary.csv, timeline.txt and one offline
        figure per run (timeline-<run>.html), written atomically as one folder."""
        from ..io import atomic_dir, check_out, write_csv

        names = []
        with atomic_dir(check_out(out, "timeline.txt", "timeline export")) as tmp:
            for name, df in (("windows.csv", self.windows), ("incidents.csv", self.incidents),
                             ("events.csv", self.events), ("summary.csv", self.summary_frame())):
                write_csv(df, tmp / name)
                names.append(name)
            (tmp / "timeline.txt").write_text(self.to_text() + "\n", encoding="utf-8")
            names.append("timeline.txt")
            for rid in self.run_ids:
                name = f"timeline-{rid}.html"
                self.figure(rid).write_html(tmp / name, include_plotlyjs=True, full_html=True)
                names.append(name)
        return names


#: column → header for people (display_frame)
INCIDENT_LABELS = {
    "run_id": "run", "incident": "incident", "t_s": "at (s)", "kind": "kind", "what": "what happened",
    "pre_goodput_rps": "goodput before (req/s)", "time_to_breach_s": "SLO broken after (s)",
    "breach_s": "broken for (s)", "time_to_recover_s": "recovered after (s)",
    "good_lost": "good requests lost", "queue_peak": "longest queue", "drain_s": "queue drained in (s)",
    "queue_area_req_s": "request-seconds waiting", "desired_from": "desired before",
    "desired_to": "desired after", "decision_delay_s": "decision delay (s)",
    "ready_time_max_s": "ready after (s, longest)", "overshoot_gpu_h": "overshoot (GPU-hours)",
    "rate_from_rps": "rate before step (req/s)", "rate_to_rps": "rate after step (req/s)",
    "fall_t_s": "rate fell back at (s)", "recover_after_fall_s": "recovered after the fall (s)",
    "drain_after_fall_s": "queue back after the fall (s)"}
SUMMARY_LABELS = {
    "run_id": "run", "windows": "windows", "offered": "requests offered", "good": "good requests",
    "attainment": "attainment", "slo_minutes_broken": "SLO-minutes broken", "incidents": "incidents",
    "scale_decisions": "scale decisions", "reversals": "reversals",
    "overshoot_gpu_h": "overshoot (GPU-hours)", "queue_peak": "longest queue",
    "replicas_min": "fewest replicas ready", "replicas_max": "most replicas ready"}


def decision_counts(desired: list[int], start: int | None) -> tuple[int, int]:
    """(decisions that changed the desired count, of them those that reversed the direction
    of the previous change) — the autoscaler's activity and its thrash."""
    changes = reversals = 0
    prev, direction = start, 0
    for d in desired:
        if prev is not None and d != prev:
            step = 1 if d > prev else -1
            changes += 1
            if direction and step != direction:
                reversals += 1
            direction = step
        elif prev is None:
            changes += 1
        prev = d
    return changes, reversals


def incident_lines(r: dict) -> list[str]:
    """A few sentences per incident (the text every surface prints)."""
    out = [f"  Incident {r['incident']} at {r['t_s']:.1f} s — {r['kind']}: {r['what']}"]
    if not is_missing(r["pre_goodput_rps"]):
        out.append(f"    before: {r['pre_offered_rps']:.4g} req/s offered, goodput "
                   f"{r['pre_goodput_rps']:.4g} req/s, attainment {fmt_pct(r['pre_attainment'], 2)}, "
                   f"{r['pre_waiting']:.3g} waiting on average")
    if r.get("kind") == "load step" and not is_missing(r.get("rate_to_rps")):
        s = f"    offered {r['rate_from_rps']:.4g} → {r['rate_to_rps']:.4g} req/s"
        if is_missing(r.get("fall_t_s")):
            if r["rate_to_rps"] > r["rate_from_rps"]:
                s += "; the rate did not fall back in the run"
        else:
            s += f"; it fell back at {r['fall_t_s']:.1f} s"
            s += ("; the SLO not recovered by the end of the run" if is_missing(r["recover_after_fall_s"])
                  else f"; SLO recovered {r['recover_after_fall_s']:.0f} s after the fall")
            s += ("; queue not back to its pre-step level by the end of the run"
                  if is_missing(r["drain_after_fall_s"])
                  else f"; queue back to its pre-step level {r['drain_after_fall_s']:.1f} s after it")
        out.append(s)
    if r["breached"]:
        rec = (f"recovered {r['time_to_recover_s']:.0f} s after the event" if r["recovered"]
               else "not recovered by the end of the run")
        out.append(f"    SLO broken {r['time_to_breach_s']:.0f} s after the event, for "
                   f"{r['breach_s']:.0f} s; {rec}")
    else:
        out.append("    the SLO held in every window after it")
    if not is_missing(r["good_lost"]):
        out.append(f"    good requests lost against the pre-event rate: {r['good_lost']:,.0f}")
    if not is_missing(r["queue_peak"]):
        drain = ("queue not back to its pre-event level by the end of the run"
                 if is_missing(r["drain_s"]) else f"drained {r['drain_s']:.0f} s after the peak")
        out.append(f"    queue peaked at {r['queue_peak']:,.0f} waiting at {r['queue_peak_t_s']:.1f} s, "
                   f"{drain}; {r['queue_area_req_s']:,.0f} request-seconds waiting")
    if r.get("desired_to") is not None and not pd.isna(r.get("desired_to")):
        frm = "?" if pd.isna(r["desired_from"]) else f"{int(r['desired_from'])}"
        s = f"    desired {frm} → {int(r['desired_to'])}"
        if not is_missing(r["decision_delay_s"]):
            s += f"; decided {r['decision_delay_s']:.0f} s after the need changed"
        if not is_missing(r["ready_time_max_s"]):
            s += (f"; new replicas ready after {r['ready_time_mean_s']:.0f} s on average "
                  f"(longest {r['ready_time_max_s']:.0f} s)")
        if not is_missing(r["overshoot_gpu_h"]):
            s += f"; overshoot {r['overshoot_gpu_h']:.3g} GPU-hours until the next decision"
        out.append(s)
    elif not is_missing(r.get("ready_time_max_s")):
        out.append(f"    replacement ready after {r['ready_time_max_s']:.0f} s")
    return out


def _spans(mask: np.ndarray, start: np.ndarray, w: float):
    """(from, to) of each run of consecutive true windows."""
    if not mask.any():
        return []
    d = np.diff(np.r_[0, mask.astype(np.int8), 0])
    a, b = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    return [(float(start[i]), float(start[j - 1] + w)) for i, j in zip(a, b)]


def _hover(r: dict) -> str:
    bits = [r["event"].replace("_", " "), f"{r['t_s']:.1f} s"]
    for k in ("replica", "group", "detail"):
        if isinstance(r.get(k), str):
            bits.append(r[k])
    if r.get("source") == "derived":
        bits.append("(derived from the requests)")
    return "<br>".join(bits)




def _dur(s: float) -> str:
    return f"{s * 1000:g} ms" if s < 1 else f"{s:g} s"
