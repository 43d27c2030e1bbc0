"""The measured prefix-cache effect of a study: hit rates, computed vs logical prefill work, and
the SLO split by hit and miss — all from the one reduction (``capplan.reduce`` with the
``cache`` cell dimension), never from a second pass over the rows.

A request is a **hit** when the server found part of its prompt in its prefix cache
(``computed_input_tokens`` < ``input_tokens``), a **miss** when it computed the whole prompt, and
**unknown** where the study does not stamp ``computed_input_tokens`` (unknown requests stay in
every denominator that does not need the split, and are counted out loud).

- request hit rate = hits / requests with a known cache outcome;
- token hit rate = 1 − Σ computed / Σ input over those requests (the share of prompt tokens the
  cache saved);
- logical and computed prefill tokens/s = Σ input / Σ computed prompt tokens of requests that got
  a first token, per second of the steady window (first to last scheduled request);
- attainment and TTFT (p50, p99 with the sample-size rule) of hits and of misses.

The four cache conditions of a run (``cache_condition`` in study.yaml: cold model, warm model
with cold KV, production warm, adversarial) are labels the comparison checks
(``check_cache_conditions``): numbers measured under different conditions are not comparable.
docs/scenarios.md, "Measured cache effect".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import contract as C
from . import sketch
from .earlystop import n_min
from .errors import SpecError, StudyError
from .present import fmt
from .reduce import Cells, TimeUnits, bucket_labels, reduce_study
from .slo import SLO
from .study import Study, open_study

#: default prompt-length buckets of the per-bucket hit rates (tokens)
INPUT_EDGES = (512.0, 2048.0, 8192.0)
#: confidence of the sample-size rule for percentiles (as ``capplan summarize``)
CONFIDENCE = 0.99

CONDITION_LABELS = {
    "cold_model": "cold model",
    "warm_model_cold_kv": "warm model, cold KV cache",
    "production_warm": "production warm",
    "adversarial": "adversarial (built to miss)",
}


def _pct(hist_counts: np.ndarray, k0: int, p: float, n: int, alpha: float) -> float:
    """A percentile from a pooled histogram, NaN below the early-stopping minimum."""
    if n < n_min(p, 1, CONFIDENCE) or hist_counts.sum() <= 0:
        return math.nan
    return float(sketch.quantile_from_counts(hist_counts, k0, p, alpha))


def _pooled_hist(cs, cell_ids: np.ndarray, metric: str) -> tuple[int, np.ndarray]:
    """Histogram of ``metric`` over the given cells, pooled over units."""
    unit, cell, key, cnt = cs.hist[metric]
    m = np.isin(cell, cell_ids)
    if not m.any():
        return 0, np.zeros(0)
    k = key[m]
    k0 = int(k.min())
    return k0, np.bincount(k - k0, weights=cnt[m])


@dataclass(frozen=True)
class CacheEffect:
    """The measured cache effect (module docstring). ``runs``: one row per run; ``buckets``:
    one row per (run, prompt-length bucket); ``split``: one row per (run, hit / miss / unknown).
    ``conditions``: each run's labelled cache condition (None: not labelled)."""

    slo: SLO
    runs: pd.DataFrame = field(repr=False)
    buckets: pd.DataFrame = field(repr=False)
    split: pd.DataFrame = field(repr=False)
    conditions: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_frame(self) -> pd.DataFrame:
        return self.runs.copy()

    def display_frame(self) -> pd.DataFrame:
        """The per-run table with headers for people."""
        d = self.runs
        return pd.DataFrame({
            "Run": d["run_id"], "Offered (req/s)": d["load_level"],
            "Cache condition": [CONDITION_LABELS.get(c, "not labelled") if c else "not labelled"
                                for c in d["cache_condition"]],
            "Requests": d["requests"], "Known": d["known"], "Hits": d["hits"],
            "Request hit rate": d["request_hit_rate"], "Token hit rate": d["token_hit_rate"],
            "Logical prefill (tok/s)": d["logical_prefill_tok_s"],
            "Computed prefill (tok/s)": d["computed_prefill_tok_s"],
            "Attainment, hits": d["attainment_hit"], "Attainment, misses": d["attainment_miss"],
            "TTFT p99 hits (ms)": d[C.pct_col("ttft_hit", 0.99)],
            "TTFT p99 misses (ms)": d[C.pct_col("ttft_miss", 0.99)],
        })

    def to_text(self) -> str:
        lines = [f"Prefix-cache effect (SLO {self.slo})"]
        for r in self.runs.to_dict("records"):
            cond = CONDITION_LABELS.get(r["cache_condition"], "not labelled") if r["cache_condition"] else "not labelled"
            lines.append(
                f"  {r['run_id']} ({r['load_level']:g}, {cond}): {r['hits']:,} hits of {r['known']:,} known "
                f"({fmt(r['request_hit_rate'], '.1%')} of requests, {fmt(r['token_hit_rate'], '.1%')} of prompt "
                f"tokens); prefill {fmt(r['logical_prefill_tok_s'], ',.0f')} logical vs "
                f"{fmt(r['computed_prefill_tok_s'], ',.0f')} computed tok/s; attainment hits "
                f"{fmt(r['attainment_hit'], '.3f')} / misses {fmt(r['attainment_miss'], '.3f')}; TTFT p99 hits "
                f"{fmt(r[C.pct_col('ttft_hit', 0.99)], ',.0f')} / misses {fmt(r[C.pct_col('ttft_miss', 0.99)], ',.0f')} ms")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        d = self.runs
        fig = make_subplots(rows=1, cols=2, subplot_titles=("Hit rate by run", "Attainment: hits vs misses"))
        fig.add_trace(go.Bar(x=d["run_id"], y=d["request_hit_rate"], name="requests with a hit"), 1, 1)
        fig.add_trace(go.Bar(x=d["run_id"], y=d["token_hit_rate"], name="prompt tokens from the cache"), 1, 1)
        fig.add_trace(go.Scatter(x=d["load_level"], y=d["attainment_hit"], mode="lines+markers", name="hits"), 1, 2)
        fig.add_trace(go.Scatter(x=d["load_level"], y=d["attainment_miss"], mode="lines+markers", name="misses"),
                      1, 2)
        fig.add_hline(y=self.slo.attainment, line_dash="dot", row=1, col=2)
        fig.update_yaxes(tickformat=".0%", row=1, col=1)
        fig.update_xaxes(title_text="offered rate", row=1, col=2)
        fig.update_layout(template="plotly_white", barmode="group")
        return fig


def cache_effect(study, slo, *, warmup="manifest", input_edges=INPUT_EDGES) -> CacheEffect:
    """The measured cache effect of ``study`` under ``slo`` (module docstring), from one
    reduction with cells (prompt-length bucket × cache outcome)."""
    study = open_study(study) if not isinstance(study, Study) else study
    slo = SLO.parse(slo)
    if not study.has("computed_input_tokens"):
        raise StudyError("the study does not stamp computed_input_tokens: no prefix-cache outcome is known",
                         file=str(study.root / C.EVENTS_DIR), column="computed_input_tokens",
                         fix="write the prompt tokens the server computed per request (input_tokens minus the "
                             "tokens its prefix cache supplied; importers fill it where the tool reports it)")
    edges = tuple(float(e) for e in input_edges)
    stats = reduce_study(study, slo, warmup=warmup, cells=Cells(input_edges=edges, cache=True, hist=("ttft",)))
    ci = stats.cell_index
    labels = bucket_labels(edges)
    conditions = {r.run_id: r.cache_condition for r in study.manifest.runs}
    runs, buckets, split = [], [], []
    for rs in stats.runs:
        cs = rs.cells
        tot = {k: v.sum(axis=0) for k, v in cs.sums.items()}  # per cell
        cache = ci["cache"].to_numpy()
        known = cache != "unknown"
        hit = cache == "hit"

        def s(name, mask):
            return float(tot[name][mask].sum())

        n, n_known, n_hit = s("n", np.ones_like(known)), s("n", known), s("n", hit)
        inp_k, comp_k = s("input_tokens", known), s("computed_input_tokens", known)
        span = rs.span_s if rs.span_s and rs.span_s > 0 else math.nan
        row = {"run_id": rs.run_id, "load_level": rs.load_level, "cache_condition": conditions.get(rs.run_id),
               "requests": int(n), "known": int(n_known), "hits": int(n_hit), "unknown": int(n - n_known),
               "request_hit_rate": n_hit / n_known if n_known else math.nan,
               "token_hit_rate": 1.0 - comp_k / inp_k if inp_k else math.nan,
               "logical_prefill_tok_s": s("input_tokens_started", np.ones_like(known)) / span,
               "computed_prefill_tok_s": s("computed_input_tokens_started", np.ones_like(known)) / span,
               "window_s": span}
        for lab in ("hit", "miss", "unknown"):
            m = cache == lab
            nn, ng = s("n", m), s("n_good", m)
            k0, h = _pooled_hist(cs, np.flatnonzero(m), "ttft")
            n_ok = int(s("n_ok", m))
            rec = {"run_id": rs.run_id, "load_level": rs.load_level, "cache": lab, "requests": int(nn),
                   "good": int(ng), "ok": n_ok, "attainment": ng / nn if nn else math.nan}
            for p in (0.5, 0.99):
                rec[C.pct_col("ttft", p)] = _pct(h, k0, p, n_ok, stats.alpha)
            split.append(rec)
            if lab != "unknown":
                row[f"attainment_{lab}"] = rec["attainment"]
                row[f"requests_{lab}"] = int(nn)
                for p in (0.5, 0.99):
                    row[C.pct_col(f"ttft_{lab}", p)] = rec[C.pct_col("ttft", p)]
        runs.append(row)
        for b, lab in enumerate(labels):
            inb = ci["input_bucket"].to_numpy() == b
            nk, nh = s("n", inb & known), s("n", inb & hit)
            ik, ck = s("input_tokens", inb & known), s("computed_input_tokens", inb & known)
            buckets.append({"run_id": rs.run_id, "load_level": rs.load_level, "input_bucket": lab,
                            "requests": int(s("n", inb)), "known": int(nk), "hits": int(nh),
                            "request_hit_rate": nh / nk if nk else math.nan,
                            "token_hit_rate": 1.0 - ck / ik if ik else math.nan,
                            "attainment": s("n_good", inb) / s("n", inb) if s("n", inb) else math.nan})
    notes = []
    unk = sum(r["unknown"] for r in runs)
    if unk:
        notes.append(f"{unk:,} requests have no computed_input_tokens: counted in every run total, "
                     "left out of the hit rates and of the hit / miss split")
    labelled = {c for c in conditions.values() if c}
    if len(labelled) > 1:
        notes.append("the runs were measured under different cache conditions ("
                     + ", ".join(sorted(CONDITION_LABELS[c] for c in labelled)) + "): compare like with like")
    notes.append("TTFT percentiles need enough requests in the group (p50: "
                 f"{n_min(0.5, 1, CONFIDENCE)}, p99: {n_min(0.99, 1, CONFIDENCE)}); blank otherwise")
    return CacheEffect(slo=slo, runs=pd.DataFrame(runs), buckets=pd.DataFrame(buckets),
                       split=pd.DataFrame(split), conditions=conditions, notes=tuple(notes))


def cache_timeline(study, slo, *, window_s: float = 10.0, run_id: str | None = None) -> pd.DataFrame:
    """Hit rate, attainment and TTFT p99 per time window of each run (the whole run, warm-up
    included, windows from 0): what a cache flush does over time. One reduction with
    ``TimeUnits(window_s)`` and the cache cell."""
    study = open_study(study) if not isinstance(study, Study) else study
    slo = SLO.parse(slo)
    ids = [r.run_id for r in study.manifest.runs if run_id is None or r.run_id == run_id]
    if not ids:
        raise SpecError(f"no run {run_id!r} in the study", field="run_id",
                        fix="one of " + ", ".join(r.run_id for r in study.manifest.runs))
    stats = reduce_study(study, slo, warmup="none",
                         units=TimeUnits(float(window_s), origin_s={r: 0.0 for r in study.manifest.run_ids}),
                         cells=Cells(cache=True, hist=("ttft",)))
    cache = stats.cell_index["cache"].to_numpy()
    rows = []
    for rs in stats.runs:
        if rs.run_id not in ids:
            continue
        cs = rs.cells
        n, good = cs.sums["n"], cs.sums["n_good"]
        known = cache != "unknown"
        hit = cache == "hit"
        inp, comp = cs.sums["input_tokens"], cs.sums["computed_input_tokens"]
        unit, cell, key, cnt = cs.hist["ttft"]
        for u in range(rs.n_units):
            nk = n[u, known].sum()
            sel = unit == u
            n_ok = int(cs.sums["n_ok"][u].sum())
            p99 = math.nan
            if sel.any() and n_ok >= n_min(0.99, 1, CONFIDENCE):
                k0 = int(key[sel].min())
                p99 = float(sketch.quantile_from_counts(np.bincount(key[sel] - k0, weights=cnt[sel]), k0, 0.99,
                                                        stats.alpha))
            rows.append({"run_id": rs.run_id, "t_s": u * float(window_s), "requests": int(n[u].sum()),
                         "request_hit_rate": n[u, hit].sum() / nk if nk else math.nan,
                         "token_hit_rate": 1 - comp[u, known].sum() / inp[u, known].sum()
                         if inp[u, known].sum() else math.nan,
                         "attainment": good[u].sum() / n[u].sum() if n[u].sum() else math.nan,
                         C.pct_col("ttft", 0.99): p99})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- conditions

def check_cache_conditions(baseline: C.Manifest, candidate: C.Manifest, pairs, *,
                           allow: bool = False) -> list[str]:
    """Refuse (StudyError) to compare matched runs labelled with different cache conditions,
    unless ``allow``; returns the notes to state (a mismatch allowed, a side not labelled).
    ``pairs``: (baseline run id, candidate run id)."""
    cb = {r.run_id: r.cache_condition for r in baseline.runs}
    cc = {r.run_id: r.cache_condition for r in candidate.runs}
    differ = [(b, c, cb.get(b), cc.get(c)) for b, c in pairs
              if cb.get(b) and cc.get(c) and cb.get(b) != cc.get(c)]
    notes = []
    if differ:
        text = "; ".join(f"{b} ({CONDITION_LABELS[x]}) vs {c} ({CONDITION_LABELS[y]})" for b, c, x, y in differ)
        if not allow:
            raise StudyError("the matched runs were measured under different prefix-cache conditions: " + text,
                             column="runs[].cache_condition (study.yaml)",
                             fix="compare runs measured in the same cache state (cold model, warm model with cold "
                                 "KV, production warm, adversarial), or pass --allow-cache-mismatch to compare "
                                 "them anyway (the difference then includes the cache's)")
        notes.append("compared across prefix-cache conditions (allowed): " + text
                     + " — the differences include the cache state's effect")
    one_sided = [(b, c) for b, c in pairs if bool(cb.get(b)) != bool(cc.get(c))]
    if one_sided:
        notes.append("cache condition labelled on one side only for " + ", ".join(f"{b}/{c}" for b, c in one_sided)
                     + ": the comparison cannot check that both ran in the same cache state")
    return notes


def timeline_figure(tl: pd.DataFrame, target: float | None = None):
    """Hit rate and attainment per window (``cache_timeline``), one line per run."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("Requests with a prefix-cache hit",
                                                                           "Attainment"))
    for run, d in tl.groupby("run_id", sort=False):
        fig.add_trace(go.Scatter(x=d["t_s"], y=d["request_hit_rate"], mode="lines", name=f"{run} hit rate"), 1, 1)
        fig.add_trace(go.Scatter(x=d["t_s"], y=d["attainment"], mode="lines", name=f"{run} attainment"), 2, 1)
    if target is not None:
        fig.add_hline(y=target, line_dash="dot", row=2, col=1)
    fig.update_yaxes(tickformat=".0%")
    fig.update_xaxes(title_text="time in the run (s, window start)", row=2, col=1)
    fig.update_layout(template="plotly_white", height=520)
    return fig


# ----------------------------------------------------------------------------- the workload's prefixes

def prefix_workload(study, *, warmup="manifest"):
    """The shared prefixes a study's requests show, as a ``capplan.sim.prefix.PrefixWorkload``
    a twin's scenario can replay (docs/scenarios.md, "Shared prefixes from a study"):

    - with ``session_id``: conversations — turns = requests per session (mean), active =
      conversations open at once (Σ session spans + one mean gap each, over the window's span),
      system prompt = the prefix below;
    - else with ``prefix_group``: system prompts — groups = distinct groups, share = requests
      with a group, Zipf exponent = the least-squares slope of log(requests) on log(rank);
    - prompt tokens of the shared prefix = the median cached tokens (``input_tokens −
      computed_input_tokens``) of the hits with a group (or of all hits without groups).

    Returns (PrefixWorkload, notes). Raises StudyError when the study shows no prefix at all."""
    from .metrics import Window, request_view
    from .sim.prefix import PrefixWorkload

    study = open_study(study) if not isinstance(study, Study) else study
    if not (study.has("prefix_group") or study.has("session_id")):
        raise StudyError("the study labels no shared prefixes (prefix_group, session_id)",
                         file=str(study.root / C.EVENTS_DIR), column="prefix_group",
                         fix="write prefix_group (the system prompt a request starts with) or session_id "
                             "(its conversation), or give the scenario's prefixes by hand")
    window = warmup if isinstance(warmup, Window) else Window.of(study, None if warmup == "manifest" else warmup)
    view = request_view(study, window)
    rows = study.sql(f"""SELECT prefix_group, session_id, scheduled_ns, cached_input_tokens
                         FROM {view} WHERE in_window ORDER BY run_id, scheduled_ns""").df()
    notes = []
    hits = rows["cached_input_tokens"]
    grouped = rows["prefix_group"].notna()
    cached = hits[(hits > 0) & (grouped if grouped.any() else True)]
    tokens = int(round(float(cached.median()))) if len(cached) else 0
    if not study.has("computed_input_tokens"):
        notes.append("no computed_input_tokens: the shared prefix's length is unknown, set prefixes.tokens by hand")
    n = len(rows)
    if rows["session_id"].notna().any():
        s = rows[rows["session_id"].notna()]
        per = s.groupby("session_id")["scheduled_ns"].agg(["count", "min", "max"])
        turns = float(per["count"].mean())
        gap = float(((per["max"] - per["min"]) / (per["count"] - 1).clip(lower=1)).mean())
        span = float(rows["scheduled_ns"].max() - rows["scheduled_ns"].min()) or 1.0
        active = max(1, int(round(float((per["max"] - per["min"] + gap).sum()) / span)))
        notes.append(f"{len(per):,} conversations, {turns:.2g} turns on average, about {active} open at once")
        return PrefixWorkload(kind="sessions", active=active, turns=max(1.0, turns), tokens=tokens), tuple(notes)
    counts = rows.loc[grouped, "prefix_group"].value_counts().to_numpy(float)
    zipf = 0.0
    if len(counts) > 2:
        slope = np.polyfit(np.log(np.arange(1, len(counts) + 1)), np.log(counts), 1)[0]
        zipf = max(0.0, float(-slope))
    notes.append(f"{len(counts)} prefix group(s) on {grouped.mean():.1%} of {n:,} requests, popularity Zipf "
                 f"{zipf:.2f}; shared prefix {tokens:,} tokens (median cached tokens of the hits)")
    return PrefixWorkload(kind="system", groups=max(1, len(counts)), tokens=tokens, share=float(grouped.mean()),
                          zipf=zipf), tuple(notes)
