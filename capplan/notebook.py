"""What every capplan notebook does first, in one call, so the notebooks stay thin and print
the same numbers as ``capplan report``, ``capplan plan`` and the what-if panel.

``setup`` resolves the inputs exactly as the command line does — study (default: the bundled
demo), plan spec (default: templates/plan.yaml), and the SLO, bootstrap replicates, seed and
confidence from the spec unless the notebook's parameters set them (``capplan.plan.inputs``; a
default that changes a number is a note in ``header()``) — sets plotly's renderer
(figures draw in JupyterLab, survive papermill and draw offline in HTML), and makes capplan's
input errors show as the command line prints them (what is wrong, the file or field, the fix)
instead of a traceback::

    from capplan import notebook
    nb = notebook.setup(study_path=study_path, spec_path=spec_path, slo=slo, seed=seed,
                        reps=reps, confidence=confidence)
    nb.study, nb.spec, nb.slo, nb.reps, nb.seed, nb.confidence   # nb.spec: these written in

The envelope and plan notebooks also take ``engine`` / ``spark_master`` (``capplan report
--engine spark``) and fit with ``nb.envelope()``: the study's events are then reduced on Spark
(the same statistics, hence the same envelope with the same seed; docs/scale.md), while
``nb.study`` stays the local DuckDB study for what reads single requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from .errors import CapplanError, SpecError
from .resources import default_spec_path, demo_study_path
from .slo import SLO

if TYPE_CHECKING:  # imported when resolve runs: a notebook's first cell stays light
    from .plan.inputs import PlanInputs


@dataclass(frozen=True)
class Inputs:
    """A notebook's resolved inputs."""

    study: object
    spec: object
    slo: SLO
    seed: int
    reps: int
    confidence: float
    spec_path: Path
    engine: str = "duckdb"  # where envelope() reduces the events: "duckdb" or "spark"
    spark_master: str | None = None  # with "spark": the master URL (None: Spark's default)
    #: every input with where it came from; ``spec`` above is its spec, the resolved SLO and
    #: bootstrap written in
    resolved: "PlanInputs | None" = None

    def header(self) -> str:
        """'**Study** `name` (13 runs, open loop) · **SLO** …' (markdown)."""
        st = self.study
        on = (f" · statistics reduced on Spark (master {self.spark_master or 'Spark default'})"
              if self.engine == "spark" else "")
        notes = "".join(f"  \n**Note**: {n}" for n in (self.resolved.notes if self.resolved else ()))
        return (f"**Study** `{st.name}` ({len(st.manifest.runs)} runs, {st.load_model} loop) · "
                f"**SLO** {self.slo.describe()} · bootstrap: {self.reps} replicates, seed {self.seed}"
                + on + notes)

    def stats(self):
        """The study reduced for the SLO on Spark (``reduce_study``), or None on DuckDB
        (``fit_envelope`` then reduces the study itself)."""
        if self.engine != "spark":
            return None
        from .reduce import reduce_study
        from .sparkstudy import open_spark_study, spark_session

        study = open_spark_study(self.study.root, spark=spark_session(self.spark_master))
        return reduce_study(study, self.slo)

    def envelope(self):
        """The study's SLO capacity envelope with these inputs (SLO, confidence, reps, seed),
        reduced on the chosen engine."""
        from .envelope import fit_envelope

        return fit_envelope(self.study, self.slo, confidence=self.confidence, reps=self.reps,
                            seed=self.seed, stats=self.stats())


def resolve(study_path=None, spec_path=None, slo=None, *, seed=None, reps=None, confidence=None,
            accept_optimistic=False, engine=None, spark_master=None) -> Inputs:
    """Open the study and spec; SLO, reps, seed and confidence are resolved as the command line
    resolves them (``capplan.plan.inputs``: given, else the spec's, else capplan's default, said
    in ``notes``), so a notebook run by hand shows the report's numbers. A notebook parameter's
    "not set" — empty, None, 0, False or a negative value — means "the spec's" (``accept_optimistic``
    True plans on a bound the sweep cannot support, as ``--accept-optimistic``). ``engine``:
    "duckdb" (default, also for empty) or "spark", with ``spark_master``."""
    from .dialect import ENGINES
    from .plan.inputs import resolve_inputs
    from .study import open_study

    study = open_study(study_path or demo_study_path())
    spec_file = Path(spec_path) if spec_path else default_spec_path()
    inputs = resolve_inputs(spec_file, slo=slo or None,
                            seed=None if seed is None or seed < 0 else int(seed),
                            reps=None if not reps or reps <= 0 else int(reps),
                            confidence=None if not confidence or confidence <= 0 else float(confidence),
                            accept_optimistic=True if accept_optimistic else None, option_prefix="")
    engine = engine or "duckdb"
    if engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}", field="engine",
                        fix="use " + " or ".join(ENGINES))
    return Inputs(study=study, spec=inputs.spec, slo=inputs.slo, seed=inputs.seed, reps=inputs.reps,
                  confidence=inputs.confidence, spec_path=spec_file, engine=engine,
                  spark_master=spark_master or None, resolved=inputs)


#: the first traceback line of a capplan input error shown in a notebook (``capplan.report``
#: reads the formatted message after it back out of the failed cell)
INPUT_ERROR_HEAD = "capplan could not use this input"


def show_errors_plainly(shell=None) -> None:
    """In IPython, show a capplan input error (StudyError, SpecError, …) as the command line
    prints it — the problem, the file or field, the fix — instead of a traceback. The cell
    still fails (papermill and ``capplan report`` see the error)."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
    if shell is None:
        return

    def handler(self, etype, value, tb, tb_offset=None):
        text = value.format() if isinstance(value, CapplanError) else str(value)
        stb = [f"{etype.__name__}: {INPUT_ERROR_HEAD}", *text.splitlines()]
        self._showtraceback(etype, value, stb)
        return stb

    shell.set_custom_exc((CapplanError,), handler)


def setup(*, study_path: str = "", spec_path: str = "", slo=None, seed: int = -1, reps: int = 0,
          confidence: float = 0.0, accept_optimistic: bool = False, engine: str = "",
          spark_master: str = "") -> Inputs:
    """Error display and plotly renderer, then :func:`resolve` (see the module docstring)."""
    import plotly.io as pio

    show_errors_plainly()
    # mimetype for JupyterLab, inline HTML (plotly.js once per page) for papermill and offline HTML
    pio.renderers.default = "plotly_mimetype+notebook"
    return resolve(study_path or None, spec_path or None, slo or None, seed=seed, reps=reps,
                   confidence=confidence, accept_optimistic=accept_optimistic, engine=engine,
                   spark_master=spark_master)


#: where `capplan whatif` collects the pre-heated kernels' "page ready" marks
READY_DIR_ENV = "CAPPLAN_READY_DIR"


def app_ready() -> None:
    """The what-if page's last call: tells `capplan whatif` that this kernel has run the whole
    page (a pre-heated kernel is ready for a visitor), so the URL is printed only when the
    first visitors will not wait. Does nothing outside the app."""
    d = os.environ.get(READY_DIR_ENV)
    if d and Path(d).is_dir():
        Path(d, f"kernel-{os.getpid()}").touch()
