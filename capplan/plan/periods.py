"""Dates of a plan's quarters, months and years (pure, no I/O).

A plan covers ``horizon_quarters`` consecutive 3-month periods from a start date: the spec's
``start:`` (any date; ``2026-04-01`` or ``2026-Q2``), else the first day of the calendar
quarter after a reference day (the report's or export's time), so the same inputs give the
same dates. A demand forecast brings its own calendar quarters (those after the history's
last observation). A quarter that starts on a calendar quarter is labelled like ``2026Q2``
(as pandas and the forecast do); any other start is labelled ``Q1 (from 15 Feb 2026)``.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from ..errors import SpecError
from ..spec import date

_QUARTER_TEXT = re.compile(r"^\s*(\d{4})\s*-?\s*Q([1-4])\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Period:
    """One period of the plan: its label, first day and last day (inclusive)."""

    label: str
    start: dt.date
    end: dt.date

    @property
    def text(self) -> str:
        """'1 Jan – 31 Mar 2026' (the dates in words)."""
        if self.start.year == self.end.year:
            return f"{self.start.day} {self.start:%b} – {self.end.day} {self.end:%b %Y}"
        return f"{self.start.day} {self.start:%b %Y} – {self.end.day} {self.end:%b %Y}"


def parse_start(value, field: str = "start") -> dt.date | None:
    """A plan start date from YAML: a date, an ISO date text (2026-04-01) or a quarter
    (2026-Q2, 2026Q2: its first day). None stays None."""
    if isinstance(value, str):
        m = _QUARTER_TEXT.match(value)
        if m:
            return dt.date(int(m.group(1)), 3 * int(m.group(2)) - 2, 1)
    try:
        return date(value, field, optional=True)
    except SpecError:
        raise SpecError(f"{field} must be a date, got {value!r}", field=field,
                        fix=f"write {field}: 2026-04-01 (a day) or {field}: 2026-Q2 (a quarter)") from None


def reference_day(as_of=None) -> dt.date:
    """The day a default start is counted from: ``as_of`` (date, datetime or ISO text, e.g.
    the report's provenance time), else today in UTC."""
    if as_of is None or as_of == "":
        return dt.datetime.now(dt.timezone.utc).date()
    if isinstance(as_of, dt.datetime):
        return as_of.date()
    if isinstance(as_of, dt.date):
        return as_of
    try:
        return dt.datetime.fromisoformat(str(as_of)).date()
    except ValueError:
        raise SpecError(f"time {as_of!r} is not an ISO timestamp", field="time",
                        fix="e.g. 2026-01-01T00:00:00+00:00") from None


def next_quarter_start(day: dt.date) -> dt.date:
    """First day of the calendar quarter after the one holding ``day``."""
    q = (day.month - 1) // 3
    year, month = day.year, 3 * (q + 1) + 1
    if month > 12:
        year, month = year + 1, 1
    return dt.date(year, month, 1)


def add_months(day: dt.date, months: int) -> dt.date:
    """The same day ``months`` later (clamped to the month's last day)."""
    y, m = divmod(day.month - 1 + months, 12)
    year, month = day.year + y, m + 1
    last = (dt.date(year + (month == 12), month % 12 + 1, 1) - dt.timedelta(days=1)).day
    return dt.date(year, month, min(day.day, last))


def _aligned(day: dt.date) -> bool:
    return day.day == 1 and day.month in (1, 4, 7, 10)


def quarters(start: dt.date, count: int) -> tuple[Period, ...]:
    """``count`` consecutive 3-month periods from ``start``."""
    out = []
    for i in range(count):
        s = add_months(start, 3 * i)
        e = add_months(start, 3 * (i + 1)) - dt.timedelta(days=1)
        label = (f"{s.year}Q{(s.month - 1) // 3 + 1}" if _aligned(s)
                 else f"Q{i + 1} (from {s.day} {s:%b %Y})")
        out.append(Period(label, s, e))
    return tuple(out)


def quarter_from_label(label: str) -> Period:
    """The calendar quarter a forecast label like ``2026Q1`` names."""
    m = _QUARTER_TEXT.match(label)
    if not m:
        raise ValueError(f"not a quarter label: {label!r}")
    return quarters(dt.date(int(m.group(1)), 3 * int(m.group(2)) - 2, 1), 1)[0]


def months_of(q: Period) -> tuple[Period, ...]:
    """The three months of a quarter, labelled '2026-01' (or by their first day)."""
    out = []
    for i in range(3):
        s = add_months(q.start, i)
        e = add_months(q.start, i + 1) - dt.timedelta(days=1)
        out.append(Period(f"{s:%Y-%m}" if s.day == 1 else f"from {s.isoformat()}", s, e))
    return tuple(out)
