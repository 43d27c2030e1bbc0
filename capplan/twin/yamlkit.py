"""Reading the twin's YAML files (twin.yaml, scenario.yaml): one place for the checks, so
that every message names the file, the field and a fix.

Kept in one module so that it can switch to the project's shared spec kit when that lands.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import yaml

from ..errors import SpecError


def load_yaml(path: str | os.PathLike, what: str) -> dict:
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecError(f"{what} not found", file=str(p), fix=f"give the path of a {what} (see docs/twin.md)")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{what} is not valid YAML{where}: {getattr(exc, 'problem', exc)}", file=str(p),
                        fix="check indentation and quoting") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{what} must be a YAML mapping", file=str(p), fix="see docs/twin.md")
    return raw


def mapping(d, fld: str, keys: tuple[str, ...] | None = None) -> dict:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise SpecError(f"{fld} must be a mapping, got {type(d).__name__}", field=fld, fix="see docs/twin.md")
    if keys is not None:
        unknown = sorted(str(k) for k in set(d) - set(keys))
        if unknown:
            raise SpecError(f"unknown key(s) in {fld}: {', '.join(unknown)}", field=fld,
                            fix="known keys: " + ", ".join(keys))
    return d


def number(v, fld: str, *, integer: bool = False, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, allow_none: bool = False):
    if v is None:
        if allow_none:
            return None
        raise SpecError(f"{fld} needs a value", field=fld)
    if isinstance(v, bool):
        raise SpecError(f"{fld} must be a number, got {v!r}", field=fld)
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise SpecError(f"{fld} must be a number, got {v!r}", field=fld) from None
    if not math.isfinite(x):
        raise SpecError(f"{fld} must be finite, got {v!r}", field=fld)
    if integer:
        if not float(x).is_integer():
            raise SpecError(f"{fld} must be a whole number, got {v!r}", field=fld)
        x = int(x)
    if lo is not None and (x <= lo if lo_open else x < lo):
        raise SpecError(f"{fld} must be {'>' if lo_open else '≥'} {lo:g}, got {v!r}", field=fld)
    if hi is not None and x > hi:
        raise SpecError(f"{fld} must be ≤ {hi:g}, got {v!r}", field=fld)
    return x


def choice(v, fld: str, options: tuple[str, ...]) -> str:
    if str(v) not in options:
        raise SpecError(f"{fld} must be one of {', '.join(options)}, got {v!r}", field=fld)
    return str(v)


def in_file(exc: SpecError, path) -> SpecError:
    """The same error, naming the file it came from."""
    if exc.file is not None:
        return exc
    return SpecError(exc.args[0], field=exc.field, fix=exc.fix, file=str(path))
