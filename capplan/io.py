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
import errno
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from . import contract as C
from .errors import OutputBusy, SpecError, write_error


def _read_umask() -> int:
    """The process umask, without changing it where Linux tells it (/proc), else by setting
    and restoring it once at import (before any thread of ours writes)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()


def follow_umask(path: str | os.PathLike) -> None:
    """Give a temp file or folder the mode a plain ``open``/``mkdir`` would have (mkstemp and
    mkdtemp create 0600/0700, which would survive the rename onto the output)."""
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~UMASK)


@contextlib.contextmanager
def _writing(dest: Path):
    """An OSError of writing (disk full, no permission, read-only) as one WriteError naming
    the path; any other error unchanged."""
    try:
        yield
    except OSError as exc:
        err = write_error(exc, dest)
        if err is None:
            raise
        raise err from None


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, suffix: str | None = None):
    """Yield a temp path beside ``dest``; on success rename it onto ``dest``."""
    dest = Path(dest)
    with _writing(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix or dest.suffix,
                                   dir=dest.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            follow_umask(tmp_path)
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


# ----------------------------------------------------------------------------- output folders
# One writer per output folder (a lock file beside it), leftovers of killed runs cleaned or
# named, and a swap that never leaves the folder missing (docs/architecture.md, "Output
# folders").

#: how long a second writer waits for the first before refusing (CAPPLAN_LOCK_WAIT_S overrides)
LOCK_WAIT_S = 600.0
_POLL_S = 0.2


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def lock_path(dest: str | os.PathLike) -> Path:
    """The lock file of an output folder: ``.NAME.lock`` beside it."""
    dest = Path(dest)
    return dest.with_name(f".{dest.name}.lock")


def _lock_wait_s() -> float:
    raw = os.environ.get("CAPPLAN_LOCK_WAIT_S", "")
    try:
        return max(0.0, float(raw)) if raw.strip() else LOCK_WAIT_S
    except ValueError:
        return LOCK_WAIT_S


def _holder(fd: int) -> str:
    """Who holds a lock, from the pid its holder wrote into the file."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"another capplan (pid {text})" if text.isdigit() else "another capplan process"


@contextlib.contextmanager
def output_lock(dest: str | os.PathLike, *, wait_s: float | None = None, say=None):
    """Hold the lock of the output ``dest`` (``fcntl.flock`` on ``.NAME.lock`` beside it):
    a second writer waits, saying so, up to ``wait_s`` (default CAPPLAN_LOCK_WAIT_S, else
    ``LOCK_WAIT_S``) and then raises :class:`~capplan.errors.OutputBusy` (exit 1). The
    kernel drops the lock when its holder dies, so a killed run never leaves a stale one. The
    file is removed on release; a waiter that got the removed file's lock sees that the name
    now points elsewhere and tries again. Without fcntl (Windows) there is no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield None
        return
    say = say or _say
    path = lock_path(dest)
    wait_s = _lock_wait_s() if wait_s is None else wait_s
    t0 = time.monotonic()
    told = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            if time.monotonic() - t0 >= wait_s:
                raise OutputBusy(str(dest), holder, wait_s) from None
            if not told:
                say(f"capplan: {holder} is writing {dest}; waiting for it to finish "
                    f"(up to {wait_s:g} s, CAPPLAN_LOCK_WAIT_S) …")
                told = True
            time.sleep(_POLL_S)
            continue
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file as we got its lock: take the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
        if told:
            say(f"capplan: {dest} is free; writing it now")
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)  # releases the lock


def _build_re(name: str) -> re.Pattern:
    """Names a run leaves beside ``name``: ``.NAME.build-PID-XXXXXXXX`` (the folder being
    built), ``.NAME.old-PID`` (the previous output during a two-rename swap) and, from
    capplan versions before the pid was in the name, ``.NAME.XXXXXXXX``."""
    n = re.escape(name)
    return re.compile(rf"^\.{n}\.(?:build-(?P<bpid>\d+)-[A-Za-z0-9_]+|old-(?P<opid>\d+)"
                      rf"|(?P<legacy>[A-Za-z0-9_]{{8}}))$")


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (a reused pid counts: kept, not deleted)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


@dataclass(frozen=True)
class Leftover:
    """A hidden folder beside an output left by an earlier run: ``kind`` "build" or "old";
    ``pid`` of the run that made it (None: an older capplan that did not record it);
    ``stale``: that process has ended, so the folder is nobody's."""

    path: Path
    kind: str
    pid: int | None
    stale: bool


def leftovers(dest: str | os.PathLike) -> list[Leftover]:
    """The build folders and previous copies that earlier runs left beside ``dest``."""
    dest = Path(dest)
    pat = _build_re(dest.name)
    found = []
    try:
        entries = list(os.scandir(dest.parent))
    except FileNotFoundError:
        return []
    for e in entries:
        m = pat.match(e.name)
        if m is None or not e.is_dir(follow_symlinks=False):
            continue
        pid_s = m.group("bpid") or m.group("opid")
        pid = int(pid_s) if pid_s else None
        kind = "old" if m.group("opid") else "build"
        found.append(Leftover(Path(e.path), kind, pid, pid is not None and not _alive(pid)))
    return sorted(found, key=lambda x: x.path.name)


def clean_leftovers(dest: str | os.PathLike, *, say=None) -> None:
    """Under ``dest``'s lock: restore ``dest`` from the previous copy of a run killed between
    the two renames of a swap (where the platform has no atomic exchange); remove the build
    folders and copies of runs whose process has ended; name, with the command that removes
    them, those whose process may still run (nothing that may be a live writer's is deleted).
    Each is said on stderr."""
    say = say or _say
    dest = Path(dest)
    found = leftovers(dest)
    stale = [x for x in found if x.stale]
    if not os.path.lexists(dest):
        olds = sorted((x for x in stale if x.kind == "old"), key=lambda x: x.path.stat().st_ctime)
        if olds:
            os.rename(olds[-1].path, dest)
            say(f"capplan: {dest} was missing (a run, pid {olds[-1].pid}, was killed while swapping "
                f"it); restored the previous output from {olds[-1].path.name}")
            stale = [x for x in stale if x is not olds[-1]]
    if stale:
        for x in stale:
            shutil.rmtree(x.path, ignore_errors=True)
        say(f"capplan: removed {len(stale)} leftover folder(s) of ended runs beside {dest}: "
            + ", ".join(f"{x.path.name} (pid {x.pid})" for x in stale))
    for x in found:
        if x.stale:
            continue
        why = ("made by a capplan that did not record its pid" if x.pid is None
               else f"pid {x.pid} is still running — if that is not capplan, the folder is stale")
        say(f"capplan: {x.path} looks like a leftover of an earlier run ({why}); remove it with: "
            f"rm -rf {shlex.quote(str(x.path))}")


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2_fn = None


def _renameat2():
    """libc's renameat2, or None (not Linux, or a libc older than glibc 2.28)."""
    global _renameat2_fn
    if _renameat2_fn is None:
        fn = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).renameat2
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                               ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = False
        _renameat2_fn = fn
    return _renameat2_fn or None


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``): at no moment is
    either name missing. False where the platform or the filesystem cannot (the caller falls
    back to two renames); any other failure raises OSError."""
    fn = _renameat2()
    if fn is None:
        return False
    import ctypes

    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", -1)):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(tmp: Path, dest: Path) -> None:
    """Put the finished folder ``tmp`` at ``dest``, replacing what is there: one atomic
    exchange where the platform has it, else two renames (a kill between them leaves the
    previous output as ``.NAME.old-PID``, which the next run restores)."""
    if exchange(tmp, dest):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the previous output
        return
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    os.replace(dest, old)
    try:
        os.replace(tmp, dest)
    except BaseException:
        os.replace(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def check_out(dest: str | os.PathLike, marker: str, what: str, field: str = "--out") -> Path:
    """An output folder is replaced whole, so it may be new, empty, or an earlier output of the
    same kind (it holds ``marker``): never a file, nor a folder of the user's other files (the
    repository root after a typo in ``--out``). The one check every ``--out`` folder gets."""
    out = Path(dest).expanduser()
    if out.exists():
        if not out.is_dir():
            raise SpecError("--out exists and is a file, not a folder", file=str(out), field=field,
                        fix=f"choose a new folder name for the {what}")
        if any(out.iterdir()) and not (out / marker).is_file():
            raise SpecError(f"--out is a folder that holds other files and is not a capplan {what}; "
                        "refusing to replace it", file=str(out), field=field,
                        fix=f"choose a new or empty folder (an earlier {what} there is replaced whole)")
    return out


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike, *, overwrite: bool = True, say=None):
    """Yield a temp directory beside ``dest``; on success it replaces ``dest`` as a whole.
    The whole build holds ``dest``'s lock (:func:`output_lock`: a second writer waits, then
    refuses), leftovers of killed runs are cleaned or named first (:func:`clean_leftovers`),
    and the swap never leaves ``dest`` missing (:func:`exchange`). ``say``: where those notes
    go (default stderr)."""
    dest = Path(dest)
    with _writing(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        with output_lock(dest, say=say):
            clean_leftovers(dest, say=say)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.build-{os.getpid()}-",
                                        dir=dest.parent))
            try:
                follow_umask(tmp)
                yield tmp
                if os.path.lexists(dest):
                    if not overwrite:
                        raise FileExistsError(dest)
                    _swap_in(tmp, dest)
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


#: Print legibility. The workbook's body font is Arial 10 pt: Excel has it, and LibreOffice
#: prints it in Liberation Sans, which has Arial's metrics, so the widths below hold in both
#: (Calibri, xlsxwriter's default, becomes a wider substitute in a LibreOffice without Carlito
#: and shrank the printout). A printed sheet never shrinks it below ``MIN_PRINT_PT``: the
#: smallest print scale is 82 % (8.2 pt), a little above 8/10 because the widths are estimates.
FONT = {"font_name": "Arial", "font_size": 10}
FONT_PT = 10.0
MIN_PRINT_PT = 8.0
MIN_PRINT_SCALE = 0.82
PAGE_BODY_PT = (842 - 2 * 0.4 * 72, 595 - 2 * 0.6 * 72)
LINE_PT = 12.75  # one line of 10 pt Arial (Excel's row height for it, 17 px)
MAX_ROW_PT = 409.0  # Excel's largest row height
NARROWEST_TEXT_CHARS = 12  # a wrapped text column is never made narrower than this


def _column_pt(width_chars: float) -> float:
    """Printed width of a column ``width_chars`` wide at 100 %. Excel gives Arial 10 7 px per
    character plus 5 px padding (5.25 pt + 3.75 pt); LibreOffice lays the same column out about
    5 % wider (measured: 5.55 pt per character + 4 pt), and the wider is taken."""
    return 5.55 * width_chars + 4.0


def _lines(text: str, width_chars: float) -> int:
    """Lines a wrapped text takes in a column ``width_chars`` wide: word-wrapped as a
    spreadsheet does, about 1.1 characters per digit width (Arial text is narrower than its
    digits; measured on LibreOffice's printout of the plan's formulas, less some room for wide
    glyphs), explicit line breaks counted."""
    per_line = max(int((width_chars - 1) * 1.1), 1)
    return sum(max(1, len(textwrap.wrap(part, per_line))) for part in str(text).split("\n"))


def _auto_width(header: str, shown: list[str]) -> float:
    """A column's width in characters when its layout names none: the widest value, the
    header's longest word or a third of the header (headers wrap), at least 8, at most 40
    (longer text wraps), plus 2 for padding."""
    words = max((len(w) for w in header.split()), default=0)
    return min(max([words, math.ceil(len(header) / 3), 6] + [len(v) for v in shown]), 38) + 2


def _fit_widths(widths: list[float], text_cols: set[int], shown: list[int]) -> list[float]:
    """Narrow the widest wrapped-text columns, one character at a time, until the shown
    columns fit the page's width at ``MIN_PRINT_SCALE`` (or every text column is at
    ``NARROWEST_TEXT_CHARS``). Number and date columns keep their width."""
    widths = list(widths)
    room = PAGE_BODY_PT[0] / MIN_PRINT_SCALE
    while sum(_column_pt(widths[j]) for j in shown) > room:
        cands = [j for j in shown if j in text_cols and widths[j] > NARROWEST_TEXT_CHARS]
        if not cands:
            break
        j = max(cands, key=lambda k: widths[k])
        widths[j] -= 1
    return widths


def write_xlsx(tables: dict[str, pd.DataFrame], path: str | os.PathLike, *, created: _dt.datetime,
               title: str = "capplan plan", layouts: dict[str, SheetLayout] | None = None) -> None:
    """Write the tables with xlsxwriter: formulas and URLs off, text made safe, numbers as
    numbers with a format per unit, dates as dates, and a print setup on every sheet: A4
    landscape, one page wide (``one_page`` sheets one page in all), header row repeated, print
    area, wrapped text rows as tall as their lines — and never printed below ``MIN_PRINT_PT``:
    wide text columns are narrowed (their text wraps) until the sheet fits one page wide at
    ``MIN_PRINT_SCALE``; a sheet of numbers that still does not fit prints at that scale across
    pages, its first column repeated; a ``one_page`` sheet too long for one page at that scale
    prints one page wide."""
    import xlsxwriter

    layouts = layouts or {}
    wb = xlsxwriter.Workbook(str(path), {"strings_to_formulas": False, "strings_to_urls": False,
                                         "strings_to_numbers": False, "nan_inf_to_errors": False,
                                         "default_format_properties": dict(FONT), "default_row_height": 17})
    wb.set_properties({"title": title, "author": "capplan", "created": created})
    head = wb.add_format({"bold": True, "text_wrap": True, "valign": "top", "bottom": 1})
    wrap = wb.add_format({"text_wrap": True, "valign": "top"})
    label = wb.add_format({"bold": True, "valign": "top"})
    top = wb.add_format({"valign": "top"})
    fmts = {k: wb.add_format({"num_format": f, "valign": "top", **({"align": "center"} if k == "date" else {})})
            for k, (f, _) in KINDS.items()}
    # LibreOffice prints a boolean cell as 1/0 unless its format says TRUE/FALSE (Excel always does)
    boolean = wb.add_format({"num_format": '"TRUE";"TRUE";"FALSE"', "valign": "top", "align": "center"})
    for sheet, df in tables.items():
        lay = layouts.get(sheet, SheetLayout())
        ws = wb.add_worksheet(sheet)
        safe = _safe_frame(df)
        cols = list(df.columns)
        shown = [j for j, c in enumerate(cols) if c not in lay.hidden]
        # widths first (text wraps to them), then the rows' heights from the wrapped lines
        text_cols = {j for j, c in enumerate(safe.columns) if any(isinstance(v, str) for v in safe[c])}
        widths = _fit_widths([lay.widths.get(c) or _auto_width(str(sc), [_shown(v) for v in safe[sc]])
                              for c, sc in zip(cols, safe.columns)], text_cols, shown)
        for j, width in enumerate(widths):
            ws.set_column(j, j, width, None, {"hidden": True} if cols[j] in lay.hidden else None)
        heights: list[float] = []  # every printed row's height in points
        row0 = 0
        if lay.about:  # the description block above the table: label | text across the shown columns
            ws.write_string(0, 0, safe_text(title), label)
            heights.append(LINE_PT)
            span = [j for j in shown if j > 0]
            text_width = sum(widths[j] for j in span) if span else widths[0]
            for i, (k, v) in enumerate(lay.about, start=1):
                ws.write_string(i, 0, safe_text(k), label)
                if len(span) > 1:
                    ws.merge_range(i, span[0], i, span[-1], safe_text(v), wrap)
                else:
                    ws.write_string(i, 1, safe_text(v), wrap)
                h = min(LINE_PT * max(_lines(v, text_width), _lines(k, widths[0])), MAX_ROW_PT)
                ws.set_row(i, h)
                heights.append(h)
            heights.append(LINE_PT)  # the blank row before the table
            row0 = len(lay.about) + 2
        units = None
        if lay.unit_column and lay.unit_column[1] in df.columns:
            units = [kind_for_unit(u) for u in df[lay.unit_column[1]].tolist()]
        lines = [1] * (len(safe) + 1)  # text lines per row (wrapped), for explicit row heights
        for j, col in enumerate(cols):
            scol = safe.columns[j]
            values = safe[scol].tolist()
            ws.write_string(row0, j, scol, head)
            kind = _column_kind(col, values, lay)
            if j in shown:
                for i, v in enumerate([scol] + values):
                    if isinstance(v, str):
                        lines[i] = max(lines[i], _lines(v, widths[j]))
            for i, v in enumerate(values, start=row0 + 1):
                if v is None:
                    ws.write_blank(i, j, None)
                elif isinstance(v, bool):
                    ws.write_boolean(i, j, v, boolean)
                elif isinstance(v, (_dt.date, _dt.datetime)):
                    d = v if isinstance(v, _dt.datetime) else _dt.datetime(v.year, v.month, v.day)
                    ws.write_datetime(i, j, d, fmts["date"])
                elif isinstance(v, (int, float)):
                    k = kind or (units[i - row0 - 1] if units else "number")
                    ws.write_number(i, j, v, fmts[k])
                else:  # a hidden column's text unwrapped: LibreOffice draws a wrapped one, clipped, a letter a line
                    ws.write_string(i, j, v, wrap if j in shown else top)
        for i, n in enumerate(lines):
            h = min(LINE_PT * n, MAX_ROW_PT)
            if n > 1:
                ws.set_row(row0 + i, h)
            heights.append(h)
        last_row, last_col = row0 + len(safe), max(max(shown, default=1), 1)
        ws.freeze_panes(row0 + 1, 0)
        ws.set_landscape()
        ws.set_paper(9)  # A4; fit-to-width keeps Letter printouts on one page wide too
        ws.set_margins(left=0.4, right=0.4, top=0.6, bottom=0.6)
        width_scale = PAGE_BODY_PT[0] / sum(_column_pt(widths[j]) for j in shown)
        if width_scale < MIN_PRINT_SCALE:  # numbers only, too many columns: across pages, legibly
            ws.set_print_scale(int(MIN_PRINT_SCALE * 100))
            ws.repeat_columns(0)
        elif lay.one_page and min(width_scale, PAGE_BODY_PT[1] / sum(heights)) >= MIN_PRINT_SCALE:
            ws.fit_to_pages(1, 1)
        else:
            ws.fit_to_pages(1, 0)
        ws.repeat_rows(row0)
        ws.print_area(0, 0, last_row, last_col)
        ws.set_header(f"&L{_header_text(title)}&R{_header_text(sheet)}")
        ws.set_footer("&CPage &P of &N")
    wb.close()


def _header_text(text: str) -> str:
    return str(text).replace("&", "&&")[:100]


def _shown(v) -> str:
    """A value as the sheet shows it (for column widths)."""
    if isinstance(v, (_dt.date, _dt.datetime)):
        return v.strftime("%Y-%m-%d")
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
