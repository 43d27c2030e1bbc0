"""Exports for people: a plan as ``plan.xlsx`` (finance) and a comparison as
``compare.xlsx`` (release gates), each plus the same tables as CSV, written atomically.

The files are written by the spreadsheet-safe writers of :mod:`capplan.io` (``write_xlsx``,
``write_csv``: no formula or URL is ever run, numbers stay numbers, CSV with CRLF and a BOM).
Deterministic bytes: the workbook's creation time is the provenance time (a parameter that
tests fix), so two exports of the same plan at the same time are byte-identical.

Plan sheets / CSV files: Summary (summary.csv), Plan line items (line_items.csv), Checks
(checks.csv), Assumptions (assumptions.csv), Capacity with CI (capacity.csv), Cost by quarter
(cost_by_quarter.csv), Provenance (provenance.csv). Comparison sheets: Comparison, Buckets,
Fairness, Workload, Verdict, Provenance (``COMPARE_CSV_NAMES``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

import pandas as pd

from .version import __version__
from .errors import SpecError
from .io import atomic_dir, write_csv, write_xlsx

XLSX_NAME = "plan.xlsx"
SHEETS = ("Summary", "Plan line items", "Checks", "Assumptions", "Capacity with CI", "Cost by quarter",
          "Provenance")
CSV_NAMES = {"Summary": "summary.csv", "Plan line items": "line_items.csv", "Checks": "checks.csv",
             "Assumptions": "assumptions.csv", "Capacity with CI": "capacity.csv",
             "Cost by quarter": "cost_by_quarter.csv", "Provenance": "provenance.csv"}


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


def export_plan(plan, out_dir: str | os.PathLike, *, time: str | None = None, study_hash: str | None = None,
                parameters: dict | None = None, figure: bool = False) -> Path:
    """Write ``plan.xlsx`` and one CSV per sheet into ``out_dir`` (built in a temp dir, then
    renamed: nothing half-written). ``time`` (ISO text, default now UTC) goes into Provenance
    and the workbook's creation date. An existing ``out_dir`` is replaced only when it is empty
    or holds an earlier export; otherwise SpecError (nothing of the user's is deleted)."""
    out = check_export_dir(out_dir, XLSX_NAME, "plan")
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


def check_export_dir(out_dir, marker: str, what: str, field: str = "out") -> Path:
    """An export directory may be new, empty, or an earlier export of the same kind (it holds
    ``marker``); anything else is a SpecError — nothing of the user's is replaced."""
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise SpecError("--out exists and is not a directory", field=field, file=str(out),
                            fix=f"choose a new directory name for the {what} export")
        if any(out.iterdir()) and not (out / marker).is_file():
            raise SpecError("--out directory exists and holds other files; the export would "
                            "replace it", field=field, file=str(out),
                            fix="choose a new or empty directory")
    return out


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
        write_xlsx(tables, tmp / COMPARE_XLSX, created=_created(time), title="capplan comparison")
        for sheet, df in tables.items():
            write_csv(df, tmp / COMPARE_CSV_NAMES[sheet])
    return out
