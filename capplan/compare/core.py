"""``compare``: open both studies, check the offered workload, reduce each side once over the
common steady windows, split the runs into families, resample, tabulate, judge."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import bootstrap as boot
from ..cache import check_cache_conditions
from ..envelope import fit_from_stats
from ..errors import SpecError, StudyError
from ..slo import SLO
from ..study import open_study
from .buckets import bucket_table, edges_for, median
from .deltas import (Ctx, classify_runs, cslo_rows, family_rows, finish_table, run_rows,
                     sweep_rows, verdict, workload_frame)
from .fairness import fairness_rows, fairness_table
from .gates import confidence_arg, load_gates
from .result import Comparison
from .sampling import draws, repeated
from .sides import arrays, cell_union, comparison_cells, largest_and_median, open_side, reduce_sides
from .workload import check_slo, check_workload, detect_pairing, match_runs


def compare(baseline, candidate, slo, *, gates=None, confidence: float | None = None,
            reps: int = 1000, seed: int = 0, warmup_s=None,
            allow_cache_mismatch: bool = False) -> Comparison:
    """Compare ``candidate`` against ``baseline`` (study paths or opened Studies) under one SLO.

    ``gates``: a path, mapping or Gates (None = templates/gates.yaml defaults);
    ``confidence`` overrides the gates file's; ``warmup_s`` replaces both manifests' warm-ups.
    Deterministic for a given ``seed``. Raises StudyError/SpecError (exit 2) when the studies
    cannot be put side by side (different offered workload, runs or SLOs, or matched runs
    labelled with different prefix-cache conditions unless ``allow_cache_mismatch``:
    ``capplan.cache.check_cache_conditions``)."""
    slo = SLO.parse(slo)
    g = load_gates(gates)
    conf = g.confidence if confidence is None else confidence_arg(confidence)
    if isinstance(reps, bool) or not isinstance(reps, (int, np.integer)) or reps < 100:
        raise SpecError(f"reps must be an integer ≥ 100, got {reps!r}", field="reps",
                        fix="e.g. --reps 1000")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise SpecError(f"seed must be an integer, got {seed!r}", field="seed")
    reps, seed = int(reps), int(seed)
    conf_family = 1.0 - (1.0 - conf) / 2.0
    sb, sc = open_study(baseline), open_study(candidate)
    check_slo(sb, sc)
    pairs = match_runs(sb, sc, warmup_s)
    cache_notes = check_cache_conditions(sb.manifest, sc.manifest, [(p.baseline, p.candidate) for p in pairs],
                                         allow=allow_cache_mismatch)
    b, c = open_side("baseline", sb, pairs), open_side("candidate", sc, pairs)
    paired, pairing = detect_pairing(sb, sc, pairs, b.offered, c.offered, g.workload.pairing)
    notes = check_workload(sb, sc, pairs, b.offered, c.offered, g.workload, paired) + cache_notes

    # the cells, from the offered lengths; then each side reduced once
    requested = b.offered.has_requested_output and c.offered.has_requested_output
    out_col = "max_output_tokens" if requested else "output_tokens"
    if not requested:
        notes.append("output-length buckets use the tokens received (max_output_tokens is not "
                     "recorded in both studies): a request that failed early lands in a short "
                     "bucket")
    in_edges = edges_for(g.buckets.input_edges,
                         max(largest_and_median(s, "input_tokens")[0] for s in (b, c)))
    out_edges = edges_for(g.buckets.output_edges,
                          max(largest_and_median(s, out_col)[0] for s in (b, c)))
    split_in, split_out = g.buckets.quadrant_split
    if split_in is None:
        split_in = median([b.offered.input_tokens])
    if split_out is None:
        split_out = largest_and_median(b, out_col)[1]
    reduce_sides(b, c, slo, comparison_cells(in_edges, out_edges, out_col, (split_in, split_out),
                                      b.has_itl and c.has_itl))

    envs = []
    for k, side in enumerate((b, c)):
        try:  # the same statistics, so the same steady windows, as every other row
            envs.append(fit_from_stats(side.stats, slo, confidence=conf, reps=reps,
                                       seed=seed + (0 if paired else k)))
        except (StudyError, SpecError):
            envs.append(None)
    regimes = classify_runs(b, envs[0], pairs, slo)

    # one resample per run: blocks of the larger of the two sides' lengths, in units
    scheme = boot.Circular()
    blocks = []
    for p in pairs:
        rb, rc = b.stats.run(p.baseline), c.stats.run(p.candidate)
        blocks.append({
            "pair": p.index, "units": rb.n_units,
            "unit_s": b.stats.unit_rule.width_ns(p.baseline) / 1e9,
            "block_units": max(scheme.block_units(rb.block_len, rb.unit_size),
                               scheme.block_units(rc.block_len, rc.unit_size)),
            "block_requests": max(scheme.block_requests(rb.block_len),
                                  scheme.block_requests(rc.block_len))})
    blocks = pd.DataFrame(blocks)
    levels = [p.level for p in pairs]
    once = ~repeated(levels)
    saturated = (regimes["family"] == "saturated").to_numpy()
    kappa = g.runs.sd_factor
    sd = np.where(once & (saturated | (not paired)), kappa, 1.0)
    if (sd > 1.0).any():
        which = "saturated runs" if paired else "runs"
        notes.append(f"{which} tested once ({int((sd > 1).sum())} of {len(pairs)}): their "
                     f"within-run bootstrap deviations are widened ×{kappa:g} for the run-to-run "
                     "spread a single run cannot show (runs.sd_factor); repeats at those rates "
                     "would measure it")
    units, L = blocks["units"].tolist(), blocks["block_units"].tolist()
    db = draws(units, L, levels, reps, seed, 0, sd)
    dc = db if paired else draws(units, L, levels, reps, seed, 1, sd)

    union = cell_union(b, c)
    (ab, _), (ac, _) = arrays(b, union, pairs), arrays(c, union, pairs)
    ctx = Ctx(b, c, ab, ac, db, dc, g, slo, conf, conf_family, union, pairs, pairing,
              paired, blocks, regimes, in_edges, out_edges, out_col, (split_in, split_out), seed,
              envs=tuple(envs))
    rows = (family_rows(ctx, "steady") + family_rows(ctx, "saturated") + cslo_rows(ctx)
            + sweep_rows(ctx) + fairness_rows(ctx) + run_rows(ctx))
    table = finish_table(rows, ctx)
    buckets = bucket_table(ctx)
    fairness = fairness_table(ctx)
    all_notes = notes + ctx.notes
    return Comparison(table=table, buckets=buckets, fairness=fairness,
                      workload=workload_frame(ctx), verdict=verdict(table, buckets, g, all_notes),
                      paired=paired, slo=slo, gates=g, baseline_name=sb.name,
                      candidate_name=sc.name, reps=reps, seed=seed,
                      confidence_headline=conf_family, confidence_buckets=conf_family,
                      notes=tuple(all_notes), envelopes=tuple(envs))
