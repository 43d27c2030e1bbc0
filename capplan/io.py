"""File output at the edges: atomic writes (temp file, then rename), the study writer, and
spreadsheet-safe table writers.

Nothing is ever half-written: a failure leaves either the old file or no file.

Tables meant for spreadsheets (plan and comparison exports) go through ``write_xlsx`` and
``write_csv``, which are safe to open in Excel or LibreOffice:
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
                compression: str = "zstd", overwrite: bool = True) -> Path:
    """Write a whole study directory atomically. ``events`` may be one table/frame or a
    mapping {relative file name: table} to split over several files; ``timeline`` (system
    events, optional) likewise, under timeline/."""
    dest = Path(dest)
    with atomic_dir(dest, overwrite=overwrite) as tmp:
        (tmp / C.EVENTS_DIR).mkdir()
        parts = events if isinstance(events, dict) else {events_name: events}
        for rel, tbl in parts.items():
            out = tmp / C.EVENTS_DIR / rel
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
