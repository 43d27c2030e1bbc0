"""Admission control and fair scheduling in the simulator (docs/scenarios.md, "Admission and
fair scheduling").

**Queue discipline** of every replica (which waiting request is admitted next):

- ``fifo`` — arrival order (the engine's default);
- ``vtc`` — the Virtual Token Counter of Sheng et al. (OSDI'24): each tenant has a counter of
  the weighted tokens it was served (``prefill_weight`` × prompt tokens computed at admission +
  ``decode_weight`` × tokens generated, divided by the tenant's ``weights`` entry); the next
  request comes from the backlogged tenant with the smallest counter (its oldest request). A
  tenant that becomes backlogged again has its counter lifted to the smallest counter of the
  backlogged tenants, so idle time does not bank credit. Counters are shared by the replicas
  (fairness across the fleet, as a gateway would enforce it);
- ``priority`` — a level per tenant (0 first); a request's level drops by one for every
  ``aging_s`` it waits (so low levels cannot starve): the next request has the smallest
  level × aging_s + arrival time.

Preempted requests always go back to the front (as in the FIFO engine).

**Admission** (``deadline_slack``) at arrival, on the replica the router chose. The queue budget
of a request is B_queue = D − route − prefill − first token − margin, with D its TTFT limit (its
SLO class's, else the default), ``route_ms``, prefill = the prompt's prefill time on the
twin's service model, first token = one decode step at the replica's current batch, and
``margin_ms``. The expected wait is the requests that would be served before it (by the
discipline) × the recent interval between admissions on that replica (the mean of its last
32). Slack = B_queue − expected wait: ≥ 0 → admit; < 0 → **defer** for tenants listed in
``defer`` (queued behind every other request: served only when nothing else waits, within its
client's own timeout) or **reject** (status rejected at once; the client may retry elsewhere).

Code: each discipline is one class over :class:`Discipline` and each admission policy one class
over :class:`Admission`, behind the registries ``DISCIPLINES`` and ``ADMISSIONS`` (name →
class); :class:`Policy` binds the chosen pair to a run. A new discipline is a subclass and one
registry entry.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass

from ..errors import SpecError

ADMIT, DEFER, REJECT = 0, 1, 2
HISTORY = 32  # admissions remembered per replica for the expected wait


# ---- queue disciplines: one class each over a base, and the registry ----------------------------

class Discipline:
    """A replica's waiting requests, with the deque operations the engine uses (``append``,
    ``appendleft``, ``popleft``, ``[0]``, truth, ``len``, iteration, ``clear``). Tiers: front
    (preempted, LIFO at the front) → normal (the discipline's order) → deferred (FIFO). A
    subclass says how the normal tier is kept: ``_push``, ``_normal_head`` (the container and
    its head, or None), ``_pop_normal``, ``_iter_normal``, ``_clear_normal``, ``_ahead_normal``.
    ``charges``: the discipline needs the policy's token counters (``Policy.charge``)."""

    __slots__ = ("pol", "front", "deferred", "_n")
    charges = False

    def __init__(self, pol: "Policy"):
        self.pol = pol
        self.front: deque = deque()
        self.deferred: deque = deque()
        self._n = 0

    def append(self, rid: int) -> None:
        p = self.pol
        if p.deferring:
            p.deferring = False
            self.deferred.append(rid)
        else:
            self._push(rid)
        self._n += 1

    def appendleft(self, rid: int) -> None:
        self.front.appendleft(rid)
        self._n += 1

    def __getitem__(self, i):
        if i != 0:
            raise IndexError("only the head is read")
        if self.front:
            return self.front[0]
        h = self._normal_head()
        if h is not None:
            return h
        if self.deferred:
            return self.deferred[0]
        raise IndexError("empty queue")

    def popleft(self) -> int:
        if self.front:
            self._n -= 1
            return self.front.popleft()
        if self._normal_head() is not None:
            self._n -= 1
            return self._pop_normal()
        if self.deferred:
            self._n -= 1
            return self.deferred.popleft()
        raise IndexError("empty queue")

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self):
        yield from self.front
        yield from self._iter_normal()
        yield from self.deferred

    def clear(self) -> None:
        self._clear_normal()
        self.front.clear()
        self.deferred.clear()
        self._n = 0

    def ahead(self, rid: int) -> int:
        """Requests that would be admitted before ``rid`` if it were queued now."""
        return len(self.front) + self._ahead_normal(rid)

    # -- the normal tier (subclasses) -------------------------------------------------------
    def _push(self, rid: int) -> None:
        raise NotImplementedError

    def _normal_head(self):
        raise NotImplementedError

    def _pop_normal(self) -> int:
        raise NotImplementedError

    def _iter_normal(self):
        raise NotImplementedError

    def _clear_normal(self) -> None:
        raise NotImplementedError

    def _ahead_normal(self, rid: int) -> int:
        raise NotImplementedError


class FifoQueue(Discipline):
    """Arrival order (the engine's default)."""

    __slots__ = ("normal",)

    def __init__(self, pol: "Policy"):
        super().__init__(pol)
        self.normal: deque = deque()

    def _push(self, rid):
        self.normal.append(rid)

    def _normal_head(self):
        return self.normal[0] if self.normal else None

    def _pop_normal(self):
        return self.normal.popleft()

    def _iter_normal(self):
        return iter(self.normal)

    def _clear_normal(self):
        self.normal.clear()

    def _ahead_normal(self, rid):
        return len(self.normal)


class VtcQueue(Discipline):
    """The Virtual Token Counter (module docstring): one FIFO per tenant; the next request
    comes from the backlogged tenant with the smallest counter (ties: the lower index)."""

    __slots__ = ("normal",)
    charges = True

    def __init__(self, pol: "Policy"):
        super().__init__(pol)
        self.normal: dict = {}  # tenant → its queued requests

    def _push(self, rid):
        p = self.pol
        t = p.ten[rid]
        q = self.normal.get(t)
        if q is None:
            q = self.normal[t] = deque()
        p.backlog_add(t)
        q.append(rid)

    def _tenant(self):
        counter = self.pol.counter
        best, bc = None, None
        for t, q in self.normal.items():
            if q and (bc is None or counter[t] < bc or (counter[t] == bc and t < best)):
                best, bc = t, counter[t]
        return best

    def _normal_head(self):
        t = self._tenant()
        return None if t is None else self.normal[t][0]

    def _pop_normal(self):
        t = self._tenant()
        rid = self.normal[t].popleft()
        self.pol.backlog_remove(t)
        return rid

    def _iter_normal(self):
        for q in self.normal.values():
            yield from q

    def _clear_normal(self):
        for t, q in self.normal.items():
            for _ in range(len(q)):
                self.pol.backlog_remove(t)
            q.clear()

    def _ahead_normal(self, rid):
        p = self.pol
        mine = p.ten[rid]
        c = p.lifted(mine)
        return sum(len(q) for t, q in self.normal.items() if p.counter[t] <= c or t == mine)


class PriorityQueue(Discipline):
    """Priority with aging (module docstring): the smallest level × aging_s + arrival first
    (ties: the earlier queued)."""

    __slots__ = ("heap", "_seq")

    def __init__(self, pol: "Policy"):
        super().__init__(pol)
        self.heap: list = []
        self._seq = 0

    def _push(self, rid):
        heapq.heappush(self.heap, (self.pol.prio_key(rid), self._seq, rid))
        self._seq += 1

    def _normal_head(self):
        return self.heap[0][2] if self.heap else None

    def _pop_normal(self):
        return heapq.heappop(self.heap)[2]

    def _iter_normal(self):
        return (x[2] for x in sorted(self.heap))

    def _clear_normal(self):
        self.heap.clear()

    def _ahead_normal(self, rid):
        k = self.pol.prio_key(rid)
        return sum(1 for x in self.heap if x[0] <= k)


#: queue discipline name (``scheduling.policy``) → its class
DISCIPLINES: dict[str, type[Discipline]] = {"fifo": FifoQueue, "vtc": VtcQueue, "priority": PriorityQueue}


# ---- admission policies: one class each, and the registry ----------------------------------------

class Admission:
    """Decides at arrival, on the replica the router chose: ADMIT, DEFER or REJECT."""

    __slots__ = ()

    def decide(self, pol: "Policy", rid: int, now: int, r: int, queue: Discipline, batch: int,
               computed: int, cls: int) -> int:
        raise NotImplementedError


class AdmitAll(Admission):
    """No admission control: every request the router places is queued (and not counted)."""

    __slots__ = ()

    def decide(self, pol, rid, now, r, queue, batch, computed, cls):
        return ADMIT


class DeadlineSlack(Admission):
    """Slack = B_queue − expected wait (module docstring): ≥ 0 admit; else defer a tenant
    listed in ``defer``, or reject."""

    __slots__ = ()

    def decide(self, pol, rid, now, r, queue, batch, computed, cls):
        d = pol.d_ns[cls] if cls < len(pol.d_ns) else pol.d_ns[0]
        if d is None:
            return ADMIT
        budget = d - pol.fixed_ns - pol.prefill_ns(computed) - pol.step_ns(batch + 1)
        h = pol.adm_t[r]
        wait = 0.0
        if len(h) >= 2:
            wait = queue.ahead(rid) * (h[-1] - h[0]) / (len(h) - 1)
        if budget - wait >= 0:
            pol.counts["admitted"] += 1
            return ADMIT
        if pol.ten[rid] in pol.defer_t:
            pol.counts["deferred"] += 1
            pol.deferring = True
            return DEFER
        pol.counts["rejected"] += 1
        return REJECT


#: admission policy name (``admission.policy``) → its class
ADMISSIONS: dict[str, type[Admission]] = {"none": AdmitAll, "deadline_slack": DeadlineSlack}


@dataclass(frozen=True)
class PolicySpec:
    """Queue discipline and admission (module docstring). Tenant names map to the run's tenant
    indices when the policy is bound (``tenants``)."""

    discipline: str = "fifo"
    prefill_weight: float = 1.0
    decode_weight: float = 2.0
    weights: tuple[tuple[str, float], ...] = ()  # vtc: tenant → weight (default 1)
    priorities: tuple[tuple[str, int], ...] = ()  # priority: tenant → level (default 0)
    aging_s: float = 10.0
    admission: str = "none"
    ttft_ms: float | None = None  # default TTFT limit D (ms)
    class_ttft_ms: tuple[tuple[str, float], ...] = ()  # SLO class → D (ms)
    route_ms: float = 0.0
    margin_ms: float = 0.0
    defer: tuple[str, ...] = ()  # tenants deferred rather than rejected

    def __post_init__(self):
        if self.discipline not in DISCIPLINES:
            raise SpecError(f"unknown queue discipline {self.discipline!r}", field="scheduling.policy",
                            fix="one of " + ", ".join(DISCIPLINES))
        if self.admission not in ADMISSIONS:
            raise SpecError(f"unknown admission policy {self.admission!r}", field="admission.policy",
                            fix="one of " + ", ".join(ADMISSIONS))
        if self.admission == "deadline_slack" and self.ttft_ms is None and not self.class_ttft_ms:
            raise SpecError("deadline-slack admission needs a TTFT limit", field="admission.ttft_ms",
                            fix="give admission.ttft_ms (or per class), e.g. the SLO's ttft_ms")
        if self.aging_s <= 0 or self.prefill_weight < 0 or self.decode_weight < 0 \
                or self.prefill_weight + self.decode_weight <= 0:
            raise SpecError("scheduling weights must be ≥ 0 (not both 0) and aging_s > 0", field="scheduling")

    @property
    def active(self) -> bool:
        return self.discipline != "fifo" or self.admission != "none"


class Policy:
    """The engine's hook (``simulate(policy=...)``), bound to one run's requests: the shared
    state of the discipline (tenant counters and backlogs) and of admission (recent
    admissions per replica), the registry's classes for both."""

    def __init__(self, spec: PolicySpec, *, tenants: tuple[str, ...], classes: tuple[str | None, ...],
                 ten: list, sched: list, inp: list, step_ns, prefill_ns, n_replicas: int):
        self.spec = spec
        self.queue_cls = DISCIPLINES[spec.discipline]
        self.admission = ADMISSIONS[spec.admission]()
        self.ten = ten
        self.sched = sched
        self.inp = inp
        T = max(len(tenants), 1)
        wmap = dict(spec.weights)
        self.weight = [float(wmap.get(t, 1.0)) for t in tenants] or [1.0]
        pmap = dict(spec.priorities)
        self.level = [int(pmap.get(t, 0)) for t in tenants] or [0]
        self.aging_ns = spec.aging_s * 1e9
        self.counter = [0.0] * T
        self.backlog = [0] * T
        dmap = dict(spec.class_ttft_ms)
        self.d_ns = [None if (spec.ttft_ms is None and dmap.get(c) is None) else
                     float(dmap.get(c, spec.ttft_ms)) * 1e6 for c in (classes or (None,))]
        self.defer_t = {i for i, t in enumerate(tenants) if t in set(spec.defer)}
        self.fixed_ns = (spec.route_ms + spec.margin_ms) * 1e6
        self.step_ns = step_ns  # decode step (ns) by batch size
        self.prefill_ns = prefill_ns  # prefill time (ns) of a prompt of n tokens
        self.adm_t: dict = defaultdict(lambda: deque(maxlen=HISTORY))  # replica → its last admissions
        self.deferring = False
        self.counts = {"admitted": 0, "deferred": 0, "rejected": 0}

    def queue(self, r: int) -> Discipline:
        return self.queue_cls(self)

    # -- discipline state ---------------------------------------------------------------------
    def prio_key(self, rid: int) -> float:
        return self.level[self.ten[rid]] * self.aging_ns + self.sched[rid]

    def lifted(self, t: int) -> float:
        back = [self.counter[u] for u in range(len(self.counter)) if self.backlog[u] > 0 and u != t]
        return max(self.counter[t], min(back)) if back and self.backlog[t] == 0 else self.counter[t]

    def backlog_add(self, t: int) -> None:
        if self.backlog[t] == 0:
            self.counter[t] = self.lifted(t)
        self.backlog[t] += 1

    def backlog_remove(self, t: int) -> None:
        self.backlog[t] -= 1

    def charge(self, rid: int, prefill_tokens: int, decode_tokens: int) -> None:
        t = self.ten[rid]
        self.counter[t] += (self.spec.prefill_weight * prefill_tokens + self.spec.decode_weight * decode_tokens) \
            / self.weight[t]

    # -- engine hooks ---------------------------------------------------------------------------
    def admitted(self, r: int, rid: int, now: int, computed: int) -> None:
        self.adm_t[r].append(now)
        if self.queue_cls.charges:
            self.charge(rid, computed, 0)

    def tokens(self, rid: int, cnt: int) -> None:
        if self.queue_cls.charges and cnt > 0:
            self.charge(rid, 0, cnt)

    def decide(self, rid: int, now: int, r: int, queue: Discipline, batch: int, computed: int, cls: int) -> int:
        """ADMIT, DEFER or REJECT at arrival (the admission class); a deferral is applied to
        the next ``append`` of the queue."""
        return self.admission.decide(self, rid, now, r, queue, batch, computed, cls)


# ---- reading the YAML mappings (synth config and the twin's scenario parts) ----------------

SCHED_KEYS = ("policy", "prefill_weight", "decode_weight", "weights", "priorities", "aging_s")
ADMISSION_KEYS = ("policy", "ttft_ms", "class_ttft_ms", "route_ms", "margin_ms", "defer")


def parse_policy(sched_raw, adm_raw, *, sched_fld: str = "scheduling", adm_fld: str = "admission",
                 default_ttft_ms: float | None = None) -> PolicySpec:
    """``scheduling: {policy: fifo|vtc|priority, prefill_weight, decode_weight, weights: {tenant: w},
    priorities: {tenant: level}, aging_s}`` and ``admission: {policy: none|deadline_slack, ttft_ms,
    class_ttft_ms: {class: ms}, route_ms, margin_ms, defer: [tenant, …]}`` (either may be None)."""
    from .. import spec as S

    sd = S.mapping(sched_raw, sched_fld, known=SCHED_KEYS) if sched_raw is not None else {}
    ad = S.mapping(adm_raw, adm_fld, known=ADMISSION_KEYS) if adm_raw is not None else {}
    dflt = PolicySpec()
    sn = lambda k, **kw: S.number(sd.get(k, getattr(dflt, k)), S.join(sched_fld, k), **kw)  # noqa: E731
    an = lambda k, **kw: S.number(ad.get(k, getattr(dflt, k)), S.join(adm_fld, k), **kw)  # noqa: E731

    def table(d, key, fld, integer=False):
        m = S.mapping(d.get(key), S.join(fld, key))
        return tuple((str(k), S.number(v, S.join(S.join(fld, key), k), integer=integer,
                                       minimum=0 if integer else None, above=None if integer else 0.0))
                     for k, v in m.items())

    defer = tuple(str(x) for x in S.sequence(ad.get("defer"), S.join(adm_fld, "defer"), example="[batch-tenant]"))
    ttft = ad.get("ttft_ms", default_ttft_ms)
    return PolicySpec(
        discipline=S.choice(sd.get("policy", "fifo"), S.join(sched_fld, "policy"), DISCIPLINES),
        prefill_weight=sn("prefill_weight", minimum=0.0), decode_weight=sn("decode_weight", minimum=0.0),
        weights=table(sd, "weights", sched_fld), priorities=table(sd, "priorities", sched_fld, integer=True),
        aging_s=sn("aging_s", above=0.0),
        admission=S.choice(ad.get("policy", "deadline_slack" if ad else "none"), S.join(adm_fld, "policy"),
                           ADMISSIONS),
        ttft_ms=None if ttft is None else S.number(ttft, S.join(adm_fld, "ttft_ms"), above=0.0),
        class_ttft_ms=table(ad, "class_ttft_ms", adm_fld), route_ms=an("route_ms", minimum=0.0),
        margin_ms=an("margin_ms", minimum=0.0), defer=defer)


def describe_policy(p: PolicySpec) -> dict:
    """The policy as study.yaml records it."""
    return {"discipline": p.discipline, "prefill_weight": p.prefill_weight, "decode_weight": p.decode_weight,
            "weights": dict(p.weights), "priorities": dict(p.priorities), "aging_s": p.aging_s,
            "admission": p.admission, "ttft_ms": p.ttft_ms, "class_ttft_ms": dict(p.class_ttft_ms),
            "route_ms": p.route_ms, "margin_ms": p.margin_ms, "defer": list(p.defer)}
