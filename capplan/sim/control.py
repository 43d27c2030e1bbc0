"""What happens to the fleet during a simulated run: replicas that fail, a rollout that swaps
them, an autoscaler that adds and drains them (docs/timeline.md "Scenario parts").

The simulator (:func:`capplan.sim.engine.simulate`) runs a :class:`Control` beside its
requests: at each time the control asks for (``next_ns``) it calls ``fire(now, sim)``, and
the control acts through the engine's :class:`Fleet` handle — add a replica (routable once
ready), fail one (the requests it holds are lost or retried by their clients), remove a
failed one from the routes, drain one (no new requests; removed when empty or at a deadline) —
and reads the signals an autoscaler sees. Every action becomes a row of the run's timeline
(``fleet.log``), so the study the twin writes shows what was done and when.

Placement: replica i of the initial fleet sits in zone ``i mod Z`` (zones named by the
scenario, 3 by default); within a zone, replicas fill nodes of ``per_node`` replicas in order.
A replica added later goes to the zone with the fewest live replicas (ties: the first), on a
node of its own group. "The largest zone" is the zone holding the most live replicas (ties:
the first); "one node" is the node holding the most.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Protocol

from ..errors import SpecError
from .autoscale import AutoscalerPolicy, AutoscalerSpec, Signals
from .retry import RetryPolicy

NS = 1_000_000_000
INF = 1 << 62


class Fleet(Protocol):  # the engine's handle (capplan.sim.engine)
    def live(self) -> list[int]: ...  # replicas added and not failed, removed or draining
    def ready(self) -> list[int]: ...  # live and routable
    def outstanding(self, idx: int) -> int: ...  # work it holds (tokens)
    def add(self, now: int, ready_at: int, group: str | None) -> int: ...
    def make_ready(self, idx: int, now: int) -> None: ...
    def fail(self, idx: int, now: int, retry_after: int | None) -> None: ...
    def unroute(self, idx: int, now: int) -> None: ...
    def drain(self, idx: int, now: int, deadline: int) -> None: ...
    def drain_deadline(self, idx: int, now: int) -> None: ...
    def signals(self, now: int, window: int, ttft_limit_ms: float) -> Signals: ...
    def log(self, t: int, event: str, replica: int | None = None, **cols) -> None: ...
    def group_of(self, idx: int) -> str | None: ...


@dataclass(frozen=True)
class Placement:
    """Zones and nodes of the fleet (module docstring)."""

    zones: tuple[str, ...] = ("a", "b", "c")
    per_node: int = 1

    def __post_init__(self):
        if not self.zones or self.per_node < 1:
            raise SpecError("placement needs at least one zone and ≥ 1 replica per node",
                            field="failure.zones")

    def initial(self, n: int) -> list[str]:
        """Group ("zone/node") of each of the first n replicas."""
        out, count = [], {z: 0 for z in self.zones}
        for i in range(n):
            z = self.zones[i % len(self.zones)]
            out.append(f"{z}/n{count[z] // self.per_node}")
            count[z] += 1
        return out


@dataclass(frozen=True)
class FailureEvent:
    """At ``at_s`` lose ``lose`` — ``replicas`` (that many, the busiest first), ``zone`` (the
    largest zone) or ``node`` (the largest node). The failure is detected after ``detect_s``;
    the router stops sending to the lost replicas ``route_removal_s`` later (until then,
    requests routed there fail at once). Requests the lost replicas held are ``lost``
    (status error, tokens received kept) or ``retried`` (their clients resend them
    ``retry_delay_s`` after the failure is seen, once — or, when the run's clients have a
    retry policy (``ControlSpec.retry``), as it says; the first attempt's tokens are dropped).
    ``replace``: a replacement is asked for at detection and is ready ``ready_s`` later."""

    at_s: float
    lose: str = "replicas"  # replicas | zone | node
    count: int = 1
    detect_s: float = 0.0
    route_removal_s: float = 0.0
    in_flight: str = "lost"  # lost | retried
    retry_delay_s: float = 1.0
    replace: bool = True
    ready_s: float = 0.0

    def __post_init__(self):
        if self.lose not in ("replicas", "zone", "node"):
            raise SpecError(f"failure.lose must be replicas, zone or node, got {self.lose!r}",
                            field="failure.lose")
        if self.in_flight not in ("lost", "retried"):
            raise SpecError(f"failure.in_flight must be lost or retried, got {self.in_flight!r}",
                            field="failure.in_flight")


@dataclass(frozen=True)
class RolloutEvent:
    """From ``at_s`` replace every replica of the fleet by a new one, ``max_surge`` above the
    fleet size at most and never more than ``max_unavailable`` below it (a Kubernetes rolling
    update): new replicas are ready ``ready_s`` after they are added; old ones drain (finishing
    what they hold, at most ``drain_timeout_s``)."""

    at_s: float
    max_surge: int = 1
    max_unavailable: int = 0
    ready_s: float = 0.0
    drain_timeout_s: float = 600.0

    def __post_init__(self):
        if self.max_surge < 0 or self.max_unavailable < 0 or self.max_surge + self.max_unavailable < 1:
            raise SpecError("a rollout needs max_surge + max_unavailable ≥ 1 (else it never moves)",
                            field="rollout.max_surge")


@dataclass(frozen=True)
class ControlSpec:
    """Everything the run's fleet does, for :class:`Control`."""

    initial: int
    placement: Placement = Placement()
    failures: tuple[FailureEvent, ...] = ()
    rollout: RolloutEvent | None = None
    autoscaler: AutoscalerSpec | None = None
    ttft_limit_ms: float = 2000.0  # what the goodput signal counts as a good first token
    #: the clients' retry policy (capplan.sim.retry): failed and rejected attempts are
    #: retried as it says; None: no client retries (a failure's ``in_flight: retried`` resends
    #: what the lost replica held once)
    retry: RetryPolicy | None = None

    def __post_init__(self):
        if self.retry is not None and any(f.in_flight == "lost" for f in self.failures):
            raise SpecError("failure.in_flight is lost (the clients do not retry) but the clients "
                            "have a retry policy", field="failure.in_flight",
                            fix="set in_flight: retried, or drop the retry policy")

    @property
    def max_replicas(self) -> int:
        a = self.autoscaler.max_replicas if self.autoscaler else 0
        surge = self.rollout.max_surge if self.rollout else 0
        return max(self.initial, a) + surge + len(self.failures) * self.initial


class Control:
    """The run's fleet controller (module docstring)."""

    def __init__(self, spec: ControlSpec):
        self.spec = spec
        self.queue: list[tuple] = []  # heap of (t, seq, what, arg)
        self.seq = 0
        self.policy = AutoscalerPolicy(spec.autoscaler, spec.initial) if spec.autoscaler else None
        for f in spec.failures:
            self._at(int(round(f.at_s * NS)), "fail", f)
        if spec.rollout is not None:
            self._at(int(round(spec.rollout.at_s * NS)), "rollout_start", spec.rollout)
        if spec.autoscaler is not None:
            self._at(int(round(spec.autoscaler.eval_period_s * NS)), "evaluate")
        self.old: set[int] = set()  # rollout: replicas still on the old version
        self.new: set[int] = set()
        self.rolling = False
        self.step = 0
        self.pending_ready: dict[int, int] = {}  # replica → ready time
        self.drain_deadline: dict[int, int] = {}

    # -- the schedule --------------------------------------------------------------------
    def _at(self, t: int, what: str, arg=None) -> None:
        heapq.heappush(self.queue, (int(t), self.seq, what, arg))
        self.seq += 1

    def next_ns(self) -> int:
        return self.queue[0][0] if self.queue else INF

    def fire(self, now: int, fleet: Fleet) -> None:
        """Run every control event due at ``now`` (in the order they were scheduled)."""
        while self.queue and self.queue[0][0] <= now:
            t, _, what, arg = heapq.heappop(self.queue)
            getattr(self, "_" + what)(t, fleet, arg)

    # -- replicas ------------------------------------------------------------------------
    def _add(self, now: int, fleet: Fleet, ready_s: float) -> int:
        ready_at = now + int(round(ready_s * NS))
        idx = fleet.add(now, ready_at, self._zone_for(fleet))
        self.pending_ready[idx] = ready_at
        self._at(ready_at, "ready", idx)
        return idx

    def _zone_for(self, fleet: Fleet) -> str:
        zones = self.spec.placement.zones
        live = {z: 0 for z in zones}
        for i in fleet.live():
            g = fleet.group_of(i)
            if g is not None and g.split("/")[0] in live:
                live[g.split("/")[0]] += 1
        z = min(zones, key=lambda k: (live[k], zones.index(k)))
        return f"{z}/new"

    def _ready(self, now: int, fleet: Fleet, idx: int) -> None:
        if self.pending_ready.pop(idx, None) is None:
            return  # cancelled (drained before it was ready), or failed
        fleet.make_ready(idx, now)
        self._rollout_progress(now, fleet)

    def later(self, t: int, what: str, arg=None) -> None:
        """Schedule one of the engine's own events (a drain deadline)."""
        self._at(t, what, arg)

    def _drain_deadline(self, now: int, fleet: Fleet, idx: int) -> None:
        fleet.drain_deadline(idx, now)

    # -- failures ------------------------------------------------------------------------
    def _fail(self, now: int, fleet: Fleet, f: FailureEvent) -> None:
        live = [i for i in fleet.live()]
        if f.lose == "replicas":
            lost = sorted(live, key=lambda i: (-fleet.outstanding(i), i))[: f.count]
            what, grp = f"{len(lost)} replica(s)", None
        else:
            key = (lambda i: (fleet.group_of(i) or "?").split("/")[0]) if f.lose == "zone" \
                else (lambda i: fleet.group_of(i) or "?")
            groups: dict[str, list[int]] = {}
            for i in live:
                groups.setdefault(key(i), []).append(i)
            order = sorted(groups, key=lambda g: (-len(groups[g]), g))
            grp = order[0] if order else None
            lost = groups.get(grp, [])
            what = f"{f.lose} {grp}"
        fleet.log(now, "fault_injected", None, group=grp,
                  detail=f"lose {what}; detect {f.detect_s:g} s, route removal {f.route_removal_s:g} s; "
                         f"in-flight requests {f.in_flight}"
                         + (f"; {self.spec.retry.describe()}" if self.spec.retry is not None else ""))
        # retried: seen at detection, then resent after the delay (once) or the policy's backoff
        retry = None if f.in_flight != "retried" else int(round(
            (f.detect_s + (0.0 if self.spec.retry is not None else f.retry_delay_s)) * NS))
        for i in lost:
            self.pending_ready.pop(i, None)
            fleet.fail(i, now, retry)
            self.old.discard(i)
            self.new.discard(i)
        t_detect = now + int(round(f.detect_s * NS))
        t_route = t_detect + int(round(f.route_removal_s * NS))
        self._at(t_route, "route_removal", tuple(lost))
        if f.replace and lost:
            self._at(t_detect, "replace", (len(lost), f.ready_s))

    def _route_removal(self, now: int, fleet: Fleet, lost) -> None:
        for i in lost:
            fleet.unroute(i, now)

    def _replace(self, now: int, fleet: Fleet, arg) -> None:
        n, ready_s = arg
        for _ in range(n):
            i = self._add(now, fleet, ready_s)
            if self.rolling:
                self.new.add(i)
        if self.policy is not None:  # the replacements count towards the desired fleet
            self.policy.desired = max(self.policy.desired, len(self._serving(fleet)))

    # -- rollout ---------------------------------------------------------------------------
    def _rollout_start(self, now: int, fleet: Fleet, r: RolloutEvent) -> None:
        self.rolling = True
        self.old = set(fleet.live())
        self.target = len(self.old)
        self._rollout_progress(now, fleet)

    def _rollout_progress(self, now: int, fleet: Fleet) -> None:
        r = self.spec.rollout
        if not self.rolling or r is None:
            return
        ready = set(fleet.ready())
        old_live = [i for i in fleet.live() if i in self.old]
        new_live = [i for i in fleet.live() if i in self.new]
        added = drained = 0
        moved = True
        while moved:  # surge new replicas, drain old ones, until neither rule allows more
            moved = False
            while len(old_live) + len(new_live) < self.target + r.max_surge and \
                    len(new_live) < self.target:
                i = self._add(now, fleet, r.ready_s)
                self.new.add(i)
                new_live.append(i)
                added += 1
                moved = True
            available = sum(1 for i in old_live + new_live if i in ready)
            for i in sorted(old_live, key=lambda i: (fleet.outstanding(i), i)):
                if available - (1 if i in ready else 0) < self.target - r.max_unavailable:
                    break
                fleet.drain(i, now, now + int(round(r.drain_timeout_s * NS)))
                old_live.remove(i)
                self.old.discard(i)
                available -= 1 if i in ready else 0
                drained += 1
                moved = True
                break  # one at a time: the surge rule may now allow a new replica
        if added or drained:
            self.step += 1
            fleet.log(now, "rollout_step", None, group=f"step {self.step}",
                      detail=f"{added} new replica(s) added, {drained} old drained; "
                             f"{len(old_live)} old left")
        if not old_live:
            self.rolling = False

    # -- autoscaler ------------------------------------------------------------------------
    def _serving(self, fleet: Fleet) -> list[int]:
        """Replicas that count towards the desired fleet: live (provisioning or ready)."""
        return list(fleet.live())

    def _evaluate(self, now: int, fleet: Fleet, _=None) -> None:
        a = self.spec.autoscaler
        self._at(now + int(round(a.eval_period_s * NS)), "evaluate")
        ready = fleet.ready()
        sig = fleet.signals(now, int(round(a.rate_window_s * NS)), self.spec.ttft_limit_ms)
        d = self.policy.decide(now / NS, sig, len(ready))
        cw = d.capacity_work  # C in prefill-equivalent tokens per second (NaN: not calibrated)
        fleet.log(now, "scale_decision", None, desired=d.desired, ready=len(ready), signal=d.signal,
                  signal_value=d.value, rate_rps=sig.rate_rps,
                  queue_work_s=sig.queue_work / cw, work_rate_replicas=sig.work_rate / cw,
                  detail=f"raw {d.raw} from {d.signal} (asked {d.asked}); C = {a.capacity_rps:g} req/s × "
                         f"{cw / a.capacity_rps:,.1f} tokens = {cw:,.1f} prefill-equivalent "
                         f"tokens/s, a prompt token = {sig.prompt_token_weight:g}, an answer "
                         f"token = {sig.decode_token_weight:.4g}")
        live = self._serving(fleet)
        if self.rolling:
            return  # a rollout sets the fleet while it runs
        if d.desired > len(live):
            for _ in range(d.desired - len(live)):
                self._add(now, fleet, a.ready_s)
        elif d.desired < len(live):
            # cancel replicas still provisioning first (newest first), then drain the least busy
            extra = len(live) - d.desired
            pend = sorted(self.pending_ready, key=lambda i: -self.pending_ready[i])
            for i in pend[:extra]:
                self.pending_ready.pop(i)
                fleet.drain(i, now, now)
                extra -= 1
            for i in sorted(ready, key=lambda i: (fleet.outstanding(i), -i))[:extra]:
                fleet.drain(i, now, now + int(round(a.drain_timeout_s * NS)))


__all__ = ["Control", "ControlSpec", "FailureEvent", "RolloutEvent", "Placement", "Fleet"]
