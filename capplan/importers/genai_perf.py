"""GenAI-Perf ``profile_export.json`` (perf_analyzer's per-request export):
``experiments[{experiment{mode, value}, requests[{timestamp, request_inputs, response_timestamps[],
response_outputs[]}], window_boundaries}]``, epoch ns.

One experiment = one run: mode ``concurrency`` → closed loop at ``value``, ``request_rate`` →
open loop at nominal ``value``. ``timestamp`` is the send time and there is no intended start,
so ``scheduled_ns = sent_ns``. Each streamed response is a chunk: the first and last chunks that
carry text are the first/last token, their gaps → ``itl_ns``, and the number of text-bearing
chunks is ``output_tokens`` (GenAI-Perf re-tokenizes text instead; one token per chunk holds for
OpenAI-style streaming). A request with no response is an error (perf_analyzer exports no error
text). Per-request input tokens are not exported: the mean ``input_sequence_length`` from
``profile_export_genai_perf.json`` beside the file is used when present, else the prompt's
whitespace word count (manifest ``input_tokens_source`` says which). Requests sent before the
first ``window_boundaries`` entry are marked as warm-up (``warmup_s``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import contract as C
from ..errors import StudyError
from .common import (EPOCH_S_MIN, RunData, add_row, endpoint_kind, gaps_ns, load_json, new_columns,
                     requested_output_tokens, to_int)

TOOL = "genai_perf"
EXPECTED = "a GenAI-Perf profile_export.json ({'experiments': [{'experiment': {...}, " \
           "'requests': [{'timestamp', 'response_timestamps', ...}]}]})"


def sniff(obj) -> bool:
    if not isinstance(obj, dict) or not isinstance(obj.get("experiments"), list):
        return False
    e = obj["experiments"][0] if obj["experiments"] else {}
    return isinstance(e, dict) and "experiment" in e and "requests" in e


def find_file(path: Path) -> Path:
    if path.is_file():
        return path
    for name in ("profile_export.json", "profile_export.json.gz"):
        hits = sorted(path.rglob(name))
        if hits:
            return hits[0]
    raise StudyError(f"no profile_export.json found; expected {EXPECTED}", file=str(path))


def parse(paths: list[str]) -> list[RunData]:
    runs = []
    for p in paths:
        f = find_file(Path(p))
        obj = load_json(f, EXPECTED)
        if not sniff(obj):
            raise StudyError(f"not a GenAI-Perf export: expected {EXPECTED}", file=str(f))
        isl = _mean_isl(f.parent)
        for k, exp in enumerate(obj["experiments"]):
            run = _experiment(exp, k, f, isl)
            run.workload = _workload(obj, exp)
            runs.append(run)
    return runs


def _mean_isl(folder: Path) -> float | None:
    for name in ("profile_export_genai_perf.json", "profile_export_genai_perf.json.gz"):
        f = folder / name
        if f.is_file():
            d = load_json(f, "GenAI-Perf's profile_export_genai_perf.json")
            v = (d.get("input_sequence_length") or {}).get("avg") if isinstance(d, dict) else None
            if v is not None:
                return float(v)
    return None


def _chunk_text(resp) -> str:
    """The generated text of one streamed response (SSE 'data: {...}' or a plain mapping)."""
    raw = resp.get("response", resp) if isinstance(resp, dict) else resp
    if isinstance(raw, dict):
        objs = [raw]
    else:
        objs = []
        for part in str(raw).split("data:"):
            part = part.strip()
            if not part or part == "[DONE]":
                continue
            try:
                objs.append(json.loads(part))
            except json.JSONDecodeError:
                continue
    out = []
    for o in objs:
        for ch in (o.get("choices") or []) if isinstance(o, dict) else []:
            delta = ch.get("delta") or {}
            out.append(str(delta.get("content") or ch.get("text") or ""))
        if isinstance(o, dict) and "text_output" in o:
            out.append(str(o["text_output"]))
    return "".join(out)


def _prompt_words(inputs) -> int:
    payload = inputs.get("payload") if isinstance(inputs, dict) else None
    try:
        body = json.loads(payload) if isinstance(payload, str) else (payload or inputs or {})
    except json.JSONDecodeError:
        return len(str(payload).split())
    msgs = body.get("messages") if isinstance(body, dict) else None
    if msgs:
        return sum(len(str(m.get("content", "")).split()) for m in msgs if isinstance(m, dict))
    return len(str(body.get("prompt", body.get("text_input", ""))).split()) if isinstance(body, dict) else 0


def _experiment(exp: dict, k: int, path: Path, isl: float | None) -> RunData:
    meta = exp.get("experiment") or {}
    mode, value = str(meta.get("mode", "")), meta.get("value")
    reqs = exp.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise StudyError(f"experiment {k} has no requests", file=str(path), column="requests")
    for i, r in enumerate(reqs):
        if not isinstance(r, dict) or "timestamp" not in r or "response_timestamps" not in r:
            raise StudyError(f"experiment {k}, request {i} lacks timestamp/response_timestamps",
                             file=str(path), column="timestamp")
    cols = new_columns("max_output_tokens")
    for i, r in enumerate(reqs):
        sent = int(r["timestamp"])
        ts = [int(t) for t in r.get("response_timestamps") or []]
        outs = r.get("response_outputs") or []
        if len(outs) == len(ts):
            tok_ts = [t for t, o in zip(ts, outs) if _chunk_text(o)]
        else:
            tok_ts = ts
        status = C.Status.OK.value if ts else C.Status.ERROR.value
        add_row(cols, request_id=f"{k}-{i}", scheduled_ns=sent, sent_ns=sent,
                first_token_ns=tok_ts[0] if tok_ts else None,
                last_token_ns=tok_ts[-1] if tok_ts else None,
                input_tokens=to_int(isl) if isl is not None else _prompt_words(r.get("request_inputs")),
                output_tokens=len(tok_ts), status=status, itl_ns=gaps_ns(tok_ts),
                max_output_tokens=requested_output_tokens(r.get("request_inputs")))
    closed = mode == "concurrency"
    epoch = bool(cols["sent_ns"]) and min(cols["sent_ns"]) >= EPOCH_S_MIN * C.NS_PER_S
    run = RunData(run_id=f"{mode or 'experiment'}_{value if value is not None else k}",
                  source=str(path), columns=cols,
                  nominal_rps=None if closed else (float(value) if value else None),
                  concurrency=to_int(value, 1) if closed else None,
                  arrival="concurrency" if closed else "unknown",
                  extra={"input_tokens_source": "genai_perf_mean_isl" if isl is not None
                         else "prompt_words"},
                  clock_epoch_ns=0 if epoch else None)  # GenAI-Perf stamps epoch ns
    wb = exp.get("window_boundaries") or []
    if wb:
        first = min(cols["scheduled_ns"])
        warm = (int(wb[0]) - first) / C.NS_PER_S
        if warm > 0:
            run.warmup_s = warm
    return run


def _workload(obj: dict, exp: dict) -> dict:
    """Workload facts: the export's version, the endpoint, streaming and ignore_eos from the
    first request's payload."""
    f: dict = {}
    if obj.get("version"):
        f["tool_version"] = str(obj["version"])
    if obj.get("endpoint"):
        f["endpoint"] = endpoint_kind(obj["endpoint"])
    reqs = exp.get("requests") or []
    payload = (reqs[0].get("request_inputs") or {}).get("payload") if reqs else None
    try:
        body = json.loads(payload) if isinstance(payload, str) else payload
    except json.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("stream"), bool):
            f["streaming"] = body["stream"]
        # the payload is the whole body sent (extra inputs included): no ignore_eos there,
        # answers may stop at end of sequence
        f["output_fixed"] = body.get("ignore_eos") is True
    return f
