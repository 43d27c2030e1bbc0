"""The SLO: which limits make a request *good*, and the attainment target.

A request is good when its status is ``ok`` and every limit that is set holds. TTFT counts from
``scheduled_ns`` by default, so a generator that fell behind cannot hide queueing
(coordinated omission).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .errors import SpecError

_FLOAT_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "attainment", "max_error_rate")
_ALL_KEYS = _FLOAT_KEYS + ("itl_stat", "ttft_from")


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
        for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            v = getattr(self, k)
            if v is not None and not (v > 0):
                raise SpecError(f"SLO limit {k} must be > 0, got {v}", field=k,
                                fix=f"give a positive limit, e.g. {k}=2000")
        if not (0.0 < self.attainment < 1.0):
            raise SpecError(f"SLO attainment must be between 0 and 1 (exclusive), got {self.attainment}",
                            field="attainment", fix="e.g. attainment=0.99")
        if self.max_error_rate is not None and not (0.0 <= self.max_error_rate < 1.0):
            raise SpecError(f"max_error_rate must be in [0, 1), got {self.max_error_rate}",
                            field="max_error_rate")
        if self.itl_stat not in ("p99", "max"):
            raise SpecError(f"itl_stat must be p99 or max, got {self.itl_stat!r}", field="itl_stat")
        if self.ttft_from not in ("scheduled", "sent"):
            raise SpecError(f"ttft_from must be scheduled or sent, got {self.ttft_from!r}",
                            field="ttft_from")
        if all(getattr(self, k) is None for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")):
            raise SpecError("an SLO needs at least one latency limit (ttft_ms, tpot_ms, itl_ms or e2e_ms)",
                            fix="e.g. --slo ttft_ms=2000,attainment=0.99")

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
        unknown = sorted(set(items) - set(_ALL_KEYS))
        if unknown:
            raise SpecError(f"unknown SLO key(s): {', '.join(unknown)}",
                            fix="known keys: " + ", ".join(_ALL_KEYS))
        kw = {}
        for k, v in items.items():
            if v is None:
                continue
            if k in _FLOAT_KEYS:
                try:
                    kw[k] = float(v)
                except (TypeError, ValueError):
                    raise SpecError(f"SLO value {k}={v!r} is not a number", field=k) from None
            else:
                kw[k] = str(v)
        return cls(**kw)

    def with_(self, **kw) -> "SLO":
        return replace(self, **kw)

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
