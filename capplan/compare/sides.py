"""One side of a comparison: the project's reduction of the study over the common steady
windows (``capplan.reduce.reduce_study``: block lengths, diagnostics, the C_SLO fit), and its
per-(sub-block, cell) sums and histograms on the time grid both sides share.

A cell is (input bucket, output bucket, quadrant, tenant, SLO class). The output bucket is the
answer length the client *asked for* (``max_output_tokens``) when both studies record it for
every request — a request that timed out stays in its long-answer bucket — else the tokens
received (said in the notes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import sketch
from ..metrics import create_request_view, good_predicate
from ..reduce import BlockStats, reduce_study
from ..slo import SLO
from ..study import Study
from .gates import FairnessRules
from .workload import Offered, RunPair, offered

CELL_DIMS = ("in_b", "out_b", "q_in", "q_out", "tenant", "slo_class")
#: per (sub-block, cell) sums; statuses one by one (they add up to n)
CELL_SUMS = ("n", "good", "ok", "rejected", "timeout", "error", "cancelled", "svc", "demand")
NONE_LABEL = "(none)"
#: the latency series whose percentiles compare gates: their dependence sets the block length
#: too, whatever the SLO limits (TPOT depends on the batch, which changes slowly)
BLOCK_METRICS = ("ttft", "tpot", "itl")
BYTES_PER_GIB = float(1 << 30)


@dataclass
class Side:
    """What one study contributes (built once per compare call)."""

    label: str
    study: Study
    runs: list[str]  # run ids in pair order
    warm: dict[str, float]  # the common steady windows, by this side's run id
    offered: Offered
    stats: BlockStats  # the project's reduction over the same windows
    gpus: int
    has_itl: bool
    cells: pd.DataFrame | None = None
    hists: dict = field(default_factory=dict)


def open_side(label: str, study: Study, pairs: list[RunPair], slo: SLO) -> Side:
    """Offered facts and the project's reduction of one side, with the steady windows of
    ``pairs`` passed explicitly (the C_SLO fit uses these statistics, so every row of the
    comparison sees the same window)."""
    runs = [getattr(p, label) for p in pairs]
    warm = {getattr(p, label): p.warmup_s for p in pairs}
    off = offered(study, pairs, label)
    stats = reduce_study(study, slo, warmup=warm, block_metrics=BLOCK_METRICS)
    gpus = int(study.manifest.gpus_per_replica) * int(study.manifest.replicas)
    return Side(label, study, runs, warm, off, stats, gpus, study.has("itl_ns"))


def _edge_sql(column: str, edges: tuple[int, ...]) -> str:
    """Bucket index = number of edges ≤ value; the structure comes from code, values are bound."""
    return "(" + " + ".join(f"CAST({column} >= ? AS INTEGER)" for _ in edges) + ")"


def reduce_cells(side: Side, slo: SLO, grid: pd.DataFrame, in_edges, out_edges, out_col: str,
                 split_in: float, split_out: float, fair: FairnessRules) -> None:
    """Per (run sub-block, cell) sums and per-cell/sub-block log-bucket histograms, one SQL
    pass each, on the shared time grid. ``out_col``: the output-length column of the cells
    (``max_output_tokens`` or ``output_tokens``). Service (fairness) = weighted prefill tokens
    of requests that got a first token + weighted tokens received; demand = weighted prompt +
    requested answer tokens (tokens received where not recorded). Queueing age: max(TTFT,
    queue_ms) of a request with a first token; a request still waiting at the end (timeout,
    cancelled, or ok without a first token) is censored at the run's last event; rejected and
    errored requests count in their rates instead."""
    con = side.study.con
    create_request_view(side.study, side.warm)
    m = grid.assign(run_id=side.runs, end_ns=side.offered.facts["end_ns"].to_numpy())
    con.register("_cmp_grid", m[["run_id", "pair", "origin_ns", "sub_ns", "end_ns"]])
    pred, gparams = good_predicate(slo, "q")
    ttft_col = "q.ttft_ms" if slo.ttft_from == "scheduled" else "q.ttft_sent_ms"
    out_sql = f"q.{out_col}"
    r_sql = f"""
        SELECT g.pair,
               CAST(floor((q.scheduled_ns - g.origin_ns) / g.sub_ns) AS BIGINT) AS unit,
               {_edge_sql('q.input_tokens', in_edges)} AS in_b,
               {_edge_sql(out_sql, out_edges)} AS out_b,
               q.input_tokens > ? AS q_in, {out_sql} > ? AS q_out,
               coalesce(q.tenant, ?) AS tenant, coalesce(q.slo_class, ?) AS slo_class,
               {pred} AS good, q.status, {ttft_col} AS ttft, q.tpot_ms AS tpot, q.itl_ns,
               q.input_tokens, q.output_tokens,
               coalesce(q.max_output_tokens, q.output_tokens) AS asked_tokens, q.first_token_ns,
               CASE WHEN q.first_token_ns IS NOT NULL
                        THEN greatest({ttft_col}, q.queue_ms)
                    WHEN q.status IN ('timeout', 'cancelled', 'ok')
                        THEN (g.end_ns - q.scheduled_ns) / 1e6 END AS age_ms
        FROM request_metrics q JOIN _cmp_grid g USING (run_id)
        WHERE q.in_window"""
    r_params = [*in_edges, *out_edges, float(split_in), float(split_out), NONE_LABEL, NONE_LABEL,
                *gparams]
    dims = "pair, unit, in_b, out_b, q_in, q_out, tenant, slo_class"
    try:
        side.cells = con.execute(f"""
            WITH r AS ({r_sql})
            SELECT {dims}, count(*) AS n, count_if(good) AS good, count_if(status = 'ok') AS ok,
                   count_if(status = 'rejected') AS rejected,
                   count_if(status = 'timeout') AS timeout,
                   count_if(status = 'error') AS error,
                   count_if(status = 'cancelled') AS cancelled,
                   sum(CASE WHEN first_token_ns IS NOT NULL THEN ? * input_tokens ELSE 0 END
                       + ? * output_tokens) AS svc,
                   sum(? * input_tokens + ? * asked_tokens) AS demand,
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


@dataclass(frozen=True)
class Arrays:
    """One side on the common cell space: dense (units × cells) sums over all pairs' sub-blocks
    (pair p's units are ``offsets[p]:offsets[p+1]``) and histogram rows with global units."""

    sums: dict  # name -> (units × cells)
    ttft: tuple  # (unit, cell, key, count) arrays
    tpot: tuple  # (unit, key, count)
    itl: tuple | None
    max_age: np.ndarray  # (pairs × cells): the worst queueing age per run and cell


def arrays(side: Side, cell_index: pd.DataFrame, offsets: np.ndarray) -> Arrays:
    n_units = int(offsets[-1])
    key = pd.MultiIndex.from_frame(cell_index[list(CELL_DIMS)])

    def unit_of(df):
        p = df["pair"].to_numpy(dtype=np.int64)
        return np.clip(offsets[p] + df["unit"].to_numpy(dtype=np.int64), offsets[p],
                       offsets[p + 1] - 1)

    def cell_of(df):
        return key.get_indexer(pd.MultiIndex.from_frame(df[list(CELL_DIMS)]))

    cells = side.cells
    u, ci = unit_of(cells), cell_of(cells)
    sums = {}
    for name in CELL_SUMS:
        M = np.zeros((n_units, len(cell_index)))
        np.add.at(M, (u, ci), cells[name].to_numpy(dtype=np.float64))
        sums[name] = M
    age = np.full((offsets.size - 1, len(cell_index)), np.nan)
    a = cells["max_age_ms"].to_numpy(dtype=np.float64)
    pair = cells["pair"].to_numpy(dtype=np.int64)
    ok = np.isfinite(a)
    if ok.any():
        age_s = pd.Series(a[ok]).groupby([pair[ok], ci[ok]]).max()
        age[age_s.index.get_level_values(0), age_s.index.get_level_values(1)] = age_s.to_numpy()
    h = side.hists["ttft"]
    ttft = (unit_of(h), cell_of(h), h["k"].to_numpy(np.int64), h["c"].to_numpy(np.float64))
    h = side.hists["tpot"]
    tpot = (unit_of(h), h["k"].to_numpy(np.int64), h["c"].to_numpy(np.float64))
    itl = None
    if "itl" in side.hists:
        h = side.hists["itl"]
        itl = (unit_of(h), h["k"].to_numpy(np.int64), h["c"].to_numpy(np.float64))
    return Arrays(sums=sums, ttft=ttft, tpot=tpot, itl=itl, max_age=age)


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
    ``capplan.cost.study_facts`` on the common steady windows (its notes say which samples
    and requests were used); NaN when the study has no power samples."""
    from ..cost import study_facts

    if not side.study.resource_files:
        return float("nan"), "no resources/ power samples"
    facts = study_facts(side.study, slo, warmup_s=side.warm)
    use = [lv for lv in facts.levels if any(math.isclose(lv.offered_rps, x, rel_tol=1e-9)
                                            for x in levels)]
    e = sum(lv.energy_j for lv in use if lv.energy_j is not None)
    g = sum(lv.good_requests_powered for lv in use if lv.good_requests_powered)
    if not g:
        return float("nan"), "; ".join(facts.notes) or "no powered good requests"
    return e / g, "; ".join(facts.notes)


def length_summary(side: Side, column: str) -> tuple[int, float]:
    """(largest, median) of a token column over the side's steady windows (requests with a
    value): the bucket edges and the quadrant split."""
    con = side.study.con
    con.register("_cmp_win", pd.DataFrame({"run_id": list(side.warm),
                                           "warmup_ns": [int(round(w * 1e9)) for w in
                                                         side.warm.values()]}))
    try:
        top, med = con.execute(f"""
            SELECT max(e.{column}), quantile_disc(e.{column}, 0.5)
            FROM events e JOIN _cmp_win w USING (run_id)
            WHERE e.scheduled_ns >= w.warmup_ns AND e.{column} IS NOT NULL""").fetchall()[0]
    finally:
        con.unregister("_cmp_win")
    return int(top or 1), float(med or 0.0)
