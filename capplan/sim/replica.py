"""One replica's scheduler state in the simulator, the request and status codes, and the KV
block arithmetic of a decode span (how many blocks k iterations need; the largest k that fits).

A :class:`Replica` is plain mutable state; what happens to it lives in the engine's hooks
(:mod:`capplan.sim.batching`, :mod:`capplan.sim.lanes`, :mod:`capplan.sim.fleetops`).
"""

from __future__ import annotations

from collections import deque

INF = 1 << 62

# request states
WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3
# status codes (index into STATUS_NAMES)
OK, REJECTED, TIMEOUT, ERROR, CANCELLED, UNRESOLVED = 0, 1, 2, 3, 4, 5
STATUS_NAMES = ("ok", "rejected", "timeout", "error", "cancelled", "unresolved")


class Replica:
    """A replica: its queue, running batch, KV blocks in use, the iteration span it is in
    (``kind`` 0 idle, 1 decode span, 2 mixed prefill iteration, 3 waiting for a prefill lane)
    and the piecewise-constant iteration segments it has run."""

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


def blocks_needed(H, it, k, bs, n):
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


def max_span(H, it, free, bs, n):
    """Largest k with blocks_needed(k) ≤ free."""
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
