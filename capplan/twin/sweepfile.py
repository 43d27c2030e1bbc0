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
from ..sim.config import SynthConfig
from .parts import DisaggregationPart, on_config, policy_scenario
from .scenario import Scenario
from .table import ScenarioTable

FORMAT = "capplan-sweeps/1"
TOP = ("format", "name", "protocol", "cache", "pd", "policies")


@dataclass(frozen=True)
class Sweeps:
    """A checked sweeps file: the protocol of each C_SLO and, per sweep, its scenarios already
    read by the parts registry (so a bad part fails when the file is read, before any run)."""

    name: str = "sweeps"
    runs: int = 2
    duration_s: float = 900.0
    cache: dict | None = None  # name → Scenario of prefixes / prefix_cache parts
    pd: dict | None = None  # checked; "pools": the DisaggregationPart of prefill, decode, kv_transfer, lanes
    policies: dict | None = None  # {load | rate_rps, duration_s, policies: {name: Scenario of scheduling / admission}}
    raw: dict = field(default_factory=dict, compare=False)


def parse_sweeps(raw, *, base_dir: Path | None = None) -> Sweeps:
    """The sweeps file's mapping checked, each setting and policy read as a scenario through the
    parts registry (``base_dir``: where a ``prefixes: {from_study: PATH}`` path is relative to)."""
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
            S.mapping(v, f, known=("prefixes", "prefix_cache"))
            cache[str(name)] = policy_scenario(str(name), v, f, base_dir=base_dir)
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
        pools = DisaggregationPart.parse({k: p.get(k, {}) for k in ("prefill", "decode", "kv_transfer")}
                                         | {"lanes": p.get("lanes", 1)}, "pd")
        pd_ = dict(p) | {"pools": pools}
    pol = None
    if d.get("policies") is not None:
        p = S.mapping(d["policies"], "policies", known=("load", "rate_rps", "duration_s", "policies"))
        if ("load" in p) == ("rate_rps" in p):
            S.fail("policies", "give policies.load (× C_SLO) or policies.rate_rps, one of them", "e.g. load: 1.5")
        items = S.mapping(p.get("policies"), "policies.policies", optional=False,
                          example="{FIFO: {}, fair queuing: {scheduling: {policy: vtc}}}")
        scenarios = {}
        for name, v in items.items():
            f = S.join("policies.policies", name)
            S.mapping(v, f, known=("scheduling", "admission"))
            scenarios[str(name)] = policy_scenario(str(name), v, f)
        pol = dict(p) | {"policies": scenarios}
    return Sweeps(name=str(d.get("name") or "sweeps"),
                  runs=S.number(pr.get("runs", 2), "protocol.runs", integer=True, minimum=1),
                  duration_s=S.duration_s(pr.get("duration_s", 900.0), "protocol.duration_s", above=0.0),
                  cache=cache, pd=pd_, policies=pol, raw=dict(raw))


def load_sweeps(path: str | os.PathLike) -> Sweeps:
    """Read a sweeps file (SpecError with the file, line and field on any problem)."""
    doc = S.document(Path(path).expanduser(), what="sweeps file", fix="see docs/scenarios.md \"Sweeps file\"")
    with doc.located():
        return parse_sweeps(doc.data, base_dir=Path(path).expanduser().parent)


@dataclass(frozen=True)
class SweepResults:
    base_cslo: object = None  # SteadyCSLO of the base configuration (when the policies needed it)
    cache: ScenarioTable | None = None
    pd: ScenarioTable | None = None
    policies: ScenarioTable | None = None


def run_sweeps(cfg: SynthConfig, slo: SLO | str, sweeps: Sweeps, *, workers: int | None = None) -> SweepResults:
    """Simulate every sweep of ``sweeps`` on ``cfg`` (a twin's ``synth_config()``)."""
    from .cachesim import cache_sweep
    from .capacity import capacity_guess, config_cslo
    from .fairsim import compare_policies
    from .pd import pd_sweep

    s = SLO.parse(slo)
    out: dict = {}
    if sweeps.cache:
        out["cache"] = cache_sweep(cfg, s, sweeps.cache, runs=sweeps.runs, duration_s=sweeps.duration_s,
                                   workers=workers)
    if sweeps.pd:
        p = sweeps.pd
        spec = on_config(cfg, Scenario("pd", "", (p["pools"],))).config.disagg  # the pools on cfg's replica
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
        out["policies"] = compare_policies(cfg, s, rate=float(rate), policies=p["policies"],
                                           duration_s=float(p.get("duration_s", sweeps.duration_s)))
    return SweepResults(**out)
