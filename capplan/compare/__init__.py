"""Baseline vs candidate on the same offered trace and SLO: release gates, bucket regressions,
tenant fairness.

Why this shape. A release decision needs (1) the same offered workload on both sides — decided
only from what the client offered (schedule, prompts, answer lengths asked for), never from
outcomes, else a regression could hide as a refusal; (2) a difference larger than its sampling
noise — a regression or improvement is declared only when the bootstrap CI of ``candidate −
baseline`` excludes zero; (3) no false alarm when nothing changed — the CIs of all gated rows
are *simultaneous* (a sup-t band), so "every gate passes" holds with probability ≥ the family
confidence under no change; (4) honest noise on realistic sweeps — runs where the baseline is
saturated (at or over its SLO capacity, overloaded, not stationary) vary far more from run to
run than one run shows, so they are gated as their own family with that spread in their
intervals.

Pipeline (I/O at the edges, the rest numpy):
1. open both studies, match runs, one steady window per matched run (``workload``);
2. offered facts, pairing (both replay the same trace rows ⇒ the same draws resample both),
   refusal of a different offered workload (``workload``);
3. the project's reduction of each side over those windows (``capplan.reduce``) — block
   lengths, diagnostics, and the C_SLO fit (``capplan.envelope.fit_from_stats``) — and the
   per-(sub-block, cell) sums on one time grid shared by both sides (``sides``, ``sampling``);
4. run families from the baseline (``deltas.classify_runs``); one resample per run
   (``capplan.bootstrap.resample``; two-stage over repeats) (``sampling``);
5. the tables (``deltas``, ``buckets``, ``fairness``) and the verdict; the files for people
   (compare.xlsx and CSVs) are written by ``capplan.export.export_comparison``.

Modules: ``gates`` (the gates file), ``workload``, ``sides``, ``sampling``, ``stats`` (the
sup-t band, the gate rule, bucket merging, fairness shares), ``deltas``, ``buckets``,
``fairness``, ``result`` (Comparison, Verdict), ``core`` (``compare``).
"""

from .core import compare
from .gates import BucketRules, FairnessRules, Gate, Gates, RunRules, WorkloadRules, load_gates
from .result import BUCKET_DIMS, METRICS, Comparison, MetricSpec, Verdict
from .stats import fairness_stats, judge, merge_ordered, simultaneous_ci
from .workload import ks_distance

__all__ = ["compare", "BucketRules", "FairnessRules", "Gate", "Gates", "RunRules",
           "WorkloadRules",
           "load_gates", "BUCKET_DIMS", "METRICS", "Comparison", "MetricSpec", "Verdict",
           "fairness_stats", "judge", "merge_ordered", "simultaneous_ci", "ks_distance"]
