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
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

from .errors import SpecError
from .slo import SLO

POLICIES = ("node", "zone", "n_plus_k", "none")
READY_PARTS = ("provision", "image", "weights", "rank_init", "compile", "warmup", "register")
CAPACITY_USES = ("lower_bound", "estimate")
BILLING = ("node", "gpu")


# ----------------------------------------------------------------------------- validation


def _bad(field_: str, message: str, fix: str | None = None):
    raise SpecError(message, field=field_, fix=fix)


def _number(value, field_: str, *, integer: bool = False, minimum: float | None = None,
            above: float | None = None, maximum: float | None = None, optional: bool = False,
            example: str = "") -> Any:
    """Check one numeric field; return it as float/int (or None when optional)."""
    leaf = field_.split(".")[-1]
    ex = f" (e.g. {leaf}: {example})" if example else ""
    if value is None:
        if optional:
            return None
        _bad(field_, f"{field_} is missing", f"add {leaf}: {example or '...'}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a whole number" if integer else "a number"
        _bad(field_, f"{field_} must be {kind}, got {value!r} ({type(value).__name__})",
             f"write a plain number{ex}")
    if isinstance(value, float) and not math.isfinite(value):
        _bad(field_, f"{field_} must be finite, got {value!r}", f"write a plain number{ex}")
    if integer:
        if isinstance(value, float) and not value.is_integer():
            _bad(field_, f"{field_} must be a whole number, got {value!r}", f"write a whole number{ex}")
        value = int(value)
    else:
        value = float(value)
    if minimum is not None and value < minimum:
        _bad(field_, f"{field_} must be ≥ {minimum:g}, got {value:g}", f"use a value ≥ {minimum:g}{ex}")
    if above is not None and not value > above:
        _bad(field_, f"{field_} must be > {above:g}, got {value:g}", f"use a value > {above:g}{ex}")
    if maximum is not None and value > maximum:
        _bad(field_, f"{field_} must be ≤ {maximum:g}, got {value:g}", f"use a value ≤ {maximum:g}{ex}")
    return value


def _choice(value, field_: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        _bad(field_, f"unknown {field_} {value!r}", "use one of: " + ", ".join(choices))
    return value


def _text(value, field_: str, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not optional and not value.strip()):
        _bad(field_, f"{field_} must be text, got {value!r}", f"write {field_.split('.')[-1]}: some-name")
    return value


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
    uncertainty: float = 0.0
    horizon_quarters: int = 1
    growth_per_quarter: float = 0.0  # only without a history
    interval: float = 0.95  # forecast prediction-interval level; the plan uses its upper bound
    mean_to_peak: float | None = None  # mean offered rate / peak, for monthly volumes
    output_tokens_per_request: float | None = None  # only used without a study

    def __post_init__(self):
        s = self.SECTION
        if not isinstance(self.peak_rps, tuple):
            object.__setattr__(self, "peak_rps", _classes(self.peak_rps, f"{s}.peak_rps"))
        for cls, rps in self.peak_rps:
            f = f"{s}.peak_rps" + (f".{cls}" if cls != "all" else "")
            _number(rps, f, above=0.0, example="380")
        if self.peak_rps and self.history:
            _bad(f"{s}.history", "demand has both peak_rps and history",
                 "give either a peak (peak_rps) or a history to forecast from, not both")
        if not self.peak_rps and not self.history:
            _bad(f"{s}.peak_rps", "demand needs peak_rps (req/s) or history (a file of request rates)",
                 "add peak_rps: 380 (or peak_rps: {interactive: 300, batch: 80}), or history: demand.csv")
        _text(self.history, f"{s}.history")
        _text(self.history_time_column, f"{s}.history_time_column", optional=False)
        _text(self.history_rate_column, f"{s}.history_rate_column", optional=False)
        u = _number(self.uncertainty, f"{s}.uncertainty", minimum=0.0, example="0.2")
        if u > 3.0:
            _bad(f"{s}.uncertainty", f"{s}.uncertainty {u:g} means planning for {1 + u:g}× the peak",
                 "u is a fraction: 0.2 plans for peak × 1.2 (+20 %); use a value ≤ 3")
        _number(self.horizon_quarters, f"{s}.horizon_quarters", integer=True, minimum=1, maximum=40,
                example="4")
        _number(self.growth_per_quarter, f"{s}.growth_per_quarter", above=-1.0, example="0.1")
        if self.history and self.growth_per_quarter:
            _bad(f"{s}.growth_per_quarter", "growth_per_quarter is for a fixed peak; with a history "
                 "the forecast gives the growth", "remove growth_per_quarter or history")
        _number(self.interval, f"{s}.interval", above=0.5, maximum=0.999, example="0.95")
        _number(self.mean_to_peak, f"{s}.mean_to_peak", above=0.0, maximum=1.0, optional=True,
                example="0.6")
        _number(self.output_tokens_per_request, f"{s}.output_tokens_per_request", above=0.0,
                optional=True, example="250")

    @property
    def total_peak_rps(self) -> float:
        return float(sum(r for _, r in self.peak_rps))


def _classes(value, field_: str) -> tuple[tuple[str, float], ...]:
    if value is None or value == ():
        return ()
    if isinstance(value, Mapping):
        if not value:
            _bad(field_, f"{field_} has no classes", "e.g. peak_rps: {interactive: 300, batch: 80}")
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
    confidence: float = 0.95
    reps: int = 200
    seed: int = 0
    good_fraction: float | None = None  # without a study: SLO-meeting share of offered requests
    #: plan with a lower bound the study cannot support honestly (``Envelope.honesty``), saying
    #: so in the plan; without it such a plan is refused (docs/envelope.md)
    accept_optimistic: bool = False

    def __post_init__(self):
        s = self.SECTION
        if not isinstance(self.accept_optimistic, bool):
            _bad(f"{s}.accept_optimistic", "capacity.accept_optimistic must be true or false",
                 "accept_optimistic: true (plan with a bound the study cannot support)")
        _choice(self.source, f"{s}.source", ("study", "number"))
        _number(self.rps_per_group, f"{s}.rps_per_group", above=0.0, optional=True, example="42")
        if self.source == "number" and self.rps_per_group is None:
            _bad(f"{s}.rps_per_group", "capacity.source is number but capacity.rps_per_group is missing",
                 "add rps_per_group: 42 (req/s one replica group serves within the SLO)")
        _choice(self.use, f"{s}.use", CAPACITY_USES)
        _number(self.confidence, f"{s}.confidence", above=0.5, maximum=0.999, example="0.95")
        _number(self.reps, f"{s}.reps", integer=True, minimum=10, example="200")
        _number(self.seed, f"{s}.seed", integer=True, minimum=0, example="0")
        _number(self.good_fraction, f"{s}.good_fraction", above=0.0, maximum=1.0, optional=True,
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
        g = _number(self.gpus_per_replica, f"{s}.gpus_per_replica", integer=True, minimum=1,
                    optional=True, example="4")
        tp = _number(self.tp, f"{s}.tp", integer=True, minimum=1, optional=True, example="4")
        pp = _number(self.pp, f"{s}.pp", integer=True, minimum=1, optional=True, example="1")
        _number(self.gpus_per_node, f"{s}.gpus_per_node", integer=True, minimum=1, example="8")
        if g is not None and (tp or pp) and g != (tp or 1) * (pp or 1):
            _bad(f"{s}.gpus_per_replica", f"gpus_per_replica {g} ≠ tp × pp = {(tp or 1) * (pp or 1)}",
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
        _choice(self.policy, f"{s}.policy", POLICIES)
        if not isinstance(self.zones, tuple):
            object.__setattr__(self, "zones", _zones(self.zones, f"{s}.zones"))
        if not self.zones:
            _bad(f"{s}.zones", "failure.zones is empty", "give a zone count (zones: 3) or names (zones: [a, b, c])")
        _number(self.k, f"{s}.k", integer=True, minimum=1 if self.policy == "n_plus_k" else 0, example="2")
        _number(self.nodes_available, f"{s}.nodes_available", integer=True, minimum=1, optional=True,
                example="40")
        if self.policy == "zone" and len(self.zones) < 2:
            _bad(f"{s}.zones", "policy zone needs at least 2 zones (losing the only zone loses everything)",
                 "list the zones (zones: [a, b, c]) or use policy: node")
        if self.nodes_available is not None and len(self.zones) > self.nodes_available:
            _bad(f"{s}.zones", f"{len(self.zones)} zones but only {self.nodes_available} nodes available",
                 "use no more zones than nodes, or raise nodes_available")


def _zones(value, field_: str) -> tuple[str, ...]:
    if isinstance(value, bool):
        _bad(field_, f"{field_} must be a count or a list of names, got {value!r}", "zones: 3")
    if isinstance(value, int):
        if value < 1:
            _bad(field_, f"{field_} must be ≥ 1, got {value}", "zones: 3")
        if value > 26:
            return tuple(f"z{i + 1}" for i in range(value))
        return tuple("abcdefghijklmnopqrstuvwxyz"[i] for i in range(value))
    if isinstance(value, (list, tuple)):
        names = tuple(str(v) for v in value)
        if len(set(names)) != len(names):
            _bad(field_, f"{field_} has duplicate zone names: {list(names)}", "give each zone a unique name")
        return names
    _bad(field_, f"{field_} must be a count or a list of names, got {value!r}", "zones: [a, b, c]")


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
            _number(getattr(self, f), f"{s}.{f}", integer=True, minimum=0, example="1")
        if self.max_surge == 0 and self.max_unavailable == 0:
            _bad(f"{s}.max_unavailable", "max_surge and max_unavailable are both 0: a rollout could never progress",
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
                _bad(f"{s}.ready_time_s", f"{s}.ready_time_s must be a mapping of parts to seconds, got {v!r}",
                     "e.g. ready_time_s: {provision: 90, image: 40, weights: 60, rank_init: 10, "
                     "compile: 30, warmup: 20, register: 5}")
            object.__setattr__(self, "ready_time_s", tuple((str(k), x) for k, x in v.items()))
        for part, secs in self.ready_time_s:
            if part not in READY_PARTS:
                _bad(f"{s}.ready_time_s.{part}", f"unknown ready-time part {part!r}",
                     "parts: " + ", ".join(READY_PARTS))
            _number(secs, f"{s}.ready_time_s.{part}", minimum=0.0, example="30")
        _number(self.burst_growth_rps_per_s, f"{s}.burst_growth_rps_per_s", minimum=0.0, example="0.5")
        _number(self.warm_floor_groups, f"{s}.warm_floor_groups", integer=True, minimum=0, example="2")

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
        _number(self.usd_per_gpu_hour, f"{s}.usd_per_gpu_hour", minimum=0.0, example="3.5")
        _number(self.overhead_pct, f"{s}.overhead_pct", minimum=0.0, maximum=1000.0, example="15")
        _number(self.usd_per_kwh, f"{s}.usd_per_kwh", minimum=0.0, example="0.12")
        _number(self.pue, f"{s}.pue", minimum=1.0, maximum=5.0, example="1.3")
        _choice(self.billing, f"{s}.billing", BILLING)
        _number(self.gpu_power_w, f"{s}.gpu_power_w", above=0.0, optional=True, example="550")


_SECTIONS: dict[str, type] = {
    "demand": DemandSpec, "capacity": CapacitySpec, "replica_group": GroupSpec,
    "failure": FailureSpec, "rollout": RolloutSpec, "autoscaling": AutoscalingSpec,
    "prices": PriceSpec,
}
_ATTR = {"demand": "demand", "capacity": "capacity", "replica_group": "group", "failure": "failure",
         "rollout": "rollout", "autoscaling": "autoscaling", "prices": "prices"}


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
    source: str | None = None  # file the spec was read from

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
    }

    def __post_init__(self):
        _text(self.name, "name", optional=False)
        _text(self.tenant, "tenant")
        if self.slo is not None and not isinstance(self.slo, SLO):
            object.__setattr__(self, "slo", SLO.parse(self.slo))

    def with_(self, **changes) -> "PlanSpec":
        """A copy with flat-named changes, validated again. ``peak_rps`` with several SLO
        classes scales every class in proportion; ``slo``/``name``/``tenant`` are top level.
        Example: ``spec.with_(peak_rps=500, policy="zone", price_usd_per_gpu_hour=2.1)``."""
        top = {k: changes.pop(k) for k in ("slo", "name", "tenant") if k in changes}
        if "slo" in top and top["slo"] is not None:
            top["slo"] = SLO.parse(top["slo"])
        by_section: dict[str, dict] = {}
        for key, value in changes.items():
            if key not in self.ALIASES:
                raise SpecError(f"unknown plan parameter {key!r}", field=key,
                                fix="known: " + ", ".join(sorted(self.ALIASES)))
            sec, f = self.ALIASES[key]
            if key == "peak_rps":
                value = self._scaled_peaks(value)
            if key == "capacity_rps_per_group" and value is not None:
                by_section.setdefault("capacity", {})["source"] = "number"
            by_section.setdefault(sec, {})[f] = value
        new = {sec: dataclasses.replace(getattr(self, sec), **kw) for sec, kw in by_section.items()}
        return dataclasses.replace(self, **new, **top)

    def _scaled_peaks(self, value):
        if isinstance(value, (Mapping, list, tuple)):
            return value
        _number(value, "demand.peak_rps", above=0.0, example="380")
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
        for key, attr in _ATTR.items():
            sec = getattr(self, attr)
            d = {}
            for f in fields(sec):
                v = getattr(sec, f.name)
                if f.name in ("peak_rps", "ready_time_s"):
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


_TOP_KEYS = ("name", "tenant", "slo") + tuple(_SECTIONS)


def load_plan_spec(path_or_dict, *, base_dir: str | os.PathLike | None = None) -> PlanSpec:
    """Read and validate a plan spec (YAML file path or mapping). Raises SpecError naming the
    field and a fix for every bad, missing, unknown or contradictory value. A relative
    ``demand.history`` path is resolved against the spec file's folder (or ``base_dir``)."""
    file = None
    if isinstance(path_or_dict, PlanSpec):
        return path_or_dict
    if isinstance(path_or_dict, Mapping):
        raw = dict(path_or_dict)
    else:
        file = str(path_or_dict)
        raw = _read_yaml(Path(path_or_dict))
        base_dir = base_dir or Path(path_or_dict).parent
    try:
        spec = _build(raw, base_dir)
        return dataclasses.replace(spec, source=file) if file else spec
    except SpecError as exc:
        if file and not exc.file:
            raise SpecError(exc.args[0], field=exc.field, fix=exc.fix, file=file) from None
        raise


def _read_yaml(path: Path) -> dict:
    import yaml

    file = str(path)
    if not path.is_file():
        raise SpecError("plan spec file not found", file=file,
                        fix="pass --spec with a plan.yaml (start from templates/plan.yaml)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SpecError("plan spec is not UTF-8 text", file=file) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"plan spec is not valid YAML{where}: {getattr(exc, 'problem', exc)}", file=file,
                        fix="check indentation and quoting (compare with templates/plan.yaml)") from None
    except OSError as exc:
        raise SpecError(f"cannot read plan spec: {exc.strerror or exc}", file=file) from None
    if not isinstance(raw, dict):
        raise SpecError("plan spec must be a mapping with demand, capacity, replica_group, failure, "
                        "rollout, autoscaling and prices sections", file=file,
                        fix="start from templates/plan.yaml")
    return raw


def _build(raw: dict, base_dir) -> PlanSpec:
    unknown = sorted(str(k) for k in raw if k not in _TOP_KEYS)
    if unknown:
        raise SpecError(f"unknown key(s) in plan spec: {', '.join(unknown)}", field=unknown[0],
                        fix="known top-level keys: " + ", ".join(_TOP_KEYS))
    for req in ("demand", "prices"):
        if raw.get(req) is None:
            raise SpecError(f"plan spec is missing the '{req}' section", field=req,
                            fix="copy it from templates/plan.yaml")
    kw: dict = {}
    for key, cls in _SECTIONS.items():
        sec = raw.get(key)
        if sec is None:
            continue
        if not isinstance(sec, Mapping):
            raise SpecError(f"'{key}' must be a mapping of settings, got {sec!r}", field=key,
                            fix="see templates/plan.yaml")
        names = {f.name for f in fields(cls)}
        bad = sorted(str(k) for k in sec if k not in names)
        if bad:
            raise SpecError(f"unknown key(s) in {key}: {', '.join(bad)}", field=f"{key}.{bad[0]}",
                            fix=f"known keys in {key}: " + ", ".join(sorted(names)))
        values = dict(sec)
        if key == "demand" and values.get("history") and base_dir is not None:
            h = values["history"]
            if isinstance(h, str) and not os.path.isabs(h):
                values["history"] = str(Path(base_dir) / h)
        if key == "demand" and "peak_rps" in values:
            values["peak_rps"] = _classes(values["peak_rps"], "demand.peak_rps")
        if key == "capacity" and "source" not in values:
            values["source"] = "number" if values.get("rps_per_group") is not None else "study"
        kw[_ATTR[key]] = cls(**values)
    slo = raw.get("slo")
    if slo is not None:
        try:
            slo = SLO.parse(slo)
        except SpecError as exc:
            raise SpecError(exc.args[0], field="slo" + (f".{exc.field}" if exc.field else ""),
                            fix=exc.fix or "e.g. slo: 'ttft_ms=2000,tpot_ms=100,attainment=0.99'") from None
    return PlanSpec(name=raw.get("name", "plan") if raw.get("name") is not None else "plan",
                    tenant=raw.get("tenant"), slo=slo, **kw)
