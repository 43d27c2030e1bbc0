"""LLMPerf ``token_benchmark_ray.py`` output: ``*_individual_responses.json`` (a list of
per-request metric mappings) and, beside it, ``*_summary.json`` (``num_concurrent_requests``).

LLMPerf is closed-loop (N concurrent clients) and stores no per-request timestamps: each request
gives ``ttft_s``, ``end_to_end_latency_s``, ``inter_token_latency_s`` (the request's mean gap or
their sum, depending on the client), token counts and ``error_code``/``error_msg``. Arrival
order and times are lost, so only an iid analysis is valid: the manifest says
``timestamps: none`` and ``scheduled_ns`` are synthetic (evenly spaced in file order at the
run's mean throughput, ``scheduled_ns_synthetic: true``). ``itl_ns`` stays empty.
"""

from __future__ import annotations

import math
from pathlib import Path

from .. import contract as C
from ..errors import StudyError
from .common import RunData, add_row, load_json, new_columns, status_from_error, to_int

TOOL = "llmperf"
EXPECTED = "an LLMPerf *_individual_responses.json (a list of per-request metrics with " \
           "'ttft_s', 'end_to_end_latency_s', 'number_output_tokens')"
KEYS = ("ttft_s", "end_to_end_latency_s")


def sniff(obj) -> bool:
    return isinstance(obj, list) and bool(obj) and isinstance(obj[0], dict) and \
        all(k in obj[0] for k in KEYS)


def find_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(path.glob("*_individual_responses.json*"))


def parse(paths: list[str]) -> list[RunData]:
    runs = []
    for p in paths:
        files = find_files(Path(p))
        if not files:
            raise StudyError(f"no *_individual_responses.json found; expected {EXPECTED}", file=str(p))
        runs.extend(_parse_file(f) for f in files)
    return runs


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _parse_file(path: Path) -> RunData:
    data = load_json(path, EXPECTED)
    if not isinstance(data, list):
        raise StudyError(f"expected {EXPECTED}, got a JSON {type(data).__name__}", file=str(path))
    if not data:
        raise StudyError("the response list is empty: no requests were recorded", file=str(path))
    for i, r in enumerate(data):
        missing = [k for k in KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise StudyError(f"record {i} lacks {', '.join(missing)}; expected {EXPECTED}",
                             file=str(path), column=missing[0])
    summary = {}
    stem = path.name.split("_individual_responses")[0]
    for cand in (path.with_name(stem + "_summary.json"), *path.parent.glob("*_summary.json")):
        if cand.is_file():
            s = load_json(cand, "an LLMPerf *_summary.json")
            summary = s if isinstance(s, dict) else {}
            break
    conc = to_int(summary.get("num_concurrent_requests"), 0) or None
    e2es = [_num(r.get("end_to_end_latency_s")) or 0.0 for r in data]
    # closed loop: requests complete at about conc / mean latency per second
    mean_e2e = sum(e2es) / len(e2es) if e2es else 0.0
    step_ns = int(round((mean_e2e / (conc or 1)) * C.NS_PER_S)) or C.NS_PER_S
    cols = new_columns()
    for i, r in enumerate(data):
        code, msg = r.get("error_code"), r.get("error_msg")
        failed = (code not in (None, "", 0) and not (isinstance(code, float) and math.isnan(code))) \
            or bool(msg)
        status = status_from_error(str(msg or ""), code=code) if failed else C.Status.OK.value
        sched = i * step_ns
        ttft, e2e = _num(r.get("ttft_s")), _num(r.get("end_to_end_latency_s"))
        first = sched + round(ttft * C.NS_PER_S) if ttft and not failed else None
        last = sched + round(e2e * C.NS_PER_S) if e2e and first is not None else None
        add_row(cols, request_id=str(i), scheduled_ns=sched, sent_ns=None, first_token_ns=first,
                last_token_ns=last, input_tokens=to_int(r.get("number_input_tokens")),
                output_tokens=to_int(r.get("number_output_tokens")) if not failed else 0,
                status=status, itl_ns=None)
    run = RunData(run_id=stem or path.stem, source=str(path), columns=cols,
                  concurrency=conc or 1, arrival="unknown", timestamps="none",
                  extra={"scheduled_ns_synthetic": True})
    asked = {k2: to_int(summary[k1]) for k1, k2 in (("mean_input_tokens", "input_tokens"),
                                                    ("mean_output_tokens", "output_tokens"))
             if summary.get(k1) is not None}
    if asked:  # --mean-input-tokens / --mean-output-tokens
        run.workload["asked"] = asked
    if summary.get("version"):
        run.workload["tool_version"] = str(summary["version"])
    if conc is None:
        run.warnings.append("no *_summary.json with num_concurrent_requests beside the file: "
                            "concurrency assumed 1")
    return run
