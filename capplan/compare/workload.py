"""Is it the same offered workload? Run matching, the common steady window, the offered facts of
each side, the refusal rules and the detection of a replayed trace (pairing).

Only what the client *offered* decides: the schedule (``scheduled_ns``), the prompts
(``input_tokens``) and the answer lengths asked for (``max_output_tokens``). What came back
(tokens received, statuses, latencies) is the systems' behaviour — a regression, never a
different workload — so it never makes two studies incomparable (docs/compare.md §1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import contract as C
from ..errors import Problem, SpecError, StudyError
from ..metrics import measured_rate_rps
from ..slo import SLO
from ..study import Study
from .gates import WorkloadRules

#: refusal thresholds are "tolerance or this many standard errors of sampling noise,
#: whichever is larger", so two seeds of one process always pass
NOISE_SDS = 4.0
#: family-wise false-refusal rate of the token-distribution tests (Bonferroni over the runs
#: and the two token columns): each KS test uses α / tests, c(α) = sqrt(−ln(α/2)/2)
KS_ALPHA = 0.001


def ks_critical(n1: float, n2: float, tests: int) -> float:
    """Two-sample KS critical distance at the family-wise level ``KS_ALPHA`` over ``tests``."""
    a = KS_ALPHA / max(tests, 1)
    return math.sqrt(-math.log(a / 2.0) / 2.0) * math.sqrt((n1 + n2) / (n1 * n2))


@dataclass(frozen=True)
class RunPair:
    """One matched run: baseline and candidate run ids, the baseline's load level and repeat,
    and the common steady window (seconds from the run's start)."""

    index: int
    baseline: str
    candidate: str
    level: float
    repeat: int
    warmup_s: float

    @property
    def label(self) -> str:
        return self.baseline if self.baseline == self.candidate else \
            f"{self.baseline} / {self.candidate}"


def match_runs(b: Study, c: Study, warmup_s=None) -> list[RunPair]:
    """Pairs (baseline run, candidate run): by run_id when both have the same set, else by
    load level order when the levels agree; otherwise a StudyError listing both. Each pair's
    steady window starts at the longer of the two manifest warm-ups (or ``warmup_s``)."""
    if b.load_model != c.load_model:
        raise StudyError(f"the studies use different load models: baseline {b.load_model}, "
                         f"candidate {c.load_model}; an open-loop and a closed-loop test do not "
                         "offer the same workload", code="workload_differs",
                         fix="compare two open-loop (or two closed-loop) studies of the same trace")
    bid, cid = b.manifest.run_ids, c.manifest.run_ids
    if set(bid) == set(cid):
        ids = [(r, r) for r in bid]
    else:
        def levels(s: Study):
            return sorted(((r.load_level, r.repeat, r.run_id) for r in s.manifest.runs))

        lb, lc = levels(b), levels(c)
        if not (len(lb) == len(lc)
                and all(math.isclose(x[0], y[0], rel_tol=1e-6) for x, y in zip(lb, lc))):
            fmt = lambda L: ", ".join(f"{rid}@{lvl:g}" for lvl, _, rid in L)  # noqa: E731
            raise StudyError("the studies do not test the same runs: "
                             f"baseline has {len(lb)} run(s) [{fmt(lb)}], candidate has "
                             f"{len(lc)} [{fmt(lc)}]", code="workload_differs",
                             fix="run the candidate on the same load levels (same run ids or the "
                                 "same offered_rps / concurrency per run)")
        ids = [(x[2], y[2]) for x, y in zip(lb, lc)]
    out = []
    for i, (rb, rc) in enumerate(ids):
        sb, sc = b.manifest.run(rb), c.manifest.run(rc)
        w = max(sb.warmup_s or 0.0, sc.warmup_s or 0.0) if warmup_s is None else float(warmup_s)
        out.append(RunPair(i, rb, rc, sb.load_level, sb.repeat, w))
    return out


def check_slo(b: Study, c: Study) -> None:
    """Both manifests may declare an SLO; when both do, they must agree."""
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


# ============================================================================ offered facts


@dataclass(frozen=True)
class Offered:
    """What one side offered in each matched run's steady window.

    ``facts``: one row per pair (pair, run_id, n, first_ns, last_ns, rate_rps, cv, end_ns,
    n_requested = rows with ``max_output_tokens``); ``input_tokens`` and ``requested_output``:
    (run_id, v, c) histograms of the prompts and of the answer lengths asked for."""

    facts: pd.DataFrame
    input_tokens: pd.DataFrame
    requested_output: pd.DataFrame

    def run_hist(self, kind: str, run_id: str) -> pd.DataFrame:
        h = self.input_tokens if kind == "input" else self.requested_output
        return h[h["run_id"] == run_id]

    @property
    def has_requested_output(self) -> bool:
        """Every offered request of every matched run says how many tokens it asked for."""
        f = self.facts
        return bool(len(f)) and bool((f["n_requested"] == f["n"]).all())


def windows_frame(pairs: list[RunPair], side: str) -> pd.DataFrame:
    """(run_id, warmup_ns) of one side's matched runs, to join in SQL."""
    return pd.DataFrame({
        "run_id": [getattr(p, side) for p in pairs],
        "warmup_ns": [int(round(p.warmup_s * C.NS_PER_S)) for p in pairs],
    }).astype({"run_id": "object", "warmup_ns": "int64"})


def offered(study: Study, pairs: list[RunPair], side: str) -> Offered:
    """The offered facts of one side (``side`` = "baseline" or "candidate"), from the events
    of each run's common steady window; ``end_ns`` is the run's last stamp of any request."""
    con = study.con
    con.register("_cmp_win", windows_frame(pairs, side))
    try:
        win = """FROM events e JOIN _cmp_win w USING (run_id)
                 WHERE e.scheduled_ns >= w.warmup_ns"""
        df = con.execute(f"""
            WITH r AS (
                SELECT e.run_id, e.scheduled_ns, e.max_output_tokens,
                       e.scheduled_ns - lag(e.scheduled_ns)
                           OVER (PARTITION BY e.run_id ORDER BY e.scheduled_ns) AS gap
                {win})
            SELECT run_id, count(*) AS n, min(scheduled_ns) AS first_ns,
                   max(scheduled_ns) AS last_ns, count(max_output_tokens) AS n_requested,
                   stddev_pop(gap) / nullif(avg(gap), 0) AS cv
            FROM r GROUP BY run_id""").df().set_index("run_id")
        ends = con.execute("""
            SELECT e.run_id, max(greatest(e.scheduled_ns, e.sent_ns, e.admitted_ns,
                                          e.first_token_ns, e.last_token_ns)) AS end_ns
            FROM events e JOIN _cmp_win w USING (run_id) GROUP BY e.run_id
        """).df().set_index("run_id")
        inp = con.execute(f"SELECT e.run_id, e.input_tokens AS v, count(*) AS c {win} "
                          "GROUP BY ALL").df()
        req = con.execute(f"SELECT e.run_id, e.max_output_tokens AS v, count(*) AS c {win} "
                          "AND e.max_output_tokens IS NOT NULL GROUP BY ALL").df()
    finally:
        con.unregister("_cmp_win")
    rows = []
    for p in pairs:
        rid = getattr(p, side)
        a = df.loc[rid] if rid in df.index else None
        n = int(a["n"]) if a is not None else 0
        first = float(a["first_ns"]) if a is not None else float("nan")
        last = float(a["last_ns"]) if a is not None else float("nan")
        rows.append({
            "pair": p.index, "run_id": rid, "n": n, "first_ns": first, "last_ns": last,
            "rate_rps": measured_rate_rps(n, first, last) if n >= 2 else float("nan"),
            "cv": float(a["cv"]) if a is not None and pd.notna(a["cv"]) else float("nan"),
            "end_ns": float(ends.loc[rid, "end_ns"]) if rid in ends.index else float("nan"),
            "n_requested": int(a["n_requested"]) if a is not None else 0,
        })
    return Offered(pd.DataFrame(rows), inp, req)


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


def cv_noise(cv_b: float, n_b: int, cv_c: float, n_c: int) -> float:
    """Standard error of a difference of two inter-arrival CVs. For exponential gaps the
    sample CV has SE ≈ 1/√n (delta method: n·Var(s/m) = (μ4 − σ⁴)/(4σ²m²) − μ3/m³ + σ⁴/m⁴
    = 2 − 2 + 1 with mean 1); scaled by the CV itself for other processes (floor 0.1)."""
    se = [max(cv, 0.1) / math.sqrt(max(n - 1, 1))
          for cv, n in ((cv_b, n_b), (cv_c, n_c))]
    return math.hypot(*se)


# ============================================================================ pairing


def detect_pairing(b: Study, c: Study, pairs: list[RunPair], off_b: Offered, off_c: Offered,
                   mode: str) -> tuple[bool, pd.DataFrame]:
    """Whether both studies replay the same trace rows, and per pair: matched, missing (in the
    baseline's window, not in the candidate's) and extra requests. Keys: request_id,
    scheduled_ns, input_tokens within matched runs and the common window (joined in DuckDB)."""
    b.con.register("_cmp_win", windows_frame(pairs, "baseline"))
    try:
        keys = b.con.sql("""
            SELECT e.run_id, e.request_id, e.scheduled_ns, e.input_tokens
            FROM events e JOIN _cmp_win w USING (run_id) WHERE e.scheduled_ns >= w.warmup_ns
        """).to_arrow_table()
    finally:
        b.con.unregister("_cmp_win")
    runmap = windows_frame(pairs, "candidate").assign(
        b_run=[p.baseline for p in pairs], pair=[p.index for p in pairs])
    con = c.con
    con.register("_cmp_base_keys", keys)
    con.register("_cmp_runmap", runmap)
    try:
        df = con.execute("""
            WITH bk AS (SELECT m.pair, k.request_id, k.scheduled_ns, k.input_tokens
                        FROM _cmp_base_keys k JOIN _cmp_runmap m ON k.run_id = m.b_run),
                 ck AS (SELECT m.pair, e.request_id, e.scheduled_ns, e.input_tokens
                        FROM events e JOIN _cmp_runmap m ON e.run_id = m.run_id
                        WHERE e.scheduled_ns >= m.warmup_ns)
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
    out = pd.DataFrame({"pair": [p.index for p in pairs]}).merge(df, on="pair", how="left")
    out = out.fillna({"matched": 0, "missing": 0, "extra": 0}).astype(
        {"matched": "int64", "missing": "int64", "extra": "int64"})
    nb = off_b.facts["n"].to_numpy()
    nc = off_c.facts["n"].to_numpy()
    same_trace = bool(np.all(out["matched"].to_numpy() >= 0.5 * np.maximum(np.maximum(nb, nc), 1)))
    if mode == "paired" and not same_trace:
        raise SpecError("pairing: paired was asked for, but the studies do not replay the same "
                        "trace rows (request_id, scheduled_ns, input_tokens per run)",
                        field="workload.pairing", fix="use pairing: auto or independent")
    paired = same_trace if mode == "auto" else mode == "paired"
    return paired, out


# ============================================================================ refusal


def check_workload(b: Study, c: Study, pairs: list[RunPair], off_b: Offered, off_c: Offered,
                   rules: WorkloadRules, paired: bool) -> list[str]:
    """Refuse (StudyError, exit 2) when the *offered* workload differs beyond sampling noise:
    rates and request counts per run, prompt lengths, requested answer lengths, the arrival
    process. A replayed trace (``paired``) offered the same rows by construction: requests the
    candidate lacks are counted by the missing-requests gate, not refused. Returns notes."""
    probs: list[Problem] = []
    notes: list[str] = []
    closed = b.load_model == C.LoadModel.CLOSED.value
    for p in pairs:
        fb, fc = off_b.facts.iloc[p.index], off_c.facts.iloc[p.index]
        run = p.label
        nb, nc = int(fb["n"]), int(fc["n"])
        if nb == 0 or nc == 0:
            probs.append(Problem(f"run {run}: offered requests in the steady window: "
                                 f"baseline {nb:,}, candidate {nc:,}"))
            continue
        noise = NOISE_SDS * math.sqrt(1.0 / nb + 1.0 / nc)  # Poisson SDs of a relative difference
        sb, sc = b.manifest.run(p.baseline), c.manifest.run(p.candidate)
        if closed:
            if sb.concurrency != sc.concurrency:
                probs.append(Problem(f"run {run}: concurrency {sb.concurrency} vs "
                                     f"{sc.concurrency}"))
        elif not paired:
            rel = abs(fc["rate_rps"] / fb["rate_rps"] - 1.0)
            if rel > max(rules.rate_tolerance_rel, noise):
                probs.append(Problem(
                    f"run {run}: offered rate (measured from scheduled_ns) baseline "
                    f"{fb['rate_rps']:.4g} req/s, candidate {fc['rate_rps']:.4g} req/s "
                    f"({100 * (fc['rate_rps'] / fb['rate_rps'] - 1):+.1f} %; allowed "
                    f"{100 * max(rules.rate_tolerance_rel, noise):.1f} %)"))
            # closed loop: the count is an outcome (a faster system sends more), not offered
            if abs(nc / nb - 1.0) > max(rules.count_tolerance_rel, noise):
                probs.append(Problem(f"run {run}: offered requests in the steady window "
                                     f"baseline {nb:,}, candidate {nc:,} "
                                     f"({100 * (nc / nb - 1):+.1f} %)"))
        for kind, what in (("input", "input tokens"),
                           ("output", "requested output tokens (max_output_tokens)")):
            hb, hc = off_b.run_hist(kind, p.baseline), off_c.run_hist(kind, p.candidate)
            n1, n2 = hb["c"].sum(), hc["c"].sum()
            if n1 == 0 or n2 == 0:
                continue
            d = ks_distance(hb["v"].to_numpy(), hb["c"].to_numpy(), hc["v"].to_numpy(),
                            hc["c"].to_numpy())
            crit = ks_critical(n1, n2, 2 * len(pairs))
            if d > max(rules.token_ks_max, crit):
                mb = np.average(hb["v"], weights=hb["c"])
                mc = np.average(hc["v"], weights=hc["c"])
                probs.append(Problem(f"run {run}: {what} distribution differs (KS distance "
                                     f"{d:.3f}; mean {mb:,.1f} vs {mc:,.1f})"))
        if not closed:
            if sb.arrival not in ("unknown", None) and sc.arrival not in ("unknown", None) \
                    and sb.arrival != sc.arrival:
                probs.append(Problem(f"run {run}: arrival process {sb.arrival} vs {sc.arrival}"))
            elif np.isfinite(fb["cv"]) and np.isfinite(fc["cv"]):
                allowed = max(rules.arrival_cv_tolerance,
                              NOISE_SDS * cv_noise(fb["cv"], nb, fc["cv"], nc))
                if abs(fb["cv"] - fc["cv"]) > allowed:
                    probs.append(Problem(f"run {run}: arrival process differs: inter-arrival "
                                         f"CV {fb['cv']:.2f} vs {fc['cv']:.2f} (allowed "
                                         f"± {allowed:.2f}; Poisson ≈ 1, constant ≈ 0)"))
    if probs:
        lines = "\n".join(f"    - {p.message}" for p in probs)
        raise StudyError(problems=[Problem(
            "baseline and candidate do not offer the same workload; they are not put side by "
            f"side:\n{lines}", file=f"{b.root} vs {c.root}",
            fix="replay the same trace (same rates, requests, token lengths and arrival process) "
                "on both systems; tolerances: gates.yaml 'workload:'", code="workload_differs")])
    missing = [lab for lab, off in (("baseline", off_b), ("candidate", off_c))
               if not off.has_requested_output]
    if missing:
        notes.append("requested answer lengths (max_output_tokens) are not recorded for every "
                     f"request in the {' and '.join(missing)}: the offered output lengths were "
                     "not compared (tokens received are an outcome, never a workload check)")
    return notes
