"""Fleet events in the simulator (only with a ``control``): a replica fails, drains, is removed
or added; the requests a failed replica held are lost or resent (the engine module's
docstring). :class:`FleetOps` is a mix-in of :class:`capplan.sim.run.Run`;
:class:`FleetHandle` is what the control (:mod:`capplan.sim.control`) sees of the run,
including the autoscaler's signals.
"""

from __future__ import annotations

import heapq

import numpy as np

from .replica import DECODE, DONE, ERROR, INF, PREFILL, WAITING, Replica


class FleetOps:
    """Lost requests, failed and removed replicas, the router's view."""

    __slots__ = ()

    def drop(self, rid, now, retry_after):
        """A request its replica lost: resent ``retry_after`` ns later (starting over, its
        deadline unchanged) — once, or under the clients' retry policy after the client saw
        the failure ``retry_after`` ns later and waited its backoff — else it ends in an error
        (tokens received kept)."""
        resent = self.resent; rtr = self.rtr; state = self.state
        at = None
        if retry_after is not None and self.dl[rid] > now:
            if rtr is None:
                if rid not in resent:
                    resent.add(rid)
                    at = now + retry_after
            else:
                b = rtr.decide(now, self.n_retry.get(rid, 0))
                if b is not None:
                    at = now + retry_after + b
        if at is not None:
            state[rid] = WAITING
            self.gen[rid] = 0
            self.adm[rid] = -1
            self.void_from[rid] = len(self.st_rid)
            self.xvoid_from[rid] = len(self.xt_rid)
            self.lane_tok[rid] = False
            heapq.heappush(self.rheap, (at, rid))
        else:
            state[rid] = DONE
            self.status[rid] = ERROR
            self.resolved(rid, now, True)

    def fail_replica(self, R, now, retry_after):
        """R stops at ``now``: iterations finished by then count; what it holds is dropped."""
        drop = self.drop; pst = self.pst; state = self.state
        if not R.alive:
            return
        if R.kind == 1:
            j = min((now - R.t0) // R.step, R.k) if R.step else 0
            if j > 0:
                self.record(R, R.t0, R.step, j, R.tok)
                R.it += j
                R.done += j * R.tok
        for rid in list(R.running):
            if state[rid] == DECODE:
                cnt = R.it - pst[rid]
                self.stint(rid, R.idx, pst[rid], cnt)
                self.gen[rid] += cnt
            drop(rid, now, retry_after)
        for rid in list(R.waiting):
            if state[rid] == WAITING and self.rep_of[rid] == R.idx:
                drop(rid, now, retry_after)
        R.waiting.clear()
        R.nwait = 0
        R.running = {}
        R.ndec = 0
        R.prefilling = []
        R.pf_done = []
        R.H = [0] * self.bs
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

    def set_routing(self):
        """The router considers the routable replicas only."""
        self.routing = [R for R in self.reps if R.routable]

    def removed(self, R, now):
        """A drained replica that holds nothing leaves the fleet."""
        R.alive = False
        R.draining = False
        R.kind = 0
        R.wake = INF
        self.tl.append((now, "replica_removed", R.idx, {"group": self.groups[R.idx], "detail": "drained"}))


class FleetHandle:
    """The control's handle on the fleet (capplan.sim.control.Fleet), over one run."""

    __slots__ = ("run",)

    def __init__(self, run):
        self.run = run

    def live(self):
        return [R.idx for R in self.run.reps if R.alive and not R.draining]

    def ready(self):
        return [R.idx for R in self.run.reps if R.alive and not R.draining and R.routable]

    def outstanding(self, idx):
        R = self.run.reps[idx]
        return R.assigned - R.done

    def group_of(self, idx):
        return self.run.groups[idx]

    def add(self, now, ready_at, group):
        run = self.run
        R = Replica(len(run.reps), run.bs)
        R.routable = False
        if run.pol is not None:
            R.waiting = run.pol.queue(R.idx)
        run.reps.append(R)
        run.groups.append(group)
        run.tl.append((now, "replica_added", R.idx, {"group": group,
                                                    "detail": f"ready at {ready_at / 1e9:.3f} s"}))
        return R.idx

    def make_ready(self, idx, now):
        run = self.run
        R = run.reps[idx]
        if R.alive and not R.draining and not R.routable:
            R.routable = True
            run.set_routing()
            run.tl.append((now, "replica_ready", idx, {"group": run.groups[idx]}))

    def fail(self, idx, now, retry_after, detail="failed"):
        run = self.run
        R = run.reps[idx]
        if not R.alive:
            return
        run.fail_replica(R, now, retry_after)
        run.tl.append((now, "replica_failed", idx, {"group": run.groups[idx], "detail": detail}))

    def unroute(self, idx, now):
        run = self.run
        R = run.reps[idx]
        if R.routable:
            R.routable = False
            run.set_routing()
            run.tl.append((now, "replica_removed", idx, {"group": run.groups[idx],
                                                        "detail": "routes removed"}))

    def drain(self, idx, now, deadline):
        run = self.run
        R = run.reps[idx]
        if not R.alive or R.draining:
            return
        R.draining = True
        if R.routable:
            R.routable = False
            run.set_routing()
        run.tl.append((now, "replica_draining", idx, {"group": run.groups[idx]}))
        if not R.running and not R.nwait:
            run.removed(R, now)
        elif deadline <= now:
            self.fail(idx, now, None, "drain deadline")
        else:
            run.ctl.later(deadline, "drain_deadline", idx)

    def drain_deadline(self, idx, now):
        R = self.run.reps[idx]
        if R.alive and R.draining:
            if self.run.rtr is None:
                self.fail(idx, now, None, "drain deadline: what it still held is lost")
            else:
                self.fail(idx, now, 0, "drain deadline: what it still held is retried")

    def log(self, t, event, replica=None, **cols):
        self.run.tl.append((t, event, replica, cols))

    def signals(self, now, window, ttft_limit_ms):
        """The autoscaler's view (capplan.sim.autoscale): work in prefill-equivalent
        tokens — a prompt token ``wp`` (1; 0 when prompts cost nothing), an answer token
        ``wd``. Q_work: waiting requests whole
        (a preempted one: its prompt and the tokens it had, re-prefilled, plus the answer
        left), running ones the prompt tokens not yet computed (a prompt on a prefill lane
        counts whole until the lane finishes) and the answer tokens not yet emitted."""
        from .autoscale import Signals

        run = self.run
        arr_t, arr_sum, ft = run.arr_t, run.arr_sum, run.ft
        state, inp, out, gen, pst, rem = run.state, run.inp, run.out, run.gen, run.pst, run.rem
        wp, wd = run.wp, run.wd
        while arr_t and arr_t[0][0] <= now - window:
            _, a_in, a_out = arr_t.popleft()
            arr_sum[0] -= a_in
            arr_sum[1] -= a_out
        while ft and ft[0][0] <= now - window:
            ft.popleft()
        q_work = 0.0
        used = cap = 0
        for R in run.reps:
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
                cap += run.kv_total
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
