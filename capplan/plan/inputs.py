"""The inputs a plan stands on, resolved in one place: the value given (a command-line option,
a notebook parameter, a page's argument), else the plan spec's, else capplan's built-in default
— and which of the three each one is.

``capplan plan``, ``capplan report`` (before any kernel starts), every notebook
(``capplan.notebook.setup``), the what-if panel, the mix page and its panel call
:func:`resolve_inputs`, so one spec gives one SLO, one bootstrap (replicates, seed, confidence)
and one plan wherever it is read. A default that changes a number is said: the built-in SLO
used because neither a given SLO nor the spec has one is in ``notes``, beside what a given SLO
leaves out of the spec's (docs/plan.md, "Where the inputs come from")::

    inputs = resolve_inputs(load_plan_spec("templates/plan.yaml"), reps=200)
    inputs.reps, inputs.source("reps"), inputs.source("seed")   # 200, "given", "spec"
    make_plan(inputs.spec, study=study)                          # the values written in
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import SpecError
from ..slo import SLO, SLOClasses, check_confidence, check_reps, load_slo_file, override_note
from .spec import PlanSpec, load_plan_spec

#: the SLO a page uses when neither a given SLO nor the spec has one (said in ``notes``)
BUILTIN_SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"

#: where a resolved value came from
GIVEN, SPEC, DEFAULT = "given", "spec", "default"

#: resolved name → the spec's key(s) that hold it
SPEC_KEYS = {"slo": "slo", "reps": "capacity.reps", "seed": "capacity.seed",
             "confidence": "capacity.confidence", "use": "capacity.use",
             "accept_optimistic": "capacity.accept_optimistic",
             "gpus_per_replica": ("replica_group.gpus_per_replica", "replica_group.tp", "replica_group.pp"),
             "slo_classes": ("slo_file", "slo_classes"),
             "target": "mix.target", "twin": "mix.twin"}


@dataclass(frozen=True)
class PlanInputs:
    """The resolved inputs; ``spec`` has them written in (what ``make_plan`` takes)."""

    spec: PlanSpec
    slo: SLO | None  # None only when no built-in SLO was asked for and neither gave one
    reps: int
    seed: int
    confidence: float
    use: str  # which C_SLO the plan uses: lower_bound or estimate
    accept_optimistic: bool
    gpus_per_replica: int | None  # None: the study's (``plan.gpus_per_group``)
    slo_classes: SLOClasses | None
    target: str | None  # the production mix (``mix.target``)
    twin: str | None  # the twin the target mix runs through (``mix.twin``)
    #: (name, "given" | "spec" | "default") for every name above but ``spec``
    sources: tuple[tuple[str, str], ...]
    #: said out loud: a given SLO that leaves out the spec's limits, a built-in SLO used
    notes: tuple[str, ...] = ()

    def source(self, name: str) -> str:
        """Where ``name`` came from: "given", "spec" or "default" (capplan's built-in)."""
        return dict(self.sources)[name]

    @property
    def defaults(self) -> tuple[str, ...]:
        """The names that came from capplan's built-in defaults (neither given nor in the spec)."""
        return tuple(n for n, s in self.sources if s == DEFAULT)

    def parameters(self) -> dict:
        """The bootstrap and SLO as an export records them."""
        return {"slo": str(self.slo) if self.slo is not None else None, "reps": self.reps, "seed": self.seed,
                "confidence": self.confidence, "use": self.use, "accept_optimistic": self.accept_optimistic}


def resolve_inputs(spec, *, slo=None, reps: int | None = None, seed: int | None = None,
                   confidence: float | None = None, use: str | None = None,
                   accept_optimistic: bool | None = None, gpus_per_replica: int | None = None,
                   slo_file=None, target=None, twin=None, builtin_slo: bool = True,
                   option_prefix: str = "--") -> PlanInputs:
    """Resolve the inputs of a plan from what was given (None: not given) and ``spec`` (a
    PlanSpec, a YAML path or a mapping). ``builtin_slo``: with neither a given SLO nor one in
    the spec, use :data:`BUILTIN_SLO` and say so (the pages, which must draw something); False
    leaves the SLO None (``capplan plan`` then refuses, naming the spec's ``slo``).
    ``option_prefix`` names the options in errors ("--reps" on the command line, "reps" for a
    notebook parameter). A given value gets the one check every command makes (``slo.check_reps``,
    ``slo.check_confidence``, a seed ≥ 0), then the spec's own (``capacity.confidence`` ≤ 0.999,
    ``capacity.use``), naming the spec file. Raises SpecError."""
    spec = load_plan_spec(spec)
    keys = spec.file_keys
    sources: dict[str, str] = {}

    def pick(name: str, given, from_spec):
        if given is not None:
            sources[name] = GIVEN
            return given
        k = SPEC_KEYS[name]
        sources[name] = SPEC if keys & ({k} if isinstance(k, str) else set(k)) else DEFAULT
        return from_spec

    notes: list[str] = []
    if slo is not None:
        slo_obj = SLO.parse(slo)
        note = override_note(spec.slo, slo_obj)
        notes += [note] if note else []
        sources["slo"] = GIVEN
    elif spec.slo is not None:
        slo_obj, sources["slo"] = spec.slo, SPEC
    elif builtin_slo:
        slo_obj, sources["slo"] = SLO.parse(BUILTIN_SLO), DEFAULT
        notes.append(f"neither a given SLO nor the plan spec ({spec.source or 'given as a mapping'}) has one: "
                     f"capplan's default SLO is used ({slo_obj.describe()}); set slo: in the spec to choose")
    else:
        slo_obj, sources["slo"] = None, DEFAULT
    if reps is not None:
        check_reps(int(reps), f"{option_prefix}reps")
    if seed is not None and int(seed) < 0:
        raise SpecError(f"{option_prefix}seed must be ≥ 0, got {seed}", field="seed",
                        fix=f"e.g. {option_prefix}seed 0")
    if confidence is not None:
        check_confidence(float(confidence), f"{option_prefix}confidence")
    c = spec.capacity
    cap = {"reps": pick("reps", None if reps is None else int(reps), c.reps),
           "seed": pick("seed", None if seed is None else int(seed), c.seed),
           "confidence": pick("confidence", None if confidence is None else float(confidence), c.confidence),
           "use": pick("use", use, c.use),
           "accept_optimistic": pick("accept_optimistic", None if accept_optimistic is None
                                     else bool(accept_optimistic), c.accept_optimistic)}
    try:  # the spec's own checks (a confidence above 0.999, an unknown use), naming the spec file
        spec = dataclasses.replace(spec, capacity=dataclasses.replace(c, **cap))
    except SpecError as exc:
        raise SpecError(exc.args[0], field=exc.field, fix=exc.fix, file=spec.source) from None
    if slo_obj is not None:
        spec = dataclasses.replace(spec, slo=slo_obj)
    gpus = pick("gpus_per_replica", gpus_per_replica, spec.group.gpus)
    if gpus_per_replica is not None:
        spec = spec.with_(gpus_per_replica=gpus_per_replica)
    classes = pick("slo_classes", None if slo_file is None else load_slo_file(slo_file), spec.slo_classes)
    mix_target = pick("target", None if target is None else str(target), spec.mix.target)
    mix_twin = pick("twin", None if twin is None else str(twin), spec.mix.twin)
    names = ("slo", "reps", "seed", "confidence", "use", "accept_optimistic", "gpus_per_replica", "slo_classes",
             "target", "twin")
    return PlanInputs(spec=spec, slo=slo_obj, gpus_per_replica=gpus, slo_classes=classes, target=mix_target,
                      twin=mix_twin, sources=tuple((n, sources[n]) for n in names), notes=tuple(notes), **cap)
