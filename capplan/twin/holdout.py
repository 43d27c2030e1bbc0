"""Held-out validation: fit the twin on the runs below a rate, predict the runs above it — what a
planner does when asked about more load than was tested — and say how far off it was.

The check runs on every run; the verdict also turns to *disagrees* when any held-out run falls
outside the twin's band for any metric (each is a prediction, not a sample of many)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import StudyError
from ..slo import CSLO_REPS, SLO
from .check import TwinCheck, check_twin, json_number
from .data import load_study
from .fit import fit_twin
from .model import Twin
from ..sim.evaluate import METRICS
from .replay import METRIC_LABELS


def check_holdout(study, slo: SLO | str, below_rps: float, *, replays: int = 20, seed: int = 0,
                  reps: int = CSLO_REPS, steady: bool = True, steady_draws: int = 10, workers: int | None = None, fit_reps: int = 200,
                  steady_options: dict | None = None) -> tuple[Twin, TwinCheck]:
    """Fit on the runs offered below ``below_rps`` and predict the runs at or above it (what a
    planner does when asked about more load than was tested); reports how far off it was."""
    s = SLO.parse(slo)
    twin = fit_twin(study, below_rps=below_rps, reps=fit_reps, seed=seed)
    data = load_study(study)
    above = tuple(r.run_id for r in data.runs if r.offered_rps is not None and r.offered_rps >= below_rps)
    if not above:
        raise StudyError(f"no run at or above {below_rps:g} req/s to predict", file=data.root,
                         fix="choose a --holdout rate below the highest tested rate")
    chk = check_twin(twin, study, s, replays=replays, seed=seed, reps=reps, steady=steady,
                     steady_draws=steady_draws, workers=workers, data=data, steady_options=steady_options)
    held = chk.runs[chk.runs.run_id.isin(above)]
    errs = {}
    for m in METRICS:
        meas = held[f"{m}_measured"].astype(float)
        tw = held[f"{m}_twin"].astype(float)
        ok = np.isfinite(meas) & np.isfinite(tw)
        if not ok.any():
            continue
        if m in ("attainment", "share_rejected", "share_timed_out"):
            errs[m] = {"mean_abs_error": json_number(float(np.mean(np.abs(tw[ok] - meas[ok])))), "kind": "absolute"}
        else:
            errs[m] = {"mean_abs_error": json_number(float(np.mean(np.abs(tw[ok] / meas[ok] - 1.0)))), "kind": "relative"}
        errs[m]["outside"] = int((~held.loc[ok, f"{m}_inside"]).sum())
    c = chk.cslo
    summary = ", ".join(f"{METRIC_LABELS[m]} off by {v['mean_abs_error']:.3g}"
                        + (" (relative)" if v["kind"] == "relative" else "") for m, v in errs.items()
                        if v["mean_abs_error"] is not None)
    hold = {"below_rps": float(below_rps), "fitted_runs": list(twin.source.get("runs", [])),
            "predicted_runs": list(above), "errors": errs, "summary": summary}
    if (c.get("twin") or {}).get("estimate") and (c.get("measured") or {}).get("estimate"):
        hold["cslo_twin_vs_measured"] = json_number(c["twin"]["estimate"] / c["measured"]["estimate"] - 1.0)
    # the prediction is the point: any held-out run outside the twin's band is a miss
    missed = []
    for r in held.to_dict("records"):
        for m in METRICS:
            if not r[f"{m}_inside"]:
                missed.append(f"held-out run {r['run_id']} at {r['offered_rps']:g} req/s: {METRIC_LABELS[m]} measured "
                              f"{r[f'{m}_measured']:.4g}, the twin predicted {r[f'{m}_twin']:.4g} "
                              f"[{r[f'{m}_pi_low']:.4g}, {r[f'{m}_pi_high']:.4g}]")
    hold["missed"] = missed
    verdict = "disagrees" if missed or chk.verdict == "disagrees" else "agrees"
    notes = chk.notes
    if missed and any(p.source in ("lower bound", "default") for p in twin.params
                      if p.key in ("max_batch", "kv_capacity_tokens", "token_budget", "queue_limit")):
        notes = notes + ("limits the runs below the hold-out rate never reached are lower bounds or defaults in the "
                         "held-out twin (see its notes); predictions above the tested load rest on them",)
    return twin, replace(chk, holdout=hold, verdict=verdict, where=tuple(chk.where) + tuple(missed), notes=notes)
