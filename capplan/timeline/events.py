"""System events of a run: the recorded timeline, the events the request data show, and the
replica counts over time that both imply (docs/timeline.md "Events").

Recorded events come from the study's ``timeline/`` table (docs/study-contract.md section 9).
Where it is missing or silent, the requests still show some events (``derive_events``): a
``replica_group`` that stops serving while the run goes on (derived ``replica_failed`` when
requests it held ended failed, else ``replica_removed``), and one that first serves well after
the others (derived ``replica_ready``). The per-window arrival counts show a step in the offered
rate (``derive_load_steps``, a ``load_step``: a change-point rule on the counts, ``StepRule``).
Derived rows carry ``source = "derived"`` and say why in ``detail``.

``replica_series`` turns the events into step functions of the replicas *ready* (routable) and
*provisioned* (asked for and not yet gone: added, ready or draining — what is paid for), by a
small state machine per replica (anonymous events, without a replica id, adjust the counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import contract as C
from ..reduce import activity
from ..study import Study

#: columns of an events frame (the contract's, with seconds instead of ns, plus the source)
EVENT_FRAME_COLUMNS = ("run_id", "t_s", "event", "replica", "group", "desired", "ready", "signal",
                       "signal_value", "rate_rps", "rate_before_rps", "queue_work_s",
                       "work_rate_replicas", "detail", "source")
#: when events share a time, they apply in this order (a replacement is added after the failure)
_ORDER = {e: i for i, e in enumerate(("load_step", "fault_injected", "replica_failed",
                                      "rollout_step", "scale_decision", "cache_flush",
                                      "replica_draining",
                                      "replica_removed", "replica_added", "replica_ready"))}


def recorded_events(study: Study) -> pd.DataFrame:
    """The study's timeline table as a frame (seconds; ``source`` = "recorded"), ordered by
    run (manifest order), time and event; empty when the study has none."""
    if not study.timeline_files:
        return pd.DataFrame(columns=list(EVENT_FRAME_COLUMNS))
    cols = ", ".join(f'"{c.name}"' for c in C.TIMELINE_COLUMNS if c.name != "t_ns")
    df = study.sql(f"SELECT t_ns / 1e9 AS t_s, {cols} FROM timeline").df()
    df["source"] = "recorded"
    return _ordered(df, study)


def _ordered(df: pd.DataFrame, study: Study) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=list(EVENT_FRAME_COLUMNS))
    run_pos = {r: i for i, r in enumerate(study.manifest.run_ids)}
    df = df.assign(_r=df["run_id"].map(run_pos).fillna(len(run_pos)),
                   _e=df["event"].map(_ORDER).fillna(len(_ORDER)))
    df = df.sort_values(["_r", "t_s", "_e"], kind="stable").drop(columns=["_r", "_e"])
    for c in ("desired", "ready"):
        df[c] = df[c].astype("Int64")
    return df[list(EVENT_FRAME_COLUMNS)].reset_index(drop=True)


def derive_events(study: Study, recorded: pd.DataFrame, act: pd.DataFrame,
                  silence_s: float) -> pd.DataFrame:
    """Events the requests show but the timeline does not record (module docstring). A
    replica is *silent after t* when it served nothing after t while, for more than
    ``silence_s``, requests kept arriving and the other replicas (if any) kept serving; it
    *started late* when its
    first service came more than ``silence_s`` after the run's first. An event of the
    timeline within ``silence_s`` of that time, for that replica, explains it."""
    rows = []
    for run_id in study.manifest.run_ids:
        a = act[(act["run_id"] == run_id) & ~act["whole_run"] & act["value"].notna()]
        whole = act[(act["run_id"] == run_id) & act["whole_run"]]
        if a.empty or whole.empty:
            continue
        rec = recorded[recorded["run_id"] == run_id]
        run_first = float(a["first_service_s"].min())
        last_sched = float(whole["last_scheduled_s"].iloc[0])
        for _, g in a.iterrows():
            name = str(g["value"])
            mine = rec[rec["replica"] == name]
            last, first = float(g["last_service_s"]), float(g["first_service_s"])
            others = a[a["value"] != g["value"]]
            others_last = float(others["last_service_s"].max()) if len(others) else math.inf
            horizon = min(last_sched, others_last)  # requests kept coming and others served
            if math.isfinite(last) and horizon > last + silence_s:
                near = mine[mine["event"].isin(("replica_failed", "replica_removed",
                                                "replica_draining"))
                            & (mine["t_s"] <= last + silence_s) & (mine["t_s"] >= first - silence_s)]
                if near.empty:
                    failed = pd.notna(g["last_failed_s"]) and g["last_failed_s"] >= last - silence_s
                    rows.append({
                        "run_id": run_id, "t_s": last, "replica": name,
                        "event": "replica_failed" if failed else "replica_removed",
                        "detail": f"derived: replica_group {name} served nothing after {last:.1f} s "
                                  f"while the run went on to {horizon:.1f} s"
                                  + ("; requests it held ended failed" if failed else ""),
                        "source": "derived"})
            if math.isfinite(first) and first > run_first + silence_s:
                near = mine[mine["event"].isin(("replica_added", "replica_ready"))
                            & (mine["t_s"] <= first + silence_s)]
                if near.empty:
                    rows.append({
                        "run_id": run_id, "t_s": first, "replica": name, "event": "replica_ready",
                        "detail": f"derived: replica_group {name} first served at {first:.1f} s, "
                                  f"{first - run_first:.1f} s after the run's first service "
                                  "(it was ready by then)", "source": "derived"})
    df = pd.DataFrame(rows, columns=list(EVENT_FRAME_COLUMNS))
    return df


def system_events(study: Study, *, derive: bool = True, silence_s: float = 10.0,
                  act: pd.DataFrame | None = None) -> pd.DataFrame:
    """Recorded plus derived events, ordered (``EVENT_FRAME_COLUMNS``)."""
    rec = recorded_events(study)
    if not derive:
        return rec
    act = activity(study) if act is None else act
    return with_events(rec, derive_events(study, rec, act, silence_s), study)


# ----------------------------------------------------------------------------- load steps

@dataclass(frozen=True)
class StepRule:
    """When the per-window arrival counts show a step in the offered rate (docs/timeline.md
    "Load steps"). At each window boundary, A and B are the arrivals in the ``span_s`` before
    and after it (m = round(span_s / w) windows each, both inside the run's arrivals); a step
    when z = (B − A) / √(D · (A + B)) reaches ``z_min`` in size and B and A differ by at least
    ``min_change`` of the smaller. D ≥ 1 is the index of dispersion of the counts (1 for
    Poisson arrivals), so a burstier process needs a bigger jump. Of boundaries closer than m
    whose z has the same sign, the largest |z| is kept — on a tie the one with the largest jump
    between its two windows (a step up and the step down after it both stay, however short the
    step)."""

    span_s: float = 30.0
    z_min: float = 5.0
    min_change: float = 0.25

    def describe(self, width_s: float) -> str:
        m = self.windows(width_s)
        return (f"a step where the arrivals in the {m * width_s:g} s after a window boundary and "
                f"the {m * width_s:g} s before it differ by ≥ {self.z_min:g} standard deviations "
                f"(Poisson, × the counts' dispersion) and by ≥ {self.min_change:.0%}")

    def windows(self, width_s: float) -> int:
        return max(1, int(round(self.span_s / width_s)))


def difference_dispersion(counts: np.ndarray) -> float:
    """The index of dispersion (variance / mean) of per-window counts, the variance from
    successive differences — Σ (n_{k+1} − n_k)² / (2 (N − 1)) — so a step in the mean adds one
    difference, not a level shift to every window; at least 1."""
    n = np.asarray(counts, float)
    if n.size < 3 or n.mean() <= 0:
        return 1.0
    var = float(np.mean(np.diff(n) ** 2) / 2.0)
    return max(1.0, var / float(n.mean()))


def load_steps(counts: np.ndarray, width_s: float, rule: StepRule = StepRule()) -> pd.DataFrame:
    """The steps of one run's per-window arrival counts (window k covers [k·w, (k+1)·w)):
    one row per step — ``t_s`` (the boundary), ``rate_before_rps`` = A / (m w),
    ``rate_rps`` = B / (m w), ``z``, ``dispersion`` (``StepRule``)."""
    cols = ["t_s", "rate_before_rps", "rate_rps", "z", "dispersion"]
    n = np.asarray(counts, float)
    busy = np.flatnonzero(n > 0)
    m = rule.windows(width_s)
    if busy.size == 0 or busy[-1] + 1 - busy[0] < 2 * m:
        return pd.DataFrame(columns=cols)
    lo, hi = int(busy[0]), int(busy[-1]) + 1  # the run's arrivals: windows lo … hi − 1
    d = difference_dispersion(n[lo:hi])
    c = np.r_[0.0, np.cumsum(n)]
    k = np.arange(lo + m, hi - m + 1)  # boundaries with m whole windows of arrivals each side
    a, b = c[k] - c[k - m], c[k + m] - c[k]
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(a + b > 0, (b - a) / np.sqrt(d * (a + b)), 0.0)
    change = np.abs(b - a) / np.maximum(np.minimum(a, b), 1.0)
    cand = np.flatnonzero((np.abs(z) >= rule.z_min) & (change >= rule.min_change))
    kept: list[int] = []
    jump = np.abs(n[k] - n[k - 1])  # ties (a step shorter than the span): the sharpest edge
    order = cand[np.lexsort((cand, -jump[cand], -np.round(np.abs(z[cand]), 9)))]
    for i in order:  # greedy: largest |z| first
        if all(abs(int(k[i]) - int(k[j])) >= m or (z[i] > 0) != (z[j] > 0) for j in kept):
            kept.append(int(i))
    kept.sort()
    span = m * width_s
    return pd.DataFrame({"t_s": k[kept] * float(width_s), "rate_before_rps": a[kept] / span,
                         "rate_rps": b[kept] / span, "z": z[kept], "dispersion": d},
                        columns=cols)


def derive_load_steps(windows: pd.DataFrame, recorded: pd.DataFrame, width_s: float,
                      rule: StepRule = StepRule()) -> pd.DataFrame:
    """``load_step`` events (``EVENT_FRAME_COLUMNS``, source "derived") from the per-window
    ``offered`` counts of each run of a window frame; a recorded ``load_step`` of the run within
    ``rule.span_s`` of a detected one explains it (nothing derived there)."""
    rows = []
    for run_id, w in windows.groupby("run_id", sort=False):
        steps = load_steps(w.sort_values("window")["offered"].to_numpy(), width_s, rule)
        rec = recorded[(recorded["run_id"] == run_id) & (recorded["event"] == "load_step")]
        for s in steps.itertuples(index=False):
            if len(rec) and (np.abs(rec["t_s"].to_numpy(float) - s.t_s) <= rule.span_s).any():
                continue
            rows.append({"run_id": run_id, "t_s": float(s.t_s), "event": "load_step",
                         "rate_rps": float(s.rate_rps), "rate_before_rps": float(s.rate_before_rps),
                         "signal": "offered_rate", "signal_value": float(s.z),
                         "detail": f"derived: offered {s.rate_before_rps:.4g} → {s.rate_rps:.4g} "
                                   f"req/s (arrivals {rule.windows(width_s) * width_s:g} s either "
                                   f"side, z = {s.z:+.1f}, dispersion {s.dispersion:.2f})",
                         "source": "derived"})
    return pd.DataFrame(rows, columns=list(EVENT_FRAME_COLUMNS))


def with_events(events: pd.DataFrame, more: pd.DataFrame, study: Study) -> pd.DataFrame:
    """Two event frames as one, ordered (``EVENT_FRAME_COLUMNS``)."""
    if more.empty:
        return events
    if events.empty:
        return _ordered(more.copy(), study)
    both = pd.concat([events.astype(object), more.astype(object)], ignore_index=True)
    both["t_s"] = both["t_s"].astype(float)
    return _ordered(both, study)


# ----------------------------------------------------------------------------- replica counts

@dataclass(frozen=True)
class ReplicaSeries:
    """Replicas ready and provisioned as step functions of time on one run's clock: from
    ``t_s[i]`` until ``t_s[i + 1]`` there were ``ready[i]`` / ``provisioned[i]``."""

    run_id: str
    t_s: np.ndarray = field(repr=False)
    ready: np.ndarray = field(repr=False)
    provisioned: np.ndarray = field(repr=False)
    initial: int = 0
    how: str = ""

    def at(self, t: float, what: str = "ready") -> float:
        v = getattr(self, what)
        return float(v[max(0, int(np.searchsorted(self.t_s, t, side="right")) - 1)])

    def mean_over(self, edges: np.ndarray, what: str = "ready") -> np.ndarray:
        """The time-average over each interval [edges[i], edges[i + 1])."""
        return np.diff(step_integral(self.t_s, getattr(self, what).astype(float), edges)) \
            / np.diff(edges)


def step_integral(t: np.ndarray, v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """∫ from t[0] to x of the step function equal to v[i] on [t[i], t[i+1]) (v[-1] after)."""
    cum = np.r_[0.0, np.cumsum(v[:-1] * np.diff(t))]
    k = np.clip(np.searchsorted(t, x, side="right") - 1, 0, t.size - 1)
    return cum[k] + v[k] * (np.asarray(x, float) - t[k])


def replica_series(run_id: str, events: pd.DataFrame, served: list[str],
                   manifest_replicas: int) -> ReplicaSeries:
    """The replica counts of one run (module docstring). Replicas that served requests and
    whose first event is not ``replica_added``/``replica_ready``, and named replicas whose
    first event takes them out of service, were ready from the start; a run whose requests and
    events name no replica starts with ``manifest_replicas``."""
    ev = events[events["run_id"] == run_id]
    named = ev[ev["replica"].notna()]
    first_event = named.groupby("replica", sort=False)["event"].first().to_dict()
    start_ids = [r for r in served if first_event.get(r) not in ("replica_added", "replica_ready")]
    start_ids += [r for r, e in first_event.items()
                  if r not in served and e in ("replica_failed", "replica_draining",
                                               "replica_removed")]
    state = {r: "ready" for r in start_ids}
    anon = {"ready": 0, "pending": 0, "draining": 0}
    if not served and named.empty:
        anon["ready"] = int(manifest_replicas)
        how = f"{manifest_replicas} replica(s) at the start (study.yaml system.replicas)"
    else:
        how = f"{len(start_ids)} replica(s) ready from the start (served before any event)"
    initial = len(start_ids) + anon["ready"]

    def counts():
        ready = sum(1 for s in state.values() if s == "ready") + anon["ready"]
        prov = (sum(1 for s in state.values() if s in ("added", "ready", "draining"))
                + anon["ready"] + anon["pending"] + anon["draining"])
        return ready, prov

    ts, rd, pv = [0.0], *[[x] for x in counts()]
    for row in ev.itertuples(index=False):
        e, r = row.event, row.replica
        if e not in C.REPLICA_EVENTS:
            continue
        if isinstance(r, str):
            new = {"replica_added": "added" if state.get(r) in (None, "gone") else state.get(r),
                   "replica_ready": "ready", "replica_draining": "draining",
                   "replica_removed": "gone", "replica_failed": "gone"}[e]
            if e == "replica_draining" and state.get(r) in (None, "gone"):
                new = state.get(r) or "gone"
            state[r] = new
        else:
            _anonymous(anon, e)
        ready, prov = counts()
        if float(row.t_s) == ts[-1]:
            rd[-1], pv[-1] = ready, prov
        else:
            ts.append(float(row.t_s))
            rd.append(ready)
            pv.append(prov)
    if rd[0] != initial:  # events at 0 set the starting fleet (a simulator names it so)
        initial = rd[0]
        how = f"{initial} replica(s) ready at the start"
    return ReplicaSeries(run_id, np.asarray(ts), np.asarray(rd, np.int64),
                         np.asarray(pv, np.int64), initial, how)


def _anonymous(anon: dict, e: str) -> None:
    """Counts of replicas without ids: an event takes the first matching replica."""
    if e == "replica_added":
        anon["pending"] += 1
    elif e == "replica_ready":
        if anon["pending"]:
            anon["pending"] -= 1
        anon["ready"] += 1
    elif e == "replica_draining":
        if anon["ready"]:
            anon["ready"] -= 1
            anon["draining"] += 1
    else:  # removed or failed
        for k in (("draining", "ready", "pending") if e == "replica_removed"
                  else ("ready", "pending", "draining")):
            if anon[k]:
                anon[k] -= 1
                break
