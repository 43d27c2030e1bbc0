"""File output at the edges: atomic writes (temp file, then rename), the study writer, and
spreadsheet-safe table writers.

Nothing is ever half-written: a failure leaves either the old file or no file.

Tables meant for spreadsheets (plan and comparison exports) go through ``write_xlsx`` and
``write_csv``, which are safe to open in Excel or LibreOffice (and, given a
:class:`SheetLayout` per sheet, format numbers per unit, print sensibly and round CSVs — the
plan export's layouts are in :mod:`capplan.export`):
- xlsxwriter with ``strings_to_formulas``/``strings_to_urls`` off, and every text cell or
  header that starts with ``= + - @`` tab, CR, LF (or full-width ``＝ ＋ － ＠``) gets a leading
  ``'`` so no spreadsheet runs it (CSV/formula injection); numbers are written as numbers,
  never as text; NaN is a blank cell and ±inf the text "inf"/"-inf";
- CSV with ``\\r\\n`` line ends (fields holding a bare CR are quoted) and a UTF-8 BOM, which
  Excel needs to read UTF-8.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from . import contract as C


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, suffix: str | None = None):
    """Yield a temp path beside ``dest``; on success rename it onto ``dest``."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix or dest.suffix, dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def write_text_atomic(dest: str | os.PathLike, text: str) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike, *, overwrite: bool = True):
    """Yield a temp directory beside ``dest``; on success it replaces ``dest`` as a whole."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            if not overwrite:
                raise FileExistsError(dest)
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def manifest_dict(name: str, runs: list[dict], *, system: dict | None = None,
                  workload: dict | None = None, load_model: str = "open", **extra) -> dict:
    """A study.yaml mapping in contract order."""
    d = {
        "contract": C.CONTRACT_VERSION,
        "name": name,
        "system": system or {"gpu": "unknown", "gpus_per_replica": 1, "tp": 1, "pp": 1, "replicas": 1},
        "workload": workload or {},
        "load_model": load_model,
        "runs": runs,
    }
    d.update(extra)
    return d


def events_table(data, columns: tuple[C.Column, ...] = C.EVENT_COLUMNS) -> pa.Table:
    """Coerce a pandas/polars frame, dict of columns or arrow table to the contract schema
    (contract columns in contract order, present optional columns kept, others dropped).
    ``columns``: the table's contract (events; ``C.TIMELINE_COLUMNS`` for system events)."""
    if isinstance(data, pa.Table):
        table = data
    elif isinstance(data, dict):
        table = pa.table(data)
    elif hasattr(data, "to_arrow"):  # polars
        table = data.to_arrow()
    else:  # pandas
        table = pa.Table.from_pandas(data, preserve_index=False)
    arrays, fields = [], []
    for c in columns:
        if c.name not in table.column_names:
            if c.required:
                raise KeyError(f"table is missing required column {c.name!r}")
            continue
        arr = table[c.name]
        if arr.type != c.dtype:
            arr = arr.cast(c.dtype)
        arrays.append(arr)
        fields.append(pa.field(c.name, c.dtype, nullable=c.nullable))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def write_study(dest: str | os.PathLike, manifest: dict, events, *, resources=None,
                timeline=None, events_name: str = "events.parquet", row_group_size: int = 1 << 20,
                compression: str = "zstd", overwrite: bool = True,
                carry_from: str | os.PathLike | None = None) -> Path:
    """Write a whole study directory atomically. ``events`` may be one table/frame or a
    mapping {relative file name: table} to split over several files; ``timeline`` (system
    events, optional) likewise, under timeline/. ``carry_from``: an existing study whose files
    (all but study.yaml: its event files, resources, timeline, anything else) are copied into
    the new directory first, so ``events`` are added beside its event files (appending runs)."""
    dest = Path(dest)
    with atomic_dir(dest, overwrite=overwrite) as tmp:
        if carry_from is not None:
            for entry in Path(carry_from).iterdir():
                if entry.name == C.MANIFEST_NAME:
                    continue
                if entry.is_dir():
                    shutil.copytree(entry, tmp / entry.name)
                else:
                    shutil.copy2(entry, tmp / entry.name)
        (tmp / C.EVENTS_DIR).mkdir(exist_ok=True)
        parts = events if isinstance(events, dict) else {events_name: events}
        for rel, tbl in parts.items():
            out = tmp / C.EVENTS_DIR / rel
            if out.exists():
                raise FileExistsError(f"{out.name} exists in the carried-over study")
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(events_table(tbl), out, row_group_size=row_group_size,
                           compression=compression)
        if timeline is not None:
            (tmp / C.TIMELINE_DIR).mkdir()
            tparts = timeline if isinstance(timeline, dict) else {"timeline.parquet": timeline}
            for rel, tbl in tparts.items():
                pq.write_table(events_table(tbl, C.TIMELINE_COLUMNS), tmp / C.TIMELINE_DIR / rel,
                               compression=compression)
        if resources is not None:
            (tmp / C.RESOURCES_DIR).mkdir()
            rparts = resources if isinstance(resources, dict) else {"power.parquet": resources}
            for rel, tbl in rparts.items():
                t = tbl if isinstance(tbl, pa.Table) else (
                    tbl.to_arrow() if hasattr(tbl, "to_arrow") else pa.Table.from_pandas(tbl, preserve_index=False))
                pq.write_table(t, tmp / C.RESOURCES_DIR / rel, compression=compression)
        (tmp / C.MANIFEST_NAME).write_text(
            yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return dest


# ----------------------------------------------------------------------------- spreadsheets

DANGEROUS_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\n", "＝", "＋", "－", "＠")

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
