"""The twin fitted to a server it did not generate (issue 26): real AIPerf 0.13 (the venv of
scripts/peer_tools.sh) drives the project's queueing replica (tests/realtools: 32 slots held from
prefill start to last token, ONE prefill lane, decode steps of 20 + 2·batch ms; its true C_SLO
from the independent simulation queue_truth.py), capplan imports the runs, `twin fit` and
`twin check` run on the study, and the fitted values are compared with the known ones.

    python benchmarks/twin_realtools.py sweep --out /tmp/twrt        # ~10 min: the AIPerf sweep
    python benchmarks/twin_realtools.py recover /tmp/twrt/study      # fit, check, truth, table

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
from tests.realtools.params import REFERENCE  # noqa: E402
from tests.realtools.queue_server import start_subprocess, stop_subprocess  # noqa: E402

PEERS = Path(os.environ.get("CAPPLAN_PEERS", Path.home() / ".cache/capplan/peers/aiperf-0.13.0_guidellm-0.8.1"))
SLO = qt.SLO(1000.0, 80.0, 0.95)
SLO_TEXT = "ttft_ms=1000,tpot_ms=80,attainment=0.95"
RATES = (4.0, 6.0, 8.0, 9.0, 10.0, 11.0, 12.0, 14.0)


def sweep(out: Path, *, rates=RATES, duration_s: float = 45.0, seed: int = 0, params=REFERENCE,
          isl_stddev: int = 24) -> Path:
    """One AIPerf run per rate against the replica, imported. Prompts of 64 ± ``isl_stddev``
    words (the word tokenizer makes AIPerf's and the server's counts equal), so the prefill cost
    per token can be told from its fixed part; 0 counts every prompt as 64 tokens."""
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--out", required=True)
    s.add_argument("--duration-s", type=float, default=45.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--isl-stddev", type=int, default=24)
    a = ap.parse_args(argv)
    if a.cmd == "sweep":
        print(sweep(Path(a.out), duration_s=a.duration_s, seed=a.seed, isl_stddev=a.isl_stddev))


if __name__ == "__main__":
    main()
