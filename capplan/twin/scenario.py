"""Scenarios: what to change about the twin's system, workload and run, as one YAML file, and
``run_scenario`` to simulate it into an ordinary study.

A scenario is a mapping of *parts*. Each part is one small frozen class registered under its
YAML key (:data:`PARTS`, :func:`register_part`); it is parsed once from its mapping and
applied, in registry order, to a :class:`ScenarioContext` (the twin and the synth
configuration built from it). Later work adds parts (failure, rollout, demand, autoscaler,
prefix cache, P/D, admission) by writing one class each — docs/twin.md "Scenarios" lists the
parts and how to add one.

.. code-block:: yaml

    name: lose-a-replica-at-peak
    system: {replicas: 1, speed: 1.0, max_batch: 128, queue_limit: 64}
    workload: {rates: [3, 4, 5], mix: {acme: 0.5, globex: 0.5}, arrival: {process: gamma, cv: 2}}
    run: {duration_s: 600, warmup_s: 30, repeats: 3, seed: 7}
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from ..errors import SpecError
from ..sim.arrivals import PROCESSES
from ..sim.config import ArrivalSpec, SynthConfig
from ..sim.lengths import LengthDist
from .. import spec as S

FORMAT = "capplan-scenario/1"
TOP = ("format", "name", "description", "slo")


@dataclass(frozen=True)
class ScenarioContext:
    """What the parts change: the twin (system) and the synth configuration (workload, run)."""

    twin: "Twin"
    config: SynthConfig
    notes: tuple[str, ...] = ()
    base_dir: Path | None = None

    def with_twin(self, twin: "Twin") -> "ScenarioContext":
        """A new twin: the configuration's replica block follows it."""
        cfg = replace(self.config, replicas=twin.replicas, replica=twin.replica_params(),
                      timeout_s=twin.timeout_s, system={**self.config.system, "replicas": twin.replicas})
        return replace(self, twin=twin, config=cfg)


class Part:
    """Base of scenario parts: ``key`` is the YAML key; ``parse`` reads the mapping (SpecError
    naming the field on any problem); ``apply`` returns the changed context."""

    key: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    @classmethod
    def parse(cls, raw: dict, fld: str) -> "Part":  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, ctx: ScenarioContext) -> ScenarioContext:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:
        return self.key


PARTS: dict[str, type[Part]] = {}


def register_part(cls: type[Part]) -> type[Part]:
    if not cls.key or cls.key in PARTS or cls.key in TOP:
        raise ValueError(f"scenario part key {cls.key!r} is empty or taken")
    PARTS[cls.key] = cls
    return cls


@register_part
@dataclass(frozen=True)
class SystemPart(Part):
    """Change the served system: replicas, service speed, scheduler and memory limits."""

    key: ClassVar[str] = "system"
    summary: ClassVar[str] = "replicas, speed (service speed factor), max_batch, kv_capacity_tokens, " \
                             "token_budget, queue_limit (null: unbounded), prefill_mode, prefill_lanes"
    replicas: int | None = None
    speed: float = 1.0
    max_batch: int | None = None
    kv_capacity_tokens: int | None = None
    token_budget: int | None = None
    queue_limit: int | None | str = "keep"
    prefill_mode: str | None = None
    prefill_lanes: int | None | str = "keep"

    @classmethod
    def parse(cls, raw, fld):
        d = S.mapping(raw, fld, known=("replicas", "speed", "max_batch", "kv_capacity_tokens", "token_budget",
                               "queue_limit", "prefill_mode", "prefill_lanes"))
        opt = lambda k, **kw: S.number(d[k], f"{fld}.{k}", **kw) if k in d else None  # noqa: E731
        return cls(
            replicas=opt("replicas", integer=True, minimum=1), speed=S.number(d.get("speed", 1.0), f"{fld}.speed", above=0.0),
            max_batch=opt("max_batch", integer=True, minimum=1),
            kv_capacity_tokens=opt("kv_capacity_tokens", integer=True, minimum=1),
            token_budget=opt("token_budget", integer=True, minimum=1),
            queue_limit=S.number(d["queue_limit"], f"{fld}.queue_limit", integer=True, minimum=0, optional=True)
            if "queue_limit" in d else "keep",
            prefill_mode=S.choice(d["prefill_mode"], f"{fld}.prefill_mode", ("mixed", "separate"))
            if "prefill_mode" in d else None,
            prefill_lanes=S.number(d["prefill_lanes"], f"{fld}.prefill_lanes", integer=True, minimum=1, optional=True)
            if "prefill_lanes" in d else "keep")

    def apply(self, ctx):
        tw = ctx.twin
        vals = {k: getattr(self, k) for k in ("replicas", "max_batch", "kv_capacity_tokens", "token_budget",
                                              "prefill_mode") if getattr(self, k) is not None}
        if self.queue_limit != "keep":
            vals["queue_limit"] = self.queue_limit
        if self.prefill_lanes != "keep":
            vals["prefill_lanes"] = self.prefill_lanes
        if vals:
            tw = tw.with_values(**vals)
        if self.speed != 1.0:
            tw = tw.scaled(decode=1.0 / self.speed, prefill=1.0 / self.speed)
        return ctx.with_twin(tw)

    def describe(self):
        parts = [f"{k} {getattr(self, k)}" for k in ("replicas", "max_batch", "kv_capacity_tokens", "token_budget",
                                                    "prefill_mode") if getattr(self, k) is not None]
        if self.queue_limit != "keep":
            parts.append(f"queue_limit {self.queue_limit}")
        if self.speed != 1.0:
            parts.append(f"service {self.speed:g}× as fast")
        return "system: " + (", ".join(parts) or "as measured")


@register_part
@dataclass(frozen=True)
class WorkloadPart(Part):
    """Change what the clients send: rate or sweep, tenant mix, arrival process, trace replay,
    answer/prompt length scaling."""

    key: ClassVar[str] = "workload"
    summary: ClassVar[str] = "rate_rps or rates: [...], mix: {tenant: share}, arrival: {process: measured|" \
                             "poisson|constant|gamma (cv)|replay (path, format, start_row)}, input_scale, output_scale"
    rates: tuple[float, ...] | None = None
    mix: tuple[tuple[str, float], ...] | None = None
    arrival: ArrivalSpec | None = None
    input_scale: float = 1.0
    output_scale: float = 1.0

    @classmethod
    def parse(cls, raw, fld, base_dir: Path | None = None):
        d = S.mapping(raw, fld, known=("rate_rps", "rates", "mix", "arrival", "input_scale", "output_scale"))
        if "rate_rps" in d and "rates" in d:
            raise SpecError(f"give {fld}.rate_rps or {fld}.rates, not both", field=fld)
        rates = None
        if "rate_rps" in d:
            rates = (S.number(d["rate_rps"], f"{fld}.rate_rps", above=0.0),)
        elif "rates" in d:
            rr = d["rates"]
            if not isinstance(rr, list) or not rr:
                raise SpecError(f"{fld}.rates must be a non-empty list", field=f"{fld}.rates", fix="e.g. rates: [2, 4, 6]")
            rates = tuple(S.number(r, f"{fld}.rates[{i}]", above=0.0) for i, r in enumerate(rr))
        mix = None
        if "mix" in d:
            m = S.mapping(d["mix"], f"{fld}.mix")
            if not m:
                raise SpecError(f"{fld}.mix is empty", field=f"{fld}.mix", fix="e.g. mix: {acme: 0.5, globex: 0.5}")
            mix = tuple((str(k), S.number(v, f"{fld}.mix.{k}", minimum=0.0)) for k, v in m.items())
            if sum(v for _, v in mix) <= 0:
                raise SpecError(f"{fld}.mix shares must not all be 0", field=f"{fld}.mix")
        arrival = None
        if "arrival" in d:
            a = S.mapping(d["arrival"], f"{fld}.arrival", known=("process", "cv", "path", "format", "start_row"))
            proc = S.choice(a.get("process", "poisson"), f"{fld}.arrival.process", ("measured",) + PROCESSES)
            if proc == "measured":
                arrival = ArrivalSpec("measured")
            elif proc == "replay":
                if not a.get("path"):
                    raise SpecError("replay arrivals need a trace path", field=f"{fld}.arrival.path",
                                    fix="an Azure LLM inference CSV or a Mooncake JSONL")
                p = Path(str(a["path"])).expanduser()
                if not p.is_absolute() and base_dir is not None:
                    p = base_dir / p
                if not p.is_file():
                    raise SpecError("trace file not found", field=f"{fld}.arrival.path", file=str(p))
                arrival = ArrivalSpec("replay", 1.0, str(p), S.choice(a.get("format", "auto"), f"{fld}.arrival.format",
                                                                  ("auto", "azure", "mooncake")),
                                      S.number(a.get("start_row", 0), f"{fld}.arrival.start_row", integer=True, minimum=0))
            else:
                arrival = ArrivalSpec(proc, S.number(a.get("cv", 1.0), f"{fld}.arrival.cv", above=0.0))
        return cls(rates, mix, arrival, S.number(d.get("input_scale", 1.0), f"{fld}.input_scale", above=0.0),
                   S.number(d.get("output_scale", 1.0), f"{fld}.output_scale", above=0.0))

    def apply(self, ctx):
        cfg = ctx.config
        notes = list(ctx.notes)
        if self.rates is not None:
            cfg = replace(cfg, rates=self.rates)
        if self.arrival is not None:
            cfg = replace(cfg, arrival=ctx.twin.workload.arrival if self.arrival.process == "measured" else self.arrival)
        if self.mix is not None:
            have = {t.name: t for t in cfg.tenants}
            unknown = [n for n, _ in self.mix if n not in have]
            if unknown:
                raise SpecError(f"workload.mix names tenant(s) the twin does not know: {', '.join(unknown)}",
                                field="workload.mix", fix="tenants: " + (", ".join(have) or "(none measured)"))
            share = dict(self.mix)
            cfg = replace(cfg, tenants=tuple(replace(t, share=share.get(t.name, 0.0)) for t in cfg.tenants
                                             if share.get(t.name, 0.0) > 0))
        if self.input_scale != 1.0 or self.output_scale != 1.0:
            cfg = replace(cfg, lengths=_scaled(cfg.lengths, self.input_scale, self.output_scale),
                          tenants=tuple(replace(t, lengths=_scaled(t.lengths, self.input_scale, self.output_scale)
                                                if t.lengths else None) for t in cfg.tenants))
            longest = max([cfg.lengths.max_total] + [t.lengths.max_total for t in cfg.tenants if t.lengths])
            if longest > cfg.replica.max_model_len:
                notes.append(f"scaled lengths reach {longest} tokens, above max_model_len "
                             f"{cfg.replica.max_model_len}: such requests end in an error")
        return replace(ctx, config=cfg, notes=tuple(notes))

    def describe(self):
        parts = []
        if self.rates is not None:
            parts.append("rates " + ", ".join(f"{r:g}" for r in self.rates) + " req/s")
        if self.mix is not None:
            parts.append("mix " + ", ".join(f"{n} {v:g}" for n, v in self.mix))
        if self.arrival is not None:
            parts.append(f"{self.arrival.process} arrivals")
        if self.input_scale != 1.0 or self.output_scale != 1.0:
            parts.append(f"prompts ×{self.input_scale:g}, answers ×{self.output_scale:g}")
        return "workload: " + (", ".join(parts) or "as measured")


def _scaled(dist: LengthDist | None, si: float, so: float) -> LengthDist | None:
    if dist is None:
        return None
    if dist.kind == "empirical":
        return LengthDist.empirical(dist.levels, [max(1.0, x * si) for x in dist.input_q],
                                    [max(1.0, x * so) for x in dist.output_q], dist.rho)
    if dist.kind == "fixed":
        return LengthDist.from_dict({"kind": "fixed", "input": max(1, round(dist.input.median * si)),
                                     "output": max(1, round(dist.output.median * so))})
    m = lambda x, s: {"median": x.median * s, "sigma": x.sigma, "min": max(1, round(x.min * s)),  # noqa: E731
                      "max": max(1, round(x.max * s))}
    return LengthDist.from_dict({"kind": "lognormal", "input": m(dist.input, si), "output": m(dist.output, so),
                                 "rho": dist.rho})


@register_part
@dataclass(frozen=True)
class RunPart(Part):
    """Change the run protocol: duration, warm-up, repeats per rate, seed."""

    key: ClassVar[str] = "run"
    summary: ClassVar[str] = "duration_s, warmup_s, repeats, seed"
    duration_s: float | None = None
    warmup_s: float | None = None
    repeats: int | None = None
    seed: int | None = None

    @classmethod
    def parse(cls, raw, fld):
        d = S.mapping(raw, fld, known=("duration_s", "warmup_s", "repeats", "seed"))
        opt = lambda k, **kw: S.number(d[k], f"{fld}.{k}", **kw) if k in d else None  # noqa: E731
        return cls(opt("duration_s", above=0.0), opt("warmup_s", minimum=0.0),
                   opt("repeats", integer=True, minimum=1), opt("seed", integer=True, minimum=0))

    def apply(self, ctx):
        cfg = ctx.config
        kw = {}
        if self.duration_s is not None:
            kw["duration_s"] = float(self.duration_s)
        if self.warmup_s is not None:
            kw["warmup_s"] = float(self.warmup_s)
        if self.repeats is not None:
            kw["repeats"] = int(self.repeats)
        if self.seed is not None:
            kw["seed"] = int(self.seed)
        cfg = replace(cfg, **kw)
        if cfg.warmup_s >= cfg.duration_s:
            raise SpecError(f"run.warmup_s ({cfg.warmup_s:g}) must be shorter than run.duration_s "
                            f"({cfg.duration_s:g})", field="run.warmup_s")
        return replace(ctx, config=cfg)

    def describe(self):
        kv = [f"{k} {getattr(self, k):g}" for k in ("duration_s", "warmup_s", "repeats", "seed")
              if getattr(self, k) is not None]
        return "run: " + (", ".join(kv) or "as measured")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    parts: tuple[Part, ...]
    raw: dict = field(default_factory=dict, compare=False)
    path: str | None = None
    sha256: str = ""
    marks: S.Document | None = field(default=None, compare=False, repr=False)  # line marks of the file
    slo: str | None = None  # recorded in the study, so `capplan timeline` needs no --slo

    def apply(self, twin: "Twin") -> ScenarioContext:
        ctx = ScenarioContext(twin, twin.synth_config(name=self.name), (), Path(self.path).parent if self.path else None)
        return apply_parts(self.parts, ctx)

    def describe(self) -> str:
        return "; ".join(p.describe() for p in self.parts) or "the twin as fitted"


def parse_parts(d: dict, fld: str = "", *, base_dir: Path | None = None) -> tuple[Part, ...]:
    """The parts of the mapping ``d`` (keys of :data:`PARTS`; others are the caller's to
    check), each read by its registered class in registry order; errors name ``fld.key``."""
    parts = []
    for key, cls in PARTS.items():
        if key in d:
            if "base_dir" in inspect.signature(cls.parse).parameters:  # parts that read files
                parts.append(cls.parse(d[key], S.join(fld, key), base_dir=base_dir))
            else:
                parts.append(cls.parse(d[key], S.join(fld, key)))
    return tuple(parts)


def apply_parts(parts, ctx: ScenarioContext) -> ScenarioContext:
    """``parts`` applied to ``ctx`` in registry order (whatever order they were given in)."""
    by_key = {p.key: p for p in parts}
    for key in PARTS:
        if key in by_key:
            ctx = by_key[key].apply(ctx)
    return ctx


def parse_scenario(raw: dict, *, base_dir: Path | None = None) -> Scenario:
    d = S.mapping(raw, "", what="scenario file", optional=False)
    unknown = sorted(set(d) - set(TOP) - set(PARTS))
    if unknown:
        raise SpecError(f"unknown scenario part(s): {', '.join(unknown)}", field="scenario",
                        fix="known parts: " + ", ".join(PARTS) + " (and name, description)")
    fmt = d.get("format", FORMAT)
    if fmt != FORMAT:
        raise SpecError(f"unknown scenario format {fmt!r}", field="format", fix=f"this capplan reads {FORMAT}")
    parts = parse_parts(d, base_dir=base_dir)
    slo = None
    if d.get("slo") is not None:
        from ..slo import SLO

        try:
            slo = str(SLO.parse(d["slo"]))
        except SpecError as exc:
            raise SpecError(exc.message, field="slo", fix=exc.fix) from None
    return Scenario(str(d.get("name") or "scenario"), str(d.get("description") or ""), parts, dict(raw),
                    slo=slo)


def load_scenario(path: str | os.PathLike) -> Scenario:
    """Read scenario.yaml (SpecError with the file, line and field on any problem)."""
    doc = S.document(Path(path).expanduser(), what="scenario file", fix="see docs/twin.md \"Scenarios\"")
    with doc.located():
        sc = parse_scenario(doc.data, base_dir=Path(path).expanduser().parent)
    return replace(sc, path=str(path), sha256=hashlib.sha256(Path(path).read_bytes()).hexdigest(),
                   marks=doc)


def as_scenario(scenario) -> Scenario:
    """A Scenario from a Scenario, its mapping (as in scenario.yaml) or a scenario file: what a
    notebook has in hand becomes the object once, at the edge."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        return parse_scenario(scenario)
    return load_scenario(scenario)


def run_scenario(twin: "Twin | str | os.PathLike", scenario: "Scenario | dict | str | os.PathLike",
                 out: str | os.PathLike, *, twin_path: str | None = None,
                 workers: int | None = None, progress: bool = False):
    """Simulate ``scenario`` (a Scenario, its mapping or a scenario file) on ``twin`` (a Twin or
    a twin file) and write an ordinary study at ``out`` (atomically); its study.yaml records the
    twin (with its last check) and the scenario. Returns (path, per-run stats, context)."""
    from ..sim.sweep import generate_study

    if isinstance(twin, (str, os.PathLike)):  # a twin file
        from .twinfile import load_twin

        twin_path = twin_path or str(twin)
        twin = load_twin(twin)
    scenario = as_scenario(scenario)
    try:
        ctx = scenario.apply(twin)
    except SpecError as exc:
        raise (scenario.marks.locate(exc) if scenario.marks is not None else exc) from None
    tw = ctx.twin
    twin_rec = {"name": tw.name, "file": twin_path, "fitted_from": {k: tw.source.get(k) for k in ("study", "sha256")},
                "last_check": tw.last_check, "edited": list(tw.edited)}
    if twin_path and Path(twin_path).is_file():
        twin_rec["sha256"] = hashlib.sha256(Path(twin_path).read_bytes()).hexdigest()
    sc_rec = {"name": scenario.name, "file": scenario.path, "sha256": scenario.sha256,
              "description": scenario.description, "summary": scenario.describe(),
              "spec": json.loads(json.dumps(scenario.raw, default=str))}
    warn = twin.warning
    readme = ["", "## Twin and scenario", "",
              f"Simulated by the capplan twin `{tw.name}` (fitted from {tw.source.get('study', '?')}) under the "
              f"scenario `{scenario.name}`: {scenario.describe()}."]
    if warn:
        readme += ["", f"**{warn}**"]
    if ctx.notes:
        readme += [""] + [f"- {n}" for n in ctx.notes]
    cfg = replace(ctx.config, description=(ctx.config.description + " " + scenario.description).strip(),
                  power=None)
    path, stats = generate_study(cfg, out, workers=workers, progress=progress,
                                 manifest_extra={"twin": twin_rec, "scenario": sc_rec,
                                                 **({"slo": scenario.slo} if scenario.slo else {})},
                                 readme_extra="\n".join(readme))
    return path, stats, ctx
