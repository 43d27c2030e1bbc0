"""Open a study directory through DuckDB: manifest + a normalized ``events`` view.

Events are never loaded into memory here: DuckDB views over the parquet files let every later
step stream (and spill), so a study larger than memory works. Column names come from
``capplan.contract``; values and paths are always bound, never formatted into SQL.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import yaml

from . import contract as C
from .errors import ProblemList, StudyError


@dataclass(frozen=True)
class Study:
    """An opened study. ``con`` holds the views ``raw_events`` and ``events`` (and
    ``resources`` when telemetry exists); ``events`` always has every contract column."""

    root: Path
    manifest: C.Manifest
    event_files: tuple[Path, ...]
    resource_files: tuple[Path, ...]
    present_columns: frozenset[str]
    con: duckdb.DuckDBPyConnection = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def load_model(self) -> str:
        return self.manifest.load_model

    def sql(self, query: str, params: list | tuple | dict | None = None):
        """Run SQL against this study's views (parameters bound)."""
        return self.con.execute(query, params) if params is not None else self.con.execute(query)

    def has(self, column: str) -> bool:
        return column in self.present_columns

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
        files = [self.root / C.MANIFEST_NAME, *self.event_files, *self.resource_files]
        for p in sorted(files):
            h.update(str(p.relative_to(self.root)).encode())
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()


def _find_parquet(folder: Path) -> tuple[Path, ...]:
    if not folder.is_dir():
        return ()
    return tuple(sorted(p for p in folder.rglob("*.parquet") if p.is_file()))


def _num(value, key: str, run_label: str, problems: ProblemList, file: str, *, integer=False):
    if value is None:
        return None
    try:
        v = int(value) if integer else float(value)
    except (TypeError, ValueError):
        problems.add(f"{run_label}: {key} must be a number, got {value!r}", file=file,
                     column=key, fix=f"write {key}: 4.0")
        return None
    return v


def parse_manifest(path: Path, problems: ProblemList | None = None) -> C.Manifest | None:
    """Read and check study.yaml. Collects problems; returns None if unusable."""
    own = problems is None
    problems = problems if problems is not None else ProblemList()
    file = str(path)
    if not path.is_file():
        problems.add("study manifest not found", file=file,
                     fix=f"a study directory holds {C.MANIFEST_NAME} and events/*.parquet; "
                         "see docs/study-contract.md", code="manifest_missing")
        if own:
            problems.raise_if_errors()
        return None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problems.add(f"study.yaml is not valid YAML{where}: {getattr(exc, 'problem', exc)}",
                     file=file, fix="check indentation and quoting; see docs/study-contract.md",
                     code="bad_yaml")
        if own:
            problems.raise_if_errors()
        return None
    except UnicodeDecodeError:
        problems.add("study.yaml is not UTF-8 text", file=file, code="bad_yaml")
        if own:
            problems.raise_if_errors()
        return None
    if not isinstance(raw, dict):
        problems.add("study.yaml must be a mapping of keys (contract, name, system, load_model, runs)",
                     file=file, code="bad_yaml")
        if own:
            problems.raise_if_errors()
        return None
    for key in C.MANIFEST_REQUIRED:
        if key not in raw or raw[key] in (None, ""):
            problems.add(f"study.yaml is missing the required field '{key}'", file=file, column=key,
                         fix=f"add '{key}:' (see docs/study-contract.md)", code="manifest_field")
    contract = raw.get("contract")
    if contract is not None and contract != C.CONTRACT_VERSION:
        problems.add(f"unsupported contract {contract!r}", file=file, column="contract",
                     fix=f"this capplan reads contract: {C.CONTRACT_VERSION}", code="manifest_field")
    load_model = raw.get("load_model", C.LoadModel.OPEN.value)
    if load_model not in (C.LoadModel.OPEN.value, C.LoadModel.CLOSED.value):
        problems.add(f"load_model must be 'open' or 'closed', got {load_model!r}", file=file,
                     column="load_model", code="manifest_field")
    system = raw.get("system") or {}
    if not isinstance(system, dict):
        problems.add("system must be a mapping", file=file, column="system", code="manifest_field")
        system = {}
    runs_raw = raw.get("runs") or []
    if not isinstance(runs_raw, list):
        problems.add("runs must be a list of run mappings", file=file, column="runs",
                     code="manifest_field")
        runs_raw = []
    runs: list[C.RunSpec] = []
    seen: set[str] = set()
    for i, r in enumerate(runs_raw):
        label = f"runs[{i}]"
        if not isinstance(r, dict):
            problems.add(f"{label} must be a mapping like {{run_id: r01, offered_rps: 2.0}}", file=file,
                         column="runs", code="manifest_field")
            continue
        run_id = r.get("run_id")
        if run_id in (None, ""):
            problems.add(f"{label} has no run_id", file=file, column="run_id",
                         example=str(r), fix="give each run a unique run_id", code="manifest_field")
            continue
        run_id = str(run_id)
        label = f"run {run_id}"
        if run_id in seen:
            problems.add(f"run_id {run_id!r} appears twice in the manifest", file=file,
                         column="run_id", code="manifest_field")
        seen.add(run_id)
        rps = _num(r.get("offered_rps"), "offered_rps", label, problems, file)
        conc = _num(r.get("concurrency"), "concurrency", label, problems, file, integer=True)
        if load_model == C.LoadModel.CLOSED.value:
            if conc is None:
                problems.add(f"{label}: closed-loop runs need 'concurrency'", file=file,
                             column="concurrency", example=str(r), fix="add concurrency: 16",
                             code="manifest_field")
            elif conc <= 0:
                problems.add(f"{label}: concurrency must be > 0, got {conc}", file=file,
                             column="concurrency", code="manifest_field")
        else:
            if rps is None:
                problems.add(f"{label}: open-loop runs need 'offered_rps'", file=file,
                             column="offered_rps", example=str(r), fix="add offered_rps: 4.0",
                             code="manifest_field")
            elif rps <= 0:
                problems.add(f"{label}: offered_rps must be > 0, got {rps}", file=file,
                             column="offered_rps", code="manifest_field")
        dur = _num(r.get("duration_s"), "duration_s", label, problems, file)
        warm = _num(r.get("warmup_s"), "warmup_s", label, problems, file)
        if warm is not None and warm < 0:
            problems.add(f"{label}: warmup_s must be ≥ 0", file=file, column="warmup_s",
                         code="manifest_field")
        if dur is not None and warm is not None and warm >= dur:
            problems.add(f"{label}: warmup_s ({warm:g}) must be shorter than duration_s ({dur:g})",
                         file=file, column="warmup_s", code="manifest_field")
        arrival = str(r.get("arrival", "concurrency" if conc is not None else "unknown"))
        known = set(C.RUN_REQUIRED_OPEN + C.RUN_REQUIRED_CLOSED + C.RUN_OPTIONAL + ("concurrency",))
        runs.append(C.RunSpec(
            run_id=run_id,
            offered_rps=rps if load_model != C.LoadModel.CLOSED.value else rps,
            concurrency=conc,
            arrival=arrival,
            duration_s=dur,
            warmup_s=warm,
            repeat=int(r.get("repeat", 0) or 0),
            nominal_rps=_num(r.get("nominal_rps"), "nominal_rps", label, problems, file),
            extra={k: v for k, v in r.items() if k not in known},
        ))
    if own:
        problems.raise_if_errors()
    if problems.errors and not runs:
        return None
    return C.Manifest(
        contract=str(contract), name=str(raw.get("name", path.parent.name)), system=system,
        workload=raw.get("workload") or {}, load_model=str(load_model), runs=tuple(runs), raw=raw,
    )


def _events_select(present: set[str]) -> str:
    """SELECT list that gives every contract column, NULL-filled where a file lacks it.
    Identifiers come from the contract module only (no user input in SQL text)."""
    cols = []
    for c in C.EVENT_COLUMNS:
        if c.name in present:
            cols.append(f'"{c.name}"')
        else:
            sql_type = {"string": "VARCHAR", "int64": "BIGINT", "list<item: int64>": "BIGINT[]"}.get(
                str(c.dtype), "VARCHAR")
            cols.append(f'CAST(NULL AS {sql_type}) AS "{c.name}"')
    return ", ".join(cols)


def connect(threads: int | None = None, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """A private in-memory DuckDB connection (spills to a temp dir for big studies). DuckDB's
    own terminal progress bar is off: it would scribble over CLI output and notebook cells."""
    config = {}
    if threads:
        config["threads"] = int(threads)
    if memory_limit:
        config["memory_limit"] = memory_limit
    con = duckdb.connect(database=":memory:", config=config)
    con.execute("SET enable_progress_bar = false")
    return con


def open_study(path: str | os.PathLike | Study, *, con: duckdb.DuckDBPyConnection | None = None,
               check: bool = False) -> Study:
    """Open a study directory. Manifest and schema problems (bad YAML, missing fields, corrupt
    parquet, missing columns, wrong dtypes) always raise a StudyError listing all of them.
    With ``check=True`` the row-level validator runs too and its errors raise the same way
    (warnings alone do not raise). Without it, opening reads only parquet footers."""
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
    assert manifest is not None
    event_files = _find_parquet(root / C.EVENTS_DIR)
    if not event_files:
        raise StudyError("no event files: events/ holds no .parquet file", file=str(root / C.EVENTS_DIR),
                         fix="write one row per offered request to events/*.parquet "
                             "(see docs/study-contract.md)", code="no_events")
    resource_files = _find_parquet(root / C.RESOURCES_DIR)
    con = con or connect()
    from .validate import check_parquet_files  # local import: validate imports this module

    present = check_parquet_files(con, event_files, problems)
    problems.raise_if_errors()
    study = build_study(root, manifest, event_files, resource_files, present, con)
    if check:
        from .validate import validate_study

        report = validate_study(study)
        report.raise_if_errors()  # StudyError listing every error (warnings attached)
    return study


def build_study(root: Path, manifest: C.Manifest, event_files: tuple[Path, ...],
                resource_files: tuple[Path, ...], present: set[str],
                con: duckdb.DuckDBPyConnection) -> Study:
    """Create the views over already-checked files (shared by open_study and the validator)."""
    files = [str(p) for p in event_files]
    con.read_parquet(files, union_by_name=True).create_view("raw_events", replace=True)
    con.execute(f"CREATE OR REPLACE VIEW events AS SELECT {_events_select(present)} FROM raw_events")
    if resource_files:
        con.read_parquet([str(p) for p in resource_files], union_by_name=True).create_view(
            "resources", replace=True)
    return Study(root=root, manifest=manifest, event_files=event_files,
                 resource_files=resource_files, present_columns=frozenset(present), con=con)
