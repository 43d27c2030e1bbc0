"""Where the bundled notebooks, templates and demo studies live (works from any directory).

A wheel install ships copies inside the package; an editable install (``pip install -e .``)
finds them at the repository root beside it. The demo study and spec are what ``capplan
report`` and the notebooks use when given no study::

    import capplan
    study = capplan.open_study(capplan.demo_study_path())
    spec = capplan.load_plan_spec(capplan.default_spec_path())
"""

from __future__ import annotations

from pathlib import Path

from .errors import SpecError


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def bundled(rel: str) -> Path:
    """A bundled resource: inside the package (wheel installs ship copies there) or beside it
    at the repository root (editable installs). Independent of the working directory."""
    pkg = _package_dir()
    for base in (pkg, pkg.parent):
        p = base / rel
        if p.exists():
            return p
    raise SpecError(f"bundled resource {rel!r} not found next to the capplan package ({pkg})",
                    fix="install capplan from its repository with `pip install -e .`")


def notebooks_dir() -> Path:
    return bundled("notebooks")


def templates_dir() -> Path:
    return bundled("templates")


def demo_study_path() -> Path:
    """The bundled demo study (``capplan synth --preset demo --out data/sample``)."""
    try:
        return bundled("data/sample")
    except SpecError:
        raise SpecError("the bundled demo study data/sample is missing",
                        fix="regenerate it: capplan synth --preset demo --out data/sample "
                            "(from the repository root), or pass a STUDY directory") from None


def baseline_study_path() -> Path:
    """The bundled baseline for trying the comparison (``05-compare``, ``capplan report
    --baseline``): the demo's workload on an older serving build (data/baseline/README.md)."""
    try:
        return bundled("data/baseline")
    except SpecError:
        raise SpecError("the bundled baseline study data/baseline is missing",
                        fix="regenerate it as data/baseline/README.md says, or pass "
                            "--baseline STUDY") from None


def default_spec_path() -> Path:
    """The bundled plan spec (``templates/plan.yaml``)."""
    return bundled("templates/plan.yaml")
