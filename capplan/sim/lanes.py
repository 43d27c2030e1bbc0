"""Separate prefill (``ReplicaParams.prefill == "separate"``): prompts are computed on prefill
lanes off the decode batch (the engine module's docstring). A lane is a server of its own: a
queued prompt starts on it when it frees, not at the next decode boundary; lane starts between
boundaries are booked at the boundary with their own times (batch slots and KV blocks change
only at boundaries). A mix-in of :class:`capplan.sim.run.Run`.
"""

from __future__ import annotations

import heapq

from .replica import DECODE, INF, PREFILL, WAITING


class Lanes:
    """Prefill lanes: start, plan around them, fill freed lanes, finish prompts."""

    __slots__ = ()

    def start_lane(self, R, h, t):
        """Separate prefill: admitted ``h`` computes its prompt on a lane from ``t`` on."""
        pfs = self.pfs
        lane_ns = self.kp_ns * self.rem[h] + self.over_ns
        if pfs is not None:
            lane_ns *= pfs[h]
        r = t + max(1000, int(round(lane_ns / 1000.0)) * 1000)
        self.ready_t[h] = r
        heapq.heappush(R.pf_heap, (r, h))
        R.lanes_busy += 1

    def plan_sep(self, R, now):
        """plan() for separate prefill: admit onto free prefill lanes, then run decode-only
        iterations, cut at the next lane completion so that a finished prompt joins the batch
        at the following boundary; with no decoding sequence, wait for a lane (kind 3)."""
        end_ns = self.end_ns; state = self.state
        R.t_plan = now
        need1 = self.make_room(R, now)
        running = R.running
        while R.nwait and len(running) < self.max_batch and R.lanes_busy < self.lanes:
            h = self.admit_head(R, now, need1)
            if h < 0:
                break
            self.start_lane(R, h, now)
        ph = R.pf_heap
        while ph and (state[ph[0][1]] != PREFILL or self.ready_t[ph[0][1]] != ph[0][0]):
            heapq.heappop(ph)
        if R.ndec:
            self.decode_span(R, now, ph[0][0] if ph else INF)
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
            self.go_idle(R)

    def lane_fill(self, R, t_free, now):
        """Separate prefill: lanes free since ``t_free`` take queued prompts at once, each at
        ``t_free`` or when it joined the queue, whichever is later, while the batch has a slot
        and the KV cache the prompt's blocks. Called at boundary ``now`` for the time since the
        last plan: a lane is a server of its own and never waits for a decode boundary (batch
        slots and KV blocks change only at boundaries, so the state now is the state then).
        With a scheduling policy the prompt is the queue's head now, not at that earlier time."""
        qt = self.qt
        w = R.waiting
        while R.nwait and len(R.running) < self.max_batch and R.lanes_busy < self.lanes:
            h = w[0]
            if self.state[h] != WAITING:
                w.popleft()
                continue
            s = qt[h] if qt[h] > t_free else t_free
            if self.dl[h] <= s:
                w.popleft()
                self.expire_waiting(R, h, s)
                continue
            if self.admit_head(R, s, 0) < 0:
                return  # the head waits for KV blocks freed at a boundary
            self.start_lane(R, h, s)

    def lanes_done(self, R, now):
        """Separate prefill, at boundary ``now``: the lanes since the last plan, in time order.
        Free lanes take the prompts queued since (``lane_fill``); a prompt whose lane finished
        by ``now`` sends its (first) token at the lane's finish time and joins the decode batch
        from iteration ``R.it`` on, and its lane takes the next prompt from that time on."""
        dl = self.dl; end_ns = self.end_ns; lane_fill = self.lane_fill; rem = self.rem
        lane_fill(R, R.t_plan, now)
        ph = R.pf_heap
        while ph and ph[0][0] <= now:
            r, rid = heapq.heappop(ph)
            if self.state[rid] != PREFILL or self.ready_t[rid] != r:
                continue
            cutoff = dl[rid] if dl[rid] < end_ns else end_ns
            if r > cutoff:
                continue  # its deadline (or the end) came first: cut with the deadlines below
            R.lanes_busy -= 1
            R.prefilling.remove(rid)
            R.done += rem[rid]
            rem[rid] = 0
            self.xt_rid.append(rid)
            self.xt_ns.append(r)
            self.lane_tok[rid] = True
            self.first_token(rid, r, True)
            self.prompt_done(R, rid, now, True)  # books as if a prefill iteration had just ended
            lane_fill(R, r, now)
