"""The serving-policy sweeps file (``capplan-sweeps/1``): which prefix-cache settings, which
prefill:decode splits and which admission / scheduling policies to simulate on a twin, for the
scenarios page (notebook 09-scenarios) and ``run_sweeps`` (docs/scenarios.md, "Sweeps file").

.. code-block:: yaml

    format: capplan-sweeps/1
    protocol: {runs: 2, duration_s: 900}           # per C_SLO: pooled runs of this length
    cache:                                          # the first setting is the baseline of the gains
      settings:
        no cache: {}
        system prompts, 2 GB: {prefixes: {kind: system, groups: 4, tokens: 2000, share: 0.9},
                               prefix_cache: {tokens: 6000}}
    pd:
      total_replicas: 8                             # or ratios: [[3, 5], [4, 4]]
      prefill: {gpu: H100-80GB, usd_per_gpu_hour: 2.5}
      decode: {gpu: H100-80GB, usd_per_gpu_hour: 2.5}
      kv_transfer: {bandwidth_gb_s: 50}
    policies:
      load: 1.5                                     # × the twin's C_SLO (or rate_rps: 12)
      policies:
        FIFO: {}
        fair queuing: {scheduling: {policy: vtc}}
        deadline slack: {admission: {ttft_ms: 2000, margin_ms: 500}}
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import spec as S
from ..slo import SLO
from ..synth import disagg as D
from ..synth import policy as PO
from ..synth import prefix as PX
from ..synth.config import SynthConfig
from ..synth.engine import ReplicaParams

FORMAT = "capplan-sweeps/1"
TOP = ("format", "name", "protocol", "cache", "pd", "policies")


@dataclass(frozen=True)
class Sweeps:
    name: str = "sweeps"
    runs: int = 2
    duration_s: float = 900.0
    cache: dict | None = None  # name → {prefixes, prefix_cache} (raw, checked)
    pd: dict | None = None  # raw, checked
    policies: dict | None = None  # {load | rate_rps, duration_s, policies: {name: {scheduling, admission}}}
    raw: dict = field(default_factory=dict, compare=False)


def parse_sweeps(raw) -> Sweeps:
    d = S.mapping(raw, "", known=TOP, what="sweeps file", optional=False)
    fmt = d.get("format", FORMAT)
    if fmt != FORMAT:
        S.fail("format", f"unknown sweeps format {fmt!r}", f"this capplan reads {FORMAT}")
    pr = S.mapping(d.get("protocol"), "protocol", known=("runs", "duration_s"))
    cache = None
    if d.get("cache") is not None:
        c = S.mapping(d["cache"], "cache", known=("settings",))
        st = S.mapping(c.get("settings"), "cache.settings", optional=False,
                       example="{no cache: {}, cached: {prefix_cache: {tokens: 400000}}}")
        cache = {}
        for name, v in st.items():
            f = S.join("cache.settings", name)
            v = S.mapping(v, f, known=("prefixes", "prefix_cache")) or {}
            if v.get("prefixes") is not None:
                PX.parse_workload(v["prefixes"], S.join(f, "prefixes"))
            if v.get("prefix_cache") is not None:
                PX.parse_cache(v["prefix_cache"], S.join(f, "prefix_cache"))
            cache[str(name)] = v
    pd_ = None
    if d.get("pd") is not None:
        p = S.mapping(d["pd"], "pd", known=("total_replicas", "ratios", "prefill", "decode", "kv_transfer", "lanes",
                                            "colocated", "colocated_usd_per_gpu_hour"))
        if ("total_replicas" in p) == ("ratios" in p):
            S.fail("pd", "give pd.total_replicas or pd.ratios, one of them", "e.g. total_replicas: 8")
        if "ratios" in p:
            for i, r in enumerate(S.sequence(p["ratios"], "pd.ratios", nonempty=True, example="[[3, 5], [4, 4]]")):
                if not (isinstance(r, (list, tuple)) and len(r) == 2):
                    S.fail(S.index("pd.ratios", i), "a ratio is [prefill replicas, decode replicas]", "e.g. [3, 5]")
                for j, x in enumerate(r):
                    S.number(x, S.index(S.index("pd.ratios", i), j), integer=True, minimum=1)
        else:
            S.number(p["total_replicas"], "pd.total_replicas", integer=True, minimum=2)
        D.parse_disagg({k: p.get(k, {}) for k in ("prefill", "decode", "kv_transfer")} | {"lanes": p.get("lanes", 1)},
                       "pd", ReplicaParams())
        pd_ = dict(p)
    pol = None
    if d.get("policies") is not None:
        p = S.mapping(d["policies"], "policies", known=("load", "rate_rps", "duration_s", "policies"))
        if ("load" in p) == ("rate_rps" in p):
            S.fail("policies", "give policies.load (× C_SLO) or policies.rate_rps, one of them", "e.g. load: 1.5")
        items = S.mapping(p.get("policies"), "policies.policies", optional=False,
                          example="{FIFO: {}, fair queuing: {scheduling: {policy: vtc}}}")
        for name, v in items.items():
            f = S.join("policies.policies", name)
            v = S.mapping(v, f, known=("scheduling", "admission")) or {}
            PO.parse_policy(v.get("scheduling"), v.get("admission"), sched_fld=S.join(f, "scheduling"),
                            adm_fld=S.join(f, "admission"))
        pol = dict(p)
    return Sweeps(name=str(d.get("name") or "sweeps"),
                  runs=S.number(pr.get("runs", 2), "protocol.runs", integer=True, minimum=1),
                  duration_s=S.duration_s(pr.get("duration_s", 900.0), "protocol.duration_s", above=0.0),
                  cache=cache, pd=pd_, policies=pol, raw=dict(raw))


def load_sweeps(path: str | os.PathLike) -> Sweeps:
    """Read a sweeps file (SpecError with the file, line and field on any problem)."""
    doc = S.document(Path(path).expanduser(), what="sweeps file", fix="see docs/scenarios.md \"Sweeps file\"")
    with doc.located():
        return parse_sweeps(doc.data)


@dataclass(frozen=True)
class SweepResults:
    base_cslo: object = None  # SteadyCSLO of the base configuration (when the policies needed it)
    cache: object = None  # CacheSweep
    pd: object = None  # PDSweep
    policies: object = None  # PolicyComparison


def run_sweeps(cfg: SynthConfig, slo: SLO | str, sweeps: Sweeps, *, workers: int | None = None) -> SweepResults:
    """Simulate every sweep of ``sweeps`` on ``cfg`` (a twin's ``synth_config()``)."""
    from .cachesim import cache_sweep
    from .capacity import capacity_guess, config_cslo
    from .fairsim import compare_policies
    from .pd import pd_sweep

    s = SLO.parse(slo)
    out: dict = {}
    bs = cfg.replica.block_size
    if sweeps.cache:
        settings = {}
        for name, v in sweeps.cache.items():
            px = PX.parse_workload(v["prefixes"], "prefixes") if v.get("prefixes") is not None else None
            pc = PX.parse_cache(v["prefix_cache"], "prefix_cache", block_size=bs) if v.get("prefix_cache") else None
            settings[name] = (px, pc)
        out["cache"] = cache_sweep(cfg, s, settings, runs=sweeps.runs, duration_s=sweeps.duration_s, workers=workers)
    if sweeps.pd:
        p = sweeps.pd
        g = int(cfg.system.get("gpus_per_replica", 1) or 1)
        spec = D.parse_disagg({k: p.get(k, {}) for k in ("prefill", "decode", "kv_transfer")} | {"lanes": p.get("lanes", 1)},
                              "pd", cfg.replica, base_gpus=g, base_gpu=str(cfg.system.get("gpu", "")))
        ratios = [tuple(int(x) for x in r) for r in p["ratios"]] if "ratios" in p else None
        out["pd"] = pd_sweep(cfg, s, prefill=spec.prefill, decode=spec.decode, total_replicas=p.get("total_replicas"),
                             ratios=ratios, transfer=spec.transfer, lanes=spec.lanes,
                             colocated=bool(p.get("colocated", True)),
                             colocated_usd_per_gpu_hour=p.get("colocated_usd_per_gpu_hour"), runs=sweeps.runs,
                             duration_s=sweeps.duration_s, workers=workers)
    if sweeps.policies:
        p = sweeps.policies
        rate = p.get("rate_rps")
        if rate is None:
            base = config_cslo(cfg, s, start=capacity_guess(cfg), runs=sweeps.runs, duration_s=sweeps.duration_s,
                               workers=workers)
            out["base_cslo"] = base
            rate = float(p["load"]) * base.estimate
        pols = {}
        for name, v in p["policies"].items():
            v = v or {}
            spec = PO.parse_policy(v.get("scheduling"), v.get("admission"))
            pols[name] = spec if spec.active else None
        out["policies"] = compare_policies(cfg, s, rate=float(rate), policies=pols,
                                           duration_s=float(p.get("duration_s", sweeps.duration_s)))
    return SweepResults(**out)

