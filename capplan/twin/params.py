"""The pieces a twin is made of: parameters with their provenance, decode points, and the
workload description. (The Twin itself is in capplan/twin/model.py.)"""

from __future__ import annotations

from dataclasses import dataclass

from ..sim.config import ArrivalSpec, Tenant
from ..sim.lengths import LengthDist

ESTIMATED, DEFAULT, MANIFEST, BOUND, EDITED = "estimated", "default", "manifest", "lower bound", "edited"
ENGINE = "engine config"  # the engine's own configuration or metrics, as study.yaml records them


@dataclass(frozen=True)
class Param:
    """One parameter of the twin as twin.yaml shows it."""

    key: str
    value: object
    unit: str = ""
    source: str = ESTIMATED  # estimated | engine config | manifest | lower bound | default | edited
    how: str = ""
    ci95: tuple[float, float] | None = None
    fitted: object = None  # the value the fit gave (differs from value after an edit)

    @property
    def sd(self) -> float:
        """Standard deviation implied by the 95 % interval (normal approximation), 0 without."""
        if self.ci95 is None:
            return 0.0
        lo, hi = self.ci95
        return max(0.0, (float(hi) - float(lo)) / (2 * 1.959964))


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    ms: float
    ci95: tuple[float, float] | None = None
    fitted: float | None = None


@dataclass(frozen=True)
class Workload:
    """What the clients sent: arrival process, tenants and their joint length distributions."""

    arrival: ArrivalSpec = ArrivalSpec()
    lengths: LengthDist = LengthDist()
    tenants: tuple[Tenant, ...] = ()
    per_run: tuple[dict, ...] = ()  # per measured run: rate, CV of gaps, dispersion of counts
    how: str = ""



#: Scalar parameters of a twin, in twin.yaml order: key → (unit, meaning).
PARAM_KEYS: dict[str, tuple[str, str]] = {
    "replicas": ("replicas", "identical replicas behind the router"),
    "router": ("", "how a request picks its replica"),
    "prefill_mode": ("", "mixed: prompt chunks run inside the batch iteration and slow the decodes; "
                         "separate: prompts run on their own lanes"),
    "prefill_lanes": ("prompts", "separate prefill: prompts computed at once (none: any number)"),
    "prefill_ms_per_token": ("ms/token", "prefill time per prompt token"),
    "prefill_overhead_ms": ("ms", "fixed time added to an iteration that computes prompt tokens "
                                  "(separate: to each prompt)"),
    "prefill_jitter_cv": ("CV", "separate prefill: spread of each prompt's time around the line (lognormal, "
                                "mean 1)"),
    "token_budget": ("tokens", "tokens per iteration (decodes + prompt chunk)"),
    "max_batch": ("sequences", "sequences running at once per replica (slots, held from prefill start)"),
    "kv_capacity_tokens": ("tokens", "KV cache per replica available to admission"),
    "kv_block_size": ("tokens", "tokens per KV block"),
    "kv_watermark": ("share", "share of KV blocks kept free at admission"),
    "max_model_len": ("tokens", "input + output above this is refused"),
    "queue_limit": ("requests", "waiting requests per replica (none: unbounded)"),
    "client_timeout_s": ("s", "the client gives up this long after the scheduled send"),
    "error_share": ("share", "requests the server fails at once, whatever the load"),
    "stall_share": ("share", "requests the server never serves, whatever the load"),
    "decode_noise_cv": ("CV", "spread of single decode steps around the batch curve (reported; the simulator's "
                              "steps are exact)"),
}


def notes_text(notes) -> list[str]:
    """The 'Notes:' block of a printed result (empty without notes)."""
    return ["", "Notes:"] + [f"  - {n}" for n in notes] if notes else []
