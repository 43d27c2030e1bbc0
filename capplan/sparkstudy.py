"""Open a study for the Spark engine (docs/scale.md): the manifest, and the events as a Spark
temporary view with every contract column — from a study folder on the local disk or in any
file system Spark reads (``file://``, ``s3a://``, ``hdfs://``, ``abfss://``, …), or from a
table of the Spark catalog (Delta, Iceberg, Hive) with the manifest given beside it.

A local study is checked with the same manifest and parquet-footer checks as
``capplan.study.open_study`` before Spark starts; a remote folder or a table is checked on the
schema Spark reads, with the same messages. pyspark is imported only here and in
``capplan.reduce.spark`` (an optional dependency: ``pip install 'capplan[spark]'``)."""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from . import contract as C
from .dialect import SPARK
from .errors import ProblemList, SpecError, StudyError
from .study import (StudyBase, check_parquet_files, events_select, find_event_files,
                    missing_runs, missing_runs_problem, parse_manifest, schema_problems)

INSTALL_FIX = ("install the Spark engine: pip install 'capplan[spark]' (pyspark) and a Java "
               "17 or 21 runtime (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)")
#: Hadoop file-system connectors by URI scheme (the jar Spark needs for each)
CONNECTORS = {"s3a": "org.apache.hadoop:hadoop-aws (matching Spark's Hadoop version)",
              "abfss": "org.apache.hadoop:hadoop-azure", "abfs": "org.apache.hadoop:hadoop-azure",
              "gs": "com.google.cloud.bigdataoss:gcs-connector"}
_tokens = itertools.count()


def spark_session(master: str | None = None, *, conf: dict | None = None):
    """The active SparkSession, or a new one on ``master``; without one, the master Spark
    itself picks (spark-submit's ``--master``, ``spark-defaults.conf``, else ``local[*]``).
    UTC session time zone, no console progress bar, Arrow for the small collects; on a local
    master two shuffle partitions per thread unless configured."""
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SpecError("the Spark engine needs pyspark, which is not installed",
                        field="--engine", fix=INSTALL_FIX) from None
    active = SparkSession.getActiveSession()
    if active is not None and master is None and not conf:
        return active
    b = SparkSession.builder.appName("capplan")
    if master is not None:
        b = b.master(master)
    settings = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false",
                "spark.sql.execution.arrow.pyspark.enabled": "true", **(conf or {})}
    for k, v in settings.items():
        b = b.config(k, v)
    try:
        spark = b.getOrCreate()
    except Exception as exc:  # no Java, a bad master URL: pyspark raises several types
        raise SpecError(f"cannot start Spark on {master or 'its default master'}: "
                        f"{_first_line(exc)}", field="--spark-master",
                        fix="check the master URL (local[*], spark://host:7077, yarn); "
                            + INSTALL_FIX) from None
    spark.sparkContext.setLogLevel("ERROR")
    cores = _local_cores(spark.sparkContext.master)
    if cores is not None and not spark.sparkContext.getConf().contains(
            "spark.sql.shuffle.partitions"):
        # Spark's default of 200 shuffle partitions is made for a cluster: on one machine
        # each of the reduction's few shuffles then runs 200 tiny tasks (4x slower on a
        # 30 k-request study with 2 threads); two per thread keeps every thread busy
        spark.conf.set("spark.sql.shuffle.partitions", str(2 * cores))
    return spark


def _local_cores(master: str) -> int | None:
    """The worker threads of a local master (``local``, ``local[4]``, ``local[*]``,
    ``local[4,2]``), None for a cluster."""
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if m is None:
        return None
    n = m.group(1)
    return 1 if n is None else (os.cpu_count() or 1) if n == "*" else max(1, int(n))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return exc.__class__.__name__


class SparkResult:
    """A query's (small) result, read like DuckDB's: ``df()``, ``fetchall()``,
    ``fetchone()``."""

    def __init__(self, frame):
        self._frame = frame

    def df(self):
        return self._frame.toPandas()

    def fetchall(self) -> list[tuple]:
        return [tuple(r) for r in self._frame.collect()]

    def fetchone(self):
        rows = self._frame.limit(1).collect()
        return tuple(rows[0]) if rows else None


@dataclass(frozen=True)
class SparkStudy(StudyBase):
    """A study opened on Spark: the same ``manifest``, ``present_columns`` and ``sql`` as a
    DuckDB ``Study``, the events in the temporary view ``events_view``."""

    root: str
    manifest: C.Manifest
    present_columns: frozenset[str]
    spark: object = field(repr=False, compare=False)
    events_view: str = ""
    token: str = ""
    manifest_text: str = field(default="", repr=False)
    input_files: tuple[str, ...] = field(default=(), repr=False)

    dialect = SPARK

    def sql(self, query: str, params: list | None = None) -> SparkResult:
        """Run Spark SQL over this study's views, parameters bound by position."""
        return SparkResult(self.spark.sql(query, args=list(params) if params else None))

    def frame(self, query: str, params: list | None = None):
        """The Spark DataFrame of a query (for the reduction's aggregations)."""
        return self.spark.sql(query, args=list(params) if params else None)

    def view_name(self, name: str) -> str:
        return f"{name}_{self.token}"

    def has_view(self, name: str) -> bool:
        return bool(self.spark.catalog.tableExists(name))

    def register(self, name: str, frame) -> None:
        """A small table (a pandas frame, or a dict of numpy columns) as a temporary view
        (NaN → NULL)."""
        if isinstance(frame, dict):  # numpy columns (metrics.window_runs)
            import pandas as pd

            frame = pd.DataFrame(frame)
        clean = frame.astype(object).where(frame.notna(), None)
        self.spark.createDataFrame(clean.to_dict("records") if len(clean) else [],
                                   schema=_schema_of(frame)).createOrReplaceTempView(name)

    def create_view(self, name: str, select: str) -> None:
        self.spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {name} AS {select}")

    def content_hash(self) -> str:
        """sha256 over the manifest text and the names of the event files Spark reads (their
        bytes are not read: the study may be far away and large)."""
        h = hashlib.sha256(self.manifest_text.encode())
        for f in sorted(self.input_files):
            h.update(f.encode())
        return h.hexdigest()


def _schema_of(frame):
    from pyspark.sql import types as T

    kinds = {"object": T.StringType(), "int16": T.ShortType(), "int64": T.LongType(),
             "float64": T.DoubleType(), "int32": T.IntegerType(), "bool": T.BooleanType()}
    return T.StructType([T.StructField(c, kinds.get(str(frame[c].dtype), T.StringType()), True)
                         for c in frame.columns])


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _is_uri(path: str) -> bool:
    return bool(_SCHEME.match(path)) and not path.lower().startswith("file://")


def is_local(path: str) -> bool:
    """A path on this machine (plain or ``file://``), which the DuckDB-side checks can read."""
    return not _is_uri(path)


def local_path(path: str) -> Path:
    """A local study path, plain or ``file://``, as a Path."""
    return Path(urlparse(path).path if path.lower().startswith("file://") else path).expanduser()


def _spark_error(exc: Exception, where: str) -> StudyError:
    """A Spark/Hadoop error while reading ``where`` as a StudyError (exit 2): a missing path,
    a missing file-system connector, or anything else with its first line."""
    text = str(exc)
    scheme = urlparse(where).scheme.lower()
    if "PATH_NOT_FOUND" in text or "Path does not exist" in text or "FileNotFound" in text:
        return StudyError("path does not exist", file=where, code="no_study",
                          fix="pass the folder that holds study.yaml and events/ (or "
                              "study.yaml with --events-table)")
    if ("No FileSystem for scheme" in text or "ClassNotFoundException" in text
            or "UnsupportedFileSystem" in text):
        jar = CONNECTORS.get(scheme, "the Hadoop connector for this scheme")
        return StudyError(f"Spark cannot read {scheme}:// paths: its Hadoop connector is "
                          "missing", file=where, code="no_connector",
                          fix=f"start Spark with the connector: spark.jars.packages={jar} "
                              "(spark-submit --packages …), and its credentials; docs/scale.md")
    if "TABLE_OR_VIEW_NOT_FOUND" in text:
        return StudyError("table not found in the Spark catalog", file=where, code="no_table",
                          fix="give a table the session can see (database.table), or a "
                              "study folder")
    return StudyError(f"Spark cannot read it: {_first_line(exc)}", file=where,
                      code="spark_read", fix="check the path, its permissions and the "
                                             "Spark configuration (docs/scale.md)")


def _read_text(spark, uri: str) -> str:
    try:
        rows = spark.read.text(uri, wholetext=True).collect()
    except Exception as exc:
        raise _spark_error(exc, uri) from None
    if not rows:
        raise StudyError("study manifest is empty", file=uri, code="manifest_missing")
    return rows[0][0]


def _check_schema(schema, where: str) -> set[str]:
    """The contract's schema checks on the schema Spark reads (file: the folder or table)."""
    from pyspark.sql import types as T

    ints = (T.LongType, T.IntegerType, T.ShortType, T.ByteType)
    ok_type = {"int64": lambda t: isinstance(t, ints),
               "string": lambda t: isinstance(t, T.StringType),
               "list<item: int64>": lambda t: isinstance(t, T.ArrayType)
               and isinstance(t.elementType, ints)}
    names = [f.name for f in schema.fields]
    bad = [(f.name, f.dataType.simpleString()) for f in schema.fields
           if f.name in C.EVENT_COLUMN_BY_NAME
           and not ok_type.get(str(C.EVENT_COLUMN_BY_NAME[f.name].dtype), lambda t: True)(
               f.dataType)]
    problems = ProblemList()
    present = schema_problems(where, names, bad, problems)
    problems.raise_if_errors()
    return present


def open_spark_study(path, *, spark=None, table: str | None = None) -> SparkStudy:
    """Open a study on Spark. ``path``: a study folder (local, ``file://`` or any URI Spark
    reads) or its study.yaml; with ``table``, the events are that catalog table and ``path``
    gives the manifest. ``spark``: a SparkSession, a master URL, or None (the active session,
    else ``local[*]``)."""
    if isinstance(path, SparkStudy):
        return path
    path = os.fspath(path)
    manifest_file = None
    if path.rstrip("/").endswith(C.MANIFEST_NAME):
        manifest_file, root = path, path.rstrip("/")[: -len(C.MANIFEST_NAME)].rstrip("/")
    else:
        root = path.rstrip("/")
    local = not _is_uri(root)
    files: tuple[str, ...] = ()
    text = None
    if local:
        # the checks of open_study, before Spark starts: same messages, exit 2
        lroot = local_path(root)
        if not lroot.exists():
            raise StudyError("study directory does not exist", file=str(lroot),
                             fix="pass the folder that holds study.yaml and events/",
                             code="no_study")
        problems = ProblemList()
        mpath = local_path(manifest_file) if manifest_file else lroot / C.MANIFEST_NAME
        manifest = parse_manifest(mpath, problems)
        problems.raise_if_errors()
        text = mpath.read_text(encoding="utf-8-sig")
        if table is None:
            event_files = find_event_files(lroot, problems)
            problems.raise_if_errors()
            present = check_parquet_files(event_files, problems)
            problems.raise_if_errors()
            missing = missing_runs(manifest.run_ids, event_files)
            if missing:
                raise StudyError(problems=[missing_runs_problem(
                    str(mpath), len(manifest.runs), missing, str(lroot / C.EVENTS_DIR))])
            files = tuple(p.resolve().as_uri() for p in event_files)
    if spark is None or isinstance(spark, str):
        spark = spark_session(spark if isinstance(spark, str) else None)
    if not local:
        mfile = manifest_file or f"{root}/{C.MANIFEST_NAME}"
        text = _read_text(spark, mfile)
        manifest = parse_manifest(mfile, text=text)
    try:
        if table is not None:
            df = spark.table(table)
            where = table
        elif local:
            df = spark.read.option("mergeSchema", "true").parquet(*files)
            where = str(local_path(root) / C.EVENTS_DIR)
        else:
            where = f"{root}/{C.EVENTS_DIR}"
            df = (spark.read.option("mergeSchema", "true")
                  .option("recursiveFileLookup", "true").option("pathGlobFilter", "*.parquet")
                  .parquet(where))
        schema = df.schema
    except StudyError:
        raise
    except Exception as exc:
        raise _spark_error(exc, table or root) from None
    if table is not None or not local:
        present = _check_schema(schema, where)
        try:
            files = tuple(df.inputFiles())
        except Exception:  # a table format without a file list
            files = ()
    token = f"s{next(_tokens)}_{os.getpid()}"
    raw = f"capplan_raw_{token}"
    events = f"capplan_events_{token}"
    df.createOrReplaceTempView(raw)
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {events} AS SELECT "
              f"{events_select(set(present), dialect=SPARK)} FROM {raw}")
    return SparkStudy(root=table or root, manifest=manifest, present_columns=frozenset(present),
                      spark=spark, events_view=events, token=token, manifest_text=text or "",
                      input_files=files)
