"""Benchmark: how far one box goes, and Spark beside DuckDB (issue 18).

Two measurements, each in fresh child processes (peak RSS = the child's ``ru_maxrss``; for
Spark also the JVM's peak resident set, ``VmHWM`` of the gateway process, read before it
stops):

  engines   the 12 × 1 M-request constant-rate sweep of bench_envelope.py (built there,
            cached under benchmarks/_data/): ``reduce_study`` on DuckDB vs on Spark in local
            mode (``--spark-master``, default local[2]); wall and CPU seconds, peak RSS of
            Python and of the JVM, Spark's session start apart, the ratio; the statistics
            of both are checked equal (counts exactly).
  big       DuckDB alone on a study larger than the fetch budget: RUNS × ROWS requests
            (default 20 × 10^7 = 2·10^8), built once in chunks of 10^6 rows with numpy/pyarrow
            (constant-rate arrivals, AR(1) log TTFT, lognormal TPOT, 0.2 % failures); the
            reduction reads it one run at a time under ``--memory-limit`` with a spill
            directory; wall, CPU, peak RSS, rows/s, and the per-run figures for an
            extrapolation.

    nice -n 10 python benchmarks/bench_scale.py engines
    nice -n 10 python benchmarks/bench_scale.py big --runs 20 --rows-per-run 10000000 \\
        --memory-limit 4GB
    python benchmarks/bench_scale.py big --runs 2 --rows-per-run 1000000   # quick

The machine is shared: the load average is printed at the start and the end; compare ratios
from one run. The big study takes ~26 bytes per request on disk (5 GB for 2·10^8): check
``df -h`` first; ``--clean`` removes it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_envelope import _cpu_s, _rss_mb, build_study  # noqa: E402  (the sweep and meters)

SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"


def build_big(dest: Path, runs: int, rows: int, seed: int = 5, chunk: int = 1_000_000) -> Path:
    """RUNS runs of ROWS requests, one parquet file per run, written chunk by chunk (memory
    ≈ one chunk), cached."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml
    from scipy import signal

    from capplan import contract as C
    from capplan.io import manifest_dict

    if (dest / C.MANIFEST_NAME).is_file():
        return dest
    # a run at a time, each from its own seed and renamed into place when complete: an
    # interrupted build resumes at the first missing run and gives the same bytes
    tmp = dest.with_name(dest.name + ".tmp")
    (tmp / C.EVENTS_DIR).mkdir(parents=True, exist_ok=True)
    status_names = np.array(["ok", "timeout", "rejected"])
    mruns = []
    phi = 0.98
    for k in range(runs):
        run_id = f"r{k + 1:02d}"
        load = (k + 1) / runs
        rate = 20.0 * (k + 1)
        mruns.append({"run_id": run_id, "offered_rps": rate, "arrival": "constant",
                      "duration_s": round(rows / rate, 3), "warmup_s": 0.0})
        final = tmp / C.EVENTS_DIR / f"{run_id}.parquet"
        if final.is_file() and pq.ParquetFile(final).metadata.num_rows == rows:
            continue
        part = final.with_suffix(".part")
        rng = np.random.default_rng([seed, k])
        writer = None
        zi = np.zeros(1)
        t0 = time.perf_counter()
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            i = np.arange(start, start + n)
            sched = (i * (1e9 / rate)).astype(np.int64)
            z, zi = signal.lfilter([1.0], [1.0, -phi],
                                   rng.standard_normal(n) * np.sqrt(1 - phi**2), zi=zi)
            ttft_ms = 400 * np.exp(0.45 * z + 2.2 * load**2)
            tpot_ms = rng.lognormal(np.log(30 * (1 + load)), 0.3, n)
            out_tok = np.maximum(2, rng.geometric(1 / 150, n)).astype(np.int64)
            first = sched + (ttft_ms * 1e6).astype(np.int64)
            last = first + (tpot_ms * 1e6 * (out_tok - 1)).astype(np.int64)
            st = rng.choice(3, n, p=[0.998, 0.001, 0.001])
            fail = st != 0
            tbl = pa.table({
                "run_id": pa.array(np.full(n, run_id)),
                "request_id": pa.array(np.char.add(f"{run_id}-", i.astype("U10"))),
                "scheduled_ns": sched, "sent_ns": sched,
                "first_token_ns": pa.array(first, mask=fail),
                "last_token_ns": pa.array(last, mask=fail),
                "input_tokens": rng.integers(50, 2000, n, dtype=np.int64),
                "output_tokens": np.where(fail, 0, out_tok),
                "status": pa.array(status_names[st]),
            })
            if writer is None:
                writer = pq.ParquetWriter(part, tbl.schema, compression="zstd")
            writer.write_table(tbl, row_group_size=chunk)
        writer.close()
        os.replace(part, final)
        print(f"  built {run_id} ({rows:,} rows) in {time.perf_counter() - t0:.0f} s",
              flush=True)
    (tmp / C.MANIFEST_NAME).write_text(yaml.safe_dump(
        manifest_dict(f"bench-scale-{runs}x{rows}", mruns), sort_keys=False))
    os.replace(tmp, dest)
    return dest


def _proc_status(pid: int, key: str) -> float:
    """A /proc/<pid>/status figure in MB (VmHWM: peak resident set; VmRSS: now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(stats) -> dict:
    return {"n": [r.n for r in stats.runs], "n_good": [r.n_good for r in stats.runs],
            "grid_sum": [int(r.grid[:, -1, -1].sum()) for r in stats.runs],
            "block_len": [round(r.block_len.circular, 6) for r in stats.runs]}


def child_duckdb(path: str, memory_limit: str | None, temp_dir: str | None,
                 fetch_mb: float | None, threads: int) -> dict:
    from capplan.reduce import engine, reduce_study
    from capplan.study import connect, open_study

    # per-stage wall seconds (for the extrapolation): DuckDB's scan + metrics + sort into
    # numpy (``_fetch``), and numpy's counting (``run_series`` + ``run_counts``); the rest
    # (open, the first SQL pass, assembly) is the remainder
    stages = {"fetch": 0.0, "count": 0.0}

    def timed(stage, f):
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                stages[stage] += time.perf_counter() - t
        return g

    engine._fetch = timed("fetch", engine._fetch)
    engine.run_series = timed("count", engine.run_series)
    engine.run_counts = timed("count", engine.run_counts)
    t0, c0 = time.perf_counter(), _cpu_s()
    study = open_study(path, con=connect(threads=threads, memory_limit=memory_limit,
                                         temp_directory=temp_dir))
    stats = reduce_study(study, SLO, fetch_mb=fetch_mb, progress=sys.stderr.isatty())
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    n = sum(r.n for r in stats.runs)
    return {"engine": "duckdb", "wall_s": wall, "cpu_s": cpu, "rss_mb": _rss_mb(), "rows": n,
            "rows_per_s": n / wall, "stages_s": stages, "summary": _summary(stats)}


def child_spark(path: str, master: str, driver_memory: str) -> dict:
    from capplan.reduce import reduce_study
    from capplan.reduce import spark as rspark
    from capplan.sparkstudy import open_spark_study, spark_session

    # what reaches the driver: rows and bytes of every collected (small) result
    collected = {"rows": 0, "bytes": 0}
    collect = rspark._collect

    def counted(*a, **k):
        df = collect(*a, **k)
        collected["rows"] += len(df)
        collected["bytes"] += int(df.memory_usage(deep=True).sum())
        return df

    rspark._collect = counted
    t0, c0 = time.perf_counter(), _cpu_s()
    spark = spark_session(master, conf={"spark.driver.memory": driver_memory,
                                        "spark.ui.enabled": "false"})
    jvm = spark.sparkContext._gateway.proc.pid
    t1, c1, j1 = time.perf_counter(), _cpu_s(), _proc_cpu_s(jvm)
    study = open_spark_study(path, spark=spark)
    stats = reduce_study(study, SLO)
    t2, c2, j2 = time.perf_counter(), _cpu_s(), _proc_cpu_s(jvm)
    n = sum(r.n for r in stats.runs)
    out = {"engine": "spark", "master": master, "start_s": t1 - t0, "wall_s": t2 - t1,
           "cpu_s": (c2 - c1) + (j2 - j1), "python_cpu_s": c2 - c1, "jvm_cpu_s": j2 - j1,
           "rss_mb": _rss_mb(), "jvm_rss_mb": _proc_status(jvm, "VmHWM"), "rows": n,
           "rows_per_s": n / (t2 - t1), "collected": collected, "summary": _summary(stats)}
    spark.stop()
    return out


def _spawn(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         env={**os.environ})
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["engines", "big"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rows-per-run", type=int, default=10_000_000)
    ap.add_argument("--memory-limit", default="4GB")
    ap.add_argument("--temp-dir", default=None)
    ap.add_argument("--fetch-mb", type=float, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--clean", action="store_true", help="remove the big study afterwards")
    ap.add_argument("--child", choices=["duckdb", "spark"], default=None)
    ap.add_argument("--path", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.child == "duckdb":
        print(json.dumps(child_duckdb(a.path, a.memory_limit, a.temp_dir, a.fetch_mb,
                                      a.threads)))
        return
    if a.child == "spark":
        print(json.dumps(child_spark(a.path, a.spark_master, a.driver_memory)))
        return
    load0 = os.getloadavg()
    res: dict = {"load_start": load0}
    if a.what == "engines":
        path = HERE / "_data" / "envelope_constant_12x1000000_s11"
        build_study(path, 12, 1_000_000, 11, "constant")
        d = _spawn(["engines", "--child", "duckdb", "--path", str(path), "--memory-limit",
                    a.memory_limit, "--threads", str(a.threads)])
        s = _spawn(["engines", "--child", "spark", "--path", str(path), "--spark-master",
                    a.spark_master, "--driver-memory", a.driver_memory])
        res.update(duckdb=d, spark=s, same=d["summary"] == s["summary"])
        print(f"12 × 1 M requests, SLO {SLO}")
        print(f"{'':34s}{'DuckDB':>12s}{'Spark ' + a.spark_master:>18s}")
        for label, key, fmt in (("reduce wall s", "wall_s", "{:.1f}"),
                                ("reduce CPU s (Python + JVM)", "cpu_s", "{:.1f}"),
                                ("peak RSS Python MB", "rss_mb", "{:.0f}")):
            print(f"{label:34s}{fmt.format(d[key]):>12s}{fmt.format(s[key]):>18s}")
        print(f"{'peak RSS JVM MB':34s}{'—':>12s}{s['jvm_rss_mb']:>18.0f}")
        print(f"{'Spark session start s':34s}{'—':>12s}{s['start_s']:>18.1f}")
        print(f"{'collected to the driver':34s}{'—':>12s}"
              f"{s['collected']['rows'] / 1e3:>9.0f} k rows, {s['collected']['bytes'] / 2**20:.1f} MB")
        print(f"{'CPU s per 10^6 rows':34s}{d['cpu_s'] / d['rows'] * 1e6:>12.2f}"
              f"{s['cpu_s'] / s['rows'] * 1e6:>18.2f}")
        print(f"ratio Spark / DuckDB: wall {s['wall_s'] / d['wall_s']:.1f}×, CPU "
              f"{s['cpu_s'] / d['cpu_s']:.1f}×; statistics equal: {res['same']}")
    else:
        dest = HERE / "_data" / f"scale_{a.runs}x{a.rows_per_run}"
        t = time.perf_counter()
        build_big(dest, a.runs, a.rows_per_run)
        print(f"study {dest} ready in {time.perf_counter() - t:.0f} s "
              f"({sum(f.stat().st_size for f in dest.rglob('*.parquet')) / 2**30:.2f} GiB)",
              flush=True)
        temp = a.temp_dir or tempfile.mkdtemp(prefix="capplan-spill-")
        d = _spawn(["big", "--child", "duckdb", "--path", str(dest), "--memory-limit",
                    a.memory_limit, "--temp-dir", temp, "--threads", str(a.threads)]
                   + (["--fetch-mb", str(a.fetch_mb)] if a.fetch_mb else []))
        res["duckdb"] = d
        print(f"DuckDB, {d['rows']:,} requests, memory limit {a.memory_limit}, "
              f"{a.threads} threads: wall {d['wall_s']:.0f} s, CPU {d['cpu_s']:.0f} s, "
              f"peak RSS {d['rss_mb']:.0f} MB, {d['rows_per_s'] / 1e6:.2f} M rows/s")
        st = d["stages_s"]
        print(f"  stages: DuckDB scan + sort into numpy {st['fetch']:.1f} s, numpy counting "
              f"{st['count']:.1f} s, the rest {d['wall_s'] - st['fetch'] - st['count']:.1f} s; "
              f"per 10^6 rows: {d['wall_s'] / d['rows'] * 1e6:.2f} s wall, "
              f"{d['cpu_s'] / d['rows'] * 1e6:.2f} s CPU")
        if a.clean:
            shutil.rmtree(dest)
        if not a.temp_dir:
            shutil.rmtree(temp, ignore_errors=True)
    res["load_end"] = os.getloadavg()
    print(f"load average {res['load_start'][0]:.1f} at the start, {res['load_end'][0]:.1f} "
          f"at the end, on {os.cpu_count()} CPUs")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
