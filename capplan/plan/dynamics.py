"""The plan's failure, rollout and cold-start checks as they play out in time, simulated on a
twin at the planned size (docs/timeline.md "The plan, simulated").

The plan's reserves are static inequalities: after losing the largest zone the rest covers
the peak; during the worst rollout step the rest covers it; while a replica starts the fleet
absorbs the burst. ``simulate_plan`` runs each as a scenario on the twin (any object with
``synth_config(...)``, or a :class:`capplan.sim.SynthConfig`), one replica per planned
group, at a quarter's peak, and measures it with :func:`capplan.timeline.analyse_timeline`:

- **failure**: at t = 300 s lose what the plan's failure policy names — the largest zone, one
  node, or k groups — detected after ``detect_s``, routes removed ``route_removal_s`` later,
  in-flight requests lost (or resent; with ``SimSettings.retry`` the clients retry failed and
  rejected attempts under that policy, in the failure and rollout checks and their control
  runs); replacements are ready the plan's ready time later;
- **rollout**: at t = 300 s a rolling update with the plan's max surge and max unavailable,
  each new replica ready the plan's ready time after it is added;
- **cold start**: the demand rises from the mean (peak × mean_to_peak) to the peak at the
  plan's burst growth b (req/s per s) from t = 300 s, with an autoscaler (the R_desired
  formula at the plan's capacity per group, ready time, warm floor, at most the planned fleet).

Each is compared with the same run (same seed: the same arrivals and answers) on the fixed
planned fleet without the event: **SLO-minutes caused** = windows in breach in the scenario
minus those in the control run, × the window; **good requests lost** = good requests of the
control run − those of the scenario; beside it the clients' **retries** and the **retry
amplification** (attempts / original requests over the run; 1 without retries). The breach
duration, recovery and queue drain come from the scenario's own timeline. ``smallest_warm_floor`` and ``smallest_fleet`` search the least
warm floor (cold start) or planned fleet (failure) whose SLO-minutes caused stay within a
budget.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ..errors import SpecError
from ..slo import SLO
from ..sim.autoscale import AutoscalerSpec
from ..sim.config import SynthConfig
from ..sim.control import ControlSpec, FailureEvent, Placement, RolloutEvent
from ..sim.evaluate import run_study, system_config
from ..sim.retry import RetryPolicy
from ..timeline import Timeline, analyse_timeline
from ..twin.fleet import AutoscalerPart, DemandPart, FailurePart, RolloutPart
from ..twin.scenario import Part, ScenarioContext
from .sizing import failure_loss

EVENT_AT_S = 300.0
WINDOW_S = 10.0


@dataclass(frozen=True)
class SimSettings:
    """How the plan's scenarios are simulated (every default is stated in the result's notes)."""

    window_s: float = WINDOW_S
    detect_s: float = 10.0
    route_removal_s: float = 5.0
    in_flight: str = "lost"
    settle_s: float = 600.0  # simulated after the event's last step, for the queue to drain
    safety: float = 1.1
    drain_target_s: float = 60.0
    eval_period_s: float = 15.0
    stabilisation_s: float = 300.0
    seed: int = 0
    #: the clients' retry policy in the failure and rollout checks (None: no client retries —
    #: in-flight requests as ``in_flight`` says, rejections final)
    retry: RetryPolicy | None = None


@dataclass(frozen=True)
class DynamicCheck:
    """One scenario at the planned size: its sentence, figures and both timelines."""

    key: str  # failure | rollout | cold_start
    what: str
    sentence: str
    groups: int
    peak_rps: float
    slo_minutes: float  # caused: scenario − control
    good_lost: int  # control − scenario
    breach_s: float
    time_to_recover_s: float
    drain_s: float
    queue_peak: float
    budget_slo_minutes: float | None = None
    retries: int = 0  # retries the clients sent in the scenario
    retry_amplification: float = 1.0  # attempts / original requests over the scenario's run
    timeline: Timeline | None = field(default=None, repr=False)
    control: Timeline | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool | None:
        if self.budget_slo_minutes is None:
            return None
        return self.slo_minutes <= self.budget_slo_minutes + 1e-9


@dataclass(frozen=True)
class PlanDynamics:
    """The simulated outcome of the plan's checks (module docstring)."""

    plan_name: str
    quarter: str
    checks: tuple[DynamicCheck, ...]
    notes: tuple[str, ...] = ()

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{
            "check": c.key, "what": c.what, "groups": c.groups, "peak_rps": c.peak_rps,
            "slo_minutes_caused": c.slo_minutes, "good_requests_lost": c.good_lost,
            "retries": c.retries, "retry_amplification": c.retry_amplification,
            "breach_s": c.breach_s, "time_to_recover_s": c.time_to_recover_s,
            "drain_s": c.drain_s, "queue_peak": c.queue_peak,
            "budget_slo_minutes": c.budget_slo_minutes, "within_budget": c.ok,
            "sentence": c.sentence} for c in self.checks])

    def to_text(self) -> str:
        out = [f"{self.plan_name}: the plan's checks simulated at the {self.quarter} peak"]
        for c in self.checks:
            mark = "" if c.ok is None else ("[ok] " if c.ok else "[FAIL] ")
            out.append(f"  {mark}{c.sentence}")
        if self.notes:
            out += ["", "Notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(out)

    def figure(self, key: str | None = None):
        """The timeline figure of one scenario (default: the first)."""
        c = self.checks[0] if key is None else next(c for c in self.checks if c.key == key)
        fig = c.timeline.figure()
        fig.update_layout(title=c.sentence)
        return fig


def base_config(system, *, duration_s: float, seed: int) -> SynthConfig:
    """The twin as a synth configuration (a SynthConfig is taken as it is): one run of
    ``duration_s`` at the system's own rates, no warm-up."""
    if not (isinstance(system, SynthConfig) or hasattr(system, "synth_config")):
        raise SpecError("simulating a plan needs a twin (capplan twin fit) or a synth config",
                        field="twin", fix="pass --twin twin.yaml")
    return system_config(system, duration_s=duration_s, warmup_s=0.0, seed=seed, itl=False)


def fleet_config(cfg: SynthConfig, groups: int, placement: Placement, retry: RetryPolicy | None = None) -> SynthConfig:
    """The planned fleet without any event: ``groups`` replicas placed as the plan places them
    (zones, groups per node), the clients' retry policy; the control run of every check."""
    return replace(cfg, replicas=int(groups), control=ControlSpec(initial=int(groups), placement=placement,
                                                                  retry=retry))


def with_parts(system, cfg: SynthConfig, *parts: Part) -> SynthConfig:
    """``cfg`` changed by scenario parts (``capplan.twin.fleet``), applied in the order given:
    the plan's checks say what happens with the twin's own parts, as a scenario file would."""
    ctx = ScenarioContext(system, cfg)
    for part in parts:
        ctx = part.apply(ctx)
    return ctx.config


def _run(cfg: SynthConfig, slo: SLO, capacity: float, settings: SimSettings, tmp: Path,
         name: str) -> tuple[Timeline, dict]:
    """The run's timeline and its statistics (the clients' retries among them)."""
    path, st = run_study(cfg, None, tmp / name)
    return analyse_timeline(path, slo, window_s=settings.window_s, capacity_rps=capacity,
                            derive=False), st[0]


def _ready_s(spec) -> float:
    return float(spec.autoscaling.ready_s)


def _placement(spec, gpus_per_group: int) -> Placement:
    n = spec.group.gpus_per_node
    per_node = n // gpus_per_group if gpus_per_group <= n else 1
    return Placement(zones=tuple(spec.failure.zones), per_node=max(1, per_node))


def _outcome(key: str, what: str, groups: int, peak: float, tl: Timeline, ctl: Timeline,
             budget, stats: dict) -> DynamicCheck:
    s, c = tl.summary_frame().iloc[0], ctl.summary_frame().iloc[0]
    minutes = max(0.0, float(s["slo_minutes_broken"] - c["slo_minutes_broken"]))
    lost = int(c["good"] - s["good"])
    inc = tl.incidents
    first = inc.iloc[0] if len(inc) else None
    breach = float(first["breach_s"]) if first is not None and first["breached"] else 0.0
    rec = float(first["time_to_recover_s"]) if first is not None and first["breached"] else 0.0
    drain = float(first["drain_s"]) if first is not None else math.nan
    queue = float(first["queue_peak"]) if first is not None else math.nan
    retries = int(stats.get("retries_sent", 0))
    amp = float(stats.get("retry_amplification", 1.0))
    if minutes <= 0 and lost <= 0:
        tail = "the SLO held (no SLO-minute beyond the same run without it)"
    else:
        tail = (f"SLO broken for {breach:,.0f} s ({minutes:.3g} SLO-minutes caused), "
                f"{max(lost, 0):,} good requests lost")
        if retries:
            tail += f" ({retries:,} client retries: ×{amp:.4f} attempts per request)"
        if first is not None and not math.isnan(drain):
            tail += f", queue drained {_dur(first['queue_peak_t_s'] - first['t_s'] + drain)} after the event"
        elif first is not None and not math.isnan(queue):
            tail += ", queue not drained by the end of the run"
    if retries and minutes <= 0 and lost <= 0:
        tail += f" ({retries:,} client retries: ×{amp:.4f} attempts per request)"
    return DynamicCheck(key=key, what=what, sentence=f"{what}: {tail}", groups=groups,
                        peak_rps=peak, slo_minutes=minutes, good_lost=lost, breach_s=breach,
                        time_to_recover_s=rec, drain_s=drain, queue_peak=queue,
                        budget_slo_minutes=budget, retries=retries, retry_amplification=amp,
                        timeline=tl, control=ctl)


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def failure_scenario(plan, system, *, groups: int | None = None, quarter: int = 0,
                     settings: SimSettings = SimSettings(), budget=None, tmp: Path) -> DynamicCheck:
    spec = plan.spec
    N = int(plan.value("total_groups") if groups is None else groups)
    g = int(plan.value("gpus_per_group"))
    peak = plan.quarters[quarter].peak_rps
    C = plan.capacity.rps_per_group
    pol = spec.failure.policy
    T = _ready_s(spec)
    lose = {"zone": ("zone", 1), "node": ("node", 1), "n_plus_k": ("replicas", spec.failure.k),
            "none": ("replicas", 1)}[pol]
    in_flight = "retried" if settings.retry is not None else settings.in_flight
    fail = FailureEvent(at_s=EVENT_AT_S, lose=lose[0], count=lose[1], detect_s=settings.detect_s,
                       route_removal_s=settings.route_removal_s, in_flight=in_flight,
                       ready_s=T)
    L = failure_loss(N, spec.failure, g, spec.group.gpus_per_node) if pol != "none" else 1
    what = {"zone": f"losing zone {spec.failure.zones[0]} ({L} of {N} groups)",
            "node": f"losing one node ({L} of {N} groups)",
            "n_plus_k": f"losing {L} of {N} groups",
            "none": f"losing 1 of {N} groups (the plan keeps no failure reserve)"}[pol]
    what += f" at the {plan.quarters[quarter].label} peak ({peak:.4g} req/s)"
    dur = EVENT_AT_S + settings.detect_s + T + settings.settle_s
    fleet = with_parts(system, fleet_config(base_config(system, duration_s=dur, seed=settings.seed), N,
                                            _placement(spec, g), settings.retry), DemandPart("steps", peak))
    tl, st = _run(with_parts(system, fleet, FailurePart((fail,))), plan.slo, C, settings, tmp, "failure")
    ctl, _ = _run(fleet, plan.slo, C, settings, tmp, "failure-control")
    return _outcome("failure", what, N, peak, tl, ctl, budget, st)


def rollout_scenario(plan, system, *, quarter: int = 0, settings: SimSettings = SimSettings(),
                     budget=None, tmp: Path) -> DynamicCheck:
    spec = plan.spec
    N = int(plan.value("total_groups"))
    peak = plan.quarters[quarter].peak_rps
    C = plan.capacity.rps_per_group
    T = _ready_s(spec)
    r = spec.rollout
    steps_n = math.ceil(N / max(1, r.max_surge + r.max_unavailable))
    dur = EVENT_AT_S + steps_n * (T + 5.0) + settings.settle_s
    roll = RolloutEvent(at_s=EVENT_AT_S, max_surge=r.max_surge, max_unavailable=r.max_unavailable,
                       ready_s=T)
    g = int(plan.value("gpus_per_group"))
    fleet = with_parts(system, fleet_config(base_config(system, duration_s=dur, seed=settings.seed), N,
                                            _placement(spec, g), settings.retry), DemandPart("steps", peak))
    what = (f"a rolling update of {N} groups (max surge {r.max_surge}, max unavailable "
            f"{r.max_unavailable}, ready in {T:g} s) at the {plan.quarters[quarter].label} peak "
            f"({peak:.4g} req/s)")
    tl, st = _run(with_parts(system, fleet, RolloutPart(roll)), plan.slo, C, settings, tmp, "rollout")
    ctl, _ = _run(fleet, plan.slo, C, settings, tmp, "rollout-control")
    return _outcome("rollout", what, N, peak, tl, ctl, budget, st)


def burst_part(plan, quarter: int = 0, *, burst_rps_per_s: float | None = None,
               mean_to_peak: float | None = None) -> tuple[DemandPart, float, float, float]:
    """(demand part, mean, peak, ramp seconds): from the mean to the quarter's peak at b
    req/s/s from t = 300 s (a step when b is 0 or infinite)."""
    spec = plan.spec
    peak = plan.quarters[quarter].peak_rps
    mtp = mean_to_peak if mean_to_peak is not None else (spec.demand.mean_to_peak or 0.6)
    mean = peak * mtp
    b = spec.autoscaling.burst_growth_rps_per_s if burst_rps_per_s is None else burst_rps_per_s
    if not b or not math.isfinite(b) or b <= 0:
        return DemandPart("steps", mean, ((EVENT_AT_S, peak),)), mean, peak, 0.0
    ramp = (peak - mean) / b
    return DemandPart("ramps", mean, ((EVENT_AT_S, EVENT_AT_S + ramp, peak),)), mean, peak, ramp


def cold_start_scenario(plan, system, *, warm_floor: int | None = None, quarter: int = 0,
                        burst_rps_per_s: float | None = None, settings: SimSettings = SimSettings(),
                        budget=None, tmp: Path) -> DynamicCheck:
    spec = plan.spec
    N = int(plan.value("total_groups"))
    C = plan.capacity.rps_per_group
    T = _ready_s(spec)
    W = spec.autoscaling.warm_floor_groups if warm_floor is None else int(warm_floor)
    burst, mean, peak, ramp = burst_part(plan, quarter, burst_rps_per_s=burst_rps_per_s)
    start = max(W, 1, math.ceil(settings.safety * mean / C - 1e-9))
    start = min(start, N)
    a = AutoscalerSpec(capacity_rps=C, ready_s=T, safety=settings.safety,
                       drain_target_s=settings.drain_target_s, eval_period_s=settings.eval_period_s,
                       stabilisation_s=settings.stabilisation_s, warm_floor=max(W, 1) if W else 1,
                       max_replicas=max(N, start))
    dur = EVENT_AT_S + ramp + T + settings.settle_s
    cfg = base_config(system, duration_s=dur, seed=settings.seed)
    place = _placement(spec, int(plan.value("gpus_per_group")))
    b = spec.autoscaling.burst_growth_rps_per_s if burst_rps_per_s is None else burst_rps_per_s
    how = f"at {b:g} req/s per s" if ramp else "at once"
    what = (f"a burst from the mean {mean:.4g} to the {plan.quarters[quarter].label} peak "
            f"{peak:.4g} req/s {how}, autoscaled from {start} groups (warm floor {W}, new groups "
            f"ready in {T:g} s, at most {N})")
    tl, st = _run(with_parts(system, fleet_config(cfg, start, place), burst, AutoscalerPart(a)),
                  plan.slo, C, settings, tmp, f"cold-start-w{W}")
    ctl, _ = _run(with_parts(system, fleet_config(cfg, N, place), burst), plan.slo, C, settings, tmp,
                  "cold-start-control")
    return _outcome("cold_start", what, start, peak, tl, ctl, budget, st)


def day_scenario(plan, system, *, quarter: int = 0, trace: str | None = None,
                 span_s: float = 86_400.0, warm_floor: int | None = None,
                 settings: SimSettings = SimSettings(), budget=None, tmp: Path) -> DynamicCheck:
    """A day under the autoscaler: a trace's day (its arrival shape stretched to ``span_s``,
    scaled so its busiest quarter-hour is the quarter's peak; a built-in working day without a
    trace), autoscaled as in the cold start; against the same day on the fixed planned fleet.
    The sentence adds the autoscaler's decisions, reversals and overshoot GPU-hours."""
    from ..sim.arrivals import load_trace
    from ..sim.demand import diurnal, from_trace

    spec = plan.spec
    N = int(plan.value("total_groups"))
    C = plan.capacity.rps_per_group
    T = _ready_s(spec)
    W = spec.autoscaling.warm_floor_groups if warm_floor is None else int(warm_floor)
    peak = plan.quarters[quarter].peak_rps
    prof = from_trace(load_trace(trace), span_s=span_s, peak_rps=peak) if trace else diurnal(span_s, peak)
    start = min(N, max(W, 1, math.ceil(settings.safety * float(prof.rate(0.0)) / C - 1e-9)))
    a = AutoscalerSpec(capacity_rps=C, ready_s=T, safety=settings.safety,
                       drain_target_s=settings.drain_target_s, eval_period_s=settings.eval_period_s,
                       stabilisation_s=settings.stabilisation_s, warm_floor=max(W, 1),
                       max_replicas=max(N, start))
    cfg = base_config(system, duration_s=span_s, seed=settings.seed)
    cfg = replace(cfg, rates=(peak,), demand=prof)
    place = _placement(spec, int(plan.value("gpus_per_group")))
    shape = f"trace {Path(trace).name}" if trace else "a working day"
    what = (f"{span_s / 3600:g} h of {shape} peaking at the {plan.quarters[quarter].label} peak "
            f"{peak:.4g} req/s, autoscaled between {max(W, 1)} and {N} groups (ready in {T:g} s)")
    # a working day's shape (diurnal) has no demand part: the profile is set on the config
    tl, st = _run(with_parts(system, fleet_config(cfg, start, place), AutoscalerPart(a)), plan.slo, C, settings,
                  tmp, "day")
    ctl, _ = _run(fleet_config(cfg, N, place), plan.slo, C, settings, tmp, "day-control")
    out = _outcome("day", what, start, peak, tl, ctl, budget, st)
    s = tl.summary_frame().iloc[0]
    sentence = (f"{what}: {out.slo_minutes:.3g} SLO-minutes caused, {max(out.good_lost, 0):,} good "
                f"requests lost against the fixed fleet; {int(s['scale_decisions'])} scale decisions "
                f"({int(s['reversals'])} reversed the one before), overshoot "
                f"{s['overshoot_gpu_h']:.3g} GPU-hours, {s['replicas_min']:.0f}–{s['replicas_max']:.0f} "
                "groups ready")
    return replace(out, sentence=sentence)


def simulate_plan(plan, system, *, quarter: int = 0, settings: SimSettings = SimSettings(),
                  budget_slo_minutes: float | None = None,
                  checks: tuple[str, ...] = ("failure", "rollout", "cold_start")) -> PlanDynamics:
    """The plan's failure, rollout and cold-start checks simulated at the planned size on the
    twin (module docstring). ``quarter``: index into ``plan.quarters``; ``budget_slo_minutes``:
    each check's SLO-minutes caused must stay within it (``ok``); ``checks`` may add ``"day"``
    (a working day under the autoscaler, ``day_scenario``)."""
    if not plan.quarters:
        raise SpecError("the plan has no quarter to simulate", field="demand")
    if not 0 <= quarter < len(plan.quarters):
        raise SpecError(f"quarter {quarter} is not in the plan (it has {len(plan.quarters)})",
                        field="quarter")
    if plan.slo is None:
        raise SpecError("simulating the plan needs its SLO", field="slo",
                        fix="add slo: 'ttft_ms=2000,attainment=0.99' to the spec or pass --slo")
    out = []
    with tempfile.TemporaryDirectory(prefix="capplan-plan-sim-") as d:
        tmp = Path(d)
        kw = dict(quarter=quarter, settings=settings, budget=budget_slo_minutes, tmp=tmp)
        if "failure" in checks:
            out.append(failure_scenario(plan, system, **kw))
        if "rollout" in checks:
            out.append(rollout_scenario(plan, system, **kw))
        if "cold_start" in checks:
            out.append(cold_start_scenario(plan, system, **kw))
        if "day" in checks:
            out.append(day_scenario(plan, system, **kw))
    notes = _notes(plan, settings)
    if getattr(system, "warning", None):  # a twin that disagreed with its study says so
        notes.insert(0, str(system.warning))
    return PlanDynamics(plan.spec.name, plan.quarters[quarter].label, tuple(out), tuple(notes))


def _notes(plan, settings: SimSettings) -> list[str]:
    return [
        f"one simulated replica per planned group, at the quarter's peak as a constant Poisson "
        f"rate; events at {EVENT_AT_S:g} s; windows of {settings.window_s:g} s; seed {settings.seed}",
        f"failures detected after {settings.detect_s:g} s, routes removed {settings.route_removal_s:g} s "
        f"later; in-flight requests {settings.in_flight if settings.retry is None else 'retried'}; "
        "replacements ready after the plan's ready time",
        ("no client retries (a lost request stays lost, a rejection is final)" if settings.retry is None
         else f"failure and rollout checks: {settings.retry.describe()}; retry amplification = "
              "attempts / original requests over the run"),
        "SLO-minutes caused and good requests lost are against the same run (same arrivals) on the "
        "fixed planned fleet without the event",
        f"the cold-start autoscaler: safety {settings.safety:g}, drain target {settings.drain_target_s:g} s, "
        f"evaluated every {settings.eval_period_s:g} s, scale-in stabilised over "
        f"{settings.stabilisation_s:g} s, capacity per group {plan.capacity.rps_per_group:.4g} req/s",
    ]


# ----------------------------------------------------------------------------- searches

@dataclass(frozen=True)
class BudgetSearch:
    """The smallest value of a knob (warm floor, planned groups) whose SLO-minutes caused stay
    within a budget; ``tried``: (value, SLO-minutes caused) in the order evaluated."""

    knob: str
    budget_slo_minutes: float
    chosen: int | None
    tried: tuple[tuple[int, float], ...]
    sentence: str

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(sorted(self.tried), columns=[self.knob, "slo_minutes_caused"])

    def to_text(self) -> str:
        return self.sentence + "\n" + "\n".join(
            f"  {self.knob} {v}: {m:.3g} SLO-minutes" for v, m in sorted(self.tried))

    def figure(self):
        import plotly.graph_objects as go

        df = self.to_frame()
        fig = go.Figure(go.Scatter(x=df[self.knob], y=df["slo_minutes_caused"], mode="lines+markers",
                                   name="SLO-minutes caused"))
        fig.add_hline(y=self.budget_slo_minutes, line_dash="dot", line_color="crimson")
        fig.update_layout(template="plotly_white", title=self.sentence,
                          xaxis_title=self.knob.replace("_", " "), yaxis_title="SLO-minutes caused")
        return fig


def _bisect(lo: int, hi: int, minutes_at) -> tuple[int | None, list[tuple[int, float]]]:
    """Smallest x in [lo, hi] with minutes_at(x) within budget (minutes_at returns (m, ok)),
    assuming fewer minutes with larger x; None when even hi is over."""
    tried, cache = [], {}

    def f(x):
        if x not in cache:
            m, ok = minutes_at(x)
            cache[x] = ok
            tried.append((x, m))
        return cache[x]

    if not f(hi):
        return None, tried
    while lo < hi:
        mid = (lo + hi) // 2
        if f(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi, tried


def smallest_warm_floor(plan, system, budget_slo_minutes: float, *, quarter: int = 0,
                        burst_rps_per_s: float | None = None,
                        settings: SimSettings = SimSettings()) -> BudgetSearch:
    """The least warm floor (groups kept warm) whose burst costs at most the budget."""
    N = int(plan.value("total_groups"))
    with tempfile.TemporaryDirectory(prefix="capplan-floor-") as d:
        def at(w):
            c = cold_start_scenario(plan, system, warm_floor=w, quarter=quarter,
                                    burst_rps_per_s=burst_rps_per_s, settings=settings,
                                    budget=budget_slo_minutes, tmp=Path(d) / f"w{w}")
            return c.slo_minutes, c.ok
        chosen, tried = _bisect(0, N, at)
    s = (f"smallest warm floor within {budget_slo_minutes:g} SLO-minutes per burst: "
         + (f"{chosen} group(s)" if chosen is not None else f"none up to the planned {N} groups"))
    return BudgetSearch("warm_floor", budget_slo_minutes, chosen, tuple(tried), s)


def smallest_fleet(plan, system, budget_slo_minutes: float, *, quarter: int = 0,
                   settings: SimSettings = SimSettings()) -> BudgetSearch:
    """The least planned fleet (groups) whose failure scenario costs at most the budget, from
    the traffic groups (no reserve) up to the plan's total; its reserve is that minus the
    traffic groups."""
    lo = int(plan.value("traffic_groups"))
    hi = int(plan.value("total_groups"))
    with tempfile.TemporaryDirectory(prefix="capplan-reserve-") as d:
        def at(n):
            c = failure_scenario(plan, system, groups=n, quarter=quarter, settings=settings,
                                 budget=budget_slo_minutes, tmp=Path(d) / f"n{n}")
            return c.slo_minutes, c.ok
        chosen, tried = _bisect(lo, hi, at)
    s = (f"smallest fleet within {budget_slo_minutes:g} SLO-minutes per failure: "
         + (f"{chosen} groups (a reserve of {chosen - lo} over the {lo} traffic groups)"
            if chosen is not None else f"none up to the planned {hi} groups"))
    return BudgetSearch("groups", budget_slo_minutes, chosen, tuple(tried), s)


__all__ = ["simulate_plan", "PlanDynamics", "DynamicCheck", "SimSettings", "smallest_warm_floor",
           "smallest_fleet", "BudgetSearch", "failure_scenario", "rollout_scenario",
           "cold_start_scenario", "day_scenario", "burst_part", "base_config", "fleet_config",
           "with_parts"]
