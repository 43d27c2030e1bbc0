#!/usr/bin/env bash
# Real-GPU check of `capplan telemetry record` (the tests fake NVML; this runs the real thing).
#
#   OUT=/some/dir bash scripts/gpu_telemetry_check.sh
#
# Installs capplan (or uses the checkout where pip cannot), records 20 s at 0.1 s on every GPU
# while a ~12 s matmul load runs (then ~6 s idle) when torch with CUDA is importable, else
# idle, and prints a summary: rows, GPUs, power min/mean/max (W), energy-counter delta vs
# integrated power (J), utilisation, memory, SM clock, sample spacing, and the GPU name /
# driver / power limit from the sidecar.
# Exit code: that of `capplan telemetry record` (2 = no NVIDIA driver). Takes < 2 min.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
echo "== install"
# `capplan` is the installed command; without a package index (pip cannot build or fetch
# dependencies) the checkout itself is used: PYTHONPATH plus `python -m capplan`. The telemetry
# recorder needs only nvidia-ml-py, pyarrow, pyyaml, click and numpy/pandas, not DuckDB.
CAPPLAN=(capplan)
timeout 60 pip install -q -e . 2>&1 | tail -3 || true
if ! python -c "import capplan.telemetry, pynvml" 2>/dev/null || ! command -v capplan >/dev/null; then
  echo "capplan not installed (no package index here?): using the checkout (PYTHONPATH, python -m capplan)"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  CAPPLAN=(python -m capplan)
fi
python -c "import capplan.telemetry, pynvml" || { echo "FAILED: cannot import capplan.telemetry / pynvml"; exit 3; }
nvidia-smi --query-gpu=index,name,driver_version,power.limit --format=csv 2>/dev/null || echo "(nvidia-smi not available)"

LOAD_PY='
import time, torch
n = torch.cuda.device_count()
xs = [torch.randn(8192, 8192, device=f"cuda:{i}", dtype=torch.bfloat16) for i in range(n)]
t0 = time.monotonic()
while time.monotonic() - t0 < 12:
    for x in xs:
        y = x @ x
    torch.cuda.synchronize()
del xs, y
torch.cuda.empty_cache()
time.sleep(6)
'
CMD=()
if timeout 60 python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "== load: bf16 matmul on every GPU for ~12 s, then ~6 s idle"
  CMD=(-- python -c "$LOAD_PY")
else
  echo "== load: none (torch with CUDA not importable): recording an idle GPU"
fi

echo "== record"
timeout 90 "${CAPPLAN[@]}" telemetry record --interval 0.1 --duration 20 --run-id gpucheck \
  --out "$OUT/resources.parquet" "${CMD[@]}"
rc=$?
if [ ! -f "$OUT/resources.parquet" ]; then
  echo "no recording written (exit $rc)"
  exit $rc
fi

echo "== summary"
python - "$OUT/resources.parquet" <<'PY'
import sys
import numpy as np
import pyarrow.parquet as pq
import yaml
from capplan.cost import integrate_power_j
from capplan.telemetry import read_metadata, sidecar_path

path = sys.argv[1]
df = pq.read_table(path).to_pandas()
side = yaml.safe_load(open(sidecar_path(path)))
assert read_metadata(path) == side, "parquet metadata and sidecar differ"
print(f"rows {len(df)}, GPUs {df.gpu_index.nunique()}, samples {side['samples']}, late ticks {side['late_ticks']}, "
      f"stop: {side['stop_reason']}")
print(f"driver {side['driver_version']}; unsupported fields: {side['unsupported_fields'] or 'none'}; "
      f"read errors: {side['read_errors']}")
for g in side["gpus"]:
    d = df[df.gpu_index == g["index"]].sort_values("t_ns")
    dt = np.diff(d.t_ns.to_numpy()) / 1e9
    p = d.power_w.dropna()
    e = d.energy_mj.dropna()
    integ = integrate_power_j(d.t_ns, d.power_w)
    delta = (e.iloc[-1] - e.iloc[0]) / 1000 if len(e) > 1 else float("nan")
    print(f"GPU {g['index']}: {g['name']}  power limit {g['power_limit_w']} W  memory {g['memory_total_bytes'] / 2**30:.1f} GiB")
    print(f"  power W min {p.min():.1f} mean {p.mean():.1f} max {p.max():.1f}")
    print(f"  energy counter delta {delta:.1f} J vs integrated power {integ:.1f} J "
          f"(ratio {delta / integ if integ else float('nan'):.3f})")
    print(f"  util % mean {d.gpu_util_pct.mean():.1f} max {d.gpu_util_pct.max():.1f}; "
          f"memory used max {d.mem_used_bytes.max() / 2**30:.2f} GiB; SM clock MHz {d.sm_clock_mhz.min():.0f}–{d.sm_clock_mhz.max():.0f}")
    print(f"  sample spacing s: median {np.median(dt):.4f}, min {dt.min():.4f}, max {dt.max():.4f}; "
          f"span {(d.t_ns.iloc[-1] - d.t_ns.iloc[0]) / 1e9:.2f} s")
PY
echo "files: $OUT/resources.parquet $OUT/resources.gpu.yaml"
exit $rc
