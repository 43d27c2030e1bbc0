"""Scenario parts for serving policies (docs/scenarios.md): shared prompt prefixes, the prefix
cache, disaggregated prefill/decode pools, the queue discipline and admission control. Each is a
``capplan.twin.Part`` registered by its YAML key; each sets one field of the synth configuration
that ``capplan.sim`` simulates.

.. code-block:: yaml

    prefixes: {kind: system, groups: 4, tokens: 3000, share: 0.9}
    prefix_cache: {tokens: 400000, router: prefix_affinity, flushes: [{at_s: 300}]}
    disaggregation: {prefill: {replicas: 3}, decode: {replicas: 5, speed: 1.2}, kv_transfer: {bandwidth_gb_s: 50}}
    scheduling: {policy: vtc, prefill_weight: 1, decode_weight: 2, weights: {acme: 2}}
    admission: {policy: deadline_slack, ttft_ms: 2000, margin_ms: 500, defer: [globex]}
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar

from ..sim import disagg as D
from ..sim import policy as PO
from ..sim import prefix as PX
from ..sim.engine import ReplicaParams
from .. import spec as S
from ..errors import SpecError
from .scenario import Part, Scenario, ScenarioContext, apply_parts, parse_parts, register_part


@register_part
@dataclass(frozen=True)
class PrefixesPart(Part):
    """Shared prompt prefixes in the workload: system prompts, multi-turn sessions, or a
    Mooncake trace's hash ids (with ``workload.arrival: replay``)."""

    key: ClassVar[str] = "prefixes"
    summary: ClassVar[str] = "kind: system (groups, tokens, share, zipf) | sessions (active, turns, tokens) | trace; " \
                             "or from_study: PATH (what a study's prefix_group / session_id show)"
    spec: PX.PrefixWorkload = PX.PrefixWorkload()
    notes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw, fld, base_dir=None):
        from pathlib import Path

        from .. import spec as S
        from ..cache import prefix_workload

        if isinstance(raw, dict) and "from_study" in raw:
            S.mapping(raw, fld, known=("from_study",))
            p = Path(str(raw["from_study"])).expanduser()
            if not p.is_absolute() and base_dir is not None:
                p = Path(base_dir) / p
            spec, notes = prefix_workload(p)
            return cls(spec, tuple(f"prefixes from {p}: {n}" for n in notes))
        return cls(PX.parse_workload(raw, fld))

    def apply(self, ctx: ScenarioContext) -> ScenarioContext:
        return replace(ctx, config=replace(ctx.config, prefixes=self.spec), notes=ctx.notes + self.notes)

    def describe(self):
        p = self.spec
        if p.kind == "system":
            return f"prefixes: {p.groups} system prompt(s) of {p.tokens} tokens on {p.share:.0%} of requests"
        if p.kind == "sessions":
            return f"prefixes: conversations ({p.active} open, {p.turns:g} turns on average)"
        return "prefixes: the trace's hash ids"


@register_part
@dataclass(frozen=True)
class PrefixCachePart(Part):
    """An LRU prefix cache per replica (capacity in KV blocks or tokens), the router, flushes."""

    key: ClassVar[str] = "prefix_cache"
    summary: ClassVar[str] = "blocks or tokens (per replica), router: least_work | prefix_affinity, " \
                             "affinity_slack, affinity_slack_tokens, flushes: [{at_s, replica}]"
    raw: dict | None = None

    @classmethod
    def parse(cls, raw, fld):
        PX.parse_cache(raw, fld)  # checked now; built against the replica's block size in apply
        return cls(dict(raw))

    def apply(self, ctx: ScenarioContext) -> ScenarioContext:
        bs = ctx.config.replica.block_size
        return replace(ctx, config=replace(ctx.config, prefix_cache=PX.parse_cache(self.raw, self.key, block_size=bs)))

    def describe(self):
        size = f"{self.raw['blocks']} blocks" if "blocks" in self.raw else f"{self.raw['tokens']} tokens"
        fl = len(self.raw.get("flushes") or [])
        return f"prefix cache: {size} per replica, {self.raw.get('router', 'least_work')} router" + \
            (f", {fl} flush(es)" if fl else "")


@register_part
@dataclass(frozen=True)
class DisaggregationPart(Part):
    """Separate prefill and decode pools (own replicas, GPU type or speed, limits) and the KV
    transfer between them."""

    key: ClassVar[str] = "disaggregation"
    summary: ClassVar[str] = "prefill: {replicas, gpu, gpus_per_replica, usd_per_gpu_hour, speed, max_batch, " \
                             "kv_blocks}, decode: {…}, kv_transfer: {bandwidth_gb_s, kv_bytes_per_token, " \
                             "latency_ms}, lanes"
    raw: dict | None = None
    spec: D.DisaggSpec | None = None  # pools already built (``pd_sweep``'s splits): used as they are

    @classmethod
    def parse(cls, raw, fld):
        D.parse_disagg(raw, fld, ReplicaParams())  # checked now; built on the twin's replica in apply
        return cls(dict(raw))

    def apply(self, ctx: ScenarioContext) -> ScenarioContext:
        cfg = ctx.config
        spec = self.spec or D.parse_disagg(self.raw, self.key, cfg.replica,
                                           base_gpus=int(cfg.system.get("gpus_per_replica", 1)),
                                           base_gpu=str(cfg.system.get("gpu", "")))
        system = {**cfg.system, "replicas": 1, "gpus_per_replica": spec.gpus,
                  "engine": f"disaggregated prefill:decode {spec.ratio}"}
        return replace(ctx, config=replace(cfg, disagg=spec, system=system),
                       notes=ctx.notes + (f"disaggregated: {spec.prefill.replicas} prefill + {spec.decode.replicas} "
                                          f"decode replicas ({spec.gpus} GPUs) as one replica group",))

    def describe(self):
        if self.spec is not None:
            return (f"disaggregation: {self.spec.prefill.replicas} prefill and {self.spec.decode.replicas} "
                    "decode replicas")
        return (f"disaggregation: {self.raw['prefill'].get('replicas', 1)} prefill and "
                f"{self.raw['decode'].get('replicas', 1)} decode replicas")


_SCHED = ("discipline", "prefill_weight", "decode_weight", "weights", "priorities", "aging_s")
_ADM = ("admission", "ttft_ms", "class_ttft_ms", "route_ms", "margin_ms", "defer")


def _merge(cfg, spec: PO.PolicySpec, names: tuple[str, ...]):
    base = cfg.policy or PO.PolicySpec()
    return replace(cfg, policy=replace(base, **{k: getattr(spec, k) for k in names}))


@register_part
@dataclass(frozen=True)
class SchedulingPart(Part):
    """The queue discipline of every replica: fifo, vtc (fair queuing by weighted tokens between
    tenants), priority (levels per tenant, with aging)."""

    key: ClassVar[str] = "scheduling"
    summary: ClassVar[str] = "policy: fifo | vtc | priority, prefill_weight, decode_weight, weights: {tenant: w}, " \
                             "priorities: {tenant: level}, aging_s"
    spec: PO.PolicySpec = PO.PolicySpec()

    @classmethod
    def parse(cls, raw, fld):
        return cls(PO.parse_policy(raw, None, sched_fld=fld))

    def apply(self, ctx):
        return replace(ctx, config=_merge(ctx.config, self.spec, _SCHED))

    def describe(self):
        return f"scheduling: {self.spec.discipline}"


@register_part
@dataclass(frozen=True)
class AdmissionPart(Part):
    """Deadline-slack admission at arrival: admit, defer (listed tenants) or reject."""

    key: ClassVar[str] = "admission"
    summary: ClassVar[str] = "policy: none | deadline_slack, ttft_ms, class_ttft_ms: {class: ms}, route_ms, " \
                             "margin_ms, defer: [tenant, …]"
    spec: PO.PolicySpec = PO.PolicySpec()

    @classmethod
    def parse(cls, raw, fld):
        return cls(PO.parse_policy(None, raw, adm_fld=fld))

    def apply(self, ctx):
        return replace(ctx, config=_merge(ctx.config, self.spec, _ADM))

    def describe(self):
        s = self.spec
        return f"admission: {s.admission}" + (f" (TTFT {s.ttft_ms:g} ms, margin {s.margin_ms:g} ms)"
                                              if s.admission != "none" and s.ttft_ms else "")


assert {f.name for f in fields(PO.PolicySpec)} == set(_SCHED) | set(_ADM)  # every policy field has its part


#: the parts that change the synth configuration alone, never the twin: what a serving-policy
#: sweep varies (the sweeps file, ``cache_sweep``, ``pd_sweep``, ``compare_policies``)
POLICY_PARTS = ("prefixes", "prefix_cache", "disaggregation", "scheduling", "admission")


def policy_scenario(name: str, spec, fld: str = "", *, base_dir=None) -> Scenario:
    """A serving-policy scenario named ``name``: a Scenario already, or its mapping of parts
    (``{prefix_cache: {tokens: 400000}}``; None or ``{}``: nothing changed), each part read
    through the registry; errors name ``fld.key``; ``base_dir``: where a ``prefixes: {from_study:
    PATH}`` is relative to. Only :data:`POLICY_PARTS` (the others need a twin: ``run_scenario``)."""
    if isinstance(spec, Scenario):
        other = [p.key for p in spec.parts if p.key not in POLICY_PARTS]
        if other:
            raise SpecError(f"a serving-policy sweep varies only {', '.join(POLICY_PARTS)}; {', '.join(other)} "
                            "needs a twin", field=fld or str(name), fix="run that scenario with run_scenario")
        return spec
    d = S.mapping(spec, fld or str(name), known=POLICY_PARTS, what=f"scenario {name!r}")
    return Scenario(str(name), "", parse_parts(d, fld, base_dir=base_dir), dict(d))


def on_config(cfg, scenario: Scenario) -> ScenarioContext:
    """``scenario`` applied to the synth configuration ``cfg`` (a twin's ``synth_config()`` or
    any), with no twin behind it: its configuration and the notes its parts add."""
    return apply_parts(scenario.parts, ScenarioContext(None, cfg))
