"""Provenance bundle of a report: enough to check, and redo, every number in it.

``write_bundle`` writes into the report folder:

- ``provenance/inputs.sha256``   sha256 of every file of the study (and baseline) and the spec,
  in ``sha256sum`` format (``sha256sum -c`` checks them from the folder the paths name);
- ``provenance/outputs.sha256``  sha256 of every file the report wrote that a rerun of the same
  command reproduces byte for byte (the exports, the index, the glossary, inputs.sha256),
  relative to the report folder: ``cd NEW_REPORT && sha256sum -c OLD_REPORT/provenance/outputs.sha256``
  passes for a rerun;
- ``provenance/run.sha256``      sha256 of the files particular to this run, for integrity only
  (``cd REPORT && sha256sum -c provenance/run.sha256``): the pages rendered from notebooks and
  the executed notebooks (a rerun's differ in plotly's random element ids, pandas' random
  table ids, the cell ids and the notebooks' execution times) and the records of the run (report.json, environment.json,
  reproduce.md: the command with its ``--out`` folder, the machine);
- ``provenance/environment.json`` capplan version, the git commit (and whether the checkout had
  uncommitted changes) when capplan runs from a checkout, Python and the versions of the
  packages the numbers depend on, the platform, the exact command and the folder it ran in;
- ``reproduce.md``              the steps and the command that regenerate the report into a
  new folder and check it against this one.

Pure file reads and hashing; no network.
"""

from __future__ import annotations

import hashlib
import json
import os
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
            "packages": package_versions(), "command": command or [], "cwd": os.getcwd()}


def command_text(command: list[str] | None) -> str:
    return shlex.join(command) if command else ""


#: the records of one run (its command, its --out folder, its machine): never equal in a rerun
RUN_RECORDS = ("report.json", "reproduce.md", "provenance/environment.json")
#: the checksum lists themselves
LISTS = ("provenance/outputs.sha256", "provenance/run.sha256")


def rerun_command(command: list[str], new_out: str, time: str) -> list[str]:
    """``command`` with its ``--out`` (either spelling) replaced by ``new_out`` and ``--time``
    added when it had none: the rerun writes a new folder instead of overwriting the report."""
    out: list[str] = []
    skip = False
    for arg in command:
        if skip:
            skip = False
            continue
        if arg == "--out":
            skip = True
            continue
        if arg.startswith("--out="):
            continue
        out.append(arg)
    if "--time" not in out and not any(a.startswith("--time=") for a in out):
        out += ["--time", time]
    return out + ["--out", new_out]


def reproduce_md(*, study: Path, study_hash: str, spec: Path, command: list[str] | None, time: str,
                 env: dict, baseline: Path | None = None, report_dir: Path | None = None) -> str:
    """The steps that rerun the report into a new folder (``REPORT-reproduced`` beside it) and
    check every reproducible file against this one's checksums, each a line to paste."""
    git = env.get("git") or {}
    where = (f"capplan {env['capplan']}" + (f", git commit `{git['commit']}`" if git.get("commit") else "")
             + (" (the checkout had uncommitted changes: those are not recorded)"
                if git.get("uncommitted_changes") else ""))
    old = str(report_dir) if report_dir is not None else "OLD_REPORT"
    new = f"{old}-reproduced" if report_dir is not None else "NEW_REPORT"
    q = shlex.quote
    if command:
        cmd = command_text(rerun_command(list(command), new, time))
        cwd = env.get("cwd")
        if cwd:
            cmd = f"cd {q(cwd)} && {cmd}"
    else:
        cmd = f"capplan report ... --time {q(time)} --out {q(new)}"
    lines = [
        "# Reproduce this report", "",
        f"Made with {where}, Python {env['python']} on {env['platform']}.",
        "The versions of every package the numbers depend on are in `provenance/environment.json`.", "",
        "1. Install the same capplan (from its repository: `git checkout "
        + (git.get("commit") or "<the release>") + " && pip install -e .`) and the package versions listed.",
        f"2. Check the inputs: the study `{study}` (content sha256 `{study_hash}`)"
        + (f", the baseline `{baseline}`" if baseline else "") + f" and the spec `{spec}`:",
        "", "   ```", f"   cd {q(old)} && sha256sum -c provenance/inputs.sha256", "   ```", "",
        "3. Run the same command, from the folder it ran in, with the same provenance time (it fixes",
        "   the export's dates and the workbook's creation time), into a new folder (so this report",
        "   and its checksums stay as they are):", "", "   ```", f"   {cmd}", "   ```", "",
        "4. Check the new report against this one: every file listed in `provenance/outputs.sha256`",
        "   (the CSV, JSON and XLSX exports, the index, the glossary, the input checksums) is",
        "   byte-identical, so every line says OK:", "",
        "   ```", f"   cd {q(new)} && sha256sum -c {q(old + '/provenance/outputs.sha256')}", "   ```", "",
        "The HTML pages rendered from notebooks, the executed notebooks and this run's records",
        "(`report.json`, `provenance/environment.json`, this file: they name the command, its `--out`",
        "folder and the machine) are not reproduced byte for byte: a rerun's pages differ only in",
        "plotly's random element ids, pandas' random table ids and the cell ids, its notebooks also",
        "in the execution times. Their",
        "checksums, in `provenance/run.sha256`, say that this folder holds the files the run wrote",
        f"(`cd {q(old)} && sha256sum -c provenance/run.sha256`).", "",
        "If this folder was moved, replace its old path above by the new one.", "",
        "The seed, bootstrap replicates, confidence and SLO are in the command and in `report.json`; the "
        "same inputs and seed give the same numbers.", ""]
    return "\n".join(lines)


def write_bundle(out: Path, *, inputs: list[Path], command: list[str] | None, study: Path,
                 study_hash: str, spec: Path, time: str, baseline: Path | None = None,
                 report_dir: Path | None = None, pages: tuple[str, ...] = ()) -> None:
    """Write ``provenance/`` and ``reproduce.md`` into the report folder ``out`` (last, so the
    output hashes cover everything else). ``inputs``: study directories (every file under them)
    and files (the spec, a gates file), listed with absolute paths. ``report_dir``: where the
    report ends up (``out`` may be a temporary folder renamed to it; default ``out``).
    ``pages``: the pages rendered from notebooks (relative to ``out``); they, the executed
    notebooks under ``notebooks/`` and the run's records go to ``run.sha256``, every other file
    to ``outputs.sha256``."""
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
                     baseline=baseline, report_dir=Path(report_dir) if report_dir else Path(out).resolve()),
        encoding="utf-8")
    varying = set(pages) | set(RUN_RECORDS)
    hashes = file_hashes(out, exclude=LISTS)
    run = [(h, rel) for h, rel in hashes if rel in varying or rel.startswith("notebooks/")]
    (prov / "outputs.sha256").write_text(sha256_lines([x for x in hashes if x not in run]),
                                         encoding="utf-8")
    (prov / "run.sha256").write_text(sha256_lines(run), encoding="utf-8")
