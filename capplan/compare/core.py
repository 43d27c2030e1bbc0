"""``compare``: open both studies, check the workload, reduce, resample, tabulate."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import bootstrap as B
from ..errors import SpecError
from ..metrics import create_request_view
from ..slo import SLO
from ..study import open_study
from .deltas import (_buckets, _Ctx, _edges_for, _fairness_table, _headline, _median, _verdict,
                     _workload_frame)
from .gates import _number, load_gates
from .reduction import _CELL_DIMS, _arrays, _block_grid, _count_matrix, _dependence_series, _reduce
from .result import Comparison
from .workload import (_check_slo, _check_workload, _facts, _gpus, _match_runs, _pairing, _Side,
                       _token_hist)


def compare(baseline, candidate, slo, *, gates=None, confidence: float | None = None,
            reps: int = 1000, seed: int = 0, warmup_s=None) -> Comparison:
    """Compare ``candidate`` against ``baseline`` (study paths or opened Studies) under one SLO.

    ``gates``: a path, mapping or Gates (None = templates/gates.yaml defaults);
    ``confidence`` overrides the gates file's. Deterministic for a given ``seed``.
    Raises StudyError/SpecError (exit 2) when the studies cannot be put side by side."""
    slo = SLO.parse(slo)
    g = load_gates(gates)
    conf = g.confidence if confidence is None else _number(confidence, "confidence", "argument",
                                                           lo=0.5, hi=1.0, hi_open=True)
    if isinstance(reps, bool) or not isinstance(reps, (int, np.integer)) or reps < 100:
        raise SpecError(f"reps must be an integer ≥ 100, got {reps!r}", field="reps",
                        fix="e.g. --reps 1000")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise SpecError(f"seed must be an integer, got {seed!r}", field="seed")
    conf_family = 1.0 - (1.0 - conf) / 2.0
    sb, sc = open_study(baseline), open_study(candidate)
    _check_slo(sb, sc)
    pairs = _match_runs(sb, sc)
    # the same steady window on both sides: the longer of the two warm-ups per matched run
    warm_b, warm_c = {}, {}
    for rb, rc in pairs:
        w = max(sb.manifest.run(rb).warmup_s or 0.0, sc.manifest.run(rc).warmup_s or 0.0)
        if warmup_s is not None:
            w = float(warmup_s)
        warm_b[rb], warm_c[rc] = w, w
    create_request_view(sb, warm_b)
    create_request_view(sc, warm_c)
    b = _Side("baseline", sb, [p[0] for p in pairs], pd.DataFrame(), _gpus(sb), sb.has("itl_ns"),
              warmup_s=warm_b)
    c = _Side("candidate", sc, [p[1] for p in pairs], pd.DataFrame(), _gpus(sc), sc.has("itl_ns"),
              warmup_s=warm_c)
    for side in (b, c):
        side.facts = _facts(side, side.runs)
        _token_hist(side)
    _check_workload(b, c, pairs, g.workload)
    paired, pairing = _pairing(b, c, pairs, g.workload.pairing)
    for side in (b, c):
        _dependence_series(side, slo)
    grid = _block_grid(b, c)
    max_in = int(max(b.tok_hist["input"]["v"].max(), c.tok_hist["input"]["v"].max()))
    max_out = int(max(b.tok_hist["output"]["v"].max() if len(b.tok_hist["output"]) else 1,
                      c.tok_hist["output"]["v"].max() if len(c.tok_hist["output"]) else 1))
    in_edges = _edges_for(g.buckets.input_edges, max_in)
    out_edges = _edges_for(g.buckets.output_edges, max_out)
    split_in = g.buckets.quadrant_split[0]
    split_out = g.buckets.quadrant_split[1]
    if split_in is None:
        split_in = _median([b.tok_hist["input"]])
    if split_out is None:
        split_out = _median([b.tok_hist["output"]])
    for side in (b, c):
        _reduce(side, slo, grid, in_edges, out_edges, split_in, split_out, g.fairness)
    cell_index = (pd.concat([b.cells[list(_CELL_DIMS)], c.cells[list(_CELL_DIMS)]])
                  .drop_duplicates().sort_values(list(_CELL_DIMS)).reset_index(drop=True))
    ab, ac = _arrays(b, cell_index, grid), _arrays(c, cell_index, grid)
    rng = B.as_rng(seed)
    Wb = _count_matrix(grid, reps, rng)
    Wc = Wb if paired else _count_matrix(grid, reps, rng)
    ctx = _Ctx(b, c, ab, ac, Wb, Wc, g, slo, conf, conf_family, cell_index, pairs, pairing,
               paired, grid, in_edges, out_edges, (split_in, split_out), seed)
    table, notes = _headline(ctx)
    buckets = _buckets(ctx)
    fairness = _fairness_table(ctx)
    verdict = _verdict(table, buckets, g, notes)
    workload = _workload_frame(ctx)
    return Comparison(table=table, buckets=buckets, fairness=fairness, workload=workload,
                      verdict=verdict, paired=paired, slo=slo, gates=g, baseline_name=sb.name,
                      candidate_name=sc.name, reps=int(reps), seed=int(seed),
                      confidence_headline=conf_family, confidence_buckets=conf_family,
                      notes=tuple(notes))
