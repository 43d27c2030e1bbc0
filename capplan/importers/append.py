"""Append an import to an existing study (``capplan import TOOL PATH... --into STUDY``).

Pure core: ``merge_into(manifest, events, result, ...)`` checks that the new runs offer the same
workload as the study (prompt lengths, asked output length, arrival process, endpoint, load
model), refuses a source file the study already holds, renames run ids that clash (``-2``, ``-3``,
…), and returns the merged manifest — its ``workload`` recomputed from every event — and the new
events. ``append_import`` reads the study, calls it and writes at the edge: a new study
directory (the old event files carried over unchanged, the new runs in one more file) swapped in
for the old one by ``write_study``, so a failure leaves the study as it was.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from .. import contract as C
from ..errors import Problem, StudyError
from ..io import write_study
from .common import FACT_KEYS, ImportResult, summarize_workload, unique_id

#: prompt lengths match when the means are within 5 % and the p90s within 10 %
MEAN_TOL = 0.05
P90_TOL = 0.10
#: workload columns read from the study's events
WORKLOAD_COLUMNS = ("run_id", "input_tokens", "output_tokens", "max_output_tokens", "status")


@dataclass(frozen=True)
class Appended:
    """The outcome of an append: the merged manifest, the new runs' events (ids as written),
    warnings, and {new run id as imported: id in the study} for every renamed run."""

    manifest: dict
    events: pa.Table
    warnings: tuple[str, ...]
    renamed: dict


# ------------------------------------------------------------------------------------------
# comparing workloads
# ------------------------------------------------------------------------------------------

def _fixed(s: dict) -> bool:
    return s.get("min") == s.get("max")


def _describe(s: dict) -> str:
    if _fixed(s):
        return f"{s['p50']:g} (fixed)"
    return f"{s['mean']:g} (mean, p90 {s['p90']:g})"


def lengths_differ(a: dict | None, b: dict | None) -> bool:
    """Two length summaries describe different offered lengths: fixed values that are not
    equal, else means more than 5 % or p90s more than 10 % apart. Unknown (None) never differs."""
    if not a or not b:
        return False
    if _fixed(a) and _fixed(b):
        return float(a["p50"]) != float(b["p50"])

    def off(x, y, tol):
        x, y = float(x), float(y)
        return abs(x - y) > tol * max(abs(x), abs(y), 1e-9)

    return off(a["mean"], b["mean"], MEAN_TOL) or off(a["p90"], b["p90"], P90_TOL)


def _asked_output(w: dict) -> dict | None:
    """The asked output length of a workload as a length summary (from the events' asked
    lengths, else the tool's configured length), None when unknown."""
    out = w.get("output_tokens") or {}
    if out.get("from") == "asked":
        return out
    v = (w.get("asked") or {}).get("output_tokens")
    if v is None:
        return None
    return {"mean": v, "sd": 0.0, "min": v, "p50": v, "p90": v, "p99": v, "max": v}


def workload_differences(study: dict, study_load_model: str, run_id: str, run: dict,
                         run_load_model: str) -> list[tuple[str, str]]:
    """[(field, what differs)] between the study's workload and one new run's workload."""
    out = []
    a, b = study.get("input_tokens"), run.get("input_tokens")
    if lengths_differ(a, b):
        out.append(("workload.input_tokens",
                    f"prompt lengths: study {_describe(a)}, new run {run_id} {_describe(b)}"))
    a, b = _asked_output(study), _asked_output(run)
    if lengths_differ(a, b):
        out.append(("workload.output_tokens",
                    f"asked output lengths: study {_describe(a)}, new run {run_id} {_describe(b)}"))
    for key, what in (("arrival", "arrival process"), ("endpoint", "endpoint")):
        x, y = study.get(key), run.get(key)
        if x and y and x not in ("unknown", "mixed") and y not in ("unknown", "mixed") and x != y:
            out.append((f"workload.{key}", f"{what}: study {x}, new run {run_id} {y}"))
    if study_load_model != run_load_model:
        out.append(("load_model", f"load model: study {study_load_model} loop, new run {run_id} "
                                  f"{run_load_model} loop"))
    return out


# ------------------------------------------------------------------------------------------
# the pure merge
# ------------------------------------------------------------------------------------------

def _same_file(a: str, b: str) -> bool:
    """The same source file (the same inode when both exist, else the same resolved path)."""
    try:
        if Path(a).exists() and Path(b).exists():
            return os.path.samefile(a, b)
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return a == b


def _to_open(entry: dict, where: str) -> dict:
    """A closed-loop run entry placed on an open-loop study's rate axis at its measured rate."""
    if "offered_rps" in entry:
        return entry
    rate = entry.get("measured_rps")
    if rate is None:
        raise StudyError(f"run {entry.get('run_id')} ({where}) is closed loop and has no "
                         "measured_rps to place it on the open-loop rate axis",
                         fix="import it into its own study (--out)")
    return {**entry, "offered_rps": float(rate), "offered_rps_from": "measured"}


def merge_into(manifest: dict, events: pa.Table, result: ImportResult, *, study: str = "",
               allow_workload_change: bool = False, today: str | None = None) -> Appended:
    """Merge ``result`` into a study given as its manifest mapping and its events (at least the
    ``WORKLOAD_COLUMNS``). Pure: nothing is read or written."""
    where = str(Path(study) / C.MANIFEST_NAME) if study else C.MANIFEST_NAME
    old_runs = list(manifest.get("runs") or [])
    new_runs = [dict(r) for r in result.manifest["runs"]]
    # 1. the same source file twice would count its requests twice
    for r in new_runs:
        for o in old_runs:
            if r.get("source") and o.get("source") and _same_file(r["source"], o["source"]):
                raise StudyError(
                    f"the study already holds {r['source']} (run {o['run_id']}); importing it "
                    "again would count its requests twice", file=where,
                    example=f"run_id: {o['run_id']}, source: {o['source']}",
                    fix="leave that file out, or import into a new study with --out")
    # 2. the offered workload must match
    swl = dict(manifest.get("workload") or {})
    if "tool" not in swl and manifest.get("source_tool"):
        swl["tool"] = manifest["source_tool"]
    s_lm, n_lm = str(manifest.get("load_model", "open")), str(result.manifest["load_model"])
    diffs = []
    for r in new_runs:
        diffs += workload_differences(swl, s_lm, r["run_id"], result.run_workloads.get(r["run_id"], {}),
                                      n_lm)
    warnings = list(result.warnings)
    if diffs and not allow_workload_change:
        name = manifest.get("name", study)
        raise StudyError(problems=[Problem(
            f"the new runs offer a different workload than study {name!r}: {text}", file=where,
            field=fld, example=text,
            fix="import them into their own study (--out), or pass --allow-workload-change if "
                "the difference is intended (the study's workload then mixes them)")
            for fld, text in diffs])
    warnings += [f"workload change allowed: {text}" for _, text in diffs]
    # 3. run ids unique across the study
    taken = {str(o["run_id"]) for o in old_runs}
    renamed = {}
    for r in new_runs:
        rid = unique_id(r["run_id"], taken)
        if rid != r["run_id"]:
            renamed[r["run_id"]] = rid
            warnings.append(f"run id {r['run_id']} is taken in the study: the new run is {rid}")
            r["run_id"] = rid
        taken.add(rid)
    new_events = result.events
    if renamed:
        ids = [renamed.get(x, x) for x in new_events["run_id"].to_pylist()]
        new_events = new_events.set_column(new_events.schema.get_field_index("run_id"), "run_id",
                                           pa.array(ids, pa.string()))
    # 4. one load model: closed runs join an open study at their measured rate
    load_model = s_lm
    if s_lm != n_lm:
        load_model = C.LoadModel.OPEN.value
        if s_lm == C.LoadModel.CLOSED.value:
            old_runs = [_to_open(o, "in the study") for o in old_runs]
        else:
            new_runs = [_to_open(r, "new") for r in new_runs]
    # 5. the workload: recomputed from every event, the tools' facts combined
    facts_old = {k: swl[k] for k in FACT_KEYS if k in swl}
    facts_old.update(asked_levels(old_runs))  # a study imported before the levels were kept
    facts_new = {k: result.manifest["workload"][k] for k in FACT_KEYS
                 if k in result.manifest["workload"]}
    cols = [c for c in WORKLOAD_COLUMNS if c in events.column_names]
    both = pa.concat_tables([events.select(cols),
                             new_events.select([c for c in WORKLOAD_COLUMNS
                                                if c in new_events.column_names])],
                            promote_options="default")
    workload = summarize_workload(both, [facts_old, facts_new], keep=swl)
    merged = dict(manifest)
    merged["workload"] = workload
    merged["load_model"] = load_model
    merged["runs"] = old_runs + new_runs
    if result.manifest.get("timestamps") == "none":
        merged["timestamps"] = "none"
    history = list(merged.get("runs_added") or [])
    history.append({"date": today or _dt.date.today().isoformat(), "tool": result.tool,
                    "runs": [r["run_id"] for r in new_runs]})
    merged["runs_added"] = history
    return Appended(manifest=merged, events=new_events, warnings=tuple(warnings), renamed=renamed)


def asked_levels(runs: list[dict]) -> dict:
    """{asked_rps, asked_concurrency}: the levels the study's runs say the tool was asked for
    (``nominal_rps``, ``concurrency``), as ``summarize_workload`` combines them."""
    out = {key: [r[field] for r in runs if r.get(field) is not None]
           for key, field in (("asked_rps", "nominal_rps"), ("asked_concurrency", "concurrency"))}
    return {k: v for k, v in out.items() if v}


# ------------------------------------------------------------------------------------------
# the edge
# ------------------------------------------------------------------------------------------

def read_study_for_append(study_dir: str | os.PathLike) -> tuple[dict, pa.Table]:
    """(manifest mapping, workload columns of every event) of an existing study; a StudyError
    when it is not one."""
    from ..study import open_study

    s = open_study(study_dir)
    cols = ", ".join(WORKLOAD_COLUMNS)
    rows = s.sql(f"SELECT {cols} FROM events").fetchall()
    types = {"run_id": pa.string(), "status": pa.string()}
    events = pa.table({c: pa.array([r[i] for r in rows], types.get(c, pa.int64()))
                       for i, c in enumerate(WORKLOAD_COLUMNS)})
    return dict(s.manifest.raw), events


def append_import(result: ImportResult, study_dir: str | os.PathLike, *,
                  allow_workload_change: bool = False) -> Appended:
    """Append ``result`` (from ``import_paths``) to the study at ``study_dir`` — what
    ``capplan import ... --into STUDY`` does. The study is rewritten atomically (the old event
    files, resources and timeline carried over; the new runs in one more events file)."""
    dest = Path(study_dir).expanduser()
    if not (dest / C.MANIFEST_NAME).is_file():
        raise StudyError("--into names no capplan study (no study.yaml there)", file=str(dest),
                         fix="create the study first: capplan import TOOL PATH... --out STUDY")
    manifest, events = read_study_for_append(dest)
    out = merge_into(manifest, events, result, study=str(dest),
                     allow_workload_change=allow_workload_change)
    existing = {p.name for p in (dest / C.EVENTS_DIR).glob("*.parquet")}
    k = 2
    while f"import-{k}.parquet" in existing:
        k += 1
    write_study(dest, out.manifest, {f"import-{k}.parquet": out.events}, carry_from=dest)
    return out

