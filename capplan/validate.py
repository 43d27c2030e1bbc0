"""Study validation: every problem found, each with file, column, example row and a fix.

The manifest and schema checks that any open needs live in :mod:`capplan.study`
(``parse_manifest``, ``check_parquet_files``). This module sits above it and adds the
row-level and run-level checks: ``validate_study`` runs them in DuckDB and returns all
problems found; ``validate_path`` does everything for a directory (what `capplan validate`
calls), so even a study that cannot be opened gets every manifest and schema problem listed
at once; ``open_checked`` opens a study and raises on any error of either kind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from . import contract as C
from .errors import Problem, ProblemList, StudyError
from .metrics import measured_rate_rps
from .study import (Study, build_study, check_parquet_files, connect, events_select,
                    find_event_files, find_parquet, open_study, parse_manifest, reading,
                    side_table_problems, study_files, unreadable_problems)

# --------------------------------------------------------------------------------------------
# Whole-study validation
# --------------------------------------------------------------------------------------------

ROW_VIEW = "_validate_rows"
#: Columns shown in an example row (those a reader needs to find and judge it).
_EXAMPLE_COLUMNS = ("run_id", "request_id", "status", "scheduled_ns", "sent_ns", "first_token_ns",
                    "last_token_ns", "input_tokens", "output_tokens")
# scheduled_ns above this (≈ 3.2 years in ns) is a wall-clock epoch, not "ns since run start".
EPOCH_NS_THRESHOLD = 100_000_000_000_000_000
# A completed request faster than this from schedule to last token is not plausible in ns.
MIN_PLAUSIBLE_E2E_NS = 100_000  # 0.1 ms
# With no duration_s, a run (≥ 2 requests) whose whole activity spans less than this is implausible.
MIN_PLAUSIBLE_RUN_SPAN_NS = 10_000_000  # 10 ms


@dataclass(frozen=True)
class RowCheck:
    """A row-level rule: ``condition`` is SQL over the contract columns (identifiers from the
    contract only; values as ``?`` parameters in ``params``)."""

    code: str
    column: str
    condition: str
    message: str
    fix: str
    params: tuple = ()
    severity: str = "error"


def row_checks(manifest: C.Manifest, present: frozenset[str] | set[str]) -> list[RowCheck]:
    """Every per-row rule of contract v1."""
    checks: list[RowCheck] = []
    for c in C.EVENT_COLUMNS:
        if c.required and not c.nullable:
            checks.append(RowCheck(
                f"null_{c.name}", c.name, f'"{c.name}" IS NULL',
                f"required column '{c.name}' is null",
                f"every offered request needs {c.name} ({c.meaning})"
                + ("; write 0 when there are none" if c.unit == "tokens" else "")))
    checks += [
        RowCheck("unknown_status", "status",
                 "status IS NOT NULL AND NOT list_contains(?, status)",
                 "unknown status", "use one of " + ", ".join(C.STATUSES)
                 + " (a request cut off at the end of the run is 'cancelled' or 'timeout')",
                 (list(C.STATUSES),)),
        RowCheck("unknown_run", "run_id",
                 "run_id IS NOT NULL AND NOT list_contains(?, run_id)",
                 "run_id is not a run of study.yaml",
                 "add the run under 'runs:' in study.yaml or fix the run_id",
                 (list(manifest.run_ids),)),
        RowCheck("first_before_scheduled", "first_token_ns", "first_token_ns < scheduled_ns",
                 "first_token_ns is before scheduled_ns",
                 "all *_ns of a run must share one monotonic clock (ns since the run's start); "
                 "check the clock and the unit of both columns"),
        RowCheck("last_before_first", "last_token_ns", "last_token_ns < first_token_ns",
                 "last_token_ns is before first_token_ns",
                 "last_token_ns is the last token received, never before the first"),
        RowCheck("ok_without_first_token", "first_token_ns",
                 "status = 'ok' AND first_token_ns IS NULL",
                 "status is 'ok' but first_token_ns is null",
                 "an ok request received its first token: stamp it, or give the request a "
                 "failure status (error, timeout, cancelled)"),
        RowCheck("ok_without_last_token", "last_token_ns",
                 "status = 'ok' AND first_token_ns IS NOT NULL AND last_token_ns IS NULL",
                 "status is 'ok' but last_token_ns is null",
                 "stamp the last token of a completed request (equal to first_token_ns for one token)"),
    ]
    for col in ("input_tokens", "output_tokens", "computed_input_tokens", "max_output_tokens"):
        if col in present:
            checks.append(RowCheck(f"negative_{col}", col, f'"{col}" < 0',
                                   f"{col} is negative",
                                   f"{col} counts tokens: write 0 or more"))
    if "branch_depth" in present:
        checks.append(RowCheck("negative_branch_depth", "branch_depth", '"branch_depth" < 0',
                               "branch_depth is negative",
                               "number a root's steps from 0: the first calls of an agent_root "
                               "have branch_depth 0, the calls after its first tool 1, …"))
    if "computed_input_tokens" in present:
        checks.append(RowCheck("computed_above_input", "computed_input_tokens",
                               '"computed_input_tokens" > "input_tokens"',
                               "computed_input_tokens (prefill tokens computed, the prefix-cache misses) "
                               "exceeds input_tokens",
                               "write the prompt tokens the server computed for the request's first "
                               "prefill: input_tokens minus the tokens it found in its prefix cache"))
    return checks


def check_select(checks: list[RowCheck], example: str) -> tuple[list[str], list]:
    """One grouped pass over a table for every rule: per rule the count of rows that break it
    and the first such row (``example``: a struct SQL expression), with the bound parameters."""
    select, params = ["count(*) AS n_rows"], []
    for i, chk in enumerate(checks):
        select.append(f"count(*) FILTER (WHERE {chk.condition}) AS n{i}")
        select.append(f"min({example}) FILTER (WHERE {chk.condition}) AS ex{i}")
        params.extend(chk.params)
        params.extend(chk.params)
    return select, params


def _example(ex: dict | None) -> tuple[str | None, str | None]:
    """(file, 'row N: col=value, …') of an example row (row numbers count from 0)."""
    if not ex:
        return None, None
    fields = ", ".join(f"{k}={ex[k]!r}" for k in _EXAMPLE_COLUMNS if k in ex and ex[k] is not None)
    return ex.get("filename"), f"row {ex.get('file_row_number')}: {fields}"


def _example_struct(present) -> str:
    # filename and row first, so min() over the struct picks the first file, then the first row.
    cols = ["filename", "file_row_number", *[c for c in _EXAMPLE_COLUMNS]]
    return "struct_pack(" + ", ".join(f'"{c}" := "{c}"' for c in cols) + ")"


def _create_row_view(study: Study) -> None:
    """The events (every contract column, NULL-filled) plus file name and row number."""
    rel = study.con.read_parquet([str(p) for p in study.event_files], union_by_name=True,
                                 filename=True, file_row_number=True)
    rel.create_view("_validate_raw", replace=True)
    study.con.execute(f"CREATE OR REPLACE VIEW {ROW_VIEW} AS SELECT "
                      f"{events_select(set(study.present_columns))}, filename, file_row_number "
                      "FROM _validate_raw")


def _db_problem(problems: ProblemList, study: Study, exc: Exception, what: str) -> None:
    bad = unreadable_problems(study_files(study), study.con)
    problems.items.extend(bad)
    if not bad:
        problems.add(f"cannot read the events while checking {what}: {str(exc).splitlines()[0]}",
                     file=str(study.root / C.EVENTS_DIR), code="bad_parquet",
                     fix="a parquet file is corrupt or its values cannot be read; re-export it")


def validate_study(study: Study, problems: ProblemList | None = None) -> ProblemList:
    """Row-level checks of an opened study, all of them, each with a count and one example
    row (file and row number). Two grouped passes over the events in DuckDB."""
    problems = problems if problems is not None else ProblemList()
    try:
        _create_row_view(study)
    except duckdb.Error as exc:
        _db_problem(problems, study, exc, "the file list")
        return problems
    checks = row_checks(study.manifest, study.present_columns)
    select, params = check_select(checks, _example_struct(study.present_columns))
    try:
        cur = study.sql(f"SELECT {', '.join(select)} FROM {ROW_VIEW}", params)
        names = [d[0] for d in cur.description]
        row = dict(zip(names, cur.fetchone()))
    except duckdb.Error as exc:
        _db_problem(problems, study, exc, "row values")
        return problems
    n_rows = row["n_rows"]
    for i, chk in enumerate(checks):
        n = row[f"n{i}"]
        if n:
            file, example = _example(row[f"ex{i}"])
            problems.items.append(Problem(
                f"{chk.message} in {n:,} of {n_rows:,} rows", file=file, column=chk.column,
                example=example, fix=chk.fix, severity=chk.severity, code=chk.code))
    _run_checks(study, problems)
    validate_timeline(study, problems)
    return problems


def _run_checks(study: Study, problems: ProblemList) -> None:
    """Per-run rules: runs without events, duplicate request ids, clock unit, offered rate."""
    manifest_file = str(study.root / C.MANIFEST_NAME)
    try:
        per_run = study.sql(f"""
            SELECT run_id, count(*) AS n, count(DISTINCT request_id) AS n_ids,
                   min(scheduled_ns) AS first_ns, max(scheduled_ns) AS last_ns,
                   max(greatest(scheduled_ns, sent_ns, first_token_ns, last_token_ns)) AS end_ns,
                   quantile_disc(last_token_ns - scheduled_ns, 0.5)
                       FILTER (WHERE status = 'ok' AND last_token_ns IS NOT NULL) AS e2e_median_ns,
                   min(filename) AS file
            FROM {ROW_VIEW} WHERE run_id IS NOT NULL AND request_id IS NOT NULL
                AND scheduled_ns IS NOT NULL
            GROUP BY run_id ORDER BY run_id
        """).fetchall()
    except duckdb.Error as exc:
        _db_problem(problems, study, exc, "per-run statistics")
        return
    stats = {r[0]: r for r in per_run}
    for spec in study.manifest.runs:
        if spec.run_id not in stats:
            problems.add(f"run {spec.run_id!r} of study.yaml has no events", file=manifest_file,
                         column="run_id", example=f"runs: - run_id: {spec.run_id}",
                         fix="write that run's events to events/*.parquet, or remove the run "
                             "from study.yaml", code="run_without_events")
    for run_id, n, n_ids, first_ns, last_ns, end_ns, e2e_med, file in per_run:
        if run_id not in study.manifest.run_ids:
            continue  # reported by the unknown_run row check
        spec = study.manifest.run(run_id)
        rel = _rel(file, study.root)
        if n_ids < n:
            _duplicates(study, problems, run_id, n - n_ids)
        unit = _clock_unit_suspect(n, first_ns, last_ns, end_ns, e2e_med, spec.duration_s)
        if unit:
            span_ns = (end_ns or last_ns) - first_ns
            problems.add(
                f"run {run_id!r}: timestamps look like {unit}, not nanoseconds "
                f"(the run's events span {span_ns:,} 'ns'"
                + (f" for a {spec.duration_s:g} s run" if spec.duration_s else "")
                + (f"; median end-to-end latency {e2e_med:,} 'ns'" if e2e_med is not None else "") + ")",
                file=rel, column="scheduled_ns",
                example=f"scheduled_ns from {first_ns:,} to {last_ns:,}",
                fix=("multiply every *_ns column by 1,000,000 (ms → ns)" if unit == "milliseconds"
                     else "multiply every *_ns column by 1,000,000,000 (s → ns)"),
                code="timestamp_unit")
            continue  # rates from a wrong clock unit would only add noise
        if first_ns is not None and first_ns > EPOCH_NS_THRESHOLD:
            problems.warn(
                f"run {run_id!r}: scheduled_ns looks like wall-clock epoch time, not ns since the "
                "run's start; the warm-up window counts from 0, so warm-up is not excluded",
                file=rel, column="scheduled_ns", example=f"first scheduled_ns = {first_ns:,}",
                fix="subtract the run's start time from every *_ns column", code="epoch_clock")
        if spec.offered_rps and n >= 2 and last_ns > first_ns:
            measured = measured_rate_rps(n, first_ns, last_ns)
            rel_diff = measured / spec.offered_rps - 1.0
            if abs(rel_diff) > C.RATE_MISMATCH_WARN:
                problems.warn(
                    f"run {run_id!r}: offered rate measured from scheduled_ns is "
                    f"{measured:.3g} req/s, {rel_diff:+.0%} off the nominal offered_rps "
                    f"{spec.offered_rps:g} (N = {n:,} over {(last_ns - first_ns) / C.NS_PER_S:.3g} s)",
                    file=manifest_file, column="offered_rps",
                    example=f"run_id: {run_id}, offered_rps: {spec.offered_rps:g}",
                    fix="the load generator did not offer the nominal rate: trust the measured "
                        "rate (capplan summarize shows it) or correct offered_rps",
                    code="rate_mismatch")


def _rel(file, root: Path):
    """Files are named as DuckDB read them (the study path joined with the file's path)."""
    return None if file is None else str(file)


def _clock_unit_suspect(n, first_ns, last_ns, end_ns, e2e_median_ns, duration_s) -> str | None:
    """'seconds' / 'milliseconds' when a run's stamps cannot be nanoseconds, else None."""
    if first_ns is None:
        return None
    span = (end_ns if end_ns is not None else last_ns) - first_ns
    suspect = False
    if duration_s and duration_s >= 1 and n >= 2:
        suspect = span < duration_s * C.NS_PER_S * C.MIN_PLAUSIBLE_SPAN_FACTOR
    if e2e_median_ns is not None and e2e_median_ns < MIN_PLAUSIBLE_E2E_NS:
        suspect = True
    if not duration_s and n >= 2 and span < MIN_PLAUSIBLE_RUN_SPAN_NS:
        suspect = True
    if not suspect:
        return None
    if duration_s and span > 0:
        per_s = span / duration_s  # ~1 for seconds, ~1000 for milliseconds
        return "seconds" if per_s < 30 else "milliseconds"
    ref = e2e_median_ns if e2e_median_ns is not None else span
    return "seconds" if ref < 300 else "milliseconds"


def _duplicates(study: Study, problems: ProblemList, run_id: str, n_extra: int) -> None:
    row = study.sql(f"""
        SELECT request_id, count(*) AS k,
               list(struct_pack(f := filename, r := file_row_number)
                    ORDER BY filename, file_row_number)[1:3] AS at
        FROM {ROW_VIEW} WHERE run_id = ? AND request_id IS NOT NULL
        GROUP BY request_id HAVING count(*) > 1
        ORDER BY request_id LIMIT 1
    """, [run_id]).fetchone()
    request_id, k, at = row
    where = "; ".join(f"row {a['r']} of {a['f']}" for a in at)
    problems.add(f"run {run_id!r}: request_id is not unique ({n_extra:,} duplicate rows)",
                 file=_rel(at[0]["f"], study.root), column="request_id",
                 example=f"request_id={request_id!r} appears {k} times: {where}",
                 fix="one row per offered request: drop repeated rows, or make request_id "
                     "unique within the run (e.g. prefix a retry counter)",
                 code="duplicate_request_id")


# --------------------------------------------------------------------------------------------
# The timeline (optional system events)
# --------------------------------------------------------------------------------------------

TIMELINE_ROW_VIEW = "_validate_timeline"
_TIMELINE_EXAMPLE = ("run_id", "t_ns", "event", "replica", "group", "desired")


def timeline_checks(manifest: C.Manifest) -> list[RowCheck]:
    """Every per-row rule of the timeline table. Conditions are SQL over the timeline columns
    plus, per row, ``run_end_ns`` (the run's end: its last request stamp or duration_s,
    whichever is later) and ``known`` (the row's replica served requests in that run or was
    added by a replica_added event of it)."""
    checks: list[RowCheck] = []
    for c in C.TIMELINE_COLUMNS:
        if c.required and not c.nullable:
            checks.append(RowCheck(f"timeline_null_{c.name}", c.name, f't."{c.name}" IS NULL',
                                   f"timeline: required column '{c.name}' is null",
                                   f"every system event needs {c.name} ({c.meaning})"))
    checks += [
        RowCheck("timeline_unknown_event", "event",
                 "t.event IS NOT NULL AND NOT list_contains(?, t.event)",
                 "timeline: unknown event",
                 "use one of " + ", ".join(C.TIMELINE_EVENTS) + " (docs/study-contract.md, "
                 "section 9)", (list(C.TIMELINE_EVENTS),)),
        RowCheck("timeline_unknown_run", "run_id",
                 "t.run_id IS NOT NULL AND NOT list_contains(?, t.run_id)",
                 "timeline: run_id is not a run of study.yaml",
                 "use the run_id of the run the event happened in", (list(manifest.run_ids),)),
        RowCheck("timeline_time_outside_run", "t_ns",
                 "t.t_ns IS NOT NULL AND f.run_end_ns IS NOT NULL "
                 "AND (t.t_ns < 0 OR t.t_ns > f.run_end_ns)",
                 "timeline: event time outside its run",
                 "t_ns is ns since the run's start on the clock of scheduled_ns (0 … the run's "
                 "last stamp or duration_s); subtract the run's start, check the unit (ns), or "
                 "drop events of other runs"),
        RowCheck("timeline_unknown_replica", "replica",
                 "t.replica IS NOT NULL AND t.run_id IS NOT NULL AND NOT coalesce(k.known, false)",
                 "timeline: unknown replica",
                 "name a replica by the replica_group value its requests carry, or add it with "
                 "a replica_added event in the same run first"),
        RowCheck("timeline_decision_without_desired", "desired",
                 "t.event = 'scale_decision' AND t.desired IS NULL",
                 "timeline: scale_decision without desired",
                 "a scale decision states the replicas it wants (desired) and, where known, "
                 "those ready (ready)"),
        RowCheck("timeline_negative_count", "desired",
                 "coalesce(t.desired, 0) < 0 OR coalesce(t.ready, 0) < 0",
                 "timeline: negative replica count", "desired and ready count replicas: 0 or more"),
    ]
    return checks


def _timeline_example(ex: dict | None) -> tuple[str | None, str | None]:
    if not ex:
        return None, None
    fields = ", ".join(f"{k}={ex[k]!r}" for k in _TIMELINE_EXAMPLE if ex.get(k) is not None)
    return ex.get("filename"), f"row {ex.get('file_row_number')}: {fields}"


def validate_timeline(study: Study, problems: ProblemList) -> None:
    """Row checks of ``timeline/`` (when the study has one): unknown events and runs, times
    outside the run, unknown replicas, decisions without counts — each with its count, the
    file and row of an example, and a fix. One grouped DuckDB pass."""
    if not study.timeline_files:
        return
    con = study.con
    try:
        con.read_parquet([str(p) for p in study.timeline_files], union_by_name=True,
                         filename=True, file_row_number=True).create_view("_validate_tl_raw",
                                                                          replace=True)
        have = set(con.sql("SELECT * FROM _validate_tl_raw LIMIT 0").columns)
        con.execute(f"CREATE OR REPLACE VIEW {TIMELINE_ROW_VIEW} AS SELECT "
                    f"{events_select(have, C.TIMELINE_COLUMNS)}, filename, file_row_number "
                    "FROM _validate_tl_raw")
    except duckdb.Error as exc:
        problems.add(f"cannot read the timeline: {str(exc).splitlines()[0]}",
                     file=str(study.root / C.TIMELINE_DIR), code="bad_parquet",
                     fix="a timeline parquet file is corrupt; re-export it or remove it")
        return
    dur = [(r.run_id, None if r.duration_s is None else int(round(r.duration_s * C.NS_PER_S)))
           for r in study.manifest.runs]
    checks = timeline_checks(study.manifest)
    cols = ["filename", "file_row_number", *_TIMELINE_EXAMPLE]
    ex = ("struct_pack(" + ", ".join(f'"{c}" := t."{c}"' for c in cols)
          + ', "run_end_ns" := f.run_end_ns)')
    select, params = check_select(checks, ex)
    query = f"""
        WITH d AS (SELECT unnest(?) AS run_id, unnest(?) AS dur_ns),
             f AS (SELECT e.run_id,
                          greatest(max(greatest(e.scheduled_ns, e.sent_ns, e.first_token_ns,
                                                e.last_token_ns)), max(d.dur_ns)) AS run_end_ns
                   FROM events e LEFT JOIN d USING (run_id) GROUP BY e.run_id),
             k AS (SELECT DISTINCT run_id, replica_group AS replica, true AS known FROM events
                   WHERE replica_group IS NOT NULL
                   UNION
                   SELECT DISTINCT run_id, replica, true FROM {TIMELINE_ROW_VIEW}
                   WHERE event = 'replica_added' AND replica IS NOT NULL)
        SELECT {', '.join(select)}
        FROM {TIMELINE_ROW_VIEW} t LEFT JOIN f USING (run_id)
             LEFT JOIN k ON k.run_id = t.run_id AND k.replica = t.replica"""
    try:
        cur = con.execute(query, [[r for r, _ in dur], [d for _, d in dur], *params])
        names = [d[0] for d in cur.description]
        row = dict(zip(names, cur.fetchone()))
    except duckdb.Error as exc:
        problems.add(f"cannot check the timeline: {str(exc).splitlines()[0]}",
                     file=str(study.root / C.TIMELINE_DIR), code="bad_parquet",
                     fix="a timeline or events parquet file cannot be read; re-export it")
        return
    for i, chk in enumerate(checks):
        n = row[f"n{i}"]
        if n:
            exr = row[f"ex{i}"]
            file, example = _timeline_example(exr)
            fix = chk.fix
            if chk.code == "timeline_time_outside_run" and exr.get("run_end_ns") is not None:
                example += f" (run {exr['run_id']} spans 0 … {exr['run_end_ns']:,} ns)"
            if chk.code == "timeline_unknown_replica":
                known = [r[0] for r in con.execute(
                    "SELECT DISTINCT replica_group FROM events WHERE run_id = ? AND "
                    "replica_group IS NOT NULL ORDER BY 1 LIMIT 8", [exr["run_id"]]).fetchall()]
                fix += (f"; replicas of run {exr['run_id']}: " + ", ".join(known)) if known else \
                    f"; the requests of run {exr['run_id']} carry no replica_group"
            problems.items.append(Problem(
                f"{chk.message} in {n:,} of {row['n_rows']:,} rows", file=file,
                column=chk.column, example=example, fix=fix, severity=chk.severity,
                code=chk.code))


def validate_path(path) -> tuple[ProblemList, Study | None]:
    """Validate a study directory end to end and collect *every* problem: manifest, files,
    schema, then (when the manifest and schemas allow opening it) all row and run checks."""
    problems = ProblemList()
    root = Path(path).expanduser()
    if root.is_file() and root.name == C.MANIFEST_NAME:
        root = root.parent
    if not root.is_dir():
        problems.add("study directory does not exist", file=str(root),
                     fix="pass the folder that holds study.yaml and events/", code="no_study")
        return problems, None
    manifest = parse_manifest(root / C.MANIFEST_NAME, problems)
    event_files = find_event_files(root, problems)
    if not event_files:
        return problems, None
    con = connect()
    n_before = len(problems.errors)
    present = check_parquet_files(event_files, problems)
    timeline_files = find_parquet(root / C.TIMELINE_DIR)
    check_parquet_files(timeline_files, problems, C.TIMELINE_COLUMNS)
    resource_files = find_parquet(root / C.RESOURCES_DIR)
    check_parquet_files(resource_files, problems, C.RESOURCE_COLUMNS)
    if len(problems.errors) == n_before:
        problems.items.extend(side_table_problems(timeline_files, resource_files))
    schema_ok = len(problems.errors) == n_before
    if manifest is None or not schema_ok:
        why = "study.yaml cannot be read" if manifest is None else "the schema problems above"
        problems.warn(f"row-level checks were skipped because of {why}; fix them and run "
                      "`capplan validate` again", code="checks_skipped")
        return problems, None
    try:
        with reading(root, (*event_files, *timeline_files, *resource_files)):
            study = build_study(root, manifest, event_files, resource_files, present, con,
                                timeline_files)
    except StudyError as exc:
        problems.items.extend(exc.problems)
        return problems, None
    validate_study(study, problems)
    return problems, study


def open_checked(path: str | os.PathLike | Study, *,
                 con: duckdb.DuckDBPyConnection | None = None) -> Study:
    """Open a study and run every check: manifest and schema problems (as ``open_study``)
    and the row-level and run-level ones raise one StudyError listing all errors, with the
    warnings attached; warnings alone do not raise."""
    study = open_study(path, con=con, check_runs=False)  # the run checks name them
    validate_study(study).raise_if_errors()
    return study
