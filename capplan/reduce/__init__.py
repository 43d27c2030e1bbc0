"""The reduction: raw request rows → per-(run, unit[, cell]) sufficient statistics. The ONLY
step that touches raw rows for every consumer (envelope, compare, and the coming timeline and
mix reweighting); everything after it works on small numpy arrays.

Design
------
*Window.* Every reduction states its steady window (``capplan.metrics.Window``: warm-up
seconds per run). ``reduce_study(warmup=...)`` takes a ``Window`` as given, or resolves one
from "manifest" / "mser" / "none" / seconds / {run_id: seconds} (MSER-5 where asked or where
the manifest has no warm-up); the result keeps it (``BlockStats.window``), so a consumer that
needs more numbers over the same requests reads them from the same statistics or passes the
same window on.

*One ordered query.* One DuckDB query scans the events, computes the per-request metrics
(``capplan.metrics``), the SLO-good flag, the status code, every log-bucket key (each
logarithm taken once, here), the SLO grid codes and, when asked, the cell code, sorts the
window's requests in scheduled order and hands them over as compact numpy columns (~25 bytes
per request). Everything after it is counting: ``np.bincount`` over those columns, per run on
two threads (numpy and scipy's FFT release the GIL). That is cheaper than materialising the
sorted rows and grouping them again in SQL — on 12 M requests a hash aggregate over
run × unit × grid code (~1 M groups) cost more CPU than the sort — and the block length needs
the per-request columns anyway. Ties in ``scheduled_ns`` are found from the ordered times, so
no string column is read on the common path (on a 12 M-request sweep with random string ids,
reading and hashing ``request_id`` was a third of the reduction); only when some run has ties
is the query run again with a hash of ``request_id`` as tie-break, which also finds events
recorded twice. Counts over units (contiguous runs of the ordered requests) are segment sums
(``np.add.reduceat``) where they are integers; float sums stay ``np.bincount``.

*Run by run.* Where every row group of the event files holds one run (one file per run, as
harnesses write them; checked from the parquet footers) and the runs are long enough to pay
for a query each (``engine.BY_RUN_ROWS_PER_FILE``), the same columns are read once per run,
filtered on run_id and without ORDER BY, on two threads, and each run is counted as soon as
it arrives: DuckDB's scan of one run overlaps the counting of another, and no sort needs the
whole study's memory. A run is sorted by scheduled time in numpy, and only when the file is
not already in that order; while no two requests share a time, that is the one order SQL's
sort gives, and a run with ties is read again sorted by the tie rule in SQL. Otherwise the
one ordered query above reads every run.

*Units* (the lattice sub-blocks of the block bootstrap), chosen by a small frozen object:
- ``CountUnits(max_units)`` (the envelope's default): ``U = min(max_units, n)`` units of
  ⌊n/U⌋ or ⌈n/U⌉ consecutive requests (a request per unit for runs up to ``max_units``);
- ``TimeUnits(width_s, origin_s, n_units)``: unit = ⌊(scheduled_ns − origin) / width⌋, the
  origin being the run's window start unless given. Two studies reduced with the same widths
  and aligned windows share the grid (unit i covers the same scheduled times on both sides):
  what a paired comparison needs; ``time_units_for`` builds such a grid for matched runs.
A bootstrap block is ``L = b·U/n`` consecutive units (``bootstrap.Circular.block_units``).

*Block length* — one rule for every consumer (``block_length``): b is the largest
Politis–White length over the run's 0/1 SLO-good series, the log of its TTFT and of its TPOT,
and the log of any other latency the SLO limits (ITL statistic, E2E), each in scheduled order,
a missing latency (failed request) read as the run's largest (a failure is a violation). Why
the union (docs/statistics.md#block-length): one resample serves every statistic read from the
run — attainment, error rate, the TTFT and TPOT percentile intervals, compare's per-cell
deltas — so the block must be long enough for the most dependent of those series. A block too
short under-covers; one too long only makes the variance estimate a little noisier. The 0/1
series alone is far too short when violations are rare and come in bursts (its
autocorrelations are mostly noise: 2.8 requests against 41 on log TTFT in a synthetic model),
and picking one "primary" latency by its violations flips between TTFT and TPOT across a sweep
and ignores a strongly dependent TPOT at light load (on the demo study PW on log TPOT is 19–123
requests where log TTFT gives 1–39).

*Per unit* (integer counts, so they add exactly and in any order):
- requests, ok, SLO-good (exact SQL predicate of the reduction SLO), one count per status,
  first/last scheduled time, TTFT sum and count (trend), Little's-law sums;
- ``grid``: a cumulative count ``G[u, i, j]`` of requests that are good under the SLO whose
  TTFT limit is ``x_i`` and whose TPOT (or ITL) limit is ``y_j`` (i, j = 0…2h, the last index
  "no limit"). An axis the SLO limits is anchored on the limit, ``x_i = limit·step^(i−h)``, so
  at (h, h) the grid count equals the exact count; an axis it does not limit is anchored on the
  pooled 90th-percentile bucket and its candidate limits are bucket edges, where counting keys
  is exact too. Other limits of the SLO (E2E, the third latency metric) are fixed conditions. A
  changed TTFT/TPOT/ITL limit or target re-fits from these counts without reading events
  (limits snap to the nearest grid value, stated in the result); the SLO surface reads the
  whole grid.
- ``tail``: log-bucket histograms (``capplan.sketch``) of TTFT, TPOT, ITL statistic and E2E
  per unit above each run's ``tail_from`` quantile, plus a per-unit count below — enough to
  bootstrap p99/p99.9 at a fraction of the memory.
Per run: full log-bucket histograms of the same metrics and of generator lag.

*Cells* (optional, ``Cells``): input-length bucket, output-length bucket, length quadrant,
tenant, SLO class, prefix-cache hit / miss / unknown (from ``computed_input_tokens``). The cell code is one more column of the same query and is counted with
the units in the same pass, so per-(run, unit, cell) counts, good counts, status counts,
token sums and log-bucket histograms come out together (``RunStats.cells``); summed over
cells they are the per-unit arrays. Without cells nothing per cell is built.

*Occupancy by time* (``reduce.occupancy``): requests present in a part of their life (by
default waiting) per time unit, spread over the units their interval covers — the queue-length
series of timelines — and ``activity``: when each value of a column (a replica group) first
and last served.

Every query binds its values; identifiers come from the fixed tables of ``reduce.sql``. The
SQL is plain (CASE, ORDER BY), so another engine can produce the same columns.

Modules: ``units`` (CountUnits, TimeUnits, Cells, time_units_for), ``stats`` (BlockStats,
RunStats, CellStats, GridSpec, the block-length rule), ``sql`` (the SQL fragments, one text
for DuckDB and Spark through ``capplan.dialect``), ``sums`` (the per-unit, per-fine-unit and
per-cell sums), ``plan`` (window and query plan), ``count`` (numpy counting of fetched
columns), ``assemble`` (per-run results into ``BlockStats``), ``engine`` (reduce_study and
the DuckDB engine), ``spark`` (the Spark engine; docs/scale.md).
"""

from .engine import ENGINES, GRID_HALF, GRID_STEP, reduce_study
from .occupancy import ACTIVITY_COLUMNS, Occupancy, RunOccupancy, activity, occupancy
from .plan import resolve_window
from .stats import (FINE_UNITS, TAIL_FROM, BlockStats, CellStats, GridSpec, RunStats,
                    block_length, block_length_fine, max_length, stats_from_series)
from .units import (CACHE_LABELS, MAX_UNITS, METRICS, NONE_LABEL, Cells, CountUnits, TimeUnits,
                    bucket_labels, time_units_for)

__all__ = [
    "ACTIVITY_COLUMNS", "Occupancy", "RunOccupancy", "activity", "occupancy",
    "BlockStats", "CACHE_LABELS", "CellStats", "Cells", "CountUnits", "ENGINES", "FINE_UNITS", "GRID_HALF",
    "GRID_STEP", "GridSpec", "MAX_UNITS", "METRICS", "NONE_LABEL", "RunStats", "TAIL_FROM", "TimeUnits",
    "block_length", "block_length_fine", "bucket_labels", "max_length", "reduce_study", "resolve_window",
    "stats_from_series", "time_units_for",
]
