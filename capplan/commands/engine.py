"""The engine options every command that reads a study's events shares (envelope,
summarize, plan, report): ``--engine duckdb|spark``, ``--spark-master``, ``--events-table``,
and DuckDB's ``--memory-limit`` / ``--temp-dir`` for a study bigger than memory
(docs/scale.md). ``@engine_options`` adds them and hands the command one ``Engine``."""

from __future__ import annotations

import functools
import gc
import importlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import click

from ..dialect import ENGINES
from ..errors import SpecError


@dataclass(frozen=True)
class Engine:
    """The chosen engine and its settings, as the command line gave them."""

    name: str = "duckdb"
    spark_master: str | None = None
    events_table: str | None = None
    memory_limit: str | None = None
    temp_dir: str | None = None

    def __post_init__(self):
        if self.name == "duckdb" and (self.spark_master or self.events_table):
            raise SpecError("--spark-master and --events-table need --engine spark",
                            field="--engine", fix="add --engine spark")
        if self.name == "spark" and (self.memory_limit or self.temp_dir):
            raise SpecError("--memory-limit and --temp-dir are DuckDB settings",
                            field="--engine", fix="give Spark its memory with its own "
                            "settings (spark-submit --driver-memory, spark.executor.memory)")

    @property
    def spark(self) -> bool:
        return self.name == "spark"

    @property
    def progress(self) -> bool:
        """A progress bar over runs, when stderr is a terminal."""
        return sys.stderr.isatty()

    def is_study(self, path) -> bool:
        """Whether ``path`` names a study this engine opens (a summary table is not one)."""
        if self.spark:
            return True
        p = Path(path)
        return not (p.is_file() and p.suffix in (".csv", ".parquet"))

    def open(self, path, *, checked: bool = False):
        """The study on this engine: a DuckDB ``Study`` (with the memory limit and spill
        folder), or a ``SparkStudy``. ``checked``: DuckDB's row-level checks first (for a
        Spark study only where it is on the local disk; remote ones get the schema
        checks)."""
        from ..study import connect, open_study
        from ..validate import open_checked

        if not self.spark:
            con = connect(memory_limit=self.memory_limit, temp_directory=self.temp_dir)
            return (open_checked if checked else open_study)(path, con=con)
        from ..sparkstudy import is_local, open_spark_study, spark_session

        if checked and self.events_table is None and is_local(str(path)):
            open_checked(path).con.close()
        return open_spark_study(path, spark=spark_session(self.spark_master),
                                table=self.events_table)


def engine_option(help_extra: str = ""):
    """``--engine duckdb|spark`` (also ``capplan report``'s, which takes only it and
    ``--spark-master``)."""
    return click.option("--engine", type=click.Choice(ENGINES), default="duckdb",
                        show_default=True,
                        help="reduce the events with DuckDB on this machine, or with Spark "
                             "(local or a cluster: docs/scale.md)" + help_extra)


def spark_master_option():
    """``--spark-master URL``."""
    return click.option("--spark-master", default=None,
                        help="with --engine spark: the master URL [default: the running "
                             "session's, else spark-submit's --master or spark-defaults.conf, "
                             "else local[*]]")


def engine_options(f):
    """Add the engine options to a click command; it receives ``engine: Engine``."""

    @functools.wraps(f)
    def wrapper(*args, engine, spark_master, events_table, memory_limit, temp_dir, **kw):
        return f(*args, engine=Engine(engine, spark_master, events_table, memory_limit,
                                      temp_dir), **kw)

    options = [
        engine_option(),
        spark_master_option(),
        click.option("--events-table", default=None,
                     help="with --engine spark: read the events from this catalog table; "
                          "STUDY then gives study.yaml"),
        click.option("--memory-limit", default=None,
                     help="DuckDB's memory limit, e.g. 4GB (it spills beyond it)"),
        click.option("--temp-dir", default=None, type=click.Path(file_okay=False),
                     help="DuckDB's spill folder [default: .tmp in the working directory]"),
    ]
    for o in reversed(options):
        wrapper = o(wrapper)
    return wrapper


class Preload:
    """A module imported on a thread while the command works on (``.module`` waits for it).

    `capplan envelope` needs the fit's modules (pandas, scipy.optimize for the isotonic fit:
    0.7–0.9 s of imports on one core) only after the reduction, whose own path imports
    neither (tests/test_cli_basic.py); importing them meanwhile starts the reduction ≈ 0.5 s
    sooner, and the reduction, whose two threads keep both cores busy, takes ≈ 0.3 s
    longer while it shares them with the imports (benchmarks/README.md, issue 29). Start it
    once the modules the two share are loaded (the caller's own imports first), so the
    threads never wait on each other's imports."""

    def __init__(self, name: str):
        self._name, self._got, self._error = name, None, None
        self._thread = threading.Thread(target=self._load, name=f"import {name}", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        # the import's objects (modules, classes, functions) live as long as the command:
        # no collection while they are made, and frozen after, so that later full
        # collections skip them (`capplan envelope` on 12 runs × 10^6 requests: the garbage
        # collector's time 0.23–0.25 → 0.03 s, benchmarks/README.md, issue 29)
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._got = importlib.import_module(self._name)
        except BaseException as exc:  # raised in the caller's thread by .module
            self._error = exc
        finally:
            gc.freeze()
            if collecting:
                gc.enable()

    @property
    def module(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._got
