"""The spec kit: read YAML documents and check their values, with errors written for people.

Everything capplan reads from YAML — plan specs (:mod:`capplan.plan.spec`), study manifests
(:func:`capplan.study.parse_manifest`), synth configs (:mod:`capplan.sim.config`), gates
files and twin scenarios — goes through this one kit, so a bad value reads the same
everywhere: the file, the line and column, the field, what was found, and how to fix it::

    ERROR: demand.peak_rps must be > 0, got -5
      file:    plan.yaml, line 3, column 3
      field:   demand.peak_rps
      fix:     use a value > 0 (e.g. peak_rps: 380)

Reading
    ``load_yaml(path, *, what, fix=None) -> Document`` reads a YAML file. A missing or
    unreadable file, text that is not UTF-8, a YAML syntax error and a key written twice in one
    mapping raise :class:`~capplan.errors.SpecError` with the file and the line and column.
    ``parse_yaml(text, *, what, file=None)`` does the same for text, and
    ``document(source, *, what, fix=None)`` accepts a path, a mapping (used as is, without
    line marks) or a Document.

``Document(data, file, marks, what)``
    ``data`` is plain Python (dicts, lists, scalars, ``datetime.date``); ``marks`` maps each
    field path written in the file to its :class:`Mark` (line, column, from 1).
    ``doc.mark(field)`` is the mark of the field or of its nearest written parent (a missing
    key points at the section it belongs in); ``doc.locate(exc)`` adds the file and that line
    to a SpecError; ``with doc.located(): ...`` does it for every SpecError raised inside.

Field paths
    Fields are named as a reader finds them in the file: ``demand.peak_rps``,
    ``runs[2].offered_rps``, ``workload.tenants[0].name``. ``join(field, key)`` and
    ``index(field, i)`` build them; the document itself is the field ``""``.

Checks — each returns the clean value or raises SpecError naming the field, with a fix
    ``number(value, field, *, integer=False, minimum=None, above=None, maximum=None,
    below=None, optional=False, example="", text_ok=False)`` — int/float (bools and text are
    not numbers unless ``text_ok``), finite, whole when ``integer``; ``minimum``/``maximum``
    are inclusive (≥, ≤), ``above``/``below`` strict (>, <).
    ``choice(value, field, choices, *, optional=False, default=None)`` — one of ``choices``,
    with "did you mean".
    ``text(value, field, *, optional=True, example="")`` — a non-blank string.
    ``flag(value, field, *, default=None)`` — true or false.
    ``mapping(value, field, *, known=None, what=None, optional=True, example="")`` — a dict;
    with ``known``, unknown keys are refused with "did you mean" (``unknown_keys``).
    ``sequence(value, field, *, optional=True, nonempty=False, example="")`` — a list.
    ``duration_s(value, field, *, optional=False, minimum=0.0, above=None, example="30s")`` —
    seconds from a number or from text like ``90s``, ``500ms``, ``5 min``, ``1h30m``.
    ``date(value, field, *, optional=False)`` — a ``datetime.date`` (YAML date or ISO text).
    ``fail(field, message, fix=None, *, example=None)`` — raise the kit's error for a rule of
    your own (a contradiction between two fields, say).
    ``did_you_mean(word, choices) -> str | None`` — the closest choice, for messages.

Collecting instead of raising
    ``Checks(problems, doc=None, *, code="spec")`` runs any check and turns its SpecError into
    a located :class:`~capplan.errors.Problem` in a :class:`~capplan.errors.ProblemList`,
    returning ``None``, so a validator lists every problem at once (``capplan validate``)::

        check = Checks(problems, doc, code="manifest_field")
        rps = check(number, run.get("offered_rps"), "runs[0].offered_rps", above=0)
        check.error("runs[0]", "closed-loop runs need 'concurrency'", fix="add concurrency: 16")

A typical loader::

    def load_thing(source) -> Thing:
        doc = document(source, what="thing file", fix="start from templates/thing.yaml")
        with doc.located():
            raw = mapping(doc.data, "", known=("name", "rate_rps"), what="thing file",
                          optional=False)
            return Thing(name=text(raw.get("name"), "name", optional=False),
                         rate_rps=number(raw.get("rate_rps"), "rate_rps", above=0,
                                         example="4.5"))

Adding a field to a document: add the key to its ``known`` tuple and check its value with one
of the functions above; the error messages, line marks and "did you mean" come for free.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import difflib
import math
import numbers
import os
import re
from dataclasses import dataclass, field as dc_field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import yaml

from .errors import ProblemList, SpecError

__all__ = [
    "Mark", "Document", "Checks", "load_yaml", "parse_yaml", "document", "join", "index",
    "number", "choice", "text", "flag", "mapping", "unknown_keys", "sequence", "duration_s",
    "date", "fail", "did_you_mean", "describe",
]


# ----------------------------------------------------------------------------- field paths


def join(field: str, key) -> str:
    """``join("demand", "peak_rps") == "demand.peak_rps"``; ``join("", "name") == "name"``."""
    return f"{field}.{key}" if field else str(key)


def index(field: str, i: int) -> str:
    """``index("runs", 2) == "runs[2]"``."""
    return f"{field}[{i}]"


def _parent(field: str) -> str | None:
    """``a.b[2].c`` → ``a.b[2]`` → ``a.b`` → ``a`` → ``""`` → None."""
    if not field:
        return None
    cut = max(field.rfind("."), field.rfind("["))
    return field[:cut] if cut > 0 else ""


def _leaf(field: str) -> str:
    """The last key of a path (``demand.peak_rps`` → ``peak_rps``), for "add key: value" fixes."""
    return re.split(r"[.\[]", field)[-1].rstrip("]") if field else field


# ----------------------------------------------------------------------------- documents


@dataclass(frozen=True)
class Mark:
    """Where a field is written: line and column, both counted from 1."""

    line: int
    column: int


@dataclass(frozen=True)
class Document:
    """A YAML document as plain data plus the line mark of every field written in it."""

    data: Any
    file: str | None = None
    marks: Mapping[str, Mark] = dc_field(default_factory=dict, repr=False)
    what: str = "document"

    def mark(self, field: str | None) -> Mark | None:
        """The field's mark, else that of its nearest written parent; None when none is."""
        f = field
        while f is not None:
            if f in self.marks:
                return self.marks[f]
            f = _parent(f)
        return None

    def locate(self, exc: SpecError) -> SpecError:
        """``exc`` with this document's file and the line of its field added."""
        m = self.mark(exc.field or "")
        return exc.located(self.file, m.line if m else None, m.column if m else None)

    @contextlib.contextmanager
    def located(self) -> Iterator["Document"]:
        """Re-raise every SpecError of the block with file and line added."""
        try:
            yield self
        except SpecError as exc:
            raise self.locate(exc) from None


def _yaml_error(exc: yaml.YAMLError, what: str, file: str | None, fix: str | None) -> SpecError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    msg = f"{what} is not valid YAML{at}: {problem}" + (f" ({context})" if context else "")
    hint = "check indentation and quoting" + (f"; {fix}" if fix else "")
    return SpecError(msg, file=file, fix=hint, line=mark.line + 1 if mark else None,
                     col=mark.column + 1 if mark else None, code="bad_yaml")


def _walk(node, path: str, marks: dict[str, Mark], what: str, file: str | None,
          stack: tuple[int, ...] = ()) -> None:
    """Record the mark of every key / item under ``node``; refuse keys written twice."""
    if id(node) in stack:  # a recursive alias: its fields are already recorded
        return
    stack = stack + (id(node),)
    if isinstance(node, yaml.MappingNode):
        merged = []
        seen: dict[str, Mark] = {}
        for k, v in node.value:
            if k.tag == "tag:yaml.org,2002:merge":
                merged.append(v)
                continue
            key = k.value if isinstance(k, yaml.ScalarNode) else "?"
            p = join(path, key)
            m = Mark(k.start_mark.line + 1, k.start_mark.column + 1)
            if key in seen:
                raise SpecError(f"{what}: key {p} is written twice (lines {seen[key].line} and "
                                f"{m.line}); YAML would silently keep only the last one",
                                field=p, file=file, line=m.line, col=m.column,
                                fix="keep one of them", code="bad_yaml")
            seen[key] = m
            marks[p] = m
            _walk(v, p, marks, what, file, stack)
        for v in merged:  # `<<: *base` keys: explicit keys win (as in YAML)
            for sub in (v.value if isinstance(v, yaml.SequenceNode) else [v]):
                extra: dict[str, Mark] = {}
                _walk(sub, path, extra, what, file, stack)
                for p, m in extra.items():
                    marks.setdefault(p, m)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            p = index(path, i)
            marks[p] = Mark(v.start_mark.line + 1, v.start_mark.column + 1)
            _walk(v, p, marks, what, file, stack)


def parse_yaml(text: str, *, what: str = "document", file: str | None = None,
               fix: str | None = None) -> Document:
    """Parse YAML text (safe loader) into a Document with the line mark of every field.
    libyaml's loader where PyYAML has it (a 12-run study.yaml: 1.2 against 8.5 ms, on every
    command's start); a document it refuses is parsed again by the pure-Python one, whose
    messages say more (the character found, the token expected)."""
    if getattr(yaml, "CSafeLoader", None) is not None:
        try:
            return _parse_yaml(text, yaml.CSafeLoader, what, file, fix)
        except SpecError:
            pass
    return _parse_yaml(text, yaml.SafeLoader, what, file, fix)


def _parse_yaml(text: str, loader_class, what: str, file: str | None,
                fix: str | None) -> Document:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        marks: dict[str, Mark] = {}
        if node is None:
            return Document(None, file, marks, what)
        _walk(node, "", marks, what, file)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, what, file, fix) from None
    finally:
        loader.dispose()
    return Document(data, file, marks, what)


def load_yaml(path: str | os.PathLike, *, what: str = "document",
              fix: str | None = None) -> Document:
    """Read a YAML file (UTF-8, a BOM is allowed) into a Document. ``what`` names the document
    in messages ("plan spec", "study.yaml"); ``fix`` says where a correct one comes from."""
    p = Path(path).expanduser()
    file = str(p)
    if not p.is_file():
        raise SpecError(f"{what} file not found", file=file, fix=fix, code="file_missing")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read the {what}: {exc.strerror or exc}", file=file,
                        code="file_unreadable") from None
    try:
        text_ = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise SpecError(f"{what} is not UTF-8 text (byte {exc.start})", file=file, line=line,
                        fix="save the file as UTF-8", code="bad_yaml") from None
    return parse_yaml(text_, what=what, file=file, fix=fix)


def document(source, *, what: str = "document", fix: str | None = None) -> Document:
    """A Document from a path (read with :func:`load_yaml`), a mapping (no line marks) or a
    Document (returned as is)."""
    if isinstance(source, Document):
        return source
    if isinstance(source, Mapping):
        return Document(dict(source), None, {}, what)
    if isinstance(source, (str, os.PathLike)):
        return load_yaml(source, what=what, fix=fix)
    raise SpecError(f"{what} must be a file path or a mapping, got {describe(source)}", fix=fix)


# ----------------------------------------------------------------------------- checks


def describe(value) -> str:
    """A value as a reader would name it: ``text 'abc'``, ``a list [1, 2]``, ``true``."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"text {value!r}"
    if isinstance(value, Mapping):
        return f"a mapping {dict(value)!r}"[:120]
    if isinstance(value, (list, tuple)):
        return f"a list {list(value)!r}"[:120]
    if isinstance(value, numbers.Number):
        return f"{value!r}"
    return f"{value!r} ({type(value).__name__})"


def fail(field: str, message: str, fix: str | None = None, *, example: str | None = None):
    """Raise the kit's error for a rule of the caller's own."""
    raise SpecError(message, field=field or None, fix=fix, example=example)


def did_you_mean(word, choices: Iterable) -> str | None:
    """The choice closest to ``word`` (case-insensitive), or None when none is close."""
    opts = {str(c).lower(): str(c) for c in choices}
    hit = difflib.get_close_matches(str(word).lower(), list(opts), n=1, cutoff=0.6)
    return opts[hit[0]] if hit else None


def _eg(field: str, example) -> str:
    return f" (e.g. {_leaf(field)}: {example})" if example != "" and example is not None else ""


def number(value, field: str, *, integer: bool = False, minimum: float | None = None,
           above: float | None = None, maximum: float | None = None,
           below: float | None = None, optional: bool = False, example="",
           text_ok: bool = False):
    """A finite int/float in range (``minimum``/``maximum`` inclusive, ``above``/``below``
    strict); int when ``integer``. None when ``optional`` and absent. ``text_ok`` also reads
    numbers written as text ("4.5")."""
    eg = _eg(field, example)
    if value is None:
        if optional:
            return None
        fail(field, f"{field} is missing", fix=f"add {_leaf(field)}: {example or '...'}")
    kind = "a whole number" if integer else "a number"
    if text_ok and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(field, f"{field} must be {kind}, got {describe(value)}", fix=f"write a plain number{eg}")
    if not math.isfinite(float(value)):
        fail(field, f"{field} must be finite, got {value!r}", fix=f"write a plain number{eg}")
    if integer:
        if isinstance(value, numbers.Integral):
            value = int(value)
        elif float(value).is_integer():
            value = int(float(value))
        else:
            fail(field, f"{field} must be a whole number, got {value!r}",
                 fix=f"write a whole number{eg}")
    else:
        value = float(value)
    if minimum is not None and value < minimum:
        fail(field, f"{field} must be ≥ {minimum:g}, got {value:g}", fix=f"use a value ≥ {minimum:g}{eg}")
    if above is not None and not value > above:
        fail(field, f"{field} must be > {above:g}, got {value:g}", fix=f"use a value > {above:g}{eg}")
    if maximum is not None and value > maximum:
        fail(field, f"{field} must be ≤ {maximum:g}, got {value:g}", fix=f"use a value ≤ {maximum:g}{eg}")
    if below is not None and not value < below:
        fail(field, f"{field} must be < {below:g}, got {value:g}", fix=f"use a value < {below:g}{eg}")
    return value


def choice(value, field: str, choices: Iterable[str], *, optional: bool = False,
           default: str | None = None) -> str | None:
    """One of ``choices`` (exact spelling); the default when ``optional`` and absent."""
    choices = tuple(choices)
    if value is None and optional:
        return default
    if not isinstance(value, str) or value not in choices:
        near = did_you_mean(value, choices) if isinstance(value, str) else None
        fail(field, f"unknown {field} {value!r}" + (f" (did you mean {near!r}?)" if near else ""),
             fix="use one of: " + ", ".join(choices))
    return value


def text(value, field: str, *, optional: bool = True, example: str = "") -> str | None:
    """A string (non-blank unless ``optional``); None when ``optional`` and absent."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not optional and not value.strip()):
        fail(field, f"{field} must be text, got {describe(value)}",
             fix=f"write {_leaf(field)}: {example or 'some-name'}")
    return value


def flag(value, field: str, *, default: bool | None = None) -> bool:
    """true or false; ``default`` when absent (absent without a default is an error)."""
    if value is None and default is not None:
        return default
    if not isinstance(value, bool):
        fail(field, f"{field} must be true or false, got {describe(value)}",
             fix=f"write {_leaf(field)}: true (or false)")
    return value


def unknown_keys(d: Mapping, known: Iterable[str], field: str, what: str | None = None) -> None:
    """Refuse keys of ``d`` not in ``known``, each with its closest known key."""
    known = tuple(known)
    bad = [str(k) for k in d if str(k) not in known]
    if not bad:
        return
    parts = []
    for k in bad:
        near = did_you_mean(k, known)
        parts.append(k + (f" (did you mean {near}?)" if near else ""))
    label = what or field or "the document"
    fail(join(field, bad[0]), f"unknown key(s) in {label}: {', '.join(parts)}",
         fix=f"known keys in {label}: " + ", ".join(known))


def mapping(value, field: str, *, known: Iterable[str] | None = None, what: str | None = None,
            optional: bool = True, example: str = "") -> dict:
    """A mapping (``{}`` when ``optional`` and absent); with ``known``, unknown keys raise."""
    label = what or field or "the document"
    if value is None:
        if optional:
            return {}
        if not field:
            fail(field, f"{label} is empty", fix=f"e.g. {example}" if example else None)
        fail(field, f"{label} is missing", fix=f"add {_leaf(field)}:" + (f" {example}" if example else ""))
    if not isinstance(value, Mapping):
        hint = (f"e.g. {example}" if example else "write it as indented key: value lines"
                + (" (keys: " + ", ".join(known) + ")" if known else ""))
        fail(field, f"{label} must be a mapping of keys, got {describe(value)}", fix=hint)
    if known is not None:
        unknown_keys(value, known, field, what)
    return dict(value)


def sequence(value, field: str, *, optional: bool = True, nonempty: bool = False,
             example: str = "") -> list:
    """A list (``[]`` when ``optional`` and absent)."""
    if value is None and optional and not nonempty:
        return []
    if value is None or not isinstance(value, (list, tuple)):
        fail(field, f"{field} must be a list, got {describe(value)}",
             fix=f"e.g. {_leaf(field)}: {example or '[...]'}")
    if nonempty and not value:
        fail(field, f"{field} is empty", fix=f"e.g. {_leaf(field)}: {example or '[...]'}")
    return list(value)


_UNIT_S = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
           "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
           "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
           "d": 86400.0, "day": 86400.0, "days": 86400.0}
_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)")


def duration_s(value, field: str, *, optional: bool = False, minimum: float | None = 0.0,
               above: float | None = None, example: str = "30s") -> float | None:
    """Seconds from a number (already seconds) or text: ``90s``, ``500ms``, ``5 min``,
    ``1h30m``, ``2 days``."""
    if isinstance(value, str):
        s = value.strip().lower()
        total, pos = 0.0, 0
        for m in _PART.finditer(s):
            if m.start() != pos or m.group(2) not in _UNIT_S:
                break
            total += float(m.group(1)) * _UNIT_S[m.group(2)]
            pos = m.end()
        if not s or pos != len(s):
            fail(field, f"{field}: cannot read {value!r} as a duration",
                 fix=f"write seconds (90) or a duration like 90s, 500ms, 5min, 1h30m{_eg(field, example)}")
        value = total
    return number(value, field, minimum=minimum, above=above, optional=optional, example=example)


def date(value, field: str, *, optional: bool = False) -> dt.date | None:
    """A calendar date from a YAML date (``2026-01-31``) or ISO text."""
    if value is None and optional:
        return None
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    fail(field, f"{field} must be a date like 2026-01-31, got {describe(value)}",
         fix=f"write {_leaf(field)}: 2026-01-31 (year-month-day)")


# ----------------------------------------------------------------------------- collecting


class Checks:
    """Collect mode: run kit checks, turning each SpecError into a located Problem of
    ``problems`` (with ``code`` unless the error has its own) and returning None."""

    def __init__(self, problems: ProblemList, doc: Document | None = None, *, code: str = "spec"):
        self.problems = problems
        self.doc = doc
        self.code = code

    def add(self, exc: SpecError, *, severity: str = "error") -> None:
        if self.doc is not None:
            exc = self.doc.locate(exc)
        self.problems.items.append(exc.problem(code=self.code, severity=severity))

    def __call__(self, check: Callable, *args, **kw):
        try:
            return check(*args, **kw)
        except SpecError as exc:
            self.add(exc)
            return None

    def error(self, field: str, message: str, *, fix: str | None = None,
              example: str | None = None, code: str = "") -> None:
        self.add(SpecError(message, field=field or None, fix=fix, example=example, code=code))

    def warn(self, field: str, message: str, *, fix: str | None = None,
             example: str | None = None, code: str = "") -> None:
        self.add(SpecError(message, field=field or None, fix=fix, example=example, code=code),
                 severity="warning")

    @property
    def failed(self) -> bool:
        return bool(self.problems.errors)

