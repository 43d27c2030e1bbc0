"""Several people open the what-if panel at once: time until each sees the plan table, and the
kernels left after they close their tabs.

    python benchmarks/bench_whatif_users.py [--users 4] [--pool 4] [--reps 200] [--baseline-python PY]
                                            [--close crash|unload] [--cull-after 30] [--watch 120]
                                            [--late N]

For each variant, in one run: start `capplan whatif` on 127.0.0.1 (fresh cache folder, so the
one-off fit is part of the server's start-up, before anyone arrives), wait until Voila's
pre-heated pool is full (or 20 s without a pool), open the panel in ``--users`` chromium pages
at the same moment (Playwright, Debian chromium), and time each page until its plan table
shows. Then the pages are closed — ``crash`` (the default: no beforeunload, as when a browser
is killed, so only culling can reclaim the kernel) or ``unload`` (a normal tab close) — and the
kernel processes under the server are counted every 2 s for ``--watch`` seconds. Kernels the
pool keeps ready for the next visitors are reported apart from the users' leftovers.

Variants: this capplan with ``--pool N`` (and with ``--pool 0``); with ``--baseline-python``
the same measurement against another interpreter's capplan (e.g. the base interpreter whose
editable install is the main branch) — the named baseline, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def kernel_pids(pid: int) -> set[int]:
    """The kernel processes under the server."""
    out = set()
    for p in descendants(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"ipykernel_launcher" in cmd or b"ipykernel" in cmd and b"-f" in cmd:
            out.add(p)
    return out


def kernels(pid: int) -> int:
    return len(kernel_pids(pid))


def rss_mb(pid: int) -> float:
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


async def visit_and_leave(url: str, users: int, how: str, server_pid: int, pool: int, watch_s: float) -> dict:
    """Open ``users`` pages at once, time each until its plan table shows, close them (``how``)
    and count the server's kernels every 2 s until the users' ones are gone (or ``watch_s``).
    One event loop for all of it (Playwright's objects belong to the loop that made them)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pages = [await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
                 for _ in range(users)]

        async def one(page):
            t0 = time.perf_counter()
            await page.goto(url, timeout=300_000)  # the page (HTML, scripts) has loaded
            t_page = time.perf_counter() - t0
            try:
                await page.wait_for_selector('tr[data-key="total_gpus"] td.value', timeout=300_000)
            except Exception:
                print("a page never showed the plan table; it shows:\n"
                      + (await page.inner_text("body"))[:2000], file=sys.stderr)
                raise
            return time.perf_counter() - t0, t_page

        both = await asyncio.gather(*(one(p) for p in pages))
        times, page_times = [b[0] for b in both], [b[1] for b in both]
        # the visitors' kernels: the ones alive now (a refill started later is not theirs)
        visitors = kernel_pids(server_pid)
        during, mem = len(visitors), rss_mb(server_pid)
        for p in pages:
            await p.close(run_before_unload=(how == "unload"))
        if how == "crash":  # the browser goes away without saying goodbye
            await browser.close()
        t_closed = time.perf_counter()
        trace, reclaimed = [], None
        while time.perf_counter() - t_closed < watch_s:
            alive = kernel_pids(server_pid)
            left = len(alive & visitors)
            trace.append((round(time.perf_counter() - t_closed), len(alive), left))
            if left == 0 and reclaimed is None:
                reclaimed = time.perf_counter() - t_closed
            if reclaimed is not None and time.perf_counter() - t_closed > reclaimed + 4:
                break
            await asyncio.sleep(2)
        if how == "unload":
            await browser.close()
    return {"times": list(times), "page_times": page_times, "kernels_during": during, "rss_mb": mem, "trace": trace,
            "reclaimed_after_s": reclaimed, "visitors": visitors}


async def late_visits(url: str, n: int, wait_s: float) -> list:
    """``n`` visitors one after another, each ``wait_s`` after the last (longer than the cull
    timeout, so the pooled kernel they get has idled past it): the time each waits for the plan
    table, or None when it never shows (60 s). Catches a culler that shuts a kernel down under
    the visitor it was just handed to."""
    from playwright.async_api import async_playwright

    out = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for _ in range(n):
            await asyncio.sleep(wait_s)
            page = await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
            t0 = time.perf_counter()
            try:
                await page.goto(url, timeout=60_000)
                await page.wait_for_selector('tr[data-key="total_gpus"] td.value', timeout=60_000)
                out.append(time.perf_counter() - t0)
            except Exception:
                out.append(None)
            await page.close()
        await browser.close()
    return out


def run_variant(name: str, python: str, pool: int, args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="capplan-bench-users-"))
    port, token = free_port(), "bench"
    env = dict(os.environ, CAPPLAN_CACHE_DIR=str(work / "cache"))
    if python != sys.executable:
        env.pop("PYTHONPATH", None)  # another interpreter: its own capplan
    cmd = [python, "-m", "capplan", "whatif", "--port", str(port), "--token", token, "--reps", str(args.reps)]
    if pool >= 0:
        cmd += ["--pool", str(pool), "--cull-after", str(args.cull_after)]
    log = open(work / "server.log", "wb")
    t_start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work, env=env, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name}: server exited: " + (work / "server.log").read_text()[-2000:])
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.3)
        t_port = time.perf_counter() - t_start
        deadline = time.perf_counter() + (180 if pool > 0 else 20)
        while time.perf_counter() < deadline:
            text = (work / "server.log").read_text(errors="replace")
            if pool > 0 and re.search(r"Kernel pool of .* is filled with", text):
                # the pool's notebooks still run after this line: wait until its kernels go quiet
                time.sleep(5)
                break
            time.sleep(0.5)
        t_ready = time.perf_counter() - t_start
        before = kernels(proc.pid)
        seen = asyncio.run(visit_and_leave(f"http://127.0.0.1:{port}/?token={token}", args.users, args.close,
                                           proc.pid, pool, args.watch))
        alive = kernel_pids(proc.pid)
        left = len(alive)
        late = (asyncio.run(late_visits(f"http://127.0.0.1:{port}/?token={token}", args.late,
                                        2 * args.cull_after + 10)) if args.late and pool > 0 else [])
        return {"name": name, "pool": pool, "port_s": t_port, "ready_s": t_ready, "kernels_before": before,
                "kernels_left": left, "user_kernels_left": len(alive & seen["visitors"]), "late": late, **seen}
    except Exception:
        print(f"{name}: server log (last 3000 characters):\n"
              + (work / "server.log").read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--pool", type=int, nargs="*", default=[4, 0],
                    help="pool sizes to measure for this capplan (default: 4 and 0)")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--cull-after", type=int, default=30)
    ap.add_argument("--close", choices=("crash", "unload"), default="crash")
    ap.add_argument("--watch", type=int, default=120, help="seconds to watch kernels after the tabs close")
    ap.add_argument("--late", type=int, default=0,
                    help="then this many single visitors, 2×cull-after+10 s apart (pooled kernels idle past "
                         "the cull timeout): each must still get the plan table")
    ap.add_argument("--baseline-python", default=None,
                    help="an interpreter whose capplan is the baseline (no --pool/--cull-after options)")
    args = ap.parse_args()
    if not os.path.exists(CHROMIUM):
        print(f"{CHROMIUM} is not installed", file=sys.stderr)
        return 2
    load0 = os.getloadavg()
    results = [run_variant(f"capplan --pool {p}", sys.executable, p, args) for p in args.pool]
    if args.baseline_python:
        results.append(run_variant("baseline", args.baseline_python, -1, args))
    load1 = os.getloadavg()
    print(f"{args.users} users at once, reps {args.reps}, tabs closed by '{args.close}', cull after "
          f"{args.cull_after} s; load average {load0[0]:.1f} before, {load1[0]:.1f} after (2 cores, shared)")
    print("| variant | server ready (s) | page loaded per user (s) | time to plan table per user (s) | max "
          "| kernels with users | RSS with users (MB) | user kernels left after close | reclaimed after (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ts = ", ".join(f"{t:.1f}" for t in sorted(r["times"]))
        ps = ", ".join(f"{t:.1f}" for t in sorted(r["page_times"]))
        rec = "—" if r["reclaimed_after_s"] is None else f"{r['reclaimed_after_s']:.0f}"
        print(f"| {r['name']} | {r['ready_s']:.1f} | {ps} | {ts} | {max(r['times']):.1f} | {r['kernels_during']} "
              f"| {r['rss_mb']:,.0f} | {r['user_kernels_left']} (of {r['kernels_left']} running; pool {max(r['pool'], 0)}) "
              f"| {rec} |")
    base = next((r for r in results if r["name"] == "baseline"), None)
    if base:
        for r in results:
            if r is not base:
                print(f"{r['name']}: slowest user {max(base['times']) / max(r['times']):.1f}× faster than the "
                      "baseline")
    for r in results:
        print(f"{r['name']}: after close (s, kernels, of them the visitors'): {r['trace']}")
        if r.get("late"):
            shown = ", ".join("never (60 s)" if t is None else f"{t:.1f} s" for t in r["late"])
            print(f"{r['name']}: later visitors, {2 * args.cull_after + 10} s apart, plan table after: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
