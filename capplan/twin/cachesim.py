"""Prefix-cache scenarios: C_SLO over cache sizes and hit rates, against what the prefill time
saved predicts (docs/scenarios.md, "The prefix cache in the twin").

Each setting (a prefix workload and a cache) gets the steady-state C_SLO of the configuration
(``capplan.twin.capacity.config_cslo``) and, from one run at that rate, the measured request and
token hit rates and the mean prompt tokens computed per request. The **prediction** scales the
baseline's C_SLO (the first setting, normally no cache) by the ratio of the service model's
throughput bounds at the measured work per request:

- prefill bound = replicas × lanes / (prefill_overhead + prefill_ms_per_token × mean computed
  prompt tokens) — separate prefill lanes; colocated (mixed) prefill shares the GPU with
  decoding, so there the two bounds combine as 1 / (1 / prefill + 1 / decode);
- decode bound = replicas × max_batch / ((mean answer − 1) × decode step at max_batch).

So the prediction is exact where one resource binds at saturation and the SLO's limit is loose
enough that C_SLO sits near it; it says what the saved prefill work buys, not what queueing
does to a tight TTFT tail.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from .. import spec as S
from ..slo import SLO
from ..sim.config import SynthConfig
from .capacity import REL_TOL, capacity_guess, config_counts, config_cslo
from .parts import on_config, policy_scenario
from .table import Layout, ScenarioTable


def throughput_bound(cfg: SynthConfig, computed_tokens: float, answer_tokens: float) -> float:
    """The service model's throughput bound (req/s) at a mean work per request (module
    docstring)."""
    rp, n = cfg.replica, cfg.replicas
    sm = rp.service
    pre_s = (sm.prefill_overhead_ms + sm.prefill_ms_per_token * computed_tokens) / 1e3
    dec_s = max(answer_tokens - 1.0, 0.0) * float(sm.step_ms(rp.max_batch)) / 1e3 / rp.max_batch
    if rp.prefill == "separate":
        lanes = rp.prefill_lanes or rp.max_batch
        return min(n * lanes / pre_s if pre_s > 0 else math.inf, n / dec_s if dec_s > 0 else math.inf)
    return n / (pre_s + dec_s)


def cache_figure(table):
    """Simulated C_SLO per setting with its interval, and the prediction beside it."""
    import plotly.graph_objects as go

    d = table.rows
    fig = go.Figure()
    fig.add_trace(go.Bar(x=d["setting"], y=d["cslo_rps"], name="simulated C_SLO",
                         error_y={"type": "data", "symmetric": False, "array": d["cslo_ci_high_rps"] - d["cslo_rps"],
                                  "arrayminus": d["cslo_rps"] - d["cslo_ci_low_rps"]}))
    fig.add_trace(go.Scatter(x=d["setting"], y=d["predicted_cslo_rps"], mode="markers", name="predicted from "
                             "the prefill time saved", marker={"symbol": "diamond", "size": 11}))
    fig.update_layout(title="C_SLO by prefix-cache setting", yaxis_title="req/s", template="plotly_white")
    return fig


#: how the cache sweep's table reads: one row per setting — cache, hit rates, mean computed prompt
#: tokens, C_SLO with its interval, the predicted C_SLO and the gain over the baseline (the first row)
CACHE_LAYOUT = Layout(
    title="Prefix-cache scenarios (SLO {slo})", key="setting",
    line=("{setting:>20}: hit rate {request_hit_rate:.1%} of requests, {token_hit_rate:.1%} of prompt tokens; "
          "{mean_computed_tokens:,.0f} prompt tokens computed per request; C_SLO {cslo_rps:.3g} req/s "
          "[{cslo_ci_low_rps:.3g}, {cslo_ci_high_rps:.3g}] (×{gain:.2f}; predicted ×{predicted_gain:.2f})",),
    headers=(("Setting", "setting"), ("Cache (blocks per replica)", "cache_blocks"),
             ("Request hit rate", "request_hit_rate"), ("Token hit rate", "token_hit_rate"),
             ("Prompt tokens computed (mean)", "mean_computed_tokens"), ("C_SLO (req/s)", "cslo_rps"),
             ("Predicted C_SLO (req/s)", "predicted_cslo_rps"), ("Gain", "gain"), ("Predicted gain", "predicted_gain")),
    figure=cache_figure)


def cache_sweep(cfg: SynthConfig, slo: SLO | str, settings: dict, *, runs: int = 2, duration_s: float = 900.0,
                warmup_s: float | None = None, workers: int | None = None, rel_tol: float = REL_TOL) -> ScenarioTable:
    """``settings``: {name: scenario} — each a mapping of ``prefixes`` / ``prefix_cache`` parts
    (``{}``: no cache) or a Scenario of them — applied in turn to ``cfg`` without its cache (a
    setting without ``prefix_cache`` is the system without one); the first is the baseline of the
    gains (module docstring)."""
    s = SLO.parse(slo)
    warm = duration_s / 6 if warmup_s is None else warmup_s
    rows, said = [], []
    for name, spec in settings.items():
        ctx = on_config(replace(cfg, prefix_cache=None), policy_scenario(name, spec, S.join("settings", name)))
        c, pc = ctx.config, ctx.config.prefix_cache
        said += [f"{name}: {n}" for n in ctx.notes]  # e.g. what prefixes from a study were read as
        est = config_cslo(c, s, start=capacity_guess(c), runs=runs, duration_s=duration_s, warmup_s=warm, workers=workers,
                          rel_tol=rel_tol)
        _, _, o, res = config_counts(c, max(est.estimate, 1e-3), s, duration_s=duration_s, warmup_s=warm, run=0,
                                     outcome=True)
        w = (res.sched_ns >= int(warm * 1e9))
        st = res.stats
        comp = res.computed_input if res.computed_input is not None else res.input_tokens
        adm = w & (comp >= 0) if res.computed_input is not None else w
        mean_comp = float(np.mean(comp[adm])) if adm.any() else math.nan
        mean_in = float(np.mean(res.input_tokens[adm])) if adm.any() else math.nan
        mean_out = float(np.mean(res.target_output[w])) if w.any() else math.nan
        hits = int(np.sum(adm & (comp < res.input_tokens))) if res.computed_input is not None else 0
        rows.append({"setting": name, "cache_blocks": None if pc is None else pc.blocks,
                     "router": None if pc is None else pc.router, "request_hit_rate": hits / adm.sum() if adm.any()
                     else math.nan, "token_hit_rate": 1 - mean_comp / mean_in if mean_in else math.nan,
                     "mean_input_tokens": mean_in, "mean_computed_tokens": mean_comp, "mean_answer_tokens": mean_out,
                     "cslo_rps": est.estimate, "cslo_ci_low_rps": est.ci_low, "cslo_ci_high_rps": est.ci_high,
                     "bound_rps": throughput_bound(c, mean_comp, mean_out),
                     "prefix_hits_run": st.get("prefix_hits"), "simulated_runs": est.evaluations})
    df = pd.DataFrame(rows)
    base = df.iloc[0]
    df["gain"] = df["cslo_rps"] / base["cslo_rps"]
    df["predicted_gain"] = df["bound_rps"] / base["bound_rps"]
    df["predicted_cslo_rps"] = base["cslo_rps"] * df["predicted_gain"]
    notes = (f"hit rates and computed tokens measured in one run at each setting's C_SLO (steady window after "
             f"{warm:g} s); the prediction scales the first setting's C_SLO by the service model's throughput bound "
             "at the measured work per request",) + tuple(said)
    return ScenarioTable("cache", s, df, CACHE_LAYOUT, notes=notes)
