"""What every importer shares: reading files with errors for people, clock alignment, offered
rate measurement, the manifest, and writing the study.

An importer is a pure parse function ``parse(paths) -> list[RunData]``: one RunData per run, its
event columns already on one clock (int64 ns, any origin). ``assemble`` re-bases every run so its
first scheduled request is at 0, measures the offered rate from the intended start times, builds
the manifest and collects warnings; ``write_import`` is the only function that touches disk.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from .. import contract as C
from ..errors import StudyError
from ..io import check_out, events_table, manifest_dict, write_study

#: event columns whose values are times on the run's clock (re-based together)
TIME_COLUMNS = ("scheduled_ns", "sent_ns", "first_token_ns", "last_token_ns", "admitted_ns",
                "prefill_start_ns", "server_received_ns")

#: GuideLLM 0.8.1 start-up burst: targeted_start below this is a relative number, not epoch s
EPOCH_S_MIN = 1e9
#: folder and file names that tools write by default: never a study's or a run's name
GENERIC_NAMES = frozenset({
    "artifacts", "artifact", "out", "output", "outputs", "result", "results", "reports", "report",
    "data", "runs", "run", "tmp", "temp", "benchmarks", "benchmark", "profile_export",
    "per_request_lifecycle_metrics", "export", "exports", "logs", ".", ""})


#: runs shorter than this (tens of seconds on an idle server) overstate capacity near saturation
SHORT_RUN_S = 60.0


@dataclass
class RunData:
    """One imported run before alignment. ``columns`` maps contract column names to equal-length
    lists; times are int ns on one clock per run (None where the source has no value)."""

    run_id: str
    source: str
    columns: dict[str, list]
    nominal_rps: float | None = None
    concurrency: int | None = None
    arrival: str = "unknown"
    duration_s: float | None = None
    warmup_s: float | None = None
    timestamps: str = "measured"  # "measured" | "none" (order and arrival times unknown)
    extra: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: what the tool's config says about the offered workload (``workload_facts``): tool_version,
    #: arrival (the configured process, when the run's own ``arrival`` cannot show it), endpoint,
    #: streaming, asked {input_tokens, output_tokens}, output_fixed, tokenizer, grace_s, seed
    workload: dict = field(default_factory=dict)
    #: rows added for requests the tool counted but did not export: {status: count}
    added: dict = field(default_factory=dict)
    #: wall-clock time (epoch ns) of this run's raw clock zero, when the tool's clock is
    #: wall-clock (AIPerf: 0, its stamps are epoch ns); None when it is a private monotonic
    #: clock. ``assemble`` writes the run's ``epoch_start_ns`` from it, which places the engine's
    #: /metrics scrapes on the run's clock (docs/engine-metrics.md)
    clock_epoch_ns: int | None = None

    @property
    def n(self) -> int:
        return len(self.columns.get("request_id", []))


@dataclass(frozen=True)
class ImportResult:
    """A parsed import, ready to write: the manifest mapping, the events table, warnings."""

    tool: str
    manifest: dict
    events: pa.Table
    warnings: tuple[str, ...]
    #: informational lines for the summary (e.g. where the study name came from)
    notes: tuple[str, ...] = ()
    #: {run_id: the run's own workload summary} (``summarize_workload`` over that run alone);
    #: ``append_import`` compares these with the study's workload
    run_workloads: dict = field(default_factory=dict)
    #: {run_id: {status: rows added for requests the tool counted but did not export}}
    added: dict = field(default_factory=dict)

    def status_counts(self) -> dict[str, dict[str, int]]:
        """{run_id: {status: count}} (for the CLI summary and tests)."""
        out: dict[str, dict[str, int]] = {}
        for rid, st in zip(self.events["run_id"].to_pylist(), self.events["status"].to_pylist()):
            out.setdefault(rid, {}).setdefault(st, 0)
            out[rid][st] += 1
        return out


# ------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------

def read_text(path: str | os.PathLike) -> str:
    """File text, transparently gunzipped (``.gz``); StudyError if unreadable."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8") as fh:
                return fh.read()
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StudyError("input file not found", file=str(p), fix="check the path") from None
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise StudyError(f"cannot read the file as UTF-8 text ({exc.__class__.__name__})",
                         file=str(p), fix="pass the tool's JSON/JSONL result file") from None


def load_json(path: str | os.PathLike, expected: str):
    """Parse a JSON (or YAML, by suffix) file; a truncated or invalid file names the position."""
    text = read_text(path)
    name = str(path)
    if not text.strip():
        raise StudyError(f"the file is empty; expected {expected}", file=name)
    if name.endswith((".yaml", ".yml", ".yaml.gz", ".yml.gz")):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise StudyError(f"not valid YAML ({getattr(exc, 'problem', exc)}); expected {expected}",
                             file=name) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(text.rstrip()) - 1 or looks_truncated(text)
        what = "truncated JSON (the file ends early)" if truncated else f"invalid JSON ({exc.msg})"
        raise StudyError(f"{what} at line {exc.lineno}, column {exc.colno}; expected {expected}",
                         file=name, fix="re-export the file; a run that was killed mid-write "
                                        "leaves a truncated file") from None


def looks_truncated(text: str) -> bool:
    """True when brackets are still open (or a string unterminated) at the end of the text:
    the signature of a file cut off mid-write, as opposed to a syntax error inside it."""
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return in_str or depth > 0


def load_jsonl(path: str | os.PathLike, expected: str) -> list[dict]:
    """Parse a JSON-lines file; the error names the bad line (a truncated last line included)."""
    text = read_text(path)
    rows = []
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            last = i == len(lines) or all(not ln.strip() for ln in lines[i:])
            what = "truncated last line" if last else "invalid JSON"
            raise StudyError(f"{what} at line {i} ({exc.msg}); expected {expected}",
                             file=str(path), example=line[:120],
                             fix="re-export the file; a run killed mid-write leaves a truncated line") from None
        if not isinstance(obj, dict):
            raise StudyError(f"line {i} is not a JSON object; expected {expected}", file=str(path),
                             example=line[:120])
        rows.append(obj)
    if not rows:
        raise StudyError(f"the file holds no records; expected {expected}", file=str(path))
    return rows


# ------------------------------------------------------------------------------------------
# clocks and values
# ------------------------------------------------------------------------------------------

def s_to_ns(t_s, origin_s: float) -> int | None:
    """Float seconds → int ns relative to ``origin_s``. Subtracting first keeps sub-µs precision
    for epoch seconds (an epoch float times 1e9 would lose ~0.25 µs)."""
    if t_s is None:
        return None
    v = float(t_s)
    if math.isnan(v):
        return None
    return int(round((v - origin_s) * C.NS_PER_S))


def gaps_ns(times_ns: list[int | None]) -> list[int] | None:
    """Successive differences of chunk times (None when fewer than two)."""
    t = [x for x in times_ns if x is not None]
    if len(t) < 2:
        return None
    return [b - a for a, b in zip(t, t[1:])]


def to_int(v, default: int = 0) -> int:
    if v is None:
        return default
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(f) else int(round(f))


#: request-body keys that cap the answer length (OpenAI chat / completions, TGI parameters)
MAX_TOKENS_KEYS = ("max_completion_tokens", "max_tokens", "max_new_tokens")


def requested_output_tokens(body, _depth: int = 0) -> int | None:
    """The output length a request asked for (its ``max_completion_tokens`` / ``max_tokens`` /
    ``max_new_tokens``), from the request body a tool recorded: a mapping or JSON text, the
    cap possibly nested under ``body``, ``payload`` or ``parameters``. None when the tool kept
    no body or the body sets no cap (compare then cannot check the offered output lengths)."""
    if isinstance(body, (str, bytes)):
        try:
            body = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
    if not isinstance(body, dict) or _depth > 2:
        return None
    for k in MAX_TOKENS_KEYS:
        v = body.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            return int(v)
    for k in ("body", "payload", "parameters"):
        if k in body:
            v = requested_output_tokens(body[k], _depth + 1)
            if v is not None:
                return v
    return None


def status_from_error(message: str | None, *, code: int | str | None = None,
                      cancelled: bool = False) -> str:
    """Map a tool's error text / HTTP code to a contract status (rejected = the server refused:
    429/503; timeout = client deadline; cancelled = client gave up, e.g. end of benchmark)."""
    if cancelled:
        return C.Status.CANCELLED.value
    text = (message or "").lower()
    try:
        icode = int(code) if code not in (None, "") else None
    except (TypeError, ValueError):
        icode = None
    if icode in (429, 503) or " 429" in text or "429 " in text or "too many requests" in text \
            or "service unavailable" in text or " 503" in text:
        return C.Status.REJECTED.value
    if "timeout" in text or "timed out" in text or icode in (408, 504):
        return C.Status.TIMEOUT.value
    if "cancel" in text:
        return C.Status.CANCELLED.value
    return C.Status.ERROR.value


def parse_rate(value) -> float | None:
    """A nominal rate as float; None for missing/'inf'/non-positive."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if math.isinf(v) or math.isnan(v) or v <= 0:
        return None
    return v


def measured_rps(scheduled_ns: list[int]) -> float | None:
    """Offered rate from intended start times: (n − 1) / (last − first). None below 2 requests."""
    s = sorted(x for x in scheduled_ns if x is not None)
    if len(s) < 2 or s[-1] <= s[0]:
        return None
    return (len(s) - 1) * C.NS_PER_S / (s[-1] - s[0])


def fmt_rate(v: float | None) -> str:
    return "?" if v is None else f"{v:.3g}"


# ------------------------------------------------------------------------------------------
# the offered workload
# ------------------------------------------------------------------------------------------

#: workload keys that come from the tools' configs (combined over runs by ``summarize_workload``)
FACT_KEYS = ("tool", "tool_version", "arrival", "arrival_cv", "endpoint", "streaming", "asked",
             "output_fixed", "tokenizer", "grace_s", "seed", "asked_rps", "asked_concurrency")
#: fact keys that differ from run to run by design (the sweep's levels): combined as the sorted
#: list of distinct values, never ``mixed``
LEVEL_KEYS = ("asked_rps", "asked_concurrency")
#: the workload keys capplan derives (recomputed, never carried over)
DERIVED_KEYS = ("input_tokens", "output_tokens", "mixed", "unknown")
#: what a workload must say for the sweep to be reproduced (``capplan design``'s commands read
#: it through ``loadtools.ManifestWorkload``); any the source does not state is listed under
#: ``unknown`` instead of being left silently absent
NEEDED_KEYS = ("tool_version", "arrival", "endpoint", "streaming", "input_tokens",
               "output_tokens", "asked.input_tokens", "asked.output_tokens", "output_fixed",
               "asked_rps|asked_concurrency")


def _num(v: float) -> float | int:
    """A token count as people read it: integers stay integers, else one decimal."""
    v = float(v)
    return int(v) if v.is_integer() else round(v, 1)


def length_summary(values) -> dict | None:
    """{mean, sd, min, p50, p90, p99, max} of token counts (nulls skipped; percentiles type 7;
    mean and sd to two decimals, the rest integers or one decimal). None when no value."""
    import numpy as np

    a = np.asarray([float(v) for v in values if v is not None], dtype=float)
    if a.size == 0:
        return None
    q = np.percentile(a, [50, 90, 99])  # numpy's default 'linear' is Hyndman & Fan type 7
    return {"mean": round(float(a.mean()), 2), "sd": round(float(a.std(ddof=1)) if a.size > 1 else 0.0, 2),
            "min": _num(a.min()), "p50": _num(q[0]), "p90": _num(q[1]), "p99": _num(q[2]),
            "max": _num(a.max())}


def endpoint_kind(text) -> str:
    """chat | completions | unknown, from a tool's endpoint / request format / backend name."""
    t = str(text or "").lower()
    if "chat" in t:
        return "chat"
    if "completion" in t or t in ("vllm", "openai", "tgi", "text_completions"):
        return "completions"
    return "unknown"


def gamma_cv(shape: float) -> float:
    """The coefficient of variation of gamma inter-arrival gaps of shape ``shape`` (vLLM's
    ``burstiness``, AIPerf's smoothness): 1/√shape (1 = Poisson); what ``workload.arrival_cv``
    holds and ``capplan design`` turns back into a shape."""
    return round(1.0 / math.sqrt(float(shape)), 6)


def _combine_facts(facts: list[dict]) -> tuple[dict, list[str]]:
    """One value per fact key when every run that states it agrees; a disagreement makes a
    string ``mixed`` and drops a number (named in the returned list)."""
    out: dict = {}
    mixed: list[str] = []
    for key in FACT_KEYS:
        if key in LEVEL_KEYS:
            levels = {float(v) for f in facts
                      for v in (f.get(key) if isinstance(f.get(key), (list, tuple))
                                else [f.get(key)]) if v is not None}
            if levels:
                out[key] = [int(v) if v.is_integer() else v for v in sorted(levels)]
            continue
        if key == "asked":
            asked: dict = {}
            for sub in ("input_tokens", "output_tokens"):
                vals = [f["asked"][sub] for f in facts
                        if isinstance(f.get("asked"), dict) and f["asked"].get(sub) is not None]
                if vals and all(v == vals[0] for v in vals):
                    asked[sub] = vals[0]
                elif vals:
                    mixed.append(f"asked.{sub}")
            if asked:
                out["asked"] = asked
            continue
        vals = [f[key] for f in facts if f.get(key) is not None]
        if not vals:
            continue
        if all(v == vals[0] for v in vals):
            out[key] = vals[0]
        elif isinstance(vals[0], str):
            out[key] = "mixed"
            mixed.append(key)
        else:
            mixed.append(key)
    return out, mixed


def summarize_workload(events: pa.Table, facts: list[dict], *, keep: dict | None = None) -> dict:
    """The manifest's ``workload`` block: the tools' stated facts combined over ``facts`` (one
    mapping per run, ``FACT_KEYS``) and the lengths summarised from ``events``: ``input_tokens``
    over every row with a counted prompt (> 0); ``output_tokens`` over ``max_output_tokens`` where stamped (``from: asked``),
    else over the tokens received by ``ok`` rows (``from: received``); the asked levels
    (``asked_rps`` / ``asked_concurrency``) as sorted distinct values; ``unknown``: the
    ``NEEDED_KEYS`` nobody stated. ``keep``: keys of an existing workload that capplan does not
    derive (e.g. ``client``), carried over."""
    out, mixed = _combine_facts(facts)
    cols = set(events.column_names)
    # a prompt has at least one token: 0 is a request that failed before it was counted (a
    # reset), whose length is unknown (the contract has no null here) — left out, not averaged in
    inp = (length_summary([v for v in events["input_tokens"].to_pylist() if v])
           if "input_tokens" in cols else None)
    if inp is not None:
        out["input_tokens"] = inp
    asked = (length_summary(events["max_output_tokens"].to_pylist())
             if "max_output_tokens" in cols else None)
    if asked is not None:
        out["output_tokens"] = {**asked, "from": "asked"}
    elif "output_tokens" in cols:
        st = events["status"].to_pylist()
        got = [v for v, s in zip(events["output_tokens"].to_pylist(), st) if s == "ok"]
        rec = length_summary(got or events["output_tokens"].to_pylist())
        if rec is not None:
            out["output_tokens"] = {**rec, "from": "received"}
    if mixed:
        out["mixed"] = mixed
    out.setdefault("arrival", "unknown")
    out.setdefault("endpoint", "unknown")
    unknown = _unknown(out)
    if unknown:
        out["unknown"] = unknown
    order = ["tool", "tool_version", "arrival", "arrival_cv", "endpoint", "streaming",
             "input_tokens", "output_tokens", "output_fixed", "asked", "asked_rps",
             "asked_concurrency", "tokenizer", "grace_s", "seed", "mixed", "unknown"]
    block = {k: out[k] for k in order if k in out}
    for k, v in (keep or {}).items():
        if k not in FACT_KEYS and k not in DERIVED_KEYS and k not in block:
            block[k] = v
    return block


def _unknown(block: dict) -> list[str]:
    """The ``NEEDED_KEYS`` a workload block does not state (absent, or ``unknown``); a key the
    runs disagree on (``mixed``) is known, just not one value."""
    known = set(block.get("mixed") or ())  # stated by the runs, just not one value
    if (block.get("output_tokens") or {}).get("from") == "asked":
        known.add("asked.output_tokens")  # every request's asked length is in the events
    out = []
    for key in NEEDED_KEYS:
        alts = key.split("|")
        if any(k in known for k in alts):
            continue
        if all(_lookup(block, k) in (None, "unknown") for k in alts):
            out.extend(alts)
    return out


def _lookup(block: dict, key: str):
    head, _, sub = key.partition(".")
    v = block.get(head)
    return (v.get(sub) if isinstance(v, dict) else None) if sub else v


def run_facts(tool: str, r: RunData, closed: bool) -> dict:
    """The workload facts of one run: the tool's stated config plus the arrival process (a
    closed-loop run's is ``concurrency``; a run without timestamps takes the configured one)
    and the level the tool was asked for (``asked_rps`` or ``asked_concurrency``)."""
    f = {"tool": tool, **r.workload}
    if closed:
        f["arrival"] = "concurrency"
    elif r.arrival not in (None, "unknown"):
        f["arrival"] = r.arrival
    f.setdefault("arrival", "unknown")
    if r.nominal_rps is not None:
        f["asked_rps"] = float(r.nominal_rps)
    if r.concurrency is not None:
        f["asked_concurrency"] = int(r.concurrency)
    return f


def add_unexported_rows(run: RunData, n: int, status: str, *, input_tokens: int | None = None,
                        max_output_tokens: int | None = None) -> None:
    """Add ``n`` rows for requests the tool counted but left out of its per-request export (AIPerf
    drops those cancelled at the grace cut-off; vLLM counts failures it may not list), so every
    denominator includes them. They carry no tokens and no stamps besides ``scheduled_ns``: the
    requests still open at the cut-off are the latest sent, so they are spread over the last
    ``n`` mean inter-arrival gaps *before* the run's last intended start (at last − (k − ½)·gap),
    inside the run's span, which keeps its duration and lets the measured rate count them.
    Input length: ``input_tokens`` (the asked length), else the run's mean; the asked output
    length goes to ``max_output_tokens`` when the run has that column."""
    if n <= 0:
        return
    cols = run.columns
    sched = sorted(v for v in cols["scheduled_ns"] if v is not None)
    if input_tokens is None:
        vals = [v for v in cols["input_tokens"] if v is not None]
        input_tokens = int(round(sum(vals) / len(vals))) if vals else 0
    gap = (sched[-1] - sched[0]) / (len(sched) - 1) if len(sched) > 1 else 0.0
    last, first = (sched[-1], sched[0]) if sched else (0, 0)
    for k in range(1, n + 1):
        t = max(first, int(round(last - (k - 0.5) * gap)))
        values = dict(request_id=f"unexported-{status}-{k}", scheduled_ns=t, input_tokens=int(input_tokens),
                      output_tokens=0, status=status)
        if "max_output_tokens" in cols:
            values["max_output_tokens"] = max_output_tokens
        add_row(cols, **values)
    run.added[status] = run.added.get(status, 0) + n


# ------------------------------------------------------------------------------------------
# assembly
# ------------------------------------------------------------------------------------------

def _rebase(run: RunData) -> int:
    """Move the run's clock so its first scheduled request is at 0; returns the old value of
    that 0 (on the tool's raw clock)."""
    cols = run.columns
    sched = cols["scheduled_ns"]
    if any(v is None for v in sched):
        raise StudyError(f"run {run.run_id}: some requests have no intended start time",
                         file=run.source)
    t0 = int(min(sched)) if sched else 0
    for name in TIME_COLUMNS:
        if name in cols:
            cols[name] = [None if v is None else int(v) - t0 for v in cols[name]]
    return t0


def assemble(tool: str, runs: list[RunData], *, name: str, system: dict | None = None,
             workload: dict | None = None, extra: dict | None = None) -> ImportResult:
    """Align clocks, measure rates, build manifest and events; pure (no I/O)."""
    if not runs:
        raise StudyError(f"no runs found in the {tool} input", fix="pass the tool's result file(s)")
    warnings: list[str] = []
    # work on copies: the caller's RunData stay as parsed
    runs = [replace(r, columns=dict(r.columns), extra=dict(r.extra), warnings=list(r.warnings))
            for r in runs]
    taken: set[str] = set()
    for r in runs:  # several files with one label (two vLLM files at one rate): -2, -3, …
        r.run_id = unique_id(r.run_id, taken)
        taken.add(r.run_id)
    closed = [r for r in runs if r.concurrency is not None and r.nominal_rps is None]
    load_model = C.LoadModel.CLOSED.value if len(closed) == len(runs) else C.LoadModel.OPEN.value
    manifest_runs = []
    kept: list[RunData] = []
    parts: list[pa.Table] = []
    for r in runs:
        if r.n == 0:
            warnings.append(f"run {r.run_id}: no requests in {r.source}; skipped")
            continue
        t0 = _rebase(r)
        warnings.extend(f"run {r.run_id}: {w}" for w in r.warnings)
        rate = measured_rps(r.columns["scheduled_ns"])
        entry: dict = {"run_id": r.run_id}
        if load_model == C.LoadModel.CLOSED.value:
            entry["concurrency"] = int(r.concurrency)
            entry["arrival"] = "unknown" if r.timestamps == "none" else "concurrency"
            if rate is not None:
                entry["measured_rps"] = round(rate, 6)
        else:
            # the level is what the tool was asked for, when it says; else what was measured
            if r.nominal_rps is not None:
                entry["offered_rps"] = float(r.nominal_rps)
            elif rate is None:
                fb, how = _fallback_rate(r)
                entry["offered_rps"] = round(fb, 6)
                entry["offered_rps_from"] = how
                warnings.append(f"run {r.run_id}: intended starts give no rate (all at once, or "
                                f"one request); offered rate {fmt_rate(fb)} rps taken from {how}")
            else:
                entry["offered_rps"] = round(rate, 6)
                entry["offered_rps_from"] = "measured"
            if rate is not None and r.timestamps != "none":
                entry["measured_rps"] = round(rate, 6)
            if r.concurrency is not None:
                entry["concurrency"] = int(r.concurrency)
            entry["arrival"] = r.arrival if r.arrival in C.ARRIVALS else "unknown"
            if r.concurrency is not None and r.nominal_rps is None:
                warnings.append(f"run {r.run_id}: closed-loop run (concurrency {r.concurrency}) in "
                                f"a sweep with open-loop runs; placed at its measured rate "
                                f"{fmt_rate(entry['offered_rps'])} rps")
        if r.nominal_rps is not None:
            entry["nominal_rps"] = float(r.nominal_rps)
            if rate is not None and r.timestamps != "none" and \
                    abs(rate - r.nominal_rps) > C.RATE_MISMATCH_WARN * r.nominal_rps:
                warnings.append(f"run {r.run_id}: measured offered rate {fmt_rate(rate)} rps differs "
                                f"from the tool's nominal {fmt_rate(r.nominal_rps)} rps by "
                                f"{100 * (rate / r.nominal_rps - 1):+.0f}%")
        if r.duration_s is not None:
            entry["duration_s"] = float(r.duration_s)
        if r.warmup_s is not None and (r.duration_s is None or r.warmup_s < r.duration_s):
            entry["warmup_s"] = float(r.warmup_s)
        if r.timestamps == "none":
            entry["timestamps"] = "none"
        elif r.clock_epoch_ns is not None:
            entry["epoch_start_ns"] = int(r.clock_epoch_ns) + t0
        entry["source"] = r.source
        if r.added:
            entry["added_unexported_requests"] = dict(r.added)
        entry.update(r.extra)
        manifest_runs.append(entry)
        kept.append(r)
        cols = dict(r.columns)
        cols["run_id"] = [r.run_id] * r.n
        parts.append(_table(cols, r))
    short = [e["run_id"] for e, p in zip(manifest_runs, kept) if _span_s(p) < SHORT_RUN_S]
    if short:
        warnings.append(f"{len(short)} of {len(manifest_runs)} runs last under {SHORT_RUN_S:g} s "
                        f"({', '.join(short[:6])}{', …' if len(short) > 6 else ''}): short runs "
                        "started on an idle server overstate capacity near saturation")
    if not manifest_runs:
        raise StudyError(f"no usable runs in the {tool} input (every run was empty)",
                         file=runs[0].source)
    top = {"source_tool": tool}
    if any(r.timestamps == "none" for r in runs):
        top["timestamps"] = "none"
        warnings.append("the source has no per-request timestamps: arrival order and times are "
                        "unknown, so only an iid analysis is valid (manifest: timestamps: none)")
    top.update(extra or {})
    models = {e.get("model") for e in manifest_runs}
    if system is None and len(models) == 1 and None not in models:
        system = {"gpu": "unknown", "gpus_per_replica": 1, "tp": 1, "pp": 1, "replicas": 1,
                  "model": models.pop()}  # hardware is not in any tool's output: fill it in
    events = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
    closed_run = {r.run_id: r.concurrency is not None and r.nominal_rps is None for r in kept}
    facts = {r.run_id: run_facts(tool, r, closed_run[r.run_id]) for r in kept}
    run_workloads = {rid: summarize_workload(
        events.filter(pa.compute.equal(events["run_id"], rid)), [f]) for rid, f in facts.items()}
    block = summarize_workload(events, list(facts.values()))
    if workload:  # what the caller states wins, and is no longer unknown
        block.update(workload)
        block.pop("unknown", None)
        if _unknown(block):
            block["unknown"] = _unknown(block)
    manifest = manifest_dict(name, manifest_runs, system=system, workload=block,
                             load_model=load_model, **top)
    return ImportResult(tool=tool, manifest=manifest, events=events, warnings=tuple(warnings),
                        run_workloads=run_workloads,
                        added={r.run_id: dict(r.added) for r in kept if r.added})


def unique_id(run_id: str, taken) -> str:
    """``run_id``, or ``run_id-2``, ``-3``, … when it is taken."""
    if run_id not in taken:
        return run_id
    k = 2
    while f"{run_id}-{k}" in taken:
        k += 1
    return f"{run_id}-{k}"


def _span_s(r: RunData) -> float:
    """How long a run lasted: the tool's duration, else its span of intended starts."""
    if r.duration_s:
        return float(r.duration_s)
    s = [v for v in r.columns["scheduled_ns"] if v is not None]
    return (max(s) - min(s)) / C.NS_PER_S if s else 0.0


def _fallback_rate(r: RunData) -> tuple[float, str]:
    """An open-loop x position for a run whose intended starts span no time (a GuideLLM
    throughput benchmark sends everything at once; a synchronous one may hold one request):
    the send rate, else requests / duration, else requests / time to the last event. A closed
    run's arrival rate is its completion rate, so it takes requests / duration first."""
    if r.nominal_rps is not None:
        return r.nominal_rps, "nominal_rps"
    if r.concurrency is not None and r.duration_s:
        return r.n / r.duration_s, "duration_s"
    rate = measured_rps(r.columns.get("sent_ns") or [])
    if rate is not None:
        return rate, "sent_ns"
    if r.duration_s:
        return r.n / r.duration_s, "duration_s"
    ends = [v for k in ("last_token_ns", "first_token_ns", "sent_ns")
            for v in r.columns.get(k) or [] if v is not None and v > 0]
    if ends:
        return r.n * C.NS_PER_S / max(ends), "last event"
    raise StudyError(f"run {r.run_id}: cannot place this run on the rate axis (no time span, "
                     "no duration, no nominal rate)", file=r.source,
                     fix="import it on its own (closed loop) or give the tool's duration")


def _table(cols: dict, run: RunData) -> pa.Table:
    arrays = {}
    for c in C.EVENT_COLUMNS:
        if c.name in cols:
            vals = cols[c.name]
            if len(vals) != run.n:
                raise AssertionError(f"importer bug: column {c.name} has {len(vals)} values, "
                                     f"expected {run.n}")
            arrays[c.name] = pa.array(vals, type=c.dtype)
    return events_table(pa.table(arrays))


def check_study_out(out: str | os.PathLike, inputs: list[str] = ()) -> Path:
    """Refuse an output path whose replacement would destroy data: an existing file, a
    non-empty directory that is not a study, or a folder holding the inputs."""
    dest = check_out(out, C.MANIFEST_NAME, "study")
    d = dest.resolve()
    for p in inputs:
        q = Path(p).resolve()
        if q == d or d in q.parents:
            raise StudyError("--out would replace the input itself", file=str(p),
                             fix="write the study to another directory")
    return dest


def write_import(result: ImportResult, out: str | os.PathLike) -> Path:
    """Write the study atomically (temp dir, then rename): nothing half-written on failure.
    An existing study at ``out`` is replaced whole; anything else there is refused."""
    dest = check_study_out(out, [r["source"] for r in result.manifest["runs"] if "source" in r])
    return write_study(dest, result.manifest, result.events)


def new_columns(*optional: str) -> dict[str, list]:
    """Empty column lists an importer appends to, one per request; ``optional`` names contract
    columns this tool can also fill (e.g. ``max_output_tokens``)."""
    return {k: [] for k in ("request_id", "scheduled_ns", "sent_ns", "first_token_ns",
                            "last_token_ns", "input_tokens", "output_tokens", "status", "itl_ns",
                            "finish_reason", *optional)}


def add_row(cols: dict[str, list], **values) -> None:
    """Append one request; columns not given get None."""
    for k in cols:
        cols[k].append(values.pop(k, None))
    if values:
        raise AssertionError(f"importer bug: unknown columns {sorted(values)}")
