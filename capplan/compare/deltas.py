"""The comparison table, bucket table and fairness table from both sides' reduced arrays and
bootstrap count matrices; the verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import bootstrap as B
from .. import contract as C
from ..errors import SpecError
from ..slo import SLO
from .gates import FairnessRules, Gate, Gates
from .reduction import NONE_LABEL, _Arrays, _energy_per_good, _quantile, _telemetry
from .result import _Q_METRICS, METRICS, OTHER_LABEL, Verdict
from .stats import fairness_stats, judge, merge_ordered, simultaneous_ci
from .workload import _Side


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
        from ..envelope import fit_envelope
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
