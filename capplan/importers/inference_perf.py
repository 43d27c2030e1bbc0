"""inference-perf (0.7) ``per_request_lifecycle_metrics.json`` (``report.request_lifecycle.
per_request: true``) with its ``stage_<N>_lifecycle_metrics.json`` files.

Clock: perf-counter float seconds with an arbitrary origin. The per-request export drops the
scheduled time and the stage id, so: ``start_time`` → both ``scheduled_ns`` and ``sent_ns`` (the
stage files' mean ``schedule_delay`` is kept in the manifest); ``chunk_times[0]`` → first token,
``chunk_times[-1]`` → last token, their gaps → ``itl_ns``; ``end_time`` is the request end.
Stages are recovered by sorting requests by start time and cutting them into consecutive groups of
each stage file's ``load_summary.count`` (stages run one after another); without stage files they
are cut at idle gaps, with a warning. Requested rate = ``load_summary.requested_rate``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import contract as C
from ..errors import StudyError
from .common import (RunData, add_row, endpoint_kind, gaps_ns, load_json, new_columns, parse_rate,
                     requested_output_tokens, s_to_ns, status_from_error, to_int)

TOOL = "inference_perf"
PER_REQUEST = "per_request_lifecycle_metrics.json"
EXPECTED = "inference-perf per-request lifecycle metrics (a JSON array of {start_time, " \
           "end_time, request, response, info, error})"
_STAGE_RE = re.compile(r"stage_(\d+)_lifecycle_metrics\.json(\.gz)?$")
#: without stage files, an idle gap this many times the median inter-arrival starts a new stage
GAP_FACTOR = 20.0


def sniff(obj) -> bool:
    return isinstance(obj, list) and bool(obj) and isinstance(obj[0], dict) and \
        {"start_time", "end_time", "info"} <= set(obj[0])


def find_file(path: Path) -> Path:
    if path.is_file():
        return path
    for name in (PER_REQUEST, PER_REQUEST + ".gz"):
        if (path / name).is_file():
            return path / name
    hits = sorted(path.rglob(PER_REQUEST + "*"))
    if not hits:
        raise StudyError(f"no {PER_REQUEST} found; expected an inference-perf report folder",
                         file=str(path), fix="set report.request_lifecycle.per_request: true "
                                             "in the inference-perf config and rerun")
    return hits[0]


def parse(paths: list[str]) -> list[RunData]:
    runs = []
    for p in paths:
        runs.extend(_parse_file(find_file(Path(p))))
    return runs


def _stages(folder: Path) -> list[dict]:
    out = []
    for f in folder.iterdir():
        m = _STAGE_RE.match(f.name)
        if m:
            d = load_json(f, "an inference-perf stage summary with 'load_summary'")
            ls = d.get("load_summary") if isinstance(d, dict) else None
            if not isinstance(ls, dict) or "count" not in ls:
                raise StudyError("stage summary has no load_summary.count", file=str(f),
                                 column="load_summary")
            out.append({"stage": int(m.group(1)), "count": int(ls["count"]),
                        "requested_rate": parse_rate(ls.get("requested_rate")),
                        "achieved_rate": ls.get("achieved_rate"),
                        "schedule_delay_mean_s": (ls.get("schedule_delay") or {}).get("mean"),
                        "concurrency": to_int(ls.get("concurrency"), 0) or None,
                        "duration_s": d.get("benchmark_time_seconds"), "file": str(f)})
    return sorted(out, key=lambda s: s["stage"])


def _concurrency_stages(folder: Path) -> dict[int, tuple[int, int | None]]:
    """{stage: (concurrency_level, num_requests)} from the run's config.yaml (concurrent type)."""
    load = _config(folder).get("load") or {}
    if str(load.get("type", "")).lower() != "concurrent":
        return {}
    return {i: (to_int(s.get("concurrency_level"), 0), to_int(s.get("num_requests"), 0) or None)
            for i, s in enumerate(load.get("stages") or [])
            if isinstance(s, dict) and s.get("concurrency_level")}


def _split_by_gaps(starts: list[float]) -> list[int]:
    """Indices (into the sorted list) where a new stage starts, from idle gaps."""
    if len(starts) < 3:
        return [0]
    gaps = sorted(b - a for a, b in zip(starts, starts[1:]))
    med = gaps[len(gaps) // 2] or 1e-3
    return [0] + [i + 1 for i, (a, b) in enumerate(zip(starts, starts[1:]))
                  if b - a > max(GAP_FACTOR * med, 0.5)]


def _parse_file(path: Path) -> list[RunData]:
    data = load_json(path, EXPECTED)
    if not isinstance(data, list):
        raise StudyError(f"expected {EXPECTED}, got a JSON {type(data).__name__}", file=str(path))
    if not data:
        raise StudyError("the per-request list is empty: no requests were recorded",
                         file=str(path), fix="rerun inference-perf; the benchmark sent nothing")
    for i, r in enumerate(data):
        if not isinstance(r, dict) or "start_time" not in r or "end_time" not in r:
            raise StudyError(f"record {i} lacks start_time/end_time; expected {EXPECTED}",
                             file=str(path), example=str(r)[:120])
    order = sorted(range(len(data)), key=lambda i: float(data[i]["start_time"]))
    stages = _stages(path.parent)
    conc = _concurrency_stages(path.parent)
    warn = []
    if stages and sum(s["count"] for s in stages) == len(data):
        cuts, acc = [], 0
        for s in stages:
            cuts.append(acc)
            acc += s["count"]
    else:
        if stages:
            warn.append(f"stage files count {sum(s['count'] for s in stages)} requests but the "
                        f"per-request file holds {len(data)}; stages recovered from idle gaps")
        else:
            warn.append("no stage_<N>_lifecycle_metrics.json beside the per-request file: stages "
                        "recovered from idle gaps and the requested rate is unknown")
        cuts = _split_by_gaps([float(data[i]["start_time"]) for i in order])
        stages = []
    bounds = list(zip(cuts, cuts[1:] + [len(order)]))
    runs = []
    for k, (a, b) in enumerate(bounds):
        idx = order[a:b]
        origin = float(data[idx[0]]["start_time"])
        cols = new_columns("max_output_tokens")
        for i in idx:
            r = data[i]
            info = r.get("info") or {}
            rm = info.get("response_metrics") or {}
            chunks = [s_to_ns(t, origin) for t in (rm.get("chunk_times") or [])]
            err = r.get("error")
            if err:
                e = err if isinstance(err, dict) else {"error_msg": str(err)}
                status = status_from_error(f"{e.get('error_type', '')} {e.get('error_msg', '')}")
            else:
                status = C.Status.OK.value
            end = s_to_ns(r.get("end_time"), origin)
            first = chunks[0] if chunks else (end if status == C.Status.OK.value else None)
            last = chunks[-1] if chunks else (end if status == C.Status.OK.value else None)
            inp = info.get("input_tokens")
            if inp is None:
                inp = ((info.get("request_metrics") or {}).get("text") or {}).get("input_tokens")
            add_row(cols, request_id=f"{k}-{i}", scheduled_ns=s_to_ns(r["start_time"], origin),
                    sent_ns=s_to_ns(r["start_time"], origin), first_token_ns=first,
                    last_token_ns=last, input_tokens=to_int(inp),
                    output_tokens=to_int(rm.get("output_tokens")), status=status,
                    max_output_tokens=requested_output_tokens(r.get("request")),
                    itl_ns=gaps_ns(chunks), finish_reason=_finish_reason(rm))
        st = stages[k] if stages else {}
        c, planned = conc.get(st.get("stage", k), (None, None))
        c = st.get("concurrency") or c
        stage_warn = list(warn) if k == 0 else []
        if planned and len(idx) < planned:
            stage_warn.append(f"config.yaml plans {planned} requests for this stage but "
                              f"{len(idx)} were recorded")
        run = RunData(run_id=f"stage_{st.get('stage', k)}", source=str(path), columns=cols,
                      nominal_rps=None if c else st.get("requested_rate"), concurrency=c or None,
                      arrival="concurrency" if c else _arrival(path.parent),
                      duration_s=st.get("duration_s"), warnings=stage_warn,
                      extra={k2: st[k2] for k2 in ("achieved_rate", "schedule_delay_mean_s")
                             if st.get(k2) is not None})
        run.workload = _workload(path.parent)
        runs.append(run)
    return runs


def _config(folder: Path) -> dict:
    cfg = folder / "config.yaml"
    if not cfg.is_file():
        return {}
    import yaml

    try:
        d = yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        return {}
    return d if isinstance(d, dict) else {}


def _workload(folder: Path) -> dict:
    """Workload facts from the config.yaml inference-perf writes: api type / streaming, the
    random data's input / output distribution means, server.ignore_eos, tokenizer, base seed."""
    d = _config(folder)
    f: dict = {}
    api = d.get("api") or {}
    if api.get("type"):
        f["endpoint"] = endpoint_kind(api["type"])
    if isinstance(api.get("streaming"), bool):
        f["streaming"] = api["streaming"]
    data = d.get("data") or {}
    asked = {}
    for k1, k2 in (("input_distribution", "input_tokens"), ("output_distribution", "output_tokens")):
        dist = data.get(k1) or {}
        if isinstance(dist, dict) and dist.get("mean") is not None:
            v = float(dist["mean"])
            asked[k2] = int(v) if v.is_integer() else v
    if asked:
        f["asked"] = asked
    ignore_eos = (d.get("server") or {}).get("ignore_eos")
    if isinstance(ignore_eos, bool):
        f["output_fixed"] = ignore_eos
    tok = (d.get("tokenizer") or {}).get("pretrained_model_name_or_path")
    if tok:
        f["tokenizer"] = str(tok)
    seed = (d.get("load") or {}).get("base_seed")
    if seed is not None:
        f["seed"] = seed
    return f


def _arrival(folder: Path) -> str:
    cfg = folder / "config.yaml"
    if cfg.is_file():
        import yaml

        try:
            t = str(((yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}).get("load") or {})
                    .get("type", "")).lower()
        except yaml.YAMLError:
            return "unknown"
        return {"poisson": "poisson", "constant": "constant"}.get(t, "unknown")
    return "unknown"


def _finish_reason(rm: dict) -> str | None:
    chunks = rm.get("response_chunks") or []
    for c in reversed(chunks):
        try:
            obj = json.loads(c) if isinstance(c, str) else c
        except (json.JSONDecodeError, TypeError):
            continue
        for ch in (obj or {}).get("choices") or []:
            if ch.get("finish_reason"):
                return str(ch["finish_reason"])
    return None
