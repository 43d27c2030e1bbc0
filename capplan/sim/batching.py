"""The batching step of the simulator: what a replica does at an iteration boundary.

At each boundary (:meth:`Batching.wake`) the replica books the iterations it has just run
(service), resolves what they finished and what missed its deadline (completion), then plans
the next span (:meth:`Batching.plan`): drop expired queued requests, preempt while the next
decode step's KV blocks do not fit, give the token budget to prompt chunks of sequences in
prefill and of newly admitted ones (:meth:`Batching.admit_head`), and either run one mixed
iteration or commit k equal decode-only iterations at once (:meth:`Batching.decode_span`).
Separate prefill plans on lanes instead (:mod:`capplan.sim.lanes`).

A mix-in of :class:`capplan.sim.run.Run`: it reads and changes the run's per-request lists
and its replicas. Hot attributes are copied to locals once per call (speed: the engine handles
millions of events per run).
"""

from __future__ import annotations

import heapq

from .replica import CANCELLED, DECODE, DONE, INF, OK, PREFILL, TIMEOUT, WAITING, max_span, blocks_needed


class Batching:
    """Admission into the batch, the iteration plan, and service and completion at a boundary."""

    __slots__ = ()

    def free_decode(self, R, rid):
        """Remove a decoding sequence from the batch; returns its KV length."""
        L = self.plen[rid] + (R.it - self.pst[rid] - 1)
        R.used -= -(-L // self.bs)
        R.H[self.ekey[rid]] -= 1
        R.ndec -= 1
        del R.running[rid]
        return L

    def cut(self, R, rid, now):
        """Resolve a running sequence at boundary ``now`` that missed its deadline or the end."""
        dl = self.dl; end_ns = self.end_ns; pst = self.pst; state = self.state
        cutoff = dl[rid] if dl[rid] < end_ns else end_ns
        st = state[rid]
        if st == DECODE:
            cnt = R.it - pst[rid]
            left = self.fin[rid] - (R.it - 1)
            if now > cutoff:
                cnt -= 1
            self.free_decode(R, rid)
            self.stint(rid, R.idx, pst[rid], cnt)
            R.assigned -= left
        else:  # PREFILL
            R.used -= -(-self.plen[rid] // self.bs)
            R.prefilling.remove(rid)
            del R.running[rid]
            R.assigned -= self.rem[rid] + (self.out[rid] - self.gen[rid] - 1)
            if self.sep:
                R.lanes_busy -= 1
        state[rid] = DONE
        self.status[rid] = self.end_status(rid)  # called at the deadline or at the end of the run
        self.resolved(rid, now)

    def expire_waiting(self, R, rid, now):
        """A queued request's client gave up (or the run ended)."""
        self.state[rid] = DONE
        self.status[rid] = self.end_status(rid)
        R.nwait -= 1
        R.assigned -= self.inp[rid] + self.out[rid] - 1  # a queued request's remaining work, preempted or not
        self.resolved(rid, now)

    def purge(self, R, now):
        """Drop the head of R's queue while it is resolved or past its deadline."""
        w = R.waiting
        while w:
            h = w[0]
            if self.state[h] != WAITING:
                w.popleft()
            elif self.dl[h] <= now:
                w.popleft()
                self.expire_waiting(R, h, now)
            else:
                break

    def preempt_one(self, R):
        """Preempt the most recently admitted sequence by recompute: back to the queue's front."""
        gen = self.gen; plen = self.plen; pst = self.pst; state = self.state
        rid = next(reversed(R.running))
        if state[rid] == DECODE:
            cnt = R.it - pst[rid]
            self.free_decode(R, rid)
            self.stint(rid, R.idx, pst[rid], cnt)
            gen[rid] += cnt
            R.assigned += self.inp[rid] + gen[rid] - 1
        else:
            R.used -= -(-plen[rid] // self.bs)
            R.prefilling.remove(rid)
            del R.running[rid]
            R.assigned += plen[rid] - self.rem[rid]
            if self.sep:
                R.lanes_busy -= 1
        state[rid] = WAITING
        R.waiting.appendleft(rid)
        R.nwait += 1
        R.preemptions += 1

    def make_room(self, R, now):
        """Drop expired queued requests and preempt until the next decode step's KV blocks fit;
        returns the blocks that step needs."""
        bs = self.bs
        if R.waiting:
            self.purge(R, now)
        it = R.it
        H = R.H
        need1 = H[(-it) % bs] if R.ndec else 0
        while R.ndec and R.used + need1 > self.kv_total:
            self.preempt_one(R)
            need1 = H[(-it) % bs] if R.ndec else 0
        return need1

    def go_idle(self, R):
        """Nothing to run: R sleeps until an arrival wakes it."""
        if R.nwait:
            raise RuntimeError("synth: a queued request cannot be admitted into an empty replica "
                               "(max_model_len larger than the KV cache?)")
        R.kind = 0
        R.k = 0
        R.wake = INF

    def admit_head(self, R, now, need1):
        """Admit the head of the queue (FIFO) when the KV cache can hold its prompt; returns
        its index, or −1 when the queue is empty or the head must wait."""
        adm = self.adm; dl = self.dl; pfx = self.pfx; pol = self.pol; rem = self.rem; state = self.state
        w = R.waiting
        while R.nwait:
            h = w[0]
            if state[h] != WAITING:
                w.popleft()
                continue
            if dl[h] <= now:
                w.popleft()
                self.expire_waiting(R, h, now)
                continue
            L = self.inp[h] + self.gen[h]
            need = -(-L // self.bs)
            if R.used + need + need1 > self.admit_cap:
                return -1
            w.popleft()
            R.nwait -= 1
            state[h] = PREFILL
            self.plen[h] = L
            rem[h] = L
            if pfx is not None:  # cached prompt tokens are not prefilled
                hit = pfx.lookup(R.idx, h, now, L, adm[h] < 0)
                rem[h] = L - hit
                R.assigned -= hit
                if adm[h] < 0:
                    self.comp[h] = L - hit
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

    def decode_span(self, R, now, until):
        """Commit k decode-only iterations: up to the next finish, client deadline, end of
        run, KV block shortage or ``until`` (a prefill lane finishing), whichever comes first."""
        bs = self.bs; state = self.state
        it = R.it
        n_dec = R.ndec
        step = self.table[n_dec]
        fh = R.fin_heap
        while True:
            f, rid = fh[0]
            if state[rid] == DECODE and self.fin[rid] == f:
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
        ke = -(-(self.end_ns - now) // step)
        if ke < k:
            k = ke
        free = self.kv_total - R.used
        if bs * (free // n_dec) < k:
            kk = max_span(R.H, it, free, bs, n_dec)
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

    def plan(self, R, now):
        max_batch = self.max_batch; rem = self.rem
        need1 = self.make_room(R, now)
        n_dec = R.ndec
        budget = self.budget_tok - n_dec
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
            h = self.admit_head(R, now, need1)
            if h < 0:
                break
            L = rem[h]
            c = L if L < budget - P else budget - P
            chunks.append((h, c))
            P += c
            nseq += 1
        if P > 0:
            step = self.table[nseq if nseq <= max_batch + 1 else max_batch + 1] + int(round((self.kp_ns * P + self.over_ns) / 1000.0)) * 1000
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
            self.decode_span(R, now, INF)
        else:
            self.go_idle(R)

    def record(self, R, t0, step, k, tok):
        """Book k iterations of length ``step`` from ``t0`` (``tok`` tokens each) as a segment,
        extending the last one when it continues it exactly."""
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

    def first_token(self, rid, t, on_time):
        """A request's prompt is done at ``t``: with a control, its first token (not a
        re-prefill after preemption) joins the signal window."""
        ft = self.ft
        if ft is not None and on_time and self.gen[rid] == 0:
            ft.append((t, t - self.sched[rid]))

    def prompt_done(self, R, rid, now, on_time):
        """rid's prompt is computed by iteration R.it − 1 (its token counts when ``on_time``):
        it is done when it wanted one token, else it decodes from iteration R.it on."""
        bs = self.bs; pfx = self.pfx; plen = self.plen; state = self.state
        it = R.it
        p = it - 1
        self.pst[rid] = p
        if pfx is not None:
            pfx.prefilled(R.idx, rid, now)
        left = self.out[rid] - self.gen[rid]
        if left <= 1:
            cnt = 1 if on_time else 0
            self.stint(rid, R.idx, p, cnt)
            R.used -= -(-plen[rid] // bs)
            del R.running[rid]
            state[rid] = DONE
            self.status[rid] = OK if cnt else (TIMEOUT if self.dl[rid] <= self.end_ns else CANCELLED)
            if cnt and pfx is not None:
                pfx.finished(R.idx, rid, now)
            self.resolved(rid, now)
        else:
            state[rid] = DECODE
            e = (plen[rid] - it) % bs
            self.ekey[rid] = e
            R.H[e] += 1
            R.ndec += 1
            f = p + left - 1
            self.fin[rid] = f
            heapq.heappush(R.fin_heap, (f, rid))

    def wake(self, R):
        """R reached the boundary it was waiting for: book the span it ran (service), resolve
        what it finished or cut (completion), then plan the next span — or stop, at the end of
        the run or when a draining replica holds nothing more."""
        now = R.wake
        k = R.k
        kind = R.kind
        if kind:
            self.record(R, R.t0, R.step, k, R.tok)
            if kind == 1 and k:
                R.used += blocks_needed(R.H, R.it, k, self.bs, R.ndec)
            R.it += k
            R.done += k * R.tok
        if kind == 2 and R.pf_done:
            dl = self.dl
            end_ns = self.end_ns
            signals = self.ft is not None
            for rid in R.pf_done:
                on_time = now <= (dl[rid] if dl[rid] < end_ns else end_ns)
                if signals:
                    self.first_token(rid, now, on_time)
                self.prompt_done(R, rid, now, on_time)
            R.pf_done = []
        if self.sep:
            self.lanes_done(R, now)
        fh = R.fin_heap
        dh = R.dl_heap
        if fh and fh[0][0] < R.it or dh and dh[0][0] <= now:
            self.complete(R, now)
        if R.draining and not R.running and not R.nwait:
            self.removed(R, now)
            return
        if now >= self.end_ns:
            self.stop(R, now)
            return
        if self.sep:
            self.plan_sep(R, now)
        else:
            self.plan(R, now)

    def complete(self, R, now):
        """Sequences whose last token came in the span just booked finish (status ok, when by
        their deadline, else cut); running ones whose client deadline passed are cut."""
        dl = self.dl
        end_ns = self.end_ns
        pst = self.pst
        state = self.state
        fh = R.fin_heap
        last = R.it - 1
        while fh and fh[0][0] <= last:
            f, rid = heapq.heappop(fh)
            if state[rid] != DECODE or self.fin[rid] != f:
                continue
            cutoff = dl[rid] if dl[rid] < end_ns else end_ns
            if now <= cutoff:
                cnt = f - pst[rid] + 1
                self.free_decode(R, rid)
                self.stint(rid, R.idx, pst[rid], cnt)
                state[rid] = DONE
                self.status[rid] = OK
                if self.pfx is not None:
                    self.pfx.finished(R.idx, rid, now)
                self.resolved(rid, now)
            else:
                self.cut(R, rid, now)
        dh = R.dl_heap
        while dh and dh[0][0] <= now:
            d, rid = heapq.heappop(dh)
            if state[rid] == PREFILL or state[rid] == DECODE:
                self.cut(R, rid, now)

    def stop(self, R, now):
        """The end of the run: what R still runs is cut, what it queues expires."""
        state = self.state
        for rid in list(R.running):
            self.cut(R, rid, now)
        for rid in R.waiting:
            if state[rid] == WAITING:
                self.expire_waiting(R, rid, self.end_ns)
        R.waiting.clear()
        R.stopped = True
        R.kind = 0
        R.wake = INF
