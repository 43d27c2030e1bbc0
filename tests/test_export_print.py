"""The plan workbook on paper: rendered to PDF through LibreOffice headless, the demo plan's
Summary is one A4 page, no printed text is smaller than 8 pt, every sheet is one page wide,
and the numbers on paper are the plan's. Without LibreOffice these tests are skipped locally
and fail under CI (the ``libreoffice`` fixture; .ci/run installs it). The print decisions that
need no renderer (fit, scale, fallbacks) are checked on the XLSX itself.

How a page's smallest text is measured: poppler's ``pdftohtml -xml`` lists each font as it is
drawn on the page — its size times the page's scale — rounded to 1/zoom pt (zoom 3, the most
it allows); a size counts as ≥ 8 pt only when even its rounding cannot take it below 8.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import openpyxl
import pandas as pd
import pytest

from capplan.cli import main
from capplan.export import SHEETS
from capplan.io import MIN_PRINT_PT, MIN_PRINT_SCALE, SheetLayout, write_xlsx

ROOT = Path(__file__).resolve().parents[1]
T = "2026-12-01T00:00:00+00:00"
#: the demo workbook prints in 15 A4 pages (13 before the one-page Contract and Chargeback
#: sheets; it was 11, at 4–7 pt); a little room for longer notes
MAX_DEMO_PAGES = 16


@dataclass(frozen=True)
class Page:
    number: int
    sheet: str
    smallest_pt: float  # the smallest text drawn, in points as printed, rounded down by its rounding
    text: str
    overlaps: tuple  # pairs of text lines drawn over each other (a wrapped cell taller than its row)


def render(xlsx: Path, out: Path) -> Path:
    """``soffice --headless --convert-to pdf`` with a private profile (another LibreOffice
    running on the box would otherwise take the job, or refuse it)."""
    profile = out / "lo-profile"
    subprocess.run(["soffice", f"-env:UserInstallation={profile.as_uri()}", "--headless", "--convert-to", "pdf",
                    "--outdir", str(out), str(xlsx)], check=True, capture_output=True, timeout=240)
    pdf = out / xlsx.with_suffix(".pdf").name
    assert pdf.is_file(), f"LibreOffice wrote no PDF for {xlsx}"
    return pdf


def pages(pdf: Path, sheets) -> list[Page]:
    """Each page of ``pdf``: its sheet (named in the page header's right part), its smallest
    printed text and its text. Every page must be A4 landscape."""
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    size = next(line for line in info.splitlines() if line.startswith("Page size:")).split()
    width_pt, height_pt = float(size[2]), float(size[4])
    assert (round(width_pt), round(height_pt)) == (842, 595), f"not A4 landscape: {size}"
    xml = subprocess.run(["pdftohtml", "-xml", "-i", "-q", "-stdout", "-zoom", "3", str(pdf)],
                         capture_output=True, text=True, check=True).stdout
    root = ET.fromstring(xml.split("\n", 2)[2] if xml.startswith("<?xml") else xml)
    fonts: dict[str, float] = {}
    families: dict[str, str] = {}
    out = []
    for page in root.iter("page"):
        zoom = float(page.get("width")) / width_pt  # pdftohtml caps the zoom; its page width says which
        for f in page.iter("fontspec"):
            fonts[f.get("id")] = float(f.get("size")) / zoom - 0.5 / zoom
            families[f.get("id")] = f.get("family").split("+")[-1]  # less the subset's prefix
        texts = [(float(t.get("top")) / zoom, t.get("font"), "".join(t.itertext())) for t in page.iter("text")]
        header = [s for top, _, s in texts if top < 0.6 * 72 and s in sheets]
        assert len(header) == 1, f"page {page.get('number')}: no sheet name in its header ({texts[:3]})"
        boxes = [(*(float(t.get(k)) / zoom for k in ("left", "top", "width", "height")), "".join(t.itertext()),
                  families[t.get("font")]) for t in page.iter("text")]
        out.append(Page(int(page.get("number")), header[0], min(fonts[f] for _, f, _ in texts),
                        "\n".join(s for _, _, s in texts), _overlaps(boxes)))
    return out


def _overlaps(boxes, tolerance_pt: float = 1.0) -> tuple:
    """Pairs of text boxes (left, top, width, height, text, font family) drawn over each other:
    they share more than ``tolerance_pt`` across and more than half a line down (the boxes of
    a wrapped cell's consecutive lines touch by a point or two: their glyphs' ascent and
    descent). Glyphs from a fallback font (⌈ ⌉ here) are boxes of their own inside their
    line's box, on the same line in another font: not an overlap."""
    out = []
    for i, (x1, y1, w1, h1, a, f1) in enumerate(boxes):
        for x2, y2, w2, h2, b, f2 in boxes[i + 1:]:
            if f1 != f2 and abs(y1 - y2) < tolerance_pt:
                continue
            dx = min(x1 + w1, x2 + w2) - max(x1, x2)
            dy = min(y1 + h1, y2 + h2) - max(y1, y2)
            if dx > tolerance_pt and dy > 0.5 * min(h1, h2):
                out.append((a, b))
    return tuple(out)


@pytest.fixture(scope="module")
def demo_pdf(tmp_path_factory, libreoffice):
    """The demo plan's workbook exactly as `capplan plan data/sample --spec templates/plan.yaml`
    (and `capplan report`, which exports the same plan) writes it, rendered to PDF."""
    d = tmp_path_factory.mktemp("demo_print")
    rc = main(["plan", str(ROOT / "data" / "sample"), "--spec", str(ROOT / "templates" / "plan.yaml"),
               "--out", str(d / "plan"), "--time", T])
    assert rc == 0
    return d / "plan" / "plan.xlsx", render(d / "plan" / "plan.xlsx", d)


def test_demo_workbook_prints_readably(demo_pdf):
    xlsx, pdf = demo_pdf
    got = pages(pdf, SHEETS)
    by_sheet = {s: [p for p in got if p.sheet == s] for s in SHEETS}
    summary = "\n".join(f"{p.number}: {p.sheet} {p.smallest_pt:.2f} pt" for p in got)
    # every sheet printed, in order, cost right after the Summary
    assert [p.sheet for p in got] == sorted((p.sheet for p in got), key=SHEETS.index), summary
    assert all(by_sheet[s] for s in SHEETS), summary
    # the Summary, the cost sheets and the capacity sheet on one page each
    for s in ("Summary", "Cost by quarter", "Cost by month", "Cost by year", "Capacity with CI", "Checks"):
        assert len(by_sheet[s]) == 1, summary
    assert len(got) <= MAX_DEMO_PAGES, summary
    # readable: no text on any page under 8 pt (font size × print scale), none drawn over another
    assert min(p.smallest_pt for p in got) >= MIN_PRINT_PT, summary
    assert not [p.overlaps for p in got if p.overlaps], [(p.number, p.overlaps[:3]) for p in got if p.overlaps]
    # one page wide: every page of a sheet shows its first and last printed column's header
    wb = openpyxl.load_workbook(xlsx)
    for s in SHEETS:
        ws = wb[s]
        head = int(ws.print_title_rows.split(":")[0].strip("$"))  # the header row, repeated on each page
        shown = [c.value for c in ws[head] if c.value and not ws.column_dimensions[c.column_letter].hidden]
        for p in by_sheet[s]:
            for h in (shown[0], shown[-1]):
                assert h.split()[0] in p.text, f"{s} page {p.number} lacks column {h!r}"
    # the numbers on paper are the plan's (the workbook's, formatted)
    items = {r[5]: r[1] for r in wb["Plan line items"].iter_rows(min_row=2, values_only=True)}
    page1 = by_sheet["Summary"][0].text
    assert f"${items['cost_usd_per_month']:,.2f}" in page1 and f"{items['total_gpus']:,.0f}" in page1
    # the plan's words above the Summary table are printed whole (wrapped, not cut off)
    head = int(wb["Summary"].print_title_rows.split(":")[0].strip("$"))
    about = {r[0]: r[1] for r in wb["Summary"].iter_rows(min_row=2, max_row=head - 1, values_only=True) if r[0]}
    assert {"plan", "period", "SLO", "capacity used", "failure policy", "prices"} <= set(about)
    flat = " ".join(page1.split())
    for label, text in about.items():
        assert " ".join(text.split()) in flat, (label, text)


def test_worst_cases_print_at_8_pt_or_more(tmp_path, libreoffice):
    """Sheets the plan does not make today but a spec could: 30 number columns (too wide for
    one page at 82 %: printed at 82 % across pages, the first column repeated), long text
    columns (narrowed until one page wide), and a one-page sheet too long for one page (one
    page wide instead) — every page ≥ 8 pt."""
    wide = pd.DataFrame({f"metric {j} (req/s)": [1234.5 + i for i in range(5)] for j in range(30)})
    wide.insert(0, "run", [f"r{i}" for i in range(5)])
    text = pd.DataFrame({"what": ["a long explanation " * 8] * 6, "why": ["because " * 30] * 6,
                         "how": ["step by step " * 12] * 6, "value": [1.5] * 6})
    long_about = tuple((f"label {i}", "words " * 40) for i in range(40))
    tall = pd.DataFrame({"Quantity": ["q"] * 20, "Value": [1.0] * 20, "Unit": ["u"] * 20})
    tables = {"Wide": wide, "Text": text, "Tall": tall}
    layouts = {"Tall": SheetLayout(about=long_about, one_page=True)}
    xlsx = tmp_path / "worst.xlsx"
    write_xlsx(tables, xlsx, created=dt.datetime(2026, 1, 1), title="worst", layouts=layouts)
    got = pages(render(xlsx, tmp_path), tables)
    summary = "\n".join(f"{p.number}: {p.sheet} {p.smallest_pt:.2f} pt" for p in got)
    assert min(p.smallest_pt for p in got) >= MIN_PRINT_PT, summary
    assert not [p.overlaps for p in got if p.overlaps], [(p.number, p.overlaps[:3]) for p in got if p.overlaps]
    assert len([p for p in got if p.sheet == "Text"]) == 1, summary  # one page: it fits once narrowed
    wide_pages = [p for p in got if p.sheet == "Wide"]
    assert len(wide_pages) > 1 and all("run" in p.text.split() for p in wide_pages), summary


def test_print_setup_decisions(tmp_path):
    """What the workbook asks the printer for (no renderer needed): the same worst cases."""
    wide = pd.DataFrame({f"m{j}": [1234.5] for j in range(30)})
    text = pd.DataFrame({c: [f"{c} " * 100] for c in ("what", "why", "how", "who", "when")})
    tall = pd.DataFrame({"Quantity": ["q"], "Value": [1.0], "Unit": ["u"]})
    short = pd.DataFrame({"Quantity": ["q"], "Value": [1.0], "Unit": ["u"]})
    layouts = {"Tall": SheetLayout(about=tuple((f"l{i}", "w " * 200) for i in range(40)), one_page=True),
               "Short": SheetLayout(about=(("plan", "demo"),), one_page=True)}
    write_xlsx({"Wide": wide, "Text": text, "Tall": tall, "Short": short}, tmp_path / "a.xlsx",
               created=dt.datetime(2026, 1, 1), layouts=layouts)
    wb = openpyxl.load_workbook(tmp_path / "a.xlsx")
    w = wb["Wide"]
    assert not w.sheet_properties.pageSetUpPr.fitToPage and w.page_setup.scale == round(MIN_PRINT_SCALE * 100)
    assert w.print_title_cols == "$A:$A"  # the row labels repeat on every page across
    t = wb["Text"]
    assert t.sheet_properties.pageSetUpPr.fitToPage and t.page_setup.fitToHeight == 0
    # 5 × 40 characters would need 70 % (openpyxl keeps a run of equal columns under its first)
    widths = [d.width for d in t.column_dimensions.values() for _ in range(d.min, d.max + 1)]
    assert all(24 < w < 40 for w in widths), widths  # narrowed (its text wraps), not to a sliver
    tall = wb["Tall"]  # too long for one page at 82 %: one page wide, as long as it takes
    assert tall.sheet_properties.pageSetUpPr.fitToPage and tall.page_setup.fitToHeight == 0
    short = wb["Short"]
    assert short.sheet_properties.pageSetUpPr.fitToPage and short.page_setup.fitToHeight in (None, 1)
    for ws in wb.worksheets:
        assert ws.page_setup.orientation == "landscape" and ws.page_setup.paperSize == 9
