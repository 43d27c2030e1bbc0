"""The gates file (templates/gates.yaml): tolerances per row, bucket, fairness, workload and
run-family rules. Validated once here; everything else reads the frozen ``Gates``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from ..earlystop import n_min
from ..errors import SpecError


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
    """How runs are split into the steady and the saturated family (docs/compare.md §3).

    ``saturated_sd_factor``: with one run per load level, the within-run bootstrap SE of a
    saturated run (at or over the baseline's SLO capacity, or not stationary) is widened by
    this factor, because near saturation the run-to-run spread is about twice the within-run
    SE (rare congestion episodes a single run may or may not contain). Levels with repeats use
    the measured spread between their repeats instead. ``gate_saturated``: false shows the
    saturated rows without gating them."""

    saturated_sd_factor: float = 2.0
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


def _err(msg: str, field_: str, src: str, fix: str | None = None) -> SpecError:
    return SpecError(msg, field=field_, file=src, fix=fix)


def _number(v, field_: str, src: str, *, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False, hi_open: bool = False, allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise _err(f"{field_} must be a number, got {v!r}", field_, src)
    v = float(v)
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise _err(f"{field_} must be {'>' if lo_open else '≥'} {lo:g}, got {v:g}", field_, src)
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise _err(f"{field_} must be {'<' if hi_open else '≤'} {hi:g}, got {v:g}", field_, src)
    return v


def _mapping(v, field_: str, src: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _err(f"{field_} must be a mapping of keys, got {type(v).__name__}", field_, src)
    return v


def _unknown(d: dict, known, field_: str, src: str) -> None:
    extra = sorted(set(map(str, d)) - set(known))
    if extra:
        raise _err(f"unknown key(s) in {field_}: {', '.join(extra)}", field_, src,
                   fix="known keys: " + ", ".join(known))


def _edges(v, field_: str, src: str) -> tuple[int, ...] | None:
    if v in (None, "auto"):
        return None
    if not isinstance(v, list) or not v:
        raise _err(f"{field_} must be 'auto' or a list of token edges like [256, 1024, 4096]",
                   field_, src)
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            raise _err(f"{field_} must hold positive integers, got {x!r}", field_, src)
        out.append(int(x))
    if out != sorted(set(out)):
        raise _err(f"{field_} must be strictly increasing, got {out}", field_, src)
    return tuple(out)


def load_gates(source: str | Path | Mapping | Gates | None = None) -> Gates:
    """Read and validate a gates file (or mapping). Missing keys take the defaults of
    templates/gates.yaml; anything unknown or out of range is a SpecError naming the field."""
    if isinstance(source, Gates):
        return source
    src = "gates"
    if source is None:
        raw: Any = {}
        src = "defaults"
    elif isinstance(source, Mapping):
        raw = dict(source)
    else:
        path = Path(source)
        src = str(path)
        if not path.is_file():
            raise SpecError("gates file not found", file=src,
                            fix="pass a YAML file like templates/gates.yaml")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise SpecError(f"gates file is not valid YAML{where}: {getattr(exc, 'problem', exc)}",
                            file=src) from None
    if not isinstance(raw, dict):
        raise _err("a gates file must be a mapping (confidence, gates, buckets, ...)", "", src)
    _unknown(raw, _TOP_KEYS, "the gates file", src)
    if raw.get("version", 1) != 1:
        raise _err(f"unsupported gates version {raw.get('version')!r}", "version", src,
                   fix="this capplan reads version: 1")
    confidence = _number(raw.get("confidence", 0.95), "confidence", src, lo=0.5, hi=1.0,
                         hi_open=True)
    percentile = _number(raw.get("percentile", 0.99), "percentile", src, lo=0.5, hi=1.0,
                         hi_open=True)
    gates_raw = _mapping(raw.get("gates"), "gates", src)
    _unknown(gates_raw, _DEFAULT_GATES, "gates", src)
    gates: dict[str, Gate] = {}
    for name, default in _DEFAULT_GATES.items():
        g = dict(default)
        user = gates_raw.get(name)
        if user is not None:
            user = _mapping(user, f"gates.{name}", src)
            _unknown(user, ("max_regression_abs", "max_regression_pct", "enabled"),
                     f"gates.{name}", src)
            if "max_regression_abs" in user or "max_regression_pct" in user:
                g.pop("max_regression_abs", None)
                g.pop("max_regression_pct", None)
            g.update(user)
        enabled = g.get("enabled", True)
        if not isinstance(enabled, bool):
            raise _err(f"gates.{name}.enabled must be true or false", f"gates.{name}.enabled", src)
        gates[name] = Gate(
            name,
            max_regression_abs=_number(g.get("max_regression_abs"), f"gates.{name}.max_regression_abs",
                                       src, lo=0.0, allow_none=True),
            max_regression_pct=_number(g.get("max_regression_pct"), f"gates.{name}.max_regression_pct",
                                       src, lo=0.0, allow_none=True),
            enabled=enabled)
    b = _mapping(raw.get("buckets"), "buckets", src)
    _unknown(b, ("min_requests", "input_edges", "output_edges", "quadrant_split",
                 "attainment_max_drop_abs", "error_rate_max_rise_abs", "p99_max_regression_pct",
                 "fail_on_regression"),
             "buckets", src)
    qs = b.get("quadrant_split", "auto")
    if qs in (None, "auto"):
        split = (None, None)
    else:
        qs = _mapping(qs, "buckets.quadrant_split", src)
        _unknown(qs, ("input", "output"), "buckets.quadrant_split", src)
        split = tuple(None if qs.get(k, "auto") == "auto" else
                      _number(qs.get(k), f"buckets.quadrant_split.{k}", src, lo=0.0)
                      for k in ("input", "output"))
    fail_b = b.get("fail_on_regression", True)
    if not isinstance(fail_b, bool):
        raise _err("buckets.fail_on_regression must be true or false",
                   "buckets.fail_on_regression", src)
    buckets = BucketRules(
        min_requests=int(_number(b.get("min_requests", n_min(0.99, 1, 0.99)), "buckets.min_requests",
                                 src, lo=1)),
        input_edges=_edges(b.get("input_edges"), "buckets.input_edges", src),
        output_edges=_edges(b.get("output_edges"), "buckets.output_edges", src),
        quadrant_split=split,
        attainment_max_drop_abs=_number(b.get("attainment_max_drop_abs", 0.01),
                                        "buckets.attainment_max_drop_abs", src, lo=0.0),
        error_rate_max_rise_abs=_number(b.get("error_rate_max_rise_abs", 0.01),
                                        "buckets.error_rate_max_rise_abs", src, lo=0.0),
        p99_max_regression_pct=_number(b.get("p99_max_regression_pct", 10.0),
                                       "buckets.p99_max_regression_pct", src, lo=0.0),
        fail_on_regression=fail_b)
    f = _mapping(raw.get("fairness"), "fairness", src)
    _unknown(f, ("prefill_weight", "decode_weight", "entitlements"), "fairness", src)
    ent = _mapping(f.get("entitlements"), "fairness.entitlements", src)
    ent = {str(k): _number(v, f"fairness.entitlements.{k}", src, lo=0.0) for k, v in ent.items()}
    if ent and sum(ent.values()) <= 0:
        raise _err("fairness.entitlements must not all be zero", "fairness.entitlements", src)
    fairness = FairnessRules(
        prefill_weight=_number(f.get("prefill_weight", 1.0), "fairness.prefill_weight", src, lo=0.0),
        decode_weight=_number(f.get("decode_weight", 2.0), "fairness.decode_weight", src, lo=0.0),
        entitlements=ent)
    if fairness.prefill_weight == 0 and fairness.decode_weight == 0:
        raise _err("fairness weights cannot both be 0", "fairness.decode_weight", src)
    w = _mapping(raw.get("workload"), "workload", src)
    _unknown(w, ("rate_tolerance_rel", "count_tolerance_rel", "token_ks_max",
                 "arrival_cv_tolerance", "pairing"), "workload", src)
    pairing = w.get("pairing", "auto")
    if pairing not in ("auto", "paired", "independent"):
        raise _err(f"workload.pairing must be auto, paired or independent, got {pairing!r}",
                   "workload.pairing", src)
    workload = WorkloadRules(
        rate_tolerance_rel=_number(w.get("rate_tolerance_rel", 0.05), "workload.rate_tolerance_rel",
                                   src, lo=0.0),
        count_tolerance_rel=_number(w.get("count_tolerance_rel", 0.05),
                                    "workload.count_tolerance_rel", src, lo=0.0),
        token_ks_max=_number(w.get("token_ks_max", 0.05), "workload.token_ks_max", src, lo=0.0,
                             hi=1.0),
        arrival_cv_tolerance=_number(w.get("arrival_cv_tolerance", 0.25),
                                     "workload.arrival_cv_tolerance", src, lo=0.0),
        pairing=pairing)
    ru = _mapping(raw.get("runs"), "runs", src)
    _unknown(ru, ("saturated_sd_factor", "gate_saturated"), "runs", src)
    gate_sat = ru.get("gate_saturated", True)
    if not isinstance(gate_sat, bool):
        raise _err("runs.gate_saturated must be true or false", "runs.gate_saturated", src)
    runs = RunRules(saturated_sd_factor=_number(ru.get("saturated_sd_factor", 2.0),
                                                "runs.saturated_sd_factor", src, lo=1.0),
                    gate_saturated=gate_sat)
    c = _mapping(raw.get("cost"), "cost", src)
    _unknown(c, ("baseline_usd_per_gpu_hour", "candidate_usd_per_gpu_hour"), "cost", src)
    pb = _number(c.get("baseline_usd_per_gpu_hour"), "cost.baseline_usd_per_gpu_hour", src,
                 lo=0.0, lo_open=True, allow_none=True)
    pc = _number(c.get("candidate_usd_per_gpu_hour"), "cost.candidate_usd_per_gpu_hour", src,
                 lo=0.0, lo_open=True, allow_none=True)
    if (pb is None) != (pc is None):
        raise _err("give both cost.baseline_usd_per_gpu_hour and cost.candidate_usd_per_gpu_hour "
                   "(or neither)", "cost", src)
    return Gates(confidence=confidence, percentile=percentile, gates=gates, buckets=buckets,
                 fairness=fairness, workload=workload, runs=runs, baseline_usd_per_gpu_hour=pb,
                 candidate_usd_per_gpu_hour=pc, source=src)
