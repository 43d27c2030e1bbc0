"""Agent and RAG fan-out: capacity in *root* requests per second from the per-call C_SLO
(docs/fanout.md).

A root request (an agent's task, a RAG question) makes k model calls in D sequential steps;
the calls of one step run in parallel and the root waits for the slowest, and between steps a
tool runs while the finished calls' KV may stay parked. Three things follow, each a formula of
docs/fanout.md:

- **calls**: a root rate λ_r offers λ_r · E[k] calls per second, so with the calls binding the
  root capacity is C_call / E[k];
- **tail amplification**: a root is good only when all its calls are; with independent calls
  good with probability p, a root of k calls is good with probability p^k, and over the
  fan-out distribution a_root(p) = Σ_r w_r p^{k_r}. The per-call attainment a root target
  needs is the p solving a_root(p) = target (p = target^{1/k} for a fixed k), and the per-call
  capacity is C_SLO *at that attainment* — the envelope re-fitted there. A root's latency is the
  sum over its steps of the slowest call, plus its tools: Σ_d max_{i ∈ d} L_i + T_tools, so a
  root E2E limit L_root is met when every call meets (L_root − T_tools) / D_max;
- **KV held while a tool runs**: sequences held × tool time per root, S = Σ_gaps width_d · gap_d
  (and in tokens, Σ tokens_d · gap_d); at a root rate λ_r, Little's law gives λ_r · E[S] held
  on average. With the KV tokens of the measured system given, λ_r · E[S_tokens] ≤ KV tokens
  bounds the root rate too, and the smaller bound binds.

The fan-out comes from the study (``agent_root``, ``branch_depth``: ``measure_fanout``) or is
given (``given_fanout``). ``root_capacity`` is the arithmetic from a per-call capacity;
``fanout_capacity`` fits the envelope at the per-call attainment needed and calls it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from . import spec as S
from .errors import SpecError, StudyError
from .slo import SLO

#: columns of a fan-out's per-root table
ROOT_COLUMNS = ("root", "calls", "depths", "width_max", "tool_s", "held_seq_s", "held_token_s",
                "latency_s", "good", "weight")


@dataclass(frozen=True)
class FanOut:
    """Roots and their calls: one row per root (``ROOT_COLUMNS``) — calls k, sequential steps
    D, the widest step, tool time between steps, sequences held × tool time (and tokens held ×
    tool time), and for measured roots the root's latency and whether every call was good;
    ``weight`` is the root's share (1 per measured root)."""

    roots: pd.DataFrame = field(repr=False)
    source: str
    notes: tuple[str, ...] = ()
    #: measured: the share of the counted roots' calls that were good (NaN without an SLO)
    call_good: float = math.nan

    @property
    def share(self) -> np.ndarray:
        w = self.roots["weight"].to_numpy(float)
        return w / w.sum()

    @property
    def mean_calls(self) -> float:
        return float(np.dot(self.share, self.roots["calls"].to_numpy(float)))

    @property
    def max_depth(self) -> int:
        return int(self.roots["depths"].max())

    def mean(self, column: str) -> float:
        """The root-weighted mean of a per-root column (NaN rows left out)."""
        v = self.roots[column].to_numpy(float)
        ok = ~np.isnan(v)
        if not ok.any():
            return math.nan
        w = self.roots["weight"].to_numpy(float)[ok]
        return float(np.dot(w, v[ok]) / w.sum())

    def distribution(self) -> pd.DataFrame:
        """Share of roots per (calls, steps)."""
        df = self.roots.assign(share=self.share)
        return (df.groupby(["calls", "depths"], as_index=False)["share"].sum()
                .sort_values(["calls", "depths"]).reset_index(drop=True))

    def root_attainment(self, p: float) -> float:
        """a_root(p) = Σ_r w_r p^{k_r}: roots good when every call is, calls independent."""
        return float(np.dot(self.share, float(p) ** self.roots["calls"].to_numpy(float)))

    def call_attainment_needed(self, root_target: float) -> float:
        """The per-call attainment p with a_root(p) = ``root_target`` (a_root rises from 0 to 1
        with p, so the root is unique)."""
        t = float(root_target)
        if not 0.0 < t < 1.0:
            raise SpecError(f"a root attainment target is a probability in (0, 1), got {t}",
                            field="--root-attainment", fix="e.g. --root-attainment 0.99")
        ks = self.roots["calls"].to_numpy(float)
        if np.allclose(ks, ks[0]):
            return t ** (1.0 / ks[0])
        return float(brentq(lambda p: self.root_attainment(p) - t, 0.0, 1.0, xtol=1e-15))


def given_fanout(calls, *, depth: int = 1, tool_s: float = 0.0,
                 context_tokens: float | None = None) -> FanOut:
    """A fan-out distribution given: ``calls`` a number k (every root makes k calls) or a
    {k: share} map; each root's calls in ``depth`` sequential steps of k / depth parallel calls,
    with ``tool_s`` of tool between steps, holding the step's calls (of ``context_tokens`` each,
    when given) meanwhile."""
    dist = {calls: 1.0} if not isinstance(calls, dict) else dict(calls)
    D = S.number(depth, "--depth", integer=True, minimum=1, example="2")
    T = S.number(tool_s, "--tool-s", minimum=0.0, example="1.5")
    ctx = S.number(context_tokens, "--context-tokens", above=0.0, optional=True, example="4000")
    rows = []
    for k, w in dist.items():
        k = S.number(k, "--fanout", integer=True, minimum=1, example="4", text_ok=True)
        w = S.number(w, "--fanout", above=0.0, example="4:0.5,1:0.5", text_ok=True)
        if k < D:
            raise SpecError(f"a root of {k} call(s) cannot have {D} sequential steps",
                            field="--depth", fix=f"use --depth ≤ {k}")
        held = k / D * (D - 1) * T  # each of the D − 1 tool waits holds one step's k/D calls
        rows.append({"root": f"k={k}", "calls": k, "depths": D, "width_max": math.ceil(k / D),
                     "tool_s": (D - 1) * T, "held_seq_s": held,
                     "held_token_s": held * ctx if ctx is not None else math.nan,
                     "latency_s": math.nan, "good": None, "weight": float(w)})
    text = ", ".join(f"{r['calls']} calls ({r['weight'] / sum(x['weight'] for x in rows):.0%})"
                     for r in rows)
    return FanOut(pd.DataFrame(rows, columns=list(ROOT_COLUMNS)),
                  f"given: {text}; {D} sequential step(s), {T:g} s of tool between steps")


def parse_fanout(text: str) -> dict[int, float]:
    """``"4"`` → {4: 1}; ``"1:0.5,4:0.3,8:0.2"`` → calls per root with their shares."""
    out: dict[int, float] = {}
    for part in str(text).split(","):
        k, _, w = part.strip().partition(":")
        k = S.number(k.strip(), "--fanout", integer=True, minimum=1, text_ok=True,
                     example="4 or 1:0.5,4:0.5")
        out[k] = out.get(k, 0.0) + S.number(w.strip() or "1", "--fanout", above=0.0,
                                             text_ok=True, example="4 or 1:0.5,4:0.5")
    return out


def measure_fanout(study, slo: SLO | str | None = None, *, warmup_s=None) -> FanOut:
    """The fan-out the study shows: calls grouped by ``agent_root`` (a call without one is a
    root of its own), steps by ``branch_depth`` (missing: 0). Per root: calls, steps, the
    widest step; per gap between steps d and d + 1 the tool time = the first call of d + 1's
    scheduled time − the last token of step d, holding step d's calls (and their input + output
    tokens); the root's latency = its last token − its first call's scheduled time; with an SLO,
    whether every call was good. Roots whose first call is in the warm-up are left out."""
    from .metrics import Window, good_predicate, request_view
    from .study import Study, open_study

    st = study if isinstance(study, Study) else open_study(study)
    if not st.has("agent_root"):
        raise StudyError("the study labels no agent roots (agent_root)", file=str(st.root),
                         column="agent_root",
                         fix="write agent_root (the root request each model call was made for) and "
                             "branch_depth (its step), or give the fan-out: --fanout 4 [--depth 2]")
    view = request_view(st, Window.of(st, warmup_s))
    good, params = good_predicate(SLO.parse(slo), "r") if slo is not None else ("NULL", [])
    df = st.sql(f"""
        SELECT r.run_id, e.agent_root, coalesce(e.branch_depth, 0) AS depth, r.request_id,
               r.scheduled_ns, r.last_token_ns, r.input_tokens + r.output_tokens AS tokens,
               r.in_window, {good} AS good
        FROM {view} r JOIN {st.events_view} e
             ON r.run_id = e.run_id AND r.request_id = e.request_id""", params).df()
    return fanout_from_calls(df, source=f"measured: {st.name} (agent_root, branch_depth)")


def fanout_from_calls(calls: pd.DataFrame, *, source: str = "measured") -> FanOut:
    """The per-root table from one row per call (``run_id``, ``agent_root`` or null,
    ``depth``, ``scheduled_ns``, ``last_token_ns`` or null, ``tokens``, ``in_window``,
    ``good`` or null) — ``measure_fanout`` without the study."""
    df = calls.copy()
    notes = []
    single = df["agent_root"].isna()
    if single.any():
        notes.append(f"{int(single.sum()):,} call(s) without agent_root count as roots of one call")
    df["root"] = np.where(single, "~" + df["request_id"].astype(str), df["agent_root"].astype(str))
    df["root"] = df["run_id"].astype(str) + "/" + df["root"]
    first = df.groupby("root")["scheduled_ns"].transform("min")
    in_win = df.loc[df["scheduled_ns"] == first].groupby("root")["in_window"].first()
    lvl = df.groupby(["root", "depth"], as_index=False).agg(
        width=("request_id", "size"), start_ns=("scheduled_ns", "min"),
        end_ns=("last_token_ns", lambda s: s.max() if s.notna().all() else np.nan),
        tokens=("tokens", "sum")).sort_values(["root", "depth"])
    nxt = lvl.groupby("root")["start_ns"].shift(-1)
    gap = ((nxt - lvl["end_ns"].astype(float)) / 1e9).clip(lower=0.0)
    lvl = lvl.assign(gap_s=gap, held_seq_s=lvl["width"] * gap, held_token_s=lvl["tokens"] * gap)
    agg = lvl.groupby("root").agg(
        calls=("width", "sum"), depths=("depth", "size"), width_max=("width", "max"),
        tool_s=("gap_s", lambda s: s.sum(min_count=1) if len(s) > 1 else 0.0),
        held_seq_s=("held_seq_s", lambda s: s.sum(min_count=1) if len(s) > 1 else 0.0),
        held_token_s=("held_token_s", lambda s: s.sum(min_count=1) if len(s) > 1 else 0.0),
        start_ns=("start_ns", "min"),
        end_ns=("end_ns", lambda s: s.max() if s.notna().all() else np.nan))
    agg["latency_s"] = (agg["end_ns"] - agg["start_ns"]) / 1e9
    keep = in_win.reindex(agg.index).fillna(False).astype(bool)
    call_good = math.nan
    if df["good"].notna().all() and len(df):
        agg["good"] = df.groupby("root")["good"].all()
        call_good = float(df.loc[df["root"].isin(keep.index[keep]), "good"].astype(bool).mean())
    else:
        agg["good"] = None
    agg = agg[keep]
    if agg.empty:
        raise StudyError("no root request starts after the warm-up", column="agent_root",
                         fix="check warmup_s in study.yaml, or pass warmup_s=0")
    agg = agg.reset_index().assign(weight=1.0)
    unfinished = int(agg["latency_s"].isna().sum())
    if unfinished:
        notes.append(f"{unfinished:,} root(s) with a call that never finished: no latency or tool "
                     "time after that step")
    return FanOut(agg[list(ROOT_COLUMNS)], source, tuple(notes), call_good)


@dataclass(frozen=True)
class FanOutCapacity:
    """Capacity in root requests per second (docs/fanout.md): the per-call C_SLO at the
    per-call attainment the root target needs, over the mean calls per root, against the KV
    the tools park. Prints (``to_text``), tabulates (``to_frame``, ``distribution``) and
    draws (``figure``) itself."""

    fanout: FanOut = field(repr=False)
    per_call_rps: float
    per_call_source: str
    call_attainment: float  # the per-call attainment the per-call capacity holds at
    call_attainment_needed: float  # the per-call attainment the root target needs
    root_target: float
    root_attainment_at_capacity: float  # a_root(call_attainment)
    mean_calls: float
    root_rps_calls: float
    root_rps_kv: float
    root_rps: float
    binding: str
    held_sequences: float
    held_kv_tokens: float
    kv_tokens: float | None = None
    call_e2e_ms: float | None = None
    root_e2e_ms: float | None = None
    measured_call_attainment: float = math.nan
    measured_root_attainment: float = math.nan
    notes: tuple[str, ...] = ()

    @property
    def honest(self) -> bool:
        """The per-call capacity holds at the attainment the root target needs."""
        return self.call_attainment >= self.call_attainment_needed - 1e-12

    def to_frame(self) -> pd.DataFrame:
        """The numbers, one row each: name, value, unit, formula."""
        rows = [
            ("mean calls per root", self.mean_calls, "calls", "E[k] = Σ w_r k_r"),
            ("root attainment target", self.root_target, "", "given"),
            ("per-call attainment needed", self.call_attainment_needed, "",
             "p with Σ w_r p^k_r = target (target^(1/k) for a fixed k)"),
            ("per-call capacity", self.per_call_rps, "req/s", self.per_call_source),
            ("its per-call attainment", self.call_attainment, "", "the SLO it was fitted at"),
            ("root attainment at that capacity", self.root_attainment_at_capacity, "",
             "Σ w_r p^k_r with p its per-call attainment"),
            ("root capacity, calls", self.root_rps_calls, "roots/s", "C_call / E[k]"),
            ("root capacity, KV", self.root_rps_kv, "roots/s", "KV tokens / E[tokens × tool s]"),
            ("root capacity", self.root_rps, "roots/s", f"the smaller ({self.binding} bind)"),
            ("sequences held for tools", self.held_sequences, "sequences",
             "λ_root × E[Σ width_d × gap_d] (Little's law)"),
            ("KV tokens held for tools", self.held_kv_tokens, "tokens",
             "λ_root × E[Σ tokens_d × gap_d]"),
        ]
        if self.call_e2e_ms is not None:
            rows.append(("per-call E2E limit", self.call_e2e_ms, "ms",
                         "(root E2E limit − tool time) / deepest steps"))
        if not math.isnan(self.measured_root_attainment):
            rows += [("measured per-call attainment", self.measured_call_attainment, "", "events"),
                     ("measured root attainment", self.measured_root_attainment, "",
                      "roots whose every call was good")]
        return pd.DataFrame(rows, columns=["name", "value", "unit", "formula"])

    def distribution(self) -> pd.DataFrame:
        """The fan-out distribution with each class's root attainment at the needed p and at
        the capacity's p."""
        d = self.fanout.distribution()
        d["root_attainment_needed_p"] = self.call_attainment_needed ** d["calls"]
        d["root_attainment_at_capacity"] = self.call_attainment ** d["calls"]
        return d

    def to_text(self) -> str:
        f = self.fanout
        counted = (f"{len(f.roots):,} root(s)" if f.source.startswith("measured")
                   else f"{len(f.roots):,} class(es) of root")
        out = [f"Fan-out: {f.source}",
               f"  {counted}; {self.mean_calls:.4g} calls per root on average, "
               f"up to {int(f.roots['calls'].max())} calls in {f.max_depth} sequential step(s)"]
        for r in self.distribution().itertuples(index=False):
            out.append(f"    {int(r.calls)} call(s) in {int(r.depths)} step(s): {r.share:.1%} of roots")
        out += ["",
                f"Root target {self.root_target:.4g}: every call good with probability p ⇒ a root "
                f"of k calls good with p^k; the per-call attainment needed is "
                f"{self.call_attainment_needed:.6g}"
                + (f" (= {self.root_target:.4g}^(1/{int(f.roots['calls'].iloc[0])}))"
                   if f.roots["calls"].nunique() == 1 else "")]
        if self.root_e2e_ms is not None and self.call_e2e_ms is not None:
            out.append(f"Root E2E limit {self.root_e2e_ms:,.0f} ms over {f.max_depth} step(s): each "
                       f"call within {self.call_e2e_ms:,.0f} ms")
        out.append(f"Per-call capacity {self.per_call_rps:.4g} req/s at per-call attainment "
                   f"{self.call_attainment:.6g} ({self.per_call_source}); roots meet "
                   f"{self.root_attainment_at_capacity:.4g} there")
        if not self.honest:
            out.append(f"  NOT HONEST for the root target: the per-call capacity holds at "
                       f"{self.call_attainment:.6g} < {self.call_attainment_needed:.6g} needed — "
                       "give the study (or an envelope) so it is re-fitted at the needed attainment")
        out.append(f"Root capacity: {self.root_rps:.4g} roots/s ({self.binding} bind) — calls "
                   f"{self.per_call_rps:.4g} / {self.mean_calls:.4g} = {self.root_rps_calls:.4g}"
                   + (f"; KV {self.root_rps_kv:.4g}" if not math.isnan(self.root_rps_kv) else ""))
        if self.held_sequences > 0 or not math.isnan(self.held_kv_tokens):
            s = (f"Held for tools at that rate: {self.held_sequences:.3g} sequences on average")
            if not math.isnan(self.held_kv_tokens):
                s += f", {self.held_kv_tokens:,.0f} KV tokens"
                if self.kv_tokens:
                    s += f" ({self.held_kv_tokens / self.kv_tokens:.1%} of the {self.kv_tokens:,.0f} KV tokens)"
            out.append(s)
        if not math.isnan(self.measured_root_attainment):
            pred = f.root_attainment(self.measured_call_attainment)
            out.append(f"Measured: calls good {self.measured_call_attainment:.4g}, roots good "
                       f"{self.measured_root_attainment:.4g} (independence predicts {pred:.4g})")
        if self.notes or f.notes:
            out += ["", "Notes:"] + [f"  - {n}" for n in (*f.notes, *self.notes)]
        return "\n".join(out)

    def figure(self):
        """Root attainment against the per-call attainment over the fan-out distribution, with
        the root target and the per-call attainment it needs marked."""
        import plotly.graph_objects as go

        lo = min(self.call_attainment, self.call_attainment_needed, self.root_target) - 0.01
        p = np.linspace(max(lo, 0.0), 1.0, 200)
        fig = go.Figure(go.Scatter(x=p, y=[self.fanout.root_attainment(x) for x in p],
                                   name="root attainment Σ w p^k"))
        fig.add_hline(y=self.root_target, line_dash="dot", annotation_text="root target")
        fig.add_vline(x=self.call_attainment_needed, line_dash="dot",
                      annotation_text="per-call attainment needed")
        fig.update_layout(template="plotly_white", xaxis_title="per-call attainment p",
                          yaxis_title="root attainment", title="Tail amplification of fan-out")
        return fig


def root_capacity(per_call_rps: float, fanout: FanOut, *, root_target: float,
                  call_attainment: float, source: str = "given",
                  kv_tokens: float | None = None, root_e2e_ms: float | None = None,
                  call_e2e_ms: float | None = None,
                  notes: tuple[str, ...] = ()) -> FanOutCapacity:
    """The root capacity from a per-call capacity ``per_call_rps`` that holds at per-call
    attainment ``call_attainment`` (module docstring)."""
    C = S.number(per_call_rps, "--capacity-rps", above=0.0, example="12.5")
    kv = S.number(kv_tokens, "--kv-tokens", above=0.0, optional=True, example="500000")
    need = fanout.call_attainment_needed(root_target)
    k = fanout.mean_calls
    by_calls = C / k
    tok_s = fanout.mean("held_token_s")
    by_kv = kv / tok_s if kv is not None and tok_s and not math.isnan(tok_s) else math.nan
    root = by_calls if math.isnan(by_kv) else min(by_calls, by_kv)
    binding = "calls" if math.isnan(by_kv) or by_calls <= by_kv else "KV held for tools"
    notes = list(notes)
    if kv is not None and math.isnan(by_kv):
        notes.append("KV tokens given, but no tokens are held for tools (no tool time, or no "
                     "context tokens given): the KV bound is not computed")
    held_seq = root * fanout.mean("held_seq_s")
    held_tok = root * tok_s if not math.isnan(tok_s) else math.nan
    if kv is not None and not math.isnan(held_tok) and held_tok / kv > 0.10 and binding == "calls":
        notes.append(f"tools park {held_tok / kv:.0%} of the KV at the root capacity: the per-call "
                     "C_SLO was measured with that KV free, so it is optimistic unless the sweep "
                     "ran the same agents")
    mc, mr = fanout.call_good, math.nan
    g = fanout.roots["good"]
    if not math.isnan(mc) and g.notna().all() and len(g):
        mr = float(g.astype(bool).mean())
    return FanOutCapacity(fanout=fanout, per_call_rps=C, per_call_source=source,
                          call_attainment=float(call_attainment), call_attainment_needed=need,
                          root_target=float(root_target),
                          root_attainment_at_capacity=fanout.root_attainment(call_attainment),
                          mean_calls=k, root_rps_calls=by_calls, root_rps_kv=by_kv,
                          root_rps=root, binding=binding, held_sequences=held_seq,
                          held_kv_tokens=held_tok, kv_tokens=kv, call_e2e_ms=call_e2e_ms,
                          root_e2e_ms=root_e2e_ms, measured_call_attainment=mc,
                          measured_root_attainment=mr, notes=tuple(notes))


def fanout_capacity(study, slo: SLO | str, *, fanout: FanOut | None = None,
                    root_target: float | None = None, root_e2e_ms: float | None = None,
                    capacity_rps: float | None = None, envelope=None, which: str = "lower_bound",
                    kv_tokens: float | None = None, reps: int = 200, seed: int = 0,
                    warmup_s=None) -> FanOutCapacity:
    """Root capacity of a study (module docstring). ``slo``: the per-call SLO (its limits; its
    attainment is the root target unless ``root_target`` is given); ``fanout``: given, else
    measured from the study's ``agent_root`` / ``branch_depth``; ``root_e2e_ms``: the root's
    E2E limit, split over the deepest root's steps after its tools (the 99th percentile of the
    roots' tool time, or the given tool time) into a per-call E2E limit. The per-call capacity:
    ``capacity_rps`` given (it holds at the SLO's attainment: no re-fit), else the C_SLO
    ``which`` ("lower_bound" or "estimate") of the envelope — ``envelope`` re-fitted, or fitted
    on the study with ``reps`` replicates — at the per-call attainment the root target needs."""
    slo = SLO.parse(slo)
    target = slo.attainment if root_target is None else S.number(
        root_target, "--root-attainment", above=0.0, below=1.0, example="0.99")
    if which not in ("lower_bound", "estimate"):
        raise SpecError(f"which must be lower_bound or estimate, got {which!r}", field="--use")
    notes = []
    if root_target is None:
        notes.append(f"root target = the SLO's attainment, {target:.4g}")
    fan = fanout if fanout is not None else measure_fanout(study, warmup_s=warmup_s)
    call_slo = slo
    call_e2e = None
    if root_e2e_ms is not None:
        L = S.number(root_e2e_ms, "--root-e2e-ms", above=0.0, example="20000")
        tools = fan.roots["tool_s"].to_numpy(float)
        tools = tools[~np.isnan(tools)]
        allowance = float(np.percentile(tools, 99)) if tools.size else 0.0
        D = fan.max_depth
        call_e2e = (L - 1000.0 * allowance) / D
        if call_e2e <= 0:
            raise SpecError(f"the root E2E limit ({L:,.0f} ms) does not cover its tools "
                            f"({allowance:g} s)", field="--root-e2e-ms",
                            fix="give a root limit above the tools' time")
        if slo.e2e_ms is not None and slo.e2e_ms < call_e2e:
            notes.append(f"the SLO's E2E limit {slo.e2e_ms:,.0f} ms is stricter than the root's "
                         f"share ({call_e2e:,.0f} ms): kept")
            call_e2e = slo.e2e_ms
        call_slo = slo.with_(e2e_ms=call_e2e)
        notes.append(f"per-call E2E limit ({L:,.0f} ms − {allowance:.3g} s of tools, the "
                     f"roots' 99th percentile) / {D} step(s) = {call_e2e:,.0f} ms")
    if fanout is None:
        fan = measure_fanout(study, call_slo, warmup_s=warmup_s)
    need = fan.call_attainment_needed(target)
    if capacity_rps is not None:
        return root_capacity(capacity_rps, fan, root_target=target, call_attainment=slo.attainment,
                             source="given (--capacity-rps), at the SLO's attainment",
                             kv_tokens=kv_tokens, root_e2e_ms=root_e2e_ms, call_e2e_ms=call_e2e,
                             notes=tuple(notes))
    from .envelope import fit_envelope

    at = call_slo.with_(attainment=need)
    env = (envelope.refit(call_slo, attainment=need) if envelope is not None
           else fit_envelope(study, at, reps=reps, seed=seed))
    C = float(getattr(env.cslo, which))
    if not math.isfinite(C) or C <= 0:
        raise StudyError(f"C_SLO at the per-call attainment the roots need ({need:.6g}) is not "
                         f"estimable: {env.cslo.status}", column="attainment",
                         fix="test lower rates (capplan design), or lower the root target")
    if env.cslo.status.startswith("≥"):
        notes.append(f"C_SLO is the largest tested rate ({env.cslo.status}): the root capacity is "
                     "a lower bound")
    src = f"C_SLO {which.replace('_', ' ')} at {at} ({env.cslo.status})"
    return root_capacity(C, fan, root_target=target, call_attainment=need, source=src,
                         kv_tokens=kv_tokens, root_e2e_ms=root_e2e_ms, call_e2e_ms=call_e2e,
                         notes=tuple(notes))
