"""What to do next, dated: the end of the report's answer (docs/report.md, "Next steps").

A pure function of what the report exported — the plan record (``capplan.plan.sensitivity.
plan_record``: the fleet steps, the per-quarter sensitivity bands, the honesty verdict, the
mix comparison), the envelope JSON, the simulated plan checks (``data/timeline/
plan-simulated.csv``, written by the timelines page with a twin) and the mix page's production
mix rows — so every step is computed from the study's own results, and a step appears only
when those results call for it:

1. **capacity**: the fleet on the plan's first day, then each quarter that needs more (or
   fewer) groups, dated by the day its planned demand passes what the fleet before carries
   (``capplan.plan.fleet_steps``);
2. **runs before signing** (by the plan's first day): the runs the honesty verdict names when
   the lower bound is not honest; otherwise whether narrowing it could change the plan — a
   quarter that would need fewer groups on the estimate (a saving), or whose band the C_SLO
   interval reaches below (a possible shortfall) — with the exact ``capplan design`` command;
   when neither, why no run is needed;
3. **what to test next**: production's mix when it gives a lower capacity than the tested mix;
   the failure, rollout or cold-start case when its simulation on the twin broke the SLO
   although the static check holds; longer runs when the runs near the crossing were still
   settling; higher rates when every tested rate met the SLO.
"""

from __future__ import annotations

import datetime as dt
import math
import shlex
from dataclasses import dataclass

from .plan.text import plural

#: the timelines page and its section with the plan's checks simulated on the twin
TIMELINES_PAGE = "08-timelines.html"
SIMULATED_ANCHOR = "The-plan,-simulated"

CAPACITY, RUNS, TESTS = "capacity", "runs", "tests"
KINDS = ((CAPACITY, "Capacity: what to have in place, by when"),
         (RUNS, "Runs to make before signing (or before the quarter they affect)"),
         (TESTS, "What to test next"))


@dataclass(frozen=True)
class NextStep:
    """One step: its kind, the day it is due, its words, and optionally a page that shows why."""

    kind: str
    by: dt.date | None
    text: str
    command: str = ""
    link: str = ""
    link_text: str = ""

    @property
    def by_text(self) -> str:
        return day_text(self.by) if self.by is not None else ""


def day_text(d: dt.date) -> str:
    """'1 Apr 2027'."""
    return f"{d.day} {d:%b %Y}"


def _date(v) -> dt.date | None:
    if v is None or v == "":
        return None
    if isinstance(v, dt.date):
        return v
    return dt.date.fromisoformat(str(v)[:10])


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def simulated_breaks(rows: list[dict] | None) -> dict[str, dict]:
    """The simulated plan checks that broke the SLO (SLO-minutes caused or good requests lost
    against the same run without the event), by check key (failure, rollout, cold_start)."""
    out = {}
    for r in rows or []:
        minutes, lost = _num(r.get("slo_minutes_caused")) or 0.0, _num(r.get("good_requests_lost")) or 0.0
        if minutes > 0 or lost > 0:
            out.setdefault(str(r.get("check", "")), r)
    return out


def simulated_words(r: dict) -> str:
    """'losing zone a (3 of 8 groups) at the 2027Q1 peak (8 req/s) broke the SLO for 20 s
    (0.333 SLO-minutes caused), 144 good requests lost'."""
    breach = _num(r.get("breach_s")) or 0.0
    minutes = _num(r.get("slo_minutes_caused")) or 0.0
    lost = int(_num(r.get("good_requests_lost")) or 0)
    return (f"{r.get('what', r.get('check', 'the event'))} broke the SLO for {breach:,.0f} s "
            f"({minutes:.3g} SLO-minutes caused), {lost:,} good requests lost")


def _first_day(plan: dict) -> dt.date | None:
    qs = plan.get("quarters") or []
    return _date(qs[0].get("start")) if qs else None


def _verdict(plan: dict, env: dict | None) -> dict:
    h = (plan.get("capacity") or {}).get("honesty")
    return h if isinstance(h, dict) and h.get("status") else ((env or {}).get("honesty") or {})


def _design_command(params: dict) -> str:
    study, slo = params.get("study"), params.get("SLO")
    if not study or not slo:
        return ""
    return f"capplan design {shlex.quote(str(study))} --slo {shlex.quote(str(slo))}"


def _bracketing_rates(env: dict | None) -> list[float]:
    """The tested rates (as asked) on either side of the C_SLO estimate."""
    cslo = (env or {}).get("cslo") or {}
    est = _num(cslo.get("estimate"))
    levels = [(float(lv["x"]), float(lv.get("load_level", lv["x"]))) for lv in (env or {}).get("levels") or []
              if _num(lv.get("x")) is not None]
    if est is None or not levels:
        return []
    below = [n for x, n in levels if x <= est]
    above = [n for x, n in levels if x > est]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def capacity_steps(plan: dict) -> list[NextStep]:
    return [NextStep(CAPACITY, _date(s["by"]), s["sentence"]) for s in plan.get("fleet_steps") or []]


def runs_before_signing(plan: dict, env: dict | None, params: dict) -> list[NextStep]:
    """Runs to make before signing (module docstring, 2)."""
    cap = plan.get("capacity") or {}
    sens = plan.get("sensitivity") or {}
    start = _first_day(plan)
    unit = cap.get("unit") or "req/s"
    cmd = _design_command(params)
    if cap.get("estimate") is None and cap.get("lower_bound") is None:
        return [NextStep(RUNS, start, f"None from this report: the capacity was given ({cap.get('source', '')}), "
                                      "not measured; a load-test sweep would measure it and its interval.")]
    h = _verdict(plan, env)
    status = h.get("status") or ""
    runs = h.get("runs_to_add") or []
    if status and status != "honest":
        if runs:
            from .honesty import RunToAdd

            what = "; ".join(RunToAdd.from_dict(r).describe() for r in runs)
            text = (f"Make these runs before signing: the lower bound the plan stands on is {status} "
                    f"({h.get('sentence', '')}). Runs: {what}. The command prints the load-test commands "
                    "and the bound expected after them.")
        else:
            text = (f"The lower bound the plan stands on is {status} ({h.get('sentence', '')}); "
                    + "; ".join(str(r) for r in h.get("reasons") or []) + ". Measure it before signing.")
        return [NextStep(RUNS, start, text, command=cmd)]
    bands = sens.get("quarters") or []
    other = sens.get("other_name") or "other number"
    other_value = _num(cap.get("estimate") if other == "estimate" else cap.get("lower_bound"))
    verdict = "the lower bound is honest" if status == "honest" else "the envelope gives no verdict on its lower bound"
    why = f" ({h['sentence']})" if status == "honest" and h.get("sentence") else ""
    ci_low = _num(cap.get("ci_low"))
    fewer = [q for q in bands if q.get("other_groups") is not None and q["other_groups"] < q["groups"]]
    more = [q for q in bands if q.get("other_groups") is not None and q["other_groups"] > q["groups"]]
    short = [q for q in bands if ci_low is not None and ci_low < q["low_system"] * (1 - 1e-9)]
    out = []
    rates = _bracketing_rates(env)
    where = (f" (repeats at {' and '.join(f'{r:g}' for r in rates)} {unit}, the tested rates either side "
             "of C_SLO)" if rates else "")
    if more:  # planned on the estimate; the lower bound needs more
        out.append(NextStep(RUNS, start,
                            f"The plan stands on the estimate, which makes no lower-bound claim: on the {other} "
                            f"({other_value:.4g} {unit}) it would need more replica groups in "
                            + "; ".join(f"{x['quarter']} ({x['other_groups']} instead of {x['groups']})" for x in more)
                            + f". Narrow the interval before signing{where}, or plan on the {other}.", command=cmd))
    if fewer:
        q = fewer[0]
        saved = "; ".join(f"{x['quarter']}: {x['other_groups']} instead of {x['groups']}" for x in fewer)
        out.append(NextStep(RUNS, min(_date(x["start"]) for x in fewer),
                            f"Narrowing the C_SLO interval could save groups: planned on the {other} "
                            f"({other_value:.4g} {unit}) the plan would need fewer replica groups in "
                            f"{plural(len(fewer), 'quarter')} ({saved}; {q['quarter']} needs fewer than "
                            f"{q['groups']} from a C_SLO of {q['high_system']:.4g} {unit}). As {verdict}, these "
                            f"runs are optional{where}; the command says whether any is expected to narrow it, "
                            "and by how much.", command=cmd))
    if short:
        q = short[0]
        out.append(NextStep(RUNS, min(_date(x["start"]) for x in short),
                            f"The C_SLO interval reaches below the band of "
                            f"{', '.join(x['quarter'] for x in short)}: {q['quarter']} keeps {plural(q['groups'], 'group')} "
                            f"only for C_SLO ≥ {q['low_system']:.4g} {unit}, and the interval's low end is "
                            f"{ci_low:.4g} {unit}; a capacity there would need {plural(q['groups_below'], 'group')}. "
                            f"Runs that narrow the interval{where} tell which, before that quarter starts.",
                            command=cmd))
    if not out:
        groups = ", ".join(str(q["groups"]) for q in bands)
        edge = [q["quarter"] for q in bands if q.get("knife_edge")]
        inside = ("the C_SLO interval lies inside every quarter's band" if not edge else
                  f"the interval's top reaches past the band of {', '.join(edge)}, which only the estimate "
                  "moving up could use")
        out.append(NextStep(RUNS, start,
                            f"None needed: {verdict}{why}, and narrowing it cannot change the plan — planned on the "
                            f"{other} " + (f"({other_value:.4g} {unit}) " if other_value is not None else "")
                            + f"every quarter keeps its groups ({groups}), and {inside}."))
    return out


def what_to_test(plan: dict, env: dict | None, params: dict, dynamics: list[dict] | None = None,
               mix: list[dict] | None = None, pages: tuple[str, ...] = ()) -> list[NextStep]:
    """What to test next (module docstring, 3)."""
    start = _first_day(plan)
    cap = plan.get("capacity") or {}
    out = []
    rows = list(plan.get("mix_comparison") or []) + list(mix or [])
    lower = [r for r in rows if r.get("production_lower")]
    if lower:
        r = min(lower, key=lambda x: _num(x.get("rps_per_group")) or math.inf)
        used = r.get("used_basis") or cap.get("basis") or "tested mix"
        if str(used).startswith("target"):
            text = (f"Test the production mix: the plan stands on the {used} (not measured at that mix); "
                    f"a sweep with production's request lengths near C_SLO measures it.")
        else:
            extra = _num(r.get("delta_cost_usd_per_month"))
            qs = plan.get("quarters") or []
            now = f" instead of {qs[0]['groups']}" if qs else ""
            text = (f"Test the production mix: on the {r.get('basis')}, {_num(r.get('rps_per_group')):.4g} req/s "
                    f"per group ({r.get('status')}), the first quarter would need "
                    f"{plural(r.get('groups', 0), 'replica group')} = {int(r.get('gpus', 0)):,} GPUs{now}"
                    + (f" (+${extra:,.0f} per month)" if extra is not None else "")
                    + ". A sweep with production's request lengths near C_SLO measures it instead of "
                      "reweighting the tested one.")
        out.append(NextStep(TESTS, start, text, link="07-mix.html" if "07-mix.html" in pages else ""
                            , link_text="Production mix page"))
    names = {"failure": "the failure-domain case", "rollout": "the rollout", "cold_start": "the cold start"}
    for key, r in simulated_breaks(dynamics).items():
        link = f"{TIMELINES_PAGE}#{SIMULATED_ANCHOR}" if TIMELINES_PAGE in pages else ""
        out.append(NextStep(TESTS, start,
                            f"Test {names.get(key, key)}: simulated on the twin at the planned size, "
                            f"{simulated_words(r)}, although the plan's static {key.replace('_', '-')} check holds. "
                            "Drill it on the real fleet, or size the reserve to an SLO-minute budget B "
                            "(the command finds the smallest fleet and warm floor within B).",
                            command=_simulate_command(params), link=link, link_text="Timelines: the plan, simulated"))
    estimand = str(_verdict(plan, env).get("estimand") or "")
    if "were still settling at their end" in estimand:  # capplan.honesty.estimand's words
        longer = _longer_runs_s(env)
        rates = _bracketing_rates(env)
        out.append(NextStep(TESTS, start,
                            "Test longer runs: the runs near the crossing were still settling at their end, so the "
                            "steady-state capacity is likely lower than C_SLO; repeat "
                            + (" and ".join(f"{x:g}" for x in rates) + " req/s " if rates else "the rates near C_SLO ")
                            + (f"with runs of {longer:.0f} s or more." if longer else "with runs twice as long."),
                            command=_design_command(params)))
    cslo = (env or {}).get("cslo") or {}
    if str(cslo.get("status", "")).startswith("≥"):
        rates = ", ".join(f"{x:g}" for x in cslo.get("suggested_rates") or [])
        out.append(NextStep(TESTS, start,
                            "Test higher rates: every tested rate met the SLO, so C_SLO is only known to be at least "
                            "the largest tested rate and the plan is conservative"
                            + (f"; suggested rates {rates} req/s." if rates else "."),
                            command=_design_command(params)))
    return out


def _simulate_command(params: dict) -> str:
    study, spec, twin = params.get("study"), params.get("plan spec"), params.get("twin")
    if not (study and spec and twin):
        return ""
    q = shlex.quote
    return (f"capplan plan {q(str(study))} --spec {q(str(spec))} --out plan-simulated "
            f"--twin {q(str(twin))} --slo-minutes-budget B")


def _longer_runs_s(env: dict | None) -> float | None:
    from .design import MIN_DURATION_S
    from .honesty import nominal_duration

    runs = [r for r in (env or {}).get("runs") or [] if r.get("usable") and _num(r.get("duration_s"))]
    if not runs:
        return None
    d = sorted(float(r["duration_s"]) for r in runs)[len(runs) // 2]
    return max(2.0 * nominal_duration(d), MIN_DURATION_S)


def next_steps(plan: dict, env: dict | None = None, params: dict | None = None,
               dynamics: list[dict] | None = None, mix: list[dict] | None = None,
               pages: tuple[str, ...] = ()) -> list[NextStep]:
    """Every next step, capacity first, then runs, then tests (module docstring). ``params``:
    the report's provenance rows as a dict (study, SLO, plan spec, twin); ``pages``: the
    report's page files, for links."""
    params = params or {}
    return (capacity_steps(plan) + runs_before_signing(plan, env, params)
            + what_to_test(plan, env, params, dynamics, mix, pages))
