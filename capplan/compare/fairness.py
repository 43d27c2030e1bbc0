"""Tenant fairness over the steady runs (the saturated ones when the baseline has none): each
tenant's share of weighted-token service against its fair share — the weighted max-min share
of what was served, given what each tenant asked for and its entitlement — Jain's index,
demand shares and the worst queueing age (docs/compare.md §6).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import contract as C
from ..errors import SpecError
from .deltas import Ctx, make_row
from .gates import FairnessRules
from .sides import Arrays, worst_ages
from .stats import fairness_stats


def entitlements(tenants: list[str], rules: FairnessRules, manifest: C.Manifest) -> np.ndarray:
    """Entitlement weights: the gates file's, else the baseline manifest's
    ``workload.entitlements``, else equal; a tenant without one when some are given is an
    error."""
    ent = dict(rules.entitlements) or dict((manifest.workload or {}).get("entitlements") or {})
    if not ent:
        return np.ones(len(tenants))
    missing = [t for t in tenants if t not in ent]
    if missing:
        raise SpecError(f"tenant(s) without an entitlement: {', '.join(missing)}",
                        field="fairness.entitlements",
                        fix="give every tenant a weight (or none, for equal shares)")
    return np.array([float(ent[t]) for t in tenants])


def service(a: Arrays, rules: FairnessRules) -> np.ndarray:
    """(units × cells) weighted tokens served: prefill of requests that got a first token,
    decode of the tokens received."""
    return rules.prefill_weight * a.sums["input_tokens_started"] \
        + rules.decode_weight * a.sums["output_tokens"]


def demand(a: Arrays, rules: FairnessRules) -> np.ndarray:
    """(units × cells) weighted tokens asked for: every prompt, and the answer lengths asked
    for (``max_output_tokens``; the tokens received where not recorded)."""
    return rules.prefill_weight * a.sums["input_tokens"] \
        + rules.decode_weight * a.sums["output_tokens_asked"]


def tenant_matrix(ctx: Ctx) -> tuple[list[str], np.ndarray]:
    """Tenants and the (cells × tenants) 0/1 matrix of which cell belongs to which."""
    tenants = sorted(ctx.cells["tenant"].unique())
    M = np.zeros((len(ctx.cells), len(tenants)))
    M[np.arange(len(ctx.cells)), [tenants.index(t) for t in ctx.cells["tenant"]]] = 1.0
    return tenants, M


def fairness_rows(ctx: Ctx) -> list[dict]:
    """fair_share_deviation (gated) and jain_index (info)."""
    tenants, M = tenant_matrix(ctx)
    runs, scope = ctx.detail()
    if len(tenants) < 2 or not runs:
        return []
    e = entitlements(tenants, ctx.g.fairness, ctx.b.study.manifest)
    stats = []
    for a, d in ((ctx.ab, ctx.db), (ctx.ac, ctx.dc)):
        S = service(a, ctx.g.fairness) @ M  # units × tenants
        Q = demand(a, ctx.g.fairness) @ M
        stats.append((fairness_stats(d.point(S, runs), e, d.point(Q, runs)),
                      fairness_stats(d.replicates(S, runs), e, d.replicates(Q, runs))))
    (pb, rb), (pc, rc) = stats
    return [make_row("fair_share_deviation", scope, float(pb["max_abs_deviation"]),
                     float(pc["max_abs_deviation"]), rb["max_abs_deviation"],
                     rc["max_abs_deviation"]),
            make_row("jain_index", scope, float(pb["jain"]), float(pc["jain"]), rb["jain"],
                     rc["jain"])]


def fairness_table(ctx: Ctx) -> pd.DataFrame:
    """Per tenant: entitled share; per side service, share, demand share, fair share,
    deviation = share − fair share, and the worst queueing age."""
    tenants, M = tenant_matrix(ctx)
    runs, _ = ctx.detail()
    if len(tenants) < 2 or not runs:
        return pd.DataFrame()
    e = entitlements(tenants, ctx.g.fairness, ctx.b.study.manifest)
    e = e / e.sum()
    out = pd.DataFrame({"tenant": tenants, "entitled_share": e})
    for name, a, d, side in (("baseline", ctx.ab, ctx.db, ctx.b),
                             ("candidate", ctx.ac, ctx.dc, ctx.c)):
        svc = d.point(service(a, ctx.g.fairness) @ M, runs)
        dem = d.point(demand(a, ctx.g.fairness) @ M, runs)
        st = fairness_stats(svc, e, dem)
        out[f"service_{name}"] = svc
        out[f"share_{name}"] = st["share"]
        out[f"demand_share_{name}"] = dem / dem.sum() if dem.sum() else np.nan
        out[f"fair_share_{name}"] = st["fair"]
        out[f"deviation_{name}"] = st["deviation"]
        ages = worst_ages(side, ctx.pairs)
        ages = ages[ages["pair"].isin(runs)].groupby("tenant")["age_ms"].max()
        out[f"worst_age_ms_{name}"] = [float(ages.get(t, np.nan)) for t in tenants]
    return out
