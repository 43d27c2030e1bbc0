"""A study's events as numpy arrays, one :class:`RunArrays` per manifest run (the twin's input).

The twin's estimators and its replays work on whole runs in memory (a few arrays of int64 per
request, plus the flat ITL gaps), read once through DuckDB with bound parameters. Statuses use
the simulator's codes, which follow ``capplan.contract.STATUSES`` (ok, rejected, timeout, error,
cancelled); a missing timestamp is −1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import contract as C
from ..errors import StudyError
from ..study import Study, open_study

OK, REJECTED, TIMEOUT, ERROR, CANCELLED = range(5)
STATUS_CODE = {s: i for i, s in enumerate(C.STATUSES)}
OPTIONAL = ("sent_ns", "server_received_ns", "admitted_ns", "prefill_start_ns", "itl_ns",
            "tenant", "slo_class", "replica_group")


@dataclass(frozen=True, eq=False)
class RunArrays:
    """One run's requests in scheduled order. Times are ns on the run clock, −1 when absent."""

    run_id: str
    offered_rps: float | None
    concurrency: int | None
    duration_s: float | None
    warmup_ns: int
    sched: np.ndarray
    arrive: np.ndarray  # when the server got it: server_received, else sent, else scheduled
    first: np.ndarray
    last: np.ndarray
    inp: np.ndarray
    out: np.ndarray
    status: np.ndarray
    admitted: np.ndarray
    replica: np.ndarray  # index into StudyData.replica_names, −1 unknown
    tenant: np.ndarray  # index into StudyData.tenants, −1 none
    itl_off: np.ndarray | None  # request i's gaps are itl_val[itl_off[i]:itl_off[i + 1]]
    itl_has: np.ndarray | None  # request i has a (non-null) gap list
    itl_val: np.ndarray | None

    @property
    def n(self) -> int:
        return int(len(self.sched))

    @property
    def in_window(self) -> np.ndarray:
        return self.sched >= self.warmup_ns

    @property
    def level(self) -> float:
        return float(self.offered_rps if self.offered_rps is not None else self.concurrency)

    def measured_rate_rps(self) -> float:
        """(N − 1) / span of the scheduled stamps in the window (as capplan summarize)."""
        s = self.sched[self.in_window]
        if len(s) < 2 or s[-1] <= s[0]:
            return float("nan")
        return (len(s) - 1) / ((s[-1] - s[0]) / C.NS_PER_S)


@dataclass(frozen=True, eq=False)
class StudyData:
    name: str
    root: str
    load_model: str
    system: dict
    replicas: int
    runs: tuple[RunArrays, ...]
    tenants: tuple[str, ...]
    slo_class_of: dict = field(default_factory=dict)  # tenant → slo_class
    replica_names: tuple[str, ...] = ()
    present: frozenset = frozenset()  # optional columns with at least one non-null value
    sha256: str = ""
    workload: dict = field(default_factory=dict)  # the manifest's workload block

    def has(self, column: str) -> bool:
        return column in self.present

    def run(self, run_id: str) -> RunArrays:
        for r in self.runs:
            if r.run_id == run_id:
                return r
        raise KeyError(run_id)


def _ns(col) -> np.ndarray:
    a = col.to_numpy(zero_copy_only=False)
    if a.dtype.kind == "f" or a.dtype == object:
        a = np.where(np.isnan(a.astype(float)), -1, a.astype(float)).astype(np.int64)
    return a.astype(np.int64)


def index_of_names(col, names, missing: int = -1) -> np.ndarray:
    """Position of each string of an arrow column in ``names`` (``missing`` for null/other)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not names or len(col) == 0:
        return np.full(len(col), missing, np.int64)
    idx = pc.index_in(col, value_set=pa.array(list(names), pa.string()))
    return np.asarray(idx.fill_null(missing).to_numpy(zero_copy_only=False), np.int64)


def load_study(study, *, runs: tuple[str, ...] | None = None) -> StudyData:
    """Read the events the twin needs (all runs, or ``runs``) into memory."""
    import pyarrow.compute as pc

    st: Study = open_study(study)
    m = st.manifest
    wanted = [r for r in m.runs if runs is None or r.run_id in runs]
    if not wanted:
        raise StudyError("no runs selected", file=str(st.root / C.MANIFEST_NAME),
                         fix="runs: " + ", ".join(m.run_ids))
    cols = ["run_id", "request_id", "scheduled_ns", "first_token_ns", "last_token_ns", "input_tokens",
            "output_tokens", "status", *OPTIONAL]
    tbl = st.con.sql(
        f"SELECT {', '.join(cols)} FROM events WHERE list_contains(?, run_id) "
        "ORDER BY run_id, scheduled_ns, request_id", params=[[r.run_id for r in wanted]]).to_arrow_table()
    present = set()
    for c in OPTIONAL:
        if tbl[c].null_count < len(tbl):
            present.add(c)
    tenants = tuple(sorted(x for x in pc.unique(tbl["tenant"]).to_pylist() if x is not None)) \
        if "tenant" in present else ()
    slo_of: dict = {}
    if tenants and "slo_class" in present:
        pairs = st.sql("SELECT tenant, any_value(slo_class) FROM events WHERE tenant IS NOT NULL "
                       "GROUP BY tenant").fetchall()
        slo_of = {t: c for t, c in pairs if c is not None}
    rnames = tuple(sorted(x for x in pc.unique(tbl["replica_group"]).to_pylist() if x is not None)) \
        if "replica_group" in present else ()
    run_col = tbl["run_id"].to_numpy(zero_copy_only=False)
    bounds = {}
    if len(run_col):
        change = np.flatnonzero(run_col[1:] != run_col[:-1]) + 1
        starts = np.r_[0, change]
        ends = np.r_[change, len(run_col)]
        bounds = {run_col[a]: (a, b) for a, b in zip(starts, ends)}
    sched_all = _ns(tbl["scheduled_ns"])
    arrive_all = sched_all.copy()
    for c in ("sent_ns", "server_received_ns"):
        if c in present:
            v = _ns(tbl[c])
            arrive_all = np.where(v >= 0, v, arrive_all)
    first_all, last_all = _ns(tbl["first_token_ns"]), _ns(tbl["last_token_ns"])
    adm_all = np.full(len(tbl), -1, np.int64)
    for c in ("prefill_start_ns", "admitted_ns"):
        if c in present:
            v = _ns(tbl[c])
            adm_all = np.where(v >= 0, v, adm_all)
    status_all = index_of_names(tbl["status"], C.STATUSES, missing=ERROR).astype(np.int8)
    inp_all = tbl["input_tokens"].to_numpy(zero_copy_only=False).astype(np.int64)
    out_all = tbl["output_tokens"].to_numpy(zero_copy_only=False).astype(np.int64)

    rep_all = index_of_names(tbl["replica_group"], rnames)
    ten_all = index_of_names(tbl["tenant"], tenants)
    itl_off = itl_has = itl_val = None
    if "itl_ns" in present:
        arr = tbl["itl_ns"].combine_chunks()
        itl_has = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
        off = np.asarray(arr.offsets.to_numpy(), np.int64)
        itl_off = off - off[0]
        itl_val = np.asarray(arr.flatten().to_numpy(zero_copy_only=False), np.int64)
    out = []
    for spec in wanted:
        a, b = bounds.get(spec.run_id, (0, 0))
        sl = slice(a, b)
        out.append(RunArrays(
            run_id=spec.run_id, offered_rps=spec.offered_rps, concurrency=spec.concurrency,
            duration_s=spec.duration_s, warmup_ns=int(round((spec.warmup_s or 0.0) * C.NS_PER_S)),
            sched=sched_all[sl], arrive=arrive_all[sl], first=first_all[sl], last=last_all[sl],
            inp=inp_all[sl], out=out_all[sl], status=status_all[sl], admitted=adm_all[sl],
            replica=rep_all[sl], tenant=ten_all[sl],
            itl_off=None if itl_off is None else itl_off[a:b + 1] - itl_off[a],
            itl_has=None if itl_has is None else itl_has[sl],
            itl_val=None if itl_val is None else itl_val[itl_off[a]:itl_off[b]]))
    return StudyData(name=st.name, root=str(st.root), load_model=st.load_model, system=dict(m.system or {}),
                     replicas=m.replicas, runs=tuple(out), tenants=tenants, slo_class_of=slo_of,
                     replica_names=rnames, present=frozenset(present), sha256=st.content_hash(),
                     workload=dict(m.workload or {}))
