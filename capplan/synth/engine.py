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
- a fleet ``control`` (:mod:`capplan.synth.control`) may change the replicas during the run:
  add one (routable once ready), fail one (the requests it holds are lost, or resent once by
  their clients after a delay, or retried as the clients' retry policy says
  (:mod:`capplan.synth.retry`, which also retries rejections) — a resent request starts over,
  its first attempt's tokens are dropped; requests routed to a failed replica before its
  routes are removed fail at once, or are resent), drain one (no new requests; removed when it holds none, or failed at a
  deadline). Every change is a timeline row (``SimResult.timeline``). Without a control the
  run is exactly as before (the presets' output is byte-identical).
- serving-policy hooks (open loop; without them the run is exactly as before): ``prefix`` (a
  :class:`capplan.synth.prefix.PrefixCache`) finds cached prompt tokens at admission — they are
  not prefilled — caches prompts and answers, and may route by prefix affinity; ``policy`` (a
  :class:`capplan.synth.policy.Policy`) orders each replica's queue (FIFO, fair queuing by
  virtual token counters, priority with aging) and admits, defers or rejects at arrival;
  ``deadline_ns`` replaces each client's deadline (the decode pool of a disaggregated system,
  :mod:`capplan.synth.disagg`).

Speed: between scheduling events (arrival that can be admitted, completion, KV block shortage,
client deadline, end of run) the batch is constant, so k decode iterations of equal length are
committed at once. Token times are not stored per token: each sequence keeps "stints" (first
iteration, token count) and each replica keeps piecewise-constant iteration segments; token
timestamps and ITL lists are rebuilt vectorised in :mod:`capplan.synth.events`.

Times are int64 ns. All state transitions are deterministic given the inputs.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import SpecError
from .service import DEFAULT_SERVICE_MODEL, ServiceModel

INF = 1 << 62

# request states
WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3
# status codes (index into STATUS_NAMES)
OK, REJECTED, TIMEOUT, ERROR, CANCELLED, UNRESOLVED = 0, 1, 2, 3, 4, 5
STATUS_NAMES = ("ok", "rejected", "timeout", "error", "cancelled", "unresolved")


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
    #: the run's prompt prefixes (capplan.synth.prefix.Prefixes) when the workload has them
    prefixes: object = None
    #: with a control: retries each request's client sent (0: its first attempt only)
    retries: np.ndarray | None = None


class _Rep:
    __slots__ = ("idx", "it", "wake", "t0", "step", "k", "kind", "tok", "waiting", "nwait",
                 "running", "ndec", "prefilling", "H", "used", "fin_heap", "dl_heap", "pf_done",
                 "seg_i0", "seg_t0", "seg_step", "seg_k", "seg_tok", "assigned", "done", "stopped",
                 "preemptions", "max_wait", "pf_heap", "lanes_busy", "routable", "alive", "draining",
                 "retry_after", "t_plan")

    def __init__(self, idx: int, bs: int):
        self.idx = idx
        self.it = 0
        self.wake = INF
        self.t0 = 0
        self.step = 0
        self.k = 0
        self.kind = 0  # 0 idle, 1 decode span, 2 mixed (prefill) iteration
        self.tok = 0
        self.waiting: deque = deque()
        self.nwait = 0
        self.running: dict = {}
        self.ndec = 0
        self.prefilling: list = []
        self.H = [0] * bs
        self.used = 0
        self.fin_heap: list = []
        self.dl_heap: list = []
        self.pf_done: list = []
        self.seg_i0: list = []
        self.seg_t0: list = []
        self.seg_step: list = []
        self.seg_k: list = []
        self.seg_tok: list = []
        self.assigned = 0
        self.done = 0
        self.stopped = False
        self.preemptions = 0
        self.max_wait = 0
        self.pf_heap: list = []  # separate prefill: (ready_ns, rid) of prompts on a lane
        self.lanes_busy = 0
        self.t_plan = 0  # separate prefill: when the replica last planned (a boundary)
        self.routable = True  # the router may send it requests
        self.alive = True  # it serves what it holds (False: failed or removed)
        self.draining = False
        self.retry_after = None  # failed: resend requests routed to it this long after (ns)


def _needs(H, it, k, bs, n):
    """New KV blocks the decode sequences need over the next k iterations."""
    if k == 1:
        return H[(-it) % bs]
    full, rem = divmod(k, bs)
    tot = n * full
    if rem:
        for e in range(bs):
            h = H[e]
            if h:
                r = (e + it) % bs
                if (bs - r + 1 if r else 1) <= rem:
                    tot += h
    return tot


def _max_k(H, it, free, bs, n):
    """Largest k with _needs(k) ≤ free."""
    full = free // n
    left = free - n * full
    cnt = [0] * (bs + 1)
    for e in range(bs):
        h = H[e]
        if h:
            r = (e + it) % bs
            cnt[bs - r + 1 if r else 1] += h
    s = 0
    rem = 0
    for d in range(1, bs):
        s += cnt[d]
        if s > left:
            break
        rem = d
    return full * bs + rem


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
    received before the end are kept. ``control``: a :class:`capplan.synth.control.Control`
    (module docstring); ``n_replicas`` is then the initial fleet. ``prefix``, ``policy``,
    ``deadline_ns``: the serving-policy hooks of the module docstring (open loop only)."""
    bs = params.block_size
    kv_total = params.kv_blocks
    wm = int(params.kv_watermark * kv_total)
    admit_cap = kv_total - wm
    max_batch = params.max_batch
    budget_tok = params.token_budget
    qlim = params.queue_limit if params.queue_limit is not None else INF
    max_len = params.max_model_len
    sm = params.service
    table = params.service.step_table_ns(max_batch + 1)
    kp_ns = sm.prefill_ms_per_token * 1e6
    over_ns = sm.prefill_overhead_ms * 1e6
    timeout_ns = int(round(timeout_s * 1e9))
    end_ns = int(round(end_s * 1e9))
    reps = [_Rep(i, bs) for i in range(n_replicas)]
    routing = reps  # the replicas the router considers (all of them without a control)
    sep = params.prefill == "separate"
    lanes = params.prefill_lanes if params.prefill_lanes is not None else INF
    if fault is not None and closed is not None:
        raise SpecError("fault codes work only for open-loop simulations", field="fault")

    # per-request state (python lists: fast scalar access)
    if closed is None:
        if len(sched_ns) and (np.any(np.diff(sched_ns) < 0) or sched_ns[0] < 0):
            raise SpecError("arrival times must be sorted and ≥ 0 ns", field="sched_ns")
        if len(sched_ns) and (input_tokens.min() < 1 or output_tokens.min() < 1):
            raise SpecError("every request needs ≥ 1 input and ≥ 1 output token", field="lengths")
        sched = sched_ns.tolist()
        inp = input_tokens.tolist()
        out = output_tokens.tolist()
        ten = (tenant if tenant is not None else np.zeros(len(sched), np.int64)).tolist()
        n0 = len(sched)
    else:
        sched, inp, out, ten = [], [], [], []
        n0 = 0
    dl = [s + timeout_ns for s in sched]
    pfx, pol = prefix, policy
    if closed is not None and (pfx is not None or pol is not None or deadline_ns is not None):
        raise SpecError("prefix caching, admission and scheduling policies work only for open-loop runs",
                        field="sweep.load_model")
    if deadline_ns is not None:
        dl = np.asarray(deadline_ns, dtype=np.int64).tolist()
    comp = [-1] * n0 if pfx is not None else None
    if pol is not None:
        for R in reps:
            R.waiting = pol.queue(R.idx)
    state = [WAITING] * n0
    status = [UNRESOLVED] * n0
    gen = [0] * n0  # tokens emitted before the current stint
    pst = [0] * n0  # iteration of the current stint's first token
    plen = [0] * n0  # prompt length of the current (re)admission
    rem = [0] * n0  # prefill tokens still to compute
    fin = [0] * n0
    ekey = [0] * n0
    adm = [-1] * n0
    rep_of = [-1] * n0
    st_rid, st_rep, st_p, st_cnt = [], [], [], []
    flt = fault.tolist() if fault is not None else None
    if prefill_scale is not None and (closed is not None or not sep):
        raise SpecError("prefill_scale works only for open-loop runs with separate prefill", field="prefill_scale")
    pfs = prefill_scale.tolist() if prefill_scale is not None else None
    ready_t = [0] * n0  # separate prefill: when the prompt on its lane is done
    lane_tok = [False] * n0  # separate prefill: the current stint's first token came off-grid
    qt = [0] * n0  # when the request joined its replica's queue (separate prefill's lanes start then)
    xt_rid: list = []
    xt_ns: list = []
    # fleet control (None: a fixed fleet, and none of this is touched)
    ctl = control
    rheap: list = []  # resent requests: (time, rid)
    resent: set = set()  # requests already resent once (no retry policy)
    rtr = None  # the clients' retry policy at work (capplan.synth.retry), if the control has one
    if ctl is not None and getattr(ctl.spec, "retry", None) is not None:
        from .retry import Retrier

        rtr = Retrier(ctl.spec.retry)
    n_att = [0, 0]  # first attempts, retries sent
    n_retry: dict = {}  # rid → retries sent
    void_from: dict = {}  # rid → first stint of its last attempt (earlier ones are dropped)
    xvoid_from: dict = {}  # the same for tokens sent off the grid (separate prefill)
    arr_t: deque = deque()  # (arrival time, prompt, answer tokens) in the control's signal window
    arr_sum = [0, 0]  # Σ prompt, Σ answer tokens of those arrivals
    ft: deque | None = None  # (first-token time, TTFT) in that window
    tl: list = []  # timeline rows
    groups: list = []
    wp, wd = 1.0, 1.0  # the autoscaler's prompt- and answer-token weights (its work unit)
    if ctl is not None and ctl.spec.autoscaler is not None:
        from .autoscale import work_weights

        wp, wd = work_weights(sm, max_batch, ctl.spec.autoscaler.decode_token_weight)
    if ctl is not None:
        ft = deque()
        groups = list(ctl.spec.placement.initial(n_replicas))
        for R in reps:
            tl.append((0, "replica_ready", R.idx, {"group": groups[R.idx],
                                                  "detail": "in service at the start"}))

    # closed loop bookkeeping
    cheap: list = []
    user_of: list = []
    reissued: list = []
    pool: list = [[], [], []]
    pool_pos = [0]
    seqno = [0]
    if closed is not None:
        if draw is None:
            raise SpecError("closed-loop simulation needs a length sampler", field="workload.lengths")
        dur_ns = int(round(closed.duration_s * 1e9))
        think_ns = int(round(closed.think_s * 1e9))
        back_ns = max(think_ns, int(round(closed.backoff_s * 1e9)), 1_000_000)
        for u in range(closed.concurrency):
            t = int(round(closed.ramp_s * 1e9 * u / closed.concurrency))
            heapq.heappush(cheap, (t, seqno[0], 0, u))
            seqno[0] += 1

    def new_request(t, u):
        if pool_pos[0] >= len(pool[0]):
            a, b, c = draw(4096)
            pool[0], pool[1], pool[2] = a.tolist(), b.tolist(), c.tolist()
            pool_pos[0] = 0
        j = pool_pos[0]
        pool_pos[0] = j + 1
        sched.append(t)
        inp.append(pool[0][j])
        out.append(pool[1][j])
        ten.append(pool[2][j])
        dl.append(t + timeout_ns)
        state.append(WAITING)
        status.append(UNRESOLVED)
        gen.append(0)
        pst.append(0)
        plen.append(0)
        rem.append(0)
        fin.append(0)
        ekey.append(0)
        adm.append(-1)
        rep_of.append(-1)
        ready_t.append(0)
        lane_tok.append(False)
        qt.append(0)
        user_of.append(u)
        reissued.append(False)
        rid = len(sched) - 1
        heapq.heappush(cheap, (t + timeout_ns, seqno[0], 1, rid))
        seqno[0] += 1
        return rid

    def resolved(rid, t, failed_fast=False):
        if closed is None or reissued[rid]:
            return
        reissued[rid] = True
        tn = t + (back_ns if failed_fast else think_ns)
        if tn < dur_ns:
            heapq.heappush(cheap, (tn, seqno[0], 0, user_of[rid]))
            seqno[0] += 1

    def stint(rid, r, p, cnt):
        if pol is not None:
            pol.tokens(rid, cnt)
        if lane_tok[rid]:  # its first token was sent when the prefill lane finished
            lane_tok[rid] = False
            p += 1
            cnt -= 1
        if cnt > 0:
            st_rid.append(rid)
            st_rep.append(r)
            st_p.append(p)
            st_cnt.append(cnt)

    def end_status(rid):
        return TIMEOUT if dl[rid] <= end_ns else CANCELLED

    def free_decode(R, rid):
        """Remove a decoding sequence from the batch; returns its KV length."""
        L = plen[rid] + (R.it - pst[rid] - 1)
        R.used -= -(-L // bs)
        R.H[ekey[rid]] -= 1
        R.ndec -= 1
        del R.running[rid]
        return L

    def cut(R, rid, now):
        """Resolve a running sequence at boundary ``now`` that missed its deadline or the end."""
        cutoff = dl[rid] if dl[rid] < end_ns else end_ns
        st = state[rid]
        if st == DECODE:
            cnt = R.it - pst[rid]
            left = fin[rid] - (R.it - 1)
            if now > cutoff:
                cnt -= 1
            free_decode(R, rid)
            stint(rid, R.idx, pst[rid], cnt)
            R.assigned -= left
        else:  # PREFILL
            R.used -= -(-plen[rid] // bs)
            R.prefilling.remove(rid)
            del R.running[rid]
            R.assigned -= rem[rid] + (out[rid] - gen[rid] - 1)
            if sep:
                R.lanes_busy -= 1
        state[rid] = DONE
        status[rid] = end_status(rid)  # called at the deadline or at the end of the run
        resolved(rid, now)

    def expire_waiting(R, rid, now):
        state[rid] = DONE
        status[rid] = end_status(rid)
        R.nwait -= 1
        R.assigned -= inp[rid] + out[rid] - 1  # a queued request's remaining work, preempted or not
        resolved(rid, now)

    def purge(R, now):
        w = R.waiting
        while w:
            h = w[0]
            if state[h] != WAITING:
                w.popleft()
            elif dl[h] <= now:
                w.popleft()
                expire_waiting(R, h, now)
            else:
                break

    def preempt_one(R):
        rid = next(reversed(R.running))
        if state[rid] == DECODE:
            cnt = R.it - pst[rid]
            free_decode(R, rid)
            stint(rid, R.idx, pst[rid], cnt)
            gen[rid] += cnt
            R.assigned += inp[rid] + gen[rid] - 1
        else:
            R.used -= -(-plen[rid] // bs)
            R.prefilling.remove(rid)
            del R.running[rid]
            R.assigned += plen[rid] - rem[rid]
            if sep:
                R.lanes_busy -= 1
        state[rid] = WAITING
        R.waiting.appendleft(rid)
        R.nwait += 1
        R.preemptions += 1

    def make_room(R, now):
        """Drop expired queued requests and preempt until the next decode step's KV blocks fit;
        returns the blocks that step needs."""
        purge(R, now)
        it = R.it
        H = R.H
        need1 = H[(-it) % bs] if R.ndec else 0
        while R.ndec and R.used + need1 > kv_total:
            preempt_one(R)
            need1 = H[(-it) % bs] if R.ndec else 0
        return need1

    def go_idle(R):
        if R.nwait:
            raise RuntimeError("synth: a queued request cannot be admitted into an empty replica "
                               "(max_model_len larger than the KV cache?)")
        R.kind = 0
        R.k = 0
        R.wake = INF

    def admit_head(R, now, need1):
        """Admit the head of the queue (FIFO) when the KV cache can hold its prompt; returns
        its index, or −1 when the queue is empty or the head must wait."""
        w = R.waiting
        while R.nwait:
            h = w[0]
            if state[h] != WAITING:
                w.popleft()
                continue
            if dl[h] <= now:
                w.popleft()
                expire_waiting(R, h, now)
                continue
            L = inp[h] + gen[h]
            need = -(-L // bs)
            if R.used + need + need1 > admit_cap:
                return -1
            w.popleft()
            R.nwait -= 1
            state[h] = PREFILL
            plen[h] = L
            rem[h] = L
            if pfx is not None:  # cached prompt tokens are not prefilled
                hit = pfx.lookup(R.idx, h, now, L, adm[h] < 0)
                rem[h] = L - hit
                R.assigned -= hit
                if adm[h] < 0:
                    comp[h] = L - hit
            if pol is not None:
                pol.admitted(R.idx, h, now, rem[h])
            R.used += need
            R.running[h] = 1
            R.prefilling.append(h)
            if adm[h] < 0:
                adm[h] = now
            heapq.heappush(R.dl_heap, (dl[h], h))
            return h
        return -1

    def decode_span(R, now, until):
        """Commit k decode-only iterations: up to the next finish, client deadline, end of
        run, KV block shortage or ``until`` (a prefill lane finishing), whichever comes first."""
        it = R.it
        n_dec = R.ndec
        step = table[n_dec]
        fh = R.fin_heap
        while True:
            f, rid = fh[0]
            if state[rid] == DECODE and fin[rid] == f:
                break
            heapq.heappop(fh)
        k = f - it + 1
        dh = R.dl_heap
        while dh and state[dh[0][1]] not in (PREFILL, DECODE):
            heapq.heappop(dh)
        if dh:
            kd = -(-(dh[0][0] - now) // step)
            if kd < k:
                k = kd
        if until < INF:
            kr = -(-(until - now) // step)
            if kr < k:
                k = kr
        ke = -(-(end_ns - now) // step)
        if ke < k:
            k = ke
        free = kv_total - R.used
        if bs * (free // n_dec) < k:
            kk = _max_k(R.H, it, free, bs, n_dec)
            if kk < k:
                k = kk
        if k < 1:
            k = 1
        R.kind = 1
        R.k = k
        R.t0 = now
        R.step = step
        R.tok = n_dec
        R.wake = now + k * step

    def plan(R, now):
        need1 = make_room(R, now)
        n_dec = R.ndec
        budget = budget_tok - n_dec
        P = 0
        nseq = n_dec
        chunks = []
        for rid in R.prefilling:
            c = rem[rid]
            if c > budget - P:
                c = budget - P
            if c <= 0:
                break
            chunks.append((rid, c))
            P += c
            nseq += 1
        running = R.running
        while R.nwait and len(running) < max_batch and P < budget:
            h = admit_head(R, now, need1)
            if h < 0:
                break
            L = rem[h]
            c = L if L < budget - P else budget - P
            chunks.append((h, c))
            P += c
            nseq += 1
        if P > 0:
            step = table[nseq if nseq <= max_batch + 1 else max_batch + 1] + int(round((kp_ns * P + over_ns) / 1000.0)) * 1000
            R.used += need1
            pf = R.pf_done
            for rid, c in chunks:
                r_ = rem[rid] - c
                rem[rid] = r_
                if r_ == 0:
                    pf.append(rid)
            if pf:
                for rid in pf:
                    R.prefilling.remove(rid)
            R.kind = 2
            R.k = 1
            R.t0 = now
            R.step = step
            R.tok = n_dec + P
            R.wake = now + step
        elif n_dec:
            decode_span(R, now, INF)
        else:
            go_idle(R)

    def start_lane(R, h, t):
        """Separate prefill: admitted ``h`` computes its prompt on a lane from ``t`` on."""
        lane_ns = kp_ns * rem[h] + over_ns
        if pfs is not None:
            lane_ns *= pfs[h]
        r = t + max(1000, int(round(lane_ns / 1000.0)) * 1000)
        ready_t[h] = r
        heapq.heappush(R.pf_heap, (r, h))
        R.lanes_busy += 1

    def plan_sep(R, now):
        """plan() for separate prefill: admit onto free prefill lanes, then run decode-only
        iterations, cut at the next lane completion so that a finished prompt joins the batch
        at the following boundary; with no decoding sequence, wait for a lane (kind 3)."""
        R.t_plan = now
        need1 = make_room(R, now)
        running = R.running
        while R.nwait and len(running) < max_batch and R.lanes_busy < lanes:
            h = admit_head(R, now, need1)
            if h < 0:
                break
            start_lane(R, h, now)
        ph = R.pf_heap
        while ph and (state[ph[0][1]] != PREFILL or ready_t[ph[0][1]] != ph[0][0]):
            heapq.heappop(ph)
        if R.ndec:
            decode_span(R, now, ph[0][0] if ph else INF)
        elif ph:
            t = ph[0][0]
            dh = R.dl_heap
            while dh and state[dh[0][1]] not in (PREFILL, DECODE):
                heapq.heappop(dh)
            if dh and dh[0][0] < t:
                t = dh[0][0] if dh[0][0] > now else now
            if t > end_ns:
                t = end_ns if end_ns > now else now
            R.kind = 3
            R.k = 0
            R.t0 = now
            R.step = 0
            R.tok = 0
            R.wake = t
        else:
            go_idle(R)

    def lane_fill(R, t_free, now):
        """Separate prefill: lanes free since ``t_free`` take queued prompts at once, each at
        ``t_free`` or when it joined the queue, whichever is later, while the batch has a slot
        and the KV cache the prompt's blocks. Called at boundary ``now`` for the time since the
        last plan: a lane is a server of its own and never waits for a decode boundary (batch
        slots and KV blocks change only at boundaries, so the state now is the state then).
        With a scheduling policy the prompt is the queue's head now, not at that earlier time."""
        w = R.waiting
        while R.nwait and len(R.running) < max_batch and R.lanes_busy < lanes:
            h = w[0]
            if state[h] != WAITING:
                w.popleft()
                continue
            s = qt[h] if qt[h] > t_free else t_free
            if dl[h] <= s:
                w.popleft()
                expire_waiting(R, h, s)
                continue
            if admit_head(R, s, 0) < 0:
                return  # the head waits for KV blocks freed at a boundary
            start_lane(R, h, s)

    def lanes_done(R, now):
        """Separate prefill, at boundary ``now``: the lanes since the last plan, in time order.
        Free lanes take the prompts queued since (``lane_fill``); a prompt whose lane finished
        by ``now`` sends its (first) token at the lane's finish time and joins the decode batch
        from iteration ``R.it`` on, and its lane takes the next prompt from that time on."""
        lane_fill(R, R.t_plan, now)
        ph = R.pf_heap
        while ph and ph[0][0] <= now:
            r, rid = heapq.heappop(ph)
            if state[rid] != PREFILL or ready_t[rid] != r:
                continue
            cutoff = dl[rid] if dl[rid] < end_ns else end_ns
            if r > cutoff:
                continue  # its deadline (or the end) came first: cut with the deadlines below
            R.lanes_busy -= 1
            R.prefilling.remove(rid)
            R.done += rem[rid]
            rem[rid] = 0
            xt_rid.append(rid)
            xt_ns.append(r)
            lane_tok[rid] = True
            first_token(rid, r, True)
            prompt_done(R, rid, now, True)  # books as if a prefill iteration had just ended
            lane_fill(R, r, now)

    def first_token(rid, t, on_time):
        """A request's prompt is done at ``t``: with a control, its first token (not a
        re-prefill after preemption) joins the signal window."""
        if ft is not None and on_time and gen[rid] == 0:
            ft.append((t, t - sched[rid]))

    def prompt_done(R, rid, now, on_time):
        """rid's prompt is computed by iteration R.it − 1 (its token counts when ``on_time``):
        it is done when it wanted one token, else it decodes from iteration R.it on."""
        it = R.it
        p = it - 1
        pst[rid] = p
        if pfx is not None:
            pfx.prefilled(R.idx, rid, now)
        left = out[rid] - gen[rid]
        if left <= 1:
            cnt = 1 if on_time else 0
            stint(rid, R.idx, p, cnt)
            R.used -= -(-plen[rid] // bs)
            del R.running[rid]
            state[rid] = DONE
            status[rid] = OK if cnt else (TIMEOUT if dl[rid] <= end_ns else CANCELLED)
            if cnt and pfx is not None:
                pfx.finished(R.idx, rid, now)
            resolved(rid, now)
        else:
            state[rid] = DECODE
            e = (plen[rid] - it) % bs
            ekey[rid] = e
            R.H[e] += 1
            R.ndec += 1
            f = p + left - 1
            fin[rid] = f
            heapq.heappush(R.fin_heap, (f, rid))

    def record(R, t0, step, k, tok):
        if k <= 0:
            return
        si = R.seg_i0
        if si and R.seg_step[-1] == step and R.seg_tok[-1] == tok and si[-1] + R.seg_k[-1] == R.it and \
                R.seg_t0[-1] + R.seg_k[-1] * step == t0:
            R.seg_k[-1] += k
        else:
            si.append(R.it)
            R.seg_t0.append(t0)
            R.seg_step.append(step)
            R.seg_k.append(k)
            R.seg_tok.append(tok)

    def wake(R):
        now = R.wake
        k = R.k
        kind = R.kind
        if kind:
            record(R, R.t0, R.step, k, R.tok)
            if kind == 1 and k:
                R.used += _needs(R.H, R.it, k, bs, R.ndec)
            R.it += k
            R.done += k * R.tok
        it = R.it
        if kind == 2 and R.pf_done:
            for rid in R.pf_done:
                first_token(rid, now, now <= (dl[rid] if dl[rid] < end_ns else end_ns))
                prompt_done(R, rid, now, now <= (dl[rid] if dl[rid] < end_ns else end_ns))
            R.pf_done = []
        if sep:
            lanes_done(R, now)
        fh = R.fin_heap
        while fh and fh[0][0] <= it - 1:
            f, rid = heapq.heappop(fh)
            if state[rid] != DECODE or fin[rid] != f:
                continue
            cutoff = dl[rid] if dl[rid] < end_ns else end_ns
            if now <= cutoff:
                cnt = f - pst[rid] + 1
                free_decode(R, rid)
                stint(rid, R.idx, pst[rid], cnt)
                state[rid] = DONE
                status[rid] = OK
                if pfx is not None:
                    pfx.finished(R.idx, rid, now)
                resolved(rid, now)
            else:
                cut(R, rid, now)
        dh = R.dl_heap
        while dh and dh[0][0] <= now:
            d, rid = heapq.heappop(dh)
            if state[rid] == PREFILL or state[rid] == DECODE:
                cut(R, rid, now)
        if R.draining and not R.running and not R.nwait:
            removed(R, now)
            return
        if now >= end_ns:
            for rid in list(R.running):
                cut(R, rid, now)
            for rid in R.waiting:
                if state[rid] == WAITING:
                    expire_waiting(R, rid, end_ns)
            R.waiting.clear()
            R.stopped = True
            R.kind = 0
            R.wake = INF
            return
        if sep:
            plan_sep(R, now)
        else:
            plan(R, now)

    def arrive(rid, t, first=True):
        if ctl is not None:
            arr_t.append((t, inp[rid], out[rid]))
            arr_sum[0] += inp[rid]
            arr_sum[1] += out[rid]
            if first:
                n_att[0] += 1
                if rtr is not None:
                    rtr.first(t)
            else:
                n_att[1] += 1
                n_retry[rid] = n_retry.get(rid, 0) + 1
        if flt is not None and flt[rid]:  # a fault: the server fails it whatever the load
            state[rid] = DONE
            status[rid] = ERROR if flt[rid] == 1 else (TIMEOUT if dl[rid] <= end_ns else CANCELLED)
            return
        if inp[rid] + out[rid] > max_len:
            state[rid] = DONE
            status[rid] = ERROR
            resolved(rid, t, True)
            return
        best = None
        bw = INF
        cands = [] if pfx is not None and pfx.affinity else None
        for R in routing:
            if R.stopped:
                continue
            if R.waiting:
                purge(R, t)
            if R.nwait >= qlim:
                continue
            w = R.assigned - R.done
            if R.kind == 1 or R.kind == 2:
                j = (t - R.t0) // R.step
                w -= (j if j < R.k else R.k) * R.tok
            if cands is not None:
                cands.append((R, w))
            if w < bw:
                bw = w
                best = R
        if cands:
            best = pfx.route(rid, t, cands, best, bw, inp[rid])
        if best is not None and pol is not None and pol.decide(
                rid, t, best.idx, best.waiting, best.ndec, inp[rid], ten[rid]) == 2:
            best = None  # refused by admission control
        if best is None:
            if rtr is not None and dl[rid] > t:  # its client retries a rejection under the policy
                b = rtr.decide(t, n_retry.get(rid, 0))
                if b is not None:
                    heapq.heappush(rheap, (t + b, rid))
                    return
            state[rid] = DONE
            status[rid] = REJECTED
            resolved(rid, t, True)
            return
        R = best
        rep_of[rid] = R.idx
        if not R.alive:  # failed, routes not yet removed: the request fails at once
            ra = R.retry_after
            drop(rid, t, ra if rtr is None or ra is None else 0)  # a policy's client sees it now
            return
        was_empty = R.nwait == 0
        R.waiting.append(rid)
        qt[rid] = t
        R.nwait += 1
        if R.nwait > R.max_wait:
            R.max_wait = R.nwait
        R.assigned += inp[rid] + out[rid] - 1
        if R.kind == 0:
            R.wake = t
        elif R.kind == 1 and was_empty and len(R.running) < max_batch \
                and R.used + -(-inp[rid] // bs) <= admit_cap and R.lanes_busy < lanes:
            j = -(-(t - R.t0) // R.step)
            if j < R.k:
                R.k = j
                R.wake = R.t0 + j * R.step
        elif R.kind == 3 and was_empty and len(R.running) < max_batch and R.lanes_busy < lanes:
            R.wake = t  # prefill lanes work off the batch: admit at once

    # ---- the fleet (only with a control) ----
    def drop(rid, now, retry_after):
        """A request its replica lost: resent ``retry_after`` ns later (starting over, its
        deadline unchanged) — once, or under the clients' retry policy after the client saw
        the failure ``retry_after`` ns later and waited its backoff — else it ends in an error
        (tokens received kept)."""
        at = None
        if retry_after is not None and dl[rid] > now:
            if rtr is None:
                if rid not in resent:
                    resent.add(rid)
                    at = now + retry_after
            else:
                b = rtr.decide(now, n_retry.get(rid, 0))
                if b is not None:
                    at = now + retry_after + b
        if at is not None:
            state[rid] = WAITING
            gen[rid] = 0
            adm[rid] = -1
            void_from[rid] = len(st_rid)
            xvoid_from[rid] = len(xt_rid)
            lane_tok[rid] = False
            heapq.heappush(rheap, (at, rid))
        else:
            state[rid] = DONE
            status[rid] = ERROR
            resolved(rid, now, True)

    def fail_replica(R, now, retry_after):
        """R stops at ``now``: iterations finished by then count; what it holds is dropped."""
        if not R.alive:
            return
        if R.kind == 1:
            j = min((now - R.t0) // R.step, R.k) if R.step else 0
            if j > 0:
                record(R, R.t0, R.step, j, R.tok)
                R.it += j
                R.done += j * R.tok
        for rid in list(R.running):
            if state[rid] == DECODE:
                cnt = R.it - pst[rid]
                stint(rid, R.idx, pst[rid], cnt)
                gen[rid] += cnt
            drop(rid, now, retry_after)
        for rid in list(R.waiting):
            if state[rid] == WAITING and rep_of[rid] == R.idx:
                drop(rid, now, retry_after)
        R.waiting.clear()
        R.nwait = 0
        R.running = {}
        R.ndec = 0
        R.prefilling = []
        R.pf_done = []
        R.H = [0] * bs
        R.used = 0
        R.fin_heap = []
        R.dl_heap = []
        R.pf_heap = []
        R.lanes_busy = 0
        R.kind = 0
        R.k = 0
        R.wake = INF
        R.assigned = R.done  # holds nothing: a least-work router sees it idle
        R.alive = False
        R.draining = False
        R.retry_after = retry_after

    def set_routing():
        nonlocal routing
        routing = [R for R in reps if R.routable]

    def removed(R, now):
        R.alive = False
        R.draining = False
        R.kind = 0
        R.wake = INF
        tl.append((now, "replica_removed", R.idx, {"group": groups[R.idx], "detail": "drained"}))

    class Fleet:
        """The control's handle on the fleet (capplan.synth.control.Fleet)."""

        def live(self):
            return [R.idx for R in reps if R.alive and not R.draining]

        def ready(self):
            return [R.idx for R in reps if R.alive and not R.draining and R.routable]

        def outstanding(self, idx):
            return reps[idx].assigned - reps[idx].done

        def group_of(self, idx):
            return groups[idx]

        def add(self, now, ready_at, group):
            R = _Rep(len(reps), bs)
            R.routable = False
            if pol is not None:
                R.waiting = pol.queue(R.idx)
            reps.append(R)
            groups.append(group)
            tl.append((now, "replica_added", R.idx, {"group": group,
                                                    "detail": f"ready at {ready_at / 1e9:.3f} s"}))
            return R.idx

        def make_ready(self, idx, now):
            R = reps[idx]
            if R.alive and not R.draining and not R.routable:
                R.routable = True
                set_routing()
                tl.append((now, "replica_ready", idx, {"group": groups[idx]}))

        def fail(self, idx, now, retry_after, detail="failed"):
            R = reps[idx]
            if not R.alive:
                return
            fail_replica(R, now, retry_after)
            tl.append((now, "replica_failed", idx, {"group": groups[idx], "detail": detail}))

        def unroute(self, idx, now):
            R = reps[idx]
            if R.routable:
                R.routable = False
                set_routing()
                tl.append((now, "replica_removed", idx, {"group": groups[idx],
                                                        "detail": "routes removed"}))

        def drain(self, idx, now, deadline):
            R = reps[idx]
            if not R.alive or R.draining:
                return
            R.draining = True
            if R.routable:
                R.routable = False
                set_routing()
            tl.append((now, "replica_draining", idx, {"group": groups[idx]}))
            if not R.running and not R.nwait:
                removed(R, now)
            elif deadline <= now:
                self.fail(idx, now, None, "drain deadline")
            else:
                ctl.later(deadline, "drain_deadline", idx)

        def drain_deadline(self, idx, now):
            if reps[idx].alive and reps[idx].draining:
                if rtr is None:
                    self.fail(idx, now, None, "drain deadline: what it still held is lost")
                else:
                    self.fail(idx, now, 0, "drain deadline: what it still held is retried")

        def log(self, t, event, replica=None, **cols):
            tl.append((t, event, replica, cols))

        def signals(self, now, window, ttft_limit_ms):
            """The autoscaler's view (capplan.synth.autoscale): work in prefill-equivalent
            tokens — a prompt token ``wp`` (1; 0 when prompts cost nothing), an answer token
            ``wd``. Q_work: waiting requests whole
            (a preempted one: its prompt and the tokens it had, re-prefilled, plus the answer
            left), running ones the prompt tokens not yet computed (a prompt on a prefill lane
            counts whole until the lane finishes) and the answer tokens not yet emitted."""
            from .autoscale import Signals

            while arr_t and arr_t[0][0] <= now - window:
                _, a_in, a_out = arr_t.popleft()
                arr_sum[0] -= a_in
                arr_sum[1] -= a_out
            while ft and ft[0][0] <= now - window:
                ft.popleft()
            q_work = 0.0
            used = cap = 0
            for R in reps:
                if not R.alive:
                    continue
                for rid in R.waiting:
                    if state[rid] == WAITING:
                        q_work += wp * (inp[rid] + gen[rid]) + wd * (out[rid] - gen[rid])
                # running: prompt not yet computed, and answer tokens not yet sent — a decoding
                # one has sent gen + (iterations done − pst)
                it_now = R.it + (min((now - R.t0) // R.step, R.k) if R.kind == 1 and R.step else 0)
                p_left = a_left = 0
                for rid in R.running:
                    st_ = state[rid]
                    if st_ == DECODE:
                        a_left += max(0, out[rid] - gen[rid] - it_now + pst[rid])
                    elif st_ == PREFILL:
                        p_left += rem[rid]
                        a_left += out[rid] - gen[rid]
                q_work += wp * p_left + wd * a_left
                if R.routable:
                    used += R.used
                    cap += kv_total
            w_s = min(window, now) / 1e9 if now > 0 else window / 1e9  # a young run: its age
            work = wp * arr_sum[0] + wd * arr_sum[1]
            ttfts = np.fromiter((x for _, x in ft), dtype=np.float64, count=len(ft))
            p99 = float(np.percentile(ttfts, 99)) / 1e6 if ttfts.size else float("nan")
            good = int(np.sum(ttfts <= ttft_limit_ms * 1e6))
            return Signals(rate_rps=len(arr_t) / w_s, work_rate=work / w_s, queue_work=q_work,
                           window_arrivals=len(arr_t), window_work=work, decode_token_weight=wd,
                           prompt_token_weight=wp,
                           ttft_p99_ms=p99, kv_use=used / cap if cap else float("nan"),
                           good_share=min(1.0, good / len(arr_t)) if arr_t else float("nan"))

    fleet = Fleet() if ctl is not None else None

    # ---- main loop ----
    ai = 0
    n_open = n0
    tick = 0
    while True:
        if closed is None:
            ta = sched[ai] if ai < n_open else INF
        else:
            ta = cheap[0][0] if cheap else INF
        if ta >= end_ns:
            ta = INF
        tw = INF
        Rw = None
        for R in reps:
            if R.wake < tw:
                tw = R.wake
                Rw = R
        if ctl is not None:
            tc = ctl.next_ns()
            tr = rheap[0][0] if rheap else INF
            if tc >= end_ns:
                tc = INF
            if tr >= end_ns:
                tr = INF
            if tc < INF and tc <= ta and tc <= tr and tc <= tw:
                ctl.fire(tc, fleet)
                continue
            if tr < INF and tr <= ta and tr <= tw:
                _, rid = heapq.heappop(rheap)
                if state[rid] == WAITING:
                    if dl[rid] <= tr:
                        state[rid] = DONE
                        status[rid] = end_status(rid)
                        resolved(rid, tr)
                    else:
                        arrive(rid, tr, False)
                continue
        if ta == INF and tw == INF:
            break
        if ta <= tw:
            if closed is None:
                arrive(ai, ta)
                ai += 1
            else:
                t, _, kind, x = heapq.heappop(cheap)
                if kind == 0:
                    arrive(new_request(t, x), t)
                else:
                    rid = x
                    if state[rid] != DONE and not reissued[rid]:
                        if state[rid] == WAITING and rep_of[rid] >= 0:
                            expire_waiting(reps[rep_of[rid]], rid, t)
                        else:
                            resolved(rid, t)
            if progress is not None:
                tick += 1
                if tick >= 20000:
                    progress(tick)
                    tick = 0
        else:
            wake(Rw)
    if progress is not None and tick:
        progress(tick)

    n = len(sched)
    for _, rid in rheap:  # resends due after the end
        if state[rid] == WAITING:
            state[rid] = DONE
            status[rid] = end_status(rid)
    if void_from:  # a resent request's first attempt streamed tokens its client dropped
        keep = [i for i, rid in enumerate(st_rid) if i >= void_from.get(rid, 0)]
        st_rid = [st_rid[i] for i in keep]
        st_rep = [st_rep[i] for i in keep]
        st_p = [st_p[i] for i in keep]
        st_cnt = [st_cnt[i] for i in keep]
    if xvoid_from:
        keep = [i for i, rid in enumerate(xt_rid) if i >= xvoid_from.get(rid, 0)]
        xt_rid = [xt_rid[i] for i in keep]
        xt_ns = [xt_ns[i] for i in keep]
    # anything still unresolved (only possible with arrivals at/after end) is cancelled
    st_arr = np.asarray(status, dtype=np.int8)
    st_arr[st_arr == UNRESOLVED] = CANCELLED
    seg = lambda attr: [np.asarray(getattr(R, attr), dtype=np.int64) for R in reps]  # noqa: E731
    stats = {
        "preemptions": int(sum(R.preemptions for R in reps)),
        "max_queue": int(max((R.max_wait for R in reps), default=0)),
        "iterations": int(sum(R.it for R in reps)),
        "requests": n,
        "kv_blocks_in_use_at_end": int(sum(R.used for R in reps)),  # 0 unless a bug leaks blocks
    }
    if pfx is not None:
        stats.update(pfx.close(end_ns))
        tl = tl + list(pfx.log)
    if pol is not None:
        stats.update({f"policy_{k}": v for k, v in pol.counts.items()})
    if ctl is not None:  # attempts / original requests (docs/timeline.md "Client retries")
        stats.update(first_attempts=n_att[0], retries_sent=n_att[1],
                     retry_amplification=(n_att[0] + n_att[1]) / n_att[0] if n_att[0] else 1.0)
        if rtr is not None:
            stats.update(retries_refused_budget=rtr.refused_budget, retries_exhausted=rtr.exhausted)
    return SimResult(
        sched_ns=np.asarray(sched, dtype=np.int64), input_tokens=np.asarray(inp, dtype=np.int64),
        target_output=np.asarray(out, dtype=np.int64), tenant=np.asarray(ten, dtype=np.int64),
        status=st_arr, admitted_ns=np.asarray(adm, dtype=np.int64),
        replica=np.asarray(rep_of, dtype=np.int64),
        stint_rid=np.asarray(st_rid, dtype=np.int64), stint_rep=np.asarray(st_rep, dtype=np.int64),
        stint_first_iter=np.asarray(st_p, dtype=np.int64), stint_count=np.asarray(st_cnt, dtype=np.int64),
        seg_i0=seg("seg_i0"), seg_t0=seg("seg_t0"), seg_step=seg("seg_step"), seg_k=seg("seg_k"), seg_tok=seg("seg_tok"),
        stats=stats, timeline=tl, groups=groups,
        xtok_rid=np.asarray(xt_rid, dtype=np.int64) if sep else None,
        xtok_ns=np.asarray(xt_ns, dtype=np.int64) if sep else None,
        computed_input=None if comp is None else np.asarray(comp, dtype=np.int64),
        retries=None if ctl is None else np.asarray(
            [n_retry.get(i, 0) for i in range(len(sched))], dtype=np.int64),
    )
