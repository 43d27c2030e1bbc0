"""The autoscaler the simulator runs (docs/timeline.md "Scenario parts: autoscaler").

Every ``eval_period_s`` the policy reads signals over the last ``rate_window_s`` and sets a
desired replica count:

- ``queue_work`` (the default): R = ⌈(s·λ_w + Q/T_d) / C⌉ — the arrival rate λ_w with safety
  factor s, plus the rate that drains the queued work Q (in requests of average size) within
  the drain target T_d, over C, the req/s one replica serves within the SLO;
- ``ttft_p99``: R = ⌈R_ready · TTFT p99 / target⌉ (proportional, as a horizontal pod autoscaler
  on a latency metric);
- ``kv_use``: R = ⌈R_ready · KV blocks in use / target share⌉;
- ``goodput``: R = ⌈R_ready · target / good share⌉ when the share of requests that got a
  good first token falls below the target.

With several signals the largest asks (any signal can scale out). Then:

1. clamp to [warm floor, max replicas];
2. *scale-out*: up to ``max_step`` replicas more per decision, at once;
3. *hysteresis*: a raw count below the current desired count scales in only when it is at least
   ``tolerance`` × current below it;
4. *scale-in*: only ``cooldown_s`` after the last change, never below the largest raw count of
   the last ``stabilisation_s`` (the decision is stable for that long), and ``max_step`` at most.

A policy with tolerance 0, no stabilisation, no cooldown and no step limit follows every
fluctuation (the naive policy that thrashes).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..errors import SpecError

SIGNALS = ("queue_work", "ttft_p99", "kv_use", "goodput")


@dataclass(frozen=True)
class AutoscalerSpec:
    """The policy's settings (module docstring). ``ready_s``: provision → ready of a new
    replica (the plan's ready-time parts); ``drain_timeout_s``: a draining replica is removed
    when it holds no request, at the latest after this (what it still holds is cancelled)."""

    capacity_rps: float
    ready_s: float = 0.0
    safety: float = 1.0
    drain_target_s: float = 60.0
    signals: tuple[str, ...] = ("queue_work",)
    eval_period_s: float = 15.0
    rate_window_s: float = 60.0
    stabilisation_s: float = 300.0
    tolerance: float = 0.0
    max_step: int | None = None
    cooldown_s: float = 0.0
    drain_timeout_s: float = 600.0
    warm_floor: int = 1
    max_replicas: int = 64
    ttft_target_ms: float = 2000.0
    kv_target: float = 0.8
    goodput_target: float = 0.99

    def __post_init__(self):
        bad = [s for s in self.signals if s not in SIGNALS]
        if not self.signals or bad:
            raise SpecError(f"unknown autoscaler signal(s) {bad or '(none)'}", field="autoscaler.signal",
                            fix="one or more of " + ", ".join(SIGNALS))
        for name, ok in (("capacity_rps", self.capacity_rps > 0), ("safety", self.safety > 0),
                         ("drain_target_s", self.drain_target_s > 0),
                         ("eval_period_s", self.eval_period_s > 0),
                         ("rate_window_s", self.rate_window_s > 0),
                         ("stabilisation_s", self.stabilisation_s >= 0),
                         ("tolerance", 0 <= self.tolerance < 1), ("ready_s", self.ready_s >= 0),
                         ("cooldown_s", self.cooldown_s >= 0),
                         ("drain_timeout_s", self.drain_timeout_s >= 0),
                         ("max_step", self.max_step is None or self.max_step >= 1),
                         ("warm_floor", self.warm_floor >= 0),
                         ("max_replicas", self.max_replicas >= max(1, self.warm_floor)),
                         ("ttft_target_ms", self.ttft_target_ms > 0),
                         ("kv_target", 0 < self.kv_target <= 1),
                         ("goodput_target", 0 < self.goodput_target <= 1)):
            if not ok:
                raise SpecError(f"autoscaler.{name} is out of range: {getattr(self, name)!r}",
                                field=f"autoscaler.{name}", fix="see docs/timeline.md")


@dataclass(frozen=True)
class Signals:
    """What the autoscaler sees at one evaluation (over the last ``rate_window_s``)."""

    rate_rps: float  # λ_w: arrivals per second
    queue: float  # Q: queued work in requests of average size
    ttft_p99_ms: float = math.nan  # of first tokens sent in the window
    kv_use: float = math.nan  # KV blocks in use / blocks, over the ready replicas
    good_share: float = math.nan  # share of first tokens in the window within the TTFT limit


@dataclass(frozen=True)
class Decision:
    desired: int
    raw: int  # the signals' count before hysteresis, steps and stabilisation
    signal: str  # the signal that asked for ``raw``
    value: float  # its value
    changed: bool


def formula_desired(spec: AutoscalerSpec, rate_rps: float, queue: float) -> float:
    """(s·λ_w + Q/T_d) / C — the queue-work signal before rounding up."""
    return (spec.safety * rate_rps + queue / spec.drain_target_s) / spec.capacity_rps


def raw_desired(spec: AutoscalerSpec, sig: Signals, ready: int) -> tuple[int, str, float]:
    """The largest count any signal asks for, with that signal's name and value."""
    best = (-1, "", math.nan)
    base = max(ready, 1)
    for s in spec.signals:
        if s == "queue_work":
            n, v = _ceil(formula_desired(spec, sig.rate_rps, sig.queue)), sig.queue
        elif s == "ttft_p99":
            v = sig.ttft_p99_ms
            n = base if math.isnan(v) else _ceil(base * v / spec.ttft_target_ms)
        elif s == "kv_use":
            v = sig.kv_use
            n = base if math.isnan(v) else _ceil(base * v / spec.kv_target)
        else:  # goodput
            v = sig.good_share
            n = base if math.isnan(v) or v >= spec.goodput_target else \
                _ceil(base * spec.goodput_target / max(v, 0.05))
        if n > best[0]:
            best = (n, s, float(v))
    return best


def _ceil(x: float) -> int:
    """⌈x⌉ tolerant to float noise (3.0000000001 → 3)."""
    return int(math.ceil(x - 1e-9 * max(1.0, abs(x))))


class AutoscalerPolicy:
    """The policy's state across evaluations: its desired count, the raw counts of the last
    stabilisation window and the time of its last change."""

    def __init__(self, spec: AutoscalerSpec, initial: int):
        self.spec = spec
        self.desired = int(initial)
        self.history: deque = deque()
        self.last_change = -math.inf

    def decide(self, now_s: float, sig: Signals, ready: int) -> Decision:
        sp = self.spec
        raw, name, value = raw_desired(sp, sig, ready)
        raw = min(max(raw, sp.warm_floor), sp.max_replicas)
        cur = self.desired
        want = cur if raw < cur and raw > cur * (1.0 - sp.tolerance) else raw  # hysteresis
        self.history.append((now_s, want))
        while self.history and self.history[0][0] < now_s - sp.stabilisation_s:
            self.history.popleft()
        step = sp.max_step if sp.max_step is not None else 1 << 30
        if want > cur:
            new = min(want, cur + step)
        elif want < cur:
            if now_s - self.last_change < sp.cooldown_s:
                new = cur
            else:
                stable = max(v for _, v in self.history)
                new = min(cur, max(stable, cur - step))
        else:
            new = cur
        changed = new != cur
        if changed:
            self.last_change = now_s
            self.desired = new
        return Decision(new, raw, name, value, changed)
