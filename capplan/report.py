"""The main job: run notebooks 1–3 (and 5, the comparison, when given a baseline) with
papermill and publish an offline HTML report.

``render_report`` is the whole pipeline (the CLI is a thin wrapper):

1. open the study and load the plan spec *before* any kernel starts, so bad input fails fast
   (StudyError / SpecError → exit 2) and nothing is written;
2. execute each notebook with papermill in a kernel running this interpreter, parameters
   recorded in the executed notebook (``metadata.papermill.parameters``), seed fixed;
3. convert each executed notebook to HTML without code cells through the offline template
   (``templates/nbconvert/capplan_offline``): no require.js / MathJax / widget loader from a
   CDN, plotly.js inlined once per page, so every chart draws with the network blocked;
4. write ``index.html`` linking the pages and the plan export (CSV/XLSX, written by notebook 3
   through ``capplan.export``; with ``baseline`` also the comparison export written by notebook 5
   through ``capplan.export.export_comparison``), and ``report.json`` with the parameters and
   study hashes;
5. save each executed notebook under ``notebooks/`` *slimmed*: figures kept as plotly JSON
   (``application/vnd.plotly.v1+json``, drawn natively by JupyterLab), without the ~4.8 MB
   plotly.js bundle and the per-figure HTML copy that the pages already carry.

Everything is written into a temp directory beside ``--out`` and renamed into place at the
end: a failed run leaves the previous report (or nothing), never a half-written one. A failing
notebook raises :class:`ReportError` (exit 1) naming the notebook and the cell.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import sys
import time
from time import perf_counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .version import __version__
from .errors import CapplanError, SpecError
from .plan.inputs import BUILTIN_SLO
from .plan.spec import CapacitySpec
from .resources import (baseline_study_path, bundled, default_spec_path,  # noqa: F401
                        demo_study_path, notebooks_dir, templates_dir)

#: Notebooks of the static report, in page order: (file name, page title).
REPORT_NOTEBOOKS: tuple[tuple[str, str], ...] = (
    ("01-explore.ipynb", "Explore the study"),
    ("02-envelope.ipynb", "SLO capacity envelope"),
    ("03-plan.ipynb", "Capacity plan"),
    ("07-mix.ipynb", "Production mix, SLO classes, KV and power"),
)
#: The comparison page, added when the report is given a baseline study.
COMPARE_NOTEBOOK: tuple[str, str] = ("05-compare.ipynb", "Baseline vs candidate")
#: The twin page, added when the report is given a twin (capplan/twin; docs/twin.md).
TWIN_NOTEBOOK: tuple[str, str] = ("06-twin.ipynb", "Twin: measured vs simulated")
WHATIF_NOTEBOOK = "04-whatif.ipynb"
#: The timelines page, added when the study has system events (timeline/; docs/timeline.md).
TIMELINE_NOTEBOOK: tuple[str, str] = ("08-timelines.ipynb", "Timelines")
MIX_NOTEBOOK = "07-mix.ipynb"
PLAN_NOTEBOOK = "03-plan.ipynb"
#: The serving-policies page, added when the study stamps computed_input_tokens (its prefix
#: cache) or a sweeps file is given with a twin (docs/scenarios.md).
SCENARIOS_NOTEBOOK: tuple[str, str] = ("09-scenarios.ipynb", "Serving policies: prefix cache, prefill/decode, "
                                                             "admission")
#: The pages whose envelope reduction runs on the report's engine (``--engine spark``); the
#: others read the local study with DuckDB (docs/scale.md "capplan report on Spark").
ENGINE_NOTEBOOKS = ("02-envelope.ipynb", PLAN_NOTEBOOK)
MIN_COMPARE_REPS = 100  # capplan.compare refuses fewer bootstrap replicates
KERNEL_NAME = "capplan"
OFFLINE_TEMPLATE = "capplan_offline"
CELL_TIMEOUT_S = 900
#: the build folder's subfolder that holds the report kernels' connection files while they run
KERNEL_FILES_DIR = ".kernels"

Progress = Callable[[str], None]


class ReportError(CapplanError):
    """A notebook failed while the report rendered (exit code 1: the input was fine)."""

    exit_code = 1


# --------------------------------------------------------------------------------------------
# Kernel: a kernelspec that runs *this* interpreter
# --------------------------------------------------------------------------------------------

def _runs_this_python(argv0: str) -> bool:
    # jupyter_client replaces a bare python / python3 / python3.X with sys.executable
    bare = {"python", f"python{sys.version_info[0]}", "python%d.%d" % sys.version_info[:2]}
    if argv0 in bare:
        return True
    try:
        return Path(argv0).resolve() == Path(sys.executable).resolve()
    except OSError:
        return False


def ensure_kernel() -> str:
    """Name of a kernel that runs this interpreter (so the notebooks import this capplan).

    The native ``python3`` spec qualifies when it launches a bare ``python`` (jupyter_client
    maps that to sys.executable); otherwise a ``capplan`` kernelspec pointing at
    sys.executable is installed into sys.prefix (or the user's Jupyter dir when sys.prefix is
    read-only). Right after ``pip install -e .`` on a fresh machine the first case holds."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    for name in ("python3", KERNEL_NAME):
        try:
            spec = ksm.get_kernel_spec(name)
        except NoSuchKernel:
            continue
        if spec.argv and _runs_this_python(spec.argv[0]):
            return name
    from ipykernel.kernelspec import install

    kw = dict(kernel_name=KERNEL_NAME, display_name="Python (capplan)")
    try:
        install(prefix=sys.prefix, **kw)
    except OSError:
        install(user=True, **kw)
    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    if not (spec.argv and _runs_this_python(spec.argv[0])):
        raise ReportError(f"the Jupyter kernel {KERNEL_NAME!r} at {spec.resource_dir} runs "
                          f"{spec.argv[0]}, not this Python ({sys.executable}); remove it with "
                          f"`jupyter kernelspec remove {KERNEL_NAME}` and retry")
    return KERNEL_NAME


# --------------------------------------------------------------------------------------------
# HTML export
# --------------------------------------------------------------------------------------------

_CDN_SCRIPT = re.compile(r"<script[^>]*\bsrc=[\"']https?://[^\"']*[\"'][^>]*>\s*</script>",
                         re.IGNORECASE)


def strip_cdn_scripts(text: str) -> str:
    """Remove ``<script src="http...">`` tags (plotly's renderer adds a MathJax one per
    figure): a report must not wait on, or fail for, the network."""
    return _CDN_SCRIPT.sub("", text)


def _base_templates() -> list[str]:
    """nbconvert's own templates (``lab``, ``base``) under the base interpreter's prefix, where
    a venv made with ``--system-site-packages`` does not look (empty when not needed)."""
    base = Path(sys.base_prefix) / "share" / "jupyter" / "nbconvert" / "templates"
    if Path(sys.prefix) != Path(sys.base_prefix) and base.is_dir():
        return [str(base)]
    return []


def _offline_exporter():
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import Preprocessor

    class OfflinePreprocessor(Preprocessor):
        """Drops stderr streams (kernel warnings are not report content) and CDN scripts."""

        def preprocess_cell(self, cell, resources, index):
            if cell.get("cell_type") == "code":
                kept = []
                for out in cell.get("outputs", []):
                    if out.get("output_type") == "stream" and out.get("name") == "stderr":
                        continue
                    data = out.get("data")
                    if data and "text/html" in data:
                        data["text/html"] = strip_cdn_scripts(data["text/html"])
                    kept.append(out)
                cell["outputs"] = kept
            return cell, resources

    exporter = HTMLExporter(
        extra_template_basedirs=[str(templates_dir() / "nbconvert"), *_base_templates()],
        extra_template_paths=_base_templates(),
        template_name=OFFLINE_TEMPLATE,
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True,
    )
    exporter.register_preprocessor(OfflinePreprocessor(), enabled=True)
    return exporter


def notebook_to_html(nb, title: str, nav_html: str = "") -> str:
    """Self-contained HTML without code cells for one executed notebook."""
    import copy

    nb = copy.deepcopy(nb)
    nb.metadata["title"] = title
    body, _ = _offline_exporter().from_notebook_node(nb, resources={"capplan_nav": nav_html})
    return body


PLOTLY_MIME = "application/vnd.plotly.v1+json"
_PLOTLY_BUNDLE = re.compile(r"\*\s*plotly\.js v\d")  # the bundle's license banner


def slim_notebook(nb):
    """A copy of an executed notebook for saving beside the pages: every plotly figure kept
    once, as ``application/vnd.plotly.v1+json`` (JupyterLab draws it natively; a ``text/plain``
    line names it elsewhere), without the plotly.js bundle that the ``notebook`` renderer
    inlines into the first figure's cell (~4.8 MB) and without each figure's HTML copy (the
    same data again, inside a script). The HTML pages keep both: they are rendered from the
    full notebook."""
    import copy

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data is not None:
                if PLOTLY_MIME in data:
                    data.pop("text/html", None)
                    if "text/plain" not in data:
                        fig = data[PLOTLY_MIME] if isinstance(data[PLOTLY_MIME], dict) else {}
                        title = ((fig.get("layout") or {}).get("title") or {})
                        title = title.get("text", "") if isinstance(title, dict) else str(title)
                        data["text/plain"] = f"<plotly figure{': ' + title if title else ''}>"
                elif "text/html" in data and _PLOTLY_BUNDLE.search(data["text/html"]):
                    del data["text/html"]
                if not data:
                    continue  # the plotly.js loader output: nothing left to show
            kept.append(out)
        cell["outputs"] = kept
    return nb


# --------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------

def _first_line(source: str) -> str:
    for line in (source or "").splitlines():
        if line.strip():
            return line.strip()[:120]
    return ""


class NotebookInputError(ReportError):
    """capplan refused the notebook's input (a StudyError or SpecError raised in the kernel,
    e.g. a comparison of studies that do not offer the same workload): exit code 2, like the
    same error from the command line."""

    exit_code = 2


#: Exceptions that capplan raises for bad input (exit code 2 on the command line).
INPUT_ERRORS = frozenset({"StudyError", "SpecError", "TelemetryError"})


def _input_error_text(exc) -> str:
    """capplan's whole message (problem, field, fix) as the kernel's error handler printed it
    (``notebook.show_errors_plainly``); the bare exception value where the cell failed before
    the handler was installed."""
    from .notebook import INPUT_ERROR_HEAD

    lines = [re.sub(r"\x1b\[[0-9;]*m", "", x) for x in (exc.traceback or [])]
    for i, line in enumerate(lines):
        if line.endswith(INPUT_ERROR_HEAD):
            text = "\n".join(x for x in lines[i + 1:] if x.strip())
            if text:
                return text
    return f"ERROR: {exc.evalue}"


def execution_error(notebook: str, exc: Exception, watch=None) -> ReportError:
    """Turn a papermill/nbclient failure into a message naming the notebook and the cell.
    A capplan input error raised in the kernel becomes :class:`NotebookInputError` (exit 2)
    carrying capplan's own message."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError) and exc.ename in INPUT_ERRORS:
        where = f"cell {exc.cell_index}"
        if exc.exec_count is not None:
            where += f" (In [{exc.exec_count}])"
        err = NotebookInputError(f"{_input_error_text(exc)}\n  (raised by {exc.ename} in notebook "
                                 f"{notebook} at {where}; nothing was written)")
        err.notebook = notebook
        err.cell_index = exc.cell_index
        return err
    if isinstance(exc, PapermillExecutionError) and exc.ename == "WriteError":
        # a full disk met while a notebook writes into the report's temp folder: capplan's
        # one line (``errors.write_error``), exit 1; the previous report stays
        msg = str(exc.evalue)
    elif isinstance(exc, PapermillExecutionError):
        where = f"cell {exc.cell_index}"
        if exc.exec_count is not None:
            where += f" (In [{exc.exec_count}])"
        src = _first_line(exc.source)
        msg = (f"notebook {notebook} failed at {where}: {exc.ename}: {exc.evalue}"
               + (f"\n  cell starts: {src}" if src else ""))
    elif type(exc).__name__ == "CellTimeoutError" and watch is not None:
        msg = (f"notebook {notebook} timed out at {watch.where()}: no reply after "
               f"{time.monotonic() - watch.started:.0f} s (the cell timeout)")
    else:
        at = f" at {watch.where()}" if watch is not None and watch.cell_index is not None else ""
        msg = f"notebook {notebook} failed{at}: {type(exc).__name__}: {exc}"
    err = ReportError(msg)
    err.notebook = notebook
    err.cell_index = getattr(exc, "cell_index", None)
    if err.cell_index is None and watch is not None:
        err.cell_index = watch.cell_index
    return err


def execute_notebook(path: Path, parameters: dict, *, kernel: str | None = None,
                     cwd: Path | None = None, cell_timeout_s: float = CELL_TIMEOUT_S, say=None,
                     kernel_dir: Path | None = None):
    """Execute one notebook in memory with papermill; returns the executed NotebookNode.
    Raises ReportError naming the notebook and cell on failure. The kernel's replies are read
    by :mod:`capplan.nbexec`'s steady client (no lost wake-ups); a cell running over
    ``nbexec.LATE_S`` is reported through ``say`` (default: stderr), one that runs over
    ``cell_timeout_s`` fails the run with its name. ``kernel_dir``: where the kernel writes
    its connection file (default: the temp folder)."""
    import papermill as pm

    from .nbexec import CellWatch, SteadyKernelManager, kernel_manager_in

    kernel = kernel or ensure_kernel()
    watch = CellWatch(path.name, say=say)
    try:
        return pm.execute_notebook(
            str(path), None, parameters=parameters, kernel_name=kernel, progress_bar=False,
            log_output=False, execution_timeout=cell_timeout_s,
            request_save_on_cell_execute=False,
            # the kernel's working directory, set without papermill's cwd= (that chdirs this
            # whole process, which races when notebooks run in threads)
            resources={"metadata": {"path": str(cwd)}} if cwd else {},
            # the kernel's own log (TCP transport warning, shutdown noise) is not progress
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
            kernel_manager_class=kernel_manager_in(kernel_dir) if kernel_dir else SteadyKernelManager,
            **watch.hooks())
    except Exception as exc:  # noqa: BLE001 - a dead kernel or timeout is a notebook failure too
        raise execution_error(path.name, exc, watch) from None


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReportParams:
    """Everything a report depends on (recorded in report.json and in each notebook)."""

    study: Path
    spec: Path
    # a ReportParams built in Python has the defaults a spec without these keys has
    # (``resolve_params`` resolves them: capplan.plan.inputs)
    slo: str = BUILTIN_SLO
    seed: int = CapacitySpec.seed
    reps: int = CapacitySpec.reps
    confidence: float = CapacitySpec.confidence
    time: str = ""  # provenance time of the plan export (ISO, UTC)
    baseline: Path | None = None  # baseline study: adds the comparison page (candidate = study)
    gates: Path | None = None  # gates YAML of the comparison (None: templates/gates.yaml defaults)
    twin: Path | None = None  # twin.yaml: adds the twin page (06-twin); the mix page runs its target mix through it
    timelines: bool = False  # the study has system events: adds the timelines page
    notes: tuple[str, ...] = ()  # said out loud before the notebooks run (e.g. what --slo dropped)
    engine: str = "duckdb"  # reduction engine of the envelope and plan pages (ENGINE_NOTEBOOKS)
    spark_master: str | None = None  # with engine "spark": the master URL (None: Spark's default)

    def engine_text(self) -> str:
        """The provenance row's words for the reduction engine."""
        if self.engine != "spark":
            return "DuckDB, this machine"
        pages = " and ".join(_page_name(n) for n in ENGINE_NOTEBOOKS)
        return (f"Spark (master {self.spark_master or 'Spark default'}) for {pages}; "
                "DuckDB on this machine for the pages that read single requests")

    def provenance_rows(self, study_name: str, study_hash: str,
                        baseline: tuple[str, str] | None = None) -> tuple[tuple[str, str], ...]:
        """(label, value) rows of the index's provenance table."""
        rows = [("study", str(self.study)), ("study name", study_name), ("study sha256", study_hash)]
        if self.baseline is not None:
            rows += [("baseline study", str(self.baseline))]
            if baseline:
                rows += [("baseline name", baseline[0]), ("baseline sha256", baseline[1])]
            rows += [("gates", str(self.gates) if self.gates else "defaults")]
        if self.twin is not None:
            rows += [("twin", str(self.twin))]
        rows += [("plan spec", str(self.spec)), ("SLO", self.slo), ("confidence", f"{self.confidence:g}"),
                 ("bootstrap replicates", str(self.reps)), ("seed", str(self.seed)),
                 ("reduction engine", self.engine_text()),
                 ("provenance time", self.time), ("capplan", __version__)]
        return tuple(rows)
    #: plan with a lower bound the study cannot support honestly (the plan says so)
    accept_optimistic: bool = False
    cache: bool = False  # the study stamps computed_input_tokens: adds the serving-policies page (09)
    sweeps: Path | None = None  # sweeps file (with a twin): simulated on the serving-policies page

    def notebook_parameters(self, artifacts_dir: Path) -> dict:
        from .slo import SLO

        return {"study_path": str(self.study), "spec_path": str(self.spec),
                "slo": SLO.parse(self.slo).to_dict(), "seed": int(self.seed),
                "reps": int(self.reps), "confidence": float(self.confidence),
                "artifacts_dir": str(artifacts_dir), "report_time": self.time}

    def compare_parameters(self, artifacts_dir: Path) -> dict:
        """Notebook 5's parameters: the usual set (the study is the candidate) plus the
        baseline and gates."""
        return {**self.notebook_parameters(artifacts_dir), "baseline": str(self.baseline),
                "gates": str(self.gates) if self.gates else ""}

    def twin_parameters(self, artifacts_dir: Path) -> dict:
        """Notebook 6's parameters: the usual set plus the twin file."""
        return {**self.notebook_parameters(artifacts_dir), "twin_path": str(self.twin)}

    def engine_parameters(self) -> dict:
        """The engine parameters of the envelope and plan pages (``notebook.setup``)."""
        return {"engine": self.engine, "spark_master": self.spark_master or ""}

    def parameters_for(self, name: str, artifacts_dir: Path) -> dict:
        """Each notebook's parameters: the common ones plus what that page needs."""
        if name == COMPARE_NOTEBOOK[0]:
            return self.compare_parameters(artifacts_dir)
        # the twin page; the mix page runs its target mix through the twin too
        if name == TWIN_NOTEBOOK[0] or (name == MIX_NOTEBOOK and self.twin):
            return self.twin_parameters(artifacts_dir)
        p = self.notebook_parameters(artifacts_dir)
        if name in ENGINE_NOTEBOOKS:
            p.update(self.engine_parameters())
        if name == PLAN_NOTEBOOK:  # the plan may be told to accept an unsupported bound
            p["accept_optimistic"] = bool(self.accept_optimistic)
        if name in (TIMELINE_NOTEBOOK[0], SCENARIOS_NOTEBOOK[0]):  # simulated on the twin, if any
            p["twin_path"] = str(self.twin) if self.twin else ""
        if name == SCENARIOS_NOTEBOOK[0]:
            p["sweeps_path"] = str(self.sweeps) if self.sweeps else ""
        return p

    def notebooks(self) -> tuple[tuple[str, str], ...]:
        """(file name, page title) of the report's notebooks, in page order."""
        return (REPORT_NOTEBOOKS + ((COMPARE_NOTEBOOK,) if self.baseline else ())
                + ((TWIN_NOTEBOOK,) if self.twin else ())
                + ((TIMELINE_NOTEBOOK,) if self.timelines or self.twin else ())
                + ((SCENARIOS_NOTEBOOK,) if self.cache or self.sweeps else ()))


@dataclass(frozen=True)
class ReportResult:
    out_dir: Path
    index: Path
    pages: tuple[Path, ...]
    exports: tuple[Path, ...]
    seconds_by_notebook: dict = field(default_factory=dict)
    seconds_total: float = 0.0


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _page_name(nb_name: str) -> str:
    return nb_name.removesuffix(".ipynb") + ".html"


def _nav_html(current: str, notebooks=REPORT_NOTEBOOKS) -> str:
    links = ['<a href="index.html">Index</a>']
    for name, title in notebooks:
        page = _page_name(name)
        if page == current:
            links.append(f"<strong>{html.escape(title)}</strong>")
        else:
            links.append(f'<a href="{page}">{html.escape(title)}</a>')
    links.append('<a href="glossary.html">Glossary</a>')
    return " ".join(links)


def _now_utc() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def _open_baseline(baseline) -> Path:
    """Open the baseline study (so a bad one fails before any kernel starts); its problems are
    reported as the baseline's."""
    from dataclasses import replace

    from .errors import StudyError
    from .study import check_readable, open_study

    path = Path(baseline).expanduser().resolve()
    try:
        check_readable(open_study(path))
    except StudyError as exc:
        raise StudyError(problems=[replace(p, message=f"--baseline: {p.message}")
                                   for p in exc.problems]) from None
    return path


def _resolve_twin(twin) -> Path | None:
    """The twin file, read once so that a bad one fails before any kernel starts."""
    if not twin:
        return None
    from .twin import load_twin

    path = Path(twin).expanduser().resolve()
    load_twin(path)
    return path


def _resolve_sweeps(sweeps, twin) -> Path | None:
    """The sweeps file, read once (it needs a twin to run on)."""
    if not sweeps:
        return None
    if not twin:
        raise SpecError("--sweeps needs --twin (the sweeps run on the twin)", field="sweeps",
                        fix="add --twin twin.yaml (capplan twin fit), or drop --sweeps")
    from .twin.sweepfile import load_sweeps

    path = Path(sweeps).expanduser().resolve()
    load_sweeps(path)
    return path


def _check_engine(engine: str, spark_master: str | None, study) -> tuple[str, ...]:
    """The engine choice checked before any kernel starts (exit 2): a known engine, a
    master only with Spark, pyspark installed, and a study on this machine's disk (a remote
    one is read by the commands that take it). Returns the notes said out loud."""
    import importlib.util

    from .dialect import ENGINES
    from .sparkstudy import INSTALL_FIX, is_local

    if engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}", field="--engine",
                        fix="use " + " or ".join(ENGINES))
    if study and not is_local(str(study)):
        raise SpecError(f"capplan report reads a study on this machine's disk, not {study}",
                        field="STUDY",
                        fix="copy the study here (the pages that read single requests use "
                            "DuckDB), or reduce it where it is with capplan envelope, summarize "
                            "or plan STUDY --engine spark (they take s3a://, hdfs://, abfss:// "
                            "paths and --events-table; docs/scale.md)")
    if engine != "spark":
        if spark_master:
            raise SpecError("--spark-master needs --engine spark", field="--engine",
                            fix="add --engine spark")
        return ()
    if importlib.util.find_spec("pyspark") is None:
        raise SpecError("the Spark engine needs pyspark, which is not installed",
                        field="--engine", fix=INSTALL_FIX)
    pages = ", ".join(n.removesuffix(".ipynb") for n in ENGINE_NOTEBOOKS)
    return (f"--engine spark: the envelope and plan pages ({pages}) reduce the events on Spark "
            f"(master {spark_master or 'Spark default'}); the other pages read the local study "
            "with DuckDB",)


def _check_engine_parameter(nb_dir: Path) -> None:
    """A notebook of ``ENGINE_NOTEBOOKS`` without an ``engine`` parameter (an older copy in
    ``--notebooks``) would silently reduce on DuckDB: refuse it (exit 2)."""
    import papermill

    for name in ENGINE_NOTEBOOKS:
        if "engine" not in papermill.inspect_notebook(str(nb_dir / name)):
            raise SpecError(f"{name} has no engine parameter, so it cannot reduce on Spark",
                            file=str(nb_dir / name), field="--engine",
                            fix="add engine and spark_master to its parameters cell and pass "
                                "them to notebook.setup (as the bundled notebook does), or drop "
                                "--engine spark")


def resolve_params(study=None, spec=None, *, slo=None, seed=None, reps=None, confidence=None,
                   time: str | None = None, baseline=None, gates=None, twin=None,
                   accept_optimistic: bool = False, sweeps=None, engine: str = "duckdb",
                   spark_master: str | None = None):
    """Check every input before a kernel starts; returns (ReportParams, opened Study).
    SLO, reps, seed and confidence are resolved as ``capplan plan`` resolves them
    (``capplan.plan.inputs``: given, else the spec's ``slo`` / ``capacity.*``), so ``capplan
    plan`` and ``capplan report`` with one spec give one plan; a spec without an SLO gets
    capplan's default, said before the notebooks run. ``baseline`` (a study
    directory) adds the comparison; ``gates`` (YAML) sets its gates. ``engine`` ("duckdb" or
    "spark", with ``spark_master``) reduces the envelope and plan pages' events
    (``ENGINE_NOTEBOOKS``); the study must be on this machine's disk (plain or ``file://``)
    either way. Raises StudyError / SpecError (exit 2)."""
    from .plan import gpus_per_group, load_plan_spec
    from .plan.inputs import resolve_inputs
    from .sparkstudy import local_path
    from .study import check_readable, open_study

    engine_notes = _check_engine(engine, spark_master, study)
    study_path = local_path(str(study)).resolve() if study else demo_study_path()
    opened = open_study(study_path)
    check_readable(opened)  # every page, before the kernels: a corrupt file fails in 0.3 s, not 18
    spec_path = Path(spec).expanduser().resolve() if spec else default_spec_path()
    if not spec_path.is_file():
        raise SpecError("plan spec not found", file=str(spec_path),
                        fix="pass --spec PATH to a plan YAML (see templates/plan.yaml)")
    plan_spec = load_plan_spec(spec_path)
    gpus_per_group(plan_spec, opened)  # a spec that disagrees with the study fails here, not in a kernel
    inputs = resolve_inputs(plan_spec, slo=slo or None, reps=reps, seed=seed, confidence=confidence)
    notes = inputs.notes + engine_notes
    slo_obj, reps, seed, confidence = inputs.slo, inputs.reps, inputs.seed, inputs.confidence
    if time:
        import datetime as dt

        try:
            dt.datetime.fromisoformat(time)
        except ValueError:
            raise SpecError(f"time {time!r} is not an ISO timestamp", field="time",
                            fix="e.g. 2026-01-01T00:00:00+00:00") from None
    baseline_path = gates_path = None
    if gates and not baseline:
        raise SpecError("--gates needs --baseline (the gates judge the comparison)",
                        field="gates", fix="add --baseline BASELINE_STUDY, or drop --gates")
    if baseline:
        baseline_path = _open_baseline(baseline)
        if reps < MIN_COMPARE_REPS:
            raise SpecError(f"--reps must be ≥ {MIN_COMPARE_REPS} with --baseline (the "
                            f"comparison's bootstrap), got {reps}", field="reps",
                            fix=f"e.g. --reps {max(MIN_COMPARE_REPS, 200)}")
        if gates:
            from .compare import load_gates

            gates_path = Path(gates).expanduser().resolve()
            if not gates_path.is_file():
                raise SpecError("gates file not found", file=str(gates_path), field="gates",
                                fix="pass --gates PATH to a gates YAML (see templates/gates.yaml)")
            load_gates(gates_path)  # a bad gates file fails here, not in the kernel
    params = ReportParams(study=study_path, spec=spec_path, slo=str(slo_obj), seed=seed,
                          reps=reps, confidence=confidence, time=time or _now_utc(),
                          baseline=baseline_path, gates=gates_path, twin=_resolve_twin(twin),
                          timelines=bool(opened.timeline_files), notes=notes,
                          accept_optimistic=bool(accept_optimistic),
                          cache=opened.has("computed_input_tokens"), sweeps=_resolve_sweeps(sweeps, twin),
                          engine=engine, spark_master=spark_master or None)
    return params, opened


def _execute_all(nb_dir: Path, runs: list[tuple[str, dict]], *, kernel: str, cwd: Path,
                 jobs: int, say: Progress, seconds: dict, kernel_dir: Path | None = None) -> list:
    """Execute the report notebooks ``runs`` = [(file name, parameters)] in page order,
    ``jobs`` at a time, printing progress as each starts and ends. Returns the executed
    notebooks in page order. On failure, notebooks not started yet are skipped, and the first
    bad-input error (exit 2), else the first failure in page order, is raised."""
    import threading
    from concurrent.futures import ThreadPoolExecutor, as_completed

    n = len(runs)
    lock = threading.Lock()

    def tell(msg: str) -> None:
        with lock:
            say(msg)

    def run(i: int, name: str, parameters: dict):
        tell(f"[{i}/{n}] {name}: running …")
        t0 = perf_counter()
        try:
            nb = execute_notebook(nb_dir / name, parameters, kernel=kernel, cwd=cwd, say=tell,
                                  kernel_dir=kernel_dir)
        except ReportError:
            tell(f"[{i}/{n}] {name}: FAILED after {perf_counter() - t0:.1f} s")
            raise
        seconds[name] = perf_counter() - t0
        tell(f"[{i}/{n}] {name}: done in {seconds[name]:.1f} s")
        return nb

    from .nbexec import rescued

    rescued_before = rescued()
    with ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        futures = [pool.submit(run, i, name, parameters)
                   for i, (name, parameters) in enumerate(runs, 1)]
        for f in as_completed(futures):
            if f.exception() is not None:
                for g in futures:
                    g.cancel()  # those not started yet: the report fails anyway
                break
    late = rescued() - rescued_before
    if late:  # said, not hidden: each cost at most a second (capplan.nbexec)
        say(f"note: {late} kernel repl{'y was' if late == 1 else 'ies were'} found by the one-second "
            "re-check, not by zmq's wake-up (a busy machine; docs/report.md, \"Lost wake-ups\")")
    errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
    if errors:
        raise next((e for e in errors if getattr(e, "exit_code", 1) == 2), errors[0])
    return [f.result() for f in futures]


def check_out_dir(out_dir: Path) -> None:
    """The report replaces ``out_dir`` as a whole, so it must be new, empty, or an earlier
    report (has report.json): ``io.check_out``."""
    from .io import check_out

    check_out(out_dir, "report.json", "report")


def default_out_dir(study_name: str) -> Path:
    """``reports/<study-name>`` under the current directory."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", study_name).strip("-.") or "study"
    return Path.cwd() / "reports" / safe


def render_report(study=None, *, spec=None, out=None, slo: str | None = None,
                  seed: int | None = None, reps: int | None = None,
                  confidence: float | None = None, time: str | None = None,
                  notebooks: Path | None = None, jobs: int | None = None,
                  baseline=None, gates=None, twin=None, command: list[str] | None = None, sweeps=None,
                  accept_optimistic: bool = False, engine: str = "duckdb",
                  spark_master: str | None = None,
                  progress: Progress | None = _stderr) -> ReportResult:
    """Render the report (see the module docstring). SLO/seed/reps/confidence default to the
    spec's; ``time`` (ISO) is the provenance time of the plan and comparison exports (default:
    now, UTC); ``notebooks`` overrides the folder the report notebooks are read from; ``jobs``
    notebooks run at once (default: all; each in its own kernel; they share nothing but the
    inputs). ``baseline`` (a study directory) adds the comparison page (05-compare: ``study``
    is the candidate) and its export under ``data/compare``; ``gates`` is its gates YAML. The
    comparison's verdict is shown, it does not fail the report; studies that cannot be
    compared (different offered workload or SLO) raise NotebookInputError (exit 2).
    When several notebooks fail, a bad-input error (exit 2) is reported first, else the first
    in page order. ``twin`` (twin.yaml) adds the twin page (06-twin: the twin's parameters and
    its check against the study, check.json under data/twin). The serving-policies page
    (09-scenarios) is added when the study stamps ``computed_input_tokens`` (its measured
    prefix cache) or ``sweeps`` (a sweeps file, with ``twin``) asks for simulated ones.
    ``command`` (the argv that asked for the report) goes into the provenance bundle and
    reproduce.md. ``engine`` ("duckdb" or "spark") and ``spark_master``: where the envelope
    and plan pages reduce the events (the same numbers either way; docs/scale.md)."""
    from .glossary import glossary_html, link_terms
    from .io import atomic_dir
    from .present import json_text
    from .provenance import write_bundle
    from .report_index import IndexInputs, index_html, read_dynamics, read_mix_record, read_records

    t_start = perf_counter()
    say = progress or (lambda _msg: None)
    params, opened = resolve_params(study, spec, slo=slo, seed=seed, reps=reps,
                                    confidence=confidence, time=time, baseline=baseline,
                                    gates=gates, twin=twin, accept_optimistic=accept_optimistic,
                                    sweeps=sweeps, engine=engine, spark_master=spark_master)
    report_nbs = params.notebooks()
    nb_dir = Path(notebooks) if notebooks else notebooks_dir()
    missing = [n for n, _ in report_nbs if not (nb_dir / n).is_file()]
    if missing:
        raise SpecError(f"notebook(s) missing: {', '.join(missing)}", file=str(nb_dir))
    if params.engine == "spark":
        _check_engine_parameter(nb_dir)
    out_dir = Path(out).expanduser().resolve() if out else default_out_dir(opened.name)
    check_out_dir(out_dir)
    study_hash = opened.content_hash()
    base_info = None
    if params.baseline is not None:
        from .study import open_study

        base_study = open_study(params.baseline)
        base_info = (base_study.name, base_study.content_hash())
    kernel = ensure_kernel()
    import nbformat

    seconds: dict[str, float] = {}
    pages: list[tuple[str, str]] = []
    from .slo import SLO

    say(f"capplan report: study {opened.name} ({params.study}); "
        + (f"baseline {base_info[0]} ({params.baseline}); " if base_info else "")
        + f"SLO: {SLO.parse(params.slo).describe()}; seed {params.seed}, reps {params.reps}; "
        f"→ {out_dir}")
    for note in params.notes:
        say(f"note: {note}")
    with atomic_dir(out_dir) as tmp:
        (tmp / "notebooks").mkdir()
        (tmp / "data").mkdir()
        data = tmp / "data"
        runs = [(name, params.parameters_for(name, data)) for name, _title in report_nbs]
        # the kernels' connection files live in the build folder: a killed report leaves
        # them there, and the next run removes that folder (docs/report.md, "Killed runs")
        kernel_dir = tmp / KERNEL_FILES_DIR
        kernel_dir.mkdir()
        executed = _execute_all(nb_dir, runs, kernel=kernel, cwd=tmp, jobs=jobs or len(runs),
                                say=say, seconds=seconds, kernel_dir=kernel_dir)
        shutil.rmtree(kernel_dir, ignore_errors=True)  # each kernel removed its own file
        for (name, title), nb in zip(report_nbs, executed):
            # the pages carry plotly.js; the saved notebooks keep each figure once, as JSON
            nbformat.write(slim_notebook(nb), str(tmp / "notebooks" / name))
            page = _page_name(name)
            (tmp / page).write_text(link_terms(notebook_to_html(nb, f"{title} — {opened.name}",
                                                                _nav_html(page, report_nbs))),
                                    encoding="utf-8")
            pages.append((page, title))
        (tmp / "glossary.html").write_text(glossary_html(f"Glossary — {opened.name}"), encoding="utf-8")
        exports = sorted(str(p.relative_to(tmp)) for p in data.rglob("*") if p.is_file())
        info = IndexInputs(study_name=opened.name, study_hash=study_hash, pages=tuple(pages),
                           exports=tuple(exports), parameters=params.provenance_rows(
                               opened.name, study_hash, base_info), baseline=params.baseline is not None)
        (tmp / "index.html").write_text(index_html(info, *read_records(data), mix=read_mix_record(data),
                                                   dynamics=read_dynamics(data)), encoding="utf-8")
        meta = {"capplan": __version__, "study": str(params.study), "study_name": opened.name,
                "study_sha256": study_hash, "spec": str(params.spec), "slo": params.slo,
                "seed": params.seed, "reps": params.reps, "confidence": params.confidence,
                "time": params.time, "engine": params.engine, "spark_master": params.spark_master,
                "notes": list(params.notes), "command": command or [],
                "pages": [p for p, _ in pages], "exports": exports}
        if params.twin is not None:
            import hashlib

            meta.update({"twin": str(params.twin),
                         "twin_sha256": hashlib.sha256(params.twin.read_bytes()).hexdigest()})
        if base_info:
            meta.update({"baseline": str(params.baseline), "baseline_name": base_info[0],
                         "baseline_sha256": base_info[1],
                         "gates": str(params.gates) if params.gates else None})
        json_text(meta, tmp / "report.json")
        inputs = [params.study, params.spec] + [x for x in (params.baseline, params.gates, params.twin)
                                                if x is not None]
        write_bundle(tmp, inputs=inputs, command=command, study=params.study, study_hash=study_hash,
                     spec=params.spec, time=params.time, baseline=params.baseline,
                     report_dir=out_dir, pages=tuple(p for p, _ in pages))
    total = perf_counter() - t_start
    say(f"report written in {total:.1f} s")
    return ReportResult(out_dir=out_dir, index=out_dir / "index.html",
                        pages=tuple(out_dir / p for p, _ in pages),
                        exports=tuple(out_dir / x for x in exports),
                        seconds_by_notebook=seconds, seconds_total=total)


def whatif_env(study: Path) -> dict:
    """Environment for a Voila process serving the what-if notebook on ``study`` (in a venv made
    with ``--system-site-packages``, Voila's and nbconvert's templates under the base
    interpreter's prefix are added to JUPYTER_PATH, where Voila would not look)."""
    env = dict(os.environ)
    env["CAPPLAN_STUDY"] = str(study)
    base = Path(sys.base_prefix) / "share" / "jupyter"
    if Path(sys.prefix) != Path(sys.base_prefix) and base.is_dir():
        env["JUPYTER_PATH"] = os.pathsep.join([p for p in (env.get("JUPYTER_PATH"), str(base)) if p])
    return env
