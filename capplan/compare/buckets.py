"""Bucket regressions, per run family: attainment, failure rate and (steady runs) the TTFT tail
percentile by input length, output length (asked for, where recorded), their quadrant, tenant
and SLO class, with one simultaneous interval family and a regression flag per bucket
(docs/compare.md §5)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .. import contract as C
from ..reduce import NONE_LABEL
from .deltas import FAMILIES, STEADY, Ctx
from .gates import Gate
from .result import OTHER_LABEL
from .sampling import quantile
from .stats import judge, merge_ordered, simultaneous_ci


def edges_for(rules_edges, max_tokens: int) -> tuple[int, ...]:
    """The bucket edges: the gates file's, else powers of two up to the largest length."""
    if rules_edges is not None:
        return tuple(rules_edges)
    top = max(1, int(math.ceil(math.log2(max(max_tokens, 2)))) + 1)
    return tuple(1 << k for k in range(1, top + 1))


def range_label(edges: tuple[int, ...], group: list[int]) -> str:
    lo_i, hi_i = min(group), max(group)
    lo = 0 if lo_i == 0 else edges[lo_i - 1]
    return f"[{lo:,}, {edges[hi_i]:,})" if hi_i < len(edges) else f"[{lo:,}, ∞)"


def median(hists: list[pd.DataFrame]) -> float:
    """Median of (v, c) histograms added together (0 when empty)."""
    h = pd.concat(hists).groupby("v")["c"].sum().sort_index()
    if h.empty:
        return 0.0
    cum = h.cumsum() / h.sum()
    return float(h.index[np.searchsorted(cum.to_numpy(), 0.5)])


def _definitions(ctx: Ctx, nb_cell, nc_cell) -> list[tuple[str, str, np.ndarray]]:
    """(dimension, label, cell mask) of every bucket, sparse ones merged (ordered dimensions)
    or pooled into "(other)" (tenants, classes)."""
    rules = ctx.g.buckets
    cells = ctx.cells
    defs: list[tuple[str, str, np.ndarray]] = []

    def ordered(dim_col: str, edges: tuple, name: str):
        nbins = len(edges) + 1
        idx = cells[dim_col].to_numpy()
        cb = np.bincount(idx, weights=nb_cell, minlength=nbins)
        cc = np.bincount(idx, weights=nc_cell, minlength=nbins)
        for grp in merge_ordered(cb, cc, rules.min_requests):
            defs.append((name, range_label(edges, grp), np.isin(idx, grp)))

    ordered("input_bucket", ctx.in_edges, "input_tokens")
    ordered("output_bucket", ctx.out_edges, ctx.out_col)
    si, so = ctx.split
    for qi in (False, True):
        for qo in (False, True):
            lab = f"in {'>' if qi else '≤'} {si:,.0f}, out {'>' if qo else '≤'} {so:,.0f}"
            defs.append(("quadrant", lab, (cells["input_long"].to_numpy() == qi)
                         & (cells["output_long"].to_numpy() == qo)))
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
    return defs


def _family_rows(ctx: Ctx, name: str, runs: list[int]) -> tuple[list[dict], list]:
    """Bucket rows of one run family: attainment, failure rate and (steady runs) the TTFT
    tail percentile per bucket, with their replicate differences."""
    scope = FAMILIES[name]
    rules = ctx.g.buckets
    nb_cell = ctx.db.point(ctx.ab.sums["n"], runs)
    nc_cell = ctx.dc.point(ctx.ac.sums["n"], runs)
    defs = _definitions(ctx, nb_cell, nc_cell)
    if not defs:
        return [], []
    M = np.column_stack([d[2] for d in defs]).astype(np.float64)  # cells × buckets
    p = ctx.g.percentile
    sums = {}
    for side, a, d in (("b", ctx.ab, ctx.db), ("c", ctx.ac, ctx.dc)):
        N = a.sums["n"] @ M
        G = a.sums["n_good"] @ M
        F = (a.sums["st_timeout"] + a.sums["st_error"] + a.sums["st_cancelled"]) @ M
        n_rep = d.replicates(N, runs)
        with np.errstate(invalid="ignore", divide="ignore"):  # per-bucket denominators
            sums[side] = {"n": d.point(N, runs), "good": d.point(G, runs),
                          "fail": d.point(F, runs), "good_rep": d.replicates(G, runs) / n_rep,
                          "fail_rep": d.replicates(F, runs) / n_rep}
    qname = C.pct_col("ttft", p)
    rows, reps_cols = [], []
    for j, (dim, lab, mask) in enumerate(defs):
        n_b, n_c = int(sums["b"]["n"][j]), int(sums["c"]["n"][j])
        common = {"scope": scope, "dimension": dim, "bucket": lab, "n_baseline": n_b,
                  "n_candidate": n_c, "enough": min(n_b, n_c) >= rules.min_requests}
        for metric, key, better in (("attainment", "good", "higher"),
                                    ("error_rate", "fail", "lower")):
            vb = sums["b"][key][j] / n_b if n_b else float("nan")
            vc = sums["c"][key][j] / n_c if n_c else float("nan")
            rows.append({**common, "metric": metric, "baseline": vb, "candidate": vc,
                         "better": better})
            reps_cols.append(sums["c"][f"{key}_rep"][:, j] - sums["b"][f"{key}_rep"][:, j])
        if name != "steady":  # a tail latency of a saturated run depends on its length
            continue
        qs = []
        for a, d in ((ctx.ab, ctx.db), (ctx.ac, ctx.dc)):
            u, ci, k, cnt = a.hist["ttft"]
            sel = mask[ci] if ci.size else np.zeros(0, bool)
            qs.append(quantile(d, runs, u[sel], k[sel], cnt[sel], p, ctx.n_units))
        (qb, rqb), (qc, rqc) = qs
        rows.append({**common, "metric": qname, "baseline": qb, "candidate": qc,
                     "better": "lower"})
        reps_cols.append(rqc - rqb)
    return rows, reps_cols


def bucket_table(ctx: Ctx) -> pd.DataFrame:
    """Attainment, failure rate and TTFT p-quantile per bucket and run family, simultaneous
    CIs over all sufficiently sampled buckets (one family of intervals), regression flags."""
    rows, reps_cols = [], []
    for name in ("steady", "saturated"):
        runs = ctx.family(name)
        if runs:
            r, c = _family_rows(ctx, name, runs)
            rows += r
            reps_cols += c
    if not rows:
        return pd.DataFrame()
    rules = ctx.g.buckets
    df = pd.DataFrame(rows)
    df["delta"] = df["candidate"] - df["baseline"]
    df["delta_pct"] = 100.0 * df["delta"] / df["baseline"].abs().replace(0, np.nan)
    gated = (df["scope"] == STEADY) | ctx.g.runs.gate_saturated
    fam = [i for i in range(len(rows))
           if rows[i]["enough"] and gated.iat[i] and np.isfinite(df["delta"].iat[i])]
    lo = np.full(len(rows), np.nan)
    hi = np.full(len(rows), np.nan)
    if fam:
        l_, h_ = simultaneous_ci(np.column_stack([reps_cols[i] for i in fam]),
                                 df["delta"].to_numpy()[fam], ctx.conf_family)
        lo[fam], hi[fam] = l_, h_
    df["ci_low"], df["ci_high"] = lo, hi
    gates = {"attainment": Gate("bucket_attainment",
                                max_regression_abs=rules.attainment_max_drop_abs),
             "error_rate": Gate("bucket_error_rate",
                                max_regression_abs=rules.error_rate_max_rise_abs)}
    changes, flags = [], []
    for i, r in df.iterrows():
        if not r["enough"]:
            changes.append(f"insufficient (n < {rules.min_requests} in a study)")
            flags.append("")
            continue
        gate = gates.get(r["metric"], Gate("bucket_p99",
                                           max_regression_pct=rules.p99_max_regression_pct))
        change, verdict = judge(r["better"], r["baseline"], r["candidate"], r["ci_low"],
                                r["ci_high"], gate if gated.iat[i] else None)
        changes.append(change)
        flags.append("REGRESSED" if verdict == "FAIL" else "")
    df["change"], df["flag"] = changes, flags
    return df.drop(columns=["enough"])
