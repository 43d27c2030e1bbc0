"""Is the C_SLO lower bound honest here? The estimand and the honesty of the bound, in words.

A fitted envelope carries one ``Honesty`` (``Envelope.honesty``): what the number estimates
(the estimand), whether the sweep's design can support the one-sided lower bound a plan uses,
why not, and which runs would make it so. ``capplan.plan`` refuses to call an unsupported
number a lower bound unless the planner accepts it (``capacity.accept_optimistic``,
``--accept-optimistic``). docs/envelope.md "Is the bound honest?" lists the rules.

Status:

- ``honest``: repeats at a rate bracketing the crossing, and the bound includes the
  between-run variation *measured* there — from those repeats (with at least ``MIN_RUNS_NEAR``
  runs near the crossing that have both outcomes) or from a twin — and no run near it was still
  settling at its end. A twin alone does not make one run per rate honest: one run per rate
  leaves the crossing as noisy as one run, and with the true system as the twin that bound was
  still too high in a third of the sweeps of one design (docs/envelope.md, "Coverage");
- ``unsupported``: the design cannot support an honest bound here — the reasons and the runs to
  add are listed (``capplan design`` plans them);
- ``optimistic``: the within-run interval was asked for (``method="within-run"``) or the input
  was a summary table under an iid assumption; near saturation such bounds are too high about
  half the time (docs/envelope.md "Coverage").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

HONEST = "honest"
UNSUPPORTED = "unsupported"
OPTIMISTIC = "optimistic"
STATUSES = (HONEST, UNSUPPORTED, OPTIMISTIC)
#: runs near the crossing needed to measure between-run variation from a single sweep
MIN_RUNS_NEAR = 3
#: repeats per rate that the suggestions ask for
REPEATS = 3
#: widest gap (relative to the estimate) between the levels bracketing the crossing for an
#: honest bound, unless the interval is wider still: interpolation error is not in the interval
MAX_BRACKET_REL = 0.10


@dataclass(frozen=True)
class RunToAdd:
    """A run (or repeats) that would let the sweep support an honest bound."""

    rate_rps: float
    repeats: int
    duration_s: float
    why: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunToAdd":
        """Back from ``to_dict`` (the envelope JSON the report reads)."""
        return cls(float(d["rate_rps"]), int(d["repeats"]), float(d["duration_s"]), str(d.get("why", "")))

    def describe(self) -> str:
        return (f"{self.repeats} × {self.rate_rps:g} req/s for {self.duration_s:.0f} s "
                f"({self.why})")


@dataclass(frozen=True)
class Honesty:
    """The honesty of an envelope's lower bound (see the module docstring)."""

    status: str
    estimand: str
    sentence: str
    reasons: tuple[str, ...] = ()
    runs_to_add: tuple[RunToAdd, ...] = ()

    @property
    def honest(self) -> bool:
        return self.status == HONEST

    def to_dict(self) -> dict:
        return {"status": self.status, "estimand": self.estimand, "sentence": self.sentence,
                "reasons": list(self.reasons),
                "runs_to_add": [r.to_dict() for r in self.runs_to_add]}

    def to_text(self) -> str:
        lines = [f"Lower bound: {self.status} — {self.sentence}", f"Estimand: {self.estimand}"]
        lines += [f"  why: {r}" for r in self.reasons]
        if self.runs_to_add:
            lines.append("Runs to add (or: capplan design):")
            lines += [f"  - {r.describe()}" for r in self.runs_to_add]
        return "\n".join(lines)


def gap_rel(estimate: float, lower_bound: float) -> float:
    """(estimate − lower bound) / estimate: how far under the estimate a plan on the bound sits;
    NaN where either is missing or the estimate is not > 0."""
    e, lb = estimate, lower_bound
    return (e - lb) / e if e == e and lb == lb and e > 0 else math.nan


def within_tolerance(status: str, estimate: float, lower_bound: float, tolerance: float) -> bool:
    """The load test's stop rule (docs/loadtest.md): the bound is honest and its ``gap_rel`` is
    at most ``tolerance``. One rule for the loop's stop and for a design round that stops adding
    runs once it expects to meet it."""
    g = gap_rel(estimate, lower_bound)
    return status == HONEST and g == g and g <= tolerance


def _fmt_s(v: float) -> str:
    return f"{v:.0f} s" if v == v else "unknown length"


def estimand(duration_s: float, warmup_s: float, target: float, settling: bool,
             overloaded: tuple[float, ...] = (), estimate: float = math.nan) -> str:
    """The sentence that says what C_SLO estimates. ``overloaded``: the levels near the
    crossing with a run whose TTFT rose over the whole run (its queue grew): above the
    estimate that is what overload looks like, at or below it the runs did not settle."""
    base = (f"the largest offered rate at which the mean attainment of runs like these "
            f"({_fmt_s(duration_s)} long, {_fmt_s(warmup_s)} warm-up, each started on an idle "
            f"server) meets {target:g}")
    above = [v for v in overloaded if estimate == estimate and v > estimate]
    below = [v for v in overloaded if v not in above]
    if settling or below:
        return (base + "; runs near the crossing were still settling at their end"
                + (f" (TTFT rising over the run at {', '.join(f'{v:.3g}' for v in below)} "
                   "req/s)" if below else "") + ", so the steady-state capacity (what long "
                "production traffic meets) is likely lower")
    tail = ("; no run near the crossing was still settling at its end (TTFT trend test), so "
            "runs of this length approximate the steady state")
    if above:
        tail += (f"; the run(s) at {', '.join(f'{v:.3g}' for v in above)} req/s, above the "
                 "crossing, are overloaded (their queue grows over the run), as expected above "
                 "capacity")
    return base + tail


def askable(rate: float) -> float:
    """A rate a load generator can be asked for: three significant digits (10.0871 → 10.1).
    Runs asked at it join the level it came from (levels group rates within 1 %)."""
    return float(f"{float(rate):.3g}")


def nominal_duration(duration_s: float) -> float:
    """The run length a load tool was most likely asked for, from a measured one (the span of
    intended starts falls short of it by about one gap): whole 10 s from 100 s, 5 s from 10 s,
    whole seconds below (299.87 → 300, 19.1 → 20, 14.9 → 15, 7.9 → 8)."""
    d = float(duration_s)
    if not d == d or d <= 0:
        return d
    step = 10.0 if d >= 100 else 5.0 if d >= 10 else 1.0
    return float(max(step, round(d / step) * step))


def rate_noise_rel(rate_rps: float, span_s: float) -> float:
    """Relative SD of the rate a Poisson run of ``span_s`` seconds realises at ``rate_rps``:
    1/√(λ·T) (a 60-s run at 10 req/s: ± 4 %). The one formula behind level grouping, the
    neighbourhood of the estimate and the runs that can make a new level."""
    return 1.0 / math.sqrt(max(float(rate_rps) * float(span_s), 1.0))


def neighbourhood(estimate: float, span_s: float) -> float:
    """Half-width (req/s) of the rates counted as repeats at the estimate: two standard
    deviations of the rate a Poisson run of ``span_s`` seconds realises at the estimate
    (√(λ/T)), at least 2 % of it. Runs whose *measured* rates fall this close to the estimate
    cannot be told apart from runs asked at the estimate, whatever rate they were asked at."""
    est = float(estimate)
    if not (est == est and est > 0):
        return 0.0
    sd = est * rate_noise_rel(est, span_s) if span_s == span_s and span_s > 0 else 0.0
    return max(0.02 * est, 2.0 * sd)


def assess(*, method: str, status: str, iid: bool, estimate: float, lower_bound: float,
           runs, near_rates: tuple[float, ...], n_near: int,
           effect_source: str, repeats_near: int, target: float,
           suggested_rates: tuple[float, ...] = (),
           near_levels: tuple[float, ...] | None = None,
           level_runs: dict | None = None,
           bracket: tuple[float, float] | None = None, ci_width: float = math.nan) -> Honesty:
    """Decide the honesty of a fitted envelope.

    ``runs``: the per-run table (columns x, usable, warnings, warmup_s, load_level and
    optionally duration); ``near_rates``: the tested rates bracketing the estimate (or the top
    ones when it is above the range); ``n_near``: usable runs at the levels near the crossing
    with both outcomes; ``effect_source``: where the
    between-run SD came from (``RunEffect.source``); ``repeats_near``: the most runs at one of
    the bracketing rates (or in the neighbourhood of the estimate); ``near_levels``: the asked
    load levels of the bracketing rates (the runs to add name them), ``level_runs``: usable runs
    per load level (so the runs to add do not ask again for runs the sweep has); ``bracket``:
    the (measured) rates of the levels the crossing is interpolated between, ``ci_width`` the
    interval's width — a bracket wider than ``MAX_BRACKET_REL`` of the estimate and than the
    interval leaves interpolation error the interval does not contain."""
    est_text, dur, settling = _near_crossing(runs, near_rates, near_levels, estimate, target)
    if method == "within-run" or iid:
        why = ("the input is a summary table: requests are assumed independent"
               if iid else "the within-run bootstrap alone was asked for (method within-run)")
        return Honesty(OPTIMISTIC, est_text,
                       "near saturation this interval misses the truth about half the time "
                       "and its lower bound is usually too high", (why,), ())
    if status == "< min tested":
        rates = tuple(sorted(suggested_rates))
        return Honesty(UNSUPPORTED, est_text, "no tested rate meets the SLO: there is no bound",
                       ("every tested rate fails the target",),
                       tuple(RunToAdd(askable(r), 1, dur, "below the tested range")
                             for r in rates))
    dur = nominal_duration(dur)  # the length a load tool is asked for (300, not 299.87 s)
    longer = max(2.0 * dur, 300.0) if dur == dur else 600.0
    run_len = dur if not settling else longer
    levels = tuple(sorted(near_levels if near_levels is not None else near_rates))
    rates = levels or tuple(sorted(suggested_rates))
    reasons, add = _variation_reasons(repeats_near=repeats_near, effect_source=effect_source,
                                      n_near=n_near, rates=rates, estimate=estimate,
                                      level_runs=level_runs or {}, run_len=run_len)
    if bracket is not None and estimate == estimate and estimate > 0:
        why_wide, new = _bracket_reasons(bracket, estimate, ci_width, add, dur, run_len)
        reasons += why_wide
        add += new
    if settling:
        reasons.append("runs near the crossing were still settling (TTFT trending) at their "
                       "end: too short for a steady-state bound")
        planned = {round(a.rate_rps, 9) for a in add}
        add = [RunToAdd(a.rate_rps, a.repeats, longer, a.why + "; longer runs") for a in add]
        add += [RunToAdd(askable(r), 1, longer, "longer run to reach steady state")
                for r in rates if round(askable(r), 9) not in planned]
    if not (lower_bound == lower_bound) or lower_bound <= 0:
        reasons.append("the lower bound is 0: replicates fail already at the lowest rate")
        add += _below_range(runs, add, run_len)
    if reasons:
        return Honesty(UNSUPPORTED, est_text,
                       "this sweep cannot support an honest lower bound here; the number "
                       "shown is likely too high", tuple(reasons), tuple(add))
    src = {"twin": "a twin", "given": "a given value", "sweep": "this sweep"}.get(
        effect_source, "this sweep")
    return Honesty(HONEST, est_text,
                   f"the lower bound includes the run-to-run variation measured from {src} "
                   f"near the crossing ({n_near} runs)" + (
                       "" if status == "bracketed" else "; C_SLO is above the tested range, "
                       "so the bound is conservative"), (), ())


def _near_crossing(runs, near_rates, near_levels, estimate: float, target: float) -> tuple[str, float, bool]:
    """What the bound estimates, in words (``estimand``), from the runs near the crossing: their
    median duration (s, as measured) and whether they were still settling at their end."""
    use = runs[runs["usable"]] if len(runs) else runs
    if near_levels is not None and "load_level" in runs.columns:
        keys = [round(v, 9) for v in near_levels]
        near = use[use["load_level"].astype(float).round(9).isin(keys)] if len(use) else use
        near_all = runs[runs["load_level"].astype(float).round(9).isin(keys)] if len(runs) else runs
    else:
        near = use[use["x"].round(9).isin([round(v, 9) for v in near_rates])] if len(use) else use
        near_all = near
    dur = _median(near, "duration_s") if len(near) else _median(use, "duration_s")
    warm = _median(near, "warmup_s") if len(near) else _median(use, "warmup_s")
    # still settling: at least half the runs at a bracketing level trend at their end (with
    # repeats one run that congests at its end is an episode, not the level's behaviour)
    settling = False
    if len(near):
        w = near["warnings"].astype(str)
        # an overloaded run above the estimate trends at its end because it is overloaded,
        # not because it is too short: that is the crossing, not a settling run
        above = (near["x"].astype(float) > estimate) if estimate == estimate else False
        short = w.str.contains("too short") & ~(w.str.contains("non-stationary") & above)
        key = near["load_level"] if "load_level" in near.columns else near["x"]
        settling = bool(short.groupby(key.to_numpy()).mean().ge(0.5).any())
    over = []
    if len(near_all) and "warnings" in near_all.columns:
        ov = near_all[near_all["warnings"].astype(str).str.contains("non-stationary")]
        over = sorted({float(v) for v in ov["load_level"]}) if "load_level" in ov.columns else []
    est_text = estimand(dur, warm, target, settling, overloaded=tuple(over),
                        estimate=estimate)
    return est_text, dur, settling


def _variation_reasons(*, repeats_near: int, effect_source: str, n_near: int, rates: tuple[float, ...],
                       estimate: float, level_runs: dict, run_len: float) -> tuple[list[str], list[RunToAdd]]:
    """Is the run-to-run variation near the crossing measured (repeats, and enough runs with both
    outcomes)? If not: why, and the runs that would measure it."""
    reasons: list[str] = []
    add: list[RunToAdd] = []

    def have(level: float) -> int:
        return int(level_runs.get(round(float(level), 9), 1))
    measured = repeats_near >= 2 and (effect_source in ("twin", "given")
                                      or (effect_source == "sweep" and n_near >= MIN_RUNS_NEAR))
    if measured:
        return reasons, add
    if repeats_near < 2 and effect_source in ("twin", "given"):
        reasons.append(
            "one run at each rate bracketing C_SLO: the run-to-run variation comes from "
            + ("a twin" if effect_source == "twin" else "a given value") + ", but the "
            "crossing itself rests on single runs; on one simulated system (one replica, "
            "binding KV limit) that bound was still too high in about a third of sweeps "
            "even with the true system as the twin: docs/envelope.md, 'Coverage'")
    elif repeats_near < 2:
        reasons.append(
            "one run at each rate bracketing C_SLO: the crossing rests on single runs, and "
            + ("how much runs differ there — which decides how optimistic a single run "
               "is — is assumed (a prior), not measured"
               if effect_source != "sweep" or n_near < MIN_RUNS_NEAR else
               f"the run-to-run variation estimated from {n_near} runs near it cannot "
               "tell a lucky single run from the level's mean")
            + "; on simulated systems one run per rate held for some (two replicas) and "
            "not for others (one replica, a bursty trace): docs/envelope.md, 'Coverage'")
    else:
        reasons.append(
            f"only {n_near} run(s) near the crossing have both outcomes: how much runs "
            "differ there cannot be measured")
    why = ("repeat a rate bracketing C_SLO so the crossing rests on more than one run"
           if effect_source in ("twin", "given") else
           "repeat a rate bracketing C_SLO to measure run-to-run variation")
    if repeats_near < 2 or effect_source in ("twin", "given"):
        add += [RunToAdd(askable(r), max(REPEATS - have(r), 1), run_len, why) for r in rates]
    else:  # repeats exist, too few runs with both outcomes: runs at the estimate have both
        add.append(RunToAdd(askable(estimate), max(MIN_RUNS_NEAR - n_near, 1), run_len,
                            "runs at the estimate, where both outcomes occur, to measure "
                            "run-to-run variation"))
    return reasons, add


def _below_range(runs, add: list[RunToAdd], run_len: float) -> list[RunToAdd]:
    """A run a fifth below the lowest usable level, where a lower bound of 0 says replicates
    fail already there: that bound can only rise on a level that clearly meets the target,
    and repeats near the crossing never give one (a real GuideLLM loop, whose lowest run was
    excluded for a lagging client, asked for them three rounds running)."""
    if runs is None or "usable" not in runs or not runs["usable"].any():
        return []
    col = "load_level" if "load_level" in runs else "x"
    low = float(runs.loc[runs["usable"].astype(bool), col].min())
    rate = askable(0.8 * low)
    if not rate > 0 or any(abs(a.rate_rps - rate) < 1e-9 for a in add):
        return []
    return [RunToAdd(rate, 1, run_len, f"below the lowest usable rate ({low:.3g} req/s), where "
                     "replicates already fail: a level that meets the target lifts the "
                     "lower bound from 0")]


def _bracket_reasons(bracket: tuple[float, float], estimate: float, ci_width: float,
                     add: list[RunToAdd], dur: float, run_len: float) -> tuple[list[str], list[RunToAdd]]:
    """Is the crossing interpolated across a bracket wider than the interval and than
    ``MAX_BRACKET_REL`` of the estimate? If so: why, and the runs (not already in ``add``)
    that would narrow it."""
    lo_x, hi_x = (float(v) for v in bracket)
    width = hi_x - lo_x
    if not (width > MAX_BRACKET_REL * estimate and not (ci_width == ci_width and width <= ci_width)):
        return [], []
    reasons = [
        f"the crossing is interpolated between runs at {lo_x:.3g} and {hi_x:.3g} req/s, "
        f"{width / estimate:.0%} of the estimate apart: the interval does not contain "
        "the interpolation error (near saturation attainment falls faster than the "
        "interpolation assumes, so the estimate is too high); on 60-s runs from a real "
        "client's shape this left the lower bound above the truth in 1 sweep of 5: "
        "docs/envelope.md, 'Coverage'"]
    # at the estimate (and just above) when that makes a new level; else in the middle
    # of the bracket: runs asked close to a bracketing level join it (levels merge
    # rates a run cannot tell apart), so runs "at the estimate" next to a level never
    # narrowed the bracket (a real AIPerf loop asked for them three rounds running)
    planned = {round(a.rate_rps, 9) for a in add}
    # a new level needs rates further apart than a run realises its rate
    tol = max(0.01, rate_noise_rel(estimate, dur if dur == dur else 60.0))
    gap = 1.5 * tol * estimate
    if min(estimate - lo_x, hi_x - estimate) > gap:
        at = askable(estimate)
        up = askable(min(estimate + gap, 0.5 * (estimate + hi_x)))
        new = [(at, REPEATS, "at the estimate, to narrow the bracket")]
        if up - at > tol * estimate and hi_x - up > tol * estimate:
            new.append((up, 1, "just above the estimate, to narrow the bracket"))
    else:
        new = [(askable(0.5 * (lo_x + hi_x)), REPEATS,
                "in the middle of the bracket, to narrow it")]
    return reasons, [RunToAdd(rate, k, run_len, why) for rate, k, why in new if round(rate, 9) not in planned]


def _median(df, col: str) -> float:
    if col not in df.columns or not len(df):
        return math.nan
    v = df[col].astype(float)
    v = v[v == v]
    return float(v.median()) if len(v) else math.nan
