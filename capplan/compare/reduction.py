"""Per-(run sub-block, cell) sums and histograms of one side of a comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import bootstrap as B
from .. import sketch
from ..metrics import good_predicate
from ..slo import SLO
from ..study import Study
from .gates import FairnessRules
from .workload import _Side

_CELL_DIMS = ("in_b", "out_b", "q_in", "q_out", "tenant", "slo_class")
_CELL_SUMS = ("n", "good", "ok", "rejected", "errors", "svc", "demand")
NONE_LABEL = "(none)"
BYTES_PER_GIB = float(1 << 30)
#: cap on bootstrap units (sub-blocks) over all runs: reps × units float64 stays ~ tens of MB
MAX_UNITS_TOTAL = 4000
SUBBLOCKS_PER_BLOCK = 4


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
                       "FROM request_metrics WHERE in_window "
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
    from ..cost import study_facts

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
    parts = [B.block_counts(int(r.units), int(r.block_units), reps, rng, "circular")
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
