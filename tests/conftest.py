"""Shared test fixtures: tiny study directories written through capplan.io.write_study.

Use ``make_study`` (a fixture returning a factory) in any test:

    def test_x(make_study):
        path = make_study(events_df, runs=[{"run_id": "r1", "offered_rps": 2.0}])
        study = open_study(path)

``events`` may be a pandas frame, a list of row dicts, or {relative file name: frame} to
split over several parquet files. ``runs`` defaults to one open-loop run per run_id found in
the events, at offered_rps 1.0. ``timeline`` (a frame or row dicts) is written to
timeline/timeline.parquet. Extra keyword arguments go into study.yaml. ``ev(...)`` builds
one event row with sensible defaults, so a test only states the fields it is about.
"""

from __future__ import annotations

import copy
import itertools

import pandas as pd
import pytest

from capplan.io import manifest_dict, write_study

_counter = itertools.count()


def ev(run_id: str = "r1", request_id: str | None = None, *, scheduled_ms: float = 0.0,
       ttft_ms: float | None = 100.0, e2e_ms: float | None = 1000.0, sent_ms: float | None = None,
       input_tokens: int = 100, output_tokens: int = 10, status: str = "ok", **extra) -> dict:
    """One event row; times in ms relative to the run start, converted to int64 ns."""
    ms = 1_000_000
    sched = int(round(scheduled_ms * ms))
    row = {
        "run_id": run_id,
        "request_id": request_id if request_id is not None else f"q{next(_counter)}",
        "scheduled_ns": sched,
        "sent_ns": int(round((sent_ms if sent_ms is not None else scheduled_ms) * ms)),
        "first_token_ns": None if ttft_ms is None else sched + int(round(ttft_ms * ms)),
        "last_token_ns": None if e2e_ms is None else sched + int(round(e2e_ms * ms)),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "status": status,
    }
    row.update(extra)
    return row


def fixed_service_raw(replicas: int = 3, *, arrival: str = "poisson", timeout_s: float = 300.0,
                      rates=(1.0,), duration_s: float = 60.0, warmup_s: float = 0.0) -> dict:
    """A synth config (YAML mapping) with deterministic service — fixed 128-token prompts and
    64-token answers, batch ≤ 16, no queue limit, no ITL lists or power — for the fleet,
    fluid and timeline tests."""
    from capplan.sim.config import PRESETS

    raw = copy.deepcopy(PRESETS["small"])
    raw["system"]["replicas"] = replicas
    raw["replica"].update({"max_batch": 16, "queue_limit": None, "kv_blocks": 20000})
    raw["workload"] = {"arrival": {"process": arrival},
                       "lengths": {"kind": "fixed", "input": 128, "output": 64}}
    raw["client"] = {"timeout_s": timeout_s}
    raw["power"] = None
    raw["output"] = {"itl": False}
    raw["sweep"] = {"load_model": "open", "rates": list(rates), "duration_s": duration_s,
                    "warmup_s": warmup_s}
    return raw


def events_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows to a frame with nullable int64 time columns (None stays null in parquet)."""
    df = pd.DataFrame(rows)
    for c in df.columns:
        if c.endswith("_ns") and c != "itl_ns" or c in ("input_tokens", "output_tokens",
                                                         "computed_input_tokens",
                                                         "max_output_tokens"):
            df[c] = df[c].astype("Int64")
    return df


@pytest.fixture
def make_study(tmp_path):
    """Factory: make_study(events, runs=None, *, name="t", load_model="open", dest=None,
    **manifest_extra) -> Path of a new study directory under tmp_path."""
    made = itertools.count()

    def _make(events, runs: list[dict] | None = None, *, name: str = "t",
              load_model: str = "open", dest=None, timeline=None, **manifest_extra):
        if isinstance(events, list):
            events = events_frame(events)
        if runs is None:
            frames = events.values() if isinstance(events, dict) else [events]
            ids = []
            for f in frames:
                for r in pd.Series(f["run_id"]).dropna().unique():
                    if r not in ids:
                        ids.append(r)
            key = "concurrency" if load_model == "closed" else "offered_rps"
            runs = [{"run_id": str(r), key: 1 if load_model == "closed" else 1.0} for r in ids]
        manifest = manifest_dict(name, runs, load_model=load_model, **manifest_extra)
        path = dest if dest is not None else tmp_path / f"study{next(made)}"
        if isinstance(timeline, list):
            timeline = pd.DataFrame(timeline)
        return write_study(path, manifest, events, timeline=timeline)

    return _make


def need_spark() -> None:
    """Skip the calling test, with the reason, when pyspark or a Java runtime is missing (CI
    installs both: .ci/run)."""
    import shutil

    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[test]')")
    if shutil.which("java") is None and not __import__("os").environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (Debian: apt-get install openjdk-17-jre-headless)")


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for every Spark test (2 threads, 2 shuffle partitions, no UI):
    starting the JVM takes seconds, a query on a small study well under one. Skipped with a
    reason when pyspark or a Java runtime is missing (``need_spark``)."""
    need_spark()
    from capplan.sparkstudy import spark_session

    session = spark_session("local[2]", conf={
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
        "spark.ui.enabled": "false", "spark.sql.adaptive.enabled": "false",
        "spark.driver.memory": "1g"})
    yield session
    session.stop()


PEERS_VENV_DEFAULT = "~/.cache/capplan/peers/aiperf-0.13.0_guidellm-0.8.1"


@pytest.fixture(scope="session")
def peer_tools():
    """The bin directory of the venv with the real load tools (AIPerf 0.13.0, GuideLLM 0.8.1;
    made by scripts/peer_tools.sh, which also puts a tiny tokenizer in <venv>/tokenizer).
    ``CAPPLAN_PEERS_VENV`` names the venv; default the script's cache path. When the venv is
    absent (no ``.complete`` marker) the test is skipped, but fails under CI (env ``CI`` set)
    so CI cannot skip it silently."""
    import os
    from pathlib import Path

    venv = Path(os.environ.get("CAPPLAN_PEERS_VENV") or PEERS_VENV_DEFAULT).expanduser()
    bin_dir = venv / "bin"
    missing = [str(p) for p in (venv / ".complete", bin_dir / "aiperf", bin_dir / "guidellm")
               if not p.exists()]
    if missing:
        msg = (f"peer load tools not installed ({', '.join(missing)} missing): run "
               "scripts/peer_tools.sh, or set CAPPLAN_PEERS_VENV to its venv")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return bin_dir


@pytest.fixture(scope="session")
def llama_engine():
    """The real engine's build (tests/realtools/llama.py: llama-server and the tiny model, made
    by scripts/real_engine.sh in its cache directory, ``CAPPLAN_LLAMA_DIR`` overriding the root).
    When absent (no ``.complete`` marker) the test is skipped with the command to run, but fails
    under CI (env ``CI`` set), which builds it first (.ci/run), so CI cannot skip it silently."""
    import os

    from tests.realtools import llama

    engine = llama.locate()
    if engine is None:
        msg = (f"llama-server build not found ({', '.join(llama.missing())} missing): run "
               "scripts/real_engine.sh (one-time, ~12.5 CPU-minutes; needs cmake, g++, ninja)")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return engine


@pytest.fixture
def llama_server(llama_engine, tmp_path):
    """A running llama-server (16 slots, one thread) on a free port, stopped after the test;
    its log in tmp_path/llama-server.log."""
    from tests.realtools import llama

    srv = llama.start(llama_engine, log_path=tmp_path / "llama-server.log")
    try:
        yield srv
    finally:
        llama.stop(srv)


@pytest.fixture(scope="session")
def libreoffice():
    """LibreOffice headless and poppler's PDF tools, for the tests that print the workbook
    (tests/test_export_print.py): ``soffice``, ``pdftohtml``, ``pdfinfo`` and a font with
    Arial's metrics (Liberation Sans, or Arial itself) — the workbook's font. When one is
    missing the test is skipped with the packages to install, but fails under CI (env ``CI``
    set), which installs them (.ci/run), so CI cannot skip it silently."""
    import os
    import shutil
    import subprocess

    missing = [t for t in ("soffice", "pdftohtml", "pdfinfo") if shutil.which(t) is None]
    if shutil.which("fc-match") is not None:
        family = subprocess.run(["fc-match", "-f", "%{family}", "Arial"], capture_output=True, text=True).stdout
        if "Liberation Sans" not in family and "Arial" not in family:
            missing.append(f"a font with Arial's metrics (Arial is printed in {family or 'nothing'})")
    if missing:
        msg = (f"printing the workbook needs {', '.join(missing)}: apt-get install libreoffice-calc-nogui "
               "poppler-utils fonts-liberation")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return shutil.which("soffice")
