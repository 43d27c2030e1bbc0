"""What each system event did to the SLO, from the per-window figures (docs/timeline.md
"Per-event figures").

Events are grouped into *incidents*. An incident opens with a cause — ``fault_injected``,
``replica_failed``, ``rollout_step``, or a ``scale_decision`` that changes the desired count —
and takes the events of the same run that follow it (replicas added, ready, draining,
removed) until the next cause; causes within one window of each other are one incident (a
zone lost: several ``replica_failed`` and the ``fault_injected`` at one instant). A run whose
events have no cause gets one incident per follow-up event instead.

Per incident (window width w, target a, K = ``recover_windows``):

- *guard* g: requests scheduled up to g before t can still be in flight at t and be caught
  by the event (lost with a failed replica); g is the run's p99 end-to-end latency of completed
  requests, in whole windows (``guard_s``);
- *before*: the windows wholly inside [t − g − pre_s, t − g) after the warm-up — goodput,
  attainment, offered rate, mean requests waiting, and the waiting level the queue must return
  to (the 95th percentile of the waiting count at their ends, + 1);
- *breach*: the first window from the one holding t whose attainment is below a; *time to
  breach* = its start − t (0 when already breached);
- *recovery*: the first window after the breach that starts K windows in a row at or above a;
  *time to recover* = its start − t; *breach duration* = its start − the breach's start (a
  run that ends in breach: until the run's last window, flagged);
- *good requests lost* = Σ (pre-event goodput · w − good) over the windows from the one
  holding t − g up to the end of the impact (recovery or drained queue, whichever is later);
- *queue*: the peak of the requests waiting after t, when it was reached, the time from the
  peak until the waiting count is back at the pre-event level for K window ends in a row
  (*drain time*, interpolated inside the window where it crossed), and the area (request-
  seconds waiting) from t to then;
- load steps (a ``load_step`` up opens the incident; the first step down after it is when the
  rate *fell back*): the rates before and after, *recovery after the fall* = the recovery
  window's start − the fall (0 when the SLO came back before it), *drain after the fall* = the
  queue back at its pre-step level − the fall; *good requests lost* counts against the
  pre-step attainment (Σ pre-attainment · offered − good), since the pre-step goodput is
  below what the higher rate offers;
- scale decisions also: *decision delay* (from the first window since the previous decision
  where the replicas needed — ⌈smoothed offered rate / C⌉ — differed from those ready in the
  decision's direction, to the decision; without C, from the first breached window, for
  scale-outs), *ready time* of the replicas it added (added → ready, mean and longest) and
  *overshoot GPU-hours* = Σ max(0, provisioned − needed) · w · GPUs per replica / 3600 until
  the next decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

CAUSES = ("fault_injected", "replica_failed", "rollout_step", "scale_decision", "cache_flush")
FOLLOW_UPS = ("replica_added", "replica_ready", "replica_draining", "replica_removed")

INCIDENT_COLUMNS = (
    "run_id", "incident", "t_s", "kind", "what", "events", "pre_offered_rps", "pre_goodput_rps",
    "pre_attainment", "pre_waiting", "breached", "time_to_breach_s", "breach_s", "recovered",
    "time_to_recover_s", "good_lost", "queue_peak", "queue_peak_t_s", "drain_s",
    "queue_area_req_s", "desired_from", "desired_to", "decision_delay_s", "replicas_added",
    "ready_time_mean_s", "ready_time_max_s", "overshoot_gpu_h", "rate_from_rps", "rate_to_rps",
    "fall_t_s", "recover_after_fall_s", "drain_after_fall_s")


@dataclass(frozen=True)
class IncidentParams:
    """How incidents are measured (docs/timeline.md "Per-event figures")."""

    target: float
    width_s: float
    recover_windows: int = 5
    pre_s: float = 60.0
    warmup_s: float = 0.0
    capacity_rps: float | None = None  # per replica, for the replicas needed
    gpus_per_replica: int = 1
    rate_smooth_s: float = 10.0
    last_arrival_s: float = math.inf  # the run's last scheduled request
    guard_s: float = 0.0  # requests scheduled this long before an event can still be caught by it


def step_down(ev: pd.DataFrame) -> np.ndarray:
    """Which rows are a ``load_step`` down (rate after < rate before, both known)."""
    if "rate_before_rps" not in ev:
        return np.zeros(len(ev), bool)
    after = pd.to_numeric(ev["rate_rps"], errors="coerce").to_numpy(float)
    before = pd.to_numeric(ev["rate_before_rps"], errors="coerce").to_numpy(float)
    with np.errstate(invalid="ignore"):
        return (ev["event"] == "load_step").to_numpy() & (after < before)


def group_incidents(events: pd.DataFrame, width_s: float) -> list[pd.DataFrame]:
    """The events of one run split into incidents (module docstring), in time order. A load
    step up is a cause; a step down follows the incident it ends."""
    # the fleet at the start (replicas ready at 0) is the state events change, not a change
    ev = events[~((events["t_s"] <= 0) & events["event"].isin(FOLLOW_UPS))].reset_index(drop=True)
    if ev.empty:
        return []
    cause = (ev["event"].isin(CAUSES).to_numpy()
             | ((ev["event"] == "load_step").to_numpy() & ~step_down(ev)))
    if (ev["event"] == "scale_decision").any():  # a decision that keeps the count is no cause
        prev = None
        for i in np.flatnonzero(ev["event"].to_numpy() == "scale_decision"):
            d = ev.at[i, "desired"]
            d = None if pd.isna(d) else int(d)
            if d is not None and d == prev:
                cause[i] = False
            prev = d if d is not None else prev
        quiet = (ev["event"] == "scale_decision").to_numpy() & ~cause
        ev, cause = ev[~quiet].reset_index(drop=True), cause[~quiet]
    if not cause.any():
        return [ev.iloc[[i]] for i in range(len(ev))]
    groups, cur, t0 = [], [], None
    for i in range(len(ev)):
        t = float(ev.at[i, "t_s"])
        if cause[i] and (t0 is None or t - t0 >= width_s):
            if cur:
                groups.append(ev.iloc[cur])
            cur, t0 = [i], t
        else:
            cur.append(i)
    groups.append(ev.iloc[cur])
    if not cause[groups[0].index[0]]:  # follow-ups before the first cause stand alone
        head = groups.pop(0)
        groups = [head.iloc[[j]] for j in range(len(head))] + groups
    return groups


def _kind(inc: pd.DataFrame, prev_desired) -> tuple[str, object, object]:
    evs = set(inc["event"])
    if "fault_injected" in evs or "replica_failed" in evs:
        return "failure", None, None
    if "rollout_step" in evs:
        return "rollout", None, None
    if "cache_flush" in evs:
        return "cache flush", None, None
    if "scale_decision" in evs and inc["event"].iloc[0] != "load_step":
        d = inc[inc["event"] == "scale_decision"].iloc[0]
        to = None if pd.isna(d["desired"]) else int(d["desired"])
        frm = prev_desired if prev_desired is not None else (
            None if pd.isna(d["ready"]) else int(d["ready"]))
        kind = "scale out" if frm is None or to is None or to > frm else "scale in"
        return kind, frm, to
    if "load_step" in evs:
        return "load step", None, None
    return "replica change", None, None


def _what(inc: pd.DataFrame) -> str:
    parts = []
    for e, g in inc.groupby("event", sort=False):
        names = [str(x) for x in g["replica"].dropna()]
        grp = [str(x) for x in g["group"].dropna().unique()]
        s = e.replace("_", " ") + (f" ×{len(g)}" if len(g) > 1 else "")
        if names:
            s += " (" + ", ".join(names[:4]) + (", …" if len(names) > 4 else "") + ")"
        if grp:
            s += " [" + ", ".join(grp[:3]) + "]"
        parts.append(s)
    return "; ".join(parts)


def measure_incidents(run_id: str, incidents: list[pd.DataFrame], win: pd.DataFrame,
                      p: IncidentParams) -> pd.DataFrame:
    """The per-incident figures of one run (module docstring) from its window frame."""
    if not incidents or win.empty:
        return pd.DataFrame(columns=list(INCIDENT_COLUMNS))
    w = p.width_s
    K = max(1, int(p.recover_windows))
    start = win["t_start_s"].to_numpy()
    offered = win["offered"].to_numpy(float)
    good = win["good"].to_numpy(float)
    att = win["attainment"].to_numpy(float)
    breach = win["in_breach"].to_numpy(bool)
    okw = ~breach  # an empty window neither breaches nor is counted as a breach
    w_end = win["waiting_end"].to_numpy(float)
    w_peak = win["waiting_peak"].to_numpy(float)
    area = win["waiting_area_req_s"].to_numpy(float)
    nw = start.size
    streak = _streaks(okw, K)  # streak[k]: windows k … k+K−1 all at or above the target
    need = _needed(win, p)
    prov = win["replicas_provisioned"].to_numpy(float)
    ready_w = win["replicas_ready"].to_numpy(float)
    decisions = [i for i, inc in enumerate(incidents) if (inc["event"] == "scale_decision").any()]
    every = pd.concat(incidents)
    downs = np.sort(every.loc[step_down(every), "t_s"].to_numpy(float))  # the rate fell back
    rows = []
    prev_desired = None
    for n_inc, inc in enumerate(incidents):
        t = float(inc["t_s"].iloc[0])
        k0 = min(nw - 1, max(0, int(math.floor(t / w))))
        kind, d_from, d_to = _kind(inc, prev_desired)
        if d_to is not None:
            prev_desired = d_to
        t_g = t - p.guard_s  # requests scheduled after t_g may still be in flight at t
        k_g = min(k0, max(0, int(math.floor(t_g / w))))
        pre = (start >= max(t_g - p.pre_s, p.warmup_s)) & (start + w <= t_g + 1e-9)
        pre_good = good[pre].sum() / (pre.sum() * w) if pre.any() else math.nan
        pre_off = offered[pre].sum() / (pre.sum() * w) if pre.any() else math.nan
        pre_att = good[pre].sum() / offered[pre].sum() if pre.any() and offered[pre].sum() else math.nan
        pre_wait = area[pre].sum() / (pre.sum() * w) if pre.any() else math.nan
        level = (np.percentile(w_end[pre], 95) + 1.0) if pre.any() else 1.0
        # breach and recovery
        kb = _first(breach, k0)
        if kb is None:
            t_breach = breach_s = t_rec = math.nan
            kr = None
            breached, recovered = False, True
        else:
            kr = _first(streak, kb + 1)
            breached = True
            t_breach = max(0.0, start[kb] - t)
            recovered = kr is not None
            end_k = kr if recovered else nw
            breach_s = (start[end_k] if recovered else start[-1] + w) - start[kb]
            t_rec = start[kr] - t if recovered else math.nan
        # queue: peak after t, then back at the pre-event level for K window ends in a row
        q = _queue(t, k0, w_end, w_peak, win["t_end_s"].to_numpy(float), area, level, K, w,
                   win, start)
        # impact: windows from k0 to the later of recovery and drain
        ends = [k0 + 1]
        if kr is not None:
            ends.append(kr)
        elif breached:
            ends.append(nw)
        if not math.isnan(q["drain_end_s"]):
            ends.append(min(nw, int(math.ceil(q["drain_end_s"] / w))))
        k_imp = max(ends)
        if kind == "load step":  # more was offered than before: count against the attainment
            lost = (pre_att * offered[k_g:k_imp].sum() - good[k_g:k_imp].sum()) \
                if not math.isnan(pre_att) else math.nan
        else:
            lost = (pre_good * w * (k_imp - k_g) - good[k_g:k_imp].sum()) \
                if not math.isnan(pre_good) else math.nan
        row = {"run_id": run_id, "incident": n_inc + 1, "t_s": t, "kind": kind, "what": _what(inc),
               "events": len(inc), "pre_offered_rps": pre_off, "pre_goodput_rps": pre_good,
               "pre_attainment": pre_att, "pre_waiting": pre_wait, "breached": breached,
               "time_to_breach_s": t_breach, "breach_s": breach_s, "recovered": recovered,
               "time_to_recover_s": t_rec, "good_lost": lost, "queue_peak": q["peak"],
               "queue_peak_t_s": q["peak_t"], "drain_s": q["drain_s"], "queue_area_req_s": q["area"],
               "desired_from": d_from, "desired_to": d_to}
        row.update(_scale_figures(n_inc, inc, incidents, decisions, kind, start, w, need, ready_w,
                                  prov, breach, p, t))
        if kind == "load step":
            row.update(_step_figures(inc, downs, t, start, kr, breached, q["drain_end_s"]))
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(INCIDENT_COLUMNS))
    for c in ("desired_from", "desired_to", "replicas_added"):
        df[c] = df[c].astype("Int64")
    return df


def _step_figures(inc: pd.DataFrame, downs: np.ndarray, t: float, start: np.ndarray, kr,
                  breached: bool, drain_end_s: float) -> dict:
    """A load step's rates, when the rate fell back (the first step down after t) and the
    recovery and drain counted from then (module docstring)."""
    first = inc.iloc[0]
    out = {"rate_from_rps": float(pd.to_numeric(first["rate_before_rps"], errors="coerce")),
           "rate_to_rps": float(pd.to_numeric(first["rate_rps"], errors="coerce")),
           "fall_t_s": math.nan, "recover_after_fall_s": math.nan,
           "drain_after_fall_s": math.nan}
    if step_down(inc.iloc[[0]])[0]:
        return out  # a step down on its own: nothing fell back after it
    later = downs[downs > t]
    if later.size == 0:
        return out
    fall = float(later[0])
    out["fall_t_s"] = fall
    if not breached:
        out["recover_after_fall_s"] = 0.0
    elif kr is not None:
        out["recover_after_fall_s"] = max(0.0, float(start[kr]) - fall)
    if not math.isnan(drain_end_s):
        out["drain_after_fall_s"] = max(0.0, drain_end_s - fall)
    return out


def _first(mask: np.ndarray, k: int):
    idx = np.flatnonzero(mask[k:])
    return None if idx.size == 0 else int(k + idx[0])


def _streaks(ok: np.ndarray, K: int) -> np.ndarray:
    """streak[k] true when ok[k … k+K−1] all hold (windows past the end do not count)."""
    c = np.r_[0, np.cumsum(ok.astype(np.int64))]
    out = np.zeros(ok.size, bool)
    if ok.size >= K:
        out[: ok.size - K + 1] = (c[K:] - c[:-K]) == K
    return out


def _queue(t, k0, w_end, w_peak, t_end, area, level, K, w, win, start) -> dict:
    """Peak waiting after t (and when), drain time back to ``level``, area until then."""
    nw = w_end.size
    out = {"peak": math.nan, "peak_t": math.nan, "drain_s": math.nan, "area": math.nan,
           "drain_end_s": math.nan}
    low = w_end <= level
    back = _streaks(low, K)
    # the queue rose when a window's peak passed the level; it is back at the first window
    # end after that from which K window ends in a row stay at the level
    rose = _first(w_peak > level, k0)
    if rose is None:
        out.update(peak=float(w_peak[k0]), peak_t=float(win["t_start_s"].iloc[k0]), drain_s=0.0,
                   area=float(area[k0]))
        return out
    kb = _first(back, rose)
    last = nw - 1 if kb is None else kb
    seg = slice(k0, last + 1)
    kp = k0 + int(np.argmax(w_peak[seg]))
    peak_t = float(win["waiting_peak_t_s"].iloc[kp]) if "waiting_peak_t_s" in win else float(start[kp])
    out["peak"], out["peak_t"] = float(w_peak[kp]), peak_t
    if kb is None:
        out["area"] = float(area[seg].sum())
        return out
    # interpolate inside window kb: waiting from the start of kb (end of kb−1) to its end
    before = w_end[kb - 1] if kb > 0 else w_end[kb]
    frac = 1.0 if before <= w_end[kb] else min(1.0, max(0.0, (before - level) / (before - w_end[kb])))
    end_t = float(start[kb] + frac * w)
    out["drain_end_s"] = end_t
    out["drain_s"] = max(0.0, end_t - peak_t)
    out["area"] = float(area[k0:kb].sum() + frac * area[kb])
    return out


def _needed(win: pd.DataFrame, p: IncidentParams) -> np.ndarray:
    """Replicas needed per window: ⌈smoothed offered rate / C⌉ (NaN without C). The rate is
    the mean over ``rate_smooth_s`` centred on the window (at least the window itself)."""
    if not p.capacity_rps:
        return np.full(len(win), np.nan)
    k = max(1, int(round(p.rate_smooth_s / p.width_s)))
    rate = win["offered_rps"].to_numpy(float)
    if k > 1:
        rate = pd.Series(rate).rolling(k, center=True, min_periods=1).mean().to_numpy()
    return np.ceil(rate / float(p.capacity_rps) - 1e-9)


def _scale_figures(n_inc, inc, incidents, decisions, kind, start, w, need, ready_w, prov, breach,
                   p: IncidentParams, t) -> dict:
    out = {"decision_delay_s": math.nan, "replicas_added": None, "ready_time_mean_s": math.nan,
           "ready_time_max_s": math.nan, "overshoot_gpu_h": math.nan}
    added = inc[inc["event"] == "replica_added"]
    ready = inc[inc["event"] == "replica_ready"]
    times = []
    for _, a in added.iterrows():
        if pd.isna(a["replica"]):
            continue
        r = ready[(ready["replica"] == a["replica"]) & (ready["t_s"] >= a["t_s"])]
        if len(r):
            times.append(float(r["t_s"].iloc[0]) - float(a["t_s"]))
    if len(added):
        out["replicas_added"] = len(added)
    if times:
        out["ready_time_mean_s"], out["ready_time_max_s"] = float(np.mean(times)), float(max(times))
    if n_inc not in decisions:
        return out
    j = decisions.index(n_inc)
    prev_t = float(incidents[decisions[j - 1]]["t_s"].iloc[0]) if j > 0 else 0.0
    next_t = float(incidents[decisions[j + 1]]["t_s"].iloc[0]) if j + 1 < len(decisions) else math.inf
    k_prev = int(math.floor(prev_t / w)) + (1 if j > 0 else 0)
    k_t = min(start.size - 1, int(math.floor(t / w)))
    span = np.arange(min(k_prev, k_t), k_t + 1)
    if span.size:
        if not np.isnan(need).all():
            pressure = need[span] > ready_w[span] + 1e-9 if kind == "scale out" else \
                need[span] < ready_w[span] - 1e-9
        elif kind == "scale out":
            pressure = breach[span]
        else:
            pressure = np.zeros(span.size, bool)
        hit = np.flatnonzero(pressure)
        if hit.size:
            out["decision_delay_s"] = max(0.0, t - float(start[span[hit[0]]]))
    if not np.isnan(need).all():
        # until the next decision, within the arrivals (the drain after the last one needs 0)
        sel = (start >= math.floor(t / w) * w) & (start < next_t) & (start <= p.last_arrival_s)
        excess = np.maximum(0.0, prov[sel] - need[sel])
        out["overshoot_gpu_h"] = float(excess.sum() * w * p.gpus_per_replica / 3600.0)
    return out
