"""The report's front page: the answer first, then how sure it is, then the checks.

``index_html`` is a pure function of what the report's notebooks exported — ``data/plan.json``
(``capplan.plan.sensitivity.plan_record``: the plan's words, dated quarters, checks, sensitivity),
``data/envelope.json`` (C_SLO, its interval, notes, and the bound's honesty when the envelope
gives one) and, with a baseline, ``data/compare/verdict.csv`` — so it shows exactly the
exported numbers. Order, as a planner reads it:

1. the answer in words (next quarter's groups, GPUs and billed GPUs, nodes, cost per
   month/quarter/year, cost per 1 000 SLO-meeting requests), which C_SLO it stands on (tested
   mix, target mix, twin, SLO classes) and whether that bound is honest, and a dated table per
   quarter — preceded, when production's mix gives a lower capacity than the tested mix, by
   that fact, the number the plan used and what the other would cost;
2. **how sure**: the C_SLO interval, what the plan assumes (lower bound or estimate), the
   sensitivity band, and whether the lower bound can be trusted with the runs to add;
   The answer ends with **next steps**, each dated (``capplan.next_steps``): the nodes to have
   or add by when, the runs to make before signing, what to test next;
2b. the sensitivity band of every quarter sits in the quarter table;
3. the checks, failing and caveated ones first; a check that holds on paper but broke the SLO
   when the timelines page simulated it on the twin (``data/timeline/plan-simulated.csv``)
   says so in numbers, linked to that page;
4. what the plan assumes (policy, rollout, prices), links, parameters and provenance.

Every term's first use links to the glossary page.
"""

from __future__ import annotations

import csv
import html
import json
import math
from dataclasses import dataclass
from pathlib import Path

from .glossary import for_readers, link_terms
from .present import MISSING
from .honesty import RunToAdd
from .next_steps import KINDS, SIMULATED_ANCHOR, TIMELINES_PAGE, NextStep, next_steps, simulated_breaks, \
    simulated_words
from .plan.text import plural

e = html.escape


@dataclass(frozen=True)
class IndexInputs:
    """What the index shows besides the exported records."""

    study_name: str
    study_hash: str
    pages: tuple[tuple[str, str], ...]  # (file, title)
    exports: tuple[str, ...]  # relative paths under the report
    parameters: tuple[tuple[str, str], ...]  # (label, value) for the provenance table
    baseline: bool = False


def read_records(data_dir: Path) -> tuple[dict | None, dict | None, dict | None]:
    """(plan record, envelope dict, comparison verdict) from a report's data folder."""
    plan = env = verdict = None
    p = data_dir / "plan.json"
    if p.is_file():
        plan = json.loads(p.read_text(encoding="utf-8"))
    p = data_dir / "envelope.json"
    if p.is_file():
        env = json.loads(p.read_text(encoding="utf-8"))
    p = data_dir / "compare" / "verdict.csv"
    if p.is_file():
        items = list(csv.DictReader(p.read_text(encoding="utf-8-sig").splitlines()))
        verdict = {"passed": any(r.get("item") == "passed" and r.get("text") == "True" for r in items),
                   "failed": [r.get("text", "") for r in items if r.get("item") == "gate failed"],
                   "regressed": [r.get("text", "") for r in items if r.get("item") == "bucket regressed"]}
    return plan, env, verdict


# ----------------------------------------------------------------------------- number words


def usd(v, cents: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return MISSING
    return f"${v:,.2f}" if cents else f"${v:,.0f}"


def rate(v, unit: str = "req/s") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return MISSING
    return f"{v:.4g} {unit}"


def _date_text(start: str, end: str) -> str:
    import datetime as dt

    a, b = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    if a.year == b.year:
        return f"{a.day} {a:%b} – {b.day} {b:%b %Y}"
    return f"{a.day} {a:%b %Y} – {b.day} {b:%b %Y}"


# ----------------------------------------------------------------------------- sections


def _verdict(plan: dict, env: dict | None) -> dict:
    """The honesty verdict of the number the plan stands on: the plan's own (every path —
    tested mix, target mix, twin, SLO classes — records one), else the headline envelope's."""
    h = (plan.get("capacity") or {}).get("honesty")
    return h if isinstance(h, dict) and h.get("status") else ((env or {}).get("honesty") or {})


def _basis(plan: dict) -> str:
    b = (plan.get("capacity") or {}).get("basis") or ""
    return {"": "", "tested mix": " at the tested mix", "SLO classes": " with every SLO class meeting its own SLO"}.get(
        b, f" at the {b}")


def _bound_words(plan: dict, env: dict | None) -> str:
    """One sentence for the answer box: which C_SLO number the plan stands on (the tested mix,
    the target mix reweighted or through the twin, the SLO classes) and whether that lower
    bound is honest (docs/envelope.md, "Is the bound honest?"; docs/plan.md, "Honest numbers only")."""
    cap = plan.get("capacity") or {}
    h = _verdict(plan, env)
    status = h.get("status")
    if not status:
        return ""
    on = (cap.get("uses") or ("lower bound" if "lower bound" in str(cap.get("source", "")) else "estimate")) \
        + _basis(plan)
    if status == "honest":
        return (f' <span id="bound-honesty">Planned on the C_SLO {e(on)}; the lower bound is <b>honest</b>: '
                "it includes the run-to-run variation measured near the crossing.</span>")
    accepted = " (accepted with accept_optimistic)" if on.startswith("lower bound") else ""
    return (f' <span id="bound-honesty">Planned on the C_SLO {e(on)}; the lower bound is <b>{e(status)}</b>'
            f"{accepted}: "
            f"{e(for_readers(_first_sentence(str(h.get('sentence', '')))))} — see “Can the lower bound be "
            "trusted?” for the runs to add.</span>")


def mix_words(plan: dict, extra: list[dict] | None = None) -> str:
    """Production's mix against the tested mix, said before the answer when production's mix
    (reweighted, or through the twin on the mix page: ``extra``) gives a lower capacity than
    the tested mix: which number the plan used and what the other would cost."""
    rows = list(plan.get("mix_comparison") or []) + list(extra or [])
    if not rows:
        return ""
    lower = [r for r in rows if r.get("production_lower")]
    lead = "Production's mix gives a lower capacity than the tested mix"
    items = "".join("<p>" + e(str(r.get("sentence", ""))).replace(e(lead), f"<b>{e(lead)}</b>", 1) + "</p>"
                    for r in (lower or rows))
    return f'<div class="{"warn" if lower else "def"}" id="production-mix">{items}</div>'


def read_dynamics(data_dir: Path) -> list[dict]:
    """The plan's checks simulated on the twin by the timelines page
    (``data/timeline/plan-simulated.csv``, ``capplan.plan.dynamics.PlanDynamics.to_frame``);
    [] without a twin."""
    p = data_dir / "timeline" / "plan-simulated.csv"
    if not p.is_file():
        return []
    return list(csv.DictReader(p.read_text(encoding="utf-8-sig").splitlines()))


def _simulated_link(pages: tuple[str, ...]) -> str:
    return (f' — <a href="{TIMELINES_PAGE}#{SIMULATED_ANCHOR}">Timelines: the plan, simulated</a>'
            if TIMELINES_PAGE in pages else "")


def answer_section(plan: dict, verdict: dict | None, env: dict | None = None,
                   mix: list[dict] | None = None, steps: list[NextStep] | None = None,
                   dynamics: list[dict] | None = None, pages: tuple[str, ...] = ()) -> str:
    q = plan["quarters"][0]
    about = dict(plan["about"])
    billed, gpus = q["billed_gpus"], q["gpus"]
    when = f"{q['quarter']} ({_date_text(q['start'], q['end'])})"
    billed_text = (f" (<b>{billed:,} billed GPUs</b>: {'whole nodes are paid' if billed > gpus else 'as used'})"
                   if billed != gpus else "")
    words = (f'<p class="answer" id="answer-text">For <b>{e(when)}</b> the plan needs '
             f"<b>{plural(q['groups'], 'replica group')} = {gpus:,} GPUs</b> on {plural(q['nodes'], 'node')}{billed_text}, "
             f"costing <b>{usd(q['cost_usd_per_month'])} per month</b> ({usd(q['cost_usd_per_quarter'])} per "
             f"quarter, {usd(q['cost_usd_per_year'])} per year at this size) — "
             f"<b>{usd(q['cost_usd_per_1k_good_requests'], cents=True)} per 1 000 SLO-meeting requests</b>. "
             f"It serves a peak demand of {rate(q['peak_rps'])}, planned at {rate(q['demand_rps'])} with the "
             f"demand uncertainty{_burst_words(plan)}, at {e(about.get('SLO', 'the SLO'))}, and is sized to "
             f"{e(about.get('failure policy', ''))}.{_bound_words(plan, env)}</p>")
    warn = []
    failed = [c for c in plan["checks"] if not c["ok"]]
    if failed:
        warn.append("<b>The plan fails " + plural(len(failed), "check") + "</b>: "
                    + "; ".join(e(c["sentence"]) for c in failed) + ".")
    sens = plan.get("sensitivity") or {}
    if sens.get("knife_edge"):
        up, down = sens.get("up") or {}, sens.get("down") or {}
        warn.append("<b>Knife-edge</b>: the capacity interval reaches past the range where this plan holds "
                    f"(C_SLO {rate(sens['low_system'])} to {rate(sens.get('high_system'))}); "
                    + (f"{plural(down['groups'], 'group')} would do at the top of the interval, " if down else "")
                    + (f"{plural(up['groups'], 'group')} would be needed below it" if up else "") + " — see how sure.")
    broken = simulated_breaks(dynamics)
    held = {c["key"] for c in plan["checks"] if c["ok"]}
    for key, r in broken.items():
        if key in held:
            warn.append(f"<b>Holds on paper, not when simulated</b>: on the twin at the planned size, "
                        f"{e(simulated_words(r))}, although the plan's {e(key.replace('_', '-'))} check holds"
                        + _simulated_link(pages) + ".")
    caveats = [c for c in plan["checks"] if c["ok"] and c.get("caveat")]
    if caveats:
        warn.append("<b>Caveat</b>: " + "; ".join(e(_first_sentence(for_readers(c["caveat"]))) for c in caveats)
                    + " — see how sure.")
    if verdict is not None:
        warn.append(("Comparison with the baseline: <b>PASS</b> (every gate passes)." if verdict["passed"] else
                     f"Comparison with the baseline: <b>FAIL</b> ({plural(len(verdict['failed']), 'gate')} failed, "
                     f"{plural(len(verdict['regressed']), 'bucket')} regressed: "
                     + "; ".join(e(x) for x in verdict["failed"] + verdict["regressed"]) + ")."))
    warn_html = "".join(f'<p class="warn">{w}</p>' for w in warn)
    first = mix_words(plan, mix)
    tail = f"{quarters_table(plan)}\n{next_steps_block(steps or [])}"
    bursty = [c for c in plan["checks"] if c["key"] == "burstiness" and not c["ok"]]
    if bursty:  # production burstier than anything tested: the headline says so first
        first = (f'<p class="warn" id="burstiness"><b>Production is burstier than the sweep</b>: '
                 f'{e(bursty[0]["sentence"])}.</p>\n' + first)
    if first and 'class="warn"' in first:  # production's mix gives less: said first
        return f'<section id="answer">\n{first}\n{words}\n{warn_html}\n{tail}\n</section>'
    return f'<section id="answer">\n{words}\n{warn_html}\n{first}\n{tail}\n</section>'


def _burst_words(plan: dict) -> str:
    """' and a burst factor of f' when the plan sized its peak with one (docs/plan.md,
    "Production burstiness")."""
    f = ((plan.get("items") or {}).get("burst_factor") or {}).get("value")
    return f" and a burst factor of {f:.4g}" if isinstance(f, (int, float)) else ""


def contract_section(plan: dict) -> str:
    """The capacity contract (``capplan.plan.contract``): what the planned capacity holds for,
    one row per clause with its source; nothing for a record written before the contract."""
    rows = "".join(f'<tr><th>{e(c["clause"])}</th><td>{e(c["text"])}<br><small>source: {e(c["source"])}</small>'
                   "</td></tr>" for c in plan.get("contract") or [])
    if not rows:
        return ""
    return ('<section id="contract"><h2>Capacity contract</h2><p>The capacity above holds for this workload, '
            f"tail SLO and goodput, with this headroom and overload response.</p><table>{rows}</table></section>")


def next_steps_block(steps: list[NextStep]) -> str:
    """The answer's last part: the dated next steps by kind (``capplan.next_steps``)."""
    if not steps:
        return ""
    parts = ['<div id="next-steps"><h2>Next steps</h2>']
    for kind, title in KINDS:
        mine = [s for s in steps if s.kind == kind]
        if not mine:
            continue
        items = []
        for s in mine:
            # the date leads the step, unless its words already name it (a fleet step's "before …")
            when = (f'<span class="due">by {e(s.by_text)}</span> '
                    if s.by is not None and s.by_text not in s.text else "")
            cmd = f'<br><code class="cmd">{e(s.command)}</code>' if s.command else ""
            link = f' <a href="{e(s.link)}">{e(s.link_text or s.link)}</a>' if s.link else ""
            items.append(f'<li data-by="{s.by.isoformat() if s.by else ""}">{when}{e(s.text)}{link}{cmd}</li>')
        parts.append(f'<h3>{e(title)}</h3><ul class="steps" data-kind="{kind}">{"".join(items)}</ul>')
    parts.append("</div>")
    return "".join(parts)


def _first_sentence(text: str) -> str:
    parts = [p.strip() for p in text.split(";") if p.strip()]
    short = [p for p in parts if "too high" in p] or parts
    return short[0]


#: the quarter table's columns: (record key, header, format)
QUARTER_VIEW = (
    ("peak_rps", "Peak demand (req/s)", "rate"),
    ("demand_rps", "Planned demand incl. uncertainty (req/s)", "rate"),
    ("groups", "Replica groups", "int"), ("gpus", "GPUs in groups", "int"),
    ("billed_gpus", "Billed GPUs", "int"), ("nodes", "Nodes", "int"),
    ("cost_usd_per_month", "Cost per month (USD)", "usd"),
    ("cost_usd_per_quarter", "Cost per quarter (USD)", "usd"),
    ("cost_usd_per_year", "Cost per year at this size (USD)", "usd"),
    ("cost_usd_per_1k_good_requests", "Cost per 1 000 SLO-meeting requests (USD)", "usd2"),
)


def _cell(v, fmt: str) -> str:
    if v is None:
        return MISSING
    if fmt == "int":
        return f"{int(v):,}"
    if fmt == "usd":
        return usd(v)
    if fmt == "usd2":
        return usd(v, cents=True)
    return f"{v:.4g}"


def _band_cell(b: dict | None) -> str:
    """A quarter's sensitivity band: the C_SLO range over which it keeps its groups."""
    if not b:
        return f'<td class="num" data-col="band">{MISSING}</td>'
    hi = f"{b['high_system']:.4g}" if b.get("high_system") is not None else "∞"
    edge = ' <b class="edge">knife-edge</b>' if b.get("knife_edge") else ""
    return (f'<td class="num" data-col="band" data-low="{b["low_system"]!r}" data-high="{b.get("high_system")!r}">'
            f'{b["low_system"]:.4g}–{hi}{edge}</td>')


def quarters_table(plan: dict) -> str:
    bands = {b["quarter"]: b for b in (plan.get("sensitivity") or {}).get("quarters") or []}
    unit = (plan.get("capacity") or {}).get("unit") or "req/s"
    band_head = f'<th class="num">Plan holds for C_SLO ({e(unit)})</th>' if bands else ""
    head = "".join(f'<th class="num">{e(h)}</th>' for _, h, _ in QUARTER_VIEW) + band_head
    rows = []
    for q in plan["quarters"]:
        cells = "".join(f'<td class="num" data-col="{k}">{_cell(q.get(k), f)}</td>' for k, _, f in QUARTER_VIEW)
        if bands:
            cells += _band_cell(bands.get(q["quarter"]))
        rows.append(f'<tr data-quarter="{e(q["quarter"])}"><th>{e(q["quarter"])}<br>'
                    f'<small>{e(_date_text(q["start"], q["end"]))}</small></th>{cells}</tr>')
    years = "".join(
        f'<tr class="total"><th>{e(y["period"])}<br><small>{e(_date_text(y["start"], y["end"]))}</small></th>'
        f'<td colspan="7"></td><td class="num" data-col="cost_usd_total">{usd(y["cost_usd"])}</td>'
        f'<td colspan="{2 + bool(bands)}"><small>total cost</small></td></tr>'
        for y in plan.get("years", []))
    cap = (" The last column is the sensitivity band of each quarter: the C_SLO range over which that "
           "quarter keeps its replica groups; knife-edge when the C_SLO interval reaches past it." if bands else "")
    return (f'<div class="scroll"><table id="quarters" class="grid"><caption>The plan by quarter (dated; '
            f'the first row is the answer above).{e(cap)}</caption>\n<thead><tr><th>Quarter</th>{head}</tr></thead>\n'
            f'<tbody>{"".join(rows)}{years}</tbody></table></div>')


def how_sure_section(plan: dict, env: dict | None) -> str:
    cap = plan["capacity"]
    sens = plan.get("sensitivity") or {}
    unit = cap.get("unit") or "req/s"
    out = ['<section id="how-sure"><h2>How sure is this?</h2>']
    if cap.get("estimate") is not None:
        conf = cap.get("confidence") or 0.95
        r = cap.get("replicas") or 1
        out.append(
            f'<h3>The capacity measured</h3><p id="capacity-interval">C_SLO of the tested system '
            f"({plural(r, 'replica')}): estimate <b>{rate(cap['estimate'], unit)}</b>; {conf:.0%} confidence "
            f"interval <b>{rate(cap['ci_low'], unit)} to {rate(cap['ci_high'], unit)}</b>; lower bound "
            f"<b>{rate(cap['lower_bound'], unit)}</b> (status: {e(str(cap.get('status') or ''))}).</p>"
            f'<p class="def">The lower bound ({conf:.0%}, one-sided) can sit above the interval\'s low end: it '
            f"leaves all {1 - conf:.0%} of the doubt on the low side, where the two-sided interval leaves "
            f"{(1 - conf) / 2:.1%} on each side.</p>")
        other = "estimate" if cap.get("uses") == "lower bound" else "lower bound"
        out.append(
            f'<h3>What the plan assumes</h3><p id="plan-assumes">The plan uses the C_SLO <b>{e(cap["uses"])}</b>: '
            f"{rate(sens.get('used_system'), unit)} ÷ {plural(r, 'replica')} = <b>{rate(cap['rps_per_group'], unit)} "
            f"per replica group</b> (the capacity per replica group C). Planning on the {other} instead is "
            "shown below.</p>")
    else:
        out.append(f'<h3>What the plan assumes</h3><p id="plan-assumes">A given capacity of '
                   f"<b>{rate(cap['rps_per_group'], unit)} per replica group</b> ({e(cap['source'])}); no "
                   "confidence interval comes with it.</p>")
    if sens:
        sentences = "".join(f"<li>{e(s)}</li>" for s in sens.get("sentences", []))
        out.append(f'<h3>Sensitivity band</h3><div id="sensitivity"><ul>{sentences}</ul>{_steps_table(sens, unit)}'
                   "</div>")
    out.append(honesty_block(env, cap))
    out.append("</section>")
    return "\n".join(out)


def _steps_table(sens: dict, unit: str) -> str:
    cases = [("this plan", sens.get("plan")), ("C_SLO below the band", sens.get("up")),
             ("C_SLO at the band's top", sens.get("down")),
             (f"planned on the {sens.get('other_name', '')}", sens.get("other"))]
    rows = []
    for name, s in cases:
        if not s:
            continue
        rows.append(f"<tr><th>{e(name)}</th><td class=\"num\">{s['groups']}</td><td class=\"num\">{s['gpus']}</td>"
                    f"<td class=\"num\">{s['billed_gpus']}</td><td class=\"num\">{s['nodes']}</td>"
                    f"<td class=\"num\">{usd(s['cost_usd_per_month'])}</td></tr>")
    band = (f"the band: C_SLO {rate(sens['low_system'], unit)} to "
            + (rate(sens['high_system'], unit) if sens.get("high_system") is not None else "any higher value"))
    return (f'<table class="grid" id="steps"><caption>{e(band)}</caption><thead><tr><th>Case</th>'
            '<th class="num">Replica groups</th><th class="num">GPUs in groups</th><th class="num">Billed GPUs</th>'
            '<th class="num">Nodes</th><th class="num">Cost per month (USD)</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def honesty_block(env: dict | None, cap: dict) -> str:
    """Can the lower bound be trusted, and which runs would make it so. Shows the verdict on
    the number the plan stands on (``cap["honesty"]``, else the envelope's ``honesty``: status,
    estimand, sentence, runs to add); otherwise the envelope's own caveats about the
    bracketing runs and its suggested rates."""
    h = cap.get("honesty") if isinstance(cap.get("honesty"), dict) else (env or {}).get("honesty")
    parts = ['<h3 id="honesty">Can the lower bound be trusted?</h3><div id="honesty-body">']
    if isinstance(h, dict) and cap.get("basis"):
        parts.append(f"<p>The plan stands on the C_SLO{e(_basis({'capacity': cap}))}.</p>")
    if isinstance(h, dict):
        status = h.get("status")
        if status:
            sentence = str(h.get("sentence") or "")
            parts.append(f'<p><b>Status: {e(str(status))}</b>'
                         + (f" — {e(for_readers(sentence[:1].upper() + sentence[1:]))}." if sentence else "")
                         + "</p>")
        if h.get("estimand"):
            parts.append(f"<p><b>What the number estimates</b>: {e(for_readers(str(h['estimand'])))}.</p>")
        reasons = h.get("reasons") or []
        if reasons:
            parts.append("<p>Why:</p><ul>" + "".join(f"<li>{e(for_readers(str(r)))}</li>" for r in reasons)
                         + "</ul>")
        runs = h.get("runs_to_add") or []
        if runs:
            parts.append("<p>Runs capplan recommends next (<code>capplan design</code> costs them and "
                         "prints the load-test commands):</p><ul>"
                         + "".join(f"<li>{e(RunToAdd.from_dict(x).describe())}</li>" for x in runs)
                         + "</ul>")
        elif status == "honest":
            parts.append('<p>No further runs are needed for an honest bound; whether narrowing it could '
                         'change the plan is under <a href="#next-steps">Next steps</a>.</p>')
    else:
        notes = [n for n in (env or {}).get("notes", []) if "bracket" in n or "too high" in n]
        if notes:
            parts.append("<ul>" + "".join(f"<li>{e(for_readers(n))}</li>" for n in notes) + "</ul>")
        else:
            parts.append("<p>The envelope reports no reason to doubt its interval.</p>")
        rates = ((env or {}).get("cslo") or {}).get("suggested_rates") or []
        if rates:
            parts.append("<p>Runs to add: offered rates " + ", ".join(f"{x:g}" for x in rates)
                         + f" {e(cap.get('unit') or 'req/s')}, each repeated (≥ 3 runs) near C_SLO.</p>")
    parts.append("</div>")
    return "".join(parts)


def checks_section(plan: dict, dynamics: list[dict] | None = None, pages: tuple[str, ...] = ()) -> str:
    """The checks, failing and caveated first. A check the timelines page simulated on the twin
    (``dynamics``) says what happened there; one that holds on paper but broke the SLO when
    simulated reads "holds on paper; broke the SLO when simulated", with the numbers and a link."""
    sim = {str(r.get("check", "")): r for r in dynamics or []}
    broken = simulated_breaks(dynamics)
    rows = []
    for c in sorted(plan["checks"], key=lambda c: (c["ok"], c["key"] not in broken, not c.get("caveat"))):
        r = sim.get(c["key"])
        if not c["ok"]:
            state, cls = "FAILS", "fail"
        elif c["key"] in broken:
            state, cls = "holds on paper; broke the SLO when simulated", "simfail"
        elif c.get("caveat"):
            state, cls = "holds, with a caveat", "caveat"
        else:
            state, cls = "holds", "ok"
        extra = ""
        if c["key"] in broken:
            extra = (f"<br><small>Simulated on the twin at the planned size: {e(simulated_words(r))}"
                     f"{_simulated_link(pages)}.</small>")
        elif r is not None:
            extra = (f"<br><small>Simulated on the twin at the planned size: {e(str(r.get('sentence', '')))}"
                     f"{_simulated_link(pages)}.</small>")
        rows.append(f'<tr class="{cls}" data-check="{e(c["key"])}"><td>{state}</td><td>{e(c["sentence"])}'
                    + (f'<br><small>{e(for_readers(c["caveat"]))}</small>' if c.get("caveat") else "")
                    + extra + "</td></tr>")
    return ('<section id="checks"><h2>Checks</h2><p>Failing checks first, then those whose simulation '
            'broke the SLO, then caveated ones.</p>'
            '<table class="grid"><thead><tr><th>Result</th><th>Check</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table></section>")


def settings_section(plan: dict) -> str:
    rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in plan["about"] if k != "checks")
    return (f'<section id="settings"><h2>What this plan is</h2><p>Its policy, rollout and prices, so two '
            f"reports with different specs never look alike.</p><table>{rows}</table></section>")


_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 1.5em auto; padding: 0 1em; color: #222;
       line-height: 1.45; }
h1 { margin-bottom: .2em; } .sub { color: #555; margin-top: 0; }
.answer { font-size: 1.15em; background: #f3f7fb; border-left: 4px solid #1f77b4; padding: .7em 1em; }
.warn { background: #fff7e0; border-left: 4px solid #e6a100; padding: .5em 1em; }
table { border-collapse: collapse; margin: .5em 0 1em; }
table.grid th, table.grid td { border-bottom: 1px solid #ddd; padding: .3em .5em; vertical-align: top; }
th { text-align: left; font-weight: 600; }
thead th { font-size: .9em; vertical-align: bottom; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total th, tr.total td { border-top: 2px solid #999; }
caption { text-align: left; color: #555; font-size: .9em; }
.def { color: #444; font-size: .95em; }
tr.fail td { color: #b00; font-weight: 600; } tr.simfail td:first-child { color: #b00; font-weight: 600; } tr.caveat td:first-child { color: #b36b00; font-weight: 600; }
.scroll { overflow-x: auto; }
td code { word-break: break-all; }
#provenance th { padding-right: 1em; white-space: nowrap; vertical-align: top; }
a.glossary { color: inherit; text-decoration: underline dotted; }
#next-steps { border-left: 4px solid #2ca02c; padding: .2em 1em .5em; background: #f4faf3; margin-top: 1em; }
#next-steps h2 { margin: .3em 0; } #next-steps h3 { margin: .6em 0 .2em; font-size: 1.05em; }
ul.steps li { margin: .35em 0; } .due { font-weight: 600; white-space: nowrap; }
code.cmd { word-break: break-all; font-size: .9em; }
b.edge { color: #b36b00; font-weight: 600; white-space: nowrap; }
"""


def read_mix_record(data_dir: Path) -> list[dict]:
    """The mix page's production-mix numbers costed as plans (``data/mix/plan_vs_mix.json``,
    written by ``capplan.mix.page.MixPage.export``: the twin's C_SLO at the target mix)."""
    p = data_dir / "mix" / "plan_vs_mix.json"
    if not p.is_file():
        return []
    rows = json.loads(p.read_text(encoding="utf-8"))
    return [r for r in rows if isinstance(r, dict)]


def index_html(info: IndexInputs, plan: dict | None, env: dict | None, verdict: dict | None,
               mix: list[dict] | None = None, dynamics: list[dict] | None = None) -> str:
    """The whole front page (see the module docstring). ``mix``: the mix page's production-mix
    numbers (``read_mix_record``), said first when lower than the tested mix; ``dynamics``: the
    plan's checks simulated on the twin (``read_dynamics``)."""
    about = dict(plan["about"]) if plan else {}
    pages = tuple(p for p, _ in info.pages)
    title = f"Capacity plan: {about.get('plan', info.study_name)}"
    sub = f"Study <code>{e(info.study_name)}</code>" + (f" · SLO: {e(about['SLO'])}" if "SLO" in about else "")
    body = [f"<h1>{e(title)}</h1>", f'<p class="sub">{sub}</p>']
    if plan:
        steps = next_steps(plan, env, dict(info.parameters), dynamics, mix, pages)
        body += [answer_section(plan, verdict, env, mix, steps, dynamics, pages), contract_section(plan),
                 how_sure_section(plan, env),
                 checks_section(plan, dynamics, pages), settings_section(plan)]
    else:
        body.append('<p class="warn">This report has no plan export.</p>')
    pages = "".join(f'<li><a href="{e(p)}">{e(t)}</a></li>' for p, t in info.pages)
    body.append(f'<section id="pages"><h2>Pages</h2><ul>{pages}'
                '<li><a href="glossary.html">Glossary</a> (every term used here)</li></ul></section>')

    def links(items):
        return "".join(f'<li><a href="{e(x)}">{e(x)}</a></li>' for x in items) or "<li>(none)</li>"

    plan_files = [x for x in info.exports if x.startswith("data/plan/")]
    compare_files = [x for x in info.exports if x.startswith("data/compare/")]
    other = [x for x in info.exports if not x.startswith(("data/plan/", "data/compare/"))]
    body.append(f'<section id="exports"><h2>Plan export (for finance)</h2><p><code>plan.xlsx</code> has every '
                "sheet with number formats and a print setup; the CSVs hold the same tables, rounded to the "
                f"precision stated in their Provenance.</p><ul>{links(plan_files)}</ul>"
                + (f"<h2>Comparison export (baseline vs this study)</h2><ul>{links(compare_files)}</ul>"
                   if info.baseline else "")
                + f"<h2>Other data</h2><ul>{links(other)}</ul></section>")
    prov = "".join(f"<tr><th>{e(k)}</th><td><code>{e(v)}</code></td></tr>" for k, v in info.parameters)
    body.append(f'<section id="provenance"><h2>Parameters and provenance</h2><table>{prov}</table>'
                '<p>How to regenerate this report, with the sha256 of every input and output: '
                '<a href="reproduce.md">reproduce.md</a> and <code>provenance/</code>. Executed notebooks (with '
                "their parameters) are in <code>notebooks/</code>.</p></section>")
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)} — {e(info.study_name)}</title><style>{_STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    return link_terms(page)
