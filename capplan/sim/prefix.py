"""Prefix caching in the simulator: shared prompt prefixes in the workload and an LRU prefix
cache per replica, in KV blocks (docs/scenarios.md, "The prefix cache in the twin").

Workload. A request's prompt is a sequence of *chunks* — a system prompt, the turns of a
conversation, a trace's 512-token blocks — each with an id and a token count; two requests
whose prompts start with the same chunk ids share that prefix. Three generators
(:class:`PrefixWorkload`):

- ``system``: a share of requests starts with one of ``groups`` system prompts of ``tokens``
  tokens (Zipf popularity with exponent ``zipf``, 0 = uniform), added in front of the sampled
  prompt;
- ``sessions``: multi-turn conversations. ``active`` sessions are open at any time; each arrival
  continues one of them at random (or opens the first turn of a new one); a session ends after a
  geometric number of turns (mean ``turns``). Turn k's prompt is the optional system prompt, the
  earlier turns' prompts and answers, and its new message (the sampled prompt); its answer is
  cached when it completes, so the next turn can hit it;
- ``trace``: the Mooncake trace's ``hash_ids`` (512-token prompt blocks shared between requests)
  replayed with the trace's rows (``workload.arrival: replay``).

Cache. Per replica an LRU of chunks with a capacity in KV blocks (a chunk of t tokens takes
⌈t / block⌉ blocks). At admission the longest run of leading chunks found in the replica's
cache is a hit: those tokens, rounded down to whole blocks and at most the prompt less one
token (a server always computes the last one), are not prefilled; the hit chunks become most
recently used. When a prompt's prefill ends its chunks are inserted (evicting the least
recently used), and a conversation turn's answer when the request completes. A flush empties
a replica's cache at a time (a rollout, a restart), logged as a timeline row. The cache is a
budget of its own: sequences still hold their full KV blocks (shared blocks are not
deduplicated), which is conservative where the KV cache binds.

Router. ``least_work`` (the engine's default) or ``prefix_affinity``: the replica whose cache
holds the longest prefix of the prompt, unless its outstanding work exceeds the least-loaded
replica's by more than ``affinity_slack`` × that + ``affinity_slack_tokens`` (then least work;
ties: least work, then the lowest index) — the cache-aware routing of SGLang's router.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import numpy as np

from ..errors import SpecError

ROUTERS = ("least_work", "prefix_affinity")
KINDS = ("system", "sessions", "trace")
TRACE_BLOCK_TOKENS = 512  # Mooncake's hash_ids: one id per 512 prompt tokens


@dataclass(frozen=True)
class PrefixCacheSpec:
    """The prefix cache of every replica and the router that may favour it."""

    blocks: int  # capacity per replica, in KV blocks
    router: str = "least_work"
    affinity_slack: float = 0.5
    affinity_slack_tokens: int = 2048
    flushes: tuple[tuple[float, int | None], ...] = ()  # (time s, replica index or None: all)

    def __post_init__(self):
        if self.blocks < 0:
            raise SpecError(f"prefix cache blocks must be ≥ 0, got {self.blocks}", field="prefix_cache.blocks")
        if self.router not in ROUTERS:
            raise SpecError(f"unknown router {self.router!r}", field="prefix_cache.router",
                            fix="one of " + ", ".join(ROUTERS))


@dataclass(frozen=True)
class PrefixWorkload:
    """Shared prefixes in the generated prompts (module docstring)."""

    kind: str = "system"
    groups: int = 1
    tokens: int = 1024  # system prompt length (system; sessions: 0 for none)
    share: float = 1.0  # system: share of requests with a system prompt
    zipf: float = 0.0  # system: popularity exponent of the groups
    active: int = 32  # sessions: conversations open at once
    turns: float = 4.0  # sessions: mean turns per conversation

    def __post_init__(self):
        if self.kind not in KINDS:
            raise SpecError(f"unknown prefix workload {self.kind!r}", field="prefixes.kind",
                            fix="one of " + ", ".join(KINDS))
        checks = (("groups", self.groups >= 1), ("tokens", self.tokens >= 0), ("share", 0 <= self.share <= 1),
                  ("zipf", self.zipf >= 0), ("active", self.active >= 1), ("turns", self.turns >= 1))
        for name, ok in checks:
            if not ok:
                raise SpecError(f"prefixes.{name} is out of range: {getattr(self, name)!r}", field=f"prefixes.{name}")


@dataclass(frozen=True)
class Prefixes:
    """Per-request prefix chunks of one run: request i's prompt chunks are
    ``ids[off[i]:off[i+1]]`` with ``tok[...]`` tokens each; ``ans_id[i]`` (−1: none) is the
    chunk its answer adds (``ans_tok[i]`` tokens); ``group`` / ``session`` label the request
    (−1: none) for the events' ``prefix_group`` / ``session_id``."""

    off: np.ndarray
    ids: np.ndarray
    tok: np.ndarray
    ans_id: np.ndarray
    ans_tok: np.ndarray
    group: np.ndarray
    session: np.ndarray
    group_names: tuple[str, ...] = ()


def _zipf_p(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def generate(spec: PrefixWorkload, inp: np.ndarray, out: np.ndarray, rng: np.random.Generator
             ) -> tuple[np.ndarray, Prefixes]:
    """The prompts with their shared prefixes: returns (new input lengths, chunks). ``inp``
    and ``out`` are the sampled prompt (the new message) and answer lengths, in arrival order."""
    n = len(inp)
    inp = np.asarray(inp, np.int64)
    out = np.asarray(out, np.int64)
    if spec.kind == "system":
        has = rng.random(n) < spec.share
        g = rng.choice(spec.groups, size=n, p=_zipf_p(spec.groups, spec.zipf)) if spec.groups > 1 \
            else np.zeros(n, np.int64)
        group = np.where(has & (spec.tokens > 0), g, -1).astype(np.int64)
        cnt = (group >= 0).astype(np.int64)
        off = np.r_[0, np.cumsum(cnt)].astype(np.int64)
        ids = group[group >= 0].astype(np.int64)
        tok = np.full(ids.size, spec.tokens, np.int64)
        new_inp = inp + np.where(group >= 0, spec.tokens, 0)
        return new_inp, Prefixes(off, ids, tok, np.full(n, -1, np.int64), np.zeros(n, np.int64), group,
                                 np.full(n, -1, np.int64), tuple(f"system-{i}" for i in range(spec.groups)))
    if spec.kind == "sessions":
        # chunk ids: 0 = system prompt; then 1, 2, … in order of creation (user, answer per turn)
        next_id = [1]
        p_end = 1.0 / spec.turns  # geometric number of turns with mean `turns`
        open_: list[list] = []  # per open session: [session index, history chunk ids, history tokens]
        n_sessions = 0
        off, ids, tok = [0], [], []
        ans_id = np.full(n, -1, np.int64)
        ans_tok = np.zeros(n, np.int64)
        session = np.zeros(n, np.int64)
        new_inp = np.zeros(n, np.int64)
        picks = rng.random(n)
        ends = rng.random(n)
        sys_tok = int(spec.tokens)
        for i in range(n):
            if len(open_) < spec.active:
                open_.append([n_sessions, [], []])
                n_sessions += 1
                j = len(open_) - 1
            else:
                j = int(picks[i] * len(open_))
            s = open_[j]
            u_id = next_id[0]
            a_id = u_id + 1
            next_id[0] += 2
            chunk_ids = ([0] if sys_tok else []) + s[1] + [u_id]
            chunk_tok = ([sys_tok] if sys_tok else []) + s[2] + [int(inp[i])]
            ids += chunk_ids
            tok += chunk_tok
            off.append(len(ids))
            new_inp[i] = sum(chunk_tok)
            ans_id[i], ans_tok[i] = a_id, int(out[i])
            session[i] = s[0]
            s[1] = s[1] + [u_id, a_id]
            s[2] = s[2] + [int(inp[i]), int(out[i])]
            if ends[i] < p_end:  # the conversation ends after this turn
                open_.pop(j)
        return new_inp, Prefixes(np.asarray(off, np.int64), np.asarray(ids, np.int64), np.asarray(tok, np.int64),
                                 ans_id, ans_tok, np.full(n, -1, np.int64) if not sys_tok else np.zeros(n, np.int64),
                                 session, ("system",) if sys_tok else ())
    raise SpecError("trace prefixes come with a replayed trace (workload.arrival: replay with a Mooncake trace)",
                    field="prefixes.kind")


def from_hash_ids(hash_ids: list, rows: np.ndarray, passes: np.ndarray, inp: np.ndarray) -> Prefixes:
    """Chunks of replayed trace rows: each hash id is a 512-token block (the last one the
    prompt's remainder); a later pass over the trace gets fresh ids (its own conversations)."""
    n = len(rows)
    span = 1 + max((max(h) for h in hash_ids if h), default=0)
    off, ids, tok = [0], [], []
    group = np.full(n, -1, np.int64)
    for i, (r, p) in enumerate(zip(rows.tolist(), passes.tolist())):
        h = hash_ids[r]
        L = int(inp[i])
        k = len(h)
        for j, x in enumerate(h):
            ids.append(int(x) + p * span)
            tok.append(TRACE_BLOCK_TOKENS if j < k - 1 else max(1, L - TRACE_BLOCK_TOKENS * (k - 1)))
        off.append(len(ids))
        if k:
            group[i] = int(h[0]) + p * span
    return Prefixes(np.asarray(off, np.int64), np.asarray(ids, np.int64), np.asarray(tok, np.int64),
                    np.full(n, -1, np.int64), np.zeros(n, np.int64), group, np.full(n, -1, np.int64))


class PrefixCache:
    """The engine's hook (``simulate(prefix=...)``): per-replica LRU caches of chunks (module
    docstring). Counts what it did in ``stats`` and logs flushes as timeline rows."""

    def __init__(self, spec: PrefixCacheSpec, px: Prefixes, block_size: int, n_replicas: int):
        self.spec = spec
        self.bs = int(block_size)
        self.cap = int(spec.blocks)
        self.off = px.off.tolist()
        self.ids = px.ids.tolist()
        self.tok = px.tok.tolist()
        self.ans_id = px.ans_id.tolist()
        self.ans_tok = px.ans_tok.tolist()
        self.n = n_replicas
        self.lru: dict = defaultdict(OrderedDict)  # replica index → its cache (replicas added later start cold)
        self.used: dict = defaultdict(int)
        self.affinity = spec.router == "prefix_affinity"
        self.pending = sorted((int(round(t * 1e9)), r) for t, r in spec.flushes)
        self.log: list = []
        self.lookups = 0
        self.hits = 0
        self.hit_tokens = 0
        self.evicted_blocks = 0

    def _flush_until(self, now: int) -> None:
        while self.pending and self.pending[0][0] <= now:
            t, r = self.pending.pop(0)
            for i in range(max([self.n, *[k + 1 for k in self.lru]])) if r is None else (r,):
                self.lru[i].clear()
                self.used[i] = 0
                self.log.append((t, "cache_flush", i, {"detail": "prefix cache flushed"}))

    def _match(self, r: int, rid: int, length: int, touch: bool) -> int:
        c = self.lru[r]
        got = 0
        for j in range(self.off[rid], self.off[rid + 1]):
            x = self.ids[j]
            if x not in c:
                break
            if touch:
                c.move_to_end(x)
            got += self.tok[j]
        got = got // self.bs * self.bs
        return min(got, length - 1) if length > 1 else 0

    def lookup(self, r: int, rid: int, now: int, length: int, first: bool) -> int:
        """Prompt tokens of ``rid`` found in replica r's cache at admission (touched)."""
        self._flush_until(now)
        got = self._match(r, rid, length, True) if self.cap else 0
        if first:
            self.lookups += 1
            self.hits += got > 0
            self.hit_tokens += got
        return got

    def _insert(self, r: int, x: int, t: int) -> None:
        c = self.lru[r]
        if x in c:
            c.move_to_end(x)
            return
        b = -(-t // self.bs)
        if b > self.cap:
            return
        c[x] = b
        self.used[r] += b
        while self.used[r] > self.cap:
            _, bb = c.popitem(last=False)
            self.used[r] -= bb
            self.evicted_blocks += bb

    def prefilled(self, r: int, rid: int, now: int) -> None:
        """rid's prompt is computed on replica r: its chunks are cached."""
        self._flush_until(now)
        if not self.cap:
            return
        for j in range(self.off[rid], self.off[rid + 1]):
            self._insert(r, self.ids[j], self.tok[j])

    def finished(self, r: int, rid: int, now: int) -> None:
        """rid completed on replica r: its answer chunk (a conversation turn) is cached."""
        if self.ans_id[rid] >= 0 and self.cap:
            self._flush_until(now)
            self._insert(r, self.ans_id[rid], self.ans_tok[rid])

    def route(self, rid: int, now: int, cands: list, best, best_work: int, length: int):
        """Prefix-affinity choice among ``cands`` [(replica, outstanding work)] (module docstring)."""
        self._flush_until(now)
        limit = best_work * (1.0 + self.spec.affinity_slack) + self.spec.affinity_slack_tokens
        top, top_hit, top_w = best, 0, best_work
        for R, w in cands:
            if w > limit:
                continue
            h = self._match(R.idx, rid, length, False)
            if h > top_hit or (h == top_hit and h > 0 and w < top_w):
                top, top_hit, top_w = R, h, w
        return top

    def close(self, end_ns: int) -> dict:
        """Apply the flushes due by the end; the counts of the run."""
        self._flush_until(end_ns)
        return {"prefix_lookups": self.lookups, "prefix_hits": self.hits, "prefix_hit_tokens": self.hit_tokens,
                "prefix_evicted_blocks": self.evicted_blocks}


class TransferredKV:
    """Hook for the decode pool of a disaggregated system: every prompt's KV arrives from the
    prefill pool, so admission computes one token (the next) and nothing is cached."""

    affinity = False
    log: list = []

    def lookup(self, r, rid, now, length, first):
        return length - 1 if length > 1 else 0

    def prefilled(self, r, rid, now):
        pass

    def finished(self, r, rid, now):
        pass

    def close(self, end_ns):
        return {}


# ---- reading the YAML mappings (synth config and the twin's scenario parts) ----------------

CACHE_KEYS = ("blocks", "tokens", "router", "affinity_slack", "affinity_slack_tokens", "flushes")
WORKLOAD_KEYS = ("kind", "groups", "tokens", "share", "zipf", "active", "turns")


def parse_cache(raw, fld: str, *, block_size: int = 16) -> PrefixCacheSpec:
    """``{blocks: N | tokens: N, router, affinity_slack, affinity_slack_tokens,
    flushes: [{at_s, replica}]}`` (capacity per replica: blocks, or tokens rounded up)."""
    from .. import spec as S

    d = S.mapping(raw, fld, known=CACHE_KEYS, optional=False, example="{blocks: 20000, router: prefix_affinity}")
    if ("blocks" in d) == ("tokens" in d):
        S.fail(fld, f"give {fld}.blocks or {fld}.tokens (the cache's capacity per replica), one of them",
               "e.g. blocks: 20000 (KV blocks of the replica's block size)")
    blocks = S.number(d["blocks"], S.join(fld, "blocks"), integer=True, minimum=0) if "blocks" in d else \
        -(-S.number(d["tokens"], S.join(fld, "tokens"), integer=True, minimum=0) // block_size)
    flushes = []
    for i, f in enumerate(S.sequence(d.get("flushes"), S.join(fld, "flushes"), example="[{at_s: 300}]")):
        ff = S.index(S.join(fld, "flushes"), i)
        f = S.mapping(f, ff, known=("at_s", "replica"), optional=False)
        flushes.append((S.duration_s(f.get("at_s"), S.join(ff, "at_s")),
                        S.number(f["replica"], S.join(ff, "replica"), integer=True, minimum=0)
                        if f.get("replica") is not None else None))
    return PrefixCacheSpec(
        blocks=int(blocks), router=S.choice(d.get("router", "least_work"), S.join(fld, "router"), ROUTERS),
        affinity_slack=S.number(d.get("affinity_slack", 0.5), S.join(fld, "affinity_slack"), minimum=0.0),
        affinity_slack_tokens=S.number(d.get("affinity_slack_tokens", 2048), S.join(fld, "affinity_slack_tokens"),
                                       integer=True, minimum=0),
        flushes=tuple(sorted(flushes, key=lambda x: x[0])))


def parse_workload(raw, fld: str) -> PrefixWorkload:
    """``{kind: system|sessions|trace, groups, tokens, share, zipf, active, turns}``."""
    from .. import spec as S

    d = S.mapping(raw, fld, known=WORKLOAD_KEYS, optional=False,
                  example="{kind: system, groups: 4, tokens: 2000, share: 0.9}")
    kind = S.choice(d.get("kind", "system"), S.join(fld, "kind"), KINDS)
    dflt = PrefixWorkload()
    num = lambda k, **kw: S.number(d.get(k, getattr(dflt, k)), S.join(fld, k), **kw)  # noqa: E731
    return PrefixWorkload(kind=kind, groups=num("groups", integer=True, minimum=1),
                          tokens=num("tokens", integer=True, minimum=0) if "tokens" in d or kind == "system"
                          else 0,
                          share=num("share", minimum=0.0, maximum=1.0), zipf=num("zipf", minimum=0.0),
                          active=num("active", integer=True, minimum=1), turns=num("turns", minimum=1.0))


def describe_cache(c: PrefixCacheSpec) -> dict:
    """The cache as study.yaml records it."""
    return {"blocks": c.blocks, "router": c.router, "affinity_slack": c.affinity_slack,
            "affinity_slack_tokens": c.affinity_slack_tokens,
            "flushes": [{"at_s": t, "replica": r} for t, r in c.flushes], "policy": "LRU"}
