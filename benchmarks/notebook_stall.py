"""Notebook runs under CPU contention: does any cell wait silently for a kernel reply?

    python benchmarks/notebook_stall.py [--rounds 10] [--report-rounds 10] [--burners 3]
                                        [--client both|steady|plain] [--parts report,notebook,page]
                                        [--cell-timeout 120] [--out stall.json]

``--burners`` CPU-bound processes run beside the measurement (a busy 2-core box). Each round
runs, per client:
- ``report``: `capplan report` on the bundled demo (its notebooks at once, in threads);
- ``notebook``: the what-if notebook as its test runs it (papermill, one kernel);
- ``page``: `capplan whatif --pool 2` started afresh, then the panel opened in chromium: the
  seconds from start until the URL is printed and from the URL until the plan table shows.

Clients, side by side in one run: ``steady`` is capplan's (capplan.nbexec: one-second polls,
late cells reported, the URL printed once the pre-heated pages are ready); ``plain`` is the
baseline, jupyter_client's own asyncio channels (a wait ends only when zmq delivers a wake-up,
or at the cell timeout, here ``--cell-timeout`` instead of 900 s so a stall costs minutes, not
quarters of an hour) and the URL printed before any kernel has run the page (as before).

Reported per part and client: cells run, the slowest cell, cells over 60 s, cell timeouts,
replies found by the re-check (steady only), and the slowest page.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client.channels import AsyncZMQSocketChannel

from capplan import nbexec
from capplan import report as R

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
STEADY_GET_MSG = nbexec.SteadyChannel.get_msg
CELLS: list[tuple[str, int, float]] = []

# every cell's duration, whichever client: wrap the watch's hooks
_start, _done = nbexec.CellWatch.on_cell_start, nbexec.CellWatch.on_cell_done


def _on_start(self, cell, cell_index, **kw):
    _start(self, cell, cell_index, **kw)


def _on_done(self, **kw):
    if self.cell_index is not None and self._handle is not None:
        CELLS.append((self.notebook, self.cell_index, time.monotonic() - self.started))
    _done(self, **kw)


nbexec.CellWatch.on_cell_start, nbexec.CellWatch.on_cell_done = _on_start, _on_done


def use_client(name: str) -> None:
    nbexec.SteadyChannel.get_msg = STEADY_GET_MSG if name == "steady" else AsyncZMQSocketChannel.get_msg


def run_part(part: str, client: str, timeout_s: float, work: Path) -> dict:
    use_client(client)
    CELLS.clear()
    before = nbexec.rescued()
    t0 = time.monotonic()
    failed = ""
    orig = R.execute_notebook
    R.execute_notebook = lambda *a, **k: orig(*a, **{**k, "cell_timeout_s": timeout_s, "say": lambda s: None})
    try:
        if part == "report":
            R.render_report(out=work / "report", progress=None)
        else:
            R.execute_notebook(R.notebooks_dir() / R.WHATIF_NOTEBOOK, {"reps": 20, "seed": 0}, cwd=work)
    except Exception as exc:  # noqa: BLE001 - a timed-out cell is a result here
        failed = str(exc).splitlines()[0][:200]
    finally:
        R.execute_notebook = orig
    return {"wall_s": time.monotonic() - t0, "cells": list(CELLS), "failed": failed,
            "rescued": nbexec.rescued() - before}


SERVE = """import sys
import capplan.commands.whatif as W
import capplan.nbexec as N
if sys.argv[1] == "plain":  # the baseline: no steady client, URL printed before the pool ran
    N.VOILA_OPTIONS = ()
    W.wait_for_pool = W.wait_for_listening = lambda *a, **k: 0
from capplan.cli import main
sys.argv = ["capplan", "whatif", *sys.argv[2:]]
main()
"""


def run_page(client: str, work: Path) -> dict:
    from playwright.sync_api import sync_playwright

    log_path = work / "whatif.log"
    env = dict(os.environ, CAPPLAN_CACHE_DIR=str(work / "cache"))
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, client, "--port", "0", "--reps", "20",
                                 "--seed", "0", "--token", "t", "--pool", "2"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=work, env=env,
                                start_new_session=True)
    try:
        url = ""
        while not url and time.monotonic() - t0 < 900 and proc.poll() is None:
            for line in log_path.read_text(errors="replace").splitlines():
                if "what-if panel for" in line:
                    url = line.split(": ", 1)[1].split()[0]
            time.sleep(0.2)
        t_url = time.monotonic() - t0
        if not url:
            return {"url_s": t_url, "page_s": float("nan"), "failed": "no URL"}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1300, "height": 1000})
                t1 = time.monotonic()  # the page's time counts from the URL being printed
                port = int(url.split(":")[2].split("/")[0])
                while socket.socket().connect_ex(("127.0.0.1", port)) != 0 and time.monotonic() - t1 < 300:
                    time.sleep(0.2)  # the baseline prints its URL before Voila listens
                page.goto(url, wait_until="commit", timeout=600_000)
                page.wait_for_selector('tr[data-key="total_gpus"] td.value', timeout=600_000)
                return {"url_s": t_url, "page_s": time.monotonic() - t1, "failed": ""}
            except Exception as exc:  # noqa: BLE001
                return {"url_s": t_url, "page_s": time.monotonic() - t1, "failed": str(exc)[:200]}
            finally:
                browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def summarize(rows: list[dict]) -> dict:
    cells = [c for r in rows for c in r.get("cells", [])]
    slow = max(cells, key=lambda c: c[2], default=("", -1, float("nan")))
    return {"rounds": len(rows), "cells": len(cells),
            "slowest_cell_s": round(slow[2], 1), "slowest_cell": f"{slow[0]} cell {slow[1]}",
            "cells_over_60s": sum(c[2] > 60 for c in cells),
            "timeouts": sum(bool(r.get("failed")) for r in rows),
            "rescued": sum(r.get("rescued", 0) for r in rows),
            "slowest_wall_s": round(max((r.get("wall_s", 0) for r in rows), default=0), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--report-rounds", type=int, default=None)
    ap.add_argument("--burners", type=int, default=3)
    ap.add_argument("--client", default="both", choices=("both", "steady", "plain"))
    ap.add_argument("--parts", default="report,notebook,page")
    ap.add_argument("--cell-timeout", type=float, default=120.0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    clients = ("steady", "plain") if a.client == "both" else (a.client,)
    parts = a.parts.split(",")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.burners)]
    results: dict = {}
    try:
        for rnd in range(max(a.rounds, a.report_rounds or 0)):
            for client in clients:  # interleaved: both clients see the same contention
                for part in parts:
                    if rnd >= (a.report_rounds or a.rounds if part == "report" else a.rounds):
                        continue
                    work = Path(tempfile.mkdtemp(prefix=f"stall-{part}-{client}-"))
                    row = run_page(client, work) if part == "page" else run_part(part, client, a.cell_timeout, work)
                    results.setdefault(f"{part}/{client}", []).append(row)
                    print(f"round {rnd} {part:8s} {client:6s} "
                          + " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in row.items() if k != "cells"), flush=True)
    finally:
        for b in burners:
            b.kill()
    print("\n| part | client | rounds | cells | slowest cell (s) | cells > 60 s | timeouts/failures "
          "| replies re-checked | slowest run (s) | slowest page (s) | slowest URL (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, rows in results.items():
        part, client = key.split("/")
        s = summarize(rows)
        pages = [r["page_s"] for r in rows if "page_s" in r]
        urls = [r["url_s"] for r in rows if "url_s" in r]
        print(f"| {part} | {client} | {s['rounds']} | {s['cells'] or '–'} | {s['slowest_cell_s'] if s['cells'] else '–'} "
              f"| {s['cells_over_60s'] if s['cells'] else '–'} | {s['timeouts']} | {s['rescued'] if part != 'page' else '–'} "
              f"| {s['slowest_wall_s'] if part != 'page' else '–'} | {max(pages, default=float('nan')):.1f} "
              f"| {max(urls, default=float('nan')):.1f} |")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
