"""The SLO: which limits make a request *good*, the attainment target, and the settings of
"the measured C_SLO" at it (``CSLO_CONFIDENCE``, ``CSLO_REPS``, ``CSLO_SEED``).

A request is good when its status is ``ok`` and every limit that is set holds. TTFT counts from
``scheduled_ns`` by default, so a generator that fell behind cannot hide queueing
(coordinated omission).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, replace

import numpy as np

from . import spec as S
from .errors import SLOUnitWarning, SpecError

_LIMIT_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
_FLOAT_KEYS = _LIMIT_KEYS + ("attainment", "max_error_rate")
_ALL_KEYS = _FLOAT_KEYS + ("itl_stat", "ttft_from")

#: the plausible range of each limit, in ms: below it the number reads as seconds typed as ms,
#: above it as microseconds (a TTFT over 10 minutes, a token gap over a minute)
PLAUSIBLE_MS = {"ttft_ms": (10.0, 600_000.0), "tpot_ms": (1.0, 60_000.0),
                "itl_ms": (1.0, 60_000.0), "e2e_ms": (10.0, 3_600_000.0)}


def unit_warnings(slo: "SLO") -> tuple[str, ...]:
    """One line per limit outside its plausible range (``PLAUSIBLE_MS``), naming the likely
    mistake and the value meant: ``ttft_ms=0.5`` is almost surely 0.5 s, i.e. 500 ms."""
    def plain(x: float) -> str:  # as typed on a command line: 500, 2000000, 0.25
        return np.format_float_positional(round(float(x), 9), trim="-")

    out = []
    for key, (low_ms, high_ms) in PLAUSIBLE_MS.items():
        v = getattr(slo, key)
        if v is None:
            continue
        if v < low_ms:
            out.append(f"{key}={plain(v)} looks like seconds: did you mean {key}={plain(v * 1000)}? "
                       f"(SLO limits are in milliseconds; under {plain(low_ms)} ms is implausible)")
        elif v > high_ms:
            out.append(f"{key}={plain(v)} looks like microseconds: did you mean {key}={plain(v / 1000)}? "
                       f"(SLO limits are in milliseconds; over {plain(high_ms)} ms is implausible)")
    return tuple(out)


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    itl_stat: str = "p99"  # "p99" | "max" of a request's inter-token gaps
    e2e_ms: float | None = None
    attainment: float = 0.99
    max_error_rate: float | None = None
    ttft_from: str = "scheduled"  # "scheduled" | "sent"

    def __post_init__(self):
        for k in _LIMIT_KEYS:
            if getattr(self, k) is not None:
                S.number(getattr(self, k), k, above=0.0, example="2000")
        S.number(self.attainment, "attainment", above=0.0, below=1.0, example="0.99")
        S.number(self.max_error_rate, "max_error_rate", minimum=0.0, below=1.0, optional=True,
                 example="0.005")
        S.choice(self.itl_stat, "itl_stat", ("p99", "max"))
        S.choice(self.ttft_from, "ttft_from", ("scheduled", "sent"))
        if all(getattr(self, k) is None for k in _LIMIT_KEYS):
            S.fail("", "an SLO needs at least one latency limit (ttft_ms, tpot_ms, itl_ms or e2e_ms)",
                   "e.g. --slo ttft_ms=2000,attainment=0.99")
        for line in unit_warnings(self):  # said, not refused: an odd SLO can be meant
            warnings.warn(line, SLOUnitWarning, stacklevel=3)

    @classmethod
    def parse(cls, text: str | dict | "SLO") -> "SLO":
        """Parse ``ttft_ms=2000,tpot_ms=100,attainment=0.99`` (or a dict, or an SLO)."""
        if isinstance(text, SLO):
            return text
        if isinstance(text, dict):
            items = dict(text)
        else:
            items = {}
            for part in str(text).split(","):
                part = part.strip()
                if not part:
                    continue
                if "=" not in part:
                    raise SpecError(f"cannot read SLO part {part!r}: expected key=value",
                                    fix="e.g. --slo ttft_ms=2000,tpot_ms=100,attainment=0.99")
                k, v = part.split("=", 1)
                items[k.strip()] = v.strip()
        unknown = [str(k) for k in items if k not in _ALL_KEYS]
        if unknown:
            near = S.did_you_mean(unknown[0], _ALL_KEYS)
            S.fail(unknown[0], f"unknown SLO key(s): {', '.join(unknown)}"
                   + (f" (did you mean {near}?)" if near else ""), "known keys: " + ", ".join(_ALL_KEYS))
        kw = {}
        for k, v in items.items():
            if v is None:
                continue
            kw[k] = S.number(v, k, text_ok=True) if k in _FLOAT_KEYS else str(v)
        return cls(**kw)

    def with_(self, **kw) -> "SLO":
        return replace(self, **kw)

    def same_limits(self, other: "SLO") -> bool:
        """Whether both SLOs call the same requests good: same latency limits and ways of
        measuring them (the attainment target and max_error_rate do not change who is good)."""
        return (self.with_(attainment=0.5, max_error_rate=None)
                == other.with_(attainment=0.5, max_error_rate=None))

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        parts = []
        if self.ttft_ms is not None:
            parts.append(f"TTFT ≤ {self.ttft_ms:g} ms")
        if self.tpot_ms is not None:
            parts.append(f"TPOT ≤ {self.tpot_ms:g} ms")
        if self.itl_ms is not None:
            parts.append(f"ITL {self.itl_stat} ≤ {self.itl_ms:g} ms")
        if self.e2e_ms is not None:
            parts.append(f"E2E ≤ {self.e2e_ms:g} ms")
        return f"{self.attainment:.4g} of requests with " + ", ".join(parts)

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.to_dict().items())


@dataclass(frozen=True)
class GoodTerm:
    """One limit of the SLO-good rule: the per-request metric ``column`` (a name of
    ``capplan.metrics.request_view``, in ms) is at most ``limit_ms``; a missing value passes
    when ``missing_passes`` (TPOT of a one-token answer, ITL without a gap list), else fails."""

    column: str
    limit_ms: float
    missing_passes: bool


def good_terms(slo: SLO) -> tuple[GoodTerm, ...]:
    """The SLO-good rule, the one definition that the SQL predicate
    (``capplan.metrics.good_predicate``) and the array mask (:func:`good_array`) are built from:
    a request is good when its status is ``ok``, it has a first token, and every term holds.
    TTFT counts from ``sent`` (``ttft_sent_ms``, from scheduled where the send is unknown) when
    ``ttft_from = sent``; E2E always from scheduled; ITL is the request's p99 or max gap."""
    terms = []
    if slo.ttft_ms is not None:
        terms.append(GoodTerm("ttft_ms" if slo.ttft_from == "scheduled" else "ttft_sent_ms",
                              float(slo.ttft_ms), False))
    if slo.tpot_ms is not None:
        terms.append(GoodTerm("tpot_ms", float(slo.tpot_ms), True))
    if slo.itl_ms is not None:
        terms.append(GoodTerm("itl_p99_ms" if slo.itl_stat == "p99" else "itl_max_ms", float(slo.itl_ms), True))
    if slo.e2e_ms is not None:
        terms.append(GoodTerm("e2e_ms", float(slo.e2e_ms), False))
    return tuple(terms)


def good_array(slo: SLO, ok: np.ndarray, metric, without: tuple[str, ...] = ()) -> np.ndarray:
    """:func:`good_terms` on arrays: ``ok`` = status ok with a first token; ``metric(column)``
    gives that column per request, NaN where the SQL view has NULL (NaN ≤ limit is false,
    as NULL ≤ limit is not true). ``without``: columns whose terms are left out (the
    reduction's grid eligibility, which keeps only the limits off the grid's axes)."""
    g = np.asarray(ok, dtype=bool).copy()
    for t in good_terms(slo):
        if t.column in without:
            continue
        v = np.asarray(metric(t.column), dtype=np.float64)
        with np.errstate(invalid="ignore"):
            hold = v <= t.limit_ms
        g &= (hold | np.isnan(v)) if t.missing_passes else hold
    return g


def override_note(base: "SLO | None", given: "SLO") -> str | None:
    """What an SLO given on the command line (which replaces the spec's SLO whole) leaves out of
    the spec's SLO, in words, or None when it keeps every limit."""
    if base is None:
        return None
    dropped = [k for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "max_error_rate")
               if getattr(base, k) is not None and getattr(given, k) is None]
    if not dropped:
        return None
    parts = ", ".join(f"{k}={getattr(base, k):g}" for k in dropped)
    return (f"--slo replaces the spec's SLO ({base.describe()}): its {parts} "
            f"{'is' if len(dropped) == 1 else 'are'} not used; add {parts} to --slo to keep "
            f"{'it' if len(dropped) == 1 else 'them'}")
# ----------------------------------------------------------------------------- SLO classes

#: the class name that covers requests of any class the file does not name (or of none)
DEFAULT_CLASS = "default"


@dataclass(frozen=True)
class SLOClasses:
    """One SLO per ``slo_class`` (e.g. interactive: TTFT ≤ 1 s at 99 %; batch: E2E ≤ 10 min at
    95 %), plus a ``default`` for requests of any other class and those without one. Read from
    an SLO file (``load_slo_file``); docs/mix.md, "SLO classes"."""

    classes: tuple[tuple[str, SLO], ...]
    default: SLO | None = None
    source: str | None = None

    def __post_init__(self):
        names = [c for c, _ in self.classes]
        if len(set(names)) != len(names):
            raise SpecError(f"SLO classes named twice: {sorted({c for c in names if names.count(c) > 1})}",
                            field="classes", fix="give each class one SLO")
        if not self.classes and self.default is None:
            raise SpecError("an SLO file needs at least one class or a default",
                            fix="e.g. classes: {interactive: {ttft_ms: 1000, attainment: 0.99}}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.classes)

    def slo_for(self, slo_class: str | None) -> SLO | None:
        """The SLO of a class (the default for a class the file does not name)."""
        for c, s in self.classes:
            if c == slo_class:
                return s
        return self.default

    def describe(self) -> str:
        parts = [f"{c}: {s.describe()}" for c, s in self.classes]
        if self.default is not None:
            parts.append(f"any other class: {self.default.describe()}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        out: dict = {}
        if self.default is not None:
            out[DEFAULT_CLASS] = self.default.to_dict()
        out["classes"] = {c: s.to_dict() for c, s in self.classes}
        return out

    def __str__(self) -> str:
        return "; ".join(f"{c}: {s}" for c, s in self.classes) + (
            f"; {DEFAULT_CLASS}: {self.default}" if self.default is not None else "")


def load_slo_file(source) -> SLOClasses:
    """Read an SLO file (path or mapping), e.g.::

        default: {ttft_ms: 2000, tpot_ms: 100, attainment: 0.99}
        classes:
          interactive: {ttft_ms: 1000, tpot_ms: 50, attainment: 0.99}
          batch: "e2e_ms=600000,attainment=0.95"

    Each SLO is a mapping of SLO keys or the ``key=value,…`` text ``--slo`` takes. Every bad
    value raises SpecError with the field, the line and a fix."""
    if isinstance(source, SLOClasses):
        return source
    from . import spec as S

    doc = S.document(source, what="SLO classes", fix="start from templates/slo.yaml (docs/mix.md, SLO classes)")
    with doc.located():
        raw = S.mapping(doc.data, "", known=(DEFAULT_CLASS, "classes"), what="SLO file", optional=False,
                        example="classes: {interactive: {ttft_ms: 1000, attainment: 0.99}}")
        default = _slo_at(raw.get(DEFAULT_CLASS), DEFAULT_CLASS)
        classes = tuple((str(c), _slo_at(v, S.join("classes", c), required=True))
                        for c, v in S.mapping(raw.get("classes"), "classes").items())
        if any(c == DEFAULT_CLASS for c, _ in classes):
            S.fail(S.join("classes", DEFAULT_CLASS), f"'{DEFAULT_CLASS}' is not a class name here",
                   f"write the default SLO at the top level ({DEFAULT_CLASS}: ...)")
        return SLOClasses(classes=classes, default=default, source=doc.file)


def _slo_at(value, field: str, required: bool = False) -> SLO | None:
    from . import spec as S

    if value is None:
        if required:
            S.fail(field, f"{field} has no SLO", "e.g. {ttft_ms: 1000, attainment: 0.99}")
        return None
    if not isinstance(value, (str, dict)):
        S.fail(field, f"{field} must be an SLO mapping or text, got {S.describe(value)}",
               "e.g. {ttft_ms: 1000, tpot_ms: 50, attainment: 0.99}")
    try:
        return SLO.parse(value)
    except SpecError as exc:
        S.fail(field + (f".{exc.field}" if exc.field else ""), exc.message, exc.fix)


#: "The measured C_SLO" of a study at an SLO is ``capplan.fit_envelope`` (run-to-run variation
#: included) with these settings — the interval's confidence, the bootstrap replicates and the
#: seed — wherever a command or a page prints it under that name: ``capplan envelope``, ``plan``,
#: ``mix`` (its tested mix), ``design`` (its "now"), ``twin check``, the report's pages and the
#: what-if (the plan spec's ``capacity:`` defaults are these). The C_SLO's estimate moves with the
#: replicates too (200 read the demo's 5.301 as 5.300, its lower bound 5.118 as 5.188), so a
#: number fitted with other settings is labelled as an approximation beside this one
#: (docs/envelope.md, "One measured C_SLO").
CSLO_CONFIDENCE = 0.95
CSLO_REPS = 1000
CSLO_SEED = 0

#: the fewest bootstrap replicates any command or call accepts: below it the interval's ends
#: are one or two replicates, not quantiles (the defaults are ``CSLO_REPS``)
MIN_REPS = 10


def check_reps(reps: int, option: str = "--reps") -> int:
    """``reps`` when at least :data:`MIN_REPS`; else the one message every command gives."""
    if reps < MIN_REPS:
        raise SpecError(f"{option} must be ≥ {MIN_REPS}, got {reps}", field=option.lstrip("-"),
                        fix=f"e.g. {option} {CSLO_REPS}")
    return reps


def check_confidence(confidence: float, option: str = "--confidence") -> float:
    """``confidence`` when strictly between 0.5 and 1; else the one message every command gives."""
    if not 0.5 < confidence < 1.0:
        raise SpecError(f"{option} must be between 0.5 and 1, got {confidence}",
                        field=option.lstrip("-"), fix=f"e.g. {option} {CSLO_CONFIDENCE}")
    return confidence
