"""Admission and fair scheduling on the same load: goodput, per-tenant attainment and the
fairness numbers ``capplan compare`` computes, for each queue discipline / admission policy
against FIFO without admission (docs/scenarios.md, "Admission and fair scheduling").

Every policy runs the *same* requests (the configuration's seed and run streams: same arrivals,
tenants, prompts and answers), so the differences are the policies'. Per policy, over the
steady window (requests scheduled after ``warmup_s``):

- goodput = SLO-good requests / window length; attainment = good / offered; the shares
  rejected (admission or a full queue), timed out, deferred (admission);
- per tenant: offered, good, attainment, TTFT p99 of its completed requests;
- fairness (``capplan.compare.fairness_stats``): each tenant's share of the weighted-token
  service (``prefill_weight`` × prompt tokens of requests that got a first token +
  ``decode_weight`` × tokens received) against its weighted max-min fair share given what it
  asked for (every prompt and the answer lengths asked for) and its entitlement; Jain's index
  and the largest deviation.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from .. import spec as S
from ..compare import fairness_stats
from ..slo import SLO
from ..sim.config import SynthConfig
from .capacity import config_counts
from .parts import on_config, policy_scenario
from ..sim.evaluate import good_mask
from .table import Layout, ScenarioTable


def policies_figure(table):
    """Attainment per tenant, grouped by policy, against the SLO's target."""
    import plotly.graph_objects as go

    d = table.detail
    fig = go.Figure()
    for t in d["tenant"].unique():
        s = d[d["tenant"] == t]
        fig.add_trace(go.Bar(x=s["policy"], y=s["attainment"], name=str(t)))
    fig.add_hline(y=table.slo.attainment, line_dash="dot", annotation_text="target")
    fig.update_layout(barmode="group", title=f"Attainment per tenant at {table.rate_rps:g} req/s",
                      yaxis_title="attainment", template="plotly_white")
    return fig


#: how the policy comparison's table reads: one row per policy, one detail row per (policy, tenant)
POLICIES_LAYOUT = Layout(
    title="Policies at {rate_rps:g} req/s (SLO {slo})", key="policy",
    line=("{policy:>22}: goodput {goodput_rps:.3g} req/s, attainment {attainment:.3f}, rejected {rejected_share:.1%}, "
          "timed out {timeout_share:.1%}; Jain {jain_index:.3f}, largest deviation {fair_share_deviation:+.3f}",),
    headers=(("Policy", "policy"), ("Goodput (req/s)", "goodput_rps"), ("Attainment", "attainment"),
             ("Rejected", "rejected_share"), ("Timed out", "timeout_share"), ("Jain's index", "jain_index"),
             ("Largest fair-share deviation", "fair_share_deviation")),
    detail_line=(" " * 24 + "{tenant}: attainment {attainment:.3f} of {offered:,} offered; service share "
                 "{service_share:.3f} (fair {fair_share:.3f})",),
    detail_headers=(("Policy", "policy"), ("Tenant", "tenant"), ("Offered", "offered"), ("Good", "good"),
                    ("Attainment", "attainment"), ("TTFT p99 (ms)", "ttft_p99_ms"), ("Service share", "service_share"),
                    ("Fair share", "fair_share")),
    figure=policies_figure)


def compare_policies(cfg: SynthConfig, slo: SLO | str, *, rate: float, policies: dict,
                     duration_s: float = 600.0, warmup_s: float | None = None, run: int = 0,
                     entitlements: dict | None = None, prefill_weight: float = 1.0,
                     decode_weight: float = 2.0) -> ScenarioTable:
    """Run ``cfg`` at ``rate`` under each of ``policies`` ({name: scenario} — a mapping of
    ``scheduling`` / ``admission`` parts, ``{}`` for FIFO without admission, or a Scenario of
    them — applied to ``cfg`` without its policy) on the same requests (module docstring)."""
    s = SLO.parse(slo)
    warm = duration_s / 6 if warmup_s is None else warmup_s
    names = [t.name for t in cfg.tenants] or ["(all)"]
    ent = np.array([float((entitlements or {}).get(n, 1.0)) for n in names])
    rows, trows = [], []
    for pname, spec in policies.items():
        c = on_config(replace(cfg, policy=None), policy_scenario(pname, spec, S.join("policies", pname))).config
        n, good_n, o, res = config_counts(c, rate, s, duration_s=duration_s, warmup_s=warm, run=run, outcome=True)
        w = o.sched >= int(round(warm * 1e9))
        good = good_mask(o, s) & w
        span = (o.sched[w].max() - o.sched[w].min()) / 1e9 if w.sum() > 1 else math.nan
        ten = res.tenant
        started = o.first >= 0
        svc = np.zeros(len(names))
        dem = np.zeros(len(names))
        for j in range(len(names)):
            m = w & (ten == j)
            svc[j] = prefill_weight * res.input_tokens[m & started].sum() + decode_weight * o.out[m].sum()
            dem[j] = prefill_weight * res.input_tokens[m].sum() + decode_weight * res.target_output[m].sum()
            ok = m & (o.status == 0) & started
            ttft = (o.first[ok] - o.sched[ok]) / 1e6
            offered = int(m.sum())
            trows.append({"policy": pname, "tenant": names[j], "offered": offered, "good": int(good[m].sum()),
                          "attainment": good[m].sum() / offered if offered else math.nan,
                          "ttft_p99_ms": float(np.percentile(ttft, 99)) if ttft.size >= 100 else math.nan,
                          "service": float(svc[j]), "demand": float(dem[j])})
        fs = fairness_stats(svc, ent, dem) if len(names) > 1 else None
        for j in range(len(names)):
            trows[-len(names) + j]["service_share"] = float(fs["share"][j]) if fs else 1.0
            trows[-len(names) + j]["fair_share"] = float(fs["fair"][j]) if fs else 1.0
        st = o.status[w]
        nw = int(w.sum())
        stats = res.stats
        rows.append({"policy": pname, "offered": nw, "good": int(good.sum()),
                     "goodput_rps": good.sum() / span if span and span > 0 else math.nan,
                     "attainment": good.sum() / nw if nw else math.nan,
                     "rejected_share": float(np.mean(st == 1)) if nw else math.nan,
                     "timeout_share": float(np.mean(st == 2)) if nw else math.nan,
                     "deferred": int(stats.get("policy_deferred", 0)),
                     "jain_index": float(fs["jain"]) if fs else 1.0,
                     "fair_share_deviation": float(fs["deviation"][np.argmax(np.abs(fs["deviation"]))]) if fs else 0.0})
    notes = (f"same requests for every policy: {cfg.arrival.process} arrivals at {rate:g} req/s for {duration_s:g} s, "
             f"the first {warm:g} s left out",
             f"fairness: service = {prefill_weight:g} × prompt tokens served + {decode_weight:g} × tokens received, "
             "against the weighted max-min fair share of what each tenant asked for (capplan compare's numbers)")
    return ScenarioTable("policies", s, pd.DataFrame(rows), POLICIES_LAYOUT, detail=pd.DataFrame(trows),
                         rate_rps=float(rate), notes=notes)

