"""How long `capplan --help` takes to start, against the listing it replaced, in one run.

    python benchmarks/cli_start.py [--repeats 15]

Three commands, interleaved round by round so a busy machine slows all of them alike:

- ``python``: an interpreter that does nothing (the floor);
- ``help``: `python -m capplan --help` (the listing comes from ``capplan.cli.COMMANDS``; no
  command module is imported);
- ``eager``: the old listing, which imported every command module (and with them pandas,
  DuckDB, pyarrow, plotly) to read each command's help line.

Reported: the median wall time of each, and help / eager as a ratio. The target of issue 29 is
`capplan --help` ≤ 0.4 s on a quiet box.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

EAGER = ("from capplan.cli import COMMANDS, LazyGroup, main\n"
         "[LazyGroup._load(n) for n in COMMANDS]\n"
         "main(['--help'])")
CASES = {
    "python": [sys.executable, "-c", "pass"],
    "help": [sys.executable, "-m", "capplan", "--help"],
    "eager": [sys.executable, "-c", EAGER],
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(a.repeats):
        for name, cmd in CASES.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'command':<8} {'median s':>9} {'min s':>7}")
    for k, v in times.items():
        print(f"{k:<8} {med[k]:>9.3f} {min(v):>7.3f}")
    print(f"help / eager: {med['help'] / med['eager']:.2f}  "
          f"(help − python: {med['help'] - med['python']:.3f} s)")


if __name__ == "__main__":
    main()
