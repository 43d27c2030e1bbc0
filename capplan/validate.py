"""Study validation: every problem found, each with file, column, example row and a fix.

``check_parquet_files`` runs at open time (schema level: readable, required columns, dtypes).
``validate_study`` runs the row-level checks in DuckDB and returns all problems found.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from . import contract as C
from .errors import ProblemList

_INT_TYPES = (pa.int64(), pa.int32(), pa.int16(), pa.int8(), pa.uint32(), pa.uint16(), pa.uint8())


def _dtype_ok(expected: pa.DataType, actual: pa.DataType) -> bool:
    if expected == pa.int64():
        return actual in _INT_TYPES or actual == pa.uint64()
    if expected == pa.string():
        return pa.types.is_string(actual) or pa.types.is_large_string(actual) or pa.types.is_dictionary(actual) and pa.types.is_string(actual.value_type)
    if pa.types.is_list(expected):
        return (pa.types.is_list(actual) or pa.types.is_large_list(actual)) and _dtype_ok(expected.value_type, actual.value_type)
    return expected == actual


def check_parquet_files(con: duckdb.DuckDBPyConnection, files: tuple[Path, ...],
                        problems: ProblemList) -> set[str]:
    """Schema-level checks of every events file; returns the union of contract columns present."""
    present: set[str] = set()
    for path in files:
        try:
            schema = pq.read_schema(path)
        except Exception as exc:  # pyarrow raises several types for corrupt files
            problems.add(f"cannot read parquet file: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                         file=str(path), fix="the file is corrupt or not parquet; re-export it "
                         "(e.g. pandas.DataFrame.to_parquet) or remove it from events/",
                         code="bad_parquet")
            continue
        names = set(schema.names)
        for col in C.REQUIRED_EVENT_COLUMNS:
            if col not in names:
                c = C.EVENT_COLUMN_BY_NAME[col]
                problems.add(f"required column '{col}' is missing", file=str(path), column=col,
                             example="columns present: " + ", ".join(schema.names[:12]),
                             fix=f"add '{col}' ({c.dtype}): {c.meaning}", code="missing_column")
        for field in schema:
            c = C.EVENT_COLUMN_BY_NAME.get(field.name)
            if c is None:
                continue
            if not _dtype_ok(c.dtype, field.type):
                problems.add(f"column '{field.name}' has type {field.type}, expected {c.dtype}",
                             file=str(path), column=field.name,
                             fix=(f"cast it to {c.dtype}" + (" nanoseconds" if c.unit == "ns" else "")),
                             code="wrong_dtype")
            present.add(field.name)
    return present
