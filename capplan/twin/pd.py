"""The prefill:decode ratio sweep: for each split of a GPU budget into a prefill and a decode
pool (``capplan.sim.disagg``), the steady-state C_SLO of the disaggregated system, per GPU and
per dollar, with the pool that binds — beside the colocated system on the same GPUs
(docs/scenarios.md, "Disaggregated prefill and decode").

C_SLO comes from ``capplan.twin.capacity.config_cslo`` (pooled long runs, bisection, a 95 %
Monte-Carlo interval). The **binding pool** is read from one run just above C_SLO (5 % more
load): the pool where work piles up — the larger backlog (the longest queue on one of its
replicas × its replicas) — binds; when neither pool queues (a backlog of at most 1 % of the
run's requests: the limit is latency, not throughput), the violations decide: a request that missed its first-token limit (or got
no first token) failed in the prefill pool, one whose first token was on time but that missed
TPOT / ITL / E2E or timed out failed in the decode pool (or the transfer).

Cost per 1 000 good requests = GPU-hours per hour × price / (C_SLO × 3,600 × the SLO's target
attainment) × 1,000 (the plan's definition at full utilisation of C_SLO).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from ..errors import SpecError
from ..present import MISSING
from ..slo import SLO
from ..sim.config import SynthConfig
from ..sim.disagg import DisaggSpec, KVTransfer, Pool
from .capacity import REL_TOL, capacity_guess, config_counts, config_cslo
from .parts import DisaggregationPart, on_config
from ..sim.evaluate import good_mask
from .scenario import Scenario
from .table import Layout, ScenarioTable, When

ABOVE = 1.05  # load factor above C_SLO at which the binding pool is read


def binding_pool(cfg: SynthConfig, rate: float, slo: SLO, *, duration_s: float, warmup_s: float) -> tuple[str, dict]:
    """('prefill' | 'decode', backlogs and violations by pool) of one run at ``rate``."""
    n, good, o, res = config_counts(cfg, rate, slo, duration_s=duration_s, warmup_s=warmup_s, run=0, outcome=True)
    st = res.stats
    w = o.sched >= int(warmup_s * 1e9)
    bad = w & ~good_mask(o, slo)
    no_first = o.first < 0
    late = np.zeros_like(no_first)
    if slo.ttft_ms is not None:
        late = ~no_first & ((o.first - o.sched) > slo.ttft_ms * 1e6)
    pre = int(np.sum(bad & (no_first | late)))
    dec = int(np.sum(bad)) - pre
    d = cfg.disagg
    q_pre = st.get("max_queue_prefill", 0) * d.prefill.replicas
    q_dec = st.get("max_queue_decode", 0) * d.decode.replicas
    counts = {"prefill": pre, "decode": dec, "backlog_prefill": q_pre, "backlog_decode": q_dec}
    if max(q_pre, q_dec) > max(5, 0.01 * n):
        return ("prefill" if q_pre >= q_dec else "decode"), counts
    return ("prefill" if pre >= dec else "decode"), counts


def pd_figure(table):
    """C_SLO per GPU by split with its interval, labelled with the pool that binds; the best
    split green, the colocated system grey."""
    import plotly.graph_objects as go

    d = table.rows
    y = d["cslo_per_gpu_rps"]
    fig = go.Figure(go.Bar(
        x=d["configuration"], y=y,
        error_y={"type": "data", "symmetric": False, "array": d["cslo_ci_high_rps"] / d["gpus"] - y,
                 "arrayminus": y - d["cslo_ci_low_rps"] / d["gpus"]},
        text=d["binding_pool"], textposition="outside",
        marker_color=["#2ca02c" if c == table.best else ("#7f7f7f" if k == "colocated" else "#1f77b4")
                      for c, k in zip(d["configuration"], d["kind"])]))
    fig.update_layout(title="C_SLO per GPU by prefill:decode split (label: the pool that binds; grey: colocated)",
                      yaxis_title="req/s per GPU", xaxis_title="prefill:decode replicas",
                      template="plotly_white")
    return fig


#: how the sweep's table reads: one row per configuration (disaggregated splits, then the
#: colocated system); ``best`` the split with the most C_SLO per GPU (the cheapest per 1 000 good
#: requests when prices are known)
PD_LAYOUT = Layout(
    title="Prefill:decode sweep (SLO {slo}); best: {best}", key="configuration",
    line=("{configuration:>14}: C_SLO {cslo_rps:.3g} req/s [{cslo_ci_low_rps:.3g}, {cslo_ci_high_rps:.3g}] on "
          "{gpus} GPUs = {cslo_per_gpu_rps:.3g} per GPU",
          When("cost_usd_per_1k_good", ", ${cost_usd_per_1k_good:.4g} per 1 000 good requests"),
          "; binding: {binding_pool}"),
    headers=(("Configuration", "configuration"), ("Prefill replicas", "prefill_replicas"),
             ("Decode replicas", "decode_replicas"), ("GPUs", "gpus"), ("C_SLO (req/s)", "cslo_rps"),
             ("95 % interval", "{cslo_ci_low_rps:.3g}–{cslo_ci_high_rps:.3g}"),
             ("C_SLO per GPU (req/s)", "cslo_per_gpu_rps"),
             ("Cost per 1 000 good requests (USD)", "cost_usd_per_1k_good"),
             ("Binding pool", "binding_pool")),
    figure=pd_figure)


def pd_sweep(base: SynthConfig, slo: SLO | str, *, prefill: Pool, decode: Pool, total_replicas: int | None = None,
             ratios=None, transfer: KVTransfer = KVTransfer(), lanes: int = 1, colocated: bool = True,
             colocated_usd_per_gpu_hour: float | None = None, runs: int = 4, duration_s: float = 900.0,
             warmup_s: float | None = None, workers: int | None = None, rel_tol: float = REL_TOL) -> ScenarioTable:
    """Sweep prefill:decode splits (module docstring). ``base``: the configuration whose
    workload, client and arrival process are kept (a twin's ``synth_config()``); ``prefill`` /
    ``decode``: the pools (their ``replicas`` are replaced by the split); the splits are
    ``ratios`` [(prefill replicas, decode replicas)] or every split of ``total_replicas``."""
    s = SLO.parse(slo)
    if ratios is None:
        if not total_replicas or total_replicas < 2:
            raise SpecError("give ratios or total_replicas ≥ 2 for the prefill:decode sweep", field="pd_sweep")
        ratios = [(p, total_replicas - p) for p in range(1, total_replicas)]
    warm = duration_s / 6 if warmup_s is None else warmup_s
    rows, notes = [], []
    gpus_all = set()

    def row(name, kind, cfg, npre, ndec, gpus, cost_h):
        est = config_cslo(cfg, s, start=capacity_guess(cfg), runs=runs, duration_s=duration_s, warmup_s=warm,
                          workers=workers, rel_tol=rel_tol)
        bind, counts = (MISSING, {})  # the colocated system has no pools
        if kind == "disaggregated" and est.estimate > 0 and math.isfinite(est.estimate):
            bind, counts = binding_pool(cfg, est.estimate * ABOVE, s, duration_s=duration_s, warmup_s=warm)
        per_1k = (cost_h / (est.estimate * 3600 * s.attainment) * 1000) if cost_h is not None and est.estimate > 0 \
            else math.nan
        return {"configuration": name, "kind": kind, "prefill_replicas": npre, "decode_replicas": ndec, "gpus": gpus,
                "cslo_rps": est.estimate, "cslo_ci_low_rps": est.ci_low, "cslo_ci_high_rps": est.ci_high,
                "cslo_per_gpu_rps": est.estimate / gpus, "cost_usd_per_hour": cost_h,
                "cost_usd_per_1k_good": per_1k, "binding_pool": bind,
                "violations_prefill": counts.get("prefill"), "violations_decode": counts.get("decode"),
                "backlog_prefill": counts.get("backlog_prefill"), "backlog_decode": counts.get("backlog_decode"),
                "simulated_runs": est.evaluations, "notes": "; ".join(est.notes)}

    for npre, ndec in ratios:
        d = DisaggSpec(replace(prefill, replicas=int(npre)), replace(decode, replicas=int(ndec)), transfer, lanes)
        gpus_all.add(d.gpus)
        # the split as a scenario part (its note repeats the row's replicas and GPUs: not kept)
        cfg = on_config(base, Scenario(d.ratio, "", (DisaggregationPart(spec=d),))).config
        rows.append(row(d.ratio, "disaggregated", cfg, int(npre), int(ndec), d.gpus, d.cost_usd_per_hour()))
    if colocated:
        g = int(base.system.get("gpus_per_replica", 1) or 1)
        for gpus in sorted(gpus_all):
            if gpus % g:
                notes.append(f"{gpus} GPUs do not split into colocated replicas of {g} GPUs: no colocated row")
                continue
            n = gpus // g
            price = colocated_usd_per_gpu_hour
            if price is None and prefill.usd_per_gpu_hour is not None \
                    and prefill.usd_per_gpu_hour == decode.usd_per_gpu_hour:
                price = prefill.usd_per_gpu_hour
            cfg = replace(base, disagg=None, replicas=n, system={**base.system, "replicas": n})
            rows.append(row(f"colocated ×{n}", "colocated", cfg, None, None, gpus,
                            None if price is None else price * gpus))
    df = pd.DataFrame(rows)
    dis = df[df["kind"] == "disaggregated"]
    if dis["cost_usd_per_1k_good"].notna().all() and len(dis):
        best = dis.loc[dis["cost_usd_per_1k_good"].idxmin(), "configuration"]
    else:
        best = dis.loc[dis["cslo_per_gpu_rps"].idxmax(), "configuration"]
    notes.append(f"binding pool read from one run at {ABOVE:g} × C_SLO: the pool with the larger backlog; when "
                 "neither queues, where the violations happened (first token late or missing → prefill pool, later "
                 "limits → decode pool and the KV transfer)")
    notes.append(f"KV transfer: {transfer.latency_ms:g} ms + {transfer.kv_bytes_per_token:,} bytes per prompt token "
                 f"at {transfer.bandwidth_gb_s:g} GB/s, no contention between transfers; prefill pools never wait for "
                 "decode memory")
    return ScenarioTable("pd", s, df, PD_LAYOUT, best=str(best), notes=tuple(notes))
