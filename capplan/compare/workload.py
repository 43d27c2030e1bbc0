"""Is it the same offered workload? Run matching, the SLO of both manifests, per-run offered
facts, the refusal rules and the detection of a replayed trace (pairing)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import contract as C
from ..errors import Problem, SpecError, StudyError
from ..metrics import measured_rate_rps
from ..slo import SLO
from ..study import Study
from .gates import WorkloadRules


def ks_distance(values_b, counts_b, values_c, counts_c) -> float:
    """Two-sample Kolmogorov–Smirnov distance from (value, count) histograms."""
    vals = np.union1d(values_b, values_c)
    fb = np.zeros(vals.size)
    fc = np.zeros(vals.size)
    fb[np.searchsorted(vals, values_b)] = counts_b
    fc[np.searchsorted(vals, values_c)] = counts_c
    if fb.sum() == 0 or fc.sum() == 0:
        return 0.0 if fb.sum() == fc.sum() else 1.0
    return float(np.abs(np.cumsum(fb) / fb.sum() - np.cumsum(fc) / fc.sum()).max())


@dataclass
class _Side:
    """What one study contributes (internal, built once per compare call)."""

    label: str
    study: Study
    runs: list[str]  # run ids in pair order
    facts: pd.DataFrame  # per pair: n, first/last scheduled, window_s, rate, cv, warmup_ns
    gpus: int
    has_itl: bool
    cells: pd.DataFrame | None = None
    hists: dict[str, pd.DataFrame] = field(default_factory=dict)
    good_series: list[np.ndarray] = field(default_factory=list)
    tok_hist: dict[str, pd.DataFrame] = field(default_factory=dict)
    warmup_s: dict[str, float] = field(default_factory=dict)  # the aligned steady windows


def _gpus(study: Study) -> int:
    return int(study.manifest.gpus_per_replica) * int(study.manifest.replicas)


def _match_runs(b: Study, c: Study) -> list[tuple[str, str]]:
    """Pairs (baseline run, candidate run): by run_id when both have the same set, else by
    load level order when the levels agree; otherwise a StudyError listing both."""
    if b.load_model != c.load_model:
        raise StudyError(f"the studies use different load models: baseline {b.load_model}, "
                         f"candidate {c.load_model}; an open-loop and a closed-loop test do not "
                         "offer the same workload", code="workload_differs",
                         fix="compare two open-loop (or two closed-loop) studies of the same trace")
    bid, cid = b.manifest.run_ids, c.manifest.run_ids
    if set(bid) == set(cid):
        return [(r, r) for r in bid]

    def levels(s: Study):
        return sorted(((r.load_level, r.repeat, r.run_id) for r in s.manifest.runs))

    lb, lc = levels(b), levels(c)
    if len(lb) == len(lc) and all(math.isclose(x[0], y[0], rel_tol=1e-6) for x, y in zip(lb, lc)):
        return [(x[2], y[2]) for x, y in zip(lb, lc)]
    fmt = lambda L: ", ".join(f"{rid}@{lvl:g}" for lvl, _, rid in L)  # noqa: E731
    raise StudyError("the studies do not test the same runs: "
                     f"baseline has {len(lb)} run(s) [{fmt(lb)}], candidate has {len(lc)} "
                     f"[{fmt(lc)}]", code="workload_differs",
                     fix="run the candidate on the same load levels (same run ids or the same "
                         "offered_rps / concurrency per run)")


def _check_slo(b: Study, c: Study) -> None:
    sb, sc = b.manifest.raw.get("slo"), c.manifest.raw.get("slo")
    if sb is not None and sc is not None:
        try:
            eq = SLO.parse(sb) == SLO.parse(sc)
        except SpecError:
            eq = sb == sc
        if not eq:
            raise SpecError(f"the studies declare different SLOs: baseline {sb!r}, candidate "
                            f"{sc!r}; a comparison needs one SLO",
                            fix="pass the SLO to judge both with --slo, and fix the manifests")


def _facts(side: _Side, pairs_ids: list[str]) -> pd.DataFrame:
    """Per run of the steady window: n, schedule span, measured rate, inter-arrival CV."""
    df = side.study.sql("""
        WITH r AS (
            SELECT run_id, scheduled_ns,
                   scheduled_ns - lag(scheduled_ns) OVER (PARTITION BY run_id ORDER BY scheduled_ns)
                       AS gap
            FROM request_metrics WHERE in_window)
        SELECT run_id, count(*) AS n, min(scheduled_ns) AS first_ns, max(scheduled_ns) AS last_ns,
               stddev_pop(gap) / nullif(avg(gap), 0) AS cv
        FROM r GROUP BY run_id
    """).df().set_index("run_id")
    ends = side.study.sql("""
        SELECT run_id, count_if(status = 'ok') AS n_ok,
               max(greatest(scheduled_ns, sent_ns, admitted_ns, first_token_ns, last_token_ns))
                   AS end_ns
        FROM request_metrics GROUP BY run_id
    """).df().set_index("run_id")
    rows = []
    for pair, rid in enumerate(pairs_ids):
        a = df.loc[rid] if rid in df.index else None
        n = int(a["n"]) if a is not None else 0
        first = float(a["first_ns"]) if a is not None else float("nan")
        last = float(a["last_ns"]) if a is not None else float("nan")
        rows.append({
            "pair": pair, "run_id": rid, "n": n, "first_ns": first, "last_ns": last,
            "rate_rps": measured_rate_rps(n, first, last) if n >= 2 else float("nan"),
            "cv": float(a["cv"]) if a is not None and pd.notna(a["cv"]) else float("nan"),
            "end_ns": float(ends.loc[rid, "end_ns"]) if rid in ends.index else float("nan"),
        })
    return pd.DataFrame(rows)


def _token_hist(side: _Side) -> None:
    s = side.study
    side.tok_hist["input"] = s.sql("""SELECT run_id, input_tokens AS v, count(*) AS c
        FROM request_metrics WHERE in_window GROUP BY ALL""").df()
    side.tok_hist["output"] = s.sql("""SELECT run_id, output_tokens AS v, count(*) AS c
        FROM request_metrics WHERE in_window AND status = 'ok' GROUP BY ALL""").df()


def _check_workload(b: _Side, c: _Side, pairs: list[tuple[str, str]], rules: WorkloadRules) -> None:
    """Refuse (StudyError, exit 2) when the offered workload differs beyond sampling noise:
    rates and request counts per run, token distributions, arrival process."""
    probs: list[Problem] = []
    for i, (rb, rc) in enumerate(pairs):
        fb, fc = b.facts.iloc[i], c.facts.iloc[i]
        run = rb if rb == rc else f"{rb} / {rc}"
        nb, nc = fb["n"], fc["n"]
        if nb == 0 or nc == 0:
            probs.append(Problem(f"run {run}: offered requests in the steady window: "
                                 f"baseline {nb:,}, candidate {nc:,}"))
            continue
        noise = 4.0 * math.sqrt(1.0 / nb + 1.0 / nc)  # ±4 Poisson SDs of a relative difference
        sb, sc = b.study.manifest.run(rb), c.study.manifest.run(rc)
        if b.study.load_model == C.LoadModel.CLOSED.value:
            if sb.concurrency != sc.concurrency:
                probs.append(Problem(f"run {run}: concurrency {sb.concurrency} vs {sc.concurrency}"))
        else:
            rel = abs(fc["rate_rps"] / fb["rate_rps"] - 1.0)
            if rel > max(rules.rate_tolerance_rel, noise):
                probs.append(Problem(
                    f"run {run}: offered rate (measured from scheduled_ns) baseline "
                    f"{fb['rate_rps']:.4g} req/s, candidate {fc['rate_rps']:.4g} req/s "
                    f"({100 * (fc['rate_rps'] / fb['rate_rps'] - 1):+.1f} %; allowed "
                    f"{100 * max(rules.rate_tolerance_rel, noise):.1f} %)"))
        rel_n = abs(nc / nb - 1.0)
        # closed loop: the request count is an outcome (a faster system sends more), not offered
        if b.study.load_model != C.LoadModel.CLOSED.value and \
                rel_n > max(rules.count_tolerance_rel, noise):
            probs.append(Problem(f"run {run}: offered requests in the steady window baseline "
                                 f"{nb:,}, candidate {nc:,} ({100 * (nc / nb - 1):+.1f} %)"))
        for kind in ("input", "output"):
            hb = b.tok_hist[kind][b.tok_hist[kind]["run_id"] == rb]
            hc = c.tok_hist[kind][c.tok_hist[kind]["run_id"] == rc]
            n1, n2 = hb["c"].sum(), hc["c"].sum()
            if n1 == 0 or n2 == 0:
                continue
            d = ks_distance(hb["v"].to_numpy(), hb["c"].to_numpy(), hc["v"].to_numpy(),
                            hc["c"].to_numpy())
            crit = 1.95 * math.sqrt((n1 + n2) / (n1 * n2))  # KS critical value, α = 0.001
            if d > max(rules.token_ks_max, crit):
                mb = np.average(hb["v"], weights=hb["c"])
                mc = np.average(hc["v"], weights=hc["c"])
                what = "input tokens" if kind == "input" else "output tokens of completed requests"
                probs.append(Problem(f"run {run}: {what} distribution differs (KS distance "
                                     f"{d:.3f}; mean {mb:,.1f} vs {mc:,.1f})"))
        if b.study.load_model != C.LoadModel.CLOSED.value:
            if sb.arrival not in ("unknown", None) and sc.arrival not in ("unknown", None) \
                    and sb.arrival != sc.arrival:
                probs.append(Problem(f"run {run}: arrival process {sb.arrival} vs {sc.arrival}"))
            elif np.isfinite(fb["cv"]) and np.isfinite(fc["cv"]) and \
                    abs(fb["cv"] - fc["cv"]) > rules.arrival_cv_tolerance:
                probs.append(Problem(f"run {run}: arrival process differs: inter-arrival CV "
                                     f"{fb['cv']:.2f} vs {fc['cv']:.2f} (Poisson ≈ 1, "
                                     "constant ≈ 0)"))
    if probs:
        lines = "\n".join(f"    - {p.message}" for p in probs)
        raise StudyError(problems=[Problem(
            "baseline and candidate do not offer the same workload; they are not put side by "
            f"side:\n{lines}", file=f"{b.study.root} vs {c.study.root}",
            fix="replay the same trace (same rates, requests, token lengths and arrival process) "
                "on both systems; tolerances: gates.yaml 'workload:'", code="workload_differs")])


def _pairing(b: _Side, c: _Side, pairs: list[tuple[str, str]], mode: str) -> tuple[bool, pd.DataFrame]:
    """Whether both studies replay the same trace rows, and per run: matched, missing (in the
    baseline, not in the candidate) and extra requests. Keys: request_id, scheduled_ns,
    input_tokens within matched runs (joined in DuckDB)."""
    keys = b.study.con.sql(
        "SELECT run_id, request_id, scheduled_ns, input_tokens FROM request_metrics "
        "WHERE in_window").to_arrow_table()
    runmap = pd.DataFrame({"b_run": [p[0] for p in pairs], "c_run": [p[1] for p in pairs],
                           "pair": range(len(pairs))})
    con = c.study.con
    con.register("_cmp_base_keys", keys)
    con.register("_cmp_runmap", runmap)
    try:
        df = con.execute("""
            WITH bk AS (SELECT m.pair, k.request_id, k.scheduled_ns, k.input_tokens
                        FROM _cmp_base_keys k JOIN _cmp_runmap m ON k.run_id = m.b_run),
                 ck AS (SELECT m.pair, q.request_id, q.scheduled_ns, q.input_tokens
                        FROM request_metrics q JOIN _cmp_runmap m ON q.run_id = m.c_run
                        WHERE q.in_window)
            SELECT coalesce(bk.pair, ck.pair) AS pair,
                   count_if(bk.request_id IS NOT NULL AND ck.request_id IS NOT NULL) AS matched,
                   count_if(ck.request_id IS NULL) AS missing,
                   count_if(bk.request_id IS NULL) AS extra
            FROM bk FULL OUTER JOIN ck USING (pair, request_id, scheduled_ns, input_tokens)
            GROUP BY 1 ORDER BY 1
        """).df()
    finally:
        con.unregister("_cmp_base_keys")
        con.unregister("_cmp_runmap")
    df = runmap.merge(df, on="pair", how="left").fillna({"matched": 0, "missing": 0, "extra": 0})
    nb = b.facts["n"].to_numpy()
    nc = c.facts["n"].to_numpy()
    same_trace = bool(np.all(df["matched"].to_numpy() >= 0.5 * np.maximum(np.maximum(nb, nc), 1)))
    if mode == "paired" and not same_trace:
        raise SpecError("pairing: paired was asked for, but the studies do not replay the same "
                        "trace rows (request_id, scheduled_ns, input_tokens per run)",
                        field="workload.pairing", fix="use pairing: auto or independent")
    paired = same_trace if mode == "auto" else mode == "paired"
    return paired, df
