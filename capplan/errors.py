"""Errors written for people: which file, which column, an example row, and how to fix it.

The CLI prints these without a traceback and exits with code 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
