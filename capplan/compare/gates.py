"""The gates file (templates/gates.yaml): tolerances per row, bucket, fairness, workload and
run-family rules. Read and checked once here with the project's spec kit (``capplan.spec``:
line marks, "did you mean", the field in every error); everything else reads the frozen
``Gates``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from .. import spec as S
from ..earlystop import n_min


@dataclass(frozen=True)
class Gate:
    """Tolerance of one row: the larger of ``max_regression_abs`` and
    ``max_regression_pct`` × |baseline| / 100 (both ≥ 0)."""

    name: str
    max_regression_abs: float | None = None
    max_regression_pct: float | None = None
    enabled: bool = True

    def tolerance(self, baseline: float) -> float:
        tol = 0.0
        if self.max_regression_abs is not None:
            tol = max(tol, float(self.max_regression_abs))
        if self.max_regression_pct is not None and np.isfinite(baseline):
            tol = max(tol, float(self.max_regression_pct) / 100.0 * abs(float(baseline)))
        return tol

    def describe(self) -> str:
        parts = []
        if self.max_regression_abs is not None:
            parts.append(f"{self.max_regression_abs:g}")
        if self.max_regression_pct is not None:
            parts.append(f"{self.max_regression_pct:g} %")
        text = "worse by > " + " or ".join(parts) if parts else "any regression"
        return text if self.enabled else f"off ({text})"


@dataclass(frozen=True)
class BucketRules:
    min_requests: int = 662
    input_edges: tuple[int, ...] | None = None  # None = powers of two
    output_edges: tuple[int, ...] | None = None
    quadrant_split: tuple[float | None, float | None] = (None, None)  # None = baseline median
    attainment_max_drop_abs: float = 0.01
    error_rate_max_rise_abs: float = 0.01
    p99_max_regression_pct: float = 10.0
    fail_on_regression: bool = True


@dataclass(frozen=True)
class FairnessRules:
    prefill_weight: float = 1.0
    decode_weight: float = 2.0
    entitlements: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkloadRules:
    rate_tolerance_rel: float = 0.05
    count_tolerance_rel: float = 0.05
    token_ks_max: float = 0.05
    arrival_cv_tolerance: float = 0.25
    pairing: str = "auto"


@dataclass(frozen=True)
class RunRules:
    """Run-to-run spread and the saturated family (docs/compare.md §3).

    ``sd_factor``: a run tested once cannot show its run-to-run spread — rare congestion
    episodes a single run may or may not contain make the spread of its tail percentiles and,
    near saturation, of its attainment and failure rates up to about twice its within-run
    bootstrap SE. Its within-run deviation is widened by this factor: every run when the two
    studies offer different traces (independent), the saturated runs when they replay the same
    trace (paired: the trace's episodes are on both sides). Load levels with repeats use the
    spread between their repeats instead; 1 turns the widening off. ``gate_saturated``: false
    shows the saturated rows without gating them."""

    sd_factor: float = 2.0
    gate_saturated: bool = True


@dataclass(frozen=True)
class Gates:
    """A validated gates file (see templates/gates.yaml, which holds exactly these defaults)."""

    confidence: float = 0.95
    percentile: float = 0.99
    gates: Mapping[str, Gate] = field(default_factory=dict)
    buckets: BucketRules = BucketRules()
    fairness: FairnessRules = FairnessRules()
    workload: WorkloadRules = WorkloadRules()
    runs: RunRules = RunRules()
    baseline_usd_per_gpu_hour: float | None = None
    candidate_usd_per_gpu_hour: float | None = None
    source: str = "defaults"

    def gate(self, name: str) -> Gate:
        return self.gates.get(name, Gate(name, enabled=False))


_DEFAULT_GATES: dict[str, dict] = {
    "attainment": {"max_regression_abs": 0.005},
    "ttft_p99_ms": {"max_regression_pct": 5},
    "tpot_p99_ms": {"max_regression_pct": 5},
    "itl_p99_ms": {"max_regression_pct": 5},
    "goodput_rps_per_gpu": {"max_regression_pct": 5},
    "throughput_rps_per_gpu": {"max_regression_pct": 5},
    "cslo_rps": {"max_regression_pct": 5},
    "error_rate": {"max_regression_abs": 0.002},
    "reject_rate": {"max_regression_abs": 0.002},
    "server_error_rate": {"max_regression_abs": 0.002},
    "missing_requests": {"max_regression_abs": 0},
    "peak_gpu_mem_gib": {"max_regression_pct": 10, "enabled": False},
    "energy_j_per_good_request": {"max_regression_pct": 10},
    "cost_usd_per_1k_good": {"max_regression_pct": 5},
    "fair_share_deviation": {"max_regression_abs": 0.05},
}
_TOP_KEYS = ("version", "confidence", "percentile", "gates", "buckets", "fairness", "workload",
             "runs", "cost")


def _edges(v, field: str) -> tuple[int, ...] | None:
    if v in (None, "auto"):
        return None
    items = S.sequence(v, field, nonempty=True, example="[256, 1024, 4096]")
    out = [S.number(x, S.index(field, i), integer=True, above=0, example=1024)
           for i, x in enumerate(items)]
    if out != sorted(set(out)):
        S.fail(field, f"{field} must be strictly increasing, got {out}",
               fix="list the token edges once each, smallest first (or write auto)")
    return tuple(out)


def _prob(v, field: str, default: float) -> float:
    """A confidence-like level in [0.5, 1)."""
    return S.number(default if v is None else v, field, minimum=0.5, below=1.0, example=default)


def load_gates(source: str | Path | Mapping | Gates | None = None) -> Gates:
    """Read and validate a gates file (or mapping). Missing keys take the defaults of
    templates/gates.yaml; anything unknown or out of range is a SpecError naming the field
    (and, from a file, its line)."""
    if isinstance(source, Gates):
        return source
    if source is None:
        doc = S.document({}, what="gates")
        src = "defaults"
    else:
        doc = S.document(source, what="gates", fix="start from templates/gates.yaml")
        src = doc.file or "gates"
    with doc.located():
        return _parse(doc.data if doc.data is not None else {}, src)


def _parse(raw, src: str) -> Gates:
    raw = S.mapping(raw, "", known=_TOP_KEYS, what="the gates file")
    version = raw.get("version", 1)
    if version != 1:
        S.fail("version", f"unsupported gates version {version!r}",
               fix="this capplan reads version: 1")
    confidence = _prob(raw.get("confidence"), "confidence", 0.95)
    percentile = _prob(raw.get("percentile"), "percentile", 0.99)
    gates_raw = S.mapping(raw.get("gates"), "gates", known=tuple(_DEFAULT_GATES))
    gates: dict[str, Gate] = {}
    for name, default in _DEFAULT_GATES.items():
        g = dict(default)
        f = S.join("gates", name)
        user = S.mapping(gates_raw.get(name), f,
                         known=("max_regression_abs", "max_regression_pct", "enabled"))
        if "max_regression_abs" in user or "max_regression_pct" in user:
            g.pop("max_regression_abs", None)
            g.pop("max_regression_pct", None)
        g.update(user)
        gates[name] = Gate(
            name,
            max_regression_abs=S.number(g.get("max_regression_abs"), f + ".max_regression_abs",
                                        minimum=0.0, optional=True, example=0.005),
            max_regression_pct=S.number(g.get("max_regression_pct"), f + ".max_regression_pct",
                                        minimum=0.0, optional=True, example=5),
            enabled=S.flag(g.get("enabled"), f + ".enabled", default=True))
    b = S.mapping(raw.get("buckets"), "buckets", known=(
        "min_requests", "input_edges", "output_edges", "quadrant_split",
        "attainment_max_drop_abs", "error_rate_max_rise_abs", "p99_max_regression_pct",
        "fail_on_regression"))
    qs = b.get("quadrant_split", "auto")
    if qs in (None, "auto"):
        split = (None, None)
    else:
        qs = S.mapping(qs, "buckets.quadrant_split", known=("input", "output"),
                       example="{input: 1024, output: 256}")
        split = tuple(None if qs.get(k, "auto") == "auto" else
                      S.number(qs.get(k), f"buckets.quadrant_split.{k}", minimum=0.0,
                               example=1024) for k in ("input", "output"))
    buckets = BucketRules(
        min_requests=S.number(b.get("min_requests", n_min(0.99, 1, 0.99)), "buckets.min_requests",
                              integer=True, minimum=1, example=662),
        input_edges=_edges(b.get("input_edges"), "buckets.input_edges"),
        output_edges=_edges(b.get("output_edges"), "buckets.output_edges"),
        quadrant_split=split,
        attainment_max_drop_abs=S.number(b.get("attainment_max_drop_abs", 0.01),
                                         "buckets.attainment_max_drop_abs", minimum=0.0),
        error_rate_max_rise_abs=S.number(b.get("error_rate_max_rise_abs", 0.01),
                                         "buckets.error_rate_max_rise_abs", minimum=0.0),
        p99_max_regression_pct=S.number(b.get("p99_max_regression_pct", 10.0),
                                        "buckets.p99_max_regression_pct", minimum=0.0),
        fail_on_regression=S.flag(b.get("fail_on_regression"), "buckets.fail_on_regression",
                                  default=True))
    f = S.mapping(raw.get("fairness"), "fairness",
                  known=("prefill_weight", "decode_weight", "entitlements"))
    ent = S.mapping(f.get("entitlements"), "fairness.entitlements", example="{acme: 2, globex: 1}")
    ent = {str(k): S.number(v, f"fairness.entitlements.{k}", minimum=0.0, example=1)
           for k, v in ent.items()}
    if ent and sum(ent.values()) <= 0:
        S.fail("fairness.entitlements", "fairness.entitlements must not all be zero",
               fix="give at least one tenant a positive weight")
    fairness = FairnessRules(
        prefill_weight=S.number(f.get("prefill_weight", 1.0), "fairness.prefill_weight",
                                minimum=0.0),
        decode_weight=S.number(f.get("decode_weight", 2.0), "fairness.decode_weight",
                               minimum=0.0),
        entitlements=ent)
    if fairness.prefill_weight == 0 and fairness.decode_weight == 0:
        S.fail("fairness.decode_weight", "fairness weights cannot both be 0",
               fix="e.g. prefill_weight: 1, decode_weight: 2")
    w = S.mapping(raw.get("workload"), "workload", known=(
        "rate_tolerance_rel", "count_tolerance_rel", "token_ks_max", "arrival_cv_tolerance",
        "pairing"))
    workload = WorkloadRules(
        rate_tolerance_rel=S.number(w.get("rate_tolerance_rel", 0.05),
                                    "workload.rate_tolerance_rel", minimum=0.0),
        count_tolerance_rel=S.number(w.get("count_tolerance_rel", 0.05),
                                     "workload.count_tolerance_rel", minimum=0.0),
        token_ks_max=S.number(w.get("token_ks_max", 0.05), "workload.token_ks_max", minimum=0.0,
                              maximum=1.0),
        arrival_cv_tolerance=S.number(w.get("arrival_cv_tolerance", 0.25),
                                      "workload.arrival_cv_tolerance", minimum=0.0),
        pairing=S.choice(w.get("pairing"), "workload.pairing", ("auto", "paired", "independent"),
                         optional=True, default="auto"))
    ru = S.mapping(raw.get("runs"), "runs", known=("sd_factor", "gate_saturated"))
    runs = RunRules(sd_factor=S.number(ru.get("sd_factor", 2.0), "runs.sd_factor", minimum=1.0,
                                       example=2.0),
                    gate_saturated=S.flag(ru.get("gate_saturated"), "runs.gate_saturated",
                                          default=True))
    c = S.mapping(raw.get("cost"), "cost",
                  known=("baseline_usd_per_gpu_hour", "candidate_usd_per_gpu_hour"))
    pb = S.number(c.get("baseline_usd_per_gpu_hour"), "cost.baseline_usd_per_gpu_hour",
                  above=0.0, optional=True, example=2.5)
    pc = S.number(c.get("candidate_usd_per_gpu_hour"), "cost.candidate_usd_per_gpu_hour",
                  above=0.0, optional=True, example=2.5)
    if (pb is None) != (pc is None):
        S.fail("cost", "give both cost.baseline_usd_per_gpu_hour and "
               "cost.candidate_usd_per_gpu_hour (or neither)",
               fix="prices per GPU-hour of both systems, e.g. 2.5 and 3.1")
    return Gates(confidence=confidence, percentile=percentile, gates=gates, buckets=buckets,
                 fairness=fairness, workload=workload, runs=runs, baseline_usd_per_gpu_hour=pb,
                 candidate_usd_per_gpu_hour=pc, source=src)


def confidence_arg(v) -> float:
    """A ``confidence`` given as an argument (it overrides the gates file's)."""
    return _prob(v, "confidence", 0.95)
