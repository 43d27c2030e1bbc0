"""The words of capplan, defined once: the report's glossary page, docs/glossary.md, and the
links from each term's first use on every report page.

One name, one meaning. Where two numbers are related but computed differently (the explore
page's goodput and the envelope's), they carry different names, and the entry says why they
differ. ``link_terms`` adds a link to the glossary at the first use of each term in a page's
text (never inside scripts, styles, code, links or table headers of the exports).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """A glossary entry: its anchor, name, the phrases that link to it, and its definition."""

    anchor: str
    name: str
    definition: str
    phrases: tuple[str, ...] = ()


TERMS: tuple[Term, ...] = (
    Term("slo", "SLO (service-level objective)",
         "The latency limits a request must meet — TTFT, TPOT, ITL or end-to-end time — and the attainment "
         "target: the share of requests that must meet them (e.g. 0.99).",
         ("SLO",)),
    Term("slo-meeting", "SLO-meeting request (good request)",
         "A request that finished with status ok and met every limit of the SLO. Rejected, failed, cancelled "
         "and unfinished requests never meet it.",
         ("SLO-meeting", "SLO-good")),
    Term("attainment", "SLO attainment",
         "The share of offered requests that are SLO-meeting. Charts show it on a stretched scale (or as misses "
         "per 1 000 requests, = 1 000 × (1 − attainment)) so the region near the target, where the decision "
         "is made, is visible: 0.99 is 10 misses per 1 000, 0.999 is 1.",
         ("attainment",)),
    Term("offered-rate", "offered rate",
         "Requests per second the load generator scheduled. Nominal: what the run asked for; measured: from "
         "the scheduled timestamps of the run's steady window.",
         ("offered rate",)),
    Term("cslo", "C_SLO (SLO capacity)",
         "The largest offered rate at which the tested system still meets the SLO attainment target. It is "
         "measured on the study's whole tested system — all its replicas (the demo tests 2) — and given as an "
         "estimate with a confidence interval and a lower bound.",
         ("C_SLO",)),
    Term("estimate", "C_SLO estimate",
         "Where the fitted attainment curve crosses the target: the best single guess of C_SLO, as likely to "
         "be too high as too low.",
         ("C_SLO estimate",)),
    Term("interval", "confidence interval (CI)",
         "A range that holds the true value with the stated probability (95 %), leaving 2.5 % on each side. "
         "For C_SLO it comes from the block bootstrap.",
         ("confidence interval", "CI")),
    Term("lower-bound", "lower bound (of C_SLO)",
         "The one-sided 95 % confidence bound: the true C_SLO is at least this with 95 % confidence. It is "
         "the planning number. It sits above the 95 % interval's low end because it leaves all 5 % on one "
         "side, where the two-sided interval leaves 2.5 %.",
         ("lower bound",)),
    Term("honest", "honest lower bound (honest, unsupported, optimistic)",
         "Whether the sweep can support its C_SLO lower bound. Honest: the bound includes the run-to-run "
         "variation measured near the crossing — from repeated runs at rates on both sides of it, or from a "
         "twin — and no run there was still settling. Unsupported: that variation could not be measured (one "
         "run per rate there, runs too short, nothing passing); the bound then rests on an assumed spread and "
         "may be too high, so the plan refuses it unless told to accept it, and capplan names the runs to add. "
         "Optimistic: the bound leaves run-to-run variation out altogether (a within-run interval).",
         ("honest", "unsupported")),
    Term("run-effect", "run-to-run variation (τ)",
         "Two runs at the same rate on the same system do not reach the same attainment: warm caches, request "
         "order and congestion episodes differ. τ is the standard deviation of a run's attainment on the logit "
         "scale between such runs; the lower bound adds it to the block bootstrap, which sees only the "
         "variation inside each run. τ = 1 means a run's odds of meeting the SLO typically differ by a factor "
         "of e ≈ 2.7 from the next run's.",
         ("τ", "run-to-run variation", "between-run SD")),
    Term("logit", "logit scale",
         "logit(a) = ln(a ÷ (1 − a)): the log odds of meeting the SLO. It stretches the region near 1 (0.99 "
         "is 4.6, 0.999 is 6.9), where attainments that look alike on a plain scale differ in misses tenfold; "
         "run-to-run variation is measured on it.",
         ("logit",)),
    Term("prior", "prior (half-normal prior on τ)",
         "What is assumed about τ before the runs are seen: a half-normal distribution of scale 0.7 (τ is "
         "below 0.47 with even odds, below 1.4 with 95 %). Repeated runs near the crossing update it; with "
         "fewer than 3 such runs the result is mostly this assumption, and the bound is called unsupported.",
         ("half-normal prior", "prior")),
    Term("clopper-pearson", "Clopper–Pearson interval",
         "The exact binomial confidence interval for a share of successes (k of n): it never claims more "
         "certainty than the count allows. Used where there is nothing to resample — a run with no misses (or "
         "no successes) — and for coverage figures (how often an interval held in simulations).",
         ("Clopper–Pearson", "Clopper-Pearson", "Clopper–Pearson-floor")),
    Term("capacity-per-group", "capacity per replica group (C)",
         "C_SLO divided by the replicas of the tested system: what one replica group serves within the SLO. "
         "The plan sizes with it; it is not called C_SLO, so C_SLO always means the tested system's number.",
         ("capacity per replica group",)),
    Term("bracketed", "bracketed",
         "C_SLO lies between two tested rates: a lower one that met the target and a higher one that did not. "
         "'≥ max tested' means every tested rate met it (C_SLO is at least the highest); '< min tested' means "
         "none did.",
         ("bracketed",)),
    Term("block-bootstrap", "block bootstrap",
         "Resampling blocks of consecutive requests (not single requests, which are correlated in time) many "
         "times to see how much C_SLO would move in a repeat of the same runs. It cannot see run-to-run "
         "differences that a single run at a rate does not show.",
         ("block bootstrap", "block-bootstrap", "bootstrap")),
    Term("isotonic", "isotonic fit (pooling)",
         "Attainment is fitted as a curve that never rises with load. Where a run at a lower rate did worse "
         "than one at a higher rate, the fit pools them into one level, so the estimate can sit above a run "
         "that missed the target.",
         ("isotonic",)),
    Term("n-eff", "effective sample size (N_eff)",
         "The number of independent requests the data are worth once correlation in time is allowed for "
         "(requests ÷ design effect).",
         ("N_eff", "n_eff", "design effect")),
    Term("goodput", "goodput",
         "SLO-meeting requests per second. The explore page gives goodput over the run's window (SLO-meeting "
         "completions ÷ window length, wall clock); the envelope page gives goodput at the offered rate "
         "(attainment × measured offered rate). They differ by the requests still in flight when the window "
         "ends, which the first leaves out and the second charges to the run.",
         ("goodput",)),
    Term("throughput", "throughput (achieved rate)",
         "Completed requests per second. The explore page's achieved rate is completions ÷ window length; the "
         "envelope page's throughput is the completed share × measured offered rate (same difference as for "
         "goodput).",
         ("throughput", "achieved rate")),
    Term("ttft", "TTFT (time to first token)",
         "From the request's scheduled time to its first output token. Counting from the scheduled time means "
         "a load generator that fell behind cannot hide queueing.",
         ("TTFT",)),
    Term("tpot", "TPOT (time per output token)",
         "(End-to-end time − TTFT) ÷ (output tokens − 1): the mean gap between output tokens of one request.",
         ("TPOT",)),
    Term("itl", "ITL (inter-token latency)",
         "The gaps between consecutive output tokens of a request; a request's ITL p99 or max is its worst "
         "stretch.",
         ("ITL",)),
    Term("e2e", "E2E (end-to-end latency)", "From the scheduled time to the last output token.", ("E2E",)),
    Term("percentile", "p99 (percentile)",
         "The value 99 % of requests stay under. The explore page computes exact percentiles over the "
         "window's completed requests; the envelope page reads them from the log-bucket histogram the "
         "bootstrap resamples (within the histogram's relative accuracy), so they can differ slightly. A "
         "percentile needs enough requests (about 662 for a p99 claim); with fewer it is shown as —.",
         ("p99",)),
    Term("kv", "KV cache (KV memory)",
         "The keys and values of every token a replica holds for the sequences it serves, kept in GPU memory "
         "next to the weights. Its size caps how many sequences (and tokens of context) run at once; the KV "
         "bound is the rate at which that cap, not compute, would bind.",
         ("KV cache", "KV memory", "KV-memory", "KV")),
    Term("stats-abbrev", "SD, SE, CV",
         "Standard deviation (spread of single values), standard error (spread of an estimate: the SD of "
         "what a repeat would give) and coefficient of variation (SD ÷ mean: 1 for Poisson arrivals' gaps).",
         ("SD", "SE", "CV")),
    Term("monte-carlo", "Monte-Carlo error",
         "The part of a simulated number's uncertainty that comes from simulating a finite number of runs; "
         "more replays shrink it. It says nothing about whether the model is right.",
         ("Monte-Carlo", "Monte Carlo")),
    Term("twin", "twin (of the measured system)",
         "A model of the measured serving system — decode step by batch size, prefill cost, scheduler and "
         "memory limits, client timeout — estimated from the study's own events. It is checked by replaying "
         "every measured run; only a twin that agrees is used to answer questions the runs did not test.",
         ("twin",)),
    Term("prediction-band", "prediction band",
         "Where a repeat of a run would land with 95 % probability according to the twin: the 2.5–97.5 % "
         "range of the twin's replays of that run. A measured value outside it (widened by the practical "
         "margin) counts against the twin.",
         ("prediction band", "prediction interval")),
    Term("tested-mix", "tested mix, target mix (reweighting)",
         "The tested mix is the share of each kind of request (prompt and output length, class) the load test "
         "sent; the target mix, production's. Reweighting recomputes C_SLO with each kind's attainment "
         "weighted by its share in the target mix instead of the tested one.",
         ("tested mix", "target mix", "reweighting", "reweighted")),
    Term("load-effect", "load effect",
         "What a different mix does to every request, not just its own kind: more long prompts mean more "
         "prefill work at the same request rate, which slows the short requests too. Reweighting cannot see "
         "it (it takes each kind's attainment at the tested load); a twin running the target mix does, so "
         "both answers are shown.",
         ("load effect",)),
    Term("slo-class", "SLO class",
         "A kind of request with its own SLO (e.g. interactive: TTFT ≤ 1 s; batch: E2E ≤ 30 s). C_SLO by "
         "class is the largest rate at which every class meets its own target; the class that fails first "
         "binds.",
         ("SLO class", "SLO classes", "binding class")),
    Term("gate", "gate (release gate)",
         "A rule the candidate must pass against the baseline (e.g. attainment no more than 0.005 lower): it "
         "fails when the bootstrap interval of the difference excludes zero on the bad side and the difference "
         "is worse than the tolerance. One failing gate makes the comparison's verdict FAIL.",
         ("gate", "gates")),
    Term("slo-minutes", "SLO-minutes (broken)",
         "Time the SLO was broken: the windows whose attainment fell below the target × the window length, "
         "in minutes. 0.5 SLO-minutes is 30 one-second windows below target.",
         ("SLO-minutes", "SLO-minute")),
    Term("good-lost", "good requests lost",
         "SLO-meeting requests an event cost: the goodput before the event × each window's length, minus the "
         "requests that window served well, summed until the SLO recovered and the queue drained; for a "
         "scenario on the twin, the same run without the event minus the run with it.",
         ("good requests lost",)),
    Term("knee", "knee",
         "The first load level where one more req/s offered buys less than 0.5 req/s of goodput: past it, "
         "extra load mostly makes requests late.",
         ("knee",)),
    Term("warm-up", "warm-up (MSER-5)",
         "The start of a run before the system settles, left out of every number. When the study does not say "
         "how long it is, MSER-5 picks the cut that leaves the steadiest remainder.",
         ("warm-up", "MSER-5", "MSER")),
    Term("steady-window", "steady window",
         "The requests scheduled after the warm-up; every one of them counts, whenever it finished.",
         ("steady window",)),
    Term("littles-law", "Little's law",
         "Requests in flight = arrival rate × mean time in the system. A run whose timestamps break it has "
         "lost or mistimed requests.",
         ("Little's law", "Little’s law")),
    Term("generator-lag", "generator lag",
         "How late the load generator sent a request after its scheduled time; a large lag means the tool, "
         "not the server, limited the load (coordinated omission).",
         ("generator lag",)),
    Term("replica-group", "replica group",
         "The unit the plan counts: one model replica on TP × PP GPUs.",
         ("replica group", "replica groups")),
    Term("tp-pp", "TP, PP (tensor and pipeline parallelism)",
         "How one model replica is split over GPUs: TP GPUs share each layer, PP stages hold consecutive "
         "layers; a replica group has TP × PP GPUs.",
         ("TP", "PP")),
    Term("fifo", "FIFO (first in, first out)",
         "Requests served in arrival order, with no priority or fair share between tenants: the scheduling "
         "policy the others are compared against.",
         ("FIFO",)),
    Term("peak-demand", "peak demand (λ_peak)",
         "The highest request rate the plan must serve in a quarter (from the spec, or the forecast's upper "
         "bound).",
         ("peak demand", "λ_peak")),
    Term("planned-demand", "planned demand (D)",
         "Peak demand plus the demand uncertainty: D = λ_peak × (1 + u). The checks test capacity against it.",
         ("planned demand",)),
    Term("failure-reserve", "failure reserve",
         "Extra replica groups so the planned demand is still met after losing the largest allowed failure "
         "domain (a zone, a node, or k groups).",
         ("failure reserve",)),
    Term("rollout-overlap", "rollout overlap",
         "Extra groups so the demand is met while a rolling update has groups out of service.",
         ("rollout overlap",)),
    Term("cold-start", "cold-start reserve",
         "Extra groups that cover demand growth during the time a new replica takes to start serving.",
         ("cold-start reserve",)),
    Term("warm-floor", "warm floor", "The fewest groups kept running at any time.", ("warm floor",)),
    Term("billed-gpus", "billed GPUs",
         "The GPUs paid for: whole nodes (billing: node), so more than the GPUs in replica groups when groups "
         "do not fill the last node of a zone, or only the groups' GPUs (billing: gpu).",
         ("billed GPUs", "GPUs billed")),
    Term("utilisation", "utilisation at peak",
         "Peak demand ÷ the fleet's capacity (groups × C): the share of the fleet busy at the peak.",
         ("utilisation",)),
    Term("operating-point", "operating point",
         "The load per replica group at the peak (peak ÷ groups); the good fraction, tokens and energy are "
         "read from the study there.",
         ("operating point",)),
    Term("cost-per-1k", "cost per 1 000 SLO-meeting requests",
         "The month's cost (everything provisioned, including reserves) ÷ the SLO-meeting requests served in "
         "the month × 1 000.",
         ("cost per 1 000 SLO-meeting requests",)),
    Term("energy-measured", "energy per SLO-meeting request, measured",
         "The tested GPUs' energy during the runs ÷ their SLO-meeting requests × PUE, at the operating point: "
         "what serving one good request costs in energy, without reserve groups or idle hours.",
         ("energy per SLO-meeting request, measured",)),
    Term("energy-fleet", "fleet energy per SLO-meeting request",
         "The fleet's monthly energy (all GPUs in groups at their operating-point power, all month) ÷ the "
         "month's SLO-meeting requests: what the energy cost actually pays per good request. Larger than the "
         "measured figure by the reserves and the off-peak hours.",
         ("fleet energy per SLO-meeting request",)),
    Term("pue", "PUE", "Power usage effectiveness: facility power ÷ IT power (cooling, conversion losses).",
         ("PUE",)),
    Term("sensitivity", "sensitivity band",
         "The range of C_SLO over which the plan keeps the same number of groups. A plan whose band ends "
         "inside the C_SLO interval is knife-edge: a capacity the data cannot rule out changes the plan.",
         ("sensitivity band", "knife-edge")),
)

BY_ANCHOR = {t.anchor: t for t in TERMS}


def glossary_markdown() -> str:
    """docs/glossary.md (the same text as the report's glossary page)."""
    out = ["# Glossary", "",
           "The words capplan's reports, exports and notebooks use, each defined once. Report pages link "
           "each term's first use here.", ""]
    for t in TERMS:
        out += [f'<a id="{t.anchor}"></a>', f"**{t.name}** — {t.definition}", ""]
    return "\n".join(out)


def glossary_html(title: str = "Glossary", back: str = "index.html") -> str:
    """The report's glossary page."""
    e = html.escape
    items = "\n".join(f'<dt id="{t.anchor}">{e(t.name)}</dt><dd>{e(t.definition)}</dd>' for t in TERMS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 860px; margin: 2em auto; padding: 0 1em; color: #222;
       line-height: 1.45; }}
dt {{ font-weight: 600; margin-top: 1em; }} dd {{ margin-left: 1.2em; }}
dt:target, dt:target + dd {{ background: #fff7d6; }}
</style></head>
<body>
<p><a href="{e(back)}">← back to the report</a></p>
<h1>{e(title)}</h1>
<p>The words this report uses, each defined once. Every page links a term's first use here.</p>
<dl>
{items}
</dl>
</body></html>
"""


_SKIP = {"script", "style", "a", "code", "pre", "title", "head", "svg", "textarea", "button", "select", "nav"}
_TOKEN = re.compile(r"(<script\b.*?</script\s*>|<style\b.*?</style\s*>|<!--.*?-->|<[^>]+>)",
                    re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<\s*(/)?\s*([a-zA-Z0-9]+)")


def _pattern(phrases) -> re.Pattern:
    alts = sorted(phrases, key=len, reverse=True)
    body = "|".join(re.escape(html.escape(p, quote=False)) for p in alts)
    return re.compile(rf"(?<![\w\-])(?:{body})(?![\w\-])")


_PATTERNS = [(t, _pattern(t.phrases)) for t in TERMS if t.phrases]


def link_terms(page: str, href: str = "glossary.html", terms=None) -> str:
    """``page`` (HTML) with the first use of each glossary term linked to ``href#anchor``.
    Only text between tags is touched, never inside script, style, a, code, pre, head or svg;
    longer phrases win over shorter ones at the same place (C_SLO estimate before C_SLO)."""
    pending = list(_PATTERNS if terms is None else [(t, _pattern(t.phrases)) for t in terms])
    parts = _TOKEN.split(page)
    depth = 0
    body_seen = "<body" not in page.lower()
    for i, part in enumerate(parts):
        if not pending:
            break
        if not part:
            continue
        if i % 2 == 1:  # a tag, comment or whole script/style block
            m = _TAG.match(part)
            if m:
                name = m.group(2).lower()
                if name == "body":
                    body_seen = True
                if name in _SKIP and not part.rstrip().endswith("/>") and not part.lower().startswith(
                        ("<script", "<style")):
                    depth += -1 if m.group(1) else 1
                    depth = max(depth, 0)
            continue
        if depth or not body_seen or not part.strip():
            continue
        parts[i] = _link_text(part, pending, href)
    return "".join(parts)


def _link_text(text: str, pending: list, href: str) -> str:
    """Link, in one text run, the first use of each pending term that does not overlap a longer
    phrase (C_SLO estimate wins over C_SLO at the same place); linked terms leave ``pending``."""
    spans: list[tuple[int, int, Term]] = []
    for term, pat in sorted(pending, key=lambda tp: -max(len(p) for p in tp[0].phrases)):
        for m in pat.finditer(text):
            if any(m.start() < b and a < m.end() for a, b, _ in spans):
                continue
            spans.append((m.start(), m.end(), term))
            pending.remove((term, pat))
            break
    out = text
    for a, b, term in sorted(spans, key=lambda x: x[0], reverse=True):
        out = (out[:a] + f'<a class="glossary" href="{href}#{term.anchor}" title="{html.escape(term.name)}">'
               + out[a:b] + "</a>" + out[b:])
    return out


_FILE_REFS = re.compile(r"\s*(?:[—–-]\s*)?\(?\b(?:see\s+)?docs/[\w./-]+\.md"
                        r"(?:\s*(?:§\s*[\w.]+|#[\w-]+|,\s*['\"‘“][^'\"’”]*['\"’”]))?\)?", re.IGNORECASE)


def for_readers(text: str) -> str:
    """A library message as a report reader sees it: without references to files they do not
    have (``see docs/envelope.md, 'Coverage'``); the glossary explains the terms instead."""
    return _FILE_REFS.sub("", str(text)).rstrip(" ;,—–-")
