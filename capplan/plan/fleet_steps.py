"""When the fleet must change: the plan's quarters as dated steps — what to have in place on the
plan's first day, then each quarter that needs more (or fewer) groups, dated by the day its
planned demand passes what the previous quarter's fleet carries (docs/plan.md, "Fleet steps").

What a fleet of N groups *carries* is the largest planned demand D (peak × (1 + u)) that the
plan's own sizing rule serves with N groups — traffic, failure reserve, rollout overlap and
cold-start reserve included (``capplan.plan.size``), found by bisection on D. The day it is
passed:

- with a fixed peak and ``growth_per_quarter``, the plan's demand is one number per quarter, so
  it steps up on the first day of the quarter that needs more;
- with a forecast (``demand.history``), the first forecast step of the quarter at which the
  upper end of the peak so far in the quarter (``Forecast.bands["peak_so_far_upper"]``, the same
  quantile of the same simulated paths that gives the quarter's planned peak) × (1 + u) passes
  what the previous fleet carries; the date is that step's first day (a week counts from the
  Monday before the Sunday it is stamped with, a month from its first day).

A quarter that needs fewer groups is a step too: the groups can be released from its first day.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass

from .result import Plan
from .sizing import size
from .text import plural

_REL = 1e-10


@dataclass(frozen=True)
class FleetStep:
    """One dated change of the fleet. ``kind``: "start" (in place on the plan's first day),
    "add" or "release". ``carried_rps``: the largest planned demand the fleet before the step
    serves under the plan's rules (None for the start)."""

    kind: str
    quarter: str
    by: dt.date
    groups_from: int
    groups_to: int
    gpus_from: int
    gpus_to: int
    billed_from: int
    billed_to: int
    nodes_from: int
    nodes_to: int
    demand_rps: float
    carried_rps: float | None
    how: str  # why this day, in words

    def sentence(self) -> str:
        """The step in words, e.g. 'Add 1 node (8 billed GPUs) before 1 Apr 2027: …'."""
        day = _day(self.by)
        g = self.groups_to - self.groups_from
        n = self.nodes_to - self.nodes_from
        b = self.billed_to - self.billed_from
        to = (f"{plural(self.groups_to, 'replica group')} = {self.gpus_to:,} GPUs on "
              f"{plural(self.nodes_to, 'node')} ({self.billed_to:,} billed GPUs)")
        if self.kind == "start":
            return (f"Have {to} serving by {day}, the plan's first day ({self.quarter}: planned demand "
                    f"{self.demand_rps:.4g} req/s).")
        why = (f"{self.quarter}'s planned demand {self.demand_rps:.4g} req/s passes the "
               f"{self.carried_rps:.4g} req/s that {plural(self.groups_from, 'group')} carry with the "
               f"plan's reserves ({self.how})")
        if self.kind == "add":
            if n > 0:
                head = f"Add {plural(n, 'node')} ({b:,} billed GPUs) before {day}"
            else:
                head = f"Start {plural(g, 'more replica group')} ({g * self.gpus_per_group:,} GPUs) on the " \
                       f"{plural(self.nodes_to, 'node')} already paid for, before {day}"
            return f"{head}: {to} — {why}."
        free = (f"{plural(-n, 'node')} ({-b:,} billed GPUs)" if n < 0
                else f"{plural(-g, 'replica group')} (its nodes stay)")
        return f"From {day} {free} can be released: {to} carry {self.quarter}'s planned demand " \
               f"{self.demand_rps:.4g} req/s."

    @property
    def gpus_per_group(self) -> int:
        g = self.groups_to or self.groups_from
        return (self.gpus_to // g) if g else 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["by"] = self.by.isoformat()
        d["sentence"] = self.sentence()
        return d


def _day(d: dt.date) -> str:
    return f"{d.day} {d:%b %Y}"


def carried_rps(plan: Plan, groups: int) -> float:
    """The largest planned demand D that ``groups`` groups serve under the plan's sizing rule
    (reserves included); 0 when even D → 0 needs more (a warm floor above ``groups``)."""
    C = plan.capacity.rps_per_group
    g = plan.gpus_per_group or int(plan.value("gpus_per_group"))

    def need(D):
        return size(D, C, plan.spec, g).total

    if need(1e-12 * C) > groups:
        return 0.0
    lo, hi = 0.0, groups * C  # ⌈D/C⌉ ≤ N needs D ≤ N·C
    while need(hi) <= groups:  # never: traffic alone needs more than N above N·C
        hi *= 2.0
    for _ in range(200):
        if hi - lo <= _REL * hi:
            break
        mid = 0.5 * (lo + hi)
        if need(mid) <= groups:
            lo = mid
        else:
            hi = mid
    return lo


def _step_start(ts, freq: str) -> dt.date:
    day = ts.date()
    if freq == "W":  # pandas' weeks end on Sunday and are stamped with it
        return day - dt.timedelta(days=6)
    return day


def _crossing(plan: Plan, quarter_index: int, carried: float) -> tuple[dt.date, str]:
    """The day quarter ``quarter_index``'s planned demand passes ``carried`` (module docstring)."""
    q = plan.quarters[quarter_index]
    fc = plan.forecast
    u = plan.spec.demand.uncertainty
    bands = getattr(fc, "bands", None)
    if fc is None or bands is None or "peak_so_far_upper" not in bands:
        return q.start, "demand is planned per quarter, so it steps up on the quarter's first day"
    idx = bands.index.tz_localize(None) if bands.index.tz is not None else bands.index
    start = dt.datetime.combine(q.start, dt.time())
    end = dt.datetime.combine(q.end, dt.time.max)
    sel = (idx >= start) & (idx <= end)
    so_far = bands["peak_so_far_upper"].to_numpy()[sel] * (1 + u)
    steps = idx[sel]
    over = [i for i, v in enumerate(so_far) if math.isfinite(v) and v > carried * (1 + 1e-9)]
    if not over:  # the quarter's peak is its last step's value; float noise only
        return q.start, "the forecast's planned peak of the quarter"
    i = over[0]
    day = max(_step_start(steps[i], fc.freq), q.start)
    per = {"D": "day", "W": "week", "MS": "month"}.get(fc.freq, "step")
    return day, (f"the forecast's {fc.interval:.0%} upper peak so far in the quarter, × (1 + {u:g}), passes it "
                 f"in the {per} from {_day(day)}")


def fleet_steps(plan: Plan) -> tuple[FleetStep, ...]:
    """The plan's dated fleet steps: the first quarter's fleet by the plan's first day, then
    each quarter whose groups differ from the quarter before (module docstring)."""
    qs = plan.quarters
    if not qs or qs[0].start is None:
        return ()
    out = []
    q0 = qs[0]
    out.append(FleetStep("start", q0.label, q0.start, 0, q0.groups, 0, q0.gpus, 0, q0.billed_gpus, 0, q0.nodes,
                         float(q0.demand_rps or 0.0), None, "the plan's first day"))
    for i in range(1, len(qs)):
        a, b = qs[i - 1], qs[i]
        if b.groups == a.groups:
            continue
        carried = carried_rps(plan, a.groups)
        if b.groups > a.groups:
            by, how = _crossing(plan, i, carried)
            kind = "add"
        else:
            by, how = b.start, "the quarter's first day"
            kind = "release"
        out.append(FleetStep(kind, b.label, by, a.groups, b.groups, a.gpus, b.gpus, a.billed_gpus, b.billed_gpus,
                             a.nodes, b.nodes, float(b.demand_rps or 0.0), carried, how))
    return tuple(out)
