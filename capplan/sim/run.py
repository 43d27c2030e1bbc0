"""One simulation run's state and its event loop (:func:`capplan.sim.engine.simulate`).

:class:`Run` holds the per-request state as Python lists (fast scalar access), the replicas
(:class:`capplan.sim.replica.Replica`) and the hooks; its behaviour comes in pieces:

- arrivals and admission (here): a request arrives (open loop: its scheduled time; closed
  loop: a user's next request; a resend or retry from the retry heap), is routed to the
  replica with the least outstanding work (or by prefix affinity), may be deferred or
  rejected by the admission policy, and joins that replica's queue;
- the batching step, service and completion (:mod:`capplan.sim.batching`), with separate
  prefill lanes (:mod:`capplan.sim.lanes`);
- fleet events (:mod:`capplan.sim.fleetops`), fired by the control.

:meth:`Run.loop` takes the earliest of: the control's next event, a resend, the next arrival,
the earliest replica boundary (ties in that order), until none is left before the end.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from ..errors import SpecError
from .batching import Batching
from .fleetops import FleetHandle, FleetOps
from .lanes import Lanes
from .replica import (CANCELLED, DONE, ERROR, INF, REJECTED, TIMEOUT, UNRESOLVED, WAITING,
                      Replica)


class Run(Batching, Lanes, FleetOps):
    """The state of one run (see :func:`capplan.sim.engine.simulate` for the arguments)."""

    __slots__ = ("adm", "admit_cap", "arr_sum", "arr_t", "back_ns", "bs", "budget_tok", "cheap",
                 "closed", "comp", "ctl", "dl", "draw", "dur_ns", "ekey", "end_ns", "fin", "fleet",
                 "flt", "ft", "gen", "groups", "inp", "kp_ns", "kv_total", "lane_tok", "lanes",
                 "max_batch", "max_len", "n_att", "n_retry", "out", "over_ns", "pfs", "pfx", "plen",
                 "pol", "pool", "pool_pos", "progress", "pst", "qlim", "qt", "ready_t", "reissued",
                 "rem", "rep_of", "reps", "resent", "rheap", "routing", "rtr", "sched", "sep",
                 "seqno", "sm", "st_cnt", "st_p", "st_rep", "st_rid", "state", "status", "table",
                 "ten", "think_ns", "timeout_ns", "tl", "user_of", "void_from", "wd", "wp", "xt_ns",
                 "xt_rid", "xvoid_from")

    def __init__(self, *, n_replicas, params, timeout_s, end_s, sched_ns, input_tokens, output_tokens,
                 tenant, closed, draw, progress, fault, prefill_scale, control, prefix, policy, deadline_ns):
        self._limits(params, timeout_s, end_s)
        self.reps = [Replica(i, self.bs) for i in range(n_replicas)]
        self.routing = list(self.reps)  # the replicas the router considers: a copy, so an added replica is not routed to before it is ready
        if fault is not None and closed is not None:
            raise SpecError("fault codes work only for open-loop simulations", field="fault")
        self.closed, self.draw, self.progress = closed, draw, progress
        self._requests(sched_ns, input_tokens, output_tokens, tenant)
        self.pfx, self.pol = prefix, policy
        if closed is not None and (prefix is not None or policy is not None or deadline_ns is not None):
            raise SpecError("prefix caching, admission and scheduling policies work only for open-loop runs",
                            field="sweep.load_model")
        if deadline_ns is not None:
            self.dl = np.asarray(deadline_ns, dtype=np.int64).tolist()
        n0 = len(self.sched)
        self.comp = [-1] * n0 if prefix is not None else None
        if policy is not None:
            for R in self.reps:
                R.waiting = policy.queue(R.idx)
        self.flt = fault.tolist() if fault is not None else None
        if prefill_scale is not None and (closed is not None or not self.sep):
            raise SpecError("prefill_scale works only for open-loop runs with separate prefill", field="prefill_scale")
        self.pfs = prefill_scale.tolist() if prefill_scale is not None else None
        self.st_rid, self.st_rep, self.st_p, self.st_cnt = [], [], [], []  # token stints
        self.xt_rid: list = []  # separate prefill: tokens sent off the iteration grid
        self.xt_ns: list = []
        self._fleet(control, n_replicas)
        self._closed_loop(closed, draw)

    def _limits(self, params, timeout_s, end_s):
        """The replica's limits and service times as plain numbers."""
        self.bs = params.block_size
        self.kv_total = kv_total = params.kv_blocks
        self.admit_cap = kv_total - int(params.kv_watermark * kv_total)
        self.max_batch = params.max_batch
        self.budget_tok = params.token_budget
        self.qlim = params.queue_limit if params.queue_limit is not None else INF
        self.max_len = params.max_model_len
        self.sm = sm = params.service
        self.table = sm.step_table_ns(params.max_batch + 1)
        self.kp_ns = sm.prefill_ms_per_token * 1e6
        self.over_ns = sm.prefill_overhead_ms * 1e6
        self.timeout_ns = int(round(timeout_s * 1e9))
        self.end_ns = int(round(end_s * 1e9))
        self.sep = params.prefill == "separate"
        self.lanes = params.prefill_lanes if params.prefill_lanes is not None else INF

    def _requests(self, sched_ns, input_tokens, output_tokens, tenant):
        """Per-request lists (open loop: every request known at the start; closed: none yet)."""
        if self.closed is None:
            if len(sched_ns) and (np.any(np.diff(sched_ns) < 0) or sched_ns[0] < 0):
                raise SpecError("arrival times must be sorted and ≥ 0 ns", field="sched_ns")
            if len(sched_ns) and (input_tokens.min() < 1 or output_tokens.min() < 1):
                raise SpecError("every request needs ≥ 1 input and ≥ 1 output token", field="lengths")
            self.sched = sched_ns.tolist()
            self.inp = input_tokens.tolist()
            self.out = output_tokens.tolist()
            self.ten = (tenant if tenant is not None else np.zeros(len(self.sched), np.int64)).tolist()
        else:
            self.sched, self.inp, self.out, self.ten = [], [], [], []
        n0 = len(self.sched)
        self.dl = [s + self.timeout_ns for s in self.sched]  # client deadlines
        self.state = [WAITING] * n0
        self.status = [UNRESOLVED] * n0
        self.gen = [0] * n0  # tokens emitted before the current stint
        self.pst = [0] * n0  # iteration of the current stint's first token
        self.plen = [0] * n0  # prompt length of the current (re)admission
        self.rem = [0] * n0  # prefill tokens still to compute
        self.fin = [0] * n0  # iteration of its last token (decoding)
        self.ekey = [0] * n0  # its class in Replica.H (when its next KV block is due)
        self.adm = [-1] * n0  # first admission time
        self.rep_of = [-1] * n0
        self.ready_t = [0] * n0  # separate prefill: when the prompt on its lane is done
        self.lane_tok = [False] * n0  # separate prefill: the current stint's first token came off-grid
        self.qt = [0] * n0  # when the request joined its replica's queue (separate prefill's lanes start then)

    def _fleet(self, control, n_replicas):
        """Fleet control (None: a fixed fleet, and none of this is touched)."""
        self.ctl = ctl = control
        self.rheap: list = []  # resent requests: (time, rid)
        self.resent: set = set()  # requests already resent once (no retry policy)
        self.rtr = None  # the clients' retry policy at work (capplan.sim.retry), if the control has one
        if ctl is not None and getattr(ctl.spec, "retry", None) is not None:
            from .retry import Retrier

            self.rtr = Retrier(ctl.spec.retry)
        self.n_att = [0, 0]  # first attempts, retries sent
        self.n_retry: dict = {}  # rid → retries sent
        self.void_from: dict = {}  # rid → first stint of its last attempt (earlier ones are dropped)
        self.xvoid_from: dict = {}  # the same for tokens sent off the grid (separate prefill)
        self.arr_t: deque = deque()  # (arrival time, prompt, answer tokens) in the control's signal window
        self.arr_sum = [0, 0]  # Σ prompt, Σ answer tokens of those arrivals
        self.ft: deque | None = None  # (first-token time, TTFT) in that window
        self.tl: list = []  # timeline rows
        self.groups: list = []
        self.wp, self.wd = 1.0, 1.0  # the autoscaler's prompt- and answer-token weights (its work unit)
        if ctl is not None and ctl.spec.autoscaler is not None:
            from .autoscale import work_weights

            self.wp, self.wd = work_weights(self.sm, self.max_batch, ctl.spec.autoscaler.decode_token_weight)
        if ctl is not None:
            self.ft = deque()
            self.groups = list(ctl.spec.placement.initial(n_replicas))
            for R in self.reps:
                self.tl.append((0, "replica_ready", R.idx, {"group": self.groups[R.idx],
                                                           "detail": "in service at the start"}))
        self.fleet = FleetHandle(self) if ctl is not None else None

    def _closed_loop(self, closed, draw):
        """Closed-loop users: a heap of (time, seq, 0 next request of user | 1 deadline, x)."""
        self.cheap: list = []
        self.user_of: list = []
        self.reissued: list = []
        self.pool: list = [[], [], []]  # drawn lengths and tenants, used in order
        self.pool_pos = [0]
        self.seqno = [0]
        if closed is None:
            return
        if draw is None:
            raise SpecError("closed-loop simulation needs a length sampler", field="workload.lengths")
        self.dur_ns = int(round(closed.duration_s * 1e9))
        self.think_ns = think_ns = int(round(closed.think_s * 1e9))
        self.back_ns = max(think_ns, int(round(closed.backoff_s * 1e9)), 1_000_000)
        for u in range(closed.concurrency):
            t = int(round(closed.ramp_s * 1e9 * u / closed.concurrency))
            heapq.heappush(self.cheap, (t, self.seqno[0], 0, u))
            self.seqno[0] += 1

    # ---- the request book ----------------------------------------------------------------------
    def new_request(self, t, u):
        """Closed loop: user ``u`` sends a request at ``t`` (lengths from the drawn pool)."""
        pool = self.pool
        pool_pos = self.pool_pos
        seqno = self.seqno
        if pool_pos[0] >= len(pool[0]):
            a, b, c = self.draw(4096)
            pool[0], pool[1], pool[2] = a.tolist(), b.tolist(), c.tolist()
            pool_pos[0] = 0
        j = pool_pos[0]
        pool_pos[0] = j + 1
        self.sched.append(t)
        self.inp.append(pool[0][j])
        self.out.append(pool[1][j])
        self.ten.append(pool[2][j])
        self.dl.append(t + self.timeout_ns)
        for lst, v in ((self.state, WAITING), (self.status, UNRESOLVED), (self.gen, 0), (self.pst, 0),
                       (self.plen, 0), (self.rem, 0), (self.fin, 0), (self.ekey, 0), (self.adm, -1),
                       (self.rep_of, -1), (self.ready_t, 0), (self.lane_tok, False), (self.qt, 0),
                       (self.user_of, u), (self.reissued, False)):
            lst.append(v)
        rid = len(self.sched) - 1
        heapq.heappush(self.cheap, (t + self.timeout_ns, seqno[0], 1, rid))
        seqno[0] += 1
        return rid

    def resolved(self, rid, t, failed_fast=False):
        """Closed loop: rid's user sends its next request after thinking (backing off when
        it failed at once)."""
        if self.closed is None:
            return
        reissued = self.reissued
        if reissued[rid]:
            return
        reissued[rid] = True
        tn = t + (self.back_ns if failed_fast else self.think_ns)
        if tn < self.dur_ns:
            seqno = self.seqno
            heapq.heappush(self.cheap, (tn, seqno[0], 0, self.user_of[rid]))
            seqno[0] += 1

    def stint(self, rid, r, p, cnt):
        """rid received ``cnt`` tokens on replica ``r``, one per iteration from iteration ``p``."""
        pol = self.pol
        if pol is not None:
            pol.tokens(rid, cnt)
        lane_tok = self.lane_tok
        if lane_tok[rid]:  # its first token was sent when the prefill lane finished
            lane_tok[rid] = False
            p += 1
            cnt -= 1
        if cnt > 0:
            self.st_rid.append(rid)
            self.st_rep.append(r)
            self.st_p.append(p)
            self.st_cnt.append(cnt)

    def end_status(self, rid):
        return TIMEOUT if self.dl[rid] <= self.end_ns else CANCELLED

    # ---- arrivals and admission ----------------------------------------------------------------
    def arrive(self, rid, t, first=True):
        """rid arrives at ``t`` (``first``: not a resend): counted for the control's signals,
        failed at once when a fault or too long, else routed, admitted and queued."""
        if self.ctl is not None:
            self.count_attempt(rid, t, first)
        flt = self.flt
        if flt is not None and flt[rid]:  # a fault: the server fails it whatever the load
            self.state[rid] = DONE
            self.status[rid] = ERROR if flt[rid] == 1 else self.end_status(rid)
            return
        if self.inp[rid] + self.out[rid] > self.max_len:
            self.state[rid] = DONE
            self.status[rid] = ERROR
            self.resolved(rid, t, True)
            return
        best = self.route(rid, t)
        pol = self.pol
        if best is not None and pol is not None and pol.decide(
                rid, t, best.idx, best.waiting, best.ndec, self.inp[rid], self.ten[rid]) == 2:
            best = None  # refused by admission control
        if best is None:
            self.refuse(rid, t)
        else:
            self.enqueue(best, rid, t)

    def count_attempt(self, rid, t, first):
        """With a control: the attempt joins the signal window and the retry counts."""
        inp, out = self.inp[rid], self.out[rid]
        self.arr_t.append((t, inp, out))
        self.arr_sum[0] += inp
        self.arr_sum[1] += out
        if first:
            self.n_att[0] += 1
            if self.rtr is not None:
                self.rtr.first(t)
        else:
            self.n_att[1] += 1
            self.n_retry[rid] = self.n_retry.get(rid, 0) + 1

    def route(self, rid, t):
        """The replica with the least outstanding work (ties: the lowest index) among those
        with room in their queue, or the prefix cache's choice; None when all are full."""
        best = None
        bw = INF
        pfx = self.pfx
        cands = [] if pfx is not None and pfx.affinity else None
        qlim = self.qlim
        for R in self.routing:
            if R.stopped:
                continue
            if R.waiting:
                self.purge(R, t)
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
            best = pfx.route(rid, t, cands, best, bw, self.inp[rid])
        return best

    def refuse(self, rid, t):
        """No replica takes rid: its client retries under the retry policy, else rejected."""
        rtr = self.rtr
        if rtr is not None and self.dl[rid] > t:  # its client retries a rejection under the policy
            b = rtr.decide(t, self.n_retry.get(rid, 0))
            if b is not None:
                heapq.heappush(self.rheap, (t + b, rid))
                return
        self.state[rid] = DONE
        self.status[rid] = REJECTED
        self.resolved(rid, t, True)

    def enqueue(self, R, rid, t):
        """rid joins R's queue; an idle R wakes now, a decode span is cut short at the next
        boundary when the request could be admitted there."""
        self.rep_of[rid] = R.idx
        if not R.alive:  # failed, routes not yet removed: the request fails at once
            ra = R.retry_after
            self.drop(rid, t, ra if self.rtr is None or ra is None else 0)  # a policy's client sees it now
            return
        was_empty = R.nwait == 0
        R.waiting.append(rid)
        self.qt[rid] = t
        R.nwait += 1
        if R.nwait > R.max_wait:
            R.max_wait = R.nwait
        n_in = self.inp[rid]
        R.assigned += n_in + self.out[rid] - 1
        kind = R.kind
        if kind == 0:
            R.wake = t
        elif kind == 1 and was_empty and len(R.running) < self.max_batch \
                and R.used + -(-n_in // self.bs) <= self.admit_cap and R.lanes_busy < self.lanes:
            j = -(-(t - R.t0) // R.step)
            if j < R.k:
                R.k = j
                R.wake = R.t0 + j * R.step
        elif kind == 3 and was_empty and len(R.running) < self.max_batch and R.lanes_busy < self.lanes:
            R.wake = t  # prefill lanes work off the batch: admit at once

    def resend(self, rid, t):
        """A resent or retried request comes back at ``t`` (unless its deadline passed)."""
        if self.state[rid] == WAITING:
            if self.dl[rid] <= t:
                self.state[rid] = DONE
                self.status[rid] = self.end_status(rid)
                self.resolved(rid, t)
            else:
                self.arrive(rid, t, False)

    def user_event(self):
        """Closed loop: the next user event — a new request, or a client deadline."""
        t, _, kind, x = heapq.heappop(self.cheap)
        if kind == 0:
            self.arrive(self.new_request(t, x), t)
            return
        rid = x
        if self.state[rid] != DONE and not self.reissued[rid]:
            if self.state[rid] == WAITING and self.rep_of[rid] >= 0:
                self.expire_waiting(self.reps[self.rep_of[rid]], rid, t)
            else:
                self.resolved(rid, t)

    # ---- the event loop -------------------------------------------------------------------------
    def loop(self):
        """Run the events in time order until none is left before the end."""
        end_ns = self.end_ns
        closed = self.closed
        ctl = self.ctl
        reps = self.reps
        sched = self.sched
        cheap = self.cheap
        rheap = self.rheap
        progress = self.progress
        arrive = self.arrive
        wake = self.wake
        ai = 0
        n_open = len(sched)
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
                    ctl.fire(tc, self.fleet)
                    continue
                if tr < INF and tr <= ta and tr <= tw:
                    _, rid = heapq.heappop(rheap)
                    self.resend(rid, tr)
                    continue
            if ta == INF and tw == INF:
                break
            if ta <= tw:
                if closed is None:
                    arrive(ai, ta)
                    ai += 1
                else:
                    self.user_event()
                if progress is not None:
                    tick += 1
                    if tick >= 20000:
                        progress(tick)
                        tick = 0
            else:
                wake(Rw)
        if progress is not None and tick:
            progress(tick)

    # ---- the result ----------------------------------------------------------------------------
    def result(self, result_cls):
        """The run as a ``result_cls`` (:class:`capplan.sim.engine.SimResult`)."""
        reps = self.reps
        sched = self.sched
        status = self.status
        n = len(sched)
        for _, rid in self.rheap:  # resends due after the end
            if self.state[rid] == WAITING:
                self.state[rid] = DONE
                status[rid] = self.end_status(rid)
        st_rid, st_rep, st_p, st_cnt = self.st_rid, self.st_rep, self.st_p, self.st_cnt
        xt_rid, xt_ns = self.xt_rid, self.xt_ns
        void_from, xvoid_from = self.void_from, self.xvoid_from
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
        a64 = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
        stats = self.stats(n)  # (closes the prefix cache, whose log then holds its last rows)
        tl = self.tl
        if self.pfx is not None:
            tl = tl + list(self.pfx.log)
        return result_cls(
            sched_ns=a64(sched), input_tokens=a64(self.inp), target_output=a64(self.out), tenant=a64(self.ten),
            status=st_arr, admitted_ns=a64(self.adm), replica=a64(self.rep_of),
            stint_rid=a64(st_rid), stint_rep=a64(st_rep), stint_first_iter=a64(st_p), stint_count=a64(st_cnt),
            seg_i0=seg("seg_i0"), seg_t0=seg("seg_t0"), seg_step=seg("seg_step"), seg_k=seg("seg_k"),
            seg_tok=seg("seg_tok"), stats=stats, timeline=tl, groups=self.groups,
            xtok_rid=a64(xt_rid) if self.sep else None, xtok_ns=a64(xt_ns) if self.sep else None,
            computed_input=None if self.comp is None else a64(self.comp),
            retries=None if self.ctl is None else a64([self.n_retry.get(i, 0) for i in range(n)]),
        )

    def stats(self, n):
        """The run's counters (SimResult.stats)."""
        reps = self.reps
        stats = {
            "preemptions": int(sum(R.preemptions for R in reps)),
            "max_queue": int(max((R.max_wait for R in reps), default=0)),
            "iterations": int(sum(R.it for R in reps)),
            "requests": n,
            "kv_blocks_in_use_at_end": int(sum(R.used for R in reps)),  # 0 unless a bug leaks blocks
        }
        if self.pfx is not None:
            stats.update(self.pfx.close(self.end_ns))
        if self.pol is not None:
            stats.update({f"policy_{k}": v for k, v in self.pol.counts.items()})
        if self.ctl is not None:  # attempts / original requests (docs/timeline.md "Client retries")
            n_att = self.n_att
            stats.update(first_attempts=n_att[0], retries_sent=n_att[1],
                         retry_amplification=(n_att[0] + n_att[1]) / n_att[0] if n_att[0] else 1.0)
            if self.rtr is not None:
                stats.update(retries_refused_budget=self.rtr.refused_budget, retries_exhausted=self.rtr.exhausted)
        return stats
