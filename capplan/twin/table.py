"""One result for every serving-policy sweep on the twin: :class:`ScenarioTable`, one row per
scenario (a prefix-cache setting, a prefill:decode split, an admission / scheduling policy —
each built from scenario parts) and one column per measured outcome (C_SLO and its interval,
hit rates, goodput, fairness, …), with an optional detail table (one row per scenario and
tenant).

Why one class. The cache sweep, the prefill:decode sweep and the policy comparison each had a
result class of the same shape (a frame of rows, notes, a text, a display frame, a figure),
each formatting its numbers its own way, so a missing value printed "nan" in one and nothing in
another. Here the sweep declares *how its table reads* once, as data — a :class:`Layout`: the
title, the column that names the scenario, one row's line as ``str.format`` templates over the
row's columns, the headers for people, and the figure — and the one class prints, tabulates and
serialises every sweep through the presentation kit (``capplan.present``): a missing value is
"—" in text and null in JSON.

Templates are ordinary format strings (``"{cslo_rps:.3g} req/s"``) whose fields are columns;
a missing value prints as the mark. A :class:`When` clause is printed only when its column holds
a value (a cost clause when a price was given), so the line says nothing rather than "—" about
a quantity the sweep was never asked for.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from .. import present as P
from ..slo import SLO


@dataclass(frozen=True)
class When:
    """A clause of a line printed only when ``column`` holds a value."""

    column: str
    text: str


@dataclass(frozen=True)
class Layout:
    """How one sweep's table reads. ``title``: a template over the table (``{slo}``, ``{best}``,
    ``{rate_rps}``); ``key``: the column naming each row's scenario; ``line`` / ``detail_line``:
    one row's text (templates and :class:`When` clauses), the detail rows printed under the row
    whose ``key`` they share; ``headers`` / ``detail_headers``: (header for people, column or
    template) of the display frames; ``figure``: the table → a plotly figure."""

    title: str
    key: str
    line: tuple[str | When, ...]
    headers: tuple[tuple[str, str], ...]
    detail_line: tuple[str | When, ...] = ()
    detail_headers: tuple[tuple[str, str], ...] = ()
    figure: Callable | None = None


class _Kit(string.Formatter):
    """``str.format`` whose missing values print as the mark (padded to the field's width)."""

    def format_field(self, value, format_spec):
        if P.is_missing(value):
            m = re.match(r"(.?[<>^=])?\d*", format_spec)
            return format(P.MISSING, m.group(0) if m and m.group(0) else "")
        return format(value, format_spec)


_KIT = _Kit()


def render(template: str, values: dict) -> str:
    """``template`` filled from ``values`` through the kit."""
    return _KIT.format(template, **values)


def _fields(template: str) -> list[str]:
    return [f for _, f, _, _ in _KIT.parse(template) if f]


def _line(pieces, values: dict) -> str:
    out = []
    for p in pieces:
        if isinstance(p, When):
            if not P.is_missing(values.get(p.column)):
                out.append(render(p.text, values))
        else:
            out.append(render(p, values))
    return "".join(out)


def _cell(source: str, values: dict):
    """A display cell: the column's raw value, or a template's text (the mark when every field
    it reads is missing)."""
    if "{" not in source:
        return values[source]
    if all(P.is_missing(values.get(f)) for f in _fields(source)):
        return P.MISSING
    return render(source, values)


@dataclass(frozen=True)
class ScenarioTable:
    """A sweep's result: ``rows`` one per scenario (named in the layout's ``key`` column),
    ``detail`` one per (scenario, tenant) where the sweep measures tenants, ``best`` the row
    the sweep recommends (when it ranks), ``rate_rps`` the load all rows ran at (when one)."""

    kind: str  # "cache" | "pd" | "policies": which sweep
    slo: SLO
    rows: pd.DataFrame = field(repr=False)
    layout: Layout = field(repr=False, compare=False)
    detail: pd.DataFrame | None = field(default=None, repr=False)
    best: str | None = None
    rate_rps: float | None = None
    notes: tuple[str, ...] = ()

    def _head(self) -> dict:
        return {"slo": self.slo, "best": self.best, "rate_rps": self.rate_rps, "kind": self.kind}

    def to_frame(self, what: str = "rows") -> pd.DataFrame:
        """The measured columns (``what="detail"``: the detail table), as computed."""
        return self._frame(what).copy()

    def _frame(self, what: str) -> pd.DataFrame:
        if what == "rows":
            return self.rows
        if what == "detail" and self.detail is not None:
            return self.detail
        have = "rows, detail" if self.detail is not None else "rows"
        raise ValueError(f"the {self.kind} table has no {what!r} frame (it has {have})")

    def display_frame(self, what: str = "rows") -> pd.DataFrame:
        """The table for people: the layout's headers, numbers left as numbers (the report's
        styler formats them), derived text through the kit."""
        df = self._frame(what)
        headers = self.layout.headers if what == "rows" else self.layout.detail_headers
        recs = df.to_dict("records")
        return pd.DataFrame({h: df[src] if "{" not in src else [_cell(src, r) for r in recs] for h, src in headers})

    def to_text(self) -> str:
        lay = self.layout
        lines = [render(lay.title, self._head())]
        detail = self.detail.to_dict("records") if self.detail is not None and lay.detail_line else []
        for r in self.rows.to_dict("records"):
            lines.append("  " + _line(lay.line, r))
            lines += ["  " + _line(lay.detail_line, d) for d in detail if d.get(lay.key) == r[lay.key]]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "title": render(self.layout.title, self._head()), "slo": str(self.slo),
                "best": self.best, "rate_rps": self.rate_rps, "rows": P.records(self.rows),
                "detail": None if self.detail is None else P.records(self.detail), "notes": list(self.notes)}

    def to_json(self, path=None) -> str:
        """The table as JSON (missing values null), written atomically to ``path`` when given."""
        return P.json_text(self.to_dict(), path)

    def figure(self):
        if self.layout.figure is None:
            raise ValueError(f"the {self.kind} table draws no figure")
        return self.layout.figure(self)
