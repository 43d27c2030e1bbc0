"""GPU telemetry through nvidia-ml-py (``import pynvml``): power, energy counter, utilisation,
memory and SM clock of every GPU, sampled on a fixed grid while a benchmark runs.

Output (``capplan telemetry record --out resources.parquet``):
- ``resources.parquet``: one row per GPU per sample, columns of ``contract.RESOURCE_COLUMNS``
  (``t_ns`` = epoch ns of the actual sample time; ``power_w`` from mW; ``energy_mj`` the
  driver's total-energy counter; ``run_id`` when given; ``host``). Its parquet key-value
  metadata holds ``capplan.telemetry`` = the JSON of the sidecar below.
- ``resources.gpu.yaml`` (sidecar, same stem): per GPU index, name, UUID, power limit (W) and
  memory total; driver version, host, interval, start/end (UTC), sample and late-tick counts,
  why recording stopped, fields the GPU does not support (left null, never invented), and the
  benchmark command with its exit code. Copy ``gpus``/``driver_version`` into study.yaml's
  ``system`` block.

Sampling: a monotonic clock with absolute deadlines t0 + k·interval (no drift from the time a
sample takes); a tick that is already past when the loop gets to it is skipped and counted
(``late_ticks``), never bunched. The sample time recorded is the actual one. Both files are
written atomically (temp file, then rename), also after Ctrl-C.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa

from . import contract as C
from .errors import CapplanError
from .present import fmt

FIELDS = ("power_w", "energy_mj", "gpu_util_pct", "mem_used_bytes", "sm_clock_mhz")
METADATA_KEY = b"capplan.telemetry"


class TelemetryError(CapplanError):
    """Telemetry cannot run (no driver, no GPU, bad option); the CLI prints it and exits 2."""

    def __init__(self, message: str, fix: str | None = None):
        self.fix = fix
        super().__init__(message)

    def format(self) -> str:
        return f"ERROR: {self.args[0]}" + (f"\n  fix:     {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str | None
    power_limit_w: float | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class Recording:
    """What a recording produced: the samples (arrow table) and the manifest facts."""

    table: pa.Table
    gpus: tuple[GpuInfo, ...]
    driver_version: str | None
    host: str
    interval_s: float
    started_utc: str
    ended_utc: str
    samples: int
    late_ticks: int
    stop_reason: str
    unsupported: tuple[str, ...] = ()
    read_errors: int = 0
    command: tuple[str, ...] = ()
    returncode: int | None = None
    run_id: str | None = None

    def manifest(self) -> dict:
        """The sidecar / parquet-metadata mapping (plain types)."""
        return {
            "gpus": [asdict(g) for g in self.gpus],
            "driver_version": self.driver_version,
            "host": self.host,
            "interval_s": self.interval_s,
            "started_utc": self.started_utc,
            "ended_utc": self.ended_utc,
            "samples": self.samples,
            "rows": self.table.num_rows,
            "late_ticks": self.late_ticks,
            "stop_reason": self.stop_reason,
            "unsupported_fields": list(self.unsupported),
            "read_errors": self.read_errors,
            "command": list(self.command),
            "returncode": self.returncode,
            "run_id": self.run_id,
            "columns": {c.name: c.unit for c in C.RESOURCE_COLUMNS},
        }

    def summary(self) -> str:
        import numpy as np

        t = self.table
        lines = [f"{self.samples} samples × {len(self.gpus)} GPU(s) = {t.num_rows} rows every {self.interval_s:g} s "
                 f"({self.stop_reason}); late ticks skipped: {self.late_ticks}"]
        for g in self.gpus:
            lines.append(f"  GPU {g.index}: {g.name}, power limit "
                         f"{fmt(g.power_limit_w, 'g')}{'' if g.power_limit_w is None else ' W'}")
        p = np.asarray(t.column("power_w").to_numpy(zero_copy_only=False), dtype=float)
        p = p[np.isfinite(p)]
        if p.size:
            lines.append(f"  power W: min {p.min():.1f}, mean {p.mean():.1f}, max {p.max():.1f}")
        if self.unsupported:
            lines.append("  not supported by this GPU/driver (left empty): " + ", ".join(self.unsupported))
        if self.read_errors:
            lines.append(f"  {self.read_errors} reads failed (left empty)")
        lines.append(f"  driver {self.driver_version}")
        return "\n".join(lines)


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


class _Nvml:
    """The nvidia-ml-py calls capplan uses, and their unit conversions (tests fake ``pynvml``)."""

    def __init__(self):
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise TelemetryError(f"no NVIDIA driver found: nvidia-ml-py is not installed ({exc})",
                                 fix="pip install nvidia-ml-py") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise TelemetryError(f"no NVIDIA driver found: {exc}",
                                 fix="run on a machine with an NVIDIA GPU and driver (nvidia-smi must work)") from None
        except OSError as exc:
            raise TelemetryError(f"no NVIDIA driver found: {exc}",
                                 fix="run on a machine with an NVIDIA GPU and driver (nvidia-smi must work)") from None
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            self.close()
            raise TelemetryError(f"NVIDIA driver found but GPUs cannot be listed: {exc}") from None
        if count < 1:
            self.close()
            raise TelemetryError("NVIDIA driver found but no GPU is visible",
                                 fix="check CUDA_VISIBLE_DEVICES / container GPU access")
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.unsupported: set[str] = set()  # "field" (device info) or "field (GPU i)"
        self._skip: set[tuple[int, str]] = set()
        self.read_errors = 0

    def close(self):
        try:
            self.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a driver that is already gone
            pass

    def _try(self, name: str, fn, *args, gpu: int | None = None):
        nv = self.nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_NOT_SUPPORTED:
                self.unsupported.add(name if gpu is None else f"{name} (GPU {gpu})")
                if gpu is not None:
                    self._skip.add((gpu, name))
            else:
                self.read_errors += 1
            return None

    def info(self) -> tuple[tuple[GpuInfo, ...], str | None]:
        nv = self.nv
        gpus = []
        for i, h in enumerate(self.handles):
            name = self._try("name", nv.nvmlDeviceGetName, h)
            uuid = self._try("uuid", nv.nvmlDeviceGetUUID, h)
            lim = self._try("power_limit_w", nv.nvmlDeviceGetPowerManagementLimit, h)
            mem = self._try("memory_total_bytes", nv.nvmlDeviceGetMemoryInfo, h)
            gpus.append(GpuInfo(index=i, name=_text(name) if name is not None else "unknown",
                                uuid=_text(uuid) if uuid is not None else None,
                                power_limit_w=None if lim is None else float(lim) / 1000.0,
                                memory_total_bytes=None if mem is None else int(mem.total)))
        drv = self._try("driver_version", nv.nvmlSystemGetDriverVersion)
        return tuple(gpus), (_text(drv) if drv is not None else None)

    def sample(self, i: int) -> tuple:
        """(power_w, energy_mj, gpu_util_pct, mem_used_bytes, sm_clock_mhz) of GPU i; None where
        the GPU does not support a field (asked once, then skipped) or a read failed."""
        nv, h = self.nv, self.handles[i]

        def get(name, fn, *args):
            return None if (i, name) in self._skip else self._try(name, fn, h, *args, gpu=i)

        p = get("power_w", nv.nvmlDeviceGetPowerUsage)
        e = get("energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption)
        u = get("gpu_util_pct", nv.nvmlDeviceGetUtilizationRates)
        m = get("mem_used_bytes", nv.nvmlDeviceGetMemoryInfo)
        c = get("sm_clock_mhz", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        return (None if p is None else float(p) / 1000.0, None if e is None else float(e),
                None if u is None else float(u.gpu), None if m is None else int(m.used),
                None if c is None else float(c))


def _utc(epoch_ns: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch_ns / 1e9, dt.timezone.utc).isoformat(timespec="milliseconds")


def record(*, interval_s: float = 0.1, duration_s: float | None = None,
           should_stop: Callable[[], str | None] | None = None, run_id: str | None = None,
           clock: Callable[[], int] = time.monotonic_ns, wall: Callable[[], int] = time.time_ns,
           sleep: Callable[[float], None] = time.sleep, host: str | None = None,
           command: tuple[str, ...] = (), on_start: Callable[[], None] | None = None) -> Recording:
    """Sample every GPU on the grid t0 + k·interval until ``duration_s`` has passed,
    ``should_stop()`` returns a reason, or Ctrl-C. ``on_start`` runs after NVML is up and
    before the first sample (the CLI starts the benchmark there)."""
    if not interval_s > 0:
        raise TelemetryError(f"--interval must be > 0 s, got {interval_s}", fix="e.g. --interval 0.1")
    if duration_s is not None and not duration_s > 0:
        raise TelemetryError(f"--duration must be > 0 s, got {duration_s}", fix="e.g. --duration 20")
    nvml = _Nvml()
    try:
        gpus, driver = nvml.info()
        n = len(nvml.handles)
        host = host or socket.gethostname()
        cols = {name: [] for name in ("t_ns", "gpu_index") + FIELDS}
        step = int(round(interval_s * C.NS_PER_S))
        end = None if duration_s is None else int(round(duration_s * C.NS_PER_S))
        if on_start is not None:
            on_start()
        t0, w0 = clock(), wall()
        k, samples, late, reason = 0, 0, 0, "duration reached"
        try:
            while True:
                due = k * step
                if end is not None and due > end:
                    break
                now = clock() - t0
                if now < due:
                    sleep((due - now) / C.NS_PER_S)
                for i in range(n):
                    t = clock() - t0
                    vals = nvml.sample(i)
                    cols["t_ns"].append(w0 + t)
                    cols["gpu_index"].append(i)
                    for name, v in zip(FIELDS, vals):
                        cols[name].append(v)
                samples += 1
                if should_stop is not None:
                    why = should_stop()
                    if why:
                        reason = why
                        break
                now = clock() - t0
                nxt = k + 1
                if now > nxt * step:  # behind: skip the ticks already past, count them
                    skip_to = now // step + 1
                    late += int(skip_to - nxt)
                    nxt = int(skip_to)
                k = nxt
        except KeyboardInterrupt:
            reason = "interrupted (Ctrl-C)"
        t_end = wall()
        table = _table(cols, run_id, host)
        return Recording(table=table, gpus=gpus, driver_version=driver, host=host, interval_s=interval_s,
                         started_utc=_utc(w0), ended_utc=_utc(t_end), samples=samples, late_ticks=late,
                         stop_reason=reason, unsupported=tuple(sorted(nvml.unsupported)),
                         read_errors=nvml.read_errors, command=tuple(command), run_id=run_id)
    finally:
        nvml.close()


def _table(cols: dict, run_id: str | None, host: str) -> pa.Table:
    n = len(cols["t_ns"])
    data = dict(cols)
    data["run_id"] = [run_id] * n
    data["host"] = [host] * n
    return pa.Table.from_pydict({c.name: data[c.name] for c in C.RESOURCE_COLUMNS}, schema=C.RESOURCE_SCHEMA)


def sidecar_path(parquet_path: str | Path) -> Path:
    p = Path(parquet_path)
    return p.with_name(p.stem + ".gpu.yaml")


def write_recording(rec: Recording, out: str | Path) -> tuple[Path, Path]:
    """Write the parquet (with the manifest facts as key-value metadata) and the sidecar YAML,
    each atomically."""
    import pyarrow.parquet as pq
    import yaml

    from .io import atomic_path, write_text_atomic

    out = Path(out)
    meta = rec.manifest()
    table = rec.table.replace_schema_metadata({METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
    with atomic_path(out) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    side = sidecar_path(out)
    write_text_atomic(side, yaml.safe_dump(meta, sort_keys=False, allow_unicode=True))
    return out, side


def read_metadata(parquet_path: str | Path) -> dict:
    """The ``capplan.telemetry`` mapping stored in a recording's parquet metadata."""
    import pyarrow.parquet as pq

    md = pq.read_schema(parquet_path).metadata or {}
    return json.loads(md[METADATA_KEY]) if METADATA_KEY in md else {}
