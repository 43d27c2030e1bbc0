"""Baseline vs candidate on the same offered trace and SLO: release gates, bucket regressions,
tenant fairness.

Why this shape. A release decision needs (1) the same offered workload on both sides — else
the comparison is refused and the differences are listed; (2) a difference that is larger than
its sampling noise — a regression or improvement is declared only when the block-bootstrap CI
of ``candidate − baseline`` excludes zero; (3) no false alarm when nothing changed — the CIs of
all gated rows are *simultaneous* (one joint percentile envelope over the replicates), so
"every gate passes" holds with probability ≥ the family confidence under no change.

Pipeline (I/O at the edges, the rest pure numpy):
1. open both studies, match runs, align warm-ups, check the offered workload (SQL);
2. detect pairing: when both replay the same trace rows (same request_id, scheduled_ns and
   input_tokens per run), resample the *same* block indices in both (paired bootstrap);
   otherwise resample each study independently;
3. reduce each study to per-(run sub-block, cell) sums with one SQL pass per statistic, where a
   cell is (input bucket, output bucket, quadrant, tenant, SLO class); TTFT/TPOT/ITL go into
   log-bucket histograms (``capplan.sketch``);
4. ``capplan.bootstrap`` count matrices (reps × sub-blocks, circular blocks of ~4 lattice
   sub-blocks of the Politis–White length) times those sums give every replicate statistic.

Deterministic failures (more errors or rejects beyond the gate, missing requests) fail at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import yaml

from . import bootstrap as B
from . import contract as C
from . import sketch
from .cache import check_cache_conditions
from .earlystop import n_min
from .errors import Problem, SpecError, StudyError
from .metrics import Window, good_predicate, measured_rate_rps, request_view
from .slo import SLO
from .study import Study, open_study

# ============================================================================ metric catalogue


@dataclass(frozen=True)
class MetricSpec:
    """One row kind of the comparison table. ``better`` is the good direction; ``kind`` is
    ``stat`` (bootstrap CI), ``deterministic`` (fails at once) or ``info`` (never gated)."""

    name: str
    label: str
    unit: str
    better: str  # "higher" | "lower"
    kind: str  # "stat" | "deterministic" | "info"


METRICS: dict[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("offered_rps", "offered rate (measured)", "req/s", "higher", "info"),
    MetricSpec("attainment", "SLO attainment (offered)", "fraction", "higher", "stat"),
    MetricSpec("ttft_p99_ms", "TTFT p99", "ms", "lower", "stat"),
    MetricSpec("tpot_p99_ms", "TPOT p99", "ms", "lower", "stat"),
    MetricSpec("itl_p99_ms", "ITL p99 (pooled gaps)", "ms", "lower", "stat"),
    MetricSpec("goodput_rps_per_gpu", "request goodput per GPU", "req/s/GPU", "higher", "stat"),
    MetricSpec("cslo_rps", "C_SLO (capacity under SLO)", "req/s", "higher", "stat"),
    MetricSpec("error_rate", "error rate (error+timeout+cancelled)", "fraction", "lower",
               "deterministic"),
    MetricSpec("reject_rate", "reject rate", "fraction", "lower", "deterministic"),
    MetricSpec("missing_requests", "requests missing from candidate", "requests", "lower",
               "deterministic"),
    MetricSpec("peak_gpu_mem_gib", "peak GPU memory", "GiB", "lower", "deterministic"),
    MetricSpec("energy_j_per_good_request", "energy per SLO-meeting request", "J", "lower", "stat"),
    MetricSpec("cost_usd_per_1k_good", "cost per 1 000 SLO-meeting requests", "USD", "lower",
               "stat"),
    MetricSpec("fair_share_deviation", "fair-share deviation (max |share − entitled|)",
               "fraction", "lower", "stat"),
    MetricSpec("jain_index", "Jain's index of share / entitled", "index", "higher", "info"),
)}

#: quantile rows read from histograms (name -> histogram key in the reduction)
_Q_METRICS = {"ttft_p99_ms": "ttft", "tpot_p99_ms": "tpot", "itl_p99_ms": "itl"}
BUCKET_DIMS = ("input_tokens", "output_tokens", "quadrant", "tenant", "slo_class")
_CELL_DIMS = ("in_b", "out_b", "q_in", "q_out", "tenant", "slo_class")
_CELL_SUMS = ("n", "good", "ok", "rejected", "errors", "svc", "demand")
NONE_LABEL = "(none)"
OTHER_LABEL = "(other)"
BYTES_PER_GIB = float(1 << 30)
#: cap on bootstrap units (sub-blocks) over all runs: reps × units float64 stays ~ tens of MB
MAX_UNITS_TOTAL = 4000
SUBBLOCKS_PER_BLOCK = 4

# ============================================================================ gates


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
class Gates:
    """A validated gates file (see templates/gates.yaml, which holds exactly these defaults)."""

    confidence: float = 0.95
    percentile: float = 0.99
    gates: Mapping[str, Gate] = field(default_factory=dict)
    buckets: BucketRules = BucketRules()
    fairness: FairnessRules = FairnessRules()
    workload: WorkloadRules = WorkloadRules()
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
    "cslo_rps": {"max_regression_pct": 5},
    "error_rate": {"max_regression_abs": 0.002},
    "reject_rate": {"max_regression_abs": 0.002},
    "missing_requests": {"max_regression_abs": 0},
    "peak_gpu_mem_gib": {"max_regression_pct": 10, "enabled": False},
    "energy_j_per_good_request": {"max_regression_pct": 10},
    "cost_usd_per_1k_good": {"max_regression_pct": 5},
    "fair_share_deviation": {"max_regression_abs": 0.05},
}
_TOP_KEYS = ("version", "confidence", "percentile", "gates", "buckets", "fairness", "workload",
             "cost")


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
                 "attainment_max_drop_abs", "p99_max_regression_pct", "fail_on_regression"),
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
                 fairness=fairness, workload=workload, baseline_usd_per_gpu_hour=pb,
                 candidate_usd_per_gpu_hour=pc, source=src)


# ============================================================================ pure statistics


def fairness_stats(service, entitled) -> dict:
    """Shares of weighted-token service vs entitled shares.

    ``service`` (…, T) weighted tokens per tenant (leading axes = replicates), ``entitled``
    (T,) non-negative weights (normalised here). Returns share, deviation = share − entitled,
    max_abs_deviation and Jain's index of x_t = share_t / entitled_t,
    J = (Σx)² / (T Σx²) over tenants with entitlement > 0 (1 = every tenant got exactly its
    entitlement; 1/T = one tenant got everything)."""
    s = np.asarray(service, dtype=np.float64)
    e = np.asarray(entitled, dtype=np.float64)
    e = e / e.sum()
    total = s.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = s / total
        dev = share - e
        pos = e > 0
        x = share[..., pos] / e[pos]
        jain = x.sum(axis=-1) ** 2 / (pos.sum() * (x * x).sum(axis=-1))
    return {"share": share, "entitled": np.broadcast_to(e, share.shape), "deviation": dev,
            "max_abs_deviation": np.abs(dev).max(axis=-1), "jain": jain}


def simultaneous_ci(replicates: np.ndarray, point, confidence: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Sup-t simultaneous band over the m columns of (reps × m) replicate differences.

    t*_rj = (D*_rj − d̂_j) / se_j with se_j the bootstrap SD; c = the ``confidence`` quantile of
    max_j |t*_rj|; interval d̂_j ± c·se_j (Montiel Olea & Plagborg-Møller 2019). With m = 1
    it is the symmetric bootstrap-t-like interval; with m correlated columns c grows much
    less than Bonferroni. The critical value is a moderate quantile of one statistic, so it is
    stable with a few hundred replicates (the extreme per-column ranks a joint percentile
    envelope would need are not). Columns without spread get a point interval; NaN replicates
    are ignored column-wise."""
    D = np.asarray(replicates, dtype=np.float64)
    if D.ndim == 1:
        D = D[:, None]
    d = np.broadcast_to(np.asarray(point, dtype=np.float64), (D.shape[1],))
    lo = np.full(D.shape[1], np.nan)
    hi = np.full(D.shape[1], np.nan)
    if D.size == 0:
        return lo, hi
    with np.errstate(invalid="ignore"):
        n_fin = np.isfinite(D).sum(axis=0)
        se = np.where(n_fin > 1, np.nanstd(np.where(np.isfinite(D), D, np.nan), axis=0, ddof=1)
                      if (n_fin > 1).any() else np.nan, np.nan)
    flat = np.isfinite(d) & (n_fin > 0) & ~(se > 0)
    lo[flat] = hi[flat] = d[flat]
    cols = np.isfinite(d) & (se > 0)
    if not cols.any():
        return lo, hi
    with np.errstate(invalid="ignore"):
        t = np.abs(D[:, cols] - d[cols]) / se[cols]
    tmax = np.nanmax(np.where(np.isfinite(t), t, -np.inf), axis=1)
    tmax = tmax[np.isfinite(tmax)]
    c = float(np.quantile(tmax, confidence)) if tmax.size else np.nan
    lo[cols] = d[cols] - c * se[cols]
    hi[cols] = d[cols] + c * se[cols]
    return lo, hi


def judge(better: str, baseline: float, candidate: float, ci_low: float, ci_high: float,
          gate: Gate | None, *, deterministic: bool = False) -> tuple[str, str]:
    """(change, verdict) of one row.

    change: ``regression`` / ``improvement`` / ``no significant change`` from the CI of the
    difference (declared only when it excludes zero), or ``worse`` / ``better`` / ``same`` for
    a deterministic row. verdict: a statistical gate FAILS when a regression is declared *and*
    the point difference is worse than the tolerance; a deterministic gate FAILS when worse
    than the tolerance; ``info`` when no (enabled) gate applies."""
    if not (np.isfinite(baseline) and np.isfinite(candidate)):
        return "n/a", "n/a"
    delta = candidate - baseline
    bad = -delta if better == "higher" else delta
    if deterministic:
        change = "worse" if bad > 0 else "better" if bad < 0 else "same"
    elif np.isfinite(ci_low) and np.isfinite(ci_high):
        bad_lo = -ci_high if better == "higher" else ci_low
        bad_hi = -ci_low if better == "higher" else ci_high
        change = ("regression" if bad_lo > 0 else "improvement" if bad_hi < 0
                  else "no significant change")
    else:
        change = "no CI"
    if gate is None or not gate.enabled:
        return change, "info"
    tol = gate.tolerance(baseline)
    if deterministic:
        return change, "FAIL" if bad > tol else "pass"
    return change, "FAIL" if change == "regression" and bad > tol else "pass"


def merge_ordered(counts_b: np.ndarray, counts_c: np.ndarray, min_n: int) -> list[list[int]]:
    """Group consecutive fine buckets (indices with any request) so that each group holds at
    least ``min_n`` requests in *both* studies: a sparse bucket merges upward into the next
    one; a sparse last group merges down into the previous group."""
    idx = [i for i in range(len(counts_b)) if counts_b[i] + counts_c[i] > 0]
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in idx:
        cur.append(i)
        if min(counts_b[cur].sum(), counts_c[cur].sum()) >= min_n:
            groups.append(cur)
            cur = []
    if cur:
        if groups:
            groups[-1].extend(cur)
        else:
            groups.append(cur)
    return groups


def ks_distance(values_b, counts_b, values_c, counts_c) -> float:
    """Two-sample Kolmogorov–Smirnov distance from (value, count) histograms."""
    vals = np.union1d(values_b, values_c)
    fb = np.zeros(vals.size)
    fc = np.zeros(vals.size)
    fb[np.searchsorted(vals, values_b)] = counts_b
    fc[np.searchsorted(vals, values_c)] = counts_c
    if fb.sum() == 0 or fc.sum() == 0:
        return 0.0 if fb.sum() == fc.sum() else 1.0
    return float(np.abs(np.cumsum(fb) / fb.sum() - np.cumsum(fc) / fc.sum()).max())


# ============================================================================ study side (SQL)


@dataclass
class _Side:
    """What one study contributes (internal, built once per compare call)."""

    label: str
    study: Study
    runs: list[str]  # run ids in pair order
    facts: pd.DataFrame  # per pair: n, first/last scheduled, window_s, rate, cv, warmup_ns
    gpus: int
    has_itl: bool
    cells: pd.DataFrame | None = None
    hists: dict[str, pd.DataFrame] = field(default_factory=dict)
    good_series: list[np.ndarray] = field(default_factory=list)
    tok_hist: dict[str, pd.DataFrame] = field(default_factory=dict)
    warmup_s: dict[str, float] = field(default_factory=dict)  # the aligned steady windows
    view: str = ""  # the request view of those windows (``metrics.request_view``)


def _gpus(study: Study) -> int:
    return int(study.manifest.gpus_per_replica) * int(study.manifest.replicas)


def _match_runs(b: Study, c: Study) -> list[tuple[str, str]]:
    """Pairs (baseline run, candidate run): by run_id when both have the same set, else by
    load level order when the levels agree; otherwise a StudyError listing both."""
    if b.load_model != c.load_model:
        raise StudyError(f"the studies use different load models: baseline {b.load_model}, "
                         f"candidate {c.load_model}; an open-loop and a closed-loop test do not "
                         "offer the same workload", code="workload_differs",
                         fix="compare two open-loop (or two closed-loop) studies of the same trace")
    bid, cid = b.manifest.run_ids, c.manifest.run_ids
    if set(bid) == set(cid):
        return [(r, r) for r in bid]

    def levels(s: Study):
        return sorted(((r.load_level, r.repeat, r.run_id) for r in s.manifest.runs))

    lb, lc = levels(b), levels(c)
    if len(lb) == len(lc) and all(math.isclose(x[0], y[0], rel_tol=1e-6) for x, y in zip(lb, lc)):
        return [(x[2], y[2]) for x, y in zip(lb, lc)]
    fmt = lambda L: ", ".join(f"{rid}@{lvl:g}" for lvl, _, rid in L)  # noqa: E731
    raise StudyError("the studies do not test the same runs: "
                     f"baseline has {len(lb)} run(s) [{fmt(lb)}], candidate has {len(lc)} "
                     f"[{fmt(lc)}]", code="workload_differs",
                     fix="run the candidate on the same load levels (same run ids or the same "
                         "offered_rps / concurrency per run)")


def _check_slo(b: Study, c: Study) -> None:
    sb, sc = b.manifest.raw.get("slo"), c.manifest.raw.get("slo")
    if sb is not None and sc is not None:
        try:
            eq = SLO.parse(sb) == SLO.parse(sc)
        except SpecError:
            eq = sb == sc
        if not eq:
            raise SpecError(f"the studies declare different SLOs: baseline {sb!r}, candidate "
                            f"{sc!r}; a comparison needs one SLO",
                            fix="pass the SLO to judge both with --slo, and fix the manifests")


def _facts(side: _Side, pairs_ids: list[str]) -> pd.DataFrame:
    """Per run of the steady window: n, schedule span, measured rate, inter-arrival CV."""
    df = side.study.sql(f"""
        WITH r AS (
            SELECT run_id, scheduled_ns,
                   scheduled_ns - lag(scheduled_ns) OVER (PARTITION BY run_id ORDER BY scheduled_ns)
                       AS gap
            FROM {side.view} WHERE in_window)
        SELECT run_id, count(*) AS n, min(scheduled_ns) AS first_ns, max(scheduled_ns) AS last_ns,
               stddev_pop(gap) / nullif(avg(gap), 0) AS cv
        FROM r GROUP BY run_id
    """).df().set_index("run_id")
    ends = side.study.sql(f"""
        SELECT run_id, count_if(status = 'ok') AS n_ok,
               max(greatest(scheduled_ns, sent_ns, admitted_ns, first_token_ns, last_token_ns))
                   AS end_ns
        FROM {side.view} GROUP BY run_id
    """).df().set_index("run_id")
    rows = []
    for pair, rid in enumerate(pairs_ids):
        a = df.loc[rid] if rid in df.index else None
        n = int(a["n"]) if a is not None else 0
        first = float(a["first_ns"]) if a is not None else float("nan")
        last = float(a["last_ns"]) if a is not None else float("nan")
        rows.append({
            "pair": pair, "run_id": rid, "n": n, "first_ns": first, "last_ns": last,
            "rate_rps": measured_rate_rps(n, first, last) if n >= 2 else float("nan"),
            "cv": float(a["cv"]) if a is not None and pd.notna(a["cv"]) else float("nan"),
            "end_ns": float(ends.loc[rid, "end_ns"]) if rid in ends.index else float("nan"),
        })
    return pd.DataFrame(rows)


def _token_hist(side: _Side) -> None:
    s = side.study
    side.tok_hist["input"] = s.sql(f"""SELECT run_id, input_tokens AS v, count(*) AS c
        FROM {side.view} WHERE in_window GROUP BY ALL""").df()
    side.tok_hist["output"] = s.sql(f"""SELECT run_id, output_tokens AS v, count(*) AS c
        FROM {side.view} WHERE in_window AND status = 'ok' GROUP BY ALL""").df()


def _check_workload(b: _Side, c: _Side, pairs: list[tuple[str, str]], rules: WorkloadRules) -> None:
    """Refuse (StudyError, exit 2) when the offered workload differs beyond sampling noise:
    rates and request counts per run, token distributions, arrival process."""
    probs: list[Problem] = []
    for i, (rb, rc) in enumerate(pairs):
        fb, fc = b.facts.iloc[i], c.facts.iloc[i]
        run = rb if rb == rc else f"{rb} / {rc}"
        nb, nc = fb["n"], fc["n"]
        if nb == 0 or nc == 0:
            probs.append(Problem(f"run {run}: offered requests in the steady window: "
                                 f"baseline {nb:,}, candidate {nc:,}"))
            continue
        noise = 4.0 * math.sqrt(1.0 / nb + 1.0 / nc)  # ±4 Poisson SDs of a relative difference
        sb, sc = b.study.manifest.run(rb), c.study.manifest.run(rc)
        if b.study.load_model == C.LoadModel.CLOSED.value:
            if sb.concurrency != sc.concurrency:
                probs.append(Problem(f"run {run}: concurrency {sb.concurrency} vs {sc.concurrency}"))
        else:
            rel = abs(fc["rate_rps"] / fb["rate_rps"] - 1.0)
            if rel > max(rules.rate_tolerance_rel, noise):
                probs.append(Problem(
                    f"run {run}: offered rate (measured from scheduled_ns) baseline "
                    f"{fb['rate_rps']:.4g} req/s, candidate {fc['rate_rps']:.4g} req/s "
                    f"({100 * (fc['rate_rps'] / fb['rate_rps'] - 1):+.1f} %; allowed "
                    f"{100 * max(rules.rate_tolerance_rel, noise):.1f} %)"))
        rel_n = abs(nc / nb - 1.0)
        # closed loop: the request count is an outcome (a faster system sends more), not offered
        if b.study.load_model != C.LoadModel.CLOSED.value and \
                rel_n > max(rules.count_tolerance_rel, noise):
            probs.append(Problem(f"run {run}: offered requests in the steady window baseline "
                                 f"{nb:,}, candidate {nc:,} ({100 * (nc / nb - 1):+.1f} %)"))
        for kind in ("input", "output"):
            hb = b.tok_hist[kind][b.tok_hist[kind]["run_id"] == rb]
            hc = c.tok_hist[kind][c.tok_hist[kind]["run_id"] == rc]
            n1, n2 = hb["c"].sum(), hc["c"].sum()
            if n1 == 0 or n2 == 0:
                continue
            d = ks_distance(hb["v"].to_numpy(), hb["c"].to_numpy(), hc["v"].to_numpy(),
                            hc["c"].to_numpy())
            crit = 1.95 * math.sqrt((n1 + n2) / (n1 * n2))  # KS critical value, α = 0.001
            if d > max(rules.token_ks_max, crit):
                mb = np.average(hb["v"], weights=hb["c"])
                mc = np.average(hc["v"], weights=hc["c"])
                what = "input tokens" if kind == "input" else "output tokens of completed requests"
                probs.append(Problem(f"run {run}: {what} distribution differs (KS distance "
                                     f"{d:.3f}; mean {mb:,.1f} vs {mc:,.1f})"))
        if b.study.load_model != C.LoadModel.CLOSED.value:
            if sb.arrival not in ("unknown", None) and sc.arrival not in ("unknown", None) \
                    and sb.arrival != sc.arrival:
                probs.append(Problem(f"run {run}: arrival process {sb.arrival} vs {sc.arrival}"))
            elif np.isfinite(fb["cv"]) and np.isfinite(fc["cv"]) and \
                    abs(fb["cv"] - fc["cv"]) > rules.arrival_cv_tolerance:
                probs.append(Problem(f"run {run}: arrival process differs: inter-arrival CV "
                                     f"{fb['cv']:.2f} vs {fc['cv']:.2f} (Poisson ≈ 1, "
                                     "constant ≈ 0)"))
    if probs:
        lines = "\n".join(f"    - {p.message}" for p in probs)
        raise StudyError(problems=[Problem(
            "baseline and candidate do not offer the same workload; they are not put side by "
            f"side:\n{lines}", file=f"{b.study.root} vs {c.study.root}",
            fix="replay the same trace (same rates, requests, token lengths and arrival process) "
                "on both systems; tolerances: gates.yaml 'workload:'", code="workload_differs")])


def _pairing(b: _Side, c: _Side, pairs: list[tuple[str, str]], mode: str) -> tuple[bool, pd.DataFrame]:
    """Whether both studies replay the same trace rows, and per run: matched, missing (in the
    baseline, not in the candidate) and extra requests. Keys: request_id, scheduled_ns,
    input_tokens within matched runs (joined in DuckDB)."""
    keys = b.study.con.sql(
        f"SELECT run_id, request_id, scheduled_ns, input_tokens FROM {b.view} "
        "WHERE in_window").to_arrow_table()
    runmap = pd.DataFrame({"b_run": [p[0] for p in pairs], "c_run": [p[1] for p in pairs],
                           "pair": range(len(pairs))})
    con = c.study.con
    con.register("_cmp_base_keys", keys)
    con.register("_cmp_runmap", runmap)
    try:
        df = con.execute(f"""
            WITH bk AS (SELECT m.pair, k.request_id, k.scheduled_ns, k.input_tokens
                        FROM _cmp_base_keys k JOIN _cmp_runmap m ON k.run_id = m.b_run),
                 ck AS (SELECT m.pair, q.request_id, q.scheduled_ns, q.input_tokens
                        FROM {c.view} q JOIN _cmp_runmap m ON q.run_id = m.c_run
                        WHERE q.in_window)
            SELECT coalesce(bk.pair, ck.pair) AS pair,
                   count_if(bk.request_id IS NOT NULL AND ck.request_id IS NOT NULL) AS matched,
                   count_if(ck.request_id IS NULL) AS missing,
                   count_if(bk.request_id IS NULL) AS extra
            FROM bk FULL OUTER JOIN ck USING (pair, request_id, scheduled_ns, input_tokens)
            GROUP BY 1 ORDER BY 1
        """).df()
    finally:
        con.unregister("_cmp_base_keys")
        con.unregister("_cmp_runmap")
    df = runmap.merge(df, on="pair", how="left").fillna({"matched": 0, "missing": 0, "extra": 0})
    nb = b.facts["n"].to_numpy()
    nc = c.facts["n"].to_numpy()
    same_trace = bool(np.all(df["matched"].to_numpy() >= 0.5 * np.maximum(np.maximum(nb, nc), 1)))
    if mode == "paired" and not same_trace:
        raise SpecError("pairing: paired was asked for, but the studies do not replay the same "
                        "trace rows (request_id, scheduled_ns, input_tokens per run)",
                        field="workload.pairing", fix="use pairing: auto or independent")
    paired = same_trace if mode == "auto" else mode == "paired"
    return paired, df


def _block_grid(b: _Side, c: _Side) -> pd.DataFrame:
    """Per matched run: sub-block width in ns (a quarter of the largest Politis–White block
    length over both studies' dependence series, converted to time at the measured rate), the
    number of sub-blocks, and the block length in sub-blocks."""
    n_pairs = len(b.runs)
    cap = max(20, MAX_UNITS_TOTAL // max(n_pairs, 1))
    rows = []
    for i in range(n_pairs):
        fb, fc = b.facts.iloc[i], c.facts.iloc[i]
        blen = 1.0
        for side in (b, c):
            for x in side.good_series[i]:
                if x.size >= 3:
                    blen = max(blen, B.optimal_block_length(x).circular)
        span_ns = max(np.nanmax([fb["last_ns"], fc["last_ns"]]) -
                      np.nanmin([fb["first_ns"], fc["first_ns"]]), 1.0)
        n_req = max(fb["n"], fc["n"], 1)
        gap_ns = span_ns / max(n_req - 1, 1)
        block_ns = blen * gap_ns
        per = SUBBLOCKS_PER_BLOCK if blen >= SUBBLOCKS_PER_BLOCK else max(1, int(round(blen)))
        sub_ns = max(block_ns / per, 1.0)
        units = int(span_ns // sub_ns) + 1
        if units > cap:  # wider sub-blocks: fewer units, blocks still ≥ the PW length
            sub_ns = span_ns / (cap - 1)
            units = int(span_ns // sub_ns) + 1
            per = max(1, int(round(block_ns / sub_ns)))
        origin = float(np.nanmin([fb["first_ns"], fc["first_ns"]]))
        rows.append({"pair": i, "origin_ns": origin, "sub_ns": float(sub_ns), "units": units,
                     "block_units": min(per, units), "block_requests": blen})
    return pd.DataFrame(rows)


def _dependence_series(side: _Side, slo: SLO) -> None:
    """Per run, in scheduled order: the SLO-good 0/1 series and the log TTFT and log TPOT
    series (a request without the value reads as the run's largest one — censored high).
    The block length is the largest Politis–White length over them: at our run lengths the
    sparse tail indicators (good, over-p99) hide the clustering of bursts under the
    autocorrelation noise band (PW ≈ 3 requests on 1{good} vs ≈ 40 on log TTFT in the tests'
    congestion model), so intervals from them alone are too narrow."""
    pred, params = good_predicate(slo)
    ttft = "ttft_ms" if slo.ttft_from == "scheduled" else "ttft_sent_ms"
    s = side.study.sql(f"SELECT run_id, CAST({pred} AS TINYINT) AS g, {ttft} AS ttft, tpot_ms "
                       f"FROM {side.view} WHERE in_window "
                       "ORDER BY run_id, scheduled_ns, request_id", params).fetchnumpy()
    rid = np.asarray(s["run_id"])
    cols = {k: np.asarray(s[k], dtype=np.float64) for k in ("g", "ttft", "tpot_ms")}
    side.good_series = []
    for r in side.runs:
        sel = rid == r
        series = [cols["g"][sel]]
        for k in ("ttft", "tpot_ms"):
            v = cols[k][sel]
            ok = np.isfinite(v) & (v > 0)
            if ok.sum() >= 3:
                series.append(np.log(np.where(ok, v, v[ok].max())))
        side.good_series.append(series)


def _edge_sql(column: str, edges: tuple[int, ...]) -> str:
    """Bucket index = number of edges ≤ value; the structure comes from code, values are bound."""
    return "(" + " + ".join(f"CAST({column} >= ? AS INTEGER)" for _ in edges) + ")"


def _reduce(side: _Side, slo: SLO, grid: pd.DataFrame, in_edges, out_edges, split_in, split_out,
            fair: FairnessRules) -> None:
    """Per (run sub-block, cell) sums and per-cell/sub-block log-bucket histograms, one SQL
    pass each. Queueing age: max(TTFT, queue_ms) of a request with a first token; a request
    still waiting at the end (timeout, cancelled, or ok without a first token) is censored at the
    run's last event; rejected and errored requests count in their rates instead."""
    con = side.study.con
    m = grid.assign(run_id=side.runs, end_ns=side.facts["end_ns"].to_numpy())
    con.register("_cmp_grid", m[["run_id", "pair", "origin_ns", "sub_ns", "end_ns"]])
    pred, gparams = good_predicate(slo, "q")
    ttft_col = "q.ttft_ms" if slo.ttft_from == "scheduled" else "q.ttft_sent_ms"
    r_sql = f"""
        SELECT g.pair,
               CAST(floor((q.scheduled_ns - g.origin_ns) / g.sub_ns) AS BIGINT) AS unit,
               {_edge_sql('q.input_tokens', in_edges)} AS in_b,
               {_edge_sql('q.output_tokens', out_edges)} AS out_b,
               q.input_tokens > ? AS q_in, q.output_tokens > ? AS q_out,
               coalesce(q.tenant, ?) AS tenant, coalesce(q.slo_class, ?) AS slo_class,
               {pred} AS good, q.status, {ttft_col} AS ttft, q.tpot_ms AS tpot, q.itl_ns,
               q.input_tokens, q.output_tokens, q.first_token_ns,
               CASE WHEN q.first_token_ns IS NOT NULL
                        THEN greatest({ttft_col}, q.queue_ms)
                    WHEN q.status IN ('timeout', 'cancelled', 'ok')
                        THEN (g.end_ns - q.scheduled_ns) / 1e6 END AS age_ms
        FROM {side.view} q JOIN _cmp_grid g USING (run_id)
        WHERE q.in_window"""
    r_params = [*in_edges, *out_edges, float(split_in), float(split_out), NONE_LABEL, NONE_LABEL,
                *gparams]
    dims = "pair, unit, in_b, out_b, q_in, q_out, tenant, slo_class"
    try:
        side.cells = con.execute(f"""
            WITH r AS ({r_sql})
            SELECT {dims}, count(*) AS n, count_if(good) AS good, count_if(status = 'ok') AS ok,
                   count_if(status = 'rejected') AS rejected,
                   count_if(status NOT IN ('ok', 'rejected')) AS errors,
                   sum(CASE WHEN first_token_ns IS NOT NULL THEN ? * input_tokens ELSE 0 END
                       + ? * output_tokens) AS svc,
                   sum(? * input_tokens + ? * output_tokens) AS demand,
                   max(age_ms) AS max_age_ms
            FROM r GROUP BY ALL
        """, [*r_params, fair.prefill_weight, fair.decode_weight, fair.prefill_weight,
              fair.decode_weight]).df()
        ln_g = math.log(sketch.gamma_of(sketch.DEFAULT_ALPHA))
        side.hists["ttft"] = con.execute(f"""
            WITH r AS ({r_sql})
            SELECT {dims}, {sketch.key_sql('ttft')} AS k, count(*) AS c
            FROM r WHERE status = 'ok' AND ttft IS NOT NULL GROUP BY ALL
        """, [*r_params, ln_g]).df()
        side.hists["tpot"] = con.execute(f"""
            WITH r AS ({r_sql})
            SELECT pair, unit, {sketch.key_sql('tpot')} AS k, count(*) AS c
            FROM r WHERE status = 'ok' AND tpot IS NOT NULL GROUP BY ALL
        """, [*r_params, ln_g]).df()
        if side.has_itl:
            side.hists["itl"] = con.execute(f"""
                WITH r AS ({r_sql}),
                     gaps AS (SELECT pair, unit, unnest(itl_ns) / 1e6 AS gap FROM r
                              WHERE status = 'ok' AND itl_ns IS NOT NULL)
                SELECT pair, unit, {sketch.key_sql('gap')} AS k, count(*) AS c
                FROM gaps WHERE gap IS NOT NULL GROUP BY ALL
            """, [*r_params, ln_g]).df()
    finally:
        con.unregister("_cmp_grid")


def _telemetry(study: Study) -> dict:
    """Peak GPU memory (GiB) over all samples, when resources/ has mem_used_bytes."""
    if not study.resource_files:
        return {}
    cols = {r[0] for r in study.sql("DESCRIBE resources").fetchall()}
    out = {}
    if "mem_used_bytes" in cols:
        v = study.sql("SELECT max(mem_used_bytes) FROM resources").fetchall()[0][0]
        if v is not None:
            out["peak_gpu_mem_gib"] = float(v) / BYTES_PER_GIB
    return out


def _energy_per_good(study: Study, slo: SLO, warmup_s: dict[str, float]) -> tuple[float, str]:
    """Joules per SLO-meeting request from ``capplan.cost.study_facts`` over the same aligned
    steady windows as the rest of the comparison (its notes explain which samples and requests
    were used); NaN when the study has no power samples."""
    from .cost import study_facts

    if not study.resource_files:
        return float("nan"), "no resources/ power samples"
    facts = study_facts(study, slo, warmup_s=warmup_s)
    e = sum(lv.energy_j for lv in facts.levels if lv.energy_j is not None)
    g = sum(lv.good_requests_powered for lv in facts.levels if lv.good_requests_powered)
    if not g:
        return float("nan"), "; ".join(facts.notes) or "no powered good requests"
    return e / g, "; ".join(facts.notes)


# ============================================================================ arrays & bootstrap


@dataclass(frozen=True)
class _Arrays:
    """One study on the common cell space: dense (units × cells) sums and histogram rows."""

    n_units: int
    sums: dict  # name -> (units × cells)
    ttft: tuple  # (unit, cell, key, count) arrays
    tpot: tuple  # (unit, key, count)
    itl: tuple | None
    max_age: np.ndarray  # (cells,)


def _arrays(side: _Side, cell_index: pd.DataFrame, grid: pd.DataFrame) -> _Arrays:
    offsets = np.concatenate([[0], np.cumsum(grid["units"].to_numpy())])
    n_units = int(offsets[-1])
    n_cells = len(cell_index)
    key = pd.MultiIndex.from_frame(cell_index[list(_CELL_DIMS)])

    def unit_of(df):
        u = offsets[df["pair"].to_numpy(dtype=np.int64)] + df["unit"].to_numpy(dtype=np.int64)
        hi = offsets[df["pair"].to_numpy(dtype=np.int64) + 1] - 1
        return np.clip(u, offsets[df["pair"].to_numpy(dtype=np.int64)], hi)

    def cell_of(df):
        return key.get_indexer(pd.MultiIndex.from_frame(df[list(_CELL_DIMS)]))

    cells = side.cells
    u, ci = unit_of(cells), cell_of(cells)
    sums = {}
    for name in _CELL_SUMS:
        M = np.zeros((n_units, n_cells))
        np.add.at(M, (u, ci), cells[name].to_numpy(dtype=np.float64))
        sums[name] = M
    age = np.full(n_cells, np.nan)
    a = cells["max_age_ms"].to_numpy(dtype=np.float64)
    ok = np.isfinite(a)
    if ok.any():
        age_s = pd.Series(a[ok]).groupby(ci[ok]).max()
        age[age_s.index.to_numpy()] = age_s.to_numpy()
    h = side.hists["ttft"]
    ttft = (unit_of(h), cell_of(h), h["k"].to_numpy(np.int64), h["c"].to_numpy(np.float64))
    h = side.hists["tpot"]
    tpot = (unit_of(h), h["k"].to_numpy(np.int64), h["c"].to_numpy(np.float64))
    itl = None
    if "itl" in side.hists:
        h = side.hists["itl"]
        itl = (unit_of(h), h["k"].to_numpy(np.int64), h["c"].to_numpy(np.float64))
    return _Arrays(n_units=n_units, sums=sums, ttft=ttft, tpot=tpot, itl=itl, max_age=age)


def _count_matrix(grid: pd.DataFrame, reps: int, rng) -> np.ndarray:
    """Stratified circular block bootstrap: each run's sub-blocks resampled on their own."""
    scheme = B.Circular()
    parts = [scheme.resample(int(r.units), int(r.block_units), reps, rng).counts()
             for r in grid.itertuples()]
    return np.hstack(parts)


def _quantile(W: np.ndarray, units, keys_, counts, n_units: int, p: float) -> tuple[float, np.ndarray]:
    """Point and replicate p-quantile from histogram rows. Only buckets above the point
    estimate's (1 − 10(1 − p)) quantile are held densely; the rest is a per-unit 'below' count
    (a replicate whose rank falls there would read NaN; it is then recomputed densely)."""
    R = W.shape[0]
    if counts.size == 0 or counts.sum() == 0:
        return float("nan"), np.full(R, np.nan)
    k_lo, k_hi = int(keys_.min()), int(keys_.max())
    full = np.bincount(keys_ - k_lo, weights=counts, minlength=k_hi - k_lo + 1)
    point = float(sketch.quantile_from_counts(full, k_lo, p))
    p_cut = max(0.0, 1.0 - 10.0 * (1.0 - p))
    cut_val = float(sketch.quantile_from_counts(full, k_lo, p_cut)) if p_cut > 0 else 0.0
    k_cut = max(k_lo, int(sketch.keys(cut_val)) - 1) if p_cut > 0 else k_lo
    for attempt in (k_cut, k_lo):
        keep = keys_ >= attempt
        H = np.zeros((n_units, k_hi - attempt + 1))
        np.add.at(H, (units[keep], keys_[keep] - attempt), counts[keep])
        below = np.bincount(units[~keep], weights=counts[~keep], minlength=n_units)
        reps = B.quantile_replicates(W, H, attempt, p, below=below if attempt > k_lo else None)
        nan_bad = np.isnan(reps) & (W @ (H.sum(axis=1) + below) > 0)
        if not nan_bad.any():
            break
    return point, reps


# ============================================================================ results


@dataclass(frozen=True)
class Verdict:
    """Overall outcome: passed only when no gate failed and (with fail_on_regression) no
    bucket was flagged."""

    passed: bool
    failed: tuple[str, ...]
    flagged_buckets: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_text(self) -> str:
        head = "PASS: every gate passes" if self.passed else "FAIL"
        lines = [head]
        lines += [f"  gate failed: {f}" for f in self.failed]
        lines += [f"  bucket regressed: {f}" for f in self.flagged_buckets]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class Comparison:
    """Result of ``compare``. ``to_frame()`` is the comparison table; ``buckets`` the bucket
    table; ``fairness`` the per-tenant table; ``workload`` the per-run offered-workload check;
    ``verdict`` the gate outcome."""

    table: pd.DataFrame = field(repr=False)
    buckets: pd.DataFrame = field(repr=False)
    fairness: pd.DataFrame = field(repr=False)
    workload: pd.DataFrame = field(repr=False)
    verdict: Verdict
    paired: bool
    slo: SLO
    gates: Gates = field(repr=False)
    baseline_name: str = ""
    candidate_name: str = ""
    reps: int = 0
    seed: int = 0
    confidence_headline: float = 0.975
    confidence_buckets: float = 0.975
    notes: tuple[str, ...] = ()

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    def display_frame(self) -> pd.DataFrame:
        """Readable strings for print / export."""
        t = self.table

        def f(v, unit):
            if v is None or (isinstance(v, float) and not np.isfinite(v)):
                return "n/a"
            if unit == "fraction":
                return f"{v:.4f}"
            if unit == "requests":
                return f"{v:,.0f}"
            return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"

        out = pd.DataFrame({
            "metric": t["metric"], "scope": t["scope"], "unit": t["unit"],
            "baseline": [f(v, u) for v, u in zip(t["baseline"], t["unit"])],
            "candidate": [f(v, u) for v, u in zip(t["candidate"], t["unit"])],
            "delta": [f(v, u) for v, u in zip(t["delta"], t["unit"])],
            "delta_%": [("n/a" if not np.isfinite(v) else f"{v:+.1f}") for v in t["delta_pct"]],
            "delta CI": [("" if not (np.isfinite(a) and np.isfinite(b)) else
                          f"[{f(a, u)}, {f(b, u)}]")
                         for a, b, u in zip(t["ci_low"], t["ci_high"], t["unit"])],
            "change": t["change"], "gate": t["gate"], "verdict": t["verdict"],
        })
        return out

    def to_text(self) -> str:
        mode = ("PAIRED (same trace rows; the same blocks resampled in both)" if self.paired
                else "independent (block bootstrap per study)")
        parts = [
            f"compare: baseline {self.baseline_name!r} vs candidate {self.candidate_name!r}",
            f"SLO: {self.slo.describe()}",
            f"bootstrap: {mode}; {self.reps} replicates, seed {self.seed}; headline CIs "
            f"simultaneous at {self.confidence_headline:.4g}, bucket CIs simultaneous at "
            f"{self.confidence_buckets:.4g}",
            self.display_frame().to_string(index=False),
        ]
        row_notes = [f"  {r.metric} ({r.scope}): {r.note}" for r in self.table.itertuples()
                     if r.note]
        if row_notes:
            parts.append("Row notes\n" + "\n".join(row_notes))
        flagged = self.buckets[self.buckets["flag"] != ""] if len(self.buckets) else self.buckets
        if len(flagged):
            cols = ["dimension", "bucket", "metric", "n_baseline", "n_candidate", "baseline",
                    "candidate", "delta", "ci_low", "ci_high", "flag"]
            shown = flagged[cols].copy()
            for col in ("baseline", "candidate", "delta", "ci_low", "ci_high"):
                shown[col] = shown[col].map(lambda v: f"{v:.4g}")
            parts.append("Bucket regressions\n" + shown.to_string(index=False))
        if len(self.fairness):
            parts.append("Tenant fairness (service = weighted tokens; age = max(TTFT, queue))\n"
                         + self.fairness.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        if self.notes:
            parts.append("Notes\n" + "\n".join(f"  {n}" for n in self.notes))
        parts.append(self.verdict.to_text())
        return "\n\n".join(parts)

    # ---------------------------------------------------------------- figures

    def figure(self):
        """Deltas with their CIs, one panel row per gated/stat metric (relative to baseline)."""
        import plotly.graph_objects as go

        t = self.table[(self.table["scope"] == "all") & np.isfinite(self.table["delta_pct"])]
        base = t["baseline"].abs().replace(0, np.nan)
        lo = 100 * t["ci_low"] / base
        hi = 100 * t["ci_high"] / base
        colors = t["verdict"].map({"FAIL": "crimson", "pass": "seagreen"}).fillna("grey")
        fig = go.Figure(go.Scatter(
            x=t["delta_pct"], y=t["metric"], mode="markers", marker=dict(color=colors, size=10),
            error_x=dict(type="data", symmetric=False, array=(hi - t["delta_pct"]).fillna(0),
                         arrayminus=(t["delta_pct"] - lo).fillna(0)),
            hovertext=t["verdict"], name="delta"))
        fig.add_vline(x=0, line_dash="dot")
        fig.update_layout(title="candidate − baseline (% of baseline) with simultaneous CI",
                          xaxis_title="delta %", yaxis_title="", height=120 + 40 * len(t))
        return fig

    def figure_buckets(self, metric: str = "ttft_p99_ms"):
        """Per-bucket delta and CI for one metric (attainment or ttft_p99_ms), one subplot row
        per dimension; flagged buckets in red."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        bk = self.buckets[self.buckets["metric"] == metric]
        dims = [d for d in BUCKET_DIMS if (bk["dimension"] == d).any()]
        fig = make_subplots(rows=max(len(dims), 1), cols=1, subplot_titles=dims,
                            vertical_spacing=0.08)
        for i, d in enumerate(dims, start=1):
            s = bk[bk["dimension"] == d]
            color = np.where(s["flag"] != "", "crimson", "steelblue")
            fig.add_trace(go.Scatter(
                x=s["bucket"], y=s["delta"], mode="markers", marker=dict(color=color, size=9),
                error_y=dict(type="data", symmetric=False,
                             array=(s["ci_high"] - s["delta"]).fillna(0),
                             arrayminus=(s["delta"] - s["ci_low"]).fillna(0)),
                name=d, showlegend=False, text=[f"n={a:,}/{b:,}" for a, b in
                                                zip(s["n_baseline"], s["n_candidate"])]), row=i,
                col=1)
            fig.add_hline(y=0, line_dash="dot", row=i, col=1)
        fig.update_layout(title=f"{metric}: candidate − baseline by bucket (simultaneous CI)",
                          height=260 * max(len(dims), 1))
        return fig

    def figure_fairness(self):
        """Share of weighted-token service per tenant vs entitled share."""
        import plotly.graph_objects as go

        f = self.fairness
        fig = go.Figure()
        if len(f):
            fig.add_bar(x=f["tenant"], y=f["entitled_share"], name="entitled")
            fig.add_bar(x=f["tenant"], y=f["share_baseline"], name="baseline")
            fig.add_bar(x=f["tenant"], y=f["share_candidate"], name="candidate")
        fig.update_layout(barmode="group", title="tenant share of weighted-token service",
                          yaxis_title="share")
        return fig


# ============================================================================ orchestration


def _edges_for(rules_edges, max_tokens: int) -> tuple[int, ...]:
    if rules_edges is not None:
        return tuple(rules_edges)
    top = max(1, int(math.ceil(math.log2(max(max_tokens, 2)))) + 1)
    return tuple(1 << k for k in range(1, top + 1))


def _range_label(edges: tuple[int, ...], group: list[int]) -> str:
    lo_i, hi_i = min(group), max(group)
    lo = 0 if lo_i == 0 else edges[lo_i - 1]
    return f"[{lo:,}, {edges[hi_i]:,})" if hi_i < len(edges) else f"[{lo:,}, ∞)"


def _median(hists: list[pd.DataFrame]) -> float:
    h = pd.concat(hists).groupby("v")["c"].sum().sort_index()
    if h.empty:
        return 0.0
    cum = h.cumsum() / h.sum()
    return float(h.index[np.searchsorted(cum.to_numpy(), 0.5)])


def _entitlements(tenants: list[str], rules: FairnessRules, manifest: C.Manifest) -> np.ndarray:
    ent = dict(rules.entitlements) or dict((manifest.workload or {}).get("entitlements") or {})
    if not ent:
        return np.ones(len(tenants))
    missing = [t for t in tenants if t not in ent]
    if missing:
        raise SpecError(f"tenant(s) without an entitlement: {', '.join(missing)}",
                        field="fairness.entitlements",
                        fix="give every tenant a weight (or none, for equal shares)")
    return np.array([float(ent[t]) for t in tenants])


def compare(baseline, candidate, slo, *, gates=None, confidence: float | None = None,
            reps: int = 1000, seed: int = 0, warmup_s=None,
            allow_cache_mismatch: bool = False) -> Comparison:
    """Compare ``candidate`` against ``baseline`` (study paths or opened Studies) under one SLO.

    ``gates``: a path, mapping or Gates (None = templates/gates.yaml defaults);
    ``confidence`` overrides the gates file's. Deterministic for a given ``seed``. Matched runs
    labelled with different prefix-cache conditions are refused unless
    ``allow_cache_mismatch`` (``capplan.cache.check_cache_conditions``).
    Raises StudyError/SpecError (exit 2) when the studies cannot be put side by side."""
    slo = SLO.parse(slo)
    g = load_gates(gates)
    conf = g.confidence if confidence is None else _number(confidence, "confidence", "argument",
                                                           lo=0.5, hi=1.0, hi_open=True)
    if isinstance(reps, bool) or not isinstance(reps, (int, np.integer)) or reps < 100:
        raise SpecError(f"reps must be an integer ≥ 100, got {reps!r}", field="reps",
                        fix="e.g. --reps 1000")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise SpecError(f"seed must be an integer, got {seed!r}", field="seed")
    conf_family = 1.0 - (1.0 - conf) / 2.0
    sb, sc = open_study(baseline), open_study(candidate)
    _check_slo(sb, sc)
    pairs = _match_runs(sb, sc)
    cache_notes = check_cache_conditions(sb.manifest, sc.manifest, pairs, allow=allow_cache_mismatch)
    # the same steady window on both sides: the longer of the two warm-ups per matched run
    warm_b, warm_c = {}, {}
    for rb, rc in pairs:
        w = max(sb.manifest.run(rb).warmup_s or 0.0, sc.manifest.run(rc).warmup_s or 0.0)
        if warmup_s is not None:
            w = float(warmup_s)
        warm_b[rb], warm_c[rc] = w, w
    b = _Side("baseline", sb, [p[0] for p in pairs], pd.DataFrame(), _gpus(sb), sb.has("itl_ns"),
              warmup_s=warm_b, view=request_view(sb, Window.of(sb, warm_b)))
    c = _Side("candidate", sc, [p[1] for p in pairs], pd.DataFrame(), _gpus(sc), sc.has("itl_ns"),
              warmup_s=warm_c, view=request_view(sc, Window.of(sc, warm_c)))
    for side in (b, c):
        side.facts = _facts(side, side.runs)
        _token_hist(side)
    _check_workload(b, c, pairs, g.workload)
    paired, pairing = _pairing(b, c, pairs, g.workload.pairing)
    for side in (b, c):
        _dependence_series(side, slo)
    grid = _block_grid(b, c)
    max_in = int(max(b.tok_hist["input"]["v"].max(), c.tok_hist["input"]["v"].max()))
    max_out = int(max(b.tok_hist["output"]["v"].max() if len(b.tok_hist["output"]) else 1,
                      c.tok_hist["output"]["v"].max() if len(c.tok_hist["output"]) else 1))
    in_edges = _edges_for(g.buckets.input_edges, max_in)
    out_edges = _edges_for(g.buckets.output_edges, max_out)
    split_in = g.buckets.quadrant_split[0]
    split_out = g.buckets.quadrant_split[1]
    if split_in is None:
        split_in = _median([b.tok_hist["input"]])
    if split_out is None:
        split_out = _median([b.tok_hist["output"]])
    for side in (b, c):
        _reduce(side, slo, grid, in_edges, out_edges, split_in, split_out, g.fairness)
    cell_index = (pd.concat([b.cells[list(_CELL_DIMS)], c.cells[list(_CELL_DIMS)]])
                  .drop_duplicates().sort_values(list(_CELL_DIMS)).reset_index(drop=True))
    ab, ac = _arrays(b, cell_index, grid), _arrays(c, cell_index, grid)
    rng = B.as_rng(seed)
    Wb = _count_matrix(grid, reps, rng)
    Wc = Wb if paired else _count_matrix(grid, reps, rng)
    ctx = _Ctx(b, c, ab, ac, Wb, Wc, g, slo, conf, conf_family, cell_index, pairs, pairing,
               paired, grid, in_edges, out_edges, (split_in, split_out), seed)
    table, notes = _headline(ctx)
    notes = list(notes) + cache_notes
    buckets = _buckets(ctx)
    fairness = _fairness_table(ctx)
    verdict = _verdict(table, buckets, g, notes)
    workload = _workload_frame(ctx)
    return Comparison(table=table, buckets=buckets, fairness=fairness, workload=workload,
                      verdict=verdict, paired=paired, slo=slo, gates=g, baseline_name=sb.name,
                      candidate_name=sc.name, reps=int(reps), seed=int(seed),
                      confidence_headline=conf_family, confidence_buckets=conf_family,
                      notes=tuple(notes))


@dataclass
class _Ctx:
    b: _Side
    c: _Side
    ab: _Arrays
    ac: _Arrays
    Wb: np.ndarray
    Wc: np.ndarray
    g: Gates
    slo: SLO
    conf: float
    conf_family: float
    cells: pd.DataFrame
    pairs: list
    pairing: pd.DataFrame
    paired: bool
    grid: pd.DataFrame
    in_edges: tuple
    out_edges: tuple
    split: tuple
    seed: int


def _row(metric: str, scope: str, base: float, cand: float, reps_b=None, reps_c=None,
         note: str = "") -> dict:
    spec = METRICS[metric]
    d = cand - base if np.isfinite(base) and np.isfinite(cand) else float("nan")
    reps = None
    if reps_b is not None and reps_c is not None:
        reps = np.asarray(reps_c, dtype=np.float64) - np.asarray(reps_b, dtype=np.float64)
    return {"metric": metric, "label": spec.label, "scope": scope, "unit": spec.unit,
            "better": spec.better, "kind": spec.kind, "baseline": float(base),
            "candidate": float(cand), "delta": d,
            "delta_pct": 100.0 * d / abs(base) if np.isfinite(d) and base != 0 else float("nan"),
            "_reps": reps, "note": note}


def _headline(ctx: _Ctx) -> tuple[pd.DataFrame, list[str]]:
    b, c, ab, ac, Wb, Wc = ctx.b, ctx.c, ctx.ab, ctx.ac, ctx.Wb, ctx.Wc
    p = ctx.g.percentile
    rows: list[dict] = []
    notes: list[str] = []
    # offered rate: measured per run (and the pooled Σn / Σwindow), info only
    for i, (rb, rc) in enumerate(ctx.pairs):
        fb, fc = b.facts.iloc[i], c.facts.iloc[i]
        rows.append(_row("offered_rps", f"run {rb}", fb["rate_rps"], fc["rate_rps"]))

    def tot(a: _Arrays, name):
        return a.sums[name].sum(axis=1)

    nb, nc = tot(ab, "n"), tot(ac, "n")
    gb, gc = tot(ab, "good"), tot(ac, "good")
    att_b, att_c = B.ratio_replicates(Wb, gb, nb), B.ratio_replicates(Wc, gc, nc)
    Ab, Ac = gb.sum() / nb.sum(), gc.sum() / nc.sum()
    rows.append(_row("attainment", "all", Ab, Ac, att_b, att_c))
    for metric, hkey in _Q_METRICS.items():
        if hkey == "itl" and (ab.itl is None or ac.itl is None):
            if ab.itl is not None or ac.itl is not None:
                notes.append("ITL p99 not compared: only one study recorded itl_ns")
            continue
        out = []
        for a, W in ((ab, Wb), (ac, Wc)):
            if hkey == "ttft":
                u, _, k, cnt = a.ttft
            else:
                u, k, cnt = getattr(a, hkey)
            out.append(_quantile(W, u, k, cnt, a.n_units, p))
        (pb, rb_), (pc, rc_) = out
        rows.append(_row(metric, "all", pb, pc, rb_, rc_))
        rows[-1]["label"] = rows[-1]["label"].replace("p99", f"p{100 * p:g}")
    # goodput per GPU = SLO-good requests / steady-window seconds / GPUs; replicates resample
    # the good count (arrival noise included; it cancels when paired)
    window_b = _window_s(b.facts)
    window_c = _window_s(c.facts)
    good_rb, good_rc = Wb @ gb, Wc @ gc
    gp_b, gp_c = good_rb / window_b / b.gpus, good_rc / window_c / c.gpus
    GPb, GPc = gb.sum() / window_b / b.gpus, gc.sum() / window_c / c.gpus
    rows.append(_row("goodput_rps_per_gpu", "all", GPb, GPc, gp_b, gp_c))
    rows.extend(_cslo_rows(ctx, notes))
    # deterministic failure rates
    for metric, name in (("error_rate", "errors"), ("reject_rate", "rejected")):
        rows.append(_row(metric, "all", tot(ab, name).sum() / nb.sum(),
                         tot(ac, name).sum() / nc.sum()))
    if ctx.paired:
        miss = float(ctx.pairing["missing"].sum())
        extra = float(ctx.pairing["extra"].sum())
        rows.append(_row("missing_requests", "all", 0.0, miss,
                         note=f"{extra:,.0f} extra in the candidate" if extra else ""))
    tb, tc = _telemetry(b.study), _telemetry(c.study)
    if "peak_gpu_mem_gib" in tb and "peak_gpu_mem_gib" in tc:
        rows.append(_row("peak_gpu_mem_gib", "all", tb["peak_gpu_mem_gib"], tc["peak_gpu_mem_gib"]))
    elif tb or tc:
        notes.append("peak GPU memory not compared: only one study has mem_used_bytes telemetry")
    eb, nb_e = _energy_per_good(b.study, ctx.slo, b.warmup_s)
    ec, nc_e = _energy_per_good(c.study, ctx.slo, c.warmup_s)
    if np.isfinite(eb) and np.isfinite(ec):
        # energy fixed, SLO-good count resampled: E/good scales with 1/good
        rows.append(_row("energy_j_per_good_request", "all", eb, ec, eb * gb.sum() / good_rb,
                         ec * gc.sum() / good_rc))
    elif np.isfinite(eb) or np.isfinite(ec):
        notes.append("energy per SLO-meeting request not compared: power telemetry in one study "
                     "only")
    if ctx.g.baseline_usd_per_gpu_hour is not None:
        pb_, pc_ = ctx.g.baseline_usd_per_gpu_hour, ctx.g.candidate_usd_per_gpu_hour
        # $/1k good = $/GPU-h × GPUs / (good req/s × 3600) × 1000 = $/GPU-h / (goodput per GPU × 3.6)
        with np.errstate(divide="ignore"):
            rows.append(_row("cost_usd_per_1k_good", "all", pb_ / (GPb * 3.6),
                             pc_ / (GPc * 3.6), pb_ / (gp_b * 3.6),
                             pc_ / (gp_c * 3.6),
                             note="price per GPU-hour from the gates file (cost:)"))
    fr = _fairness_rows(ctx)
    rows.extend(fr)
    # per-run rows (pointwise, informational) when the study has several runs
    if len(ctx.pairs) > 1:
        off = np.concatenate([[0], np.cumsum(ctx.grid["units"].to_numpy())])
        for i, (rb, _) in enumerate(ctx.pairs):
            sl = slice(off[i], off[i + 1])
            rb_reps = B.ratio_replicates(Wb[:, sl], gb[sl], nb[sl])
            rc_reps = B.ratio_replicates(Wc[:, sl], gc[sl], nc[sl])
            r = _row("attainment", f"run {rb}", gb[sl].sum() / max(nb[sl].sum(), 1),
                     gc[sl].sum() / max(nc[sl].sum(), 1), rb_reps, rc_reps)
            r["kind"] = "info"
            rows.append(r)
    return _finish_table(rows, ctx), notes


def _window_s(facts: pd.DataFrame) -> float:
    """Σ per run of the steady window (n − 1) / measured rate, i.e. the scheduled span."""
    span = (facts["last_ns"] - facts["first_ns"]).clip(lower=0).fillna(0).sum() / C.NS_PER_S
    return float(span) if span > 0 else float("nan")


def _cslo_rows(ctx: _Ctx, notes: list[str]) -> list[dict]:
    """C_SLO of each study from ``capplan.envelope.fit_envelope`` (its own bootstrap); the CI of
    the difference treats the two fits as independent (conservative for a paired trace)."""
    levels = {r.load_level for r in ctx.b.study.manifest.runs}
    if ctx.b.study.load_model != C.LoadModel.OPEN.value or len(levels) < 2:
        notes.append("C_SLO not compared: it needs an open-loop sweep of at least two offered "
                     "rates")
        return []
    try:
        from .envelope import fit_envelope
    except ImportError:
        notes.append("C_SLO not compared: capplan.envelope is not available in this build")
        return []
    reps = ctx.Wb.shape[0]
    fits = []
    for k, side in enumerate((ctx.b, ctx.c)):
        env = fit_envelope(side.study, ctx.slo, confidence=ctx.conf, reps=reps,
                           seed=ctx.seed + k)
        fits.append(env)
    vals = [float(env.cslo.estimate) for env in fits]
    reps_ = [np.asarray(env.crossing_replicates, dtype=np.float64) for env in fits]
    def one(name, cs):
        return (f"{name} {cs.estimate:.4g} [{cs.ci_low:.4g}, {cs.ci_high:.4g}], lower bound "
                f"{cs.lower_bound:.4g} ({cs.status})")

    note = "; ".join(one(n, env.cslo) for n, env in zip(("baseline", "candidate"), fits))
    usable = all(r.size == reps and np.isfinite(r).mean() >= 0.95 for r in reps_)
    if not usable:
        notes.append("C_SLO difference has no CI: the capacity is not bracketed by the tested "
                     "rates in too many replicates (see `capplan envelope`)")
        r = _row("cslo_rps", "all", vals[0], vals[1], note=note)
        r["kind"] = "info"
        return [r]
    return [_row("cslo_rps", "all", vals[0], vals[1], reps_[0], reps_[1], note=note)]


def _tenant_matrix(ctx: _Ctx) -> tuple[list[str], np.ndarray]:
    tenants = sorted(ctx.cells["tenant"].unique())
    M = np.zeros((len(ctx.cells), len(tenants)))
    M[np.arange(len(ctx.cells)), [tenants.index(t) for t in ctx.cells["tenant"]]] = 1.0
    return tenants, M


def _fairness_rows(ctx: _Ctx) -> list[dict]:
    tenants, M = _tenant_matrix(ctx)
    if len(tenants) < 2:
        return []
    e = _entitlements(tenants, ctx.g.fairness, ctx.b.study.manifest)
    out = []
    stats = []
    for a, W in ((ctx.ab, ctx.Wb), (ctx.ac, ctx.Wc)):
        S = a.sums["svc"] @ M  # units × tenants
        stats.append((fairness_stats(S.sum(axis=0), e), fairness_stats(W @ S, e)))
    (pb, rb), (pc, rc) = stats
    out.append(_row("fair_share_deviation", "all", float(pb["max_abs_deviation"]),
                    float(pc["max_abs_deviation"]), rb["max_abs_deviation"],
                    rc["max_abs_deviation"]))
    out.append(_row("jain_index", "all", float(pb["jain"]), float(pc["jain"]), rb["jain"],
                    rc["jain"]))
    return out


def _finish_table(rows: list[dict], ctx: _Ctx) -> pd.DataFrame:
    """CIs: one simultaneous family over the gated stat rows; pointwise for the rest; then the
    verdict of every row."""
    fam = [i for i, r in enumerate(rows) if r["kind"] == "stat" and r["_reps"] is not None
           and ctx.g.gate(r["metric"]).enabled and np.isfinite(r["delta"])]
    lo = np.full(len(rows), np.nan)
    hi = np.full(len(rows), np.nan)
    kinds = [""] * len(rows)
    if fam:
        D = np.column_stack([rows[i]["_reps"] for i in fam])
        l_, h_ = simultaneous_ci(D, [rows[i]["delta"] for i in fam], ctx.conf_family)
        lo[fam], hi[fam] = l_, h_
        for i in fam:
            kinds[i] = "simultaneous"
    for i, r in enumerate(rows):
        if i in fam or r["_reps"] is None or not np.isfinite(r["delta"]):
            continue
        lo[i], hi[i] = B.percentile_ci(r["_reps"], ctx.conf)
        kinds[i] = "pointwise"
    for i, r in enumerate(rows):
        r["ci_low"], r["ci_high"], r["ci_kind"] = lo[i], hi[i], kinds[i]
        gate = ctx.g.gate(r["metric"]) if r["scope"] == "all" else None
        if r["kind"] == "deterministic":
            change, verdict = judge(r["better"], r["baseline"], r["candidate"], np.nan, np.nan,
                                    gate, deterministic=True)
        elif kinds[i]:
            change, verdict = judge(r["better"], r["baseline"], r["candidate"], lo[i], hi[i],
                                    gate if i in fam else None)
        else:
            change = ""
            verdict = "info" if np.isfinite(r["delta"]) else "n/a"
        r["change"], r["verdict"] = change, verdict
        r["gate"] = gate.describe() if gate is not None and r["kind"] != "info" else ""
    cols = ["metric", "label", "scope", "unit", "better", "kind", "baseline", "candidate", "delta",
            "delta_pct", "ci_low", "ci_high", "ci_kind", "change", "gate", "verdict", "note"]
    return pd.DataFrame([{k: r[k] for k in cols} for r in rows], columns=cols)


def _buckets(ctx: _Ctx) -> pd.DataFrame:
    """Attainment and TTFT p-quantile per bucket of each dimension, simultaneous CIs over all
    sufficiently sampled buckets (one family), and regression flags."""
    rules = ctx.g.buckets
    cells = ctx.cells
    nb_cell = ctx.ab.sums["n"].sum(axis=0)
    nc_cell = ctx.ac.sums["n"].sum(axis=0)
    defs: list[tuple[str, str, np.ndarray]] = []  # (dimension, label, cell mask)

    def ordered(dim_col: str, edges: tuple, name: str):
        nbins = len(edges) + 1
        idx = cells[dim_col].to_numpy()
        cb = np.bincount(idx, weights=nb_cell, minlength=nbins)
        cc = np.bincount(idx, weights=nc_cell, minlength=nbins)
        for grp in merge_ordered(cb, cc, rules.min_requests):
            defs.append((name, _range_label(edges, grp), np.isin(idx, grp)))

    ordered("in_b", ctx.in_edges, "input_tokens")
    ordered("out_b", ctx.out_edges, "output_tokens")
    si, so = ctx.split
    for qi in (False, True):
        for qo in (False, True):
            lab = (f"in {'>' if qi else '≤'} {si:,.0f}, out {'>' if qo else '≤'} {so:,.0f}")
            defs.append(("quadrant", lab, (cells["q_in"].to_numpy() == qi)
                         & (cells["q_out"].to_numpy() == qo)))
    for dim in ("tenant", "slo_class"):
        vals = cells[dim].to_numpy()
        labels = sorted(set(vals))
        if labels == [NONE_LABEL]:
            continue
        sparse = []
        for lab in labels:
            m = vals == lab
            if min(nb_cell[m].sum(), nc_cell[m].sum()) >= rules.min_requests:
                defs.append((dim, lab, m))
            else:
                sparse.append(lab)
        if sparse:
            defs.append((dim, OTHER_LABEL if len(sparse) > 1 else sparse[0],
                         np.isin(vals, sparse)))
    if not defs:
        return pd.DataFrame()
    M = np.column_stack([d[2] for d in defs]).astype(np.float64)  # cells × buckets
    p = ctx.g.percentile
    rows = []
    reps_cols = []
    Gb, Nb = ctx.ab.sums["good"] @ M, ctx.ab.sums["n"] @ M
    Gc, Nc = ctx.ac.sums["good"] @ M, ctx.ac.sums["n"] @ M
    with np.errstate(invalid="ignore", divide="ignore"):  # per-bucket denominators
        att_b = (ctx.Wb @ Gb) / (ctx.Wb @ Nb)
        att_c = (ctx.Wc @ Gc) / (ctx.Wc @ Nc)
    qname = f"ttft_p{100 * p:g}_ms"
    for j, (dim, lab, mask) in enumerate(defs):
        n_b, n_c = int(Nb[:, j].sum()), int(Nc[:, j].sum())
        enough = min(n_b, n_c) >= rules.min_requests
        Ab = Gb[:, j].sum() / n_b if n_b else float("nan")
        Ac = Gc[:, j].sum() / n_c if n_c else float("nan")
        rows.append({"dimension": dim, "bucket": lab, "metric": "attainment", "n_baseline": n_b,
                     "n_candidate": n_c, "baseline": Ab, "candidate": Ac,
                     "better": "higher", "enough": enough})
        reps_cols.append(att_c[:, j] - att_b[:, j])
        qs = []
        for a, W in ((ctx.ab, ctx.Wb), (ctx.ac, ctx.Wc)):
            u, ci, k, cnt = a.ttft
            sel = mask[ci] if ci.size else np.zeros(0, bool)
            qs.append(_quantile(W, u[sel], k[sel], cnt[sel], a.n_units, p))
        (qb, rqb), (qc, rqc) = qs
        rows.append({"dimension": dim, "bucket": lab, "metric": qname, "n_baseline": n_b,
                     "n_candidate": n_c, "baseline": qb, "candidate": qc, "better": "lower",
                     "enough": enough})
        reps_cols.append(rqc - rqb)
    df = pd.DataFrame(rows)
    df["delta"] = df["candidate"] - df["baseline"]
    df["delta_pct"] = 100.0 * df["delta"] / df["baseline"].abs().replace(0, np.nan)
    fam = [i for i, r in enumerate(rows) if r["enough"] and np.isfinite(df["delta"].iat[i])]
    lo = np.full(len(rows), np.nan)
    hi = np.full(len(rows), np.nan)
    if fam:
        l_, h_ = simultaneous_ci(np.column_stack([reps_cols[i] for i in fam]),
                                 df["delta"].to_numpy()[fam], ctx.conf_family)
        lo[fam], hi[fam] = l_, h_
    df["ci_low"], df["ci_high"] = lo, hi
    changes, flags = [], []
    for i, r in df.iterrows():
        if not r["enough"]:
            changes.append(f"insufficient (n < {rules.min_requests} in a study)")
            flags.append("")
            continue
        if r["metric"] == "attainment":
            gate = Gate("bucket_attainment", max_regression_abs=rules.attainment_max_drop_abs)
        else:
            gate = Gate("bucket_p99", max_regression_pct=rules.p99_max_regression_pct)
        change, verdict = judge(r["better"], r["baseline"], r["candidate"], r["ci_low"],
                                r["ci_high"], gate)
        changes.append(change)
        flags.append("REGRESSED" if verdict == "FAIL" else "")
    df["change"], df["flag"] = changes, flags
    return df.drop(columns=["enough"])


def _fairness_table(ctx: _Ctx) -> pd.DataFrame:
    tenants, M = _tenant_matrix(ctx)
    if len(tenants) < 2:
        return pd.DataFrame()
    e = _entitlements(tenants, ctx.g.fairness, ctx.b.study.manifest)
    e = e / e.sum()
    out = pd.DataFrame({"tenant": tenants, "entitled_share": e})
    for name, a in (("baseline", ctx.ab), ("candidate", ctx.ac)):
        svc = (a.sums["svc"] @ M).sum(axis=0)
        dem = (a.sums["demand"] @ M).sum(axis=0)
        st = fairness_stats(svc, e)
        out[f"service_{name}"] = svc
        out[f"share_{name}"] = st["share"]
        out[f"deviation_{name}"] = st["deviation"]
        out[f"demand_share_{name}"] = dem / dem.sum() if dem.sum() else np.nan
        age = np.full(len(tenants), np.nan)
        for t_i in range(len(tenants)):
            v = a.max_age[M[:, t_i] > 0]
            v = v[np.isfinite(v)]
            if v.size:
                age[t_i] = v.max()
        out[f"worst_age_ms_{name}"] = age
    return out


def _verdict(table: pd.DataFrame, buckets: pd.DataFrame, g: Gates, notes: list[str]) -> Verdict:
    failed = []
    for r in table[table["verdict"] == "FAIL"].itertuples():
        failed.append(f"{r.metric} ({r.scope}): baseline {r.baseline:.6g}, candidate "
                      f"{r.candidate:.6g}, delta {r.delta:+.6g} [{r.ci_low:.4g}, {r.ci_high:.4g}]"
                      if r.kind == "stat" else
                      f"{r.metric}: baseline {r.baseline:.6g}, candidate {r.candidate:.6g} "
                      f"(deterministic; {r.gate})")
    flagged = []
    if len(buckets):
        for r in buckets[buckets["flag"] != ""].itertuples():
            flagged.append(f"{r.dimension} {r.bucket}: {r.metric} {r.baseline:.4g} → "
                           f"{r.candidate:.4g} (CI of delta [{r.ci_low:.4g}, {r.ci_high:.4g}], "
                           f"n = {r.n_baseline:,}/{r.n_candidate:,})")
    vnotes = list(notes)
    improved = table[(table["scope"] == "all") & (table["change"] == "improvement")]
    if flagged and len(improved):
        vnotes.append("the aggregate improved (" + ", ".join(improved["metric"]) + ") while "
                      f"{len(flagged)} bucket(s) regressed — see the buckets above")
    elif flagged and not len(table[(table["scope"] == "all") & (table["change"] == "regression")]):
        vnotes.append(f"no aggregate regression is significant, but {len(flagged)} bucket(s) "
                      "regressed")
    passed = not failed and not (flagged and g.buckets.fail_on_regression)
    return Verdict(passed=passed, failed=tuple(failed), flagged_buckets=tuple(flagged),
                   notes=tuple(vnotes))


def _workload_frame(ctx: _Ctx) -> pd.DataFrame:
    rows = []
    for i, (rb, rc) in enumerate(ctx.pairs):
        fb, fc = ctx.b.facts.iloc[i], ctx.c.facts.iloc[i]
        pr = ctx.pairing.iloc[i]
        rows.append({"run_baseline": rb, "run_candidate": rc,
                     "offered_rps_baseline": fb["rate_rps"], "offered_rps_candidate": fc["rate_rps"],
                     "n_baseline": int(fb["n"]), "n_candidate": int(fc["n"]),
                     "arrival_cv_baseline": fb["cv"], "arrival_cv_candidate": fc["cv"],
                     "matched_requests": int(pr["matched"]), "missing_in_candidate": int(pr["missing"]),
                     "extra_in_candidate": int(pr["extra"]),
                     "block_requests": ctx.grid["block_requests"].iat[i],
                     "subblock_s": ctx.grid["sub_ns"].iat[i] / C.NS_PER_S,
                     "subblocks": int(ctx.grid["units"].iat[i])})
    return pd.DataFrame(rows)


# ============================================================================ export (I/O edge)

XLSX_NAME = "compare.xlsx"
CSV_NAMES = {"Comparison": "comparison.csv", "Buckets": "buckets.csv", "Fairness": "fairness.csv",
             "Workload": "workload.csv", "Verdict": "verdict.csv", "Provenance": "provenance.csv"}


def comparison_tables(cmp: Comparison, *, time: str, hashes: tuple[str, str] | None = None
                      ) -> dict[str, pd.DataFrame]:
    """The export's tables keyed by sheet name (numbers stay numbers)."""
    v = cmp.verdict
    verdict = pd.DataFrame(
        [("passed", str(v.passed))] + [("gate failed", f) for f in v.failed]
        + [("bucket regressed", f) for f in v.flagged_buckets] + [("note", n) for n in v.notes],
        columns=["item", "text"])
    from .version import __version__

    prov = [("capplan version", __version__), ("baseline", cmp.baseline_name),
            ("candidate", cmp.candidate_name), ("SLO", str(cmp.slo)),
            ("gates", cmp.gates.source), ("bootstrap", "paired" if cmp.paired else "independent"),
            ("replicates", cmp.reps), ("seed", cmp.seed),
            ("confidence (each family)", cmp.confidence_headline), ("time", time)]
    if hashes:
        prov += [("baseline content hash (sha256)", hashes[0]),
                 ("candidate content hash (sha256)", hashes[1])]
    return {"Comparison": cmp.to_frame(), "Buckets": cmp.buckets, "Fairness": cmp.fairness,
            "Workload": cmp.workload, "Verdict": verdict,
            "Provenance": pd.DataFrame(prov, columns=["key", "value"])}


def check_out_dir(out_dir) -> Path:
    """An --out directory may be new, empty, or an earlier compare export; anything else is a
    SpecError (nothing of the user's is replaced)."""
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise SpecError("--out exists and is not a directory", field="--out", file=str(out),
                            fix="choose a new directory name for the comparison export")
        if any(out.iterdir()) and not (out / XLSX_NAME).is_file():
            raise SpecError("--out directory exists and holds other files; the export would "
                            "replace it", field="--out", file=str(out),
                            fix="choose a new or empty directory")
    return out


def export_comparison(cmp: Comparison, out_dir, *, time: str | None = None,
                      hashes: tuple[str, str] | None = None) -> Path:
    """Write compare.xlsx and one CSV per sheet, built in a temp directory and renamed (never
    half-written). Text cells are formula-injection safe (capplan.io writers)."""
    import datetime as _dt

    from .io import atomic_dir, write_csv, write_xlsx

    out = check_out_dir(out_dir)
    time = time or _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    created = _dt.datetime.fromisoformat(time).astimezone(_dt.timezone.utc).replace(tzinfo=None)
    tables = comparison_tables(cmp, time=time, hashes=hashes)
    with atomic_dir(out) as tmp:
        write_xlsx(tables, tmp / XLSX_NAME, created=created, title="capplan comparison")
        for sheet, df in tables.items():
            write_csv(df, tmp / CSV_NAMES[sheet])
    return out
