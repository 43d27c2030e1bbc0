"""File output at the edges: atomic writes (temp file, then rename) and the study writer.

Nothing is ever half-written: a failure leaves either the old file or no file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

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


def events_table(data) -> pa.Table:
    """Coerce a pandas/polars frame, dict of columns or arrow table to the contract schema
    (contract columns in contract order, present optional columns kept, others dropped)."""
    if isinstance(data, pa.Table):
        table = data
    elif isinstance(data, dict):
        table = pa.table(data)
    elif hasattr(data, "to_arrow"):  # polars
        table = data.to_arrow()
    else:  # pandas
        table = pa.Table.from_pandas(data, preserve_index=False)
    arrays, fields = [], []
    for c in C.EVENT_COLUMNS:
        if c.name not in table.column_names:
            if c.required:
                raise KeyError(f"events are missing required column {c.name!r}")
            continue
        arr = table[c.name]
        if arr.type != c.dtype:
            arr = arr.cast(c.dtype)
        arrays.append(arr)
        fields.append(pa.field(c.name, c.dtype, nullable=c.nullable))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def write_study(dest: str | os.PathLike, manifest: dict, events, *, resources=None,
                events_name: str = "events.parquet", row_group_size: int = 1 << 20,
                compression: str = "zstd", overwrite: bool = True) -> Path:
    """Write a whole study directory atomically. ``events`` may be one table/frame or a
    mapping {relative file name: table} to split over several files."""
    dest = Path(dest)
    with atomic_dir(dest, overwrite=overwrite) as tmp:
        (tmp / C.EVENTS_DIR).mkdir()
        parts = events if isinstance(events, dict) else {events_name: events}
        for rel, tbl in parts.items():
            out = tmp / C.EVENTS_DIR / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(events_table(tbl), out, row_group_size=row_group_size,
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
