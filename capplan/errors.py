"""Errors written for people: which file, which column, an example row, and how to fix it.

The CLI prints these without a traceback and exits with code 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One problem found in a study (the validator collects all of them)."""

    message: str
    file: str | None = None
    column: str | None = None
    example: str | None = None
    fix: str | None = None
    severity: str = "error"  # "error" | "warning"
    code: str = ""

    def format(self) -> str:
        head = f"{self.severity.upper()}: {self.message}"
        lines = [head]
        if self.file:
            lines.append(f"  file:    {self.file}")
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
    """A plan spec, SLO string, gates file or CLI parameter is invalid."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None,
                 file: str | None = None):
        self.field = field
        self.fix = fix
        self.file = file
        super().__init__(message)

    def format(self) -> str:
        lines = [f"ERROR: {self.args[0]}"]
        if self.file:
            lines.append(f"  file:    {self.file}")
        if self.field:
            lines.append(f"  field:   {self.field}")
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
