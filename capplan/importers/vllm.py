"""vLLM ``bench serve --save-result --save-detailed`` JSON: one file per rate, index-aligned
per-request arrays that include failed requests.

Clock: ``start_times`` are perf-counter seconds (arbitrary origin) taken when the request is sent;
vLLM records no separate intended start, so ``scheduled_ns = sent_ns`` (with ``max_concurrency``
set, a request waiting for a slot is stamped late: its queueing wait is invisible — a
coordinated-omission caveat). ``ttfts`` (s) → first token; ``itls`` (s, one per streamed chunk
after the first) → ``itl_ns``; last token = start + ``latencies``/``e2els`` (s), else
first + sum(itls). ``errors[i] == ""`` → ok, otherwise the error text decides the status.
"""

from __future__ import annotations

from pathlib import Path

from .. import contract as C
from ..errors import StudyError
from .common import (RunData, add_row, add_unexported_rows, endpoint_kind, gamma_cv, load_json,
                     new_columns, parse_rate, s_to_ns, status_from_error, to_int)

TOOL = "vllm"
EXPECTED = "a vLLM bench serve result (--save-result --save-detailed: 'ttfts', 'itls', " \
           "'input_lens', 'output_lens', 'errors' arrays)"
ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "errors")


def sniff(obj) -> bool:
    """A vLLM result mapping (SGLang's single-line results say backend: sglang*)."""
    return isinstance(obj, dict) and "ttfts" in obj and "itls" in obj and "input_lens" in obj \
        and not str(obj.get("backend", "")).startswith("sglang")


def parse(paths: list[str]) -> list[RunData]:
    files: list[Path] = []
    for p in paths:
        pp = Path(p)
        files.extend(sorted(x for x in pp.glob("*.json")) if pp.is_dir() else [pp])
    if not files:
        raise StudyError(f"no JSON files found; expected {EXPECTED}", file=", ".join(paths))
    return [parse_result(load_json(f, EXPECTED), f) for f in files]


def parse_result(obj, path: Path, *, expected: str = EXPECTED, where: str = "") -> RunData:
    """A vLLM-style result mapping → one run (SGLang's lines share it but lack start_times)."""
    if not isinstance(obj, dict):
        raise StudyError(f"{where}expected {expected}, got a JSON {type(obj).__name__}", file=str(path))
    missing = [k for k in ARRAYS if k not in obj]
    if missing:
        hint = " (saved without --save-detailed?)" if "ttfts" in missing else ""
        raise StudyError(f"{where}missing per-request field(s) {', '.join(missing)}{hint}; "
                         f"expected {expected}", file=str(path), column=missing[0],
                         fix="rerun with --save-result --save-detailed (vLLM) or "
                             "--output-details (SGLang)")
    n = len(obj["input_lens"])
    if n == 0:
        raise StudyError(f"{where}the per-request arrays are empty: no requests were recorded",
                         file=str(path))
    arrays = {k: obj[k] for k in ARRAYS}
    lat = obj.get("latencies") if obj.get("latencies") is not None else obj.get("e2els")
    starts = obj.get("start_times")
    for k, v in [*arrays.items(), ("latencies", lat), ("start_times", starts)]:
        if v is not None and (not isinstance(v, list) or len(v) != n):
            raise StudyError(f"'{k}' has {len(v) if isinstance(v, list) else 'no'} entries but "
                             f"'input_lens' has {n}; the arrays must be index-aligned",
                             file=str(path), column=k)
    if starts is not None and not all(isinstance(x, (int, float)) for x in starts):
        raise StudyError(f"{where}'start_times' must hold numbers (perf-counter seconds)",
                         file=str(path), column="start_times",
                         example=str([x for x in starts if not isinstance(x, (int, float))][:1]))
    rate = parse_rate(obj.get("request_rate"))
    synthetic = starts is None
    if synthetic:  # SGLang: order and send times unknown; spread evenly at the nominal rate
        dur = float(obj.get("duration") or 0) or None
        step_s = 1.0 / rate if rate else (dur / n if dur else 1.0)
        starts = [i * step_s for i in range(n)]
    origin = min(float(s) for s in starts)
    cols = new_columns()
    for i in range(n):
        err = arrays["errors"][i]
        status = C.Status.OK.value if not err else status_from_error(str(err))
        sent = s_to_ns(starts[i], origin)
        ttft = arrays["ttfts"][i]
        itl = arrays["itls"][i] or []
        ok_ttft = ttft is not None and float(ttft) > 0 and (status == C.Status.OK.value or itl)
        first = sent + round(float(ttft) * C.NS_PER_S) if ok_ttft and sent is not None else None
        last = None
        if first is not None:
            if lat is not None and lat[i] is not None and float(lat[i]) > 0:
                last = sent + round(float(lat[i]) * C.NS_PER_S)
            else:
                last = first + sum(round(float(x) * C.NS_PER_S) for x in itl)
        add_row(cols, request_id=str(i), scheduled_ns=sent, sent_ns=None if synthetic else sent, first_token_ns=first,
                last_token_ns=last, input_tokens=to_int(arrays["input_lens"][i]),
                output_tokens=to_int(arrays["output_lens"][i]) if status == C.Status.OK.value
                or itl else 0,
                status=status,
                itl_ns=[round(float(x) * C.NS_PER_S) for x in itl] if itl else None)
    conc = to_int(obj.get("max_concurrency"), 0) or None
    closed = rate is None and conc is not None
    burst = obj.get("burstiness")
    arrival = "concurrency" if closed else (
        "poisson" if burst in (None, 1, 1.0) else "gamma")
    run = RunData(run_id=(f"rate_{rate:g}" if rate is not None else
                          f"concurrency_{conc}" if conc else path.stem),
                  source=str(path), columns=cols, nominal_rps=rate,
                  concurrency=conc if closed else None, arrival=arrival,
                  duration_s=float(obj["duration"]) if obj.get("duration") else None)
    if synthetic:
        run.timestamps = "none"
        run.arrival = "unknown"
        run.extra["scheduled_ns_synthetic"] = True
        if not str(obj.get("backend", "")).startswith("sglang"):
            run.warnings.append("no 'start_times' in this result (vLLM before per-request start "
                                "times were saved): arrival times unknown, iid analysis only")
    if obj.get("model_id"):
        run.extra["model"] = str(obj["model_id"])
    for k in ("completed", "failed"):
        if obj.get(k) is not None:
            run.extra[f"source_{k}"] = int(obj[k])
    run.workload = _workload(obj, synthetic, rate, closed)
    listed = sum(1 for s in cols["status"] if s != C.Status.OK.value)
    unlisted = to_int(obj.get("failed"), 0) - listed
    if unlisted > 0 and not synthetic:  # counted as failed but absent from the arrays
        add_unexported_rows(run, unlisted, C.Status.ERROR.value)
        run.warnings.append(f"'failed' is {obj['failed']} but the per-request arrays hold {listed} "
                            f"failures: added {unlisted} error row(s) without tokens at the end "
                            "of the run's schedule")
    if conc and not closed:
        run.extra["max_concurrency"] = conc
        run.warnings.append(f"max_concurrency={conc} caps this open-loop run: requests waiting "
                            "for a slot are stamped when sent, so their queueing is not measured")
    if burst not in (None, 1, 1.0):
        run.extra["burstiness"] = float(burst)
    if rate is None and conc is None:
        run.warnings.append("request_rate is inf and no max_concurrency: all requests were "
                            "sent at once (a burst, not a rate)")
    return run


def _workload(obj: dict, synthetic: bool, rate, closed: bool) -> dict:
    """Workload facts a vLLM / SGLang result states: the backend (→ endpoint), tokenizer,
    ignore_eos, the random dataset's lengths (SGLang keeps ``random_input_len``), the seed, and the
    arrival process when the timestamps cannot show it (Poisson, gamma with burstiness ≠ 1)."""
    f: dict = {}
    backend = str(obj.get("backend") or "")
    if obj.get("endpoint"):
        f["endpoint"] = endpoint_kind(obj["endpoint"])
    elif backend.startswith("sglang-oai"):  # SGLang's OpenAI-compatible backends
        f["endpoint"] = "chat" if "chat" in backend else "completions"
    elif backend and not backend.startswith("sglang"):  # sglang / sglang-native: /generate
        f["endpoint"] = endpoint_kind(backend)
    if obj.get("tokenizer_id"):
        f["tokenizer"] = str(obj["tokenizer_id"])
    if obj.get("ignore_eos") is True:
        f["output_fixed"] = True
    asked = {k2: to_int(obj[k1]) for k1, k2 in (("random_input_len", "input_tokens"),
                                                ("random_output_len", "output_tokens"))
             if obj.get(k1) is not None}
    if asked:
        f["asked"] = asked
    if obj.get("seed") is not None:
        f["seed"] = obj["seed"]
    burst = obj.get("burstiness")
    if synthetic and not closed and rate is not None:
        f["arrival"] = "poisson" if burst in (None, 1, 1.0) else "gamma"
    if not closed and rate is not None and burst not in (None, 1, 1.0):
        f["arrival_cv"] = gamma_cv(float(burst))  # gamma gaps of shape = burstiness
    return f
