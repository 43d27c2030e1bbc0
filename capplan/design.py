"""The next runs of a sweep: which rates, repeats and durations most shrink the distance between
the C_SLO estimate and its honest lower bound per minute of load-test time.

``propose(env, budget_minutes=...)`` works on a fitted envelope (``capplan.fit_envelope``).
Where the bound is unsupported and the estimate is interpolated across a bracket wider than
``honesty.MAX_BRACKET_REL`` of it, the proposal is single runs spread across that bracket and
nothing else (``_spread``: the fit after them decides whether repeats are needed); where it is
unsupported otherwise, it starts from the honesty rule's runs (``_honest_package``). Then:

1. **candidates**: a run at each rate bracketing the estimate, at the estimate itself, and
   half-way between the lower bound and the estimate (rounded to 3 significant digits), each
   as long as the sweep's runs near the crossing (twice as long, ≥ 300 s, when those were
   still settling);
2. **expected bound after a candidate**: ``sims`` simulated outcomes of the run are added to
   the sweep and the envelope is re-fitted on each; the mean lower bound and estimate are the
   expectation. Outcomes come from the current fit (attainment at the rate from the isotonic
   curve on the logit scale, plus the between-run SD τ, clustered violations with the design
   effect of the nearest run) — or, with a ``model`` (a twin, or a synth configuration), from
   simulating the run on it;
3. **greedy**: the candidate with the largest drop of E[estimate − lower bound] per minute is
   taken (a run that makes an unsupported bound honest counts the whole gap as the drop), the
   sweep is extended by its expected outcome, and the search repeats until the budget is used.

The proposal prints ready-to-run commands for GuideLLM, AIPerf, vLLM ``bench serve`` and
``capplan synth``, and a manifest stub for the new runs; ``write_design`` saves design.yaml,
which ``capplan synth --design design.yaml --twin MODEL`` runs against a model.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.special import expit, logit

from .errors import SpecError
from .honesty import nominal_duration, within_tolerance
from .present import fmt_num
from .reduce import BlockStats, stats_from_series

DESIGN_FORMAT = "capplan-design/1"
MIN_DURATION_S = 300.0


@dataclass(frozen=True)
class ProposedRun:
    rate_rps: float
    repeats: int
    duration_s: float
    warmup_s: float
    why: str

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def minutes(self) -> float:
        return self.repeats * self.duration_s / 60.0


@dataclass(frozen=True)
class Design:
    """A proposal of next runs with the bound expected after them."""

    study: str
    slo: str
    budget_minutes: float
    #: the measured C_SLO now (estimate, lower_bound, ci_low, ci_high, status, honesty, reps,
    #: seed): the envelope ``propose`` was given, as ``capplan envelope`` prints it
    current: dict
    expected: dict             # the same, expected after the proposed runs (trial fits)
    runs: tuple[ProposedRun, ...]
    existing: tuple[dict, ...]  # the sweep so far: rate_rps, runs, duration_s, warmup_s
    source: str                 # "the current fit" or the model's name
    notes: tuple[str, ...] = ()
    #: the study's manifest ``workload`` (what the printed commands must reproduce), its
    #: directory and how many runs it has (the seed base of the next round: new seeds)
    workload: dict = field(default_factory=dict)
    study_path: str = ""
    runs_in_study: int = 0
    #: the trial fits' bootstrap replicates and their reading of the sweep as it is now: when
    #: they are fewer than the measured C_SLO's, ``expected`` is an approximation at that count,
    #: comparable with ``trial_now`` (not with ``current``)
    trial_reps: int = 0
    trial_now: dict = field(default_factory=dict)

    @property
    def approximate(self) -> bool:
        """The expected numbers come from trial fits with other replicates than the measured
        C_SLO (fewer, for speed), and runs were proposed."""
        return bool(self.runs) and bool(self.trial_now) and self.trial_reps != self.current.get("reps")

    @property
    def minutes(self) -> float:
        return float(sum(r.minutes for r in self.runs))

    def to_dict(self) -> dict:
        return {"format": DESIGN_FORMAT, "study": self.study, "slo": self.slo,
                "budget_minutes": self.budget_minutes, "minutes": round(self.minutes, 3),
                "expected_from": self.source, "current": self.current,
                "expected": self.expected, "trial_reps": self.trial_reps, "trial_now": self.trial_now,
                "next_runs": [r.to_dict() for r in self.runs],
                "existing": list(self.existing), "notes": list(self.notes)}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame([r.to_dict() for r in self.runs],
                            columns=["rate_rps", "repeats", "duration_s", "warmup_s", "why"])

    def manifest_stub(self, first_index: int = 1) -> list[dict]:
        """study.yaml ``runs:`` entries for the proposed runs (add them to the manifest and
        put each run's events in events/<run_id>.parquet)."""
        out, i = [], first_index
        for r in self.runs:
            for k in range(r.repeats):
                out.append({"run_id": f"next{i:02d}", "offered_rps": r.rate_rps,
                            "arrival": "poisson", "duration_s": r.duration_s,
                            "warmup_s": r.warmup_s, "repeat": k})
                i += 1
        return out

    def commands(self, *, url: str = "http://127.0.0.1:8000", model: str = "MODEL",
                 tokenizer: str | None = None, seed_base: int | None = None,
                 out_dir: str = "runs", design_path: str | None = None):
        """Commands per load tool that run verbatim and reproduce the study's workload
        (``capplan.loadtools.commands``), one per run, with fresh seeds: ``seed_base``
        defaults to ``loadtools.seed_base_for(runs already in the study)``."""
        from .loadtools import commands, seed_base_for

        base = seed_base_for(self.runs_in_study) if seed_base is None else int(seed_base)
        return commands(self.runs, self.workload, url=url, model=model, tokenizer=tokenizer,
                        seed_base=base, out_dir=out_dir, design_path=design_path,
                        study=self.study_path or "STUDY")

    def to_text(self) -> str:
        c, e = self.current, self.expected
        what = c.get("settings_note") or (f"the measured C_SLO, as capplan envelope prints it ({c['reps']} "
                                          f"bootstrap replicates, seed {c['seed']})")
        lines = [f"Next runs for {self.study} ({self.slo}); budget {self.budget_minutes:g} min, "
                 f"proposed {self.minutes:.0f} min",
                 f"now:      estimate {fmt_num(c['estimate'])}, lower bound {fmt_num(c['lower_bound'])} "
                 f"req/s ({c['honesty']}) — {what}"]
        if not self.runs:
            lines.append("expected: unchanged — no run proposed")
        else:
            lines.append(f"expected: estimate {fmt_num(e['estimate'])}, lower bound {fmt_num(e['lower_bound'])} "
                         f"req/s ({e['honesty']}; from {self.source})")
        if self.approximate:
            t = self.trial_now
            lines.append(f"          approximate: trial fits with {self.trial_reps} bootstrap replicates (--reps), "
                         f"which read the sweep as it is now at estimate {fmt_num(t['estimate'])}, lower bound "
                         f"{fmt_num(t['lower_bound'])} req/s — compare the expected numbers with these")
        lines.append("")
        if not self.runs:
            lines.append("no run proposed (why: the note below)")
        for r in self.runs:
            lines.append(f"- {r.repeats} × {r.rate_rps:g} req/s, {r.duration_s:.0f} s each "
                         f"({r.warmup_s:.0f} s warm-up): {r.why}")
        lines += [f"note: {n}" for n in self.notes]
        if self.runs:
            lines += ["", self.commands().to_text()]
        return "\n".join(lines)


def _summary(env) -> dict:
    c = env.cslo
    return {"estimate": _num(c.estimate), "lower_bound": _num(c.lower_bound),
            "ci_low": _num(c.ci_low), "ci_high": _num(c.ci_high), "status": c.status,
            "honesty": env.honesty.status if env.honesty else "", "reps": int(env.reps),
            "seed": int(env.seed)}


def _num(v):
    return None if v is None or v != v else float(v)


def _gap(env) -> float:
    """estimate − lower bound, with an unsupported bound counting as no bound at all."""
    c = env.cslo
    est = c.estimate if c.estimate == c.estimate else 0.0
    if env.honesty is not None and not env.honesty.honest:
        return max(est, 0.0)
    return max(est - (c.lower_bound if c.lower_bound == c.lower_bound else 0.0), 0.0)


# ------------------------------------------------------------------------------ outcomes

def _curve(env):
    """(x, logit attainment) of the fitted curve, for interpolation."""
    lv = env.levels
    x = lv["x"].to_numpy(float)
    f = np.clip(lv["fitted"].to_numpy(float), 1e-6, 1 - 1e-6)
    return x, logit(f)


def _deff_at(env, rate: float) -> float:
    r = env.runs[env.runs["usable"]]
    if not len(r):
        return 1.0
    j = int(np.argmin(np.abs(r["x"].to_numpy(float) - rate)))
    d = float(r["design_effect_used"].iloc[j])
    return d if d == d and d >= 1 else 1.0


def _fit_outcome(env, rate: float, duration_s: float, warmup_s: float, rng) -> dict:
    """One simulated run at ``rate`` from the current fit: a 0/1 good series with violations
    in clusters of the nearest run's design effect."""
    x, y = _curve(env)
    span = max(duration_s - warmup_s, 1.0)
    asked = rate
    # a Poisson client realises the asked rate ± √(λ/T): the run lands where it lands
    rate = max(float(rng.poisson(asked * span)) / span, 0.5 * asked)
    eta = float(np.interp(rate, x, y, left=y[0], right=y[-1]))
    if rate > x[-1] and x.size >= 2 and x[-1] > x[-2]:  # extrapolate the last slope
        eta = y[-1] + (y[-1] - y[-2]) / (x[-1] - x[-2]) * (rate - x[-1])
    tau = env.run_effect.tau if env.run_effect is not None else 0.0
    n = max(int(round(rate * span)), 20)
    a = float(expit(eta + tau * rng.standard_normal()))
    d = _deff_at(env, rate)
    v = int(rng.binomial(max(int(n / d), 1), 1 - a) * d)
    v = min(v, n)
    good = np.ones(n)
    if v:
        size = max(int(round(d)), 1)
        starts = rng.choice(n, size=max(v // size, 1), replace=False)
        idx = np.unique(np.concatenate([np.arange(s, min(s + size, n)) for s in starts]))[:v]
        good[idx] = 0.0
    return {"good": good, "rate_rps": rate, "asked_rps": asked}


def _model_outcomes(model, rate: float, duration_s: float, warmup_s: float, slo, sims: int,
                    seed: int) -> list[dict]:
    """Runs simulated on a model (twin or synth config) — real synth runs, reduced. Not the
    evaluator's counts (``capplan.sim.evaluate.steady``) but the study evaluator
    (``run_study``): a trial fit needs each run's block statistics and diagnostics, which the
    reduction of a written study gives."""
    import tempfile

    from .reduce import reduce_study
    from .sim import run_study

    with tempfile.TemporaryDirectory(prefix="capplan-design-") as tmp:
        path, _ = run_study(model, None, Path(tmp) / "s", rates=(rate,), duration_s=duration_s,
                            warmup_s=warmup_s, repeats=sims, seed=seed)
        st = reduce_study(path, slo)
    return [{"run": r, "diag": st.diagnostics[st.diagnostics["run_id"] == r.run_id]}
            for r in st.runs]


def twin_run_effect(env, model, *, runs: int = 20, seed: int = 0):
    """The between-run SD of logit attainment near the crossing from a model (a twin, or a
    synth configuration): ``runs`` simulated runs of the study's protocol (its run length and
    warm-up) at each tested rate bracketing the estimate, scored with the pipeline's own
    definitions (``capplan.sim.truth.true_attainment``). Returns (RunEffect or None, note).
    A twin whose last ``twin check`` disagreed is not used (None, and the note says why): the
    envelope then estimates τ from the sweep, as without a twin."""
    from .runeffect import RunEffect
    from .sim.truth import true_attainment

    warn = str(getattr(model, "warning", "") or "")
    if warn:
        return None, ("the twin's run-to-run variation was not used: its last check disagreed "
                      f"with the study ({warn})")
    c = env.cslo
    x = env.levels["x"].to_numpy(float)
    nominal = env.levels["load_level"].to_numpy(float)
    if c.status == "bracketed" and c.estimate == c.estimate:
        i = int(np.searchsorted(x, c.estimate, side="right"))
        rates = [float(nominal[j]) for j in (i - 1, i) if 0 <= j < x.size]
    else:
        rates = [float(v) for v in nominal[-2:]]
    dur, warm = _run_length(env)
    att, nn = {}, {}
    for r in rates:
        cfg = model_config(model, rates=(r,), duration_s=dur, warmup_s=warm, seed=seed)
        t = true_attainment(cfg, r, env.slo, replications=runs, duration_s=dur, warmup_s=warm)
        att[r] = np.asarray(t.per_run, dtype=np.float64)
        nn[r] = np.full(len(t.per_run), t.n_requests / max(len(t.per_run), 1))
    eff = RunEffect.from_samples(att, nn, source="twin")
    return eff, (f"run-to-run variation from the twin: {runs} simulated runs at "
                 + ", ".join(f"{r:g}" for r in rates) + " req/s")


def fit_envelope_with_twin(study, slo, model, *, seed: int = 0, stats=None, **fit_kw):
    """``capplan envelope --twin`` as one call: the envelope of ``study`` with the run-to-run
    variation near the crossing held at or above what ``model`` (a twin or a synth config, or
    its file) shows running the study's protocol there (:func:`twin_run_effect`;
    docs/envelope.md). ``fit_kw`` go to :func:`capplan.envelope.fit_envelope` (confidence,
    reps, scheme, block_len, warmup, method); one reduction serves both fits. The envelope's
    notes say what the twin gave, or why it was not used."""
    from .envelope import fit_envelope
    from .reduce import reduce_study
    from .slo import SLO

    if isinstance(model, (str, os.PathLike)):
        from .twin import load_system

        model = load_system(model)
    slo = SLO.parse(slo)
    if stats is None:
        stats = reduce_study(study, slo, warmup=fit_kw.get("warmup", "manifest"))
    env = fit_envelope(study, slo, seed=seed, stats=stats, **fit_kw)
    effect, note = twin_run_effect(env, model, seed=seed)
    if effect is not None:
        env = fit_envelope(study, slo, seed=seed, stats=stats, run_effect=effect, **fit_kw)
    return replace(env, notes=env.notes + (note,))


def model_config(model, *, rates, duration_s, warmup_s, repeats=1, seed=0):
    """A synth configuration for ``model``: a twin (anything with ``synth_config``) or a
    ``SynthConfig`` (``capplan.sim.evaluate.system_config``, without per-request ITL)."""
    from .sim.evaluate import system_config

    return system_config(model, rates=rates, duration_s=duration_s, warmup_s=warmup_s, repeats=repeats, seed=seed,
                         itl=False)


def add_runs(stats: BlockStats, new: list[dict]) -> BlockStats:
    """``stats`` with extra runs: dicts from ``_fit_outcome`` (0/1 series) or from
    ``_model_outcomes`` (reduced runs of a model)."""
    runs = list(stats.runs)
    diags = [stats.diagnostics]
    base = max((r.run_idx for r in runs), default=-1) + 1
    series = [d for d in new if "good" in d]
    for i, d in enumerate(series):
        s = stats_from_series([{"run_id": f"sim{base + i}",
                                "load_level": d.get("asked_rps", d["rate_rps"]),
                                "good": d["good"], "rate_rps": d["rate_rps"]}], stats.slo)
        r = replace(s.runs[0], run_idx=base + i)
        runs.append(r)
        diags.append(s.diagnostics)
    k = base + len(series)
    for d in new:
        if "run" in d:
            r = replace(d["run"], run_idx=k, run_id=f"sim{k}")
            runs.append(r)
            diags.append(d["diag"].assign(run_id=f"sim{k}"))
            k += 1
    dg = pd.concat(diags, ignore_index=True)
    return replace(stats, runs=tuple(runs), diagnostics=dg, _cache={})


# ------------------------------------------------------------------------------ proposal

def _study_workload(study_path) -> dict:
    """The ``workload`` of the study at ``study_path`` (its study.yaml), {} when none."""
    if not study_path:
        return {}
    p = Path(str(study_path)) / "study.yaml"
    try:
        m = yaml.safe_load(p.read_text(encoding="utf-8")) if p.is_file() else None
    except (OSError, yaml.YAMLError):
        return {}
    return dict((m or {}).get("workload") or {}) if isinstance(m, dict) else {}


def _existing(env) -> tuple[dict, ...]:
    r = env.runs
    out = []
    for lv, g in r.groupby("load_level", sort=True):
        out.append({"rate_rps": float(lv), "runs": int(len(g)),
                    "duration_s": round(float(g["duration_s"].median()), 3),
                    "warmup_s": round(float(g["warmup_s"].median()), 3)})
    return tuple(out)


def _candidates(env) -> list[tuple[float, str]]:
    """Candidate rates (nominal, as a load generator takes them), fixed for the whole search
    so that repeats concentrate: the tested levels bracketing the estimate, the estimate, and
    half-way between the lower bound and the estimate."""
    c = env.cslo
    lv = env.levels
    x = lv["x"].to_numpy(float)
    nominal = lv["load_level"].to_numpy(float)
    out = []
    est = c.estimate
    if c.status == "bracketed" and est == est:
        i = int(np.searchsorted(x, est, side="right"))
        for j in (i - 1, i):
            if 0 <= j < x.size:
                out.append((float(nominal[j]), "repeat a rate bracketing C_SLO"))
        out.append((float(f"{est:.2g}"), "at the estimate"))
        lb = c.lower_bound
        if lb == lb and 0 < lb < est:
            out.append((float(f"{0.5 * (lb + est):.2g}"),
                        "between the lower bound and the estimate"))
    elif c.status == "≥ max tested":
        out += [(float(v), "above the tested range") for v in c.suggested_rates[:2]]
        out.append((float(nominal[-1]), "repeat the largest tested rate"))
    else:
        out += [(float(v), "below the tested range") for v in c.suggested_rates]
    seen, uniq = set(), []
    for rate, why in out:
        key = float(f"{rate:.3g}")
        if key > 0 and key not in seen:
            seen.add(key)
            uniq.append((key, why))
    return uniq


def _run_length(env) -> tuple[float, float]:
    """(duration, warm-up) of the runs near the crossing; longer when they were settling."""
    r = env.runs[env.runs["usable"]]
    dur = float(r["duration_s"].median()) if len(r) else 600.0
    warm = float(r["warmup_s"].median()) if len(r) else 0.0
    dur = nominal_duration(dur)  # the length the tool was asked for
    if env.honesty is not None and any("settling" in x for x in env.honesty.reasons):
        dur = max(2.0 * dur, MIN_DURATION_S)
        warm = max(warm, 0.1 * dur)
    return (dur if dur == dur else 600.0), (warm if warm == warm else 0.0)


def _capped(dur: float, warm: float, max_duration_s: float | None) -> tuple[float, float, str]:
    """(duration, warm-up, note): a run longer than ``max_duration_s`` is cut to it, its
    warm-up in proportion, and the note says so (a load test's cap on its runs' length)."""
    if not max_duration_s or dur <= max_duration_s:
        return dur, warm, ""
    cut = float(max_duration_s)
    return cut, warm * cut / dur, (f"the runs asked for are {dur:.0f} s long (runs near the crossing were "
                                   f"still settling); capped at {cut:.0f} s, the longest run allowed")


def propose(env, *, budget_minutes: float = 60.0, sims: int = 4, reps: int = 200,
            seed: int = 0, model=None, max_runs: int = 12, workload: dict | None = None,
            study_path: str | os.PathLike | None = None,
            max_duration_s: float | None = None, enough_gap_rel: float | None = None) -> Design:
    """Greedy proposal of next runs within ``budget_minutes`` (see the module docstring).
    ``env`` is the measured C_SLO (``Design.current``); the trial fits use ``reps`` replicates
    (fewer, for speed: their expected numbers are then labelled approximate, beside the trial
    fits' own reading of the sweep now). ``workload`` (the study manifest's) and ``study_path``
    go into the printed commands; by default they come from the study the envelope was fitted on.
    ``max_duration_s``: no run longer than this (the load test's cap), said in the notes.
    ``enough_gap_rel``: where the bound is honest already, stop adding runs once the expected
    sweep (the median trial outcome) has (estimate − lower bound) / estimate at most this — the
    load test's stop rule — so that a round that only narrows the gap does not spend its whole
    budget past the point where it expects to stop. Not where the bound is unsupported: the
    honesty package is the smallest set whose *median* outcome is honest, and stopping there
    left real AIPerf sweeps unsupported round after round (benchmarks/loadtest_seeds.py)."""
    from .envelope import fit_from_stats

    if env.stats is None:
        raise SpecError("a design needs a study's events (not a summary table)")
    if not budget_minutes > 0:
        raise SpecError(f"--budget-minutes must be > 0, got {budget_minutes}",
                        field="budget_minutes", fix="e.g. --budget-minutes 60")
    rng = np.random.default_rng([int(seed), 7_000_001])
    slo = env.slo
    stats = env.stats
    if study_path is None:
        study_path = getattr(stats, "source", None)
    if workload is None:
        workload = _study_workload(study_path)
    fit = dict(confidence=env.confidence, reps=reps, seed=seed, scheme=env.scheme,
               block_len=env.block_len, method="run-effect")
    cur = fit_from_stats(stats, slo, **fit)
    start = cur
    dur, warm, cap_note = _capped(*_run_length(cur), max_duration_s)
    chosen: list[ProposedRun] = []
    left = float(budget_minutes)
    notes = [cap_note] if cap_note else []
    cands = _candidates(start)
    unsupported = start.honesty is not None and start.honesty.status == "unsupported"
    spread, spacing = _spread(start, dur, warm) if unsupported else ([], "")
    if spread:
        # single runs across a wide bracket, alone: the fit after them decides whether repeats
        # are needed (the trial fits' outcomes of the spread are the expectation, not a gate)
        return _spread_design(env, start, stats, spread, spacing, slo, fit, warm, sims, rng,
                              model, notes, budget_minutes=budget_minutes, workload=workload,
                              study_path=study_path, reps=reps)
    if unsupported and start.honesty.runs_to_add:
        # one run alone cannot make an unsupported bound honest (it needs repeats near the
        # crossing), so the greedy step below would propose nothing: start from the runs the
        # honesty rule names, the cheapest set that can, checked on simulated outcomes
        chosen, cur, stats, note = _honest_package(start, stats, slo, fit, warm, sims, rng,
                                                   model, max_duration_s)
        left -= sum(r.minutes for r in chosen)
        notes.append(note)
        if left < 0:
            notes.append(f"these runs take {sum(r.minutes for r in chosen):.0f} min, more than "
                         f"the budget of {budget_minutes:g} min: no smaller set can make the "
                         "bound honest")
    tried: list[tuple[float, float]] = []  # (rate, expected gap) of the first search step
    while left >= dur / 60.0 - 1e-9 and len(chosen) < max_runs:
        if chosen and enough_gap_rel is not None and start.honesty is not None \
                and start.honesty.honest and within_tolerance(
                    cur.honesty.status if cur.honesty is not None else "",
                    cur.cslo.estimate, cur.cslo.lower_bound, enough_gap_rel):
            notes.append(f"stopped adding runs: with these the bound is expected honest within "
                         f"{100 * enough_gap_rel:g} % of the estimate")
            break
        g0 = _gap(cur)
        best = None
        first = not tried
        for rate, why in cands:
            envs = []
            for s in range(sims):
                if model is None:
                    extra = [_fit_outcome(cur, rate, dur, warm, rng)]
                else:
                    extra = _model_outcomes(model, rate, dur, warm, slo, 1,
                                            int(rng.integers(2**31)))
                envs.append(fit_from_stats(add_runs(stats, extra), slo, **fit))
            gap = float(np.mean([_gap(e) for e in envs]))
            if first:
                tried.append((rate, gap))
            score = (g0 - gap) / (dur / 60.0)
            if best is None or score > best[0]:
                best = (score, rate, why, envs)
        if best is None or best[0] <= 0:
            if not chosen:
                notes.append(_why_none(start, g0, tried, dur))
            break
        _, rate, why, envs = best
        # extend the sweep by the median outcome (the one whose bound is the median)
        med = sorted(envs, key=lambda e: e.cslo.lower_bound)[len(envs) // 2]
        stats = med.stats
        cur = med
        same = [i for i, r in enumerate(chosen) if abs(r.rate_rps - rate) < 1e-9]
        if same:
            chosen[same[0]] = replace(chosen[same[0]], repeats=chosen[same[0]].repeats + 1)
        else:
            chosen.append(ProposedRun(rate, 1, dur, warm, why))
        left -= dur / 60.0
    if not chosen and not tried and not notes:
        notes.append(f"the budget ({budget_minutes:g} min) is shorter than one run of {dur:.0f} s: "
                     "no run was tried")
    # with no run proposed nothing changes: the expectation is the measured C_SLO itself
    return _design(env, start, stats, chosen, cur if chosen else env, notes, slo=slo,
                   budget_minutes=budget_minutes, model=model, workload=workload,
                   study_path=study_path, reps=reps)


def _design(env, start, stats, runs, expected, notes, *, slo, budget_minutes, model, workload,
            study_path, reps) -> Design:
    """The ``Design`` of proposed ``runs``, with ``expected`` (an envelope) as the expectation."""
    src = "the current fit" if model is None else f"the model {getattr(model, 'name', 'given')}"
    return Design(study=str(getattr(stats, "name", "")), slo=str(slo),
                  budget_minutes=float(budget_minutes),
                  current={**_summary(env), "settings_note": env.settings_note()},
                  expected=_summary(expected), runs=tuple(runs), existing=_existing(start),
                  source=src, notes=tuple(notes), workload=dict(workload or {}),
                  study_path=str(study_path or ""), runs_in_study=len(env.runs),
                  trial_reps=int(reps), trial_now=_summary(start))


def _why_none(env, gap_now: float, tried: list[tuple[float, float]], duration_s: float) -> str:
    """Why no run is proposed, in numbers: the gap now and the gap expected after one more run
    at each candidate rate (the first search step), and whether the bound needs any run."""
    h = env.honesty
    status = h.status if h is not None else "without a verdict"
    need = ("the bound is honest, so no run is needed before planning on it"
            if h is not None and h.honest else f"the bound is {status}")
    after = ", ".join(f"{g:.3g} req/s at {r:g} req/s" for r, g in tried)
    tau = getattr(env.run_effect, "tau", None) if env.run_effect is not None else None
    spread = f", run-to-run SD τ = {tau:.3g} on the logit scale" if tau is not None and tau == tau else ""
    return (f"no run is proposed: {need}, and none of the candidate runs is expected to narrow it — "
            f"after one more {duration_s:.0f}-s run the expected gap between the estimate and the "
            f"lower bound would be {after or 'not computable'}, against {gap_now:.3g} req/s now "
            f"as the trial fits read it (outcomes simulated from the current fit{spread}; the same "
            "replicates on both sides); a larger --budget-minutes does not "
            "change this first step")


#: simulated outcomes of the honest package that must come out honest (else a run is added)
HONEST_SHARE = 0.5
#: runs at the estimate the package may add after the named runs
MAX_EXTRA = 3


def _outcomes(cur, runs, warm, rng, model, slo) -> list[dict]:
    out = []
    for r in runs:
        for _ in range(r.repeats):
            if model is None:
                out.append(_fit_outcome(cur, r.rate_rps, r.duration_s, warm, rng))
            else:
                out += _model_outcomes(model, r.rate_rps, r.duration_s, warm, slo, 1,
                                       int(rng.integers(2**31)))
    return out


def _spread(env, dur: float, warm: float) -> tuple[list[ProposedRun], str]:
    """Single runs no more than ``MAX_BRACKET_REL`` apart across the bracket the estimate is
    interpolated in, when the bracket is wider than that (nearest the estimate first): a fixed
    fine grid's levels, only where the crossing is. On real AIPerf sweeps a fine grid of single
    runs was honest at once where repeats at a coarse bracket's two levels stayed unsupported
    round after round: levels this close put several runs in the estimate's neighbourhood
    (repeats, whatever rate they were asked at: docs/envelope.md) and narrow the bracket too.
    None where the lower bound is 0 (replicates fail at the lowest rate): that bound needs runs
    below the tested range, and spread after spread left a real GuideLLM loop there.
    Returns the runs and their spacing in words (for the round's note)."""
    from .honesty import MAX_BRACKET_REL, askable, rate_noise_rel

    c = env.cslo
    est = c.estimate
    if c.status != "bracketed" or c.closed_loop or not (est == est and est > 0) \
            or not c.lower_bound > 0:
        return [], ""
    x = env.levels["x"].to_numpy(float)
    nominal = env.levels["load_level"].to_numpy(float)
    i = int(np.searchsorted(x, est, side="right"))
    if i <= 0 or i >= x.size or not x[i] - x[i - 1] > MAX_BRACKET_REL * est:
        return [], ""
    lo, hi = float(nominal[i - 1]), float(nominal[i])
    # levels closer than a run of this length realises its rate merge into one (group_levels):
    # then the step is over 1.1 × that, so each run stays a level of its own
    noise = rate_noise_rel(lo, dur)
    if 1.1 * noise <= MAX_BRACKET_REL:  # as many steps as keep levels ≤ 10 % apart
        n = int(np.ceil(np.log(hi / lo) / np.log1p(MAX_BRACKET_REL)))
        spacing = f"levels ≤ {100 * MAX_BRACKET_REL:g} % apart"
    else:  # as few as keep them > 1.1 × the noise apart (none inside: no spread)
        n = int(np.floor(np.log(hi / lo) / np.log1p(1.1 * noise)))
        spacing = (f"levels {100 * ((hi / lo) ** (1 / max(n, 1)) - 1):.0f} % apart (a {dur:g}-s "
                   f"run realises its rate ± {100 * noise:.0f} %: closer levels would be one)")
    rates = {askable(lo * (hi / lo) ** (j / n)) for j in range(1, n)} - {askable(lo), askable(hi)}
    if not rates:
        return [], ""
    why = f"across the bracket, {spacing}: runs on both sides of the crossing"
    return ([ProposedRun(r, 1, dur, warm, why)
             for r in sorted(rates, key=lambda r: (abs(r - est), r))], spacing)


def _spread_design(env, start, stats, spread, spacing, slo, fit, warm, sims, rng, model, notes, *,
                   budget_minutes, workload, study_path, reps) -> Design:
    """The design of a spread round (``_spread``): those runs alone, whatever the budget (they
    are the fewest that put levels ≤ 10 % apart — or as close as runs of their length can be
    told apart — across the crossing), and as expectation the
    median of ``sims`` trial fits with their simulated outcomes. Not gated on those trial fits:
    on real AIPerf sweeps they called such runs not honest enough and the design added repeats
    and runs at the estimate in the same round, where the measured fit after the spread alone
    (a fine grid near the crossing) was often honest already."""
    from .envelope import fit_from_stats
    from .honesty import MAX_BRACKET_REL

    envs = [fit_from_stats(add_runs(stats, _outcomes(start, spread, warm, rng, model, slo)),
                           slo, **fit) for _ in range(max(int(sims), 2))]
    med = sorted(envs, key=lambda e: e.cslo.lower_bound)[len(envs) // 2]
    honest = sum(e.honesty is not None and e.honesty.honest for e in envs)
    minutes = sum(r.minutes for r in spread)
    notes = [*notes, (
        f"the bound is unsupported and the crossing is interpolated across a bracket wider than "
        f"{100 * MAX_BRACKET_REL:g} % of the estimate: {len(spread)} single run(s) across it "
        f"first, {spacing}; the fit after them decides whether "
        f"repeats are needed (they came out honest in {honest} of {len(envs)} simulated outcomes)")]
    if minutes > budget_minutes:
        notes.append(f"these runs take {minutes:.0f} min, more than the budget of "
                     f"{budget_minutes:g} min: kept whole, the fewest that narrow the bracket")
    return _design(env, start, stats, spread, med, notes, slo=slo, budget_minutes=budget_minutes,
                   model=model, workload=workload, study_path=study_path, reps=reps)


def _honest_package(start, stats, slo, fit, warm, sims, rng, model, max_duration_s=None):
    """The cheapest runs expected to make an unsupported bound honest: the runs the honesty
    rule names (``Honesty.runs_to_add``), taken one at a time — nearest the estimate first,
    alternating between the rates — then runs at the estimate, until at least
    ``HONEST_SHARE`` of ``sims`` simulated outcomes of the set come out honest.
    Returns (runs, the median outcome's envelope, its stats, a note saying what is expected)."""
    from .envelope import fit_from_stats
    from .honesty import askable

    est = start.cslo.estimate
    add = sorted(start.honesty.runs_to_add,
                 key=lambda r: abs(r.rate_rps - est) if est == est else 0.0)
    dur, cap_note = add[0].duration_s, ""
    if max_duration_s and dur > max_duration_s:  # ``warm`` is already propose's (capped) one
        dur, _, cap_note = _capped(dur, warm, max_duration_s)
        add = [replace(r, duration_s=min(r.duration_s, dur)) for r in add]
    singles = []
    for k in range(max(r.repeats for r in add)):
        singles += [r for r in add if r.repeats > k]
    at = askable(est) if est == est and est > 0 else add[0].rate_rps
    singles += [replace(add[0], rate_rps=at, repeats=1, duration_s=dur,
                        why="at the estimate: more runs with both outcomes")] * MAX_EXTRA
    sims = max(int(sims), 2)
    runs: list[ProposedRun] = []
    for i, r in enumerate(singles):
        same = [j for j, q in enumerate(runs) if abs(q.rate_rps - r.rate_rps) < 1e-9]
        if same:
            runs[same[0]] = replace(runs[same[0]], repeats=runs[same[0]].repeats + 1)
        else:
            runs.append(ProposedRun(r.rate_rps, 1, r.duration_s, warm, r.why))
        if i + 1 < min(2, len(singles)):
            continue  # one run alone never makes repeats
        envs = [fit_from_stats(add_runs(stats, _outcomes(start, runs, warm, rng, model, slo)),
                               slo, **fit) for _ in range(sims)]
        honest = sum(e.honesty is not None and e.honesty.honest for e in envs)
        if honest >= HONEST_SHARE * sims:
            break
    med = sorted(envs, key=lambda e: e.cslo.lower_bound)[len(envs) // 2]
    n = sum(r.repeats for r in runs)
    note = (f"the bound is unsupported: the honesty rule asks for repeats near the crossing; "
            f"the {n} run(s) proposed first are the fewest that came out honest in {honest} of "
            f"{sims} simulated outcomes" + (f"; {cap_note}" if cap_note else ""))
    return runs, med, med.stats, note


# ------------------------------------------------------------------------------ files

def write_design(design: Design, path: str | os.PathLike, commands=None) -> Path:
    """design.yaml; with ``commands`` (``Design.commands(...)``) the printed commands too, per
    tool, so a script can run them exactly as printed."""
    from .io import write_text_atomic

    d = design.to_dict()
    if commands is not None:
        d["commands"] = {t: {"commands": list(p.commands), "import": p.import_command or None,
                             "reason": p.reason or None}
                         for t, p in ((p.tool, p) for p in commands.plans)}
        d["seed_base"] = commands.seed_base
    text = yaml.safe_dump(d, sort_keys=False, allow_unicode=True)
    write_text_atomic(path, text)
    return Path(path)


def load_design(path: str | os.PathLike) -> dict:
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecError("design file not found", file=str(p), fix="write one with capplan design")
    try:
        d = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"design file is not valid YAML: {exc}", file=str(p)) from None
    if not isinstance(d, dict) or d.get("format") != DESIGN_FORMAT:
        raise SpecError(f"not a capplan design file (format: {DESIGN_FORMAT})", file=str(p),
                        fix="write one with capplan design STUDY --slo ... --out design.yaml")
    for i, r in enumerate(list(d.get("existing") or []) + list(d.get("next_runs") or [])):
        for k in ("rate_rps", "duration_s"):
            if not isinstance(r.get(k), (int, float)) or not r[k] > 0:
                raise SpecError(f"run {i}: {k} must be a positive number", file=str(p),
                                field=k)
    return d


def design_plans(d: dict):
    """The synth RunPlans of a design: the existing sweep, then the next runs."""
    from .sim.sweep import RunPlan

    plans, i = [], 0
    for r in d.get("existing") or []:
        for k in range(int(r.get("runs", 1))):
            plans.append(RunPlan(i, f"r{i + 1:02d}", float(r["rate_rps"]), k,
                                 float(r["duration_s"])))
            i += 1
    for r in d.get("next_runs") or []:
        for k in range(int(r.get("repeats", 1))):
            plans.append(RunPlan(i, f"r{i + 1:02d}", float(r["rate_rps"]), k,
                                 float(r["duration_s"])))
            i += 1
    return tuple(plans)


def design_warmup(d: dict) -> float:
    w = [float(r.get("warmup_s", 0.0)) for r in (d.get("existing") or [])
         + (d.get("next_runs") or [])]
    return float(np.median(w)) if w else 0.0


__all__ = ["Design", "ProposedRun", "propose", "write_design", "load_design", "design_plans",
           "add_runs", "model_config"]
