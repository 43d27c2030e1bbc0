"""How a run is cut into units, and which cell dimensions are summed with them: the small
frozen objects a consumer passes to ``reduce_study`` (see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .. import contract as C
from ..errors import SpecError
from ..metrics import Window, request_view
from ..study import Study

MAX_UNITS = 1024
METRICS = ("ttft", "tpot", "itl", "e2e")
NONE_LABEL = "(none)"

@dataclass(frozen=True)
class CountUnits:
    """Units of consecutive requests in scheduled order: ``min(max_units, n)`` per run."""

    max_units: int = MAX_UNITS

    def __post_init__(self):
        if isinstance(self.max_units, bool) or not isinstance(self.max_units, (int, np.integer)) \
                or self.max_units < 1:
            raise SpecError(f"max_units must be an integer ≥ 1, got {self.max_units!r}",
                            field="max_units")


def _per_run(value, run_id: str, what: str):
    if isinstance(value, Mapping):
        if run_id not in value:
            raise SpecError(f"TimeUnits.{what} has no value for run {run_id!r}",
                            field=what, fix="give every run of the study a value")
        return value[run_id]
    return value


@dataclass(frozen=True)
class TimeUnits:
    """Units of equal scheduled-time width: unit = ⌊(scheduled_ns − origin) / width⌋, clipped
    to [0, n_units − 1].

    ``width_s``: seconds, one number or {run_id: seconds}; ``origin_s``: {run_id: seconds on
    the run's clock}, default the run's window start (its warm-up); ``n_units``: {run_id:
    count}, default from the data (the last request's unit + 1). Two studies with the same
    widths, origins and counts per matched run share one grid (see ``time_units_for``)."""

    width_s: float | Mapping[str, float]
    origin_s: Mapping[str, float] | None = None
    n_units: Mapping[str, int] | None = None

    def width_ns(self, run_id: str) -> int:
        w = float(_per_run(self.width_s, run_id, "width_s"))
        if not (w > 0 and math.isfinite(w)):
            raise SpecError(f"TimeUnits width for run {run_id!r} must be > 0 s, got {w!r}",
                            field="width_s")
        return max(1, int(round(w * C.NS_PER_S)))

    def origin_ns(self, run_id: str, window: Window) -> int:
        o = window.seconds(run_id) if self.origin_s is None else float(
            _per_run(self.origin_s, run_id, "origin_s"))
        return int(round(o * C.NS_PER_S))

    def count(self, run_id: str) -> int | None:
        if self.n_units is None:
            return None
        n = int(_per_run(self.n_units, run_id, "n_units"))
        if n < 1:
            raise SpecError(f"TimeUnits n_units for run {run_id!r} must be ≥ 1, got {n}",
                            field="n_units")
        return n


#: the token columns a cell bucket may read (integers of the request view)
TOKEN_COLUMNS = tuple(c.name for c in C.EVENT_COLUMNS if c.name.endswith("_tokens"))


@dataclass(frozen=True)
class Cells:
    """Cell dimensions summed in the same pass as the units. Buckets: index = number of edges
    ≤ value (edges [256, 1024] → <256, 256–1024, ≥1024; a missing count reads 0); quadrant:
    (input > split_in, output > split_out); tenant and slo_class: their values ("(none)" when
    missing); cache: ``CACHE_LABELS`` — "hit" when some prompt tokens came from the prefix
    cache (``computed_input_tokens`` < ``input_tokens``), "miss" when none did, "unknown" where
    ``computed_input_tokens`` is not stamped. ``hist``: metrics with per-(unit, cell) log-bucket
    histograms (ok requests)."""

    input_edges: tuple[float, ...] = ()
    output_edges: tuple[float, ...] = ()
    quadrant_split: tuple[float, float] | None = None
    tenant: bool = False
    slo_class: bool = False
    cache: bool = False
    hist: tuple[str, ...] = ("ttft", "tpot")
    input_column: str = "input_tokens"
    output_column: str = "output_tokens"

    def __post_init__(self):
        for name in ("input_edges", "output_edges"):
            e = tuple(float(v) for v in getattr(self, name))
            if any(not math.isfinite(v) for v in e) or any(b <= a for a, b in zip(e, e[1:])):
                raise SpecError(f"Cells.{name} must be increasing finite numbers, got {e}",
                                field=name)
            object.__setattr__(self, name, e)
        if self.quadrant_split is not None:
            q = tuple(float(v) for v in self.quadrant_split)
            if len(q) != 2:
                raise SpecError("Cells.quadrant_split is (input split, output split)",
                                field="quadrant_split")
            object.__setattr__(self, "quadrant_split", q)
        bad = [m for m in self.hist if m not in METRICS]
        if bad:
            raise SpecError(f"Cells.hist: unknown metric(s) {bad}", field="hist",
                            fix="choose from " + ", ".join(METRICS))
        for name in ("input_column", "output_column"):
            if getattr(self, name) not in TOKEN_COLUMNS:
                raise SpecError(f"Cells.{name} must be a token column, got "
                                f"{getattr(self, name)!r}", field=name,
                                fix="one of " + ", ".join(TOKEN_COLUMNS))

    @property
    def dims(self) -> tuple[str, ...]:
        """The cell dimensions asked for, in cell-index column order."""
        out = []
        if self.input_edges:
            out.append("input_bucket")
        if self.output_edges:
            out.append("output_bucket")
        if self.quadrant_split is not None:
            out += ["input_long", "output_long"]
        if self.tenant:
            out.append("tenant")
        if self.slo_class:
            out.append("slo_class")
        if self.cache:
            out.append("cache")
        return tuple(out)


#: the cache cell's values, by code
CACHE_LABELS = ("miss", "hit", "unknown")


def bucket_labels(edges: Sequence[float]) -> list[str]:
    """Readable names of the buckets that ``edges`` cut: <a, a–b, …, ≥z."""
    if not edges:
        return ["all"]
    return ([f"<{edges[0]:g}"] + [f"{a:g}–{b:g}" for a, b in zip(edges, edges[1:])]
            + [f"≥{edges[-1]:g}"])


def time_units_for(sides: Sequence[tuple[Study, Window, Sequence[str]]], *,
                   max_units: int = MAX_UNITS) -> list[TimeUnits]:
    """One time grid shared by several studies: ``sides`` are (study, window, run ids) with
    the runs matched by position. Per matched run: origin = the latest window start, width =
    the longest window span over the sides / (max_units − 1), and the same unit count, so unit i
    covers the same scheduled times on every side. Returns one ``TimeUnits`` per side, keyed by
    that side's run ids."""
    ends = []
    for study, window, run_ids in sides:
        view = request_view(study, window)
        rows = dict(study.sql(f"SELECT run_id, max(scheduled_ns) FROM {view} WHERE in_window "
                              "GROUP BY run_id").fetchall())
        ends.append([rows.get(r) for r in run_ids])
    n_pairs = len(sides[0][2])
    widths, origins, counts = [{} for _ in sides], [{} for _ in sides], [{} for _ in sides]
    for i in range(n_pairs):
        origin_ns = max(int(round(w.seconds(ids[i]) * C.NS_PER_S)) for _, w, ids in sides)
        last = [e[i] for e in ends if e[i] is not None]
        span_ns = max(max(last) - origin_ns, 1) if last else 1
        width_ns = max(1, -(-span_ns // max(int(max_units) - 1, 1)))
        n_u = int(span_ns // width_ns) + 1
        for k, (_, _, ids) in enumerate(sides):
            widths[k][ids[i]] = width_ns / C.NS_PER_S
            origins[k][ids[i]] = origin_ns / C.NS_PER_S
            counts[k][ids[i]] = n_u
    return [TimeUnits(widths[k], origins[k], counts[k]) for k in range(len(sides))]
