"""The autoscaler the simulator runs (docs/timeline.md "Scenario parts: autoscaler").

Every ``eval_period_s`` the policy reads signals over the last ``rate_window_s`` and sets a
desired replica count:

- ``queue_work`` (the default): R = ⌈(s·λ_w + Q_work/T_d) / C⌉, all in one work unit, the
  *prefill-equivalent token*: a prompt token is 1, an answer token ``w_d`` (the time one costs
  at a full batch over a prompt token's, :func:`work_weights`; a service model whose prompts
  cost nothing counts answer tokens only). λ_w is the work arriving
  per second (Σ prompt + w_d · answer of the arrivals in the window / the window), Q_work the
  work still to do — waiting requests whole, running ones what is left of their prompt and
  answer — drained within T_d, and C the work per second one replica serves within the SLO:
  ``capacity_rps`` × ``request_work``, the mean work of a request of the mix C_SLO was
  measured at. A request rate would miss a shift toward long prompts (the same req/s, more
  work) and a queue of requests would miss the work already running;
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
from .service import ServiceModel

SIGNALS = ("queue_work", "ttft_p99", "kv_use", "goodput")


@dataclass(frozen=True)
class AutoscalerSpec:
    """The policy's settings (module docstring). ``ready_s``: provision → ready of a new
    replica (the plan's ready-time parts); ``drain_timeout_s``: a draining replica is removed
    when it holds no request, at the latest after this (what it still holds is cancelled).
    ``request_work``: prefill-equivalent tokens per request of the mix ``capacity_rps`` was
    measured at (None: the mean of the arrivals in the run's first ``rate_window_s``);
    ``decode_token_weight``: prefill-equivalent tokens per answer token (None: from the
    replica's service model, :func:`work_weights`)."""

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
    request_work: float | None = None
    decode_token_weight: float | None = None

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
                         ("goodput_target", 0 < self.goodput_target <= 1),
                         ("request_work", self.request_work is None or self.request_work > 0),
                         ("decode_token_weight",
                          self.decode_token_weight is None or self.decode_token_weight > 0)):
            if not ok:
                raise SpecError(f"autoscaler.{name} is out of range: {getattr(self, name)!r}",
                                field=f"autoscaler.{name}", fix="see docs/timeline.md")


@dataclass(frozen=True)
class Signals:
    """What the autoscaler sees at one evaluation (over the last ``rate_window_s``); work in
    prefill-equivalent tokens (module docstring)."""

    rate_rps: float  # arrivals (attempts) per second
    work_rate: float  # λ_w: work arriving per second
    queue_work: float  # Q_work: work of the waiting requests + what the running ones have left
    window_arrivals: int = 0  # arrivals in the window (the request-work calibration)
    window_work: float = 0.0  # their work
    decode_token_weight: float = math.nan  # w_d the work was counted with
    prompt_token_weight: float = 1.0  # w_p (0 when the service model gives prompts no cost)
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
    capacity_work: float = math.nan  # C in work per second (capacity_rps × request work)
    asked: int = -1  # the signals' count before the clamp to [warm floor, max replicas]


def work_weights(service: ServiceModel, max_batch: int,
                 decode_weight: float | None = None) -> tuple[float, float]:
    """(prompt-token weight, answer-token weight) of the work unit. Given ``decode_weight``:
    (1, it). Else prefill-equivalent tokens from the service model: at a full batch of B
    sequences an answer token costs decode_step_ms(B) / B of a replica's time, a prompt token
    ``prefill_ms_per_token`` — (1, their ratio), the costs where capacity binds. A model whose
    prompts cost nothing (prefill_ms_per_token 0, as a twin fitted on data where prompts did
    not slow anything): (0, 1), the work is the answer tokens (the decision's detail says so)."""
    if decode_weight is not None:
        return 1.0, float(decode_weight)
    if service.prefill_ms_per_token > 0:
        return 1.0, float(service.step_ms(max_batch)) / max_batch / service.prefill_ms_per_token
    return 0.0, 1.0


def formula_desired(spec: AutoscalerSpec, work_rate: float, queue_work: float,
                    request_work: float) -> float:
    """(s·λ_w + Q_work/T_d) / C, C = capacity_rps × request_work — the queue-work signal
    before rounding up (every term in work per second)."""
    capacity_work = spec.capacity_rps * request_work
    return (spec.safety * work_rate + queue_work / spec.drain_target_s) / capacity_work


def raw_desired(spec: AutoscalerSpec, sig: Signals, ready: int,
                request_work: float | None = None) -> tuple[int, str, float]:
    """The largest count any signal asks for, with that signal's name and value.
    ``request_work``: the work of a request at C (default ``spec.request_work``); unknown
    (no arrival yet to calibrate on), the queue-work signal keeps the ready count."""
    best = (-1, "", math.nan)
    base = max(ready, 1)
    w = spec.request_work if request_work is None else request_work
    for s in spec.signals:
        if s == "queue_work":
            v = sig.queue_work
            n = base if w is None or math.isnan(v) else \
                _ceil(formula_desired(spec, sig.work_rate, sig.queue_work, w))
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
    stabilisation window, the time of its last change and the work of a request at C (given,
    or the mean of the arrivals seen until the first window has passed, then kept)."""

    def __init__(self, spec: AutoscalerSpec, initial: int):
        self.spec = spec
        self.desired = int(initial)
        self.history: deque = deque()
        self.last_change = -math.inf
        self.request_work = spec.request_work

    def decide(self, now_s: float, sig: Signals, ready: int) -> Decision:
        sp = self.spec
        if sp.request_work is None and sig.window_arrivals and \
                (self.request_work is None or now_s <= sp.rate_window_s + 1e-9):
            self.request_work = sig.window_work / sig.window_arrivals  # the run's starting mix
        asked, name, value = raw_desired(sp, sig, ready, self.request_work)
        raw = min(max(asked, sp.warm_floor), sp.max_replicas)
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
        cw = sp.capacity_rps * self.request_work if self.request_work is not None else math.nan
        return Decision(new, raw, name, value, changed, cw, asked)
