"""The serving engine's own Prometheus ``/metrics`` recorded during a sweep: read a file of
scrapes, place them on the runs' clocks (a study's ``engine_metrics/``), and the per-run KV
pressure a planner reads beside attainment — preemptions, peak KV-cache usage, peak running and
waiting requests. The client sees latency; only the engine says *why* (it ran out of KV blocks
and preempted, or queued). docs/engine-metrics.md.

Scrape files (told apart by their first non-empty line):

- **text**: a line ``# scrape at <epoch seconds>``, then that scrape's exposition text; repeat.
- **JSON lines**: one ``{"t": <epoch seconds>, "text": "<exposition text>"}`` per scrape.
- **AIPerf** ``server_metrics_export.jsonl`` (``--server-metrics-formats jsonl``): one
  ``{"timestamp_ns", "endpoint_url", "metrics": {family: [{"labels", "value"}]}}`` per scrape.

The exposition text is parsed by prometheus_client. Counters and gauges are kept (a counter
under its family name, ``_total`` removed, as AIPerf names it too); histograms and summaries
are left out and counted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from . import contract as C
from .errors import StudyError

FORMAT_HELP = ("a file of Prometheus scrapes: '# scrape at <epoch seconds>' lines each followed "
               "by the /metrics text, JSON lines {\"t\": <epoch s>, \"text\": \"...\"}, or "
               "AIPerf's server_metrics_export.jsonl (docs/engine-metrics.md)")
SCRAPE_MARK = "# scrape at"

#: what each engine calls the signals capplan reads (family names, ``_total`` removed).
#: preemptions: a counter (its increase over the run's steady window); the others gauges.
SIGNALS: dict[str, tuple[str, ...]] = {
    "preemptions": ("vllm:num_preemptions",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                 "llamacpp:kv_cache_usage_ratio"),
    "running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
    "waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
}

#: the per-run columns ``pressure`` returns (beside run_id)
PRESSURE_COLUMNS = ("engine_scrapes", "preemptions", "preemptions_per_1k", "kv_usage_peak",
                    "running_peak", "waiting_peak", "engine_note")


@dataclass(frozen=True)
class Scrape:
    """One scrape: its wall-clock time, the line of the file it starts on, and its counter and
    gauge samples as (metric, labels, kind, value)."""

    t_epoch_ns: int
    line: int
    samples: tuple[tuple[str, str, str, float], ...]
    skipped: int = 0  # histogram / summary / NaN samples left out


@dataclass(frozen=True)
class ScrapeFile:
    path: str
    format: str  # text | jsonl | aiperf
    scrapes: tuple[Scrape, ...]

    @property
    def skipped(self) -> int:
        return sum(s.skipped for s in self.scrapes)


# --------------------------------------------------------------------------------------------
# reading scrape files
# --------------------------------------------------------------------------------------------

def _bad(path, line: int, message: str, example: str = "") -> StudyError:
    return StudyError(f"line {line}: {message}", file=str(path), example=example[:120] or None,
                      fix="record the engine's /metrics as " + FORMAT_HELP, code="engine_metrics")


def _labels(labels: dict | None) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted((labels or {}).items()))


def _family_name(name: str) -> str:
    return name[:-len("_total")] if name.endswith("_total") else name


def parse_exposition(text: str, *, path, line: int) -> tuple[tuple, int]:
    """Counter and gauge samples of one scrape's exposition text, and how many samples were
    left out (histograms, summaries, NaN). A line prometheus_client cannot parse is an error
    naming its line in the file (``line`` is where the text starts)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        bad, at = _first_bad_line(text)
        raise _bad(path, line + at, f"not Prometheus text format ({exc})", bad) from None
    out, skipped = [], 0
    for fam in families:
        kind = {"counter": "counter", "gauge": "gauge", "unknown": "untyped",
                "untyped": "untyped"}.get(fam.type)
        if kind is None or fam.name.endswith("_created"):
            skipped += len(fam.samples)
            continue
        for s in fam.samples:
            if s.name.endswith("_created") or not math.isfinite(float(s.value)):
                skipped += 1
                continue
            name = fam.name if kind == "gauge" else _family_name(fam.name)
            out.append((name, _labels(s.labels), kind, float(s.value)))
    return tuple(out), skipped


def _first_bad_line(text: str) -> tuple[str, int]:
    """The first sample line prometheus_client rejects on its own, and its 0-based offset."""
    from prometheus_client.parser import text_string_to_metric_families

    for i, ln in enumerate(text.splitlines()):
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        try:
            list(text_string_to_metric_families(ln + "\n"))
        except (ValueError, TypeError, IndexError):
            return ln, i
    return "", 0


def _epoch_ns(value, path, line: int, what: str, *, scale: int) -> int:
    """Epoch seconds (``scale`` 10⁹) or ns (1) → int ns, exact for decimal text (no float
    rounding of a 10-digit epoch)."""
    try:
        ns = Decimal(str(value)) * scale
    except (InvalidOperation, ValueError):
        raise _bad(path, line, f"{what} is not a number ({value!r})") from None
    if not ns.is_finite() or ns < Decimal(10) ** 18:  # before 2001-09: not an epoch time
        raise _bad(path, line, f"{what} {value!r} is not a wall-clock (epoch) time",
                   "# scrape at 1796167537.605")
    return int(ns.to_integral_value())


def epoch_seconds_ns(text: str) -> int:
    """Epoch seconds written as text ("1796167537.605") → int ns, exactly; ValueError when it
    is not a number or not a wall-clock time."""
    try:
        return _epoch_ns(text, "", 0, "time", scale=C.NS_PER_S)
    except StudyError as exc:
        raise ValueError(str(exc)) from None


def read_scrapes(path: str | Path) -> ScrapeFile:
    """Every scrape of a recorded file, in file order (see the module docstring for the
    formats). Errors name the file and line, exit 2."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StudyError("engine metrics file not found", file=str(p), fix="check the path",
                         code="engine_metrics") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise StudyError(f"cannot read the file as UTF-8 text ({exc.__class__.__name__})",
                         file=str(p), fix="pass " + FORMAT_HELP, code="engine_metrics") from None
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        raise StudyError("the file is empty; expected " + FORMAT_HELP, file=str(p),
                         code="engine_metrics")
    if lines[first].lstrip().startswith("{"):
        return _read_jsonl(p, lines)
    if not lines[first].startswith(SCRAPE_MARK):
        raise _bad(p, first + 1, f"a scrape file starts with '{SCRAPE_MARK} <epoch seconds>'",
                   lines[first])
    marks = [i for i, ln in enumerate(lines) if ln.startswith(SCRAPE_MARK)]
    scrapes = []
    for k, i in enumerate(marks):
        words = lines[i][len(SCRAPE_MARK):].split()
        t = _epoch_ns(words[0] if words else None, p, i + 1, "the scrape time", scale=C.NS_PER_S)
        end = marks[k + 1] if k + 1 < len(marks) else len(lines)
        samples, skipped = parse_exposition("\n".join(lines[i + 1:end]) + "\n", path=p, line=i + 2)
        scrapes.append(Scrape(t, i + 1, samples, skipped))
    return ScrapeFile(str(p), "text", tuple(scrapes))


def _read_jsonl(p: Path, lines: list[str]) -> ScrapeFile:
    scrapes, fmt = [], None
    for i, ln in enumerate(lines, 1):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln, parse_float=Decimal)
        except json.JSONDecodeError as exc:
            raise _bad(p, i, f"invalid JSON ({exc.msg})", ln) from None
        if not isinstance(obj, dict):
            raise _bad(p, i, "not a JSON object", ln)
        if "text" in obj and "t" in obj:
            fmt = fmt or "jsonl"
            t = _epoch_ns(obj["t"], p, i, "'t'", scale=C.NS_PER_S)
            if not isinstance(obj["text"], str):
                raise _bad(p, i, "'text' is not a string", ln)
            samples, skipped = parse_exposition(obj["text"], path=p, line=i)
        elif "timestamp_ns" in obj and isinstance(obj.get("metrics"), dict):
            fmt = fmt or "aiperf"
            t = _epoch_ns(obj["timestamp_ns"], p, i, "'timestamp_ns'", scale=1)
            samples, skipped = _aiperf_samples(obj["metrics"], p, i)
        else:
            raise _bad(p, i, "a scrape record has 't' and 'text' (or AIPerf's 'timestamp_ns' and "
                             "'metrics')", ln)
        scrapes.append(Scrape(t, i, samples, skipped))
    return ScrapeFile(str(p), fmt or "jsonl", tuple(scrapes))


def _aiperf_samples(metrics: dict, p: Path, line: int) -> tuple[tuple, int]:
    """AIPerf keeps no metric types in its JSON lines: a sample with ``value`` is a counter
    when its family is a known counter (``SIGNALS['preemptions']``) or AIPerf stripped a
    ``_total`` (it names families as prometheus_client does), else untyped; histogram samples
    (``buckets``) are left out."""
    counters = set(SIGNALS["preemptions"])
    out, skipped = [], 0
    for fam, samples in metrics.items():
        if not isinstance(samples, list):
            raise _bad(p, line, f"metrics[{fam!r}] is not a list of samples")
        for s in samples:
            if not isinstance(s, dict) or s.get("value") is None:
                skipped += 1
                continue
            try:
                v = float(s["value"])
            except (TypeError, ValueError):
                raise _bad(p, line, f"metrics[{fam!r}] value {s['value']!r} is not a number") from None
            if not math.isfinite(v):
                skipped += 1
                continue
            name = _family_name(str(fam))
            out.append((name, _labels(s.get("labels")), "counter" if name in counters else "untyped", v))
    return tuple(out), skipped


# --------------------------------------------------------------------------------------------
# placing scrapes on the runs' clocks
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placed:
    """Scrapes placed on runs: the ``engine_metrics/`` table, and what was left out."""

    table: pa.Table
    scrapes_by_run: dict
    outside: int  # scrapes in no run's span
    skipped_samples: int


def place(files: list[ScrapeFile], spans: dict[str, tuple[int, int]]) -> Placed:
    """Each scrape goes to the run whose span holds it: ``spans`` = {run_id: (epoch ns of the
    run clock's 0, the run's last stamp in ns on its clock)}; its time becomes run-clock ns.
    A scrape in no run's span (between runs, before, after) is left out and counted."""
    cols: dict[str, list] = {c.name: [] for c in C.ENGINE_METRIC_COLUMNS}
    by_run: dict[str, int] = {rid: 0 for rid in spans}
    outside = 0
    for f in files:
        for s in f.scrapes:
            hit = [rid for rid, (t0, end) in spans.items() if 0 <= s.t_epoch_ns - t0 <= end]
            if not hit:
                outside += 1
                continue
            rid = hit[0]
            by_run[rid] += 1
            t = s.t_epoch_ns - spans[rid][0]
            for metric, labels, kind, value in s.samples:
                for k, v in (("run_id", rid), ("t_ns", t), ("metric", metric), ("labels", labels),
                             ("kind", kind), ("value", value), ("source", Path(f.path).name)):
                    cols[k].append(v)
    table = pa.Table.from_pydict(cols, schema=C.ENGINE_METRIC_SCHEMA)
    return Placed(table, by_run, outside, sum(f.skipped for f in files))


def run_spans(study, epoch_start_ns: dict[str, int] | None = None) -> dict[str, tuple[int, int]]:
    """{run_id: (epoch ns of the run clock's 0, last stamp ns)} for every run of a study: the
    clock zero from ``epoch_start_ns`` (given) or the manifest's ``epoch_start_ns`` (importers
    write it when the tool's clock was wall-clock). A run with neither is an error naming it."""
    given = dict(epoch_start_ns or {})
    unknown = sorted(set(given) - set(study.manifest.run_ids))
    if unknown:
        raise StudyError(f"--run-start names run(s) not in study.yaml: {', '.join(unknown)}",
                         file=str(study.root / C.MANIFEST_NAME), column="run_id",
                         fix="runs: " + ", ".join(study.manifest.run_ids), code="engine_metrics")
    starts = {r.run_id: given.get(r.run_id, r.epoch_start_ns) for r in study.manifest.runs}
    missing = [rid for rid, v in starts.items() if v is None]
    if missing:
        raise StudyError(
            f"{len(missing)} of {len(starts)} runs have no epoch_start_ns in study.yaml "
            f"({', '.join(missing[:6])}{', …' if len(missing) > 6 else ''}): the scrapes' "
            "wall-clock times cannot be placed on their clocks", file=str(study.root / C.MANIFEST_NAME),
            column="runs[].epoch_start_ns", code="engine_metrics",
            fix="give each run's wall-clock start: --run-start RUN=<epoch seconds of its first "
                "scheduled request> (AIPerf, GenAI-Perf and GuideLLM imports record it)")
    ends = dict(study.sql(
        f"SELECT run_id, max(greatest(scheduled_ns, coalesce(sent_ns, 0), "
        f"coalesce(first_token_ns, 0), coalesce(last_token_ns, 0))) FROM {study.events_view} "
        "GROUP BY run_id").fetchall())
    return {rid: (int(t0), int(ends.get(rid) or 0)) for rid, t0 in starts.items()}


def write(study_root: str | Path, placed: Placed, name: str) -> Path:
    """Write the placed scrapes to ``engine_metrics/<name>.parquet`` (atomically; the same name
    again replaces it)."""
    import pyarrow.parquet as pq

    from .io import atomic_path

    dest = Path(study_root) / C.ENGINE_METRICS_DIR / f"{name}.parquet"
    with atomic_path(dest) as tmp:
        pq.write_table(placed.table, tmp, compression="zstd")
    return dest


def read(study_root: str | Path) -> pd.DataFrame | None:
    """The study's engine metrics (every ``engine_metrics/*.parquet``), or None when it has
    none. A file without the contract's columns is an error naming it."""
    import pyarrow.parquet as pq

    folder = Path(study_root) / C.ENGINE_METRICS_DIR
    files = sorted(folder.rglob("*.parquet")) if folder.is_dir() else []
    if not files:
        return None
    parts = []
    for f in files:
        try:
            t = pq.read_table(f)
        except (OSError, pa.ArrowException) as exc:
            raise StudyError(f"not readable parquet ({exc.__class__.__name__})", file=str(f),
                             fix="re-import it: capplan telemetry engine FILE --into STUDY",
                             code="engine_metrics") from None
        lack = [c.name for c in C.ENGINE_METRIC_COLUMNS if c.required and c.name not in t.column_names]
        if lack:
            raise StudyError(f"missing column(s) {', '.join(lack)}", file=str(f), column=lack[0],
                             fix="re-import it: capplan telemetry engine FILE --into STUDY",
                             code="engine_metrics")
        df = t.select([c.name for c in C.ENGINE_METRIC_COLUMNS if c.name in t.column_names]).to_pandas()
        df["source"] = (df["source"].fillna("") if "source" in df else "") + f"@{f.name}"
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


# --------------------------------------------------------------------------------------------
# per-run KV pressure
# --------------------------------------------------------------------------------------------

def counter_increase(values) -> float:
    """A counter's increase over successive scrapes, Prometheus ``increase`` without
    extrapolation: Σ (vᵢ − vᵢ₋₁), and where the value drops (the engine restarted and its
    counter began again from 0) the new value vᵢ itself."""
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return float("nan")
    d = np.diff(v)
    return float(np.where(d >= 0, d, v[1:]).sum())


def pressure(metrics: pd.DataFrame | None, windows: dict[str, tuple[int, int]],
             n_requests: dict[str, int]) -> pd.DataFrame:
    """Per run, from the scrapes taken in its steady window ``windows[run] = (start_ns, end_ns)``
    on the run's clock: the preemption counter's increase (summed over label sets — several
    engines or models — and over scrape files, each its own endpoint), per 1,000 requests of
    ``n_requests``; peak KV-cache usage (0–1, the fullest label set of any scrape); peak running
    and waiting requests (summed over the label sets of one scrape, the highest scrape of any
    file). What a run lacks is NaN with ``engine_note`` saying why."""
    rows = []
    for rid, (lo, hi) in windows.items():
        row = {"run_id": rid, "engine_scrapes": 0, "preemptions": float("nan"),
               "preemptions_per_1k": float("nan"), "kv_usage_peak": float("nan"),
               "running_peak": float("nan"), "waiting_peak": float("nan")}
        if metrics is None:
            row["engine_note"] = "not recorded (no engine_metrics/ in the study)"
            rows.append(row)
            continue
        m = metrics[(metrics["run_id"] == rid) & (metrics["t_ns"] >= lo) & (metrics["t_ns"] <= hi)]
        row["engine_scrapes"] = int(m["t_ns"].nunique())
        notes = []
        if m.empty:
            row["engine_note"] = "not recorded (no scrape in the steady window)"
            rows.append(row)
            continue
        pre = _signal(m, "preemptions")
        if pre.empty:
            notes.append("preemptions not recorded (no " + "/".join(SIGNALS["preemptions"])
                         + " counter)")
        elif pre["t_ns"].nunique() < 2:
            notes.append("preemptions not recorded (one scrape in the steady window)")
        else:
            row["preemptions"] = float(sum(counter_increase(g.sort_values("t_ns")["value"])
                                           for _, g in pre.groupby(["source", "labels"])
                                           if len(g) >= 2))
            n = n_requests.get(rid) or 0
            row["preemptions_per_1k"] = 1000.0 * row["preemptions"] / n if n else float("nan")
        for key, col, how in (("kv_usage", "kv_usage_peak", "max"),
                              ("running", "running_peak", "sum"), ("waiting", "waiting_peak", "sum")):
            g = _signal(m, key)
            if g.empty:
                notes.append(f"{key} not recorded")
            else:
                row[col] = float(g.groupby(["source", "t_ns"])["value"].agg(how).max())
        row["engine_note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows, columns=["run_id", *PRESSURE_COLUMNS])


def _signal(m: pd.DataFrame, key: str) -> pd.DataFrame:
    """The samples of the first of ``SIGNALS[key]``'s names the scrapes hold (an engine that
    exports both the old and the new name is read once)."""
    for name in SIGNALS[key]:
        g = m[m["metric"] == name]
        if not g.empty:
            return g
    return m.iloc[0:0]
