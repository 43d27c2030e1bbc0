"""Provenance bundle of a report: enough to check, and redo, every number in it.

``write_bundle`` writes into the report folder:

- ``provenance/inputs.sha256``   sha256 of every file of the study (and baseline) and the spec,
  in ``sha256sum`` format (``sha256sum -c`` checks them from the folder the paths name);
- ``provenance/outputs.sha256``  sha256 of every file the report wrote (pages, notebooks,
  exports), relative to the report folder (``cd REPORT && sha256sum -c provenance/outputs.sha256``);
- ``provenance/environment.json`` capplan version, the git commit (and whether the checkout had
  uncommitted changes) when capplan runs from a checkout, Python and the versions of the
  packages the numbers depend on, the platform, the exact command;
- ``reproduce.md``              the steps and the command that regenerate the report.

Pure file reads and hashing; no network.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from .version import __version__

#: the packages whose versions go into environment.json (the numbers and files depend on them)
PACKAGES = ("capplan", "numpy", "scipy", "pandas", "pyarrow", "duckdb", "polars", "statsmodels",
            "plotly", "papermill", "nbconvert", "nbformat", "jupyter_client", "ipykernel", "xlsxwriter",
            "pyyaml", "click", "ipywidgets", "voila")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(root: Path, *, exclude: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(sha256, path relative to ``root``) of every file under ``root``, sorted by path."""
    root = Path(root)
    out = []
    for p in sorted(x for x in root.rglob("*") if x.is_file()):
        rel = p.relative_to(root).as_posix()
        if rel in exclude:
            continue
        out.append((sha256_file(p), rel))
    return out


def sha256_lines(rows: list[tuple[str, str]]) -> str:
    return "".join(f"{h}  {path}\n" for h, path in rows)


def git_info(where: Path) -> dict:
    """The git commit of the checkout holding ``where`` and whether it has uncommitted changes
    (empty when it is not a checkout or git is missing)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit, "uncommitted_changes": dirty}


def package_versions() -> dict[str, str | None]:
    from importlib import metadata

    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment(command: list[str] | None) -> dict:
    pkg_dir = Path(__file__).resolve().parent
    return {"capplan": __version__, "capplan_location": str(pkg_dir),
            "git": git_info(pkg_dir.parent), "python": sys.version.split()[0],
            "implementation": platform.python_implementation(), "platform": platform.platform(),
            "packages": package_versions(), "command": command or []}


def command_text(command: list[str] | None) -> str:
    return shlex.join(command) if command else ""


def reproduce_md(*, study: Path, study_hash: str, spec: Path, command: list[str] | None, time: str,
                 env: dict, baseline: Path | None = None) -> str:
    git = env.get("git") or {}
    where = (f"capplan {env['capplan']}" + (f", git commit `{git['commit']}`" if git.get("commit") else "")
             + (" (the checkout had uncommitted changes: those are not recorded)"
                if git.get("uncommitted_changes") else ""))
    cmd = command_text(command)
    if cmd and "--time" not in (command or []):
        cmd += f" --time {shlex.quote(time)}"
    lines = [
        "# Reproduce this report", "",
        f"Made with {where}, Python {env['python']} on {env['platform']}.",
        "The versions of every package the numbers depend on are in `provenance/environment.json`.", "",
        "1. Install the same capplan (from its repository: `git checkout "
        + (git.get("commit") or "<the release>") + " && pip install -e .`) and the package versions listed.",
        f"2. Check the inputs: the study `{study}` (content sha256 `{study_hash}`)"
        + (f", the baseline `{baseline}`" if baseline else "") + f" and the spec `{spec}`:",
        "", "   ```", "   sha256sum -c provenance/inputs.sha256", "   ```", "",
        "3. Run the same command with the same provenance time (it fixes the export's dates and the",
        "   workbook's creation time):", "", "   ```", f"   {cmd or 'capplan report ... --time ' + time}", "   ```", "",
        "4. Compare the outputs: every CSV, JSON and XLSX file is byte-identical "
        "(`cd NEW_REPORT && sha256sum -c OLD_REPORT/provenance/outputs.sha256`); the HTML pages and "
        "executed notebooks differ only in plotly's random element ids and cell ids.", "",
        "The seed, bootstrap replicates, confidence and SLO are in the command and in `report.json`; the "
        "same inputs and seed give the same numbers.", ""]
    return "\n".join(lines)


def write_bundle(out: Path, *, inputs: list[Path], command: list[str] | None, study: Path,
                 study_hash: str, spec: Path, time: str, baseline: Path | None = None) -> None:
    """Write ``provenance/`` and ``reproduce.md`` into the report folder ``out`` (last, so the
    output hashes cover everything else). ``inputs``: study directories (every file under them)
    and files (the spec, a gates file), listed with absolute paths."""
    prov = out / "provenance"
    prov.mkdir(exist_ok=True)
    rows = []
    for path in map(Path, inputs):
        if path.is_dir():
            rows += [(h, str((path / rel).resolve())) for h, rel in file_hashes(path)]
        elif path.is_file():
            rows.append((sha256_file(path), str(path.resolve())))
    (prov / "inputs.sha256").write_text(sha256_lines(rows), encoding="utf-8")
    env = environment(command)
    (prov / "environment.json").write_text(json.dumps(env, indent=2) + "\n", encoding="utf-8")
    (out / "reproduce.md").write_text(
        reproduce_md(study=study, study_hash=study_hash, spec=spec, command=command, time=time, env=env,
                     baseline=baseline), encoding="utf-8")
    (prov / "outputs.sha256").write_text(
        sha256_lines(file_hashes(out, exclude=("provenance/outputs.sha256",))), encoding="utf-8")
