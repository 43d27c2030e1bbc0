"""AIPerf (0.13, and the older ``timestamp_ns``/``credit_phase`` record schema): one run per
``profile_export.jsonl`` (``artifacts/<dir>/rate_<r>/``), its rate and load type from the
``profile_export_aiperf.json`` beside it.

Clock: epoch ns. ``credit_issued_ns`` (the credit that allows the send, ~1 ms before it) is the
closest thing AIPerf has to an intended start → ``scheduled_ns``; ``request_start_ns`` →
``sent_ns``; first token = start + ``time_to_first_token``; last token = start +
``request_latency``; ``inter_chunk_latency`` → ``itl_ns``. Warm-up records
(``benchmark_phase: warmup``) are excluded and counted in the manifest
(``excluded_warmup_requests``). Requests AIPerf cancelled at the grace cut-off are missing from
every export; their count is read from ``logs/aiperf.log`` and reported.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import contract as C
from ..errors import StudyError
from .common import (EPOCH_S_MIN, RunData, add_row, add_unexported_rows, endpoint_kind, gamma_cv,
                     load_json, load_jsonl, new_columns, parse_rate, status_from_error, to_int)

TOOL = "aiperf"
RECORDS = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"
EXPECTED = "AIPerf per-request records (profile_export.jsonl: one JSON object per line with " \
           "'metadata' and 'metrics')"
_CANCELLED_RE = re.compile(r"Phase profiling.*?complete \|.*?cancelled=(\d+)")


def sniff_record(obj) -> bool:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    return isinstance(md, dict) and ("credit_issued_ns" in md or "request_start_ns" in md
                                     or "timestamp_ns" in md)


def find_files(path: Path) -> list[Path]:
    """profile_export.jsonl files under an artifact directory (aggregates skipped)."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob(RECORDS + "*")
                   if p.name in (RECORDS, RECORDS + ".gz") and "aggregate" not in p.parts)
    return files


def parse(paths: list[str]) -> list[RunData]:
    runs = []
    for p in paths:
        files = find_files(Path(p))
        if not files:
            raise StudyError(f"no {RECORDS} found; expected an AIPerf artifact directory "
                             "(artifacts/<dir>/rate_<r>/profile_export.jsonl)", file=str(p),
                             fix="run aiperf with --export-level records or raw")
        runs.extend(_parse_file(f) for f in files)
    return runs


def _value(metrics: dict, name: str):
    m = metrics.get(name)
    if isinstance(m, dict):
        return m.get("value")
    return m


def _ms_to_ns(v) -> int | None:
    if v is None:
        return None
    return int(round(float(v) * C.NS_PER_MS))


def _load_model(summary: dict | None, folder: Path) -> tuple[float | None, int | None, str]:
    """(nominal rate, concurrency, arrival) from profile_export_aiperf.json, else the folder name."""
    rate = conc = None
    arrival = "unknown"
    if isinstance(summary, dict):
        ic = summary.get("input_config") or {}
        phases = [ph for ph in (ic.get("phases") or []) if isinstance(ph, dict)
                  and (ph.get("kind") or ph.get("name")) == "profiling"]
        if phases:
            ph = phases[0]
            rate = parse_rate(ph.get("rate"))
            conc = to_int(ph.get("concurrency"), 0) or None
            kind = str(ph.get("type") or "")
            arrival = {"poisson": "poisson", "constant": "constant", "gamma": "gamma"}.get(kind, arrival)
        lg = ic.get("loadgen") or {}  # older input_config
        rate = rate or parse_rate(lg.get("request_rate"))
        conc = conc or (to_int(lg.get("concurrency"), 0) or None)
        if arrival == "unknown" and lg.get("request_rate_mode"):
            arrival = {"poisson": "poisson", "constant": "constant"}.get(
                str(lg["request_rate_mode"]).lower(), "unknown")
        vv = ((summary.get("run_info") or {}).get("variation_values") or {})
        for k, v in vv.items():
            if k.endswith(".rate"):
                rate = parse_rate(v) or rate
            elif k.endswith(".concurrency"):
                conc = to_int(v, 0) or conc
    if rate is None and conc is None:
        m = re.match(r"(rate|concurrency)_([0-9.]+)", folder.name)
        if m:
            if m.group(1) == "rate":
                rate = parse_rate(m.group(2))
            else:
                conc = to_int(m.group(2), 0) or None
    if rate is not None:
        conc = None  # open loop (a concurrency cap is not the load level)
    elif conc is not None:
        arrival = "concurrency"
    return rate, conc, arrival


def _epoch_clock(stamps) -> bool:
    """AIPerf stamps requests with wall-clock epoch ns (time.time_ns); a hand-made file with
    small numbers is on no known clock."""
    vals = [v for v in stamps if v is not None]
    return bool(vals) and min(vals) >= EPOCH_S_MIN * C.NS_PER_S


def _cancelled_in_log(folder: Path) -> int | None:
    log = folder / "logs" / "aiperf.log"
    if not log.is_file():
        return None
    n = None
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _CANCELLED_RE.search(line)
        if m:
            n = int(m.group(1))
    return n


def _parse_file(path: Path) -> RunData:
    records = load_jsonl(path, EXPECTED)
    for i, r in enumerate(records, 1):
        if not sniff_record(r):
            raise StudyError(f"line {i} is not an AIPerf record: expected 'metadata' with "
                             "credit_issued_ns/request_start_ns", file=str(path),
                             example=str(list(r)[:6]), fix="pass AIPerf's profile_export.jsonl")
    folder = path.parent
    summary = None
    for name in (SUMMARY, SUMMARY + ".gz"):
        if (folder / name).is_file():
            summary = load_json(folder / name, "AIPerf's profile_export_aiperf.json")
    rate, conc, arrival = _load_model(summary, folder)
    facts, fixed_osl = _workload(summary)
    cols = new_columns("max_output_tokens")
    cached, sessions, turns = [], [], []  # prefix-cache reads, conversations (where reported)
    warm = 0
    for i, r in enumerate(records, 1):
        md, mt = r["metadata"], (r.get("metrics") or {})
        phase = md.get("benchmark_phase") or md.get("credit_phase") or md.get("phase_kind")
        if str(phase).lower() == "warmup":
            warm += 1
            continue
        sent = md.get("request_start_ns", md.get("timestamp_ns"))
        sched = md.get("credit_issued_ns", sent)
        if sent is None:
            raise StudyError(f"line {i}: record has no request_start_ns/timestamp_ns",
                             file=str(path), column="metadata.request_start_ns")
        sent, sched = int(sent), int(sched)
        err = r.get("error")
        cancelled = bool(md.get("was_cancelled"))
        if err or cancelled:
            e = err if isinstance(err, dict) else {}
            status = status_from_error(f"{e.get('type', '')} {e.get('message', '')}",
                                       code=e.get("code"), cancelled=cancelled)
        else:
            status = C.Status.OK.value
        ttft = _ms_to_ns(_value(mt, "time_to_first_token"))
        lat = _ms_to_ns(_value(mt, "request_latency"))
        icl = _value(mt, "inter_chunk_latency")
        osl = _value(mt, "output_sequence_length")
        if osl is None:
            osl = _value(mt, "output_token_count")
        isl = _value(mt, "input_sequence_length")
        if isl is None:
            isl = _value(mt, "error_isl") if _value(mt, "error_isl") is not None else \
                _value(mt, "usage_prompt_tokens")
        read = _value(mt, "usage_prompt_cache_read_tokens")
        cached.append(None if read is None or isl is None else max(0, to_int(isl) - to_int(read)))
        sessions.append(md.get("conversation_id"))
        turns.append(md.get("turn_index") or 0)
        add_row(cols,
                request_id=str(md.get("x_request_id") or md.get("x_correlation_id") or i),
                scheduled_ns=sched, sent_ns=sent,
                first_token_ns=None if ttft is None else sent + ttft,
                last_token_ns=None if lat is None or ttft is None else sent + lat,
                input_tokens=to_int(isl), output_tokens=to_int(osl), status=status,
                max_output_tokens=fixed_osl,
                itl_ns=[_ms_to_ns(x) for x in icl] if isinstance(icl, list) else None)
    if any(v is not None for v in cached):  # the server reported prompt-cache reads
        cols["computed_input_tokens"] = cached
    if any(t for t in turns) and any(v is not None for v in sessions):  # multi-turn conversations
        cols["session_id"] = [None if v is None else str(v) for v in sessions]
    if fixed_osl is None:  # the asked output length varied per request and AIPerf keeps no body
        del cols["max_output_tokens"]
    # the run is the folder AIPerf wrote it to (rate_6.0 in a sweep, the --artifact-dir name else)
    run = RunData(run_id=folder.name or path.stem, source=str(path), columns=cols,
                  nominal_rps=rate, concurrency=conc, arrival=arrival, workload=facts,
                  clock_epoch_ns=0 if _epoch_clock(cols["scheduled_ns"]) else None)
    if summary:
        phases = [ph for ph in ((summary.get("input_config") or {}).get("phases") or [])
                  if isinstance(ph, dict) and ph.get("kind") == "profiling"]
        if phases and phases[0].get("duration") is not None:
            run.duration_s = float(phases[0]["duration"])
    if summary:
        items = ((summary.get("input_config") or {}).get("models") or {}).get("items") or []
        if items and isinstance(items[0], dict) and items[0].get("name"):
            run.extra["model"] = str(items[0]["name"])
    if warm:
        run.extra["excluded_warmup_requests"] = warm
    missing = _cancelled_in_log(folder)
    if missing:
        run.extra["missing_cancelled_requests"] = missing
        asked = facts.get("asked") or {}
        add_unexported_rows(run, missing, C.Status.CANCELLED.value,
                            input_tokens=asked.get("input_tokens"), max_output_tokens=fixed_osl)
        run.warnings.append(
            f"AIPerf's log reports cancelled={missing} in the profiling phase, but AIPerf drops "
            "requests cancelled at the grace cut-off from every export: added as "
            f"{missing} cancelled row(s) without tokens at the end of the run's schedule")
    return run


def _isint(v) -> int | float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if f.is_integer() else f


def _workload(summary: dict | None) -> tuple[dict, int | None]:
    """(workload facts, the fixed asked output length or None) from profile_export_aiperf.json:
    aiperf_version, endpoint type / streaming, dataset isl/osl (--isl/--osl), ignore_eos among
    the extra inputs, tokenizer, grace period and seed."""
    if not isinstance(summary, dict):
        return {}, None
    ic = summary.get("input_config") or {}
    f: dict = {}
    if summary.get("aiperf_version"):
        f["tool_version"] = str(summary["aiperf_version"])
    ep = ic.get("endpoint") or {}
    if ep.get("type"):
        f["endpoint"] = endpoint_kind(ep.get("type"))
    if isinstance(ep.get("streaming"), bool):
        f["streaming"] = ep["streaming"]
    extra = ep.get("extra") or {}
    if isinstance(extra, list):  # [[key, value], ...] in some versions
        extra = {str(x[0]): x[1] for x in extra if isinstance(x, (list, tuple)) and len(x) == 2}
    if isinstance(extra, dict) and "extra" in ep:
        # the extra inputs AIPerf sent are listed in full: no ignore_eos there, answers may stop
        # at end of sequence before the asked length
        f["output_fixed"] = str(extra.get("ignore_eos")).lower() == "true"
    fixed_osl = None
    ds = [d for d in (ic.get("datasets") or []) if isinstance(d, dict)]
    if ds:
        prompts = ds[0].get("prompts") or {}
        isl, osl = prompts.get("isl") or {}, prompts.get("osl") or {}
        asked = {}
        if isinstance(isl, dict) and _isint(isl.get("mean")) is not None:
            asked["input_tokens"] = _isint(isl["mean"])
        if isinstance(osl, dict) and _isint(osl.get("mean")) is not None:
            asked["output_tokens"] = _isint(osl["mean"])
            if not float(osl.get("stddev") or 0) and isinstance(asked["output_tokens"], int):
                fixed_osl = asked["output_tokens"]  # every request asked max_tokens = --osl
        if asked:
            f["asked"] = asked
        if ds[0].get("random_seed") is not None:
            f["seed"] = ds[0]["random_seed"]
    tok = (ic.get("tokenizer") or {}).get("name")
    if tok:
        f["tokenizer"] = str(tok)
    phases = [ph for ph in (ic.get("phases") or []) if isinstance(ph, dict)
              and (ph.get("kind") or ph.get("name")) == "profiling"]
    if phases and phases[0].get("grace_period") is not None:
        f["grace_s"] = float(phases[0]["grace_period"])
    if phases and str(phases[0].get("type") or "") == "gamma":
        shape = next((float(phases[0][k]) for k in ("smoothness", "arrival_smoothness")
                      if phases[0].get(k) is not None), 1.0)  # AIPerf's default shape is 1
        f["arrival_cv"] = gamma_cv(shape)
    return f, fixed_osl
