"""Finance export: a plan as ``plan.xlsx`` plus the same tables as CSV, written atomically.

What a finance reader gets (docs/plan.md "Finance export"):
- numbers in numeric cells with a format per unit — whole numbers for groups, GPUs and nodes,
  currency with 2 decimals, percentages, req/s with 3 decimals, dates as dates — and text in
  text columns (a table never mixes the two in one column: key–value tables have a ``Value``
  column for numbers and a ``Text`` column for words);
- the plan dated: cost by quarter (first and last day), by month and by plan year;
- a print setup on every sheet: landscape, one page wide, the header row repeated on each page,
  a print area; the Summary sheet prints on one page;
- CSVs rounded to a stated precision (``CSV_PRECISION``: money to the cent, req/s to 0.0001,
  fractions to 6 decimals, percentages to 0.01, counts whole, other numbers to 6 significant
  digits) so they carry no float noise; the workbook keeps full precision.

Safe for spreadsheets:
- xlsxwriter with ``strings_to_formulas``/``strings_to_urls`` off, and every text cell or
  header that starts with ``= + - @`` tab, CR, LF (or full-width ``＝ ＋ － ＠``) gets a leading
  ``'`` so no spreadsheet runs it; numbers are written as numbers, never as text;
- CSV with ``\\r\\n`` line ends (fields holding a bare CR are quoted) and a UTF-8 BOM;
- deterministic bytes: the workbook's creation time is the provenance time (a parameter that
  tests fix), so two exports of the same plan at the same time are byte-identical.

``write_xlsx`` / ``write_csv`` also serve other exports (``capplan.compare``): without a
:class:`SheetLayout` a column's format follows its values (whole numbers without decimals,
others as the spreadsheet's General format) and CSV numbers are written unrounded.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import __version__
from .errors import SpecError
from .io import atomic_dir

XLSX_NAME = "plan.xlsx"
DANGEROUS_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\n", "＝", "＋", "－", "＠")
SHEETS = ("Summary", "Plan line items", "Checks", "Assumptions", "Capacity with CI", "Cost by quarter",
          "Cost by month", "Cost by year", "Provenance")
CSV_NAMES = {"Summary": "summary.csv", "Plan line items": "line_items.csv", "Checks": "checks.csv",
             "Assumptions": "assumptions.csv", "Capacity with CI": "capacity.csv",
             "Cost by quarter": "cost_by_quarter.csv", "Cost by month": "cost_by_month.csv",
             "Cost by year": "cost_by_year.csv", "Provenance": "provenance.csv"}

#: number kinds: spreadsheet format, and the CSV rounding (decimals; None = 6 significant digits)
KINDS: dict[str, tuple[str, int | None]] = {
    "int": ("#,##0", 0),
    "usd": ('"$"#,##0.00', 2),
    "pct": ("0.0", 2),  # the value is in percent (36.15 → "36.2", unit "%" beside it)
    "fraction": ("0.0000", 6),
    "rate": ("#,##0.000", 4),
    "energy": ("#,##0.000", 4),
    "tokens": ("#,##0.0", 1),
    "number": ("General", None),
    "date": ("yyyy-mm-dd", None),
}
#: what each kind's CSV precision is, in words (stated in Provenance and docs/plan.md)
CSV_PRECISION = ("CSV numbers are rounded: money (USD) to 0.01, rates (req/s) to 0.0001, fractions to "
                 "0.000001, percentages to 0.01, counts (groups, GPUs, nodes, requests) to whole numbers, "
                 "energy (Wh, kW) to 0.0001, tokens to 0.1, other numbers to 6 significant digits; plan.xlsx keeps full "
                 "precision and shows it rounded by its number formats")

_UNIT_KINDS = {"usd": "usd", "usd/month": "usd", "usd/quarter": "usd", "usd/year": "usd",
               "%": "pct", "fraction": "fraction", "req/s": "rate", "wh": "energy", "kw": "energy",
               "groups": "int", "gpus": "int", "nodes": "int", "requests": "int", "replicas": "int",
               "quarters": "int", "replicates": "int", "tokens": "tokens"}


def kind_for_unit(unit) -> str:
    """The number kind of a unit ('USD/month' → usd, 'GPUs' → int, '%' → pct, …)."""
    return _UNIT_KINDS.get(str(unit or "").strip().lower(), "number")


@dataclass(frozen=True)
class SheetLayout:
    """How one sheet is formatted and printed. ``kinds``: column → number kind (KINDS);
    ``unit_column``: (value column, unit column) — the value's kind follows the row's unit;
    ``about``: (label, text) rows printed above the table (the Summary's plan description);
    ``one_page``: the sheet prints on one page (else one page wide); ``widths``: column →
    width in characters (text wraps)."""

    kinds: dict = field(default_factory=dict)
    unit_column: tuple[str, str] | None = None
    about: tuple[tuple[str, str], ...] = ()
    one_page: bool = False
    widths: dict = field(default_factory=dict)
    hidden: tuple[str, ...] = ()  # columns kept for machines (CSV) but hidden and not printed


def safe_text(value: str) -> str:
    """Text a spreadsheet will not run as a formula: a leading ``'`` before = + - @ tab CR LF
    (and their full-width forms)."""
    s = str(value)
    return "'" + s if s.startswith(DANGEROUS_PREFIXES) else s


def _cell(value):
    """Normalise a value for both writers: numbers stay numbers, dates stay dates, None/NaN
    blank, text safe."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value
    if isinstance(value, (int, float)):
        v = float(value) if not isinstance(value, int) else value
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, float) and math.isinf(v):
            return safe_text("inf" if v > 0 else "-inf")
        return v
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalar
        return _cell(value.item())
    if value is pd.NaT:
        return None
    return safe_text(value)


def _safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    cols = [safe_text(c) for c in df.columns]
    data = {sc: pd.Series([_cell(v) for v in df[c].tolist()], dtype=object) for sc, c in zip(cols, df.columns)}
    return pd.DataFrame(data, columns=cols)


# ----------------------------------------------------------------------------- the plan's tables


def _split_value(df: pd.DataFrame, col: str = "value") -> pd.DataFrame:
    """A key–value table with numbers and words in one column → numbers in ``Value``, words
    in ``Text``."""
    vals = df[col].tolist()
    num = [v if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in vals]
    txt = [None if isinstance(v, (int, float)) and not isinstance(v, bool) else
           (("yes" if v else "no") if isinstance(v, bool) else v) for v in vals]
    out = df.drop(columns=[col]).copy()
    out.insert(list(df.columns).index(col), "Value", pd.Series(num, dtype=object))
    out.insert(list(df.columns).index(col) + 1, "Text", pd.Series(txt, dtype=object))
    return out


QUARTER_COLUMNS = {
    "quarter": "Quarter", "start": "First day", "end": "Last day", "peak_rps": "Peak demand (req/s)",
    "demand_rps": "Planned demand incl. uncertainty (req/s)", "groups": "Replica groups",
    "gpus": "GPUs in groups", "billed_gpus": "Billed GPUs", "nodes": "Nodes",
    "cost_usd_per_month": "Cost per month (USD)", "cost_usd_per_quarter": "Cost per quarter (USD)",
    "cost_usd_per_year": "Cost per year at this size (USD)",
    "cost_usd_per_1k_good_requests": "Cost per 1 000 SLO-meeting requests (USD)",
    "forecast_mean_rps": "Forecast mean peak (req/s)", "forecast_lower_rps": "Forecast interval low (req/s)",
}
_QUARTER_KINDS = {"First day": "date", "Last day": "date", "Peak demand (req/s)": "rate",
                  "Planned demand incl. uncertainty (req/s)": "rate", "Replica groups": "int",
                  "GPUs in groups": "int", "Billed GPUs": "int", "Nodes": "int",
                  "Cost per month (USD)": "usd", "Cost per quarter (USD)": "usd",
                  "Cost per year at this size (USD)": "usd",
                  "Cost per 1 000 SLO-meeting requests (USD)": "usd",
                  "Forecast mean peak (req/s)": "rate", "Forecast interval low (req/s)": "rate"}


def plan_tables(plan, *, time: str, study_hash: str | None = None, parameters: dict | None = None
                ) -> dict[str, pd.DataFrame]:
    """The export's tables (unsanitised), keyed by sheet name, with units in the headers or a
    unit column."""
    items = plan.to_frame().rename(columns={"item": "Line item", "value": "Value", "unit": "Unit",
                                            "formula": "Formula", "inputs": "Inputs", "key": "Key"})
    checks = plan.checks_frame().rename(columns={"check": "Check", "ok": "Holds", "caveat": "Caveat",
                                                 "key": "Key"})
    summary = plan.summary_frame().rename(columns={"quantity": "Quantity", "value": "Value", "unit": "Unit",
                                                   "key": "Key"})
    assumptions = plan.assumptions_frame()
    for note in plan.notes:
        assumptions.loc[len(assumptions)] = ["note", note, "", "stated by the plan (a default it used, what "
                                             "it could not compute, or a warning)"]
    assumptions = _split_value(assumptions).rename(columns={"assumption": "Assumption", "unit": "Unit",
                                                            "note": "Note"})
    capacity = plan.capacity.to_frame().rename(columns={"quantity": "Quantity", "value": "Value",
                                                        "unit": "Unit", "note": "Note"})
    quarters = plan.quarters_frame().rename(columns=QUARTER_COLUMNS)
    months = plan.months_frame().rename(columns={
        "month": "Month", "start": "First day", "end": "Last day", "quarter": "Quarter",
        "billed_gpus": "Billed GPUs", "cost_usd_per_month": "Cost (USD)"})
    years = plan.years_frame().rename(columns={
        "period": "Period", "start": "First day", "end": "Last day", "quarters": "Quarters",
        "cost_usd": "Cost (USD)"})
    prov = [("capplan version", __version__), ("plan", plan.spec.name), ("tenant", plan.spec.tenant),
            ("spec file", plan.spec.source), ("study", plan.capacity.study_name),
            ("study content hash (sha256)", study_hash or plan.capacity.study_hash),
            ("SLO", str(plan.slo) if plan.slo is not None else None),
            ("capacity source", plan.capacity.source), ("time", time), ("CSV precision", CSV_PRECISION)]
    for k, v in sorted((parameters or {}).items()):
        prov.append((f"parameter {k}", v if isinstance(v, str) or v is None
                     else json.dumps(v, sort_keys=True, default=str)))
    prov.append(("spec (JSON)", json.dumps(plan.spec.to_dict(), sort_keys=True, default=str, ensure_ascii=False)))
    provenance = pd.DataFrame([(k, None if v is None else str(v)) for k, v in prov], columns=["Key", "Value"])
    return {"Summary": summary, "Plan line items": items, "Checks": checks, "Assumptions": assumptions,
            "Capacity with CI": capacity, "Cost by quarter": quarters, "Cost by month": months,
            "Cost by year": years, "Provenance": provenance}


def plan_layouts(plan) -> dict[str, SheetLayout]:
    """Number formats and print setup of the plan's sheets."""
    unit = ("Value", "Unit")
    return {
        "Summary": SheetLayout(unit_column=unit, about=tuple(plan.about()), one_page=True,
                               widths={"Quantity": 58, "Value": 16, "Unit": 12, "Key": 30}, hidden=("Key",)),
        "Plan line items": SheetLayout(unit_column=unit, widths={"Line item": 34, "Value": 14, "Unit": 11,
                                                                 "Formula": 60, "Inputs": 52, "Key": 24}),
        "Checks": SheetLayout(widths={"Check": 90, "Holds": 7, "Caveat": 60, "Key": 16}),
        "Assumptions": SheetLayout(unit_column=unit, widths={"Assumption": 44, "Value": 14, "Text": 64,
                                                             "Unit": 10, "Note": 44}),
        "Capacity with CI": SheetLayout(unit_column=unit, one_page=True,
                                        widths={"Quantity": 46, "Value": 12, "Unit": 9, "Note": 70}),
        "Cost by quarter": SheetLayout(kinds=dict(_QUARTER_KINDS), widths={"Quarter": 22}),
        "Cost by month": SheetLayout(kinds={"First day": "date", "Last day": "date", "Billed GPUs": "int",
                                            "Cost (USD)": "usd"}, widths={"Month": 18, "Quarter": 22}),
        "Cost by year": SheetLayout(kinds={"First day": "date", "Last day": "date", "Quarters": "int",
                                           "Cost (USD)": "usd"}, one_page=True,
                                    widths={"Period": 26}),
        "Provenance": SheetLayout(widths={"Key": 30, "Value": 100}),
    }


# ----------------------------------------------------------------------------- writers


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _created(time: str) -> _dt.datetime:
    try:
        t = _dt.datetime.fromisoformat(time)
    except ValueError:
        raise SpecError(f"export time {time!r} is not an ISO timestamp", field="time",
                        fix="e.g. 2026-01-01T00:00:00+00:00") from None
    if t.tzinfo is not None:
        t = t.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return t


def _column_kind(col: str, values: list, layout: SheetLayout) -> str | None:
    """The kind of a whole column (None: per row, from the unit column, or text)."""
    if col in layout.kinds:
        return layout.kinds[col]
    if layout.unit_column and col == layout.unit_column[0]:
        return None
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if nums and all(float(v).is_integer() for v in nums):
        return "int"
    return "number" if nums else None


def write_xlsx(tables: dict[str, pd.DataFrame], path: str | os.PathLike, *, created: _dt.datetime,
               title: str = "capplan plan", layouts: dict[str, SheetLayout] | None = None) -> None:
    """Write the tables with xlsxwriter: formulas and URLs off, text made safe, numbers as
    numbers with a format per unit, dates as dates, and a print setup on every sheet
    (landscape, one page wide — ``one_page`` sheets one page in all —, header row repeated,
    print area)."""
    import xlsxwriter

    layouts = layouts or {}
    wb = xlsxwriter.Workbook(str(path), {"strings_to_formulas": False, "strings_to_urls": False,
                                         "strings_to_numbers": False, "nan_inf_to_errors": False})
    wb.set_properties({"title": title, "author": "capplan", "created": created})
    head = wb.add_format({"bold": True, "text_wrap": True, "valign": "top", "bottom": 1})
    wrap = wb.add_format({"text_wrap": True, "valign": "top"})
    label = wb.add_format({"bold": True, "valign": "top"})
    fmts = {k: wb.add_format({"num_format": f, "valign": "top"}) for k, (f, _) in KINDS.items()}
    for sheet, df in tables.items():
        lay = layouts.get(sheet, SheetLayout())
        ws = wb.add_worksheet(sheet)
        safe = _safe_frame(df)
        row0 = 0
        if lay.about:  # the description block above the table: label | text
            ws.write_string(0, 0, safe_text(title), label)
            for i, (k, v) in enumerate(lay.about, start=1):
                ws.write_string(i, 0, safe_text(k), label)
                if len(safe.columns) > 2:
                    ws.merge_range(i, 1, i, len(safe.columns) - 1, safe_text(v), wrap)
                else:
                    ws.write_string(i, 1, safe_text(v), wrap)
                ws.set_row(i, 15 * max(1, math.ceil(len(str(v)) / 75)))
            row0 = len(lay.about) + 2
        units = None
        if lay.unit_column and lay.unit_column[1] in df.columns:
            units = [kind_for_unit(u) for u in df[lay.unit_column[1]].tolist()]
        lines = [1] * (len(safe) + 1)  # text lines per row (wrapped), for explicit row heights
        for j, col in enumerate(df.columns):
            scol = safe.columns[j]
            values = safe[scol].tolist()
            ws.write_string(row0, j, scol, head)
            kind = _column_kind(col, values, lay)
            width = lay.widths.get(col) or min(max([len(str(scol))] + [len(_shown(v)) for v in values] + [8]) + 2, 60)
            ws.set_column(j, j, width, None, {"hidden": True} if col in lay.hidden else None)
            if col not in lay.hidden:
                for i, v in enumerate([scol] + values):
                    if isinstance(v, str):
                        lines[i] = max(lines[i], math.ceil(len(v) * 1.1 / max(width - 1, 1)))
            for i, v in enumerate(values, start=row0 + 1):
                if v is None:
                    ws.write_blank(i, j, None)
                elif isinstance(v, bool):
                    ws.write_boolean(i, j, v)
                elif isinstance(v, (_dt.date, _dt.datetime)):
                    d = v if isinstance(v, _dt.datetime) else _dt.datetime(v.year, v.month, v.day)
                    ws.write_datetime(i, j, d, fmts["date"])
                elif isinstance(v, (int, float)):
                    k = kind or (units[i - row0 - 1] if units else "number")
                    ws.write_number(i, j, v, fmts[k])
                else:
                    ws.write_string(i, j, v, wrap)
        for i, n in enumerate(lines):
            if n > 1:
                ws.set_row(row0 + i, 15 * n)
        shown = [j for j, c in enumerate(df.columns) if c not in lay.hidden]
        last_row, last_col = row0 + len(safe), max(max(shown, default=1), 1)
        ws.freeze_panes(row0 + 1, 0)
        ws.set_landscape()
        ws.set_paper(9)  # A4; fit-to-width keeps Letter printouts on one page wide too
        ws.set_margins(left=0.4, right=0.4, top=0.6, bottom=0.6)
        ws.fit_to_pages(1, 1 if lay.one_page else 0)
        ws.repeat_rows(row0)
        ws.print_area(0, 0, last_row, last_col)
        ws.set_header(f"&L{_header_text(title)}&R{_header_text(sheet)}")
        ws.set_footer("&CPage &P of &N")
    wb.close()


def _header_text(text: str) -> str:
    return str(text).replace("&", "&&")[:100]


def _shown(v) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}"
    return "" if v is None else str(v)


def _round(v: float, decimals: int | None) -> str:
    if decimals is None:
        x = float(f"{v:.6g}")
        return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)
    if decimals == 0:
        return str(int(round(v)))
    return f"{round(v, decimals):.{decimals}f}"


def csv_frame(df: pd.DataFrame, layout: SheetLayout | None) -> pd.DataFrame:
    """The table as CSV text cells: numbers rounded per kind (``CSV_PRECISION``), dates ISO."""
    if layout is None:
        return df
    units = None
    if layout.unit_column and layout.unit_column[1] in df.columns:
        units = [kind_for_unit(u) for u in df[layout.unit_column[1]].tolist()]
    out = {}
    for col in df.columns:
        values = df[col].tolist()
        kind = _column_kind(col, values, layout)
        cells = []
        for i, v in enumerate(values):
            if isinstance(v, (_dt.date, _dt.datetime)):
                cells.append(v.isoformat())
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                k = kind or (units[i] if units else "number")
                cells.append(_round(float(v), KINDS[k][1]))
            else:
                cells.append(v)
        out[col] = pd.Series(cells, dtype=object)
    return pd.DataFrame(out, columns=list(df.columns))


def write_csv(df: pd.DataFrame, path: str | os.PathLike, layout: SheetLayout | None = None) -> None:
    """CSV with a UTF-8 BOM and CRLF line ends; text made safe; with a ``layout`` numbers are
    rounded to the stated precision (``CSV_PRECISION``)."""
    _safe_frame(csv_frame(df, layout)).to_csv(path, index=False, lineterminator="\r\n", encoding="utf-8-sig")


def export_plan(plan, out_dir: str | os.PathLike, *, time: str | None = None, study_hash: str | None = None,
                parameters: dict | None = None, figure: bool = False) -> Path:
    """Write ``plan.xlsx`` and one CSV per sheet into ``out_dir`` (built in a temp dir, then
    renamed: nothing half-written). ``time`` (ISO text, default now UTC) goes into Provenance
    and the workbook's creation date. An existing ``out_dir`` is replaced only when it is empty
    or holds an earlier export; otherwise SpecError (nothing of the user's is deleted)."""
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise SpecError("--out exists and is not a directory", field="out", file=str(out),
                            fix="choose a new directory name for the plan export")
        entries = list(out.iterdir())
        if entries and not (out / XLSX_NAME).is_file():
            raise SpecError("--out directory exists and holds other files; the export would replace it",
                            field="out", file=str(out), fix="choose a new or empty directory")
    time = time or _now()
    created = _created(time)
    tables = plan_tables(plan, time=time, study_hash=study_hash, parameters=parameters)
    layouts = plan_layouts(plan)
    with atomic_dir(out) as tmp:
        write_xlsx(tables, tmp / XLSX_NAME, created=created, title=f"capplan plan: {plan.spec.name}",
                   layouts=layouts)
        for sheet, df in tables.items():
            write_csv(df, tmp / CSV_NAMES[sheet], layouts.get(sheet))
        if figure:
            (tmp / "plan_groups.html").write_text(
                plan.figure().to_html(include_plotlyjs=True, full_html=True, div_id="capplan-plan"),
                encoding="utf-8")
    return out
