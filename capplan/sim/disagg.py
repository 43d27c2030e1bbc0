"""Disaggregated prefill and decode (P/D) in the simulator: two pools, each with its own replica
count, GPU type (service speed or model) and limits, and the KV cache shipped between them
(docs/scenarios.md, "Disaggregated prefill and decode").

A request goes through three stages, each a run of the same engine (``capplan.sim.engine``):

1. **prefill pool** — the router (least outstanding work) picks a prefill replica; it queues
   there (FIFO) and its prompt is computed on one of the replica's ``lanes`` (one prompt at a
   time by default: ``prefill_overhead_ms + prefill_ms_per_token × prompt`` of the pool's
   service model). The **first token** is sent when the prompt is done (TTFT is the prefill
   pool's queue + prefill);
2. **KV transfer** — ``latency_ms + prompt tokens × kv_bytes_per_token / bandwidth``, a fixed
   delay per request (links are not shared: no contention between transfers);
3. **decode pool** — the request arrives at a decode replica (least outstanding work) with its
   KV cache; it waits for a batch slot and KV blocks (FIFO), computes the next token in its
   first iteration and decodes the rest at the pool's decode step for the batch it runs in.

The client's deadline counts from the request's schedule through all stages. Assumptions:
the prefill pool never waits for decode memory (its KV leaves at once — no back-pressure), a
request the decode pool cannot queue fails (status ``error``), and both pools see the same
prompts and answers. Replicas are named ``prefill-<i>`` and ``decode-<j>`` in the events.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import SpecError
from .engine import ERROR, OK, REJECTED, ReplicaParams, SimResult, simulate
from .prefix import TransferredKV
from .service import ServiceModel

#: KV bytes per token of Llama-2-70B in 16-bit (80 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes)
KV_BYTES_PER_TOKEN = 327_680


@dataclass(frozen=True)
class Pool:
    """One pool of a disaggregated system."""

    replicas: int
    params: ReplicaParams
    gpu: str = ""
    gpus_per_replica: int = 1
    usd_per_gpu_hour: float | None = None

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True)
class KVTransfer:
    """KV cache shipped from prefill to decode: a delay per request."""

    bandwidth_gb_s: float = 50.0  # gigabytes per second per transfer
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN
    latency_ms: float = 0.0

    def ns(self, tokens: np.ndarray) -> np.ndarray:
        t = self.latency_ms * 1e6 + np.asarray(tokens, np.float64) * self.kv_bytes_per_token / (self.bandwidth_gb_s * 1e9) * 1e9
        return np.round(t).astype(np.int64)


@dataclass(frozen=True)
class DisaggSpec:
    prefill: Pool
    decode: Pool
    transfer: KVTransfer = KVTransfer()
    lanes: int = 1  # prompts a prefill replica computes at once

    def __post_init__(self):
        if self.prefill.replicas < 1 or self.decode.replicas < 1:
            raise SpecError("a disaggregated system needs ≥ 1 prefill and ≥ 1 decode replica",
                            field="disaggregation")

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    @property
    def ratio(self) -> str:
        return f"{self.prefill.replicas}:{self.decode.replicas}"

    def cost_usd_per_hour(self) -> float | None:
        if self.prefill.usd_per_gpu_hour is None or self.decode.usd_per_gpu_hour is None:
            return None
        return self.prefill.gpus * self.prefill.usd_per_gpu_hour + self.decode.gpus * self.decode.usd_per_gpu_hour


def simulate_disagg(spec: DisaggSpec, *, sched_ns: np.ndarray, input_tokens: np.ndarray,
                    output_tokens: np.ndarray, tenant: np.ndarray | None, timeout_s: float, end_s: float,
                    fault: np.ndarray | None = None, prefix=None, policy=None, progress=None) -> SimResult:
    """One open-loop run of a disaggregated system (module docstring), as one ``SimResult``
    whose replicas are the prefill pool's, then the decode pool's. ``prefix`` and ``policy``
    hooks act on the prefill pool."""
    n = len(sched_ns)
    timeout_ns = int(round(timeout_s * 1e9))
    pp = replace(spec.prefill.params, prefill="separate", prefill_lanes=spec.lanes)
    res1 = simulate(n_replicas=spec.prefill.replicas, params=pp, timeout_s=timeout_s, end_s=end_s,
                    sched_ns=sched_ns, input_tokens=input_tokens, output_tokens=np.ones(n, np.int64),
                    tenant=tenant, fault=fault, prefix=prefix, policy=policy, progress=progress)
    first = np.full(n, -1, np.int64)
    first[res1.xtok_rid] = res1.xtok_ns
    status = res1.status.copy()
    go = (status == OK) & (output_tokens > 1) & (first >= 0)
    idx = np.flatnonzero(go)
    arrive = first[idx] + spec.transfer.ns(input_tokens[idx])
    order = np.argsort(arrive, kind="stable")
    idx, arrive = idx[order], arrive[order]
    deadline = np.asarray(sched_ns, np.int64)[idx] + timeout_ns
    res2 = simulate(n_replicas=spec.decode.replicas, params=spec.decode.params, timeout_s=timeout_s, end_s=end_s,
                    sched_ns=arrive, input_tokens=input_tokens[idx] + 1, output_tokens=output_tokens[idx] - 1,
                    tenant=None if tenant is None else np.asarray(tenant)[idx], deadline_ns=deadline,
                    prefix=TransferredKV(), progress=progress)
    s2 = res2.status.copy()
    s2[s2 == REJECTED] = ERROR  # prefilled, but no decode replica could queue it
    status[idx] = s2
    npf = spec.prefill.replicas
    replica = res1.replica.copy()
    replica[idx] = np.where(res2.replica >= 0, res2.replica + npf, replica[idx])
    stats = {k: v for k, v in res1.stats.items() if k.startswith(("prefix_", "policy_"))}
    for k in ("preemptions", "iterations", "kv_blocks_in_use_at_end"):
        stats[k] = int(res1.stats[k] + res2.stats[k])
    stats.update(requests=n, max_queue=int(res1.stats["max_queue"]), max_queue_prefill=int(res1.stats["max_queue"]),
                 max_queue_decode=int(res2.stats["max_queue"]), decode_requests=int(len(idx)),
                 decode_rejected=int(np.sum(res2.status == REJECTED)))
    return SimResult(
        sched_ns=np.asarray(sched_ns, np.int64), input_tokens=np.asarray(input_tokens, np.int64),
        target_output=np.asarray(output_tokens, np.int64),
        tenant=res1.tenant, status=status, admitted_ns=res1.admitted_ns, replica=replica,
        stint_rid=idx[res2.stint_rid] if len(res2.stint_rid) else res2.stint_rid,
        stint_rep=res2.stint_rep + npf, stint_first_iter=res2.stint_first_iter, stint_count=res2.stint_count,
        seg_i0=res1.seg_i0 + res2.seg_i0, seg_t0=res1.seg_t0 + res2.seg_t0, seg_step=res1.seg_step + res2.seg_step,
        seg_k=res1.seg_k + res2.seg_k, seg_tok=res1.seg_tok + res2.seg_tok, stats=stats,
        xtok_rid=res1.xtok_rid, xtok_ns=res1.xtok_ns, computed_input=res1.computed_input,
        timeline=list(res1.timeline),
        replica_names=tuple(f"prefill-{i}" for i in range(npf)) + tuple(f"decode-{j}" for j in range(spec.decode.replicas)))


# ---- reading the YAML mapping (synth config and the twin's scenario part) -------------------

POOL_KEYS = ("replicas", "gpu", "gpus_per_replica", "usd_per_gpu_hour", "speed", "service_model", "max_batch",
             "kv_blocks", "token_budget", "queue_limit")
TRANSFER_KEYS = ("bandwidth_gb_s", "kv_bytes_per_token", "latency_ms")
KEYS = ("prefill", "decode", "kv_transfer", "lanes")


def parse_pool(raw, fld: str, base: ReplicaParams, base_gpus: int = 1, base_gpu: str = "") -> Pool:
    """``{replicas, gpu, gpus_per_replica, usd_per_gpu_hour, speed | service_model, max_batch,
    kv_blocks, token_budget, queue_limit}`` on top of the base replica parameters."""
    from .. import spec as S

    d = S.mapping(raw, fld, known=POOL_KEYS, optional=False, example="{replicas: 2, gpu: H100-80GB, speed: 1.0}")
    service = base.service
    if "service_model" in d:
        service = ServiceModel.from_dict(d["service_model"], field_prefix=S.join(fld, "service_model"))
    speed = S.number(d.get("speed", 1.0), S.join(fld, "speed"), above=0.0)
    if speed != 1.0:
        service = replace(service, decode_step_ms=tuple(v / speed for v in service.decode_step_ms),
                          prefill_ms_per_token=service.prefill_ms_per_token / speed,
                          prefill_overhead_ms=service.prefill_overhead_ms / speed,
                          source=f"{service.source} × speed {speed:g}")
    opt = lambda k, **kw: S.number(d[k], S.join(fld, k), integer=True, **kw) if k in d else getattr(base, k)  # noqa: E731
    mb = opt("max_batch", minimum=1)
    params = replace(base, service=service, max_batch=mb, kv_blocks=opt("kv_blocks", minimum=1),
                     token_budget=max(opt("token_budget", minimum=1), mb),
                     queue_limit=S.number(d["queue_limit"], S.join(fld, "queue_limit"), integer=True, minimum=0,
                                          optional=True) if "queue_limit" in d else base.queue_limit,
                     prefill="mixed", prefill_lanes=None, prefill_jitter_cv=0.0)
    price = d.get("usd_per_gpu_hour")
    return Pool(replicas=S.number(d.get("replicas", 1), S.join(fld, "replicas"), integer=True, minimum=1),
                params=params, gpu=str(d.get("gpu", base_gpu) or base_gpu),
                gpus_per_replica=S.number(d.get("gpus_per_replica", base_gpus), S.join(fld, "gpus_per_replica"),
                                          integer=True, minimum=1),
                usd_per_gpu_hour=None if price is None else S.number(price, S.join(fld, "usd_per_gpu_hour"),
                                                                     minimum=0.0))


def parse_disagg(raw, fld: str, base: ReplicaParams, *, base_gpus: int = 1, base_gpu: str = "") -> DisaggSpec:
    """``{prefill: {pool}, decode: {pool}, kv_transfer: {bandwidth_gb_s, kv_bytes_per_token,
    latency_ms}, lanes}``."""
    from .. import spec as S

    d = S.mapping(raw, fld, known=KEYS, optional=False,
                  example="{prefill: {replicas: 2}, decode: {replicas: 2}, kv_transfer: {bandwidth_gb_s: 50}}")
    for k in ("prefill", "decode"):
        if k not in d:
            S.fail(S.join(fld, k), f"{fld} needs a {k} pool", f"e.g. {k}: {{replicas: 2}}")
    t = S.mapping(d.get("kv_transfer"), S.join(fld, "kv_transfer"), known=TRANSFER_KEYS)
    dflt = KVTransfer()
    tf = S.join(fld, "kv_transfer")
    return DisaggSpec(
        prefill=parse_pool(d["prefill"], S.join(fld, "prefill"), base, base_gpus, base_gpu),
        decode=parse_pool(d["decode"], S.join(fld, "decode"), base, base_gpus, base_gpu),
        transfer=KVTransfer(S.number(t.get("bandwidth_gb_s", dflt.bandwidth_gb_s), S.join(tf, "bandwidth_gb_s"),
                                     above=0.0),
                            S.number(t.get("kv_bytes_per_token", dflt.kv_bytes_per_token),
                                     S.join(tf, "kv_bytes_per_token"), integer=True, minimum=1),
                            S.number(t.get("latency_ms", 0.0), S.join(tf, "latency_ms"), minimum=0.0)),
        lanes=S.number(d.get("lanes", 1), S.join(fld, "lanes"), integer=True, minimum=1))


def describe_disagg(d: DisaggSpec) -> dict:
    """The system as study.yaml records it."""
    pool = lambda p: {"replicas": p.replicas, "gpu": p.gpu, "gpus_per_replica": p.gpus_per_replica,  # noqa: E731
                      "usd_per_gpu_hour": p.usd_per_gpu_hour, "max_batch": p.params.max_batch,
                      "kv_blocks": p.params.kv_blocks, "service_model": p.params.service.to_dict()}
    return {"prefill": pool(d.prefill), "decode": pool(d.decode), "lanes": d.lanes,
            "kv_transfer": {"bandwidth_gb_s": d.transfer.bandwidth_gb_s,
                            "kv_bytes_per_token": d.transfer.kv_bytes_per_token,
                            "latency_ms": d.transfer.latency_ms}}
