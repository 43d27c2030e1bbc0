"""Finance export: round trip through openpyxl, no formula cells, injection-safe, deterministic."""

from __future__ import annotations

import io
import math
import re

import openpyxl
import pandas as pd
import pytest

from capplan.cli import main
from capplan.errors import SpecError
from capplan.export import SHEETS, CSV_NAMES, export_plan
from capplan.io import safe_text
from capplan.plan import load_plan_spec, make_plan

T = "2026-01-02T03:04:05+00:00"
SPEC = {
    "name": "tp4 plan",
    "tenant": "acme",
    "slo": "ttft_ms=2000,attainment=0.99",
    "demand": {"peak_rps": 380.0, "uncertainty": 0.1, "horizon_quarters": 3, "growth_per_quarter": 0.1,
               "mean_to_peak": 0.5, "output_tokens_per_request": 200},
    "replica_group": {"gpus_per_replica": 4},
    "failure": {"policy": "zone", "zones": 3},
    "prices": {"usd_per_gpu_hour": 2.0, "overhead_pct": 10, "usd_per_kwh": 0.1, "pue": 1.3, "gpu_power_w": 500},
}


def plan_of(**top):
    return make_plan(load_plan_spec({**SPEC, **top}), capacity=50.0)


def read_sheet(ws):
    rows = list(ws.iter_rows(values_only=True))
    return list(rows[0]), [list(r) for r in rows[1:]]


def test_round_trip_numbers_and_sheets(tmp_path):
    plan = plan_of()
    out = export_plan(plan, tmp_path / "x", time=T, study_hash="abc123")
    wb = openpyxl.load_workbook(out / "plan.xlsx")
    for s in ("Summary", "Plan line items", "Assumptions", "Capacity with CI", "Cost by quarter", "Provenance"):
        assert s in wb.sheetnames
    assert wb.sheetnames == list(SHEETS)
    # no formula cells anywhere
    for ws in wb.worksheets:
        for row in ws.iter_rows():
            for cell in row:
                assert cell.data_type != "f", (ws.title, cell.coordinate, cell.value)
    head, rows = read_sheet(wb["Plan line items"])
    assert head == ["Line item", "Value", "Unit", "Formula", "Inputs", "Key"]
    got = {r[5]: r[1] for r in rows}
    for it in plan.items:
        assert isinstance(got[it.key], (int, float)) and not isinstance(got[it.key], bool)
        assert got[it.key] == pytest.approx(it.value, rel=1e-12)
    head, rows = read_sheet(wb["Cost by quarter"])
    assert "Cost per quarter (USD)" in head and "Peak demand (req/s)" in head
    col = head.index("Cost per quarter (USD)")
    assert [r[col] for r in rows] == pytest.approx([q.cost_usd_per_quarter for q in plan.quarters])
    prov = dict(read_sheet(wb["Provenance"])[1])
    assert prov["time"] == T and prov["study content hash (sha256)"] == "abc123"
    assert prov["capplan version"] == __import__("capplan").__version__
    assert wb.properties.created.isoformat().startswith("2026-01-02T03:04:05")
    checks = read_sheet(wb["Checks"])[1]
    assert all(r[1] is True for r in checks)
    # CSVs: same tables, BOM + CRLF
    for sheet, name in CSV_NAMES.items():
        raw = (out / name).read_bytes()
        assert raw.startswith(b"\xef\xbb\xbf") and b"\r\n" in raw
    df = pd.read_csv(out / "line_items.csv", encoding="utf-8-sig")
    assert df.set_index("Key").loc["total_groups", "Value"] == plan.value("total_groups")
    assert df.set_index("Key").loc["cost_usd_per_month", "Value"] == pytest.approx(plan.value("cost_usd_per_month"))


@pytest.mark.parametrize("evil", ["=HYPERLINK(\"http://x\",\"y\")", "+1+2", "-1+cmd|' /C calc'!A0", "@SUM(A1)",
                                  "\tx", "\rx", "\nx", "＝1+1", "＋1", "－1", "＠x"])
def test_injection_written_as_text(tmp_path, evil):
    plan = plan_of(name=evil, tenant=evil)
    out = export_plan(plan, tmp_path / "x", time=T)
    wb = openpyxl.load_workbook(out / "plan.xlsx")
    # xlsxwriter stores CR as the OOXML escape _x000D_ (Excel shows a CR; openpyxl keeps the escape)
    about = dict((r[0], r[1].replace("_x000D_", "\r") if isinstance(r[1], str) else r[1])
                 for r in wb["Summary"].iter_rows(values_only=True) if r[0] in ("plan", "tenant"))
    assert about["plan"] == "'" + evil and about["tenant"] == "'" + evil
    prov = dict((r[0], r[1].replace("_x000D_", "\r") if isinstance(r[1], str) else r[1])
                for r in read_sheet(wb["Provenance"])[1])
    assert prov["plan"] == "'" + evil and prov["tenant"] == "'" + evil
    for ws in wb.worksheets:
        for row in ws.iter_rows():
            for cell in row:
                assert cell.data_type != "f"
                if isinstance(cell.value, str):
                    assert not cell.value.startswith(("=", "+", "-", "@", "\t", "\r", "\n", "＝", "＋", "－", "＠"))
    # CSV: the evil text comes back whole (one row, prefixed), nothing split by the bare CR
    text = (out / "provenance.csv").read_bytes().decode("utf-8-sig")
    df = pd.read_csv(io.StringIO(text), keep_default_na=False)
    assert df.set_index("Key").loc["tenant", "Value"] == "'" + evil
    assert list(df.columns) == ["Key", "Value"]


def test_safe_text_rules():
    assert safe_text("-5") == "'-5" and safe_text("5") == "5" and safe_text("a=b") == "a=b"


def test_injection_in_headers_and_numbers_stay_numbers(tmp_path):
    from capplan.io import write_csv, write_xlsx
    import datetime as dt

    df = pd.DataFrame({"=bad header": ["=1+1", -3.5], "n": [1, float("nan")]})
    write_xlsx({"S": df}, tmp_path / "a.xlsx", created=dt.datetime(2026, 1, 1))
    ws = openpyxl.load_workbook(tmp_path / "a.xlsx")["S"]
    assert ws["A1"].value == "'=bad header"
    assert ws["A2"].value == "'=1+1" and ws["A3"].value == -3.5  # a negative number stays a number
    assert ws["B2"].value == 1 and ws["B3"].value is None
    write_csv(df, tmp_path / "a.csv")
    back = pd.read_csv(tmp_path / "a.csv", encoding="utf-8-sig")
    assert list(back.columns) == ["'=bad header", "n"] and back.iloc[1, 0] == "-3.5"


def test_deterministic_bytes(tmp_path):
    a = export_plan(plan_of(), tmp_path / "a", time=T, study_hash="h")
    b = export_plan(plan_of(), tmp_path / "b", time=T, study_hash="h")
    for name in ["plan.xlsx", *CSV_NAMES.values()]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    c = export_plan(plan_of(), tmp_path / "c", time="2027-01-01T00:00:00+00:00", study_hash="h")
    assert (a / "plan.xlsx").read_bytes() != (c / "plan.xlsx").read_bytes()


def test_out_dir_with_other_files_is_not_replaced(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.txt").write_text("keep me")
    with pytest.raises(SpecError, match="holds other files"):
        export_plan(plan_of(), d, time=T)
    assert (d / "thesis.txt").read_text() == "keep me"
    # an earlier export is replaced as a whole
    out = export_plan(plan_of(), tmp_path / "x", time=T)
    (out / "stale.csv").write_text("old")
    export_plan(plan_of(), out, time=T)
    assert not (out / "stale.csv").exists() and (out / "plan.xlsx").is_file()


def test_infinite_cost_is_text_not_an_error_cell(tmp_path):
    from capplan.io import _cell

    assert _cell(math.inf) == "inf" and _cell(float("nan")) is None and _cell(3) == 3


def test_cli_capacity_only(tmp_path, capsys):
    import yaml

    spec = tmp_path / "plan.yaml"
    spec.write_text(yaml.safe_dump({k: v for k, v in SPEC.items()}), encoding="utf-8")
    rc = main(["plan", "--capacity-rps", "50", "--spec", str(spec), "--out", str(tmp_path / "o"), "--time", T])
    text = capsys.readouterr().out
    assert rc == 0
    assert "Line items:" in text and "Checks:" in text and "[ok] after losing zone a" in text
    assert (tmp_path / "o" / "plan.xlsx").is_file()
    wb = openpyxl.load_workbook(tmp_path / "o" / "plan.xlsx")
    got = {r[5]: r[1] for r in read_sheet(wb["Plan line items"])[1]}
    assert got["total_groups"] == plan_of().value("total_groups")
    # --strict: a failed check (too few nodes available) exits 1, files still written
    assert main(["plan", "--capacity-rps", "50", "--spec", str(spec), "--out", str(tmp_path / "o"), "--strict",
                 "--time", T]) == 0
    spec.write_text(yaml.safe_dump({**SPEC, "failure": {"policy": "zone", "zones": 3, "nodes_available": 3}}),
                    encoding="utf-8")
    capsys.readouterr()
    assert main(["plan", "--capacity-rps", "50", "--spec", str(spec), "--out", str(tmp_path / "o2"), "--strict",
                 "--time", T]) == 1
    # D = 418 → R = 9; zone: 14 − ⌈14/3⌉ = 9 → 14 groups (5, 5, 4) at 2 per node → 3 + 3 + 2 = 8 nodes
    assert "[FAIL] planned nodes 8 ≤ nodes available 3" in capsys.readouterr().out
    assert (tmp_path / "o2" / "plan.xlsx").is_file()
    assert main(["plan", "--capacity-rps", "50", "--spec", str(spec), "--out", str(tmp_path / "o"),
                 "--time", "yesterday"]) == 2
    assert "not an ISO timestamp" in capsys.readouterr().err


# ------------------------------------------------------------------ formats and print setup


def _fmt(ws, coord):
    return ws[coord].number_format


def test_number_formats_numeric_cells_and_print_setup(tmp_path):
    """Integers without decimals, money with 2 decimals and a currency sign, percentages and
    rates with fixed decimals, dates as dates; numbers in numeric cells and words in text
    columns; every sheet landscape, one page wide, header row repeated, with a print area;
    the Summary on one page."""
    import datetime as dt

    plan = make_plan(load_plan_spec({**SPEC, "start": "2026-Q2"}), capacity=50.0)
    out = export_plan(plan, tmp_path / "x", time=T)
    wb = openpyxl.load_workbook(out / "plan.xlsx")
    for ws in wb.worksheets:
        assert ws.page_setup.orientation == "landscape", ws.title
        # fit to pages, one page wide (OOXML's default width and height are 1: left out when 1)
        assert ws.sheet_properties.pageSetUpPr.fitToPage and ws.page_setup.fitToWidth in (None, 1), ws.title
        assert ws.print_title_rows, ws.title  # header row repeated on every page
        assert ws.print_area, ws.title
    assert wb["Summary"].page_setup.fitToHeight in (None, 1) and wb["Plan line items"].page_setup.fitToHeight == 0

    def rows(name):
        ws = wb[name]
        values = list(ws.iter_rows())
        start = next(i for i, r in enumerate(values) if r[0].value in ("Quantity", "Line item", "Quarter",
                                                                      "Assumption", "Month", "Period"))
        head = [c.value for c in values[start]]
        return head, values[start + 1:]

    head, body = rows("Summary")
    by = {r[0].value: r for r in body}
    v, u = head.index("Value"), head.index("Unit")
    assert by["total GPUs"][v].data_type == "n" and _fmt(wb["Summary"], by["total GPUs"][v].coordinate) == "#,##0"
    assert by["total cost per month"][v].number_format == '"$"#,##0.00'
    assert by["utilisation at peak"][u].value == "%" and by["utilisation at peak"][v].number_format == "0.0"
    assert by["peak demand λ_peak"][v].number_format == "#,##0.000"
    assert all(r[v].data_type == "n" for r in body)  # Summary values: numbers only
    # the plan's words sit above the table, as text
    about = {r[0].value: r[1].value for r in wb["Summary"].iter_rows(max_row=12) if r[0].value}
    assert about["failure policy"].startswith("survive losing the largest of 3 zones")
    assert about["period"].startswith("2026Q2 to 2026Q4 (2026-04-01 to 2026-12-31")
    # text and numbers never share a column
    head, body = rows("Assumptions")
    v, t = head.index("Value"), head.index("Text")
    assert all(r[v].value is None or r[v].data_type == "n" for r in body)
    assert all(r[t].value is None or r[t].data_type == "s" for r in body)
    assert all(r[v].value is not None or r[t].value is not None for r in body)
    texts = [r[t].value for r in body if r[t].value]
    assert "a, b, c" in texts and not [x for x in texts if x.startswith("[") or x.startswith("{")]
    # assumptions the plan did not use are left out (k is for n_plus_k; PUE and gpu power are used here)
    assert not [r for r in body if r[0].value and r[0].value.startswith("groups that may fail at once")]
    # dates, and monthly / quarterly / annual totals
    head, body = rows("Cost by quarter")
    assert [r[0].value for r in body] == ["2026Q2", "2026Q3", "2026Q4"]
    first = body[0][head.index("First day")]
    assert first.is_date and first.value == dt.datetime(2026, 4, 1) and first.number_format == "yyyy-mm-dd"
    assert body[0][head.index("Replica groups")].number_format == "#,##0"
    assert body[0][head.index("Cost per quarter (USD)")].number_format == '"$"#,##0.00'
    head, months = rows("Cost by month")
    assert len(months) == 9 and months[0][0].value == "2026-04"
    q_cost = sum(r[head.index("Cost (USD)")].value for r in months[:3])
    assert q_cost == pytest.approx(plan.quarters[0].cost_usd_per_quarter)
    head, years = rows("Cost by year")
    assert years[0][0].value == "year 1 (3 quarters of 4)"
    assert years[0][head.index("Cost (USD)")].value == pytest.approx(sum(q.cost_usd_per_quarter for q in plan.quarters))


def test_csvs_are_rounded_to_the_stated_precision(tmp_path):
    plan = make_plan(load_plan_spec({**SPEC, "demand": {**SPEC["demand"], "peak_rps": 8.0}}), capacity=2.7660679936927552)
    out = export_plan(plan, tmp_path / "x", time=T)
    text = "".join((out / n).read_text(encoding="utf-8-sig") for n in CSV_NAMES.values())
    assert not re.search(r"\d\.\d{7,}", text.replace((out / "provenance.csv").read_text(encoding="utf-8-sig"), ""))
    q = pd.read_csv(out / "cost_by_quarter.csv", encoding="utf-8-sig", dtype=str)
    assert q["Peak demand (req/s)"].tolist() == ["8.0000", "8.8000", "9.6800"]  # not 9.680000000000001
    assert all(re.fullmatch(r"\d+\.\d\d", x) for x in q["Cost per quarter (USD)"])
    assert all(re.fullmatch(r"\d+", x) for x in q["Replica groups"])
    prov = pd.read_csv(out / "provenance.csv", encoding="utf-8-sig").set_index("Key")["Value"]
    assert "money (USD) to 0.01" in prov["CSV precision"]
