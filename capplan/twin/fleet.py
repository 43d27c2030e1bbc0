"""Scenario parts that change the fleet or the demand during a run: ``failure``, ``rollout``,
``demand`` and ``autoscaler`` (docs/timeline.md "Scenario parts"). Each is registered in the
scenario table (``capplan.twin.scenario.PARTS``) after system, workload and run, reads its keys
with the spec kit, and sets the synth configuration's fleet control (``SynthConfig.control``)
or its demand (``SynthConfig.demand``); the simulator does the rest and the study it writes
carries a ``timeline/`` table, so ``capplan timeline`` analyses it like a measured one.

.. code-block:: yaml

    name: lose-zone-b-at-peak
    slo: ttft_ms=2000,tpot_ms=100,attainment=0.99
    system: {replicas: 6}
    workload: {rate_rps: 14}
    run: {duration_s: 1500, warmup_s: 60}
    failure: {at_s: 600, lose: zone, zones: 3, detect_s: 10, route_removal_s: 5,
              in_flight: lost, ready_time_s: {provision: 120, weights: 90, warmup: 20}}
    autoscaler: {capacity_rps: 2.8, safety: 1.1, drain_target_s: 60, signal: queue_work,
                 eval_period_s: 15, stabilisation_s: 300, warm_floor: 2, max_replicas: 12,
                 ready_s: 330}
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from .. import spec as S
from ..errors import SpecError
from ..sim.arrivals import load_trace
from ..sim.autoscale import SIGNALS, AutoscalerSpec
from ..sim.control import ControlSpec, FailureEvent, Placement, RolloutEvent
from ..sim.demand import RateProfile, from_trace, oscillation, ramps, steps
from ..sim.retry import RetryPolicy, parse_retry
from .scenario import Part, ScenarioContext, register_part

FAILURE_KEYS = ("at_s", "lose", "count", "detect_s", "route_removal_s", "in_flight",
                "retry_delay_s", "retry", "replace", "ready_s", "ready_time_s", "zones", "per_node")
ROLLOUT_KEYS = ("at_s", "max_surge", "max_unavailable", "ready_s", "ready_time_s",
                "drain_timeout_s", "retry")
DEMAND_KEYS = ("base_rps", "steps", "ramps", "oscillate", "trace")
AUTOSCALER_KEYS = ("capacity_rps", "safety", "drain_target_s", "signal", "eval_period_s",
                   "rate_window_s", "stabilisation_s", "tolerance", "max_step", "cooldown_s",
                   "drain_timeout_s", "ready_s", "ready_time_s", "warm_floor", "max_replicas",
                   "ttft_target_ms", "kv_target", "goodput_target", "request_work",
                   "decode_token_weight")


def ready_seconds(d: dict, fld: str) -> float:
    """``ready_s`` (seconds) or ``ready_time_s`` (its parts, as in a plan spec: summed); 0
    when neither is given."""
    if "ready_s" in d and "ready_time_s" in d:
        S.fail(f"{fld}.ready_s", f"give {fld}.ready_s or {fld}.ready_time_s, not both",
               "ready_time_s: {provision: 120, image: 45, weights: 90} or ready_s: 255")
    if "ready_time_s" in d:
        parts = S.mapping(d["ready_time_s"], f"{fld}.ready_time_s")
        return float(sum(S.duration_s(v, f"{fld}.ready_time_s.{k}") for k, v in parts.items()))
    return float(S.duration_s(d.get("ready_s", 0.0), f"{fld}.ready_s"))


def _control(ctx: ScenarioContext) -> ControlSpec:
    c = ctx.config.control
    return c if c is not None else ControlSpec(initial=ctx.config.replicas)


def _with_control(ctx: ScenarioContext, control: ControlSpec) -> ScenarioContext:
    return replace(ctx, config=replace(ctx.config, control=control))


def _with_retry(c: ControlSpec, retry: RetryPolicy | None, fld: str) -> ControlSpec:
    """The run's clients get one retry policy (docs/timeline.md "Client retries")."""
    if retry is None:
        return c
    if c.retry is not None and c.retry != retry:
        S.fail(fld, "the failure and rollout parts give different client retry policies",
               "give the same retry mapping (the clients are the same), or one")
    return replace(c, retry=retry)


def _zones(value, fld: str) -> tuple[str, ...]:
    if isinstance(value, bool):
        S.fail(fld, f"{fld} must be a count or a list of names", "zones: 3")
    if isinstance(value, int):
        n = S.number(value, fld, integer=True, minimum=1, example="3")
        return tuple("abcdefghijklmnopqrstuvwxyz"[i] if n <= 26 else f"z{i + 1}" for i in range(n))
    names = tuple(str(v) for v in S.sequence(value, fld, nonempty=True, example="[a, b, c]"))
    if len(set(names)) != len(names):
        S.fail(fld, f"{fld} has duplicate zone names", "give each zone a unique name")
    return names


@register_part
@dataclass(frozen=True)
class FailurePart(Part):
    """Lose replicas, the largest zone or one node at a time; detection and route-removal
    delays; in-flight requests lost or retried; replacements after a ready time."""

    key: ClassVar[str] = "failure"
    summary: ClassVar[str] = ("at_s, lose: replicas (count) | zone | node, detect_s, route_removal_s, "
                              "in_flight: lost | retried (retry_delay_s, or a client retry "
                              "policy: retry), replace, ready_s or ready_time_s, zones, per_node; "
                              "or a list of such mappings")
    failures: tuple[FailureEvent, ...] = ()
    placement: Placement | None = None
    retry: RetryPolicy | None = None

    @classmethod
    def parse(cls, raw, fld):
        items = raw if isinstance(raw, list) else [raw]
        specs, placement, retry = [], None, None
        for i, r in enumerate(items):
            f = S.index(fld, i) if isinstance(raw, list) else fld
            d = S.mapping(r, f, known=FAILURE_KEYS, optional=False,
                          example="{at_s: 600, lose: zone, detect_s: 10, ready_s: 300}")
            if "at_s" not in d:
                S.fail(f"{f}.at_s", f"{f} needs at_s: when the failure happens", "at_s: 600")
            if "zones" in d or "per_node" in d:
                placement = Placement(
                    zones=_zones(d.get("zones", 3), f"{f}.zones"),
                    per_node=int(S.number(d.get("per_node", 1), f"{f}.per_node", integer=True,
                                          minimum=1, example="2")))
            in_flight = S.choice(d.get("in_flight", "retried" if "retry" in d else "lost"),
                                 f"{f}.in_flight", ("lost", "retried"))
            if "retry" in d:
                if in_flight == "lost" or "retry_delay_s" in d:
                    S.fail(f"{f}.retry", "a client retry policy needs in_flight: retried and "
                           "replaces retry_delay_s (one resend)",
                           "drop retry_delay_s; in_flight: retried, retry: {max_retries: 3}")
                r_ = parse_retry(d["retry"], f"{f}.retry")
                if retry is not None and r_ != retry:
                    S.fail(f"{f}.retry", "the failures give different client retry policies",
                           "give the same retry mapping to each (the clients are the same)")
                retry = r_
            specs.append(FailureEvent(
                at_s=S.duration_s(d["at_s"], f"{f}.at_s", example="600"),
                lose=S.choice(d.get("lose", "replicas"), f"{f}.lose", ("replicas", "zone", "node")),
                count=int(S.number(d.get("count", 1), f"{f}.count", integer=True, minimum=1)),
                detect_s=S.duration_s(d.get("detect_s", 0.0), f"{f}.detect_s"),
                route_removal_s=S.duration_s(d.get("route_removal_s", 0.0), f"{f}.route_removal_s"),
                in_flight=in_flight,
                retry_delay_s=S.duration_s(d.get("retry_delay_s", 1.0), f"{f}.retry_delay_s"),
                replace=S.flag(d.get("replace"), f"{f}.replace", default=True),
                ready_s=ready_seconds(d, f)))
        if retry is not None and any(s_.in_flight == "lost" for s_ in specs):
            S.fail(f"{fld}.in_flight", "one failure loses its requests while the clients retry "
                   "under a policy", "in_flight: retried on every failure")
        return cls(tuple(specs), placement, retry)

    def apply(self, ctx):
        c = _control(ctx)
        if self.placement is not None:
            c = replace(c, placement=self.placement)
        c = _with_retry(c, self.retry, f"{self.key}.retry")
        return _with_control(ctx, replace(c, failures=c.failures + self.failures))

    def describe(self):
        parts = []
        for f in self.failures:
            what = f"{f.count} replica(s)" if f.lose == "replicas" else f"the largest {f.lose}"
            parts.append(f"lose {what} at {f.at_s:g} s (detect {f.detect_s:g} s, routes "
                         f"{f.route_removal_s:g} s, in flight {f.in_flight}"
                         + (f", replaced after {f.ready_s:g} s" if f.replace else "") + ")")
        return "failure: " + "; ".join(parts) + (f"; {self.retry.describe()}" if self.retry else "")


@register_part
@dataclass(frozen=True)
class RolloutPart(Part):
    """A rolling update of the whole fleet with a surge / unavailable schedule."""

    key: ClassVar[str] = "rollout"
    summary: ClassVar[str] = ("at_s, max_surge, max_unavailable, ready_s or ready_time_s, drain_timeout_s, "
                              "retry (the clients' retry policy)")
    rollout: RolloutEvent | None = None
    retry: RetryPolicy | None = None

    @classmethod
    def parse(cls, raw, fld):
        d = S.mapping(raw, fld, known=ROLLOUT_KEYS, optional=False,
                      example="{at_s: 300, max_surge: 1, max_unavailable: 0, ready_s: 300}")
        if "at_s" not in d:
            S.fail(f"{fld}.at_s", f"{fld} needs at_s: when the rollout starts", "at_s: 300")
        surge = int(S.number(d.get("max_surge", 1), f"{fld}.max_surge", integer=True, minimum=0))
        unavail = int(S.number(d.get("max_unavailable", 0), f"{fld}.max_unavailable", integer=True,
                               minimum=0))
        if surge + unavail < 1:
            S.fail(f"{fld}.max_surge", "max_surge and max_unavailable are both 0: the rollout "
                   "could never progress", "max_surge: 1")
        return cls(RolloutEvent(at_s=S.duration_s(d["at_s"], f"{fld}.at_s"), max_surge=surge,
                               max_unavailable=unavail, ready_s=ready_seconds(d, fld),
                               drain_timeout_s=S.duration_s(d.get("drain_timeout_s", 600.0),
                                                            f"{fld}.drain_timeout_s")),
                   parse_retry(d["retry"], f"{fld}.retry") if "retry" in d else None)

    def apply(self, ctx):
        c = _with_retry(_control(ctx), self.retry, f"{self.key}.retry")
        return _with_control(ctx, replace(c, rollout=self.rollout))

    def describe(self):
        r = self.rollout
        return (f"rollout at {r.at_s:g} s (max surge {r.max_surge}, max unavailable "
                f"{r.max_unavailable}, ready after {r.ready_s:g} s)")


@register_part
@dataclass(frozen=True)
class DemandPart(Part):
    """A rate that changes during the run: steps, ramps, an oscillation, or a trace's day
    scaled to a peak (one run per repeat; the run's rate is the profile's peak)."""

    key: ClassVar[str] = "demand"
    summary: ClassVar[str] = ("base_rps and one of: steps [{at_s, rate_rps}], ramps [{from_s, to_s, "
                              "to_rps}], oscillate {low_rps, high_rps, period_s, shape, start_s}, "
                              "trace {path, format, span_s, peak_rps, bin_s, start_s}")
    kind: str = "steps"
    base_rps: float | None = None
    changes: tuple = ()
    oscillate: tuple | None = None
    trace: tuple | None = None

    @classmethod
    def parse(cls, raw, fld, base_dir: Path | None = None):
        d = S.mapping(raw, fld, known=DEMAND_KEYS, optional=False,
                      example="{base_rps: 4, steps: [{at_s: 600, rate_rps: 12}]}")
        kinds = [k for k in ("steps", "ramps", "oscillate", "trace") if k in d]
        if len(kinds) != 1:
            S.fail(fld, f"{fld} needs exactly one of steps, ramps, oscillate, trace "
                   f"(got {', '.join(kinds) or 'none'})", "steps: [{at_s: 600, rate_rps: 12}]")
        kind = kinds[0]
        base = S.number(d["base_rps"], f"{fld}.base_rps", minimum=0.0) if "base_rps" in d else None
        if kind == "steps":
            rows = []
            for i, s in enumerate(S.sequence(d["steps"], f"{fld}.steps", nonempty=True)):
                f = S.index(f"{fld}.steps", i)
                m = S.mapping(s, f, known=("at_s", "rate_rps"), optional=False)
                rows.append((S.duration_s(m.get("at_s"), f"{f}.at_s"),
                             S.number(m.get("rate_rps"), f"{f}.rate_rps", minimum=0.0, example="12")))
            return cls("steps", base, tuple(rows))
        if kind == "ramps":
            rows = []
            for i, s in enumerate(S.sequence(d["ramps"], f"{fld}.ramps", nonempty=True)):
                f = S.index(f"{fld}.ramps", i)
                m = S.mapping(s, f, known=("from_s", "to_s", "to_rps"), optional=False)
                a = S.duration_s(m.get("from_s"), f"{f}.from_s")
                b = S.duration_s(m.get("to_s"), f"{f}.to_s", above=a)
                rows.append((a, b, S.number(m.get("to_rps"), f"{f}.to_rps", minimum=0.0)))
            return cls("ramps", base, tuple(rows))
        if kind == "oscillate":
            f = f"{fld}.oscillate"
            m = S.mapping(d["oscillate"], f, known=("low_rps", "high_rps", "period_s", "shape", "start_s"),
                          optional=False)
            lo = S.number(m.get("low_rps"), f"{f}.low_rps", minimum=0.0, example="2")
            hi = S.number(m.get("high_rps"), f"{f}.high_rps", minimum=lo, example="8")
            return cls("oscillate", base, (), (lo, hi, S.duration_s(m.get("period_s"), f"{f}.period_s", above=0.0),
                                               S.choice(m.get("shape", "square"), f"{f}.shape", ("square", "sine")),
                                               S.duration_s(m.get("start_s", 0.0), f"{f}.start_s")))
        f = f"{fld}.trace"
        m = S.mapping(d["trace"], f, known=("path", "format", "span_s", "peak_rps", "bin_s", "start_s"),
                      optional=False)
        p = Path(str(S.text(m.get("path"), f"{f}.path", optional=False))).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        if not p.is_file():
            S.fail(f"{f}.path", "trace file not found", "an Azure LLM inference CSV or a Mooncake JSONL")
        return cls("trace", base, (), None, (
            str(p), S.choice(m.get("format", "auto"), f"{f}.format", ("auto", "azure", "mooncake")),
            S.duration_s(m["span_s"], f"{f}.span_s", above=0.0) if "span_s" in m else None,
            S.number(m["peak_rps"], f"{f}.peak_rps", above=0.0) if "peak_rps" in m else None,
            S.duration_s(m["bin_s"], f"{f}.bin_s", above=0.0) if "bin_s" in m else None,
            S.duration_s(m.get("start_s", 0.0), f"{f}.start_s")))

    def profile(self, cfg) -> RateProfile:
        base = self.base_rps if self.base_rps is not None else (cfg.rates[0] if cfg.rates else None)
        if base is None and self.kind in ("steps", "ramps"):
            raise SpecError("demand.base_rps is needed (the workload gives no rate)", field="demand.base_rps",
                            fix="base_rps: 4")
        if self.kind == "steps":
            return steps(base, list(self.changes))
        if self.kind == "ramps":
            return ramps(base, list(self.changes))
        if self.kind == "oscillate":
            lo, hi, period, shape, start = self.oscillate
            return oscillation(lo, hi, period, float(cfg.duration_s), shape=shape, start_s=start)
        path, fmt, span, peak, bin_s, start = self.trace
        peak = peak if peak is not None else max(cfg.rates or (base or 0.0,))
        if not peak:
            raise SpecError("demand.trace.peak_rps is needed (the workload gives no rate)",
                            field="demand.trace.peak_rps", fix="peak_rps: 12")
        return from_trace(load_trace(path, fmt), span_s=span or float(cfg.duration_s) - start,
                          peak_rps=peak, bin_s=bin_s, start_s=start)

    def apply(self, ctx):
        cfg = ctx.config
        if cfg.load_model != "open":
            raise SpecError("demand changes need an open-loop workload", field="demand")
        prof = self.profile(cfg)
        notes = ctx.notes + (f"demand: {self.describe()}; the run's rate is its peak "
                             f"{prof.peak_rps:g} req/s, its mean {prof.cumulative(cfg.duration_s) / cfg.duration_s:.4g}",)
        return replace(ctx, config=replace(cfg, demand=prof, rates=(prof.peak_rps,)), notes=notes)

    def describe(self):
        if self.kind == "steps":
            return "demand: steps " + ", ".join(f"{r:g} req/s at {t:g} s" for t, r in self.changes)
        if self.kind == "ramps":
            return "demand: ramps " + ", ".join(f"to {r:g} req/s from {a:g} to {b:g} s" for a, b, r in self.changes)
        if self.kind == "oscillate":
            lo, hi, period, shape, _ = self.oscillate
            return f"demand: {shape} oscillation {lo:g}–{hi:g} req/s every {period:g} s"
        return f"demand: the day of trace {Path(self.trace[0]).name}"


@register_part
@dataclass(frozen=True)
class AutoscalerPart(Part):
    """The R_desired autoscaler (docs/timeline.md "The autoscaler")."""

    key: ClassVar[str] = "autoscaler"
    summary: ClassVar[str] = ("capacity_rps, safety, drain_target_s, signal (queue_work | ttft_p99 | "
                              "kv_use | goodput, or a list), eval_period_s, rate_window_s, "
                              "stabilisation_s, tolerance, max_step, cooldown_s, drain_timeout_s, "
                              "ready_s or ready_time_s, warm_floor, max_replicas, ttft_target_ms, "
                              "kv_target, goodput_target, request_work, decode_token_weight")
    spec: AutoscalerSpec | None = None

    @classmethod
    def parse(cls, raw, fld):
        d = S.mapping(raw, fld, known=AUTOSCALER_KEYS, optional=False,
                      example="{capacity_rps: 2.8, ready_s: 330, warm_floor: 2, max_replicas: 12}")
        if "capacity_rps" not in d:
            S.fail(f"{fld}.capacity_rps", f"{fld} needs capacity_rps: the req/s one replica serves "
                   "within the SLO (the plan's C_SLO per group)", "capacity_rps: 2.8")
        sig = d.get("signal", "queue_work")
        sigs = tuple(S.choice(s, f"{fld}.signal", SIGNALS) for s in (sig if isinstance(sig, list) else [sig]))
        num = lambda k, default, **kw: S.number(d.get(k, default), f"{fld}.{k}", **kw)  # noqa: E731
        dur = lambda k, default, **kw: S.duration_s(d.get(k, default), f"{fld}.{k}", **kw)  # noqa: E731
        try:
            spec = AutoscalerSpec(
                capacity_rps=num("capacity_rps", None, above=0.0), ready_s=ready_seconds(d, fld),
                safety=num("safety", 1.0, above=0.0), drain_target_s=dur("drain_target_s", 60.0, above=0.0),
                signals=sigs, eval_period_s=dur("eval_period_s", 15.0, above=0.0),
                rate_window_s=dur("rate_window_s", 60.0, above=0.0),
                stabilisation_s=dur("stabilisation_s", 300.0), tolerance=num("tolerance", 0.0, minimum=0.0, below=1.0),
                max_step=int(num("max_step", 1, integer=True, minimum=1)) if "max_step" in d else None,
                cooldown_s=dur("cooldown_s", 0.0), drain_timeout_s=dur("drain_timeout_s", 600.0),
                warm_floor=int(num("warm_floor", 1, integer=True, minimum=0)),
                max_replicas=int(num("max_replicas", 64, integer=True, minimum=1)),
                ttft_target_ms=num("ttft_target_ms", 2000.0, above=0.0),
                kv_target=num("kv_target", 0.8, above=0.0, maximum=1.0),
                goodput_target=num("goodput_target", 0.99, above=0.0, maximum=1.0),
                request_work=num("request_work", None, above=0.0, optional=True),
                decode_token_weight=num("decode_token_weight", None, above=0.0, optional=True))
        except SpecError as exc:
            raise SpecError(exc.message, field=exc.field, fix=exc.fix) from None
        return cls(spec)

    def apply(self, ctx):
        c = _control(ctx)
        a = self.spec
        if a.max_replicas < c.initial:
            raise SpecError(f"autoscaler.max_replicas ({a.max_replicas}) is below the starting fleet "
                            f"({c.initial} replicas)", field="autoscaler.max_replicas")
        return _with_control(ctx, replace(c, autoscaler=a, ttft_limit_ms=a.ttft_target_ms))

    def describe(self):
        a = self.spec
        return (f"autoscaler ({', '.join(a.signals)}; C {a.capacity_rps:g} req/s, safety {a.safety:g}, "
                f"drain target {a.drain_target_s:g} s, ready {a.ready_s:g} s, {a.warm_floor}–"
                f"{a.max_replicas} replicas)")


