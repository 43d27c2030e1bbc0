"""GuideLLM benchmark reports (``--output kind=json``/yaml): format version 2 (GuideLLM 0.8.x)
and the older 2025 field names (0.2–0.4, ``scheduler_info.targeted_start_time``).

One benchmark = one run. Clocks are epoch float seconds; each run is re-based on its first
intended start. Requests: ``successful`` → ok, ``errored`` → error/timeout/rejected (from the
error text), ``incomplete`` → cancelled (GuideLLM cancels open requests at the end of each
benchmark). GuideLLM keeps no per-token timestamps, so ``itl_ns`` stays empty. The answer
length each request asked for (``max_output_tokens``) comes from the body in ``request_args``.
"""

from __future__ import annotations

from pathlib import Path

from .. import contract as C
from ..errors import StudyError
from .common import (EPOCH_S_MIN, GENERIC_NAMES, RunData, add_row, endpoint_kind, load_json,
                     new_columns, parse_rate, requested_output_tokens, s_to_ns, status_from_error, to_int)

TOOL = "guidellm"
REPORT_SUFFIXES = (".json", ".json.gz", ".yaml", ".yml", ".yaml.gz", ".yml.gz")
EXPECTED = "a GuideLLM benchmark report (JSON/YAML with 'benchmarks': [...])"
BUCKETS = (("successful", C.Status.OK.value), ("errored", None), ("incomplete", C.Status.CANCELLED.value))


def sniff(obj) -> bool:
    """True for a GuideLLM report (any format version)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("benchmarks"), list):
        return False
    b = obj["benchmarks"][0] if obj["benchmarks"] else {}
    return isinstance(b, dict) and isinstance(b.get("requests"), dict) and (
        "successful" in b["requests"] or "errored" in b["requests"])


def format_version(obj: dict) -> int:
    """2 for GuideLLM ≥ 0.5 reports (``metadata.version``), 1 for the 2025 field names."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict) and meta.get("version") is not None:
        return int(meta["version"])
    return 1


def find_files(path: Path) -> list[Path]:
    """The GuideLLM reports in an output folder (``benchmarks.json`` / ``.yaml``, gzipped or
    not; the CSV and HTML views GuideLLM writes beside them are skipped)."""
    files = []
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.name.endswith(REPORT_SUFFIXES):
            try:
                if sniff(load_json(p, EXPECTED)):
                    files.append(p)
            except StudyError:
                continue
    if not files:
        raise StudyError("no GuideLLM report in this folder", file=str(path),
                         fix="pass the folder given to `guidellm run --output-path`, or the "
                             "benchmarks.json file in it")
    return files


def parse(paths: list[str]) -> list[RunData]:
    runs: list[RunData] = []
    files = [f for p in paths for f in (find_files(Path(p)) if Path(p).is_dir() else [p])]
    for path in files:
        obj = load_json(path, EXPECTED)
        if not sniff(obj):
            raise StudyError(f"not a GuideLLM report: expected {EXPECTED} with "
                             "requests.successful/errored/incomplete", file=str(path),
                             fix="pass the file written by `guidellm run --output kind=json,...`")
        version = format_version(obj)
        parse_bench = _bench_v2 if version >= 2 else _bench_v1
        file_runs = [parse_bench(bench, i, str(path), version)
                     for i, bench in enumerate(obj["benchmarks"])]
        backend = (((obj.get("config") or {}).get("spec") or {}).get("backend") or {})
        slo = {k: v for k, v in ((obj["benchmarks"][0].get("config") or {}).get("slo") or {}).items()
               if v is not None} if file_runs else {}
        facts = _workload(obj)
        for r, bench in zip(file_runs, obj["benchmarks"]):
            r.workload = {**facts, **_bench_facts(bench, facts)}
            if backend.get("model"):
                r.extra["model"] = str(backend["model"])
            if slo:
                r.extra["guidellm_slo"] = dict(slo)
        _flag_shared_arrival_path(file_runs)
        folder = Path(path).parent.name
        if len(file_runs) == 1 and folder and folder.lower() not in GENERIC_NAMES:
            # one benchmark in a run's own folder (capplan design's DIR/benchmarks.json): the
            # run is the folder, as for AIPerf; the profile label stays in the manifest
            file_runs[0].extra["guidellm_label"] = file_runs[0].run_id
            file_runs[0].run_id = folder
        runs.extend(file_runs)
    return runs



def _unit_gaps(run: RunData, k: int = 20) -> list[float]:
    """The first k inter-arrival gaps scaled by the nominal rate (unit-rate arrival path)."""
    s = sorted(run.columns["scheduled_ns"])
    return [(b - a) * run.nominal_rps / C.NS_PER_S for a, b in zip(s, s[1:])][:k]


def _flag_shared_arrival_path(runs: list[RunData], min_gaps: int = 5, rtol: float = 1e-3) -> None:
    """GuideLLM reuses one random arrival path for every rate: the rates of a sweep are then not
    independent samples. Detected as identical rate-scaled gap sequences between benchmarks."""
    paths = [(r, _unit_gaps(r)) for r in runs if r.nominal_rps and r.arrival == "poisson"]
    for j, (r, g) in enumerate(paths):
        for q, h in paths[:j]:
            m = min(len(g), len(h))
            if m >= min_gaps and all(abs(a - b) <= rtol * max(abs(a), abs(b), 1e-9)
                                     for a, b in zip(g[:m], h[:m])):
                r.extra["guidellm_same_arrival_path_as"] = q.run_id
                r.warnings.append(
                    f"same random arrival path as run {q.run_id} (rate-scaled gaps identical): "
                    "GuideLLM reuses one path for every rate, so the rates are not independent "
                    "samples and their errors are correlated")
                break


def _strategy(strategy: dict) -> tuple[str, float | None, int | None, str]:
    """(type, nominal rate, concurrency, arrival) from a GuideLLM strategy mapping."""
    kind = str(strategy.get("type_") or strategy.get("type") or "unknown")
    rate = parse_rate(strategy.get("rate"))
    conc = None
    if kind == "synchronous":
        conc = 1
    elif kind == "concurrent":
        conc = to_int(strategy.get("streams"), 0) or None
    elif kind == "throughput":
        conc = to_int(strategy.get("max_concurrency"), 0) or None
    arrival = {"poisson": "poisson", "constant": "constant"}.get(kind, "concurrency" if conc else "unknown")
    return kind, rate, conc, arrival


def _run_label(kind: str, rate, conc, index: int) -> str:
    if rate is not None:
        return f"{kind}@{rate:g}"
    if conc is not None:
        return f"{kind}-c{conc}"
    return f"{kind}-{index}"


def _iter_requests(bench: dict, path: str, index: int):
    reqs = bench.get("requests")
    if not isinstance(reqs, dict):
        raise StudyError(f"benchmark {index} has no 'requests' mapping "
                         "(successful/errored/incomplete)", file=path, column="requests")
    total = 0
    for bucket, status in BUCKETS:
        items = reqs.get(bucket) or []
        if not isinstance(items, list):
            raise StudyError(f"benchmark {index}: requests.{bucket} must be a list", file=path)
        total += len(items)
        for r in items:
            yield bucket, status, r
    if total == 0:
        raise StudyError(f"benchmark {index}: the request lists are empty "
                         "(requests.successful/errored/incomplete)", file=path,
                         fix="GuideLLM keeps per-request data unless it was sampled away; rerun "
                             "without --sample-requests or with a larger value")


def _bench_v2(bench: dict, index: int, path: str, version: int) -> RunData:
    cfg = bench.get("config") or {}
    strategy = cfg.get("strategy")
    if not isinstance(strategy, dict):
        raise StudyError(f"benchmark {index}: missing 'config.strategy' (format version {version})",
                         file=path, column="config.strategy")
    kind, rate, conc, arrival = _strategy(strategy)
    rows = []
    for bucket, status, r in _iter_requests(bench, path, index):
        info = r.get("info") or {}
        t = info.get("timings")
        if not isinstance(t, dict) or "targeted_start" not in t:
            raise StudyError(f"benchmark {index}: a request in requests.{bucket} has no "
                             "info.timings.targeted_start", file=path, column="info.timings",
                             example=str(r.get("request_id")))
        rows.append((bucket, status, r, info, t))
    burst = [t for *_, t in rows if t.get("targeted_start") is not None
             and float(t["targeted_start"]) < EPOCH_S_MIN]
    start = _first_epoch([t.get("targeted_start") for *_, t in rows]
                         + [t.get("request_start") for *_, t in rows])
    cols = new_columns("max_output_tokens")
    for bucket, status, r, info, t in rows:
        targeted = t.get("targeted_start")
        sent = t.get("request_start")
        if targeted is None or float(targeted) < EPOCH_S_MIN:
            # start-up burst: a relative number instead of an epoch time; the request was due at
            # once, so the actual dispatch is the best intended time we have
            targeted = t.get("scheduled_at") or t.get("dequeued") or sent
        st = status or status_from_error(info.get("error") or r.get("error"),
                                         cancelled=info.get("status") == "cancelled")
        add_row(cols,
                request_id=str(r.get("request_id") or info.get("request_id")),
                scheduled_ns=s_to_ns(targeted, start), sent_ns=s_to_ns(sent, start),
                first_token_ns=s_to_ns(t.get("first_token_iteration"), start),
                last_token_ns=s_to_ns(t.get("last_token_iteration"), start),
                input_tokens=to_int(r.get("prompt_tokens")),
                output_tokens=to_int(r.get("output_tokens")),
                max_output_tokens=requested_output_tokens(r.get("request_args")),
                status=st, itl_ns=None, finish_reason=None)
    run = RunData(run_id=_run_label(kind, rate, conc, index), source=path, columns=cols,
                  nominal_rps=rate if conc is None else None, concurrency=conc, arrival=arrival,
                  duration_s=_float(bench.get("duration")),
                  extra={"guidellm_strategy": kind, "guidellm_format_version": version},
                  clock_epoch_ns=_epoch_ns(start))
    sm = bench.get("scheduler_metrics") or {}
    measure_start = _float(sm.get("measure_start_time"))
    first_sched = min((x for x in cols["scheduled_ns"] if x is not None), default=None)
    warm_cfg = _float(bench.get("warmup_duration")) or 0.0
    if warm_cfg > 0 and measure_start is not None and first_sched is not None:
        warm = (s_to_ns(measure_start, start) - first_sched) / C.NS_PER_S
        if warm > 1e-6:  # requests before GuideLLM's measured window are its warm-up
            run.warmup_s = warm
    if burst:
        run.warnings.append(
            f"GuideLLM start-up burst: {len(burst)} request(s) have targeted_start < 1e9 (a "
            "relative number, not an epoch time); they were dispatched at once, which inflates "
            "the offered rate and attainment at this rate is unreliable. Their intended start "
            "was replaced by the dispatch time; above 5 % of the run the envelope leaves the "
            "run out (GuideLLM 0.8.1's start-up race: rerun it).")
        run.extra["off_schedule_requests"] = len(burst)
    _check_sampled(run, sm.get("requests_made"), len(rows))
    workers = to_int(strategy.get("worker_count"), 0)
    if workers > 1 and kind == "poisson":
        run.warnings.append(
            f"GuideLLM ran this Poisson benchmark with {workers} worker processes; every worker "
            "uses the same seed, so arrivals are burstier than Poisson. Rerun with "
            "GUIDELLM__MAX_WORKER_PROCESSES=1 for a true Poisson schedule.")
    return run


def _bench_v1(bench: dict, index: int, path: str, version: int) -> RunData:
    args = bench.get("args") or {}
    strategy = args.get("strategy") or bench.get("strategy")
    if not isinstance(strategy, dict):
        raise StudyError(f"benchmark {index}: missing 'args.strategy' (2025 GuideLLM format)",
                         file=path, column="args.strategy")
    kind, rate, conc, arrival = _strategy(strategy)
    rows = []
    for bucket, status, r in _iter_requests(bench, path, index):
        si = r.get("scheduler_info")
        if not isinstance(si, dict) or "targeted_start_time" not in si:
            raise StudyError(f"benchmark {index}: a request in requests.{bucket} has no "
                             "scheduler_info.targeted_start_time", file=path,
                             column="scheduler_info", example=str(r.get("request_id")))
        rows.append((bucket, status, r, si))
    start = _first_epoch([si.get("targeted_start_time") for *_, si in rows]
                         + [r.get("start_time") for _, _, r, _ in rows])
    burst = sum(1 for *_, si in rows if 0 <= float(si["targeted_start_time"]) < EPOCH_S_MIN)
    cols = new_columns("max_output_tokens")
    for bucket, status, r, si in rows:
        targeted = si.get("targeted_start_time")
        sent = r.get("start_time")
        if sent is None or float(sent) < 0:
            sent = si.get("request_start") if float(si.get("request_start", -1)) > 0 else None
        if targeted is None or float(targeted) < EPOCH_S_MIN:
            targeted = si.get("scheduled_time") if float(si.get("scheduled_time", -1)) > 0 else sent
        st = status or status_from_error(r.get("error"), cancelled=bool(si.get("canceled")))
        add_row(cols,
                request_id=str(r.get("request_id")),
                scheduled_ns=s_to_ns(targeted, start), sent_ns=s_to_ns(sent, start),
                first_token_ns=s_to_ns(r.get("first_token_time"), start),
                last_token_ns=s_to_ns(r.get("last_token_time"), start),
                input_tokens=to_int(r.get("prompt_tokens")),
                output_tokens=to_int(r.get("output_tokens")),
                max_output_tokens=requested_output_tokens(r.get("request_args")),
                status=st, itl_ns=None, finish_reason=None)
    run = RunData(run_id=_run_label(kind, rate, conc, index), source=path, columns=cols,
                  nominal_rps=rate if conc is None else None, concurrency=conc, arrival=arrival,
                  extra={"guidellm_strategy": kind, "guidellm_format_version": version},
                  clock_epoch_ns=_epoch_ns(start))
    rs = bench.get("run_stats") or {}
    if rs.get("start_time") is not None and rs.get("end_time") is not None:
        run.duration_s = float(rs["end_time"]) - float(rs["start_time"])
    _check_sampled(run, rs.get("requests_made"), len(rows))
    if burst:
        run.warnings.append(f"GuideLLM start-up burst: {burst} request(s) have a targeted start "
                            "< 1e9 (relative, not epoch); offered rate and attainment unreliable; "
                            "above 5 % of the run the envelope leaves the run out")
        run.extra["off_schedule_requests"] = burst
    return run


def _check_sampled(run: RunData, made, n_listed: int) -> None:
    """GuideLLM can keep only a sample of the per-request lists (--sample-requests): say so,
    because the offered rate and attainment would then come from the sample."""
    total = to_int((made or {}).get("total"), 0) if isinstance(made, dict) else 0
    if total > n_listed:
        run.extra["guidellm_requests_made"] = total
        run.warnings.append(
            f"GuideLLM kept only {n_listed} of the {total} requests made in its per-request "
            "lists (sampled): the measured offered rate and attainment use the sample; rerun "
            "without --sample-requests for a complete import")


def _float(v) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _epoch_ns(start_s: float) -> int | None:
    """The epoch ns of the run clock's origin ``start_s`` (epoch seconds); None when the file's
    times are not epoch seconds."""
    return int(round(start_s * C.NS_PER_S)) if start_s >= EPOCH_S_MIN else None


def _first_epoch(values) -> float:
    """The run's clock origin: the smallest epoch-second value (burst values excluded)."""
    vals = [float(v) for v in values if v is not None and float(v) >= EPOCH_S_MIN]
    if not vals:
        vals = [float(v) for v in values if v is not None and float(v) >= 0]
    return min(vals) if vals else 0.0


def _workload(obj: dict) -> dict:
    """Workload facts of a report: GuideLLM version, request format / streaming, the synthetic
    data's prompt_tokens / output_tokens, tokenizer, seed (format version 2; the 2025 files name
    none of them)."""
    f: dict = {}
    meta = obj.get("metadata") or {}
    if isinstance(meta, dict) and meta.get("guidellm_version"):
        f["tool_version"] = str(meta["guidellm_version"])
    spec = ((obj.get("config") or {}).get("spec") or {})
    backend = spec.get("backend") or {}
    if backend.get("request_format"):
        f["endpoint"] = endpoint_kind(backend["request_format"])
    if isinstance(backend.get("stream"), bool):
        f["streaming"] = backend["stream"]
    data = [d for d in (spec.get("data") or []) if isinstance(d, dict)]
    if data:
        asked = {k2: to_int(data[0][k1]) for k1, k2 in (("prompt_tokens", "input_tokens"),
                                                         ("output_tokens", "output_tokens"))
                 if data[0].get(k1) is not None}
        if asked:
            f["asked"] = asked
    tok = (spec.get("tokenizer") or {}).get("model")
    if tok:
        f["tokenizer"] = str(tok)
    seed = (spec.get("seed") or {}).get("value") if isinstance(spec.get("seed"), dict) else None
    if seed is not None:
        f["seed"] = seed
    return f


def _bench_facts(bench: dict, facts: dict) -> dict:
    """Per benchmark: ignore_eos in the request bodies (answers forced to the asked length: true
    when every body has it, false when the bodies are kept without it), the
    endpoint from the 2025 request_type, the strategy's seed when the report has none."""
    import json as _json

    f: dict = {}
    reqs = bench.get("requests") or {}
    bodies = []
    for bucket in ("successful", "errored", "incomplete"):
        for r in reqs.get(bucket) or []:
            body = r.get("request_args")
            try:
                body = _json.loads(body) if isinstance(body, str) else body
            except ValueError:
                body = None
            body = (body or {}).get("body", body) if isinstance(body, dict) else None
            if isinstance(body, dict):
                bodies.append(body.get("ignore_eos") is True)
            if "endpoint" not in facts and "endpoint" not in f and r.get("request_type"):
                f["endpoint"] = endpoint_kind(r["request_type"])
    if bodies:  # the bodies sent are kept whole: without ignore_eos, answers may stop early
        f["output_fixed"] = all(bodies)
    strat = ((bench.get("config") or {}).get("strategy")
             or (bench.get("args") or {}).get("strategy") or {})
    if "seed" not in facts and isinstance(strat, dict) and strat.get("random_seed") is not None:
        f["seed"] = strat["random_seed"]
    return f
