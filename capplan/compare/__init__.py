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

Modules: ``gates`` (the gates file), ``workload`` (same workload? pairing), ``reduction`` (each
side's sums), ``stats`` (intervals, the gate rule), ``deltas`` (the tables and the verdict),
``result`` (Comparison, Verdict), ``export`` (compare.xlsx and CSVs), ``core`` (``compare``).
"""

from .core import compare
from .export import CSV_NAMES, XLSX_NAME, check_out_dir, comparison_tables, export_comparison
from .gates import BucketRules, FairnessRules, Gate, Gates, WorkloadRules, load_gates
from .result import BUCKET_DIMS, METRICS, Comparison, MetricSpec, Verdict
from .stats import fairness_stats, judge, merge_ordered, simultaneous_ci
from .workload import ks_distance

__all__ = ["compare", "CSV_NAMES", "XLSX_NAME", "check_out_dir", "comparison_tables",
           "export_comparison", "BucketRules", "FairnessRules", "Gate", "Gates", "WorkloadRules",
           "load_gates", "BUCKET_DIMS", "METRICS", "Comparison", "MetricSpec", "Verdict",
           "fairness_stats", "judge", "merge_ordered", "simultaneous_ci", "ks_distance"]
