"""Finance export: a plan as ``plan.xlsx`` plus the same tables as CSV, written atomically.

Safe for spreadsheets (see shared/design/TOOLING.md "Finance export"):
- xlsxwriter with ``strings_to_formulas``/``strings_to_urls`` off, and every text cell or
  header that starts with ``= + - @`` tab, CR, LF (or full-width ``＝ ＋ － ＠``) gets a leading
  ``'`` so no spreadsheet runs it; numbers are written as numbers, never as text;
- CSV with ``\\r\\n`` line ends (fields holding a bare CR are quoted) and a UTF-8 BOM;
- deterministic bytes: the workbook's creation time is the provenance time (a parameter that
  tests fix), so two exports of the same plan at the same time are byte-identical.

Sheets / CSV files: Summary (summary.csv), Plan line items (line_items.csv), Checks
(checks.csv), Assumptions (assumptions.csv), Capacity with CI (capacity.csv), Cost by quarter
(cost_by_quarter.csv), Provenance (provenance.csv).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from pathlib import Path

import pandas as pd

from . import __version__
from .errors import SpecError
from .io import atomic_dir

XLSX_NAME = "plan.xlsx"
DANGEROUS_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\n", "＝", "＋", "－", "＠")
SHEETS = ("Summary", "Plan line items", "Checks", "Assumptions", "Capacity with CI", "Cost by quarter",
          "Provenance")
CSV_NAMES = {"Summary": "summary.csv", "Plan line items": "line_items.csv", "Checks": "checks.csv",
             "Assumptions": "assumptions.csv", "Capacity with CI": "capacity.csv",
             "Cost by quarter": "cost_by_quarter.csv", "Provenance": "provenance.csv"}


def safe_text(value: str) -> str:
    """Text a spreadsheet will not run as a formula: a leading ``'`` before = + - @ tab CR LF
    (and their full-width forms)."""
    s = str(value)
    return "'" + s if s.startswith(DANGEROUS_PREFIXES) else s


def _cell(value):
    """Normalise a value for both writers: numbers stay numbers, None/NaN blank, text safe."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        v = float(value) if not isinstance(value, int) else value
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, float) and math.isinf(v):
            return safe_text("inf" if v > 0 else "-inf")
        return v
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalar
        return _cell(value.item())
    return safe_text(value)


def _safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    cols = [safe_text(c) for c in df.columns]
    data = {sc: pd.Series([_cell(v) for v in df[c].tolist()], dtype=object) for sc, c in zip(cols, df.columns)}
    return pd.DataFrame(data, columns=cols)


def plan_tables(plan, *, time: str, study_hash: str | None = None, parameters: dict | None = None
                ) -> dict[str, pd.DataFrame]:
    """The export's tables (unsanitised), keyed by sheet name, with units in the headers."""
    items = plan.to_frame().rename(columns={"item": "Line item", "value": "Value", "unit": "Unit",
                                            "formula": "Formula", "inputs": "Inputs", "key": "Key"})
    checks = plan.checks_frame().rename(columns={"check": "Check", "ok": "Holds", "key": "Key"})
    summary = plan.summary_frame().rename(columns={"quantity": "Quantity", "value": "Value", "unit": "Unit"})
    assumptions = plan.assumptions_frame().rename(columns={"assumption": "Assumption", "value": "Value",
                                                           "note": "Note"})
    for note in plan.notes:
        assumptions.loc[len(assumptions)] = ["note", note, "stated by the plan (what it could not compute, or a warning)"]
    capacity = plan.capacity.to_frame().rename(columns={"quantity": "Quantity", "value": "Value",
                                                        "unit": "Unit", "note": "Note", "status": "Status"})
    quarters = plan.quarters_frame().rename(columns={
        "quarter": "Quarter", "peak_rps": "Planned peak (req/s)", "forecast_mean_rps": "Forecast mean peak (req/s)",
        "groups": "Replica groups", "gpus": "GPUs", "nodes": "Nodes", "billed_gpus": "Billed GPUs",
        "cost_usd_per_quarter": "Cost (USD/quarter)",
        "cost_usd_per_1k_good_requests": "Cost per 1 000 SLO-meeting requests (USD)",
        "forecast_lower_rps": "Forecast interval low (req/s)"})
    prov = [("capplan version", __version__), ("plan", plan.spec.name), ("tenant", plan.spec.tenant),
            ("spec file", plan.spec.source), ("study", plan.capacity.study_name),
            ("study content hash (sha256)", study_hash or plan.capacity.study_hash),
            ("SLO", str(plan.slo) if plan.slo is not None else None),
            ("capacity source", plan.capacity.source), ("time", time)]
    for k, v in sorted((parameters or {}).items()):
        prov.append((f"parameter {k}", v if isinstance(v, (int, float, str, bool)) or v is None
                     else json.dumps(v, sort_keys=True, default=str)))
    prov.append(("spec (JSON)", json.dumps(plan.spec.to_dict(), sort_keys=True, default=str, ensure_ascii=False)))
    provenance = pd.DataFrame(prov, columns=["Key", "Value"])
    out = {"Summary": summary, "Plan line items": items, "Checks": checks, "Assumptions": assumptions,
           "Capacity with CI": capacity, "Cost by quarter": quarters, "Provenance": provenance}
    for sheet, df in getattr(plan.capacity, "tables", ()):  # SLO classes, production mix (docs/mix.md)
        out[sheet] = df
    return out


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


def write_xlsx(tables: dict[str, pd.DataFrame], path: str | os.PathLike, *, created: _dt.datetime,
               title: str = "capplan plan") -> None:
    """Write the tables with xlsxwriter: formulas and URLs off, text made safe, numbers as numbers."""
    import xlsxwriter

    wb = xlsxwriter.Workbook(str(path), {"strings_to_formulas": False, "strings_to_urls": False,
                                         "strings_to_numbers": False, "nan_inf_to_errors": False})
    wb.set_properties({"title": title, "author": "capplan", "created": created})
    head = wb.add_format({"bold": True, "text_wrap": True, "valign": "top"})
    wrap = wb.add_format({"text_wrap": True, "valign": "top"})
    num = wb.add_format({"num_format": "#,##0.########", "valign": "top"})
    for sheet, df in tables.items():
        ws = wb.add_worksheet(sheet)
        safe = _safe_frame(df)
        for j, col in enumerate(safe.columns):
            ws.write_string(0, j, col, head)
            width = max([len(str(col))] + [len(str(v)) for v in safe[col].tolist() if v is not None] + [8])
            ws.set_column(j, j, min(width + 2, 80))
            for i, v in enumerate(safe[col].tolist(), start=1):
                if v is None:
                    ws.write_blank(i, j, None)
                elif isinstance(v, bool):
                    ws.write_boolean(i, j, v)
                elif isinstance(v, (int, float)):
                    ws.write_number(i, j, v, num)
                else:
                    ws.write_string(i, j, v, wrap)
        ws.freeze_panes(1, 0)
    wb.close()


def write_csv(df: pd.DataFrame, path: str | os.PathLike) -> None:
    _safe_frame(df).to_csv(path, index=False, lineterminator="\r\n", encoding="utf-8-sig")


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
    with atomic_dir(out) as tmp:
        write_xlsx(tables, tmp / XLSX_NAME, created=created)
        for sheet, df in tables.items():
            write_csv(df, tmp / CSV_NAMES.get(sheet, sheet.lower().replace(" ", "_") + ".csv"))
        if figure:
            (tmp / "plan_groups.html").write_text(
                plan.figure().to_html(include_plotlyjs=True, full_html=True, div_id="capplan-plan"),
                encoding="utf-8")
    return out
