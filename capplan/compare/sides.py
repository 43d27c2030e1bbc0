"""One side of a comparison and the project's one reduction of it.

Each study is reduced ONCE (``capplan.reduce.reduce_study``) over the common steady windows
(``metrics.Window``, passed explicitly), on a time grid both sides share
(``reduce.time_units_for``: unit i covers the same scheduled times on both sides), with the
comparison's cells (``reduce.Cells``: input bucket, output bucket, quadrant, tenant, SLO
class) summed in the same pass. The result serves every row: block lengths, run diagnostics,
per-(unit, cell) counts and histograms, and the envelope of the C_SLO row.

The output bucket is the answer length the client *asked for* (``max_output_tokens``) when
both studies record it for every request — a request that timed out stays in its long-answer
bucket — else the tokens received (said in the notes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..metrics import Window, request_view
from ..reduce import MAX_UNITS, NONE_LABEL, BlockStats, Cells, reduce_study, time_units_for
from ..slo import SLO
from ..study import Study
from .workload import Offered, RunPair, offered

#: the cell dimensions of a comparison, as ``reduce.Cells`` names them
CELL_DIMS = ("input_bucket", "output_bucket", "input_long", "output_long", "tenant", "slo_class")
#: per (unit, cell) sums read from the reduction; statuses one by one (they add up to n)
CELL_SUMS = ("n", "n_good", "n_ok", "st_rejected", "st_timeout", "st_error", "st_cancelled",
             "input_tokens", "input_tokens_started", "output_tokens", "output_tokens_asked")
#: cap on time units over all runs of a comparison (per-unit × cell sums stay small); a run
#: gets at most the reduction's own MAX_UNITS
MAX_UNITS_TOTAL = 4000
BYTES_PER_GIB = float(1 << 30)


@dataclass
class Side:
    """What one study contributes (built once per compare call)."""

    label: str
    study: Study
    runs: list[str]  # run ids in pair order
    window: Window  # the common steady windows
    offered: Offered
    gpus: int
    stats: BlockStats | None = None  # the reduction (``reduce_sides``)

    @property
    def has_itl(self) -> bool:
        return self.study.has("itl_ns")


def open_side(label: str, study: Study, pairs: list[RunPair]) -> Side:
    """The side's window (the pairs' common warm-ups) and its offered facts."""
    runs = [getattr(p, label) for p in pairs]
    window = Window.of(study, {getattr(p, label): p.warmup_s for p in pairs})
    gpus = int(study.manifest.gpus_per_replica) * int(study.manifest.replicas)
    return Side(label, study, runs, window, offered(study, pairs, label), gpus)


def reduce_sides(b: Side, c: Side, slo: SLO, cells: Cells) -> None:
    """Reduce both sides once, on one shared time grid, with ``cells``."""
    per_run = max(20, min(MAX_UNITS, MAX_UNITS_TOTAL // max(len(b.runs), 1)))
    tb, tc = time_units_for([(b.study, b.window, b.runs), (c.study, c.window, c.runs)],
                            max_units=per_run)
    for side, units in ((b, tb), (c, tc)):
        side.stats = reduce_study(side.study, slo, warmup=side.window, units=units, cells=cells)


def largest_and_median(side: Side, column: str) -> tuple[int, float]:
    """(largest, median) of a token column over the side's windows (requests with a value):
    the bucket edges and the quadrant split."""
    view = request_view(side.study, side.window)
    top, med = side.study.sql(
        f"SELECT max({column}), quantile_disc({column}, 0.5) FROM {view} "
        f"WHERE in_window AND {column} IS NOT NULL").fetchall()[0]
    return int(top or 1), float(med or 0.0)


# ============================================================================ arrays


def cell_union(b: Side, c: Side) -> pd.DataFrame:
    """The cells seen on either side (one row each, ``CELL_DIMS`` columns present)."""
    dims = [d for d in CELL_DIMS if d in b.stats.cell_index.columns]
    both = pd.concat([b.stats.cell_index[dims], c.stats.cell_index[dims]])
    return both.drop_duplicates().sort_values(dims).reset_index(drop=True)


@dataclass(frozen=True)
class Arrays:
    """One side on the common cell space: dense (units × cells) sums over all pairs' units
    (pair p's units are ``offsets[p]:offsets[p+1]``, the same on both sides) and per-request
    log-bucket histogram rows (global unit, cell, key, count) of TTFT, TPOT and the per-request
    ITL statistic (ok requests)."""

    sums: dict  # name -> (units × cells)
    hist: dict  # metric -> (unit, cell, key, count)


def arrays(side: Side, union: pd.DataFrame, pairs: list[RunPair]) -> tuple[Arrays, np.ndarray]:
    """The side's reduced cells on the union cell index; also the unit offsets per pair."""
    st = side.stats
    dims = list(union.columns)
    col = pd.MultiIndex.from_frame(union[dims]).get_indexer(
        pd.MultiIndex.from_frame(st.cell_index[dims]))  # side cell → union cell
    runs = [st.run(getattr(p, side.label)) for p in pairs]
    offsets = np.concatenate([[0], np.cumsum([r.n_units for r in runs])]).astype(np.int64)
    K = len(union)
    sums = {}
    for name in CELL_SUMS:
        M = np.zeros((int(offsets[-1]), K))
        for p, r in enumerate(runs):
            M[offsets[p]:offsets[p + 1], col] = r.cells.sums[name]
        sums[name] = M
    hist = {}
    for m in st.cells.hist:
        parts = [(r.cells.hist[m][0] + offsets[p], col[r.cells.hist[m][1]], r.cells.hist[m][2],
                  r.cells.hist[m][3].astype(np.float64)) for p, r in enumerate(runs)]
        hist[m] = tuple(np.concatenate([x[i] for x in parts]) for i in range(4))
    return Arrays(sums=sums, hist=hist), offsets


# ============================================================================ descriptive


def worst_ages(side: Side, pairs: list[RunPair]) -> pd.DataFrame:
    """Per (pair, tenant): the worst queueing age in the window, ms — max(TTFT, queue_ms) of
    a request with a first token; a request still waiting at the end (timeout, cancelled, or ok
    without a first token) is censored at the run's last event. A maximum, not resampled."""
    view = request_view(side.study, side.window)
    ends = pd.DataFrame({"run_id": side.runs, "pair": [p.index for p in pairs],
                         "end_ns": side.offered.facts["end_ns"].to_numpy()})
    side.study.con.register("_cmp_ends", ends)
    try:
        return side.study.sql(f"""
            SELECT e.pair, coalesce(m.tenant, ?) AS tenant,
                   max(CASE WHEN m.first_token_ns IS NOT NULL
                                THEN greatest(m.ttft_ms, m.queue_ms)
                            WHEN m.status IN ('timeout', 'cancelled', 'ok')
                                THEN (e.end_ns - m.scheduled_ns) / 1e6 END) AS age_ms
            FROM {view} m JOIN _cmp_ends e USING (run_id)
            WHERE m.in_window GROUP BY ALL""", [NONE_LABEL]).df()
    finally:
        side.study.con.unregister("_cmp_ends")


def telemetry(study: Study) -> dict:
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


def energy_per_good(side: Side, slo: SLO, levels: set[float]) -> tuple[float, str]:
    """Joules per SLO-meeting request over the runs at ``levels`` (offered rates), from
    ``capplan.cost.study_facts`` on the common windows (its notes say which samples and
    requests were used); NaN when the study has no power samples."""
    from ..cost import study_facts

    if not side.study.resource_files:
        return float("nan"), "no resources/ power samples"
    facts = study_facts(side.study, slo, warmup_s=side.window.as_dict())
    use = [lv for lv in facts.levels if any(math.isclose(lv.offered_rps, x, rel_tol=1e-9)
                                            for x in levels)]
    e = sum(lv.energy_j for lv in use if lv.energy_j is not None)
    g = sum(lv.good_requests_powered for lv in use if lv.good_requests_powered)
    if not g:
        return float("nan"), "; ".join(facts.notes) or "no powered good requests"
    return e / g, "; ".join(facts.notes)


def comparison_cells(in_edges, out_edges, out_col: str, split: tuple[float, float],
              has_itl: bool) -> Cells:
    """The comparison's cells: both length buckets, the quadrant, tenant and SLO class, with
    per-(unit, cell) histograms of TTFT, TPOT and (when recorded) the per-request ITL."""
    return Cells(input_edges=tuple(in_edges), output_edges=tuple(out_edges),
                 quadrant_split=tuple(split), tenant=True, slo_class=True,
                 hist=("ttft", "tpot", "itl") if has_itl else ("ttft", "tpot"),
                 input_column="input_tokens", output_column=out_col)

