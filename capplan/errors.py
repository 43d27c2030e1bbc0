"""Errors written for people: which file, which column, an example row, and how to fix it.

The CLI prints these without a traceback and exits with code 2.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path


def where(file: str | None, line: int | None = None, col: int | None = None) -> str | None:
    """``plan.yaml, line 3, column 14`` (line and column count from 1), or None."""
    if not file and line is None:
        return None
    text = file or "(text)"
    if line is not None:
        text += f", line {line}" + (f", column {col}" if col is not None else "")
    return text


@dataclass(frozen=True)
class Problem:
    """One problem found in a study or a spec (the validators collect all of them).
    ``column`` names a table column, ``field`` a key of a YAML document (``runs[2].offered_rps``),
    ``line``/``col`` where it is written (from 1)."""

    message: str
    file: str | None = None
    column: str | None = None
    example: str | None = None
    fix: str | None = None
    severity: str = "error"  # "error" | "warning"
    code: str = ""
    field: str | None = None
    line: int | None = None
    col: int | None = None

    def format(self) -> str:
        head = f"{self.severity.upper()}: {self.message}"
        lines = [head]
        loc = where(self.file, self.line, self.col)
        if loc:
            lines.append(f"  file:    {loc}")
        if self.field:
            lines.append(f"  field:   {self.field}")
        if self.column:
            lines.append(f"  column:  {self.column}")
        if self.example:
            lines.append(f"  example: {self.example}")
        if self.fix:
            lines.append(f"  fix:     {self.fix}")
        return "\n".join(lines)


class CapplanError(Exception):
    """Base of errors the CLI reports as a message with exit code 2."""

    exit_code = 2

    def format(self) -> str:
        return str(self)


class StudyError(CapplanError):
    """A study (or other input) is unusable. Carries one or more problems."""

    def __init__(self, message: str | None = None, *, file: str | None = None,
                 column: str | None = None, example: str | None = None,
                 fix: str | None = None, problems: list[Problem] | None = None,
                 code: str = ""):
        if problems is None:
            problems = [Problem(message or "invalid study", file, column, example, fix, code=code)]
        self.problems = [p for p in problems]
        errors = [p for p in self.problems if p.severity == "error"]
        first = (errors or self.problems)[0]
        super().__init__(first.message)

    @property
    def file(self) -> str | None:
        return self.problems[0].file

    @property
    def column(self) -> str | None:
        return self.problems[0].column

    def format(self) -> str:
        return "\n".join(p.format() for p in self.problems)


class SpecError(CapplanError):
    """A plan spec, manifest, synth config, gates file, SLO string or CLI parameter is invalid.
    ``field`` is the key path (``demand.peak_rps``); ``line``/``col`` where it is written."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None,
                 file: str | None = None, example: str | None = None, line: int | None = None,
                 col: int | None = None, code: str = ""):
        self.field = field
        self.fix = fix
        self.file = file
        self.example = example
        self.line = line
        self.col = col
        self.code = code
        super().__init__(message)

    @property
    def message(self) -> str:
        return self.args[0]

    def located(self, file: str | None = None, line: int | None = None,
                col: int | None = None) -> "SpecError":
        """The same error with the file and position filled in where it had none."""
        if self.line is not None:
            line, col = self.line, self.col
        return SpecError(self.message, field=self.field, fix=self.fix, file=self.file or file,
                         example=self.example, line=line, col=col, code=self.code)

    def problem(self, *, code: str = "", severity: str = "error") -> Problem:
        """This error as a Problem (for validators that list every problem at once)."""
        return Problem(self.message, file=self.file, example=self.example, fix=self.fix,
                       severity=severity, code=self.code or code, field=self.field,
                       line=self.line, col=self.col)

    def format(self) -> str:
        lines = [f"ERROR: {self.message}"]
        loc = where(self.file, self.line, self.col)
        if loc:
            lines.append(f"  file:    {loc}")
        if self.field:
            lines.append(f"  field:   {self.field}")
        if self.example:
            lines.append(f"  example: {self.example}")
        if self.fix:
            lines.append(f"  fix:     {self.fix}")
        return "\n".join(lines)


@dataclass
class ProblemList:
    """Accumulates problems so `capplan validate` can list every one, not just the first."""

    items: list[Problem] = field(default_factory=list)

    def add(self, message: str, **kw) -> None:
        self.items.append(Problem(message, **kw))

    def warn(self, message: str, **kw) -> None:
        self.items.append(Problem(message, severity="warning", **kw))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.items if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.items if p.severity == "warning"]

    def raise_if_errors(self) -> None:
        if self.errors:
            raise StudyError(problems=self.errors + self.warnings)


class SLOUnitWarning(UserWarning):
    """An SLO limit whose size suggests the wrong unit (``capplan.slo.unit_warnings``): said,
    not refused; the CLI prints it as a ``WARNING:`` line on stderr."""


#: OS errors of writing an output, and the exit code each gets: a full disk or quota is the
#: machine's state (1, like a failing job); a folder the user may not write, or a read-only
#: one, is a wrong ``--out`` (2, like any bad argument).
WRITE_ERRNOS: dict[int, int] = {getattr(errno, name): code for name, code in (
    ("ENOSPC", 1), ("EDQUOT", 1), ("EACCES", 2), ("EPERM", 2), ("EROFS", 2))
    if hasattr(errno, name)}


class WriteError(CapplanError):
    """An output could not be written (disk full, no permission, read-only folder): one line
    with the path, what the system said and what to do; exit 1 or 2 (``WRITE_ERRNOS``)."""

    def __init__(self, path: str, reason: str, fix: str, exit_code: int):
        self.path, self.reason, self.fix, self.exit_code = path, reason, fix, exit_code
        super().__init__(f"ERROR: cannot write {path}: {reason} — {fix}")


def write_error(exc: BaseException, dest=None) -> WriteError | None:
    """The WriteError for an OSError of writing (``WRITE_ERRNOS``), else None. ``dest``: the
    output being written, named when the error itself names no file (a write() of a full
    disk)."""
    if not isinstance(exc, OSError) or exc.errno not in WRITE_ERRNOS:
        return None
    path = str(exc.filename or dest or "(an output file)")
    reason = exc.strerror or os.strerror(exc.errno)
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        free = None
        for p in (path, *(str(a) for a in Path(path).parents)):
            if os.path.isdir(p):
                free = shutil.disk_usage(p).free
                break
        where = ("" if free is None else f" ({free / 1e6:.0f} MB free there)" if free >= 1e6
                 else f" ({free / 1e3:.0f} kB free there)")
        fix = f"free space on that disk{where} or choose another --out"
    elif exc.errno == errno.EROFS:
        fix = "the folder is read-only; choose another --out"
    else:
        fix = "you may not write there; choose another --out or fix the folder's permissions"
    return WriteError(path, reason, fix, WRITE_ERRNOS[exc.errno])


class OutputBusy(CapplanError):
    """Another capplan process holds the output's lock (it is writing the same folder) and did
    not finish within the wait: one line, exit 1 (the machine's state: the same command works
    once the other run ends)."""

    exit_code = 1

    def __init__(self, path: str, holder: str, waited_s: float):
        self.path, self.holder, self.waited_s = path, holder, waited_s
        super().__init__(
            f"ERROR: {holder} is still writing {path} after {waited_s:g} s — wait for it to "
            "finish (or end it) and run again, or choose another --out "
            "(CAPPLAN_LOCK_WAIT_S sets how long to wait)")
