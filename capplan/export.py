"""Exports for people: a plan as ``plan.xlsx`` (finance) and a comparison as
``compare.xlsx`` (release gates), each plus the same tables as CSV, written atomically.

What a finance reader gets (docs/plan.md "Finance export"):
- numbers in numeric cells with a format per unit — whole numbers for groups, GPUs and nodes,
  currency with 2 decimals, percentages, req/s with 3 decimals, dates as dates — and text in
  text columns (a table never mixes the two in one column: key–value tables have a ``Value``
  column for numbers and a ``Text`` column for words);
- the plan dated: cost by quarter (first and last day), by month and by plan year;
- the capacity contract (Contract: workload, tail SLO, goodput, headroom, overload response,
  each with its source) right after the Summary, and the chargeback (Chargeback: the monthly
  cost per tenant / SLO class by token share, summing to the cent to the total);
- a print setup on every sheet: A4 landscape, one page wide, the header row repeated on each
  page, a print area, never below 8 pt (``capplan.io.write_xlsx``); the Summary, Contract, Cost by year,
  Chargeback and Capacity with CI on one page each; the cost sheets right after the Contract;
- CSVs rounded to a stated precision (``CSV_PRECISION``: money to the cent, req/s to 0.0001,
  fractions to 6 decimals, percentages to 0.01, counts whole, other numbers to 6 significant
  digits) so they carry no float noise; the workbook keeps full precision.

The files are written by the spreadsheet-safe writers of :mod:`capplan.io` (``write_xlsx``,
``write_csv``: no formula or URL is ever run, numbers stay numbers, CSV with CRLF and a BOM),
given this module's :func:`plan_layouts` for the plan. Deterministic bytes: the workbook's
creation time is the provenance time (a parameter that tests fix), so two exports of the same
plan at the same time are byte-identical. Comparison sheets: Comparison, Buckets, Fairness,
Workload, Verdict, Provenance (``COMPARE_CSV_NAMES``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

import pandas as pd

from .errors import SpecError
from .io import SheetLayout, atomic_dir, write_csv, write_xlsx
from .version import __version__

XLSX_NAME = "plan.xlsx"
#: the sheets in print order: what it costs first, then how it was sized, then where it came from
SHEETS = ("Summary", "Contract", "Cost by quarter", "Cost by month", "Cost by year", "Chargeback",
          "Plan line items", "Checks",
          "Capacity with CI", "Assumptions", "Provenance")
CSV_NAMES = {"Summary": "summary.csv", "Plan line items": "line_items.csv", "Checks": "checks.csv",
             "Assumptions": "assumptions.csv", "Capacity with CI": "capacity.csv",
             "Cost by quarter": "cost_by_quarter.csv", "Cost by month": "cost_by_month.csv",
             "Cost by year": "cost_by_year.csv", "Provenance": "provenance.csv", "Contract": "contract.csv",
             "Chargeback": "chargeback.csv"}

#: what each kind's CSV precision is, in words (stated in Provenance and docs/plan.md)
CSV_PRECISION = ("CSV numbers are rounded: money (USD) to 0.01, rates (req/s) to 0.0001, fractions to "
                 "0.000001, percentages to 0.01, counts (groups, GPUs, nodes, requests) to whole numbers, "
                 "energy (Wh, kW) to 0.0001, tokens to 0.1, other numbers to 6 significant digits; plan.xlsx keeps full "
                 "precision and shows it rounded by its number formats")

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
    cb = plan.chargeback()
    charge = cb.to_frame()
    total = ["total"] + [None] * (len(cb.by) - 1) + [charge[c].sum() for c in charge.columns[len(cb.by) or 1:]]
    total[-1] = cb.total_usd_per_month  # the cents of the rows sum to it exactly (largest remainder)
    charge.loc[len(charge)] = total
    charge["Note"] = [None] * (len(charge) - 1) + [f"weight: {cb.weight}; at the planned size of the first quarter"]
    out = {"Summary": summary, "Contract": plan.contract().to_frame(), "Cost by quarter": quarters, "Cost by month": months, "Cost by year": years,
           "Chargeback": charge, "Plan line items": items, "Checks": checks, "Capacity with CI": capacity,
           "Assumptions": assumptions, "Provenance": provenance}
    for sheet, df in getattr(plan.capacity, "tables", ()):  # SLO classes, production mix (docs/mix.md)
        out[sheet] = df
    return out


def plan_layouts(plan) -> dict[str, SheetLayout]:
    """Number formats and print setup of the plan's sheets. The widths (characters) keep every
    sheet one A4 landscape page wide at 100 % or close to it (docs/plan.md "Finance export");
    machine keys are hidden (the CSVs carry them)."""
    unit = ("Value", "Unit")
    return {
        # the Unit column is wide so the plan's words above the table wrap over Value + Unit
        "Summary": SheetLayout(unit_column=unit, about=tuple(plan.about()), one_page=True,
                               widths={"Quantity": 44, "Value": 16, "Unit": 60, "Key": 30}, hidden=("Key",)),
        "Contract": SheetLayout(one_page=True, widths={"Clause": 18, "What the capacity holds for": 90,
                                                       "Source": 50}),
        "Cost by quarter": SheetLayout(kinds=dict(_QUARTER_KINDS)),
        "Cost by month": SheetLayout(kinds={"First day": "date", "Last day": "date", "Billed GPUs": "int",
                                            "Cost (USD)": "usd"}),
        "Cost by year": SheetLayout(kinds={"First day": "date", "Last day": "date", "Quarters": "int",
                                           "Cost (USD)": "usd"}, one_page=True),
        "Chargeback": SheetLayout(kinds={"Requests in study": "int", "Share of tokens": "fraction", "Input tokens": "tokens",
                                         "Output tokens": "tokens",
                                         "GPU-hours per month": "number", "Cost per month (USD)": "usd"},
                                  one_page=True, widths={"Note": 60}),
        "Plan line items": SheetLayout(unit_column=unit, widths={"Line item": 32, "Value": 14, "Unit": 11,
                                                                 "Formula": 48, "Inputs": 42, "Key": 24},
                                       hidden=("Key",)),
        "Checks": SheetLayout(widths={"Check": 72, "Holds": 7, "Caveat": 52, "Key": 16}, hidden=("Key",)),
        "Capacity with CI": SheetLayout(unit_column=unit, one_page=True,
                                        widths={"Quantity": 46, "Value": 12, "Unit": 9, "Note": 70}),
        "Assumptions": SheetLayout(unit_column=unit, widths={"Assumption": 44, "Value": 12, "Text": 44,
                                                             "Unit": 10, "Note": 44}),
        "Provenance": SheetLayout(widths={"Key": 30, "Value": 100}),
    }


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def created_time(time: str) -> _dt.datetime:
    try:
        t = _dt.datetime.fromisoformat(time)
    except ValueError:
        raise SpecError(f"export time {time!r} is not an ISO timestamp", field="time",
                        fix="e.g. 2026-01-01T00:00:00+00:00") from None
    if t.tzinfo is not None:
        t = t.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return t


def export_plan(plan, out_dir: str | os.PathLike, *, time: str | None = None, study_hash: str | None = None,
                parameters: dict | None = None, figure: bool = False) -> Path:
    """Write ``plan.xlsx`` and one CSV per sheet into ``out_dir`` (built in a temp dir, then
    renamed: nothing half-written). ``time`` (ISO text, default now UTC) goes into Provenance
    and the workbook's creation date. An existing ``out_dir`` is replaced only when it is empty
    or holds an earlier export; otherwise SpecError (nothing of the user's is deleted)."""
    out = check_export_dir(out_dir, XLSX_NAME, "plan")
    time = time or _now()
    created = created_time(time)
    tables = plan_tables(plan, time=time, study_hash=study_hash, parameters=parameters)
    layouts = plan_layouts(plan)
    with atomic_dir(out) as tmp:
        write_xlsx(tables, tmp / XLSX_NAME, created=created, title=f"capplan plan: {plan.spec.name}",
                   layouts=layouts)
        for sheet, df in tables.items():
            write_csv(df, tmp / CSV_NAMES.get(sheet, sheet.lower().replace(" ", "_") + ".csv"), layouts.get(sheet))
        if figure:
            (tmp / "plan_groups.html").write_text(
                plan.figure().to_html(include_plotlyjs=True, full_html=True, div_id="capplan-plan"),
                encoding="utf-8")
    return out


def check_export_dir(out_dir, marker: str, what: str, field: str = "out") -> Path:
    """An export directory may be new, empty, or an earlier export of the same kind (it holds
    ``marker``): ``io.check_out``."""
    from .io import check_out

    return check_out(out_dir, marker, f"{what} export", field=field)


# ----------------------------------------------------------------------------- comparison

COMPARE_XLSX = "compare.xlsx"
COMPARE_CSV_NAMES = {"Comparison": "comparison.csv", "Buckets": "buckets.csv",
                     "Fairness": "fairness.csv", "Workload": "workload.csv",
                     "Verdict": "verdict.csv", "Provenance": "provenance.csv"}


def comparison_tables(cmp, *, time: str, hashes: tuple[str, str] | None = None
                      ) -> dict[str, pd.DataFrame]:
    """The tables of a ``capplan.compare.Comparison`` keyed by sheet name (numbers stay
    numbers)."""
    v = cmp.verdict
    verdict = pd.DataFrame(
        [("passed", str(v.passed))] + [("gate failed", f) for f in v.failed]
        + [("bucket regressed", f) for f in v.flagged_buckets] + [("note", n) for n in v.notes],
        columns=["item", "text"])
    prov = [("capplan version", __version__), ("baseline", cmp.baseline_name),
            ("candidate", cmp.candidate_name), ("SLO", str(cmp.slo)),
            ("gates", cmp.gates.source), ("bootstrap", "paired" if cmp.paired else "independent"),
            ("replicates", cmp.reps), ("seed", cmp.seed),
            ("confidence (each family)", cmp.confidence_headline), ("time", time)]
    if hashes:
        prov += [("baseline content hash (sha256)", hashes[0]),
                 ("candidate content hash (sha256)", hashes[1])]
    return {"Comparison": cmp.to_frame(), "Buckets": cmp.buckets, "Fairness": cmp.fairness,
            "Workload": cmp.workload, "Verdict": verdict,
            "Provenance": pd.DataFrame(prov, columns=["key", "value"])}


def check_compare_out(out_dir) -> Path:
    """``capplan compare --out``: new, empty, or an earlier comparison export."""
    return check_export_dir(out_dir, COMPARE_XLSX, "comparison", field="--out")


def export_comparison(cmp, out_dir, *, time: str | None = None,
                      hashes: tuple[str, str] | None = None) -> Path:
    """Write compare.xlsx and one CSV per sheet, built in a temp directory and renamed (never
    half-written); text cells are formula-injection safe."""
    out = check_compare_out(out_dir)
    time = time or _now()
    tables = comparison_tables(cmp, time=time, hashes=hashes)
    with atomic_dir(out) as tmp:
        write_xlsx(tables, tmp / COMPARE_XLSX, created=created_time(time), title="capplan comparison")
        for sheet, df in tables.items():
            write_csv(df, tmp / COMPARE_CSV_NAMES[sheet])
    return out
