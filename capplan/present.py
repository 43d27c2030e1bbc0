"""The presentation kit every result's ``to_text`` / ``to_dict`` / ``to_json`` uses: one mark for a
missing value, the number formatters around it, and one JSON writer.

Why one kit. A number that is missing (no crossing, a percentile the sample cannot support, a
run with no completed request) printed "—" in some results, "n/a" in others and "nan" or
"None" where a formatter forgot the case; a reader comparing two pages could not tell "not
measured" from "zero" from a bug. Here a missing value is ``None``, a float NaN, a numpy NaN,
NaT or ``pandas.NA`` (:func:`is_missing`), and it prints as :data:`MISSING` wherever a kit
formatter writes a number; in JSON it is ``null``. Infinity is a value (an unbounded capacity,
no limit), not a missing one: it prints as Python writes it and goes to JSON as ``"inf"``.

- :data:`MISSING` — "—" (an em dash: it reads as an empty cell in a table and never as a value);
- :func:`fmt` — ``format(v, spec)`` or the mark; :func:`fmt_num` — significant digits;
  :func:`fmt_pct` — a fraction as a percentage;
- :func:`json_value`, :func:`json_ready`, :func:`records` — values made JSON-ready (NaN → null,
  ±inf → "inf"/"-inf", numpy scalars → Python, tuples → lists);
- :func:`json_text` — indented UTF-8 JSON of a result's ``to_dict()``, also written atomically
  when given a path.

Pure and light: no numpy or pandas import, so any floor of the library may use it.
"""

from __future__ import annotations

import json
import math
import os

#: the one mark for a missing value in text, tables and pages
MISSING = "—"


def is_missing(v) -> bool:
    """None, NaN (float or numpy), NaT, or pandas.NA."""
    if v is None:
        return True
    if isinstance(v, (str, bytes, bool)):
        return False
    try:
        return bool(v != v)  # NaN and NaT are the values not equal to themselves
    except (TypeError, ValueError):  # pandas.NA: its comparisons are NA, which has no truth value
        return type(v).__name__ == "NAType"


def fmt(v, spec: str = ".4g") -> str:
    """``format(v, spec)``, or :data:`MISSING` for a missing value."""
    return MISSING if is_missing(v) else format(v, spec)


def fmt_num(v, digits: int = 4) -> str:
    """A number for people: ``digits`` significant digits, or :data:`MISSING`."""
    return fmt(v, f".{digits}g")


def fmt_pct(v, digits: int = 1) -> str:
    """A fraction as a percentage, ``0.9876 → "98.76 %"`` with ``digits=2``, or :data:`MISSING`."""
    return MISSING if is_missing(v) else f"{100 * v:.{digits}f} %"


def json_value(v):
    """One value made JSON-ready: missing → None, ±inf → "inf"/"-inf", numpy → Python,
    tuples → lists (element by element)."""
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if isinstance(v, dict):
        return {k: json_value(x) for k, x in v.items()}
    if isinstance(v, (str, bool, int)) or v is None:
        return v
    if hasattr(v, "item") and not hasattr(v, "__len__"):  # a numpy scalar
        v = v.item()
        if isinstance(v, (str, bool, int)):
            return v
    if is_missing(v):
        return None
    if isinstance(v, float) and math.isinf(v):
        return str(v)
    return v


json_ready = json_value  # a whole document: dicts, lists and tuples are walked


def records(df) -> list[dict]:
    """A pandas frame as JSON-ready records."""
    return [{k: json_value(v) for k, v in row.items()} for row in df.to_dict("records")]


def json_text(doc, path: str | os.PathLike | None = None) -> str:
    """``doc`` (a result's ``to_dict()``) as indented UTF-8 JSON ending in a newline; missing
    values are null (never the invalid ``NaN``). Written atomically to ``path`` when given."""
    text = json.dumps(json_ready(doc), indent=2, ensure_ascii=False, allow_nan=False, default=str) + "\n"
    if path is not None:
        from .io import write_text_atomic

        write_text_atomic(path, text)
    return text
