"""Pure statistics of a comparison: simultaneous intervals of differences, the gate rule,
bucket merging and fairness shares."""

from __future__ import annotations

import numpy as np

from .gates import Gate


def fair_shares(demand, entitled, served) -> np.ndarray:
    """Weighted max-min fair shares of ``served`` among tenants that asked for ``demand``.

    ``demand`` (…, T) and ``served`` (…,) in weighted tokens, ``entitled`` (T,) weights. By
    water-filling, tenant t's fair service is min(D_t, λ·e_t) with λ such that the fair services
    add up to what was served: a tenant asking for less than its entitlement is owed only what
    it asked for, and the rest goes to the others in proportion to their entitlements. When
    everything asked for was served (a system within capacity) the fair share is the demand
    share. Returns fair service / served."""
    D = np.asarray(demand, dtype=np.float64)
    e = np.asarray(entitled, dtype=np.float64)
    e = e / e.sum()
    C = np.broadcast_to(np.asarray(served, dtype=np.float64), D.shape[:-1])
    lead = D.shape[:-1]
    D2, C2 = D.reshape(-1, D.shape[-1]), C.reshape(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(e > 0, D2 / e, np.inf)  # λ at which tenant t is fully served
    order = np.argsort(ratio, axis=1)
    rs = np.take_along_axis(ratio, order, axis=1)
    Ds = np.take_along_axis(D2, order, axis=1)
    es = e[order]
    T = D2.shape[1]
    lam = np.full(D2.shape[0], np.inf)
    for k in range(T + 1):  # the k tenants with the smallest ratios are fully served
        sat = Ds[:, :k].sum(axis=1)
        rest = es[:, k:].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            cand = np.where(rest > 0, (C2 - sat) / rest, np.inf)
        lo = rs[:, k - 1] if k > 0 else np.full(D2.shape[0], -np.inf)
        hi = rs[:, k] if k < T else np.full(D2.shape[0], np.inf)
        ok = np.isinf(lam) & (cand >= lo) & (cand <= hi)
        lam = np.where(ok, cand, lam)
    fair = np.minimum(D2, lam[:, None] * e[None, :])
    with np.errstate(invalid="ignore", divide="ignore"):
        out = fair / C2[:, None]
    return out.reshape(lead + (T,))


def fairness_stats(service, entitled, demand=None) -> dict:
    """Shares of weighted-token service against fair shares.

    ``service`` (…, T) weighted tokens per tenant (leading axes = replicates), ``entitled``
    (T,) non-negative weights (normalised here). Without ``demand`` the fair share is the
    entitled share; with ``demand`` (…, T, weighted tokens asked for) it is the weighted
    max-min fair share of what was served (``fair_shares``), so a tenant that asked for less
    than its entitlement is not "under-served", and a system within capacity that served
    everyone what they asked for is fair whatever the tenant mix. Returns share, fair (the
    fair share), deviation = share − fair, max_abs_deviation and Jain's index of x_t =
    share_t / fair_t, J = (Σx)² / (T Σx²) over tenants with a positive fair share (1 = every
    tenant got exactly its fair share; 1/T = one tenant got everything)."""
    s = np.asarray(service, dtype=np.float64)
    e = np.asarray(entitled, dtype=np.float64)
    e = e / e.sum()
    total = s.sum(axis=-1, keepdims=True)
    if demand is None:
        fair = np.broadcast_to(e, s.shape)
    else:
        fair = fair_shares(demand, e, total[..., 0])
    with np.errstate(invalid="ignore", divide="ignore"):
        share = s / total
        dev = share - fair
        pos = fair > 0
        x = np.where(pos, share / np.where(pos, fair, 1.0), 0.0)
        jain = x.sum(axis=-1) ** 2 / (pos.sum(axis=-1) * (x * x).sum(axis=-1))
    return {"share": share, "entitled": np.broadcast_to(e, share.shape), "fair": fair,
            "deviation": dev, "max_abs_deviation": np.abs(dev).max(axis=-1), "jain": jain}


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
