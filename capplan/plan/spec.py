"""The plan specification: the frozen, validated :class:`PlanSpec` and its sections.

What a capacity plan is asked for (demand, where capacity comes from, the replica group,
failure domains, rollouts, autoscaling, prices), read from YAML (see ``templates/plan.yaml``)
or a mapping by :func:`load_plan_spec`. Every bad, missing, unknown or contradictory value
raises :class:`~capplan.errors.SpecError` naming the field and a fix. Specs are immutable;
:meth:`PlanSpec.with_` makes a validated copy from the flat names in ``PlanSpec.ALIASES``::

    spec = load_plan_spec("templates/plan.yaml")
    spec2 = spec.with_(peak_rps=500, policy="zone", price_usd_per_gpu_hour=2.1)

The sizing and costing that turn a spec into a plan live in :mod:`capplan.plan`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

from .. import spec as S
from ..errors import SpecError
from .periods import parse_start
from ..slo import CSLO_CONFIDENCE, CSLO_REPS, CSLO_SEED, MIN_REPS, SLO, SLOClasses, load_slo_file

POLICIES = ("node", "zone", "n_plus_k", "none")
READY_PARTS = ("provision", "image", "weights", "rank_init", "compile", "warmup", "register")
CAPACITY_USES = ("lower_bound", "estimate")
BILLING = ("node", "gpu")


# ----------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class DemandSpec:
    """Peak offered rate (per SLO class, summed into one pool), or a demand history to
    forecast from; uncertainty u; planning horizon in quarters."""

    SECTION: ClassVar[str] = "demand"
    peak_rps: tuple[tuple[str, float], ...] = ()  # (class, req/s) pairs
    history: str | None = None  # CSV/parquet of timestamped request rates
    history_time_column: str = "t"
    history_rate_column: str = "rps"
    #: u, a fraction (plan for peak × (1 + u)); ``"backtest"`` in the YAML measures it on the
    #: history (``forecast.backtest``): the ``backtest_quantile`` of actual / planned peak − 1
    uncertainty: float = 0.0
    horizon_quarters: int = 1
    growth_per_quarter: float = 0.0  # only without a history
    interval: float = 0.95  # forecast prediction-interval level; the plan uses its upper bound
    mean_to_peak: float | None = None  # mean offered rate / peak, for monthly volumes
    output_tokens_per_request: float | None = None  # without a study (or to override it)
    #: demand as a daily token volume instead of a peak rate: {input: tokens/day, output: ...}
    tokens_per_day: tuple[tuple[str, float], ...] = ()
    input_tokens_per_request: float | None = None  # without a study (or to override it)
    backtest_quantile: float = 0.9  # with uncertainty: backtest
    #: production's arrival process, for the burst factor (docs/plan.md, "Production burstiness"):
    #: one of trace (file), per_second (CSV of counts, ``column``), dispersion or cv; window_s, quantile
    arrivals: Any = None
    #: the back-test u was measured by (``forecast.BackTest``); not a YAML key
    backtest: Any = field(default=None, compare=False, repr=False, metadata={"yaml": False})

    def __post_init__(self):
        s = self.SECTION
        if not isinstance(self.peak_rps, tuple):
            object.__setattr__(self, "peak_rps", _classes(self.peak_rps, f"{s}.peak_rps"))
        for cls, rps in self.peak_rps:
            f = f"{s}.peak_rps" + (f".{cls}" if cls != "all" else "")
            S.number(rps, f, above=0.0, example="380")
        if self.peak_rps and self.history:
            S.fail(f"{s}.history", "demand has both peak_rps and history",
                   "give either a peak (peak_rps) or a history to forecast from, not both")
        if not isinstance(self.tokens_per_day, tuple):
            object.__setattr__(self, "tokens_per_day", _token_volume(self.tokens_per_day, f"{s}.tokens_per_day"))
        given = [k for k, v in (("peak_rps", self.peak_rps), ("history", self.history),
                                ("tokens_per_day", self.tokens_per_day)) if v]
        if len(given) > 1:
            S.fail(f"{s}.{given[1]}", f"demand has both {given[0]} and {given[1]}",
                   "give one of peak_rps, history or tokens_per_day")
        if not given:
            S.fail(f"{s}.peak_rps", "demand needs peak_rps (req/s), history (a file of request rates) "
                   "or tokens_per_day (a daily token volume)",
                   "add peak_rps: 380 (or peak_rps: {interactive: 300, batch: 80}), history: demand.csv, "
                   "or tokens_per_day: {input: 2.0e9, output: 4.0e8}")
        if self.tokens_per_day and self.mean_to_peak is None:
            S.fail(f"{s}.mean_to_peak", "a daily token volume needs mean_to_peak to turn the day's mean "
                   "rate into a peak", "add mean_to_peak: 0.6 (mean offered rate / peak rate)")
        S.text(self.history, f"{s}.history")
        S.text(self.history_time_column, f"{s}.history_time_column", optional=False)
        S.text(self.history_rate_column, f"{s}.history_rate_column", optional=False)
        S.number(self.backtest_quantile, f"{s}.backtest_quantile", above=0.5, below=1.0, example="0.9")
        if isinstance(self.uncertainty, str) and self.uncertainty.strip().lower() in ("backtest", "back-test"):
            self._measure_uncertainty()
        elif isinstance(self.uncertainty, str):
            S.fail(f"{s}.uncertainty", f"{s}.uncertainty must be a number or backtest, got {self.uncertainty!r}",
                   "write a fraction (uncertainty: 0.2 plans for peak × 1.2) or uncertainty: backtest to "
                   "measure it on the demand history")
        u = S.number(self.uncertainty, f"{s}.uncertainty", minimum=0.0, example="0.2")
        if u > 3.0:
            S.fail(f"{s}.uncertainty", f"{s}.uncertainty {u:g} means planning for {1 + u:g}× the peak",
                   "u is a fraction: 0.2 plans for peak × 1.2 (+20 %); use a value ≤ 3")
        S.number(self.horizon_quarters, f"{s}.horizon_quarters", integer=True, minimum=1, maximum=40,
                 example="4")
        S.number(self.growth_per_quarter, f"{s}.growth_per_quarter", above=-1.0, example="0.1")
        if self.history and self.growth_per_quarter:
            S.fail(f"{s}.growth_per_quarter", "growth_per_quarter is for a fixed peak; with a history "
                   "the forecast gives the growth", "remove growth_per_quarter or history")
        S.number(self.interval, f"{s}.interval", above=0.5, maximum=0.999, example="0.95")
        S.number(self.mean_to_peak, f"{s}.mean_to_peak", above=0.0, maximum=1.0, optional=True,
                 example="0.6")
        S.number(self.output_tokens_per_request, f"{s}.output_tokens_per_request", above=0.0,
                 optional=True, example="250")
        S.number(self.input_tokens_per_request, f"{s}.input_tokens_per_request", above=0.0,
                 optional=True, example="1200")
        if self.arrivals is not None and not isinstance(self.arrivals, tuple):
            object.__setattr__(self, "arrivals", _arrivals(self.arrivals, f"{s}.arrivals"))

    def _measure_uncertainty(self) -> None:
        """``uncertainty: backtest``: u from a rolling-origin back-test of the forecast on the
        history (same horizon and interval as the plan); refused without a history or with one
        too short to back-test."""
        s = self.SECTION
        if not self.history:
            S.fail(f"{s}.uncertainty", "uncertainty: backtest measures u on the demand history, but the demand "
                   "has no history", "add demand.history (a file of request rates), or give u as a number (0.2)")
        S.number(self.horizon_quarters, f"{s}.horizon_quarters", integer=True, minimum=1, maximum=40, example="4")
        S.number(self.interval, f"{s}.interval", above=0.5, maximum=0.999, example="0.95")
        from .forecast import backtest_from_file

        bt = backtest_from_file(self.history, time_column=self.history_time_column,
                                rate_column=self.history_rate_column, horizon_quarters=self.horizon_quarters,
                                interval=self.interval, quantile=self.backtest_quantile)
        if bt.u > 3.0:
            S.fail(f"{s}.uncertainty", f"the back-test measured u = {bt.u:.3g}: the forecast's planned peak fell "
                   f"short by more than 3× ({bt.sentence})", "check the history (units, a level shift), or give "
                   "u as a number")
        object.__setattr__(self, "uncertainty", bt.u)
        object.__setattr__(self, "backtest", bt)

    @property
    def backtested(self) -> bool:
        """Is u the back-test's (not a number typed in the spec, or moved on a slider since)?"""
        return self.backtest is not None and self.uncertainty == self.backtest.u

    @property
    def uncertainty_source(self) -> str:
        """Where u came from, in words."""
        return self.backtest.sentence if self.backtested else "given in the spec"

    @property
    def total_peak_rps(self) -> float:
        return float(sum(r for _, r in self.peak_rps))


def _arrivals(value, field_: str) -> tuple[tuple[str, Any], ...]:
    """``demand.arrivals`` checked and frozen as (key, value) pairs: exactly one source."""
    from ..burst import ARRIVAL_KEYS

    m = dict(S.mapping(value, field_, known=ARRIVAL_KEYS, example="{trace: prod.csv, window_s: 1}"))
    src = [k for k in ("trace", "per_second", "dispersion", "cv") if m.get(k) is not None]
    if len(src) != 1:
        S.fail(field_, "demand.arrivals needs exactly one of trace, per_second, dispersion or cv"
               + (f" (got {', '.join(src)})" if src else ""),
               "e.g. arrivals: {trace: production.csv} or arrivals: {cv: 2.0}")
    for k in ("trace", "per_second", "column", "format"):
        S.text(m.get(k), f"{field_}.{k}")
    S.number(m.get("dispersion"), f"{field_}.dispersion", above=0.0, optional=True, example="4.0")
    S.number(m.get("cv"), f"{field_}.cv", above=0.0, optional=True, example="2.0")
    m["window_s"] = float(S.number(m.get("window_s", 1.0), f"{field_}.window_s", above=0.0, example="1"))
    m["quantile"] = float(S.number(m.get("quantile", 0.99), f"{field_}.quantile", above=0.5, below=1.0,
                                   example="0.99"))
    return tuple((k, m[k]) for k in ARRIVAL_KEYS if m.get(k) is not None)


def _token_volume(value, field_: str) -> tuple[tuple[str, float], ...]:
    if value is None or value == ():
        return ()
    d = S.mapping(value, field_, known=("input", "output"), example="{input: 2.0e9, output: 4.0e8}")
    return tuple((k, S.number(v, S.join(field_, k), above=0.0, example="2.0e9")) for k, v in d.items())


def _classes(value, field_: str) -> tuple[tuple[str, float], ...]:
    if value is None or value == ():
        return ()
    if isinstance(value, Mapping):
        if not value:
            S.fail(field_, f"{field_} has no classes", "e.g. peak_rps: {interactive: 300, batch: 80}")
        return tuple((str(k), v) for k, v in value.items())
    if isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        return tuple((str(k), v) for k, v in value)
    return (("all", value),)


@dataclass(frozen=True)
class CapacitySpec:
    """Where C_SLO (req/s per replica group) comes from: a study + SLO or a number."""

    SECTION: ClassVar[str] = "capacity"
    source: str = "study"  # study | number
    rps_per_group: float | None = None
    use: str = "lower_bound"  # lower_bound | estimate (of the study's C_SLO)
    #: the measured C_SLO's settings (``capplan.slo``): a spec that keeps them plans on the number
    #: ``capplan envelope`` prints
    confidence: float = CSLO_CONFIDENCE
    reps: int = CSLO_REPS  # the lower bound is a 5 % quantile: 200 replicates read it ~0.5 % high
    seed: int = CSLO_SEED
    good_fraction: float | None = None  # without a study: SLO-meeting share of offered requests
    #: plan with a lower bound the study cannot support honestly (``Envelope.honesty``), saying
    #: so in the plan; without it such a plan is refused (docs/envelope.md)
    accept_optimistic: bool = False

    def __post_init__(self):
        s = self.SECTION
        S.flag(self.accept_optimistic, f"{s}.accept_optimistic")
        S.choice(self.source, f"{s}.source", ("study", "number"))
        S.number(self.rps_per_group, f"{s}.rps_per_group", above=0.0, optional=True, example="42")
        if self.source == "number" and self.rps_per_group is None:
            S.fail(f"{s}.rps_per_group", "capacity.source is number but capacity.rps_per_group is missing",
                   "add rps_per_group: 42 (req/s one replica group serves within the SLO)")
        S.choice(self.use, f"{s}.use", CAPACITY_USES)
        S.number(self.confidence, f"{s}.confidence", above=0.5, maximum=0.999, example="0.95")
        S.number(self.reps, f"{s}.reps", integer=True, minimum=MIN_REPS, example="200")
        S.number(self.seed, f"{s}.seed", integer=True, minimum=0, example="0")
        S.number(self.good_fraction, f"{s}.good_fraction", above=0.0, maximum=1.0, optional=True,
                 example="0.99")


@dataclass(frozen=True)
class GroupSpec:
    """The replica group: GPUs per replica (TP × PP) and GPUs per node."""

    SECTION: ClassVar[str] = "replica_group"
    gpus_per_replica: int | None = None
    tp: int | None = None
    pp: int | None = None
    gpus_per_node: int = 8

    def __post_init__(self):
        s = self.SECTION
        g = S.number(self.gpus_per_replica, f"{s}.gpus_per_replica", integer=True, minimum=1,
                     optional=True, example="4")
        tp = S.number(self.tp, f"{s}.tp", integer=True, minimum=1, optional=True, example="4")
        pp = S.number(self.pp, f"{s}.pp", integer=True, minimum=1, optional=True, example="1")
        S.number(self.gpus_per_node, f"{s}.gpus_per_node", integer=True, minimum=1, example="8")
        if g is not None and (tp or pp) and g != (tp or 1) * (pp or 1):
            S.fail(f"{s}.gpus_per_replica", f"gpus_per_replica {g} ≠ tp × pp = {(tp or 1) * (pp or 1)}",
                   "give gpus_per_replica or tp/pp, or make them agree")

    @property
    def gpus(self) -> int | None:
        if self.gpus_per_replica is not None:
            return int(self.gpus_per_replica)
        if self.tp is not None or self.pp is not None:
            return int(self.tp or 1) * int(self.pp or 1)
        return None


@dataclass(frozen=True)
class FailureSpec:
    """Failure domains and which loss the plan must survive."""

    SECTION: ClassVar[str] = "failure"
    policy: str = "node"  # node | zone | n_plus_k | none
    zones: tuple[str, ...] = ("a",)
    k: int = 1  # for n_plus_k
    nodes_available: int | None = None

    def __post_init__(self):
        s = self.SECTION
        S.choice(self.policy, f"{s}.policy", POLICIES)
        if not isinstance(self.zones, tuple):
            object.__setattr__(self, "zones", _zones(self.zones, f"{s}.zones"))
        if not self.zones:
            S.fail(f"{s}.zones", "failure.zones is empty",
                   "give a zone count (zones: 3) or names (zones: [a, b, c])")
        S.number(self.k, f"{s}.k", integer=True, minimum=1 if self.policy == "n_plus_k" else 0, example="2")
        S.number(self.nodes_available, f"{s}.nodes_available", integer=True, minimum=1, optional=True,
                 example="40")
        if self.policy == "zone" and len(self.zones) < 2:
            S.fail(f"{s}.zones",
                   "policy zone needs at least 2 zones (losing the only zone loses everything)",
                   "list the zones (zones: [a, b, c]) or use policy: node")
        if self.nodes_available is not None and len(self.zones) > self.nodes_available:
            S.fail(f"{s}.zones", f"{len(self.zones)} zones but only {self.nodes_available} nodes available",
                   "use no more zones than nodes, or raise nodes_available")


def _zones(value, field_: str) -> tuple[str, ...]:
    if isinstance(value, bool):
        S.fail(field_, f"{field_} must be a count or a list of names, got {value!r}", "zones: 3")
    if isinstance(value, int):
        if value < 1:
            S.fail(field_, f"{field_} must be ≥ 1, got {value}", "zones: 3")
        if value > 26:
            return tuple(f"z{i + 1}" for i in range(value))
        return tuple("abcdefghijklmnopqrstuvwxyz"[i] for i in range(value))
    if isinstance(value, (list, tuple)):
        names = tuple(str(v) for v in value)
        if len(set(names)) != len(names):
            S.fail(field_, f"{field_} has duplicate zone names: {list(names)}",
                   "give each zone a unique name")
        return names
    S.fail(field_, f"{field_} must be a count or a list of names, got {value!r}", "zones: [a, b, c]")


@dataclass(frozen=True)
class RolloutSpec:
    """Rolling update: groups added before old ones go (surge), groups down at once
    (unavailable), canary groups on the new version first."""

    SECTION: ClassVar[str] = "rollout"
    max_surge: int = 1
    max_unavailable: int = 0
    canary_groups: int = 0

    def __post_init__(self):
        s = self.SECTION
        for f in ("max_surge", "max_unavailable", "canary_groups"):
            S.number(getattr(self, f), f"{s}.{f}", integer=True, minimum=0, example="1")
        if self.max_surge == 0 and self.max_unavailable == 0:
            S.fail(f"{s}.max_unavailable",
                   "max_surge and max_unavailable are both 0: a rollout could never progress",
                   "allow max_surge: 1 (extra group during rollouts) or max_unavailable: 1")

    @property
    def loss_groups(self) -> int:
        """Groups out of service in the worst step: unavailable ones, or canaries that surge
        does not cover (the plan does not count on a canary's capacity)."""
        return max(self.max_unavailable, self.canary_groups - self.max_surge, 0)


@dataclass(frozen=True)
class AutoscalingSpec:
    """Replica ready time as its parts, expected burst growth, warm floor."""

    SECTION: ClassVar[str] = "autoscaling"
    ready_time_s: tuple[tuple[str, float], ...] = ()
    burst_growth_rps_per_s: float = 0.0
    warm_floor_groups: int = 0

    def __post_init__(self):
        s = self.SECTION
        if not isinstance(self.ready_time_s, tuple):
            v = self.ready_time_s
            if not isinstance(v, Mapping):
                S.fail(f"{s}.ready_time_s",
                       f"{s}.ready_time_s must be a mapping of parts to seconds, got {S.describe(v)}",
                       "e.g. ready_time_s: {provision: 90, image: 40, weights: 60, rank_init: 10, "
                       "compile: 30, warmup: 20, register: 5}")
            object.__setattr__(self, "ready_time_s", tuple((str(k), x) for k, x in v.items()))
        for part, secs in self.ready_time_s:
            if part not in READY_PARTS:
                near = S.did_you_mean(part, READY_PARTS)
                S.fail(f"{s}.ready_time_s.{part}", f"unknown ready-time part {part!r}"
                       + (f" (did you mean {near!r}?)" if near else ""),
                       "parts: " + ", ".join(READY_PARTS))
            S.number(secs, f"{s}.ready_time_s.{part}", minimum=0.0, example="30")
        S.number(self.burst_growth_rps_per_s, f"{s}.burst_growth_rps_per_s", minimum=0.0, example="0.5")
        S.number(self.warm_floor_groups, f"{s}.warm_floor_groups", integer=True, minimum=0, example="2")

    @property
    def ready_s(self) -> float:
        return float(sum(x for _, x in self.ready_time_s))


@dataclass(frozen=True)
class PriceSpec:
    """Prices: $/GPU-hour, overhead % (CPU, network, storage, control plane), $/kWh, PUE."""

    SECTION: ClassVar[str] = "prices"
    usd_per_gpu_hour: float | None = None
    overhead_pct: float = 0.0
    usd_per_kwh: float = 0.0
    pue: float = 1.0
    billing: str = "node"  # node: whole nodes are paid; gpu: only the GPUs of the groups
    gpu_power_w: float | None = None  # mean board power per GPU when the study has no telemetry

    def __post_init__(self):
        s = self.SECTION
        S.number(self.usd_per_gpu_hour, f"{s}.usd_per_gpu_hour", minimum=0.0, example="3.5")
        S.number(self.overhead_pct, f"{s}.overhead_pct", minimum=0.0, maximum=1000.0, example="15")
        S.number(self.usd_per_kwh, f"{s}.usd_per_kwh", minimum=0.0, example="0.12")
        S.number(self.pue, f"{s}.pue", minimum=1.0, maximum=5.0, example="1.3")
        S.choice(self.billing, f"{s}.billing", BILLING)
        S.number(self.gpu_power_w, f"{s}.gpu_power_w", above=0.0, optional=True, example="550")


@dataclass(frozen=True)
class ModelSpec:
    """The served model and GPU (catalogue names) for the KV-memory bound, and the forecast
    context length per sequence; docs/mix.md, "KV memory"."""

    SECTION: ClassVar[str] = "model"
    name: str | None = None  # catalogue model; default the study's system.model when listed
    gpu: str | None = None  # catalogue GPU; default the study's system.gpu when listed
    context_tokens: int | None = None  # forecast context per sequence (input + output tokens)
    kv_dtype: str = "bf16"
    weight_bytes_per_param: float = 2.0
    activation_reserve: float = 0.10  # fraction of GPU memory for activations, CUDA graphs, runtime
    block_tokens: int = 16
    catalogue: str | None = None  # default templates/catalogue.yaml
    mean_e2e_s: float | None = None  # without a study: mean time in system at C_SLO (Little's law)

    def __post_init__(self):
        s = self.SECTION
        S.text(self.name, f"{s}.name", example="llama-3.1-70b")
        S.text(self.gpu, f"{s}.gpu", example="h100-80gb")
        S.number(self.context_tokens, f"{s}.context_tokens", integer=True, minimum=1, optional=True,
                 example="8192")
        S.text(self.kv_dtype, f"{s}.kv_dtype", optional=False, example="bf16")
        S.number(self.weight_bytes_per_param, f"{s}.weight_bytes_per_param", above=0.0, example="2")
        S.number(self.activation_reserve, f"{s}.activation_reserve", minimum=0.0, below=1.0, example="0.1")
        S.number(self.block_tokens, f"{s}.block_tokens", integer=True, minimum=1, example="16")
        S.text(self.catalogue, f"{s}.catalogue")
        S.number(self.mean_e2e_s, f"{s}.mean_e2e_s", above=0.0, optional=True, example="12")


@dataclass(frozen=True)
class PowerSpec:
    """Peak power of the plan against a rack and/or row power cap; docs/mix.md, "Power"."""

    SECTION: ClassVar[str] = "power"
    gpu_peak_w: float | None = None  # default: the study's highest GPU power sample, else the GPU's TDP
    node_overhead_w: float = 0.0  # CPUs, NICs, fans, … of a node at peak (not GPU boards)
    rack_cap_kw: float | None = None
    nodes_per_rack: int | None = None
    row_cap_kw: float | None = None

    def __post_init__(self):
        s = self.SECTION
        S.number(self.gpu_peak_w, f"{s}.gpu_peak_w", above=0.0, optional=True, example="700")
        S.number(self.node_overhead_w, f"{s}.node_overhead_w", minimum=0.0, example="2000")
        S.number(self.rack_cap_kw, f"{s}.rack_cap_kw", above=0.0, optional=True, example="40")
        S.number(self.nodes_per_rack, f"{s}.nodes_per_rack", integer=True, minimum=1, optional=True,
                 example="4")
        S.number(self.row_cap_kw, f"{s}.row_cap_kw", above=0.0, optional=True, example="400")
        if self.rack_cap_kw is not None and self.nodes_per_rack is None:
            S.fail(f"{s}.nodes_per_rack", "a rack power cap needs nodes_per_rack",
                   "add nodes_per_rack: 4 (nodes planned into one rack)")


@dataclass(frozen=True)
class MixSpec:
    """Plan at production's mix: the study reweighted to a target (docs/mix.md, "Reweighting")."""

    SECTION: ClassVar[str] = "mix"
    target: str | None = None  # production trace or bucket table (relative to the spec file)
    period: str = "peak_hour"  # day | peak_hour (of a timestamped trace)
    input_edges: tuple[float, ...] = (1024.0, 4096.0)
    output_edges: tuple[float, ...] = ()
    by: tuple[str, ...] = ()  # tenant, slo_class
    #: target: plan with the reweighted C_SLO; twin: with the twin's C_SLO at the target mix
    #: (needs ``twin``); tested: plan at the tested mix, the target's number beside it
    plan_on: str = "target"
    drop_untested: bool = False
    #: twin.yaml (relative to the spec file): the report's mix page also runs the target mix
    #: through it (docs/mix.md, "The twin at the target mix"); with ``plan_on: twin`` the plan
    #: sizes on it
    twin: str | None = None

    def __post_init__(self):
        s = self.SECTION
        S.text(self.target, f"{s}.target", example="prod.parquet")
        S.text(self.twin, f"{s}.twin", example="twin.yaml")
        S.choice(self.period, f"{s}.period", ("day", "peak_hour"))
        S.choice(self.plan_on, f"{s}.plan_on", ("target", "twin", "tested"))
        if self.plan_on == "twin" and (self.twin is None or self.target is None):
            S.fail(f"{s}.plan_on", "mix.plan_on: twin plans on the twin's C_SLO at the target mix, but the spec has "
                   + ("no mix.twin" if self.twin is None else "no mix.target"),
                   fix="add mix.twin: twin.yaml (capplan twin fit) and mix.target, or plan_on: target / tested",
                   example="mix: {target: prod.parquet, twin: twin.yaml, plan_on: twin}")
        S.flag(self.drop_untested, f"{s}.drop_untested")
        for name in ("input_edges", "output_edges", "by"):
            v = getattr(self, name)
            if not isinstance(v, tuple):
                v = tuple(S.sequence(v, f"{s}.{name}", example="[1024, 4096]"))
                object.__setattr__(self, name, v)
        for i, e in enumerate(self.input_edges + self.output_edges):
            S.number(e, f"{s}.edges[{i}]", above=0.0, example="1024")
        for i, d in enumerate(self.by):
            S.choice(d, S.index(f"{s}.by", i), ("tenant", "slo_class"))

    def buckets(self):
        """The cells the target mix is counted in (``capplan.mix.Buckets``): the plan's and the
        mix page's alike."""
        from ..mix.target import Buckets

        return Buckets(input_edges=self.input_edges, output_edges=self.output_edges, tenant="tenant" in self.by,
                       slo_class="slo_class" in self.by)


_SECTIONS: dict[str, type] = {
    "demand": DemandSpec, "capacity": CapacitySpec, "replica_group": GroupSpec,
    "failure": FailureSpec, "rollout": RolloutSpec, "autoscaling": AutoscalingSpec,
    "prices": PriceSpec, "model": ModelSpec, "power": PowerSpec, "mix": MixSpec,
}
_ATTR = {"demand": "demand", "capacity": "capacity", "replica_group": "group", "failure": "failure",
         "rollout": "rollout", "autoscaling": "autoscaling", "prices": "prices", "model": "model",
         "power": "power", "mix": "mix"}


@dataclass(frozen=True)
class PlanSpec:
    """A validated plan specification (frozen). Change it with :meth:`with_`."""

    demand: DemandSpec
    prices: PriceSpec
    capacity: CapacitySpec = field(default_factory=CapacitySpec)
    group: GroupSpec = field(default_factory=GroupSpec)
    failure: FailureSpec = field(default_factory=FailureSpec)
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    autoscaling: AutoscalingSpec = field(default_factory=AutoscalingSpec)
    name: str = "plan"
    tenant: str | None = None
    slo: SLO | None = None
    start: Any = None  # first day of the plan (datetime.date); None: the next calendar quarter
    source: str | None = None  # file the spec was read from
    model: ModelSpec = field(default_factory=ModelSpec)
    power: PowerSpec = field(default_factory=PowerSpec)
    mix: MixSpec = field(default_factory=MixSpec)
    #: one SLO per slo_class (``slo_file:`` or ``slo_classes:`` in the YAML); docs/mix.md
    slo_classes: SLOClasses | None = None
    #: the keys the spec's YAML or mapping set (``slo``, ``capacity.reps``, …; ``with_`` adds the
    #: ones it changes), so a resolved input can say whether a value is the spec's or capplan's
    #: default (``capplan.plan.inputs``); a PlanSpec built field by field in Python records none
    file_keys: frozenset = field(default=frozenset(), compare=False, repr=False)

    # flat name -> (section attribute, field)
    ALIASES: ClassVar[dict[str, tuple[str, str]]] = {
        "peak_rps": ("demand", "peak_rps"), "uncertainty": ("demand", "uncertainty"),
        "horizon_quarters": ("demand", "horizon_quarters"),
        "growth_per_quarter": ("demand", "growth_per_quarter"),
        "mean_to_peak": ("demand", "mean_to_peak"),
        "output_tokens_per_request": ("demand", "output_tokens_per_request"),
        "capacity_rps_per_group": ("capacity", "rps_per_group"), "capacity_use": ("capacity", "use"),
        "confidence": ("capacity", "confidence"), "good_fraction": ("capacity", "good_fraction"),
        "accept_optimistic": ("capacity", "accept_optimistic"),
        "gpus_per_replica": ("group", "gpus_per_replica"), "gpus_per_node": ("group", "gpus_per_node"),
        "policy": ("failure", "policy"), "zones": ("failure", "zones"), "k": ("failure", "k"),
        "nodes_available": ("failure", "nodes_available"),
        "max_surge": ("rollout", "max_surge"), "max_unavailable": ("rollout", "max_unavailable"),
        "canary_groups": ("rollout", "canary_groups"),
        "ready_time_s": ("autoscaling", "ready_time_s"),
        "burst_growth_rps_per_s": ("autoscaling", "burst_growth_rps_per_s"),
        "warm_floor_groups": ("autoscaling", "warm_floor_groups"),
        "price_usd_per_gpu_hour": ("prices", "usd_per_gpu_hour"),
        "overhead_pct": ("prices", "overhead_pct"), "usd_per_kwh": ("prices", "usd_per_kwh"),
        "pue": ("prices", "pue"), "billing": ("prices", "billing"), "gpu_power_w": ("prices", "gpu_power_w"),
        "tokens_per_day": ("demand", "tokens_per_day"),
        "input_tokens_per_request": ("demand", "input_tokens_per_request"),
        "context_tokens": ("model", "context_tokens"), "kv_dtype": ("model", "kv_dtype"),
        "activation_reserve": ("model", "activation_reserve"),
        "gpu_peak_w": ("power", "gpu_peak_w"), "node_overhead_w": ("power", "node_overhead_w"),
        "rack_cap_kw": ("power", "rack_cap_kw"), "nodes_per_rack": ("power", "nodes_per_rack"),
        "row_cap_kw": ("power", "row_cap_kw"),
    }

    def __post_init__(self):
        S.text(self.name, "name", optional=False)
        S.text(self.tenant, "tenant")
        if self.slo is not None and not isinstance(self.slo, SLO):
            object.__setattr__(self, "slo", SLO.parse(self.slo))
        object.__setattr__(self, "start", parse_start(self.start))
        if self.start is not None and self.demand.history:
            S.fail("start", "start is for a fixed peak; with a demand history the plan covers the "
                 "calendar quarters after its last observation", "remove start or demand.history")
        if self.slo_classes is not None and not isinstance(self.slo_classes, SLOClasses):
            object.__setattr__(self, "slo_classes", load_slo_file(self.slo_classes))

    def with_(self, **changes) -> "PlanSpec":
        """A copy with flat-named changes, validated again. ``peak_rps`` with several SLO
        classes scales every class in proportion; ``slo``/``name``/``tenant`` are top level.
        Example: ``spec.with_(peak_rps=500, policy="zone", price_usd_per_gpu_hour=2.1)``."""
        top = {k: changes.pop(k) for k in ("slo", "name", "tenant", "slo_classes", "start") if k in changes}
        if "slo" in top and top["slo"] is not None:
            top["slo"] = SLO.parse(top["slo"])
        if "slo_classes" in top and top["slo_classes"] is not None:
            top["slo_classes"] = load_slo_file(top["slo_classes"])
        by_section: dict[str, dict] = {}
        for key, value in changes.items():
            if key not in self.ALIASES:
                near = S.did_you_mean(key, self.ALIASES)
                S.fail(key, f"unknown plan parameter {key!r}"
                       + (f" (did you mean {near!r}?)" if near else ""),
                       "known: " + ", ".join(sorted(self.ALIASES)))
            sec, f = self.ALIASES[key]
            if key == "peak_rps":
                value = self._scaled_peaks(value)
            if key == "capacity_rps_per_group" and value is not None:
                by_section.setdefault("capacity", {})["source"] = "number"
            by_section.setdefault(sec, {})[f] = value
        new = {sec: dataclasses.replace(getattr(self, sec), **kw) for sec, kw in by_section.items()}
        sections = {attr: key for key, attr in _ATTR.items()}
        keys = self.file_keys | set(top) | {f"{sections[sec]}.{f}" for sec, kw in by_section.items() for f in kw}
        return dataclasses.replace(self, **new, **top, file_keys=frozenset(keys))

    def _scaled_peaks(self, value):
        if isinstance(value, (Mapping, list, tuple)):
            return value
        S.number(value, "demand.peak_rps", above=0.0, example="380")
        classes = self.demand.peak_rps
        total = sum(r for _, r in classes)
        if len(classes) <= 1 or total <= 0:
            return ((classes[0][0] if classes else "all", float(value)),)
        return tuple((c, r * float(value) / total) for c, r in classes)

    def to_dict(self) -> dict:
        """Plain mapping in the YAML layout (for provenance and round trips)."""
        out: dict = {"name": self.name}
        if self.tenant is not None:
            out["tenant"] = self.tenant
        if self.slo is not None:
            out["slo"] = str(self.slo)
        if self.start is not None:
            out["start"] = self.start.isoformat()
        if self.slo_classes is not None:
            out["slo_classes"] = self.slo_classes.to_dict()
        for key, attr in _ATTR.items():
            sec = getattr(self, attr)
            d = {}
            for f in fields(sec):
                if not f.metadata.get("yaml", True):
                    continue
                v = getattr(sec, f.name)
                if f.name in ("peak_rps", "ready_time_s", "tokens_per_day") or (f.name == "arrivals" and v):
                    v = {a: b for a, b in v}
                elif isinstance(v, tuple):
                    v = list(v)
                d[f.name] = v
            out[key] = d
        return out

    def flat(self) -> dict[str, Any]:
        """Flat ``section.field -> value`` view (Assumptions sheet, provenance)."""
        out = {}
        for k, v in self.to_dict().items():
            if isinstance(v, dict):
                for kk, vv in v.items():
                    if isinstance(vv, dict):
                        for k3, v3 in vv.items():
                            out[f"{k}.{kk}.{k3}"] = v3
                    else:
                        out[f"{k}.{kk}"] = vv
            else:
                out[k] = v
        return out


_TOP_KEYS = ("name", "tenant", "slo", "slo_file", "slo_classes", "start") + tuple(_SECTIONS)


def load_plan_spec(path_or_dict, *, base_dir: str | os.PathLike | None = None) -> PlanSpec:
    """Read and validate a plan spec (YAML file path or mapping). Raises SpecError naming the
    field, its line in the file and a fix for every bad, missing, unknown or contradictory
    value. A relative ``demand.history`` path is resolved against the spec file's folder (or
    ``base_dir``)."""
    if isinstance(path_or_dict, PlanSpec):
        return path_or_dict
    doc = S.document(path_or_dict, what="plan spec", fix="start from templates/plan.yaml")
    if doc.file and base_dir is None:
        base_dir = Path(doc.file).parent
    with doc.located():
        spec = _build(doc.data, base_dir)
    return dataclasses.replace(spec, source=doc.file) if doc.file else spec


def _build(raw, base_dir) -> PlanSpec:
    raw = S.mapping(raw, "", known=_TOP_KEYS, what="plan spec", optional=False,
                    example="the sections of templates/plan.yaml")
    for req in ("demand", "prices"):
        if raw.get(req) is None:
            S.fail(req, f"plan spec is missing the '{req}' section", "copy it from templates/plan.yaml")
    kw: dict = {}
    keys = {k for k in ("name", "tenant", "slo", "slo_file", "slo_classes", "start") if raw.get(k) is not None}
    for key, cls in _SECTIONS.items():
        if raw.get(key) is None:
            continue
        values = S.mapping(raw[key], key, known=[f.name for f in fields(cls) if f.metadata.get("yaml", True)],
                           example="see templates/plan.yaml")
        keys |= {f"{key}.{name}" for name, v in values.items() if v is not None}
        if key == "demand" and values.get("history") and base_dir is not None:
            h = values["history"]
            if isinstance(h, str) and not os.path.isabs(h):
                values["history"] = str(Path(base_dir) / h)
        if key == "demand" and isinstance(values.get("arrivals"), Mapping) and base_dir is not None:
            a = dict(values["arrivals"])
            for name in ("trace", "per_second"):
                if isinstance(a.get(name), str) and not os.path.isabs(a[name]):
                    a[name] = str(Path(base_dir) / a[name])
            values["arrivals"] = a
        if key == "demand" and "peak_rps" in values:
            values["peak_rps"] = _classes(values["peak_rps"], "demand.peak_rps")
        for name in ("target", "twin"):
            if key == "mix" and isinstance(values.get(name), str) and base_dir is not None \
                    and not os.path.isabs(values[name]):
                values[name] = str(Path(base_dir) / values[name])
        if key == "model" and isinstance(values.get("catalogue"), str) and base_dir is not None \
                and not os.path.isabs(values["catalogue"]):
            values["catalogue"] = str(Path(base_dir) / values["catalogue"])
        if key == "capacity" and "source" not in values:
            values["source"] = "number" if values.get("rps_per_group") is not None else "study"
        kw[_ATTR[key]] = cls(**values)
    slo = raw.get("slo")
    if slo is not None:
        try:
            slo = SLO.parse(slo)
        except SpecError as exc:
            S.fail("slo" + (f".{exc.field}" if exc.field else ""), exc.message,
                   exc.fix or "e.g. slo: 'ttft_ms=2000,tpot_ms=100,attainment=0.99'")
    classes = None
    if raw.get("slo_file") is not None and raw.get("slo_classes") is not None:
        S.fail("slo_file", "the plan spec has both slo_file and slo_classes",
               "give the class SLOs in one place: slo_file: slo.yaml, or slo_classes: {...}")
    if raw.get("slo_file") is not None:
        f = S.text(raw["slo_file"], "slo_file", optional=False, example="slo.yaml")
        if base_dir is not None and not os.path.isabs(f):
            f = str(Path(base_dir) / f)
        classes = load_slo_file(f)  # errors name the SLO file and its line
    elif raw.get("slo_classes") is not None:
        sub = S.mapping(raw["slo_classes"], "slo_classes", example="{classes: {interactive: ...}}")
        try:
            classes = load_slo_file(sub)
        except SpecError as exc:
            S.fail("slo_classes" + (f".{exc.field}" if exc.field else ""), exc.message, exc.fix)
    return PlanSpec(name=raw.get("name", "plan") if raw.get("name") is not None else "plan",
                    tenant=raw.get("tenant"), slo=slo, slo_classes=classes, start=raw.get("start"),
                    file_keys=frozenset(keys), **kw)
