"""The replica simulator: continuous batching with iteration-level scheduling, event-driven.

Model (vLLM-like, one FIFO queue per replica):

- each iteration runs every *running* sequence once: decode sequences emit one token, then the
  rest of the per-iteration token budget goes to prompt chunks (chunked prefill) of sequences
  still in prefill, oldest first, then to newly admitted ones;
- a request is admitted from its replica's queue (FIFO, head-of-line) when the batch has fewer
  than ``max_batch`` sequences and the KV cache can hold its prompt blocks above the watermark;
- KV blocks: a sequence holds ceil(tokens/block_size) blocks and needs a new one each time its
  length crosses a block boundary. When the decode tokens of the next iteration do not fit, the
  most recently admitted sequence is preempted *by recompute*: its blocks are freed and it
  returns to the front of the queue; on re-admission it prefills prompt + tokens generated so
  far, and its stream continues (the client sees one long gap);
- the iteration time comes from a :class:`ServiceModel`;
- ``prefill="separate"`` (the twin's choice when the data show that a prompt does not slow the
  running decodes) moves prefill off the batch: an admitted sequence computes its prompt on a
  prefill lane (``prefill_overhead_ms + prefill_ms_per_token × prompt``; ``prefill_lanes`` at
  once, unbounded by default; each lane time × a per-request factor ``prefill_scale`` when
  given, e.g. lognormal jitter), emits its first token when the lane finishes and joins the
  decode batch at the next iteration boundary; decode iterations then take
  ``decode_step_ms(decoding sequences)`` only and the token budget does not apply. A lane is a
  server of its own: a queued prompt starts on it when it frees (or when the prompt arrives at a
  free lane), not at the next decode boundary — lane starts between boundaries are booked at
  the boundary with their own times (batch slots and KV blocks change only at boundaries);
- ``fault`` (open loop) marks requests the server fails whatever the load: 1 = an immediate
  error, 2 = a stall (never served; the client gives up at its deadline).
- a fleet ``control`` (:mod:`capplan.sim.control`) may change the replicas during the run:
  add one (routable once ready), fail one (the requests it holds are lost, or resent once by
  their clients after a delay, or retried as the clients' retry policy says
  (:mod:`capplan.sim.retry`, which also retries rejections) — a resent request starts over,
  its first attempt's tokens are dropped; requests routed to a failed replica before its
  routes are removed fail at once, or are resent), drain one (no new requests; removed when it holds none, or failed at a
  deadline). Every change is a timeline row (``SimResult.timeline``). Without a control the
  run is exactly as before (the presets' output is byte-identical).
- serving-policy hooks (open loop; without them the run is exactly as before): ``prefix`` (a
  :class:`capplan.sim.prefix.PrefixCache`) finds cached prompt tokens at admission — they are
  not prefilled — caches prompts and answers, and may route by prefix affinity; ``policy`` (a
  :class:`capplan.sim.policy.Policy`) orders each replica's queue (FIFO, fair queuing by
  virtual token counters, priority with aging) and admits, defers or rejects at arrival;
  ``deadline_ns`` replaces each client's deadline (the decode pool of a disaggregated system,
  :mod:`capplan.sim.disagg`).

Speed: between scheduling events (arrival that can be admitted, completion, KV block shortage,
client deadline, end of run) the batch is constant, so k decode iterations of equal length are
committed at once. Token times are not stored per token: each sequence keeps "stints" (first
iteration, token count) and each replica keeps piecewise-constant iteration segments; token
timestamps and ITL lists are rebuilt vectorised in :mod:`capplan.sim.events`.

Times are int64 ns. All state transitions are deterministic given the inputs.

Code: this module holds the public types and :func:`simulate`; a run's state and its event
loop are :class:`capplan.sim.run.Run` (arrivals, routing and admission), which takes its
hooks from :mod:`capplan.sim.batching` (the batching step: admission into the batch, the
iteration plan, service and completion), :mod:`capplan.sim.lanes` (separate prefill) and
:mod:`capplan.sim.fleetops` (fleet events); a replica's state and the KV block arithmetic
are in :mod:`capplan.sim.replica`. ``tests/test_synth_golden.py`` pins the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SpecError
from .replica import (CANCELLED, DECODE, DONE, ERROR, INF, OK, PREFILL, REJECTED, STATUS_NAMES,  # noqa: F401
                      TIMEOUT, UNRESOLVED, WAITING)
from .run import Run
from .service import DEFAULT_SERVICE_MODEL, ServiceModel


@dataclass(frozen=True)
class ReplicaParams:
    """One replica's scheduler and memory limits (all replicas are identical)."""

    max_batch: int = 128
    token_budget: int = 1024
    kv_blocks: int = 28_000
    block_size: int = 16
    kv_watermark: float = 0.01
    max_model_len: int = 16_384
    queue_limit: int | None = 512
    service: ServiceModel = DEFAULT_SERVICE_MODEL
    prefill: str = "mixed"  # "mixed": chunks inside the batch iteration | "separate": own lanes
    prefill_lanes: int | None = None  # separate prefill: prompts computed at once (None: any)
    prefill_jitter_cv: float = 0.0  # separate prefill: CV of a lognormal factor (mean 1) on each lane time

    def __post_init__(self):
        checks = [
            ("max_batch", self.max_batch >= 1),
            ("token_budget", self.token_budget >= self.max_batch),
            ("block_size", self.block_size >= 1),
            ("kv_blocks", self.kv_blocks >= 1),
            ("kv_watermark", 0.0 <= self.kv_watermark < 0.5),
            ("max_model_len", self.max_model_len >= 2),
            ("queue_limit", self.queue_limit is None or self.queue_limit >= 0),
            ("prefill", self.prefill in ("mixed", "separate")),
            ("prefill_lanes", self.prefill_lanes is None or self.prefill_lanes >= 1),
            ("prefill_jitter_cv", 0.0 <= self.prefill_jitter_cv <= 5.0),
        ]
        for name, ok in checks:
            if not ok:
                fix = {"token_budget": "token_budget must be ≥ max_batch (every running sequence decodes each iteration)",
                       "prefill": "mixed (prompt chunks inside the batch iteration) or separate (own prefill lanes)"}
                raise SpecError(f"replica.{name} is out of range: {getattr(self, name)!r}",
                                field=f"replica.{name}", fix=fix.get(name, "see docs/synth.md"))
        usable = int(self.kv_blocks * (1.0 - self.kv_watermark)) * self.block_size
        if self.max_model_len > usable:
            raise SpecError(f"max_model_len {self.max_model_len} exceeds the usable KV cache "
                            f"({usable} tokens = kv_blocks × block_size × (1 − watermark))",
                            field="replica.max_model_len",
                            fix="raise replica.kv_blocks or lower replica.max_model_len")


@dataclass(frozen=True)
class ClosedLoop:
    """Fixed-concurrency clients: each user sends its next request ``think_s`` after the last
    one resolved (after ``max(think_s, backoff_s)`` when it was rejected or failed at once)."""

    concurrency: int
    duration_s: float
    think_s: float = 0.0
    backoff_s: float = 1.0
    ramp_s: float = 0.0


@dataclass
class SimResult:
    """Raw simulator output for one run (arrays indexed by request, in issue order)."""

    sched_ns: np.ndarray
    input_tokens: np.ndarray
    target_output: np.ndarray
    tenant: np.ndarray
    status: np.ndarray
    admitted_ns: np.ndarray
    replica: np.ndarray
    stint_rid: np.ndarray
    stint_rep: np.ndarray
    stint_first_iter: np.ndarray
    stint_count: np.ndarray
    seg_i0: list  # per replica: np.ndarray of first iteration index of each segment
    seg_t0: list  # per replica: start time of that segment's first iteration
    seg_step: list  # per replica: iteration length in the segment
    seg_k: list  # per replica: iterations in the segment
    seg_tok: list  # per replica: tokens computed per iteration (decode + prefill)
    stats: dict = field(default_factory=dict)
    #: system events — fleet changes (with a control), prefix-cache flushes: (t_ns, event,
    #: replica index or None, {column: value})
    timeline: list = field(default_factory=list)
    #: with a control: each replica's group ("zone/node"), by index
    groups: list = field(default_factory=list)
    #: separate prefill: tokens emitted off the iteration grid (when a prefill lane finishes),
    #: one row each: request and time. None in mixed mode.
    xtok_rid: np.ndarray | None = None
    xtok_ns: np.ndarray | None = None
    #: with a prefix cache: prompt tokens computed at each request's first admission (−1: never
    #: admitted); None without one
    computed_input: np.ndarray | None = None
    #: replica names when not ``replica-<i>`` (the pools of a disaggregated system)
    replica_names: tuple | None = None
    #: the run's prompt prefixes (capplan.sim.prefix.Prefixes) when the workload has them
    prefixes: object = None
    #: with a control: retries each request's client sent (0: its first attempt only)
    retries: np.ndarray | None = None


def simulate(*, n_replicas: int, params: ReplicaParams, timeout_s: float, end_s: float,
             sched_ns: np.ndarray | None = None, input_tokens: np.ndarray | None = None,
             output_tokens: np.ndarray | None = None, tenant: np.ndarray | None = None,
             closed: ClosedLoop | None = None, draw=None, progress=None,
             fault: np.ndarray | None = None, prefill_scale: np.ndarray | None = None,
             control=None, prefix=None, policy=None, deadline_ns: np.ndarray | None = None) -> SimResult:
    """Simulate one run. Open loop: pass sorted ``sched_ns`` with the lengths (and tenant
    indices, and optionally ``fault`` codes: 1 error, 2 stall, and ``prefill_scale``: a factor
    on each request's prefill-lane time, separate prefill only). Closed loop: pass ``closed``
    and ``draw(n) -> (input, output, tenant)`` arrays.

    Requests unresolved at ``end_s`` (the hard stop, normally duration + drain) get status
    ``timeout`` when their client deadline had passed by then, else ``cancelled``; tokens
    received before the end are kept. ``control``: a :class:`capplan.sim.control.Control`
    (module docstring); ``n_replicas`` is then the initial fleet. ``prefix``, ``policy``,
    ``deadline_ns``: the serving-policy hooks of the module docstring (open loop only)."""
    run = Run(n_replicas=n_replicas, params=params, timeout_s=timeout_s, end_s=end_s, sched_ns=sched_ns,
              input_tokens=input_tokens, output_tokens=output_tokens, tenant=tenant, closed=closed, draw=draw,
              progress=progress, fault=fault, prefill_scale=prefill_scale, control=control, prefix=prefix,
              policy=policy, deadline_ns=deadline_ns)
    run.loop()
    return run.result(SimResult)
