"""Telemetry with nvidia-ml-py replaced at its boundary (there is no GPU here)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pyarrow.parquet as pq
import pynvml
import pytest
import yaml

from capplan import contract as C
from capplan.cli import main
from capplan.telemetry import read_metadata, record, sidecar_path


class FakeNvml:
    """Two GPUs. Power 100 + 10·i W (+1 W per call), energy counter +50 mJ per call, util 40 %,
    memory 1 GiB used of 80 GiB, SM clock 1980 MHz. GPU 1 does not support the energy counter.
    Each read advances the fake clock by ``cost_ns`` (a read takes time)."""

    def __init__(self, clock=None, cost_ns=0, count=2):
        self.clock = clock
        self.cost_ns = cost_ns
        self.count = count
        self.calls = 0
        self.energy = {0: 1_000_000.0, 1: 2_000_000.0}
        self.shutdown = False

    def _tick(self):
        self.calls += 1
        if self.clock is not None:
            self.clock.t += self.cost_ns

    def install(self, mp):
        mp.setattr(pynvml, "nvmlInit", lambda: None)
        mp.setattr(pynvml, "nvmlShutdown", self._shut)
        mp.setattr(pynvml, "nvmlDeviceGetCount", lambda: self.count)
        mp.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: ("h", i))
        mp.setattr(pynvml, "nvmlDeviceGetName", lambda h: f"NVIDIA H200 #{h[1]}".encode())
        mp.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-000{h[1]}")
        mp.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "560.35.03")
        mp.setattr(pynvml, "nvmlDeviceGetPowerManagementLimit", lambda h: 700_000)
        mp.setattr(pynvml, "nvmlDeviceGetPowerUsage", self.power)
        mp.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", self.energy_mj)
        mp.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=40, memory=10))
        mp.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=2**30, total=80 * 2**30, free=0))
        mp.setattr(pynvml, "nvmlDeviceGetClockInfo", self.clock_info)
        return self

    def _shut(self):
        self.shutdown = True

    def power(self, h):
        self._tick()
        return (100 + 10 * h[1]) * 1000 + self.calls  # mW

    def energy_mj(self, h):
        if h[1] == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.energy[h[1]] += 50.0
        return self.energy[h[1]]

    def clock_info(self, h, which):
        assert which == pynvml.NVML_CLOCK_SM
        return 1980


class FakeClock:
    def __init__(self):
        self.t = 5_000_000_000  # monotonic clocks do not start at 0
        self.sleeps = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        assert s >= 0
        self.sleeps.append(s)
        self.t += int(round(s * 1e9))


def test_samples_every_gpu_on_a_drift_free_grid(monkeypatch):
    clk = FakeClock()
    fake = FakeNvml(clk, cost_ns=3_000_000).install(monkeypatch)  # each read takes 3 ms
    rec = record(interval_s=0.1, duration_s=10.0, clock=clk, wall=lambda: 1_700_000_000_000_000_000,
                 sleep=clk.sleep, host="h1", run_id="r1")
    t = rec.table
    assert t.schema.names == [c.name for c in C.RESOURCE_COLUMNS]
    assert rec.samples == 101 and t.num_rows == 202 and rec.late_ticks == 0
    ts = t.column("t_ns").to_pylist()
    gpu = t.column("gpu_index").to_pylist()
    first = [x for x, g in zip(ts, gpu) if g == 0]
    # GPU 0 is read at exactly k × 100 ms: 3 ms per read does not accumulate (absolute deadlines)
    rel = [x - 1_700_000_000_000_000_000 for x in first]
    assert rel[0] == 0 and rel[1] == 100_000_000 and rel[-1] == 10_000_000_000
    # GPU 1 is read after GPU 0's reads (one power read = 3 ms): actual times recorded
    second = [x for x, g in zip(ts, gpu) if g == 1]
    assert second[0] - first[0] == 3_000_000
    rows = t.to_pylist()
    assert rows[0]["power_w"] == pytest.approx(100.001) and rows[1]["power_w"] == pytest.approx(110.002)
    assert rows[0]["energy_mj"] == 1_000_050.0 and rows[1]["energy_mj"] is None
    assert rows[0]["gpu_util_pct"] == 40.0 and rows[0]["mem_used_bytes"] == 2**30
    assert rows[0]["sm_clock_mhz"] == 1980.0 and rows[0]["run_id"] == "r1" and rows[0]["host"] == "h1"
    assert rec.unsupported == ("energy_mj (GPU 1)",)  # said, not hidden
    assert rows[-2]["energy_mj"] == 1_000_050.0 + 100 * 50.0  # GPU 0 keeps its counter
    assert rec.gpus[1].name == "NVIDIA H200 #1" and rec.gpus[0].power_limit_w == 700.0
    assert rec.gpus[0].memory_total_bytes == 80 * 2**30 and rec.driver_version == "560.35.03"
    assert fake.shutdown


def test_slow_reads_skip_ticks_instead_of_bunching(monkeypatch):
    clk = FakeClock()
    FakeNvml(clk, cost_ns=130_000_000, count=1).install(monkeypatch)  # a read takes 130 ms > 100 ms
    rec = record(interval_s=0.1, duration_s=1.0, clock=clk, wall=lambda: 0, sleep=clk.sleep, host="h")
    rel = rec.table.column("t_ns").to_pylist()
    # reads at 0, 200, …, 1 000 ms: each missed tick skipped and counted
    assert rel == [0, 200_000_000, 400_000_000, 600_000_000, 800_000_000, 1_000_000_000]
    assert rec.late_ticks == 6  # 100, 300, 500, 700, 900 and 1 100 ms (1 100 is within the duration)


def test_stop_callback_and_ctrl_c(monkeypatch):
    clk = FakeClock()
    FakeNvml(clk, count=1).install(monkeypatch)
    n = {"k": 0}

    def stop():
        n["k"] += 1
        return "command exited with code 0" if n["k"] == 4 else None

    rec = record(interval_s=0.5, should_stop=stop, clock=clk, wall=lambda: 0, sleep=clk.sleep, host="h")
    assert rec.samples == 4 and rec.stop_reason == "command exited with code 0"

    clk = FakeClock()
    FakeNvml(clk, count=1).install(monkeypatch)

    def interrupting_sleep(s):  # Ctrl-C arrives while waiting for the tick at 3.0 s
        if clk.t > 5_000_000_000 + 2_000_000_000:
            raise KeyboardInterrupt
        clk.sleep(s)

    rec = record(interval_s=0.5, clock=clk, wall=lambda: 0, sleep=interrupting_sleep, host="h")
    assert rec.stop_reason == "interrupted (Ctrl-C)" and rec.samples == 6  # 0 … 2.5 s kept


def test_cli_duration_writes_parquet_and_sidecar(monkeypatch, tmp_path, capsys):
    FakeNvml().install(monkeypatch)
    out = tmp_path / "resources.parquet"
    rc = main(["telemetry", "record", "--interval", "0.02", "--duration", "0.1", "--out", str(out),
               "--run-id", "r7"])
    text = capsys.readouterr().out
    assert rc == 0
    t = pq.read_table(out)
    assert t.num_rows == 2 * 6 and set(t.column("run_id").to_pylist()) == {"r7"}
    side = yaml.safe_load(sidecar_path(out).read_text())
    assert side["gpus"][0]["name"] == "NVIDIA H200 #0" and side["gpus"][0]["power_limit_w"] == 700.0
    assert side["driver_version"] == "560.35.03" and side["unsupported_fields"] == ["energy_mj (GPU 1)"]
    assert side["rows"] == 12 and side["stop_reason"] == "duration reached"
    assert read_metadata(out) == side
    assert "power W: min" in text and "not supported by this GPU/driver (left empty): energy_mj (GPU 1)" in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_cli_records_while_a_command_runs(monkeypatch, tmp_path, capsys):
    FakeNvml().install(monkeypatch)
    out = tmp_path / "r.parquet"
    rc = main(["telemetry", "record", "--interval", "0.02", "--out", str(out), "--",
               sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(3)"])
    assert rc == 3  # the benchmark's exit code comes back
    side = yaml.safe_load(sidecar_path(out).read_text())
    assert side["stop_reason"] == "command exited with code 3" and side["returncode"] == 3
    assert side["command"][-1].endswith("sys.exit(3)")
    assert side["samples"] >= 5
    assert "exited with code 3" in capsys.readouterr().err


@pytest.mark.parametrize("err", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_exit_2(monkeypatch, tmp_path, capsys, err):
    def boom():
        raise pynvml.NVMLError(err)

    monkeypatch.setattr(pynvml, "nvmlInit", boom)
    out = tmp_path / "r.parquet"
    rc = main(["telemetry", "record", "--duration", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 2
    assert "no NVIDIA driver found: " in captured.err and "Traceback" not in captured.err
    assert not out.exists() and not sidecar_path(out).exists()


def test_no_gpu_and_bad_options(monkeypatch, tmp_path, capsys):
    FakeNvml(count=0).install(monkeypatch)
    assert main(["telemetry", "record", "--duration", "1", "--out", str(tmp_path / "a.parquet")]) == 2
    assert "no GPU is visible" in capsys.readouterr().err
    FakeNvml().install(monkeypatch)
    assert main(["telemetry", "record", "--interval", "0", "--out", str(tmp_path / "a.parquet")]) == 2
    assert "--interval must be > 0" in capsys.readouterr().err
    assert main(["telemetry", "record", "--out", str(tmp_path / "a.csv")]) == 2
    assert "must name a .parquet file" in capsys.readouterr().err
    assert main(["telemetry", "record", "--duration", "1", "--out", str(tmp_path / "b.parquet"), "--",
                 "/nonexistent/bench"]) == 2
    assert "cannot start the command" in capsys.readouterr().err


def test_recorder_runs_without_duckdb():
    """A GPU node may have NVML and pyarrow but no DuckDB (scripts/gpu_telemetry_check.sh on a
    box without a package index): ``capplan telemetry record`` must not need it."""
    code = ("import sys; sys.modules['duckdb'] = None\n"
            "import capplan, capplan.telemetry, capplan.cost\n"
            "from capplan.cli import main\n"
            "try:\n    main(['telemetry', 'record', '--help'])\nexcept SystemExit as e:\n"
            "    sys.exit(e.code)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--interval" in r.stdout
