"""Open a study directory through DuckDB: manifest + a normalized ``events`` view.

Events are never loaded into memory here: DuckDB views over the parquet files let every later
step stream (and spill), so a study larger than memory works. Column names come from
``capplan.contract``; values and paths are always bound, never formatted into SQL.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from . import contract as C
from . import spec as S
from .dialect import DUCKDB, Dialect
from .errors import Problem, ProblemList, SpecError, StudyError


class StudyBase:
    """What every opened study (DuckDB's ``Study``, Spark's ``SparkStudy``) answers from its
    ``manifest`` and ``present_columns``."""

    manifest: C.Manifest
    present_columns: frozenset[str]

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def load_model(self) -> str:
        return self.manifest.load_model

    def has(self, column: str) -> bool:
        return column in self.present_columns


@dataclass(frozen=True)
class Study(StudyBase):
    """An opened study. ``con`` holds the views ``raw_events`` and ``events`` (and
    ``resources`` when telemetry exists, ``timeline`` when system events exist); ``events``
    and ``timeline`` always have every contract column."""

    root: Path
    manifest: C.Manifest
    event_files: tuple[Path, ...]
    resource_files: tuple[Path, ...]
    present_columns: frozenset[str]
    con: duckdb.DuckDBPyConnection = field(repr=False, compare=False)
    timeline_files: tuple[Path, ...] = ()

    def sql(self, query: str, params: list | tuple | dict | None = None):
        """Run SQL against this study's views (parameters bound)."""
        return self.con.execute(query, params) if params is not None else self.con.execute(query)

    # -- what the engine-neutral queries need (``capplan.sparkstudy.SparkStudy`` has the same)
    dialect = DUCKDB
    events_view = "events"

    def view_name(self, name: str) -> str:
        return name

    def has_view(self, name: str) -> bool:
        return bool(self.con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?",
                                     [name]).fetchall()[0][0])

    def register(self, name: str, frame) -> None:
        """A small table (a pandas frame, or a dict of numpy columns whose NaN is NULL) as
        a table of this study's connection."""
        self.con.register("_capplan_frame", frame)
        self.con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM _capplan_frame")
        self.con.unregister("_capplan_frame")

    def create_view(self, name: str, select: str) -> None:
        self.con.execute(f"CREATE OR REPLACE VIEW {name} AS {select}")

    def runs_frame(self):
        """Manifest runs as a pandas frame (run_id, offered_rps, concurrency, ...)."""
        import pandas as pd

        rows = []
        for r in self.manifest.runs:
            rows.append({
                "run_id": r.run_id,
                "offered_rps": r.offered_rps,
                "concurrency": r.concurrency,
                "load_level": r.load_level,
                "arrival": r.arrival,
                "duration_s": r.duration_s,
                "warmup_s": r.warmup_s,
                "repeat": r.repeat,
            })
        return pd.DataFrame(rows)

    def content_hash(self) -> str:
        """sha256 over the manifest and every data file's bytes (provenance for reports)."""
        h = hashlib.sha256()
        files = [self.root / C.MANIFEST_NAME, *self.event_files, *self.resource_files,
                 *self.timeline_files]
        for p in sorted(files):
            h.update(str(p.relative_to(self.root)).encode())
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()


def find_parquet(folder: Path) -> tuple[Path, ...]:
    if not folder.is_dir():
        return ()
    return tuple(sorted(p for p in folder.rglob("*.parquet") if p.is_file()))


#: Keys of study.yaml and of its runs that the contract defines (others are kept and ignored).
MANIFEST_KEYS = C.MANIFEST_REQUIRED + ("workload", "quality")
RUN_KEYS = tuple(dict.fromkeys(C.RUN_REQUIRED_OPEN + C.RUN_REQUIRED_CLOSED + C.RUN_OPTIONAL))
LOAD_MODELS = tuple(m.value for m in C.LoadModel)


def parse_manifest(path: Path, problems: ProblemList | None = None, *,
                   text: str | None = None) -> C.Manifest | None:
    """Read and check study.yaml (with the spec kit: every problem names its field and line).
    Collects problems into ``problems``; without it, raises StudyError listing all of them.
    Returns None when the manifest is unusable. ``text``: the file's text, already read (a
    manifest in object storage, read by Spark); ``path`` then only names it."""
    own = problems is None
    problems = problems if problems is not None else ProblemList()
    manifest = _read_manifest(Path(path) if text is None else path, problems, text)
    if own:
        problems.raise_if_errors()
    return manifest


def _near_misses(check: S.Checks, d: dict, field: str, known: tuple[str, ...], where: str) -> None:
    """Warn about keys the contract does not define that look like a misspelt known key: they
    would be ignored silently (a ``warmup`` meant as ``warmup_s`` keeps the warm-up in)."""
    for k in d:
        near = None if str(k) in known else S.did_you_mean(k, known)
        if near and near not in d:
            check.warn(S.join(field, k), f"{where}: key {str(k)!r} is not part of the study contract "
                       f"and is ignored (did you mean {near!r}?)",
                       fix=f"rename it to {near} if that is what it means")


def _read_manifest(path, problems: ProblemList, text: str | None = None) -> C.Manifest | None:
    file = str(path)
    if text is None and not path.is_file():
        problems.add("study manifest not found", file=file,
                     fix=f"a study directory holds {C.MANIFEST_NAME} and events/*.parquet; "
                         "see docs/study-contract.md", code="manifest_missing")
        return None
    try:
        fix = "see docs/study-contract.md"
        doc = (S.load_yaml(path, what=C.MANIFEST_NAME, fix=fix) if text is None else
               S.parse_yaml(text, what=C.MANIFEST_NAME, file=file, fix=fix))
    except SpecError as exc:
        problems.items.append(exc.problem(code="bad_yaml"))
        return None
    check = S.Checks(problems, doc, code="manifest_field")
    raw = check(S.mapping, doc.data, "", what=C.MANIFEST_NAME, optional=False,
                example="contract, name, system, load_model and runs (see docs/study-contract.md)")
    if raw is None:
        return None
    _near_misses(check, raw, "", MANIFEST_KEYS, C.MANIFEST_NAME)
    for key in C.MANIFEST_REQUIRED:
        if raw.get(key) in (None, ""):
            check.error(key, f"{C.MANIFEST_NAME} is missing the required field '{key}'",
                        fix=f"add '{key}:' (see docs/study-contract.md)")
    contract = raw.get("contract")
    if contract is not None and contract != C.CONTRACT_VERSION:
        check.error("contract", f"unsupported contract {contract!r}",
                    fix=f"this capplan reads contract: {C.CONTRACT_VERSION}")
    load_model = check(S.choice, raw.get("load_model"), "load_model", LOAD_MODELS,
                       optional=True, default=C.LoadModel.OPEN.value) or C.LoadModel.OPEN.value
    closed = load_model == C.LoadModel.CLOSED.value
    system = check(S.mapping, raw.get("system"), "system") or {}
    runs_raw = check(S.sequence, raw.get("runs"), "runs",
                     example="[{run_id: r01, offered_rps: 2.0}]") or []
    runs: list[C.RunSpec] = []
    seen: set[str] = set()
    for i, r in enumerate(runs_raw):
        fld = S.index("runs", i)
        r = check(S.mapping, r, fld, example="{run_id: r01, offered_rps: 2.0}")
        if r is None:
            continue
        if r.get("run_id") in (None, ""):
            check.error(S.join(fld, "run_id"), f"{fld} has no run_id", example=str(r),
                        fix="give each run a unique run_id")
            continue
        run_id = str(r["run_id"])
        label = f"run {run_id}"
        if run_id in seen:
            check.error(S.join(fld, "run_id"), f"run_id {run_id!r} appears twice in the manifest",
                        fix="give each run a unique run_id")
        seen.add(run_id)
        _near_misses(check, r, fld, RUN_KEYS, label)

        def num(key, **kw):
            return check(S.number, r.get(key), S.join(fld, key), optional=True, text_ok=True, **kw)

        rps = num("offered_rps", above=0.0 if not closed else None, example="4.0")
        conc = num("concurrency", integer=True, above=0 if closed else None, example="16")
        need = "concurrency" if closed else "offered_rps"
        if r.get(need) is None:
            check.error(S.join(fld, need), f"{label}: {load_model}-loop runs need '{need}'",
                        example=str(r), fix=f"add {need}: {'16' if closed else '4.0'}")
        dur = num("duration_s", above=0.0, example="300")
        warm = num("warmup_s", minimum=0.0, example="30")
        if dur is not None and warm is not None and warm >= dur:
            check.error(S.join(fld, "warmup_s"),
                        f"{label}: warmup_s ({warm:g}) must be shorter than duration_s ({dur:g})",
                        fix="the warm-up is cut from the start of the run: make it shorter")
        arrival = str(r.get("arrival", "concurrency" if conc is not None else "unknown"))
        if arrival not in C.ARRIVALS:
            near = S.did_you_mean(arrival, C.ARRIVALS)
            check.warn(S.join(fld, "arrival"), f"{label}: arrival {arrival!r} is not one of "
                       + ", ".join(C.ARRIVALS) + (f" (did you mean {near!r}?)" if near else ""),
                       fix="use one of the contract's arrival names (unknown when in doubt)")
        cache = r.get("cache_condition")
        if cache is not None and str(cache) not in C.CACHE_CONDITIONS:
            near = S.did_you_mean(str(cache), C.CACHE_CONDITIONS)
            check.error(S.join(fld, "cache_condition"),
                        f"{label}: cache_condition {cache!r} is not one of " + ", ".join(C.CACHE_CONDITIONS)
                        + (f" (did you mean {near!r}?)" if near else ""),
                        example="cache_condition: production_warm",
                        fix="label the prefix-cache state the run was measured in (docs/study-contract.md), "
                            "or leave the key out")
            cache = None
        runs.append(C.RunSpec(
            run_id=run_id, offered_rps=rps, concurrency=conc, arrival=arrival,
            cache_condition=None if cache is None else str(cache),
            duration_s=dur, warmup_s=warm,
            repeat=num("repeat", integer=True, minimum=0, example="1") or 0,
            nominal_rps=num("nominal_rps", above=0.0, example="4.0"),
            epoch_start_ns=num("epoch_start_ns", integer=True, minimum=0, example="1796167537605000000"),
            extra={k: v for k, v in r.items() if k not in RUN_KEYS},
        ))
    quality = _quality(check, raw.get("quality"))
    if problems.errors and not runs:
        return None
    return C.Manifest(
        contract=str(contract), name=str(raw.get("name", Path(str(path)).parent.name)), system=system,
        workload=raw.get("workload") or {}, load_model=str(load_model), runs=tuple(runs), raw=raw,
        quality=quality,
    )


def _quality(check: S.Checks, value) -> C.QualityResult | None:
    """The manifest's optional ``quality`` block, every problem named (None when absent or bad)."""
    if value is None:
        return None
    eg = "quality: {eval: mmlu-pro, score: 0.712, se: 0.004}"
    q = check(S.mapping, value, "quality", known=C.QUALITY_REQUIRED + C.QUALITY_OPTIONAL, example=eg)
    if q is None:
        return None
    missing = [k for k in C.QUALITY_REQUIRED if q.get(k) is None]
    for k in missing:
        check.error(S.join("quality", k), f"quality is missing '{k}'", example=eg,
                    fix="give the eval's name, the build's score and its standard error (se)")
    name = check(S.text, q.get("eval"), "quality.eval", optional=True, example="mmlu-pro")
    if isinstance(name, str) and not name.strip():
        check.error("quality.eval", "quality.eval is empty", fix="name the eval, e.g. eval: mmlu-pro")
        name = None
    score = check(S.number, q.get("score"), "quality.score", optional=True, example="0.712")
    se = check(S.number, q.get("se"), "quality.se", optional=True, minimum=0.0, example="0.004")
    hib = check(S.flag, q.get("higher_is_better"), "quality.higher_is_better", default=True)
    n = check(S.number, q.get("n"), "quality.n", optional=True, integer=True, above=0, example="12032")
    notes = check(S.text, q.get("notes"), "quality.notes", example="lm-eval-harness 0.4.5, 5-shot")
    if missing or None in (name, score, se, hib) or (q.get("n") is not None and n is None) \
            or (q.get("notes") is not None and notes is None):
        return None
    return C.QualityResult(eval=name, score=float(score), se=float(se), higher_is_better=hib, n=n, notes=notes)


# --------------------------------------------------------------------------------------------
# Schema checks (what any open needs; the row-level checks live in capplan.validate)
# --------------------------------------------------------------------------------------------

_INT_TYPES = (pa.int64(), pa.int32(), pa.int16(), pa.int8(), pa.uint32(), pa.uint16(), pa.uint8())


def _dtype_ok(expected: pa.DataType, actual: pa.DataType) -> bool:
    if expected == pa.float64():
        return pa.types.is_floating(actual) or actual in _INT_TYPES or actual == pa.uint64()
    if expected == pa.int64():
        return actual in _INT_TYPES or actual == pa.uint64()
    if expected == pa.string():
        return pa.types.is_string(actual) or pa.types.is_large_string(actual) or pa.types.is_dictionary(actual) and pa.types.is_string(actual.value_type)
    if pa.types.is_list(expected):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and _dtype_ok(expected.value_type, actual.value_type)
    return expected == actual


def _first_value(path: Path, column: str) -> str | None:
    """'row 0: column=value' of a file (reads one small batch of one column)."""
    try:
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=1, columns=[column]), None)
    except Exception:  # the schema was readable; a value may still not be
        return None
    if batch is None or batch.num_rows == 0:
        return None
    return f"row 0: {column}={batch.column(0)[0].as_py()!r}"


def check_parquet_files(files: tuple[Path, ...], problems: ProblemList,
                        columns: tuple[C.Column, ...] = C.EVENT_COLUMNS) -> set[str]:
    """Schema-level checks of every file of one table (readable, required columns, dtypes),
    read from the parquet footers only; returns the union of contract columns present.
    ``columns``: the table's contract (events by default, ``C.TIMELINE_COLUMNS``)."""
    present: set[str] = set()
    by_name = {c.name: c for c in columns}
    for path in files:
        try:
            schema = pq.read_schema(path)
        except Exception as exc:  # pyarrow raises several types for corrupt files
            problems.add(f"cannot read parquet file: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                         file=str(path), fix="the file is corrupt or not parquet; re-export it "
                         "(e.g. pandas.DataFrame.to_parquet) or remove it from its folder",
                         code="bad_parquet")
            continue
        bad = [(f.name, f.type) for f in schema if f.name in by_name
               and not _dtype_ok(by_name[f.name].dtype, f.type)]
        present |= schema_problems(str(path), list(schema.names), bad, problems,
                                   example=lambda col, p=path: _first_value(p, col), columns=columns)
    return present


def schema_problems(file: str, names: list[str], bad: list[tuple[str, object]],
                    problems: ProblemList, example=None,
                    columns: tuple[C.Column, ...] = C.EVENT_COLUMNS) -> set[str]:
    """The problems of one table's schema — required columns missing, contract columns of the
    wrong type (``bad``: (name, actual type)) — in the words every engine uses; returns the
    contract columns present. ``example(column)``: an example value, where one can be read.
    ``columns``: the table's contract (events by default, ``C.TIMELINE_COLUMNS``)."""
    by_name = {c.name: c for c in columns}
    for c in columns:
        if c.required and c.name not in names:
            problems.add(f"required column '{c.name}' is missing", file=file, column=c.name,
                         example="columns present: " + ", ".join(names[:12]),
                         fix=f"add '{c.name}' ({c.dtype}): {c.meaning}", code="missing_column")
    for name, actual in bad:
        c = by_name[name]
        problems.add(f"column '{name}' has type {actual}, expected {c.dtype}",
                     file=file, column=name, example=example(name) if example else None,
                     fix=(f"cast it to {c.dtype}" + (" nanoseconds" if c.unit == "ns" else "")),
                     code="wrong_dtype")
    return {n for n in names if n in by_name}


def events_select(present: set[str], columns: tuple[C.Column, ...] = C.EVENT_COLUMNS,
                  dialect: Dialect = DUCKDB) -> str:
    """SELECT list that gives every contract column, NULL-filled where a file lacks it.
    Identifiers come from the contract module only (no user input in SQL text)."""
    cols = []
    for c in columns:
        if c.name in present:
            cols.append(dialect.ident(c.name))
        else:
            cols.append(f"CAST(NULL AS {dialect.type_name(str(c.dtype))}) AS "
                        f"{dialect.ident(c.name)}")
    return ", ".join(cols)


def connect(threads: int | None = None, memory_limit: str | None = None,
            temp_directory: str | os.PathLike | None = None) -> duckdb.DuckDBPyConnection:
    """A private in-memory DuckDB connection (spills to a temp dir for big studies:
    ``temp_directory``, default DuckDB's ``.tmp`` beside the working directory). DuckDB's
    own terminal progress bar is off: it would scribble over CLI output and notebook cells.
    A bad ``memory_limit`` or an unusable ``temp_directory`` is a SpecError."""
    config = {}
    if threads:
        config["threads"] = int(threads)
    if memory_limit:
        config["memory_limit"] = str(memory_limit)
    if temp_directory:
        config["temp_directory"] = str(temp_directory)
    try:
        con = duckdb.connect(database=":memory:", config=config)
    except duckdb.Error as exc:
        raise SpecError(f"DuckDB does not accept these settings: {str(exc).splitlines()[0]}",
                        field="--memory-limit / --temp-dir",
                        fix="a memory limit like 4GB or 800MB, and a writable folder") from None
    con.execute("SET enable_progress_bar = false")
    return con


def find_event_files(root: Path, problems: ProblemList) -> tuple[Path, ...]:
    """The parquet files under ``events/``; a problem when there is none."""
    files = find_parquet(root / C.EVENTS_DIR)
    if not files:
        problems.add("no event files: events/ holds no .parquet file", file=str(root / C.EVENTS_DIR),
                     fix="write one row per offered request to events/*.parquet "
                         "(see docs/study-contract.md)", code="no_events")
    return files


def _footer_run_ids(event_files: tuple[Path, ...]) -> tuple[set[str], list[tuple[str, str]]] | None:
    """(runs certainly present, [min, max] ranges of row groups that hold several runs) from the
    ``run_id`` statistics of the parquet footers; None when a row group has no statistics."""
    present: set[str] = set()
    ranges: list[tuple[str, str]] = []
    for path in event_files:
        meta = pq.ParquetFile(path).metadata
        names = meta.schema.names
        if "run_id" not in names:
            return None
        i = names.index("run_id")
        for g in range(meta.num_row_groups):
            col = meta.row_group(g).column(i)
            if col.num_values == 0:
                continue
            st = col.statistics
            if st is None or not st.has_min_max or not isinstance(st.min, str):
                return None
            if st.min == st.max:
                present.add(st.min)
            else:
                ranges.append((st.min, st.max))
    return present, ranges


def runs_without_events(study: Study) -> tuple[str, ...]:
    """The manifest's runs that have no row in ``events/`` (manifest order)."""
    return missing_runs(study.manifest.run_ids, study.event_files, study.con)


def missing_runs(run_ids: tuple[str, ...], event_files: tuple[Path, ...],
                 con: duckdb.DuckDBPyConnection | None = None) -> tuple[str, ...]:
    """Which of ``run_ids`` no row of ``event_files`` has. Settled from the parquet footers
    where they can (one run per row group, how every importer and ``capplan synth`` write);
    otherwise one scan of the ``run_id`` column (on ``con``, or a private connection)."""
    footers = _footer_run_ids(event_files)
    if footers is not None:
        present, ranges = footers
        maybe = [r for r in run_ids if r not in present and any(lo <= r <= hi for lo, hi in ranges)]
        if not maybe:
            return tuple(r for r in run_ids if r not in present)
    con = con or connect()
    found = {r for (r,) in con.execute(
        "SELECT DISTINCT run_id FROM read_parquet(?, union_by_name = true) WHERE run_id IS NOT NULL",
        [[str(f) for f in event_files]]).fetchall()}
    return tuple(r for r in run_ids if r not in found)


def missing_runs_problem(manifest_file: str, n_runs: int, missing: tuple[str, ...],
                         events_dir: str) -> Problem:
    """The refusal of a study whose manifest lists runs without events: a C_SLO fitted to part of
    the sweep blames the wrong cause and asks for the wrong runs, so no command plans from it."""
    shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
    return Problem(
        f"{len(missing)} of the {n_runs} runs of {C.MANIFEST_NAME} have no events: {shown}; an "
        "envelope or plan from the other runs would be fitted to part of the sweep",
        file=manifest_file, column="run_id",
        example=f"runs: - run_id: {missing[0]} (no row of {C.EVENTS_DIR}/*.parquet has it)",
        fix=f"put those runs' event files back under {events_dir} (or re-import the study: "
            f"capplan import TOOL PATH... --out STUDY), or remove the runs from {C.MANIFEST_NAME}; "
            "capplan validate lists every problem",
        code="run_without_events")


def open_study(path: str | os.PathLike | Study, *,
               con: duckdb.DuckDBPyConnection | None = None, check_runs: bool = True) -> Study:
    """Open a study directory. Manifest and schema problems (bad YAML, missing fields, corrupt
    parquet, missing columns, wrong dtypes) and manifest runs without events raise a StudyError
    listing all of them. Opening reads only parquet footers (and, when they cannot tell which
    runs a file holds, the ``run_id`` column); the row-level checks are
    ``capplan.validate.open_checked`` (which reports runs without events itself:
    ``check_runs=False``)."""
    if isinstance(path, Study):
        return path
    root = Path(path).expanduser()
    problems = ProblemList()
    if not root.exists():
        raise StudyError("study directory does not exist", file=str(root),
                         fix="pass the folder that holds study.yaml and events/", code="no_study")
    if root.is_file() and root.name == C.MANIFEST_NAME:
        root = root.parent
    manifest = parse_manifest(root / C.MANIFEST_NAME, problems)
    problems.raise_if_errors()
    event_files = find_event_files(root, problems)
    problems.raise_if_errors()
    present = check_parquet_files(event_files, problems)
    timeline_files = find_parquet(root / C.TIMELINE_DIR)
    check_parquet_files(timeline_files, problems, C.TIMELINE_COLUMNS)
    resource_files = find_parquet(root / C.RESOURCES_DIR)
    check_parquet_files(resource_files, problems, C.RESOURCE_COLUMNS)
    problems.raise_if_errors()
    problems.items.extend(side_table_problems(timeline_files, resource_files))
    problems.raise_if_errors()
    with reading(root, (*event_files, *timeline_files, *resource_files)):
        study = build_study(root, manifest, event_files, resource_files, present,
                            con or connect(), timeline_files)
    missing = runs_without_events(study) if check_runs else ()
    if missing:
        raise StudyError(problems=[missing_runs_problem(
            str(root / C.MANIFEST_NAME), len(manifest.runs), missing, str(root / C.EVENTS_DIR))])
    return study


def build_study(root: Path, manifest: C.Manifest, event_files: tuple[Path, ...],
                resource_files: tuple[Path, ...], present: set[str],
                con: duckdb.DuckDBPyConnection, timeline_files: tuple[Path, ...] = ()) -> Study:
    """Create the views over already-checked files (shared by open_study and the validator).
    ``timeline``: the system events with every contract column (NULL-filled), when there are
    any."""
    files = [str(p) for p in event_files]
    con.read_parquet(files, union_by_name=True).create_view("raw_events", replace=True)
    con.execute(f"CREATE OR REPLACE VIEW events AS SELECT {events_select(present)} FROM raw_events")
    if resource_files:
        con.read_parquet([str(p) for p in resource_files], union_by_name=True).create_view(
            "resources", replace=True)
    if timeline_files:
        rel = con.read_parquet([str(p) for p in timeline_files], union_by_name=True)
        rel.create_view("raw_timeline", replace=True)
        have = set(rel.columns)
        con.execute("CREATE OR REPLACE VIEW timeline AS SELECT "
                    f"{events_select(have, C.TIMELINE_COLUMNS)} FROM raw_timeline")
    study = Study(root=root, manifest=manifest, event_files=event_files,
                  resource_files=resource_files, present_columns=frozenset(present), con=con,
                  timeline_files=tuple(timeline_files))
    _OPENED.append(weakref.ref(study))
    del _OPENED[:-8]  # the studies a command has open (a comparison: two; the rest are gone)
    return study


# --------------------------------------------------------------------------------------------
# Unreadable data: the one place that turns a DuckDB / pyarrow read error into a StudyError
# naming the file. Opening reads footers only (cheap); a file whose footer reads but whose data
# pages do not fails at the first real read, and is named here then.
# --------------------------------------------------------------------------------------------

#: weak references to the studies opened in this process, newest last (``read_failure``).
_OPENED: list[weakref.ref] = []

#: the exception types a corrupt parquet file raises when its pages are read.
READ_ERRORS: tuple[type[BaseException], ...] = (duckdb.Error, pa.ArrowException)

_BAD_PAGES_FIX = ("the file is corrupt (its footer reads, its data pages do not); re-export it "
                  "(e.g. re-run the import or pandas.DataFrame.to_parquet) or remove it from "
                  "its folder")


def study_files(study: "Study") -> tuple[Path, ...]:
    """Every parquet file of a study: events, timeline, resources."""
    return (*study.event_files, *study.timeline_files, *study.resource_files)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [exc.__class__.__name__])[0]


def unreadable_files(con: duckdb.DuckDBPyConnection | None, files) -> list[tuple[str, str]]:
    """(file, error) for every file whose pages cannot be decoded. Reads each file fully
    (the demo study: 0.25 s), so it runs when a read has failed, or before a long job."""
    files = list(files)
    if not files:  # no connection made for nothing (a study without side tables: 30 ms)
        return []
    con = con if con is not None else duckdb.connect()
    bad = []
    for f in files:
        try:
            reader = con.sql("SELECT * FROM read_parquet(?)", params=[str(f)]).to_arrow_reader(1 << 16)
            for _ in reader:
                pass
        except (*READ_ERRORS, OSError) as exc:
            bad.append((str(f), _first_line(exc)))
    return bad


def unreadable_problems(files, con: duckdb.DuckDBPyConnection | None = None) -> list[Problem]:
    """One ``bad_parquet`` problem per file of ``files`` whose data cannot be read."""
    return [Problem(f"cannot read parquet data: {msg}", file=f, fix=_BAD_PAGES_FIX,
                    code="bad_parquet") for f, msg in unreadable_files(con, files)]


def read_failure(exc: BaseException, files=None) -> StudyError | None:
    """The StudyError for a read error ``exc``: the unreadable files among ``files`` (default:
    those of every study opened in this process). None when every file reads — then ``exc``
    is not about the data and must be raised as it is."""
    if not isinstance(exc, READ_ERRORS):
        return None
    if files is None:
        studies = [s for s in (r() for r in _OPENED) if s is not None]
        files = dict.fromkeys(f for s in studies for f in study_files(s))
    problems = unreadable_problems(files)
    return StudyError(problems=problems) if problems else None


def side_table_problems(timeline_files, resource_files) -> list[Problem]:
    """The unreadable pages of the timeline and resources files, read in full at open: these
    tables are small (the demo's telemetry: 0.37 MB, 0.01 s), and a command that never reads
    them would otherwise pass over a corrupt one. The events, the large table, are named at
    their first failing read instead (``read_failure``)."""
    return unreadable_problems((*timeline_files, *resource_files))


def check_readable(study: "Study") -> None:
    """Read every page of every file of ``study``; a StudyError naming each unreadable one.
    For jobs that would fail late and expensively (``capplan report`` before its kernels)."""
    problems = unreadable_problems(study_files(study), study.con)
    if problems:
        raise StudyError(problems=problems)


class reading:
    """``with reading(root, files):`` a DuckDB / pyarrow read error inside names the
    unreadable file among ``files`` (StudyError); any other error passes unchanged."""

    def __init__(self, root: Path, files):
        self.root, self.files = root, tuple(files)

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or not isinstance(exc, READ_ERRORS):
            return False
        err = read_failure(exc, self.files)
        if err is None:
            return False
        raise err from None
