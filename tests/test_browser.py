"""Real browser (Playwright driving Debian's chromium): the report's index read as a planner
reads it (next quarter's dated GPUs and cost, the sensitivity band), and the what-if app —
`capplan whatif` serving notebook 4 with Voila on 127.0.0.1 — moved with the keyboard: the
peak-demand slider redraws the plan the library computes; an impossible TTFT limit hides the
plan and says in plain words what to change."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from capplan import report as R
from capplan.whatif import WhatIfModel, slider_range, whatif_state
from test_report import demo_report  # noqa: F401  (shared fixture)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
REPS = 20
PRESSES = 3
#: a browser wait returns as soon as its condition holds, so a long one costs nothing when
#: all is well; 30 s waits took 15 s on a box at load ≈ 9 (issue 33), so every wait is 120 s
WAIT_MS = 120_000

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_url(log_path, proc: subprocess.Popen, timeout_s: float = 400.0) -> None:
    """Wait until `capplan whatif` prints its URL: it does so only once its pre-heated kernels
    have run the page (no HTTP GET here: each one would start a kernel)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"capplan whatif exited with {proc.returncode}")
        if "what-if panel for" in log_path.read_text(errors="replace"):
            return
        time.sleep(0.3)
    raise TimeoutError(f"capplan whatif printed no URL after {timeout_s:.0f} s")


def _skip_without_chromium():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")


@pytest.fixture(scope="module")
def whatif_app(tmp_path_factory):
    """One app for the module's tests (each opens its own page, so gets its own kernel)."""
    _skip_without_chromium()
    tmp_path = tmp_path_factory.mktemp("whatif")
    port, token = _free_port(), "capplan-test"
    log = open(tmp_path / "whatif.log", "wb")
    env = dict(os.environ, CAPPLAN_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "capplan", "whatif", "--port", str(port), "--reps", str(REPS),
         "--seed", "0", "--token", token, "--pool", "2"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path, env=env)
    try:
        _wait_for_url(tmp_path / "whatif.log", proc)
        # the URL comes after the pool is ready: the pages below must not wait for a kernel
        yield f"http://127.0.0.1:{port}/?token={token}"
    except Exception:
        log.flush()
        print((tmp_path / "whatif.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        # the whole process group: capplan whatif, Voila and its kernel
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


def test_slider_moves_the_rendered_plan(whatif_app):
    from playwright.sync_api import sync_playwright

    # what the table must show after PRESSES steps of the peak slider, computed here
    model = WhatIfModel.build(R.demo_study_path(), reps=REPS, seed=0)
    start = model.defaults()
    _, _, step = slider_range(start.peak_rps, 0.1, 3.0)
    final = whatif_state(model, start.with_(peak_rps=start.peak_rps + PRESSES * step))
    shown = final.table.set_index("key")["shown"]
    want_peak, want_gpus = shown["peak_rps"], shown["total_gpus"]
    assert want_gpus != whatif_state(model, start).table.set_index("key")["shown"]["total_gpus"]

    cell = "document.querySelector('tr[data-key=\"{}\"] td.value')"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.set_default_timeout(WAIT_MS)
            page.goto(whatif_app, wait_until="commit", timeout=WAIT_MS)
            page.wait_for_selector('tr[data-key="total_gpus"] td.value', timeout=WAIT_MS)
            assert page.inner_text('tr[data-key="peak_rps"] td.value') == f"{start.peak_rps:g}"
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=WAIT_MS)
            # the peak-demand slider: the handle in the row labelled so
            row = page.locator(".widget-slider", has_text="peak demand")
            row.locator(".noUi-handle").focus()
            for _ in range(PRESSES):
                page.keyboard.press("ArrowRight")
            page.wait_for_function(
                f"([p, g]) => {cell.format('peak_rps')}?.innerText === p && "
                f"{cell.format('total_gpus')}?.innerText === g",
                arg=[want_peak, want_gpus], timeout=WAIT_MS)
            assert page.inner_text('tr[data-key="total_gpus"] td.value') == want_gpus
            # the chart redrew too: the waterfall's total bar label is the new group count
            total = shown["total_groups"]
            page.wait_for_function(
                "t => [...document.querySelectorAll('.js-plotly-plot .waterfalllayer text')]"
                ".some(e => e.textContent === t)", arg=total, timeout=WAIT_MS)
        finally:
            browser.close()


def test_impossible_ttft_hides_the_plan_and_names_the_fix(whatif_app):
    """The strictest TTFT limit no tested rate meets: the plan table and chart go away (no stale
    plan left on screen) and the message says, in plain words, which control to move."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(WAIT_MS)
            page.goto(whatif_app, wait_until="commit", timeout=WAIT_MS)
            page.wait_for_selector('tr[data-key="total_gpus"] td.value', timeout=WAIT_MS)
            page.wait_for_selector(".capplan-plan-chart .js-plotly-plot", timeout=WAIT_MS)
            row = page.locator(".widget-slider", has_text="TTFT limit")
            row.locator(".noUi-handle").focus()
            for _ in range(12):  # to the slider's left end: 600 ms
                page.keyboard.press("ArrowLeft")
            page.wait_for_selector("#whatif-problem", timeout=WAIT_MS)
            msg = page.inner_text("#whatif-problem")
            assert "No plan at these settings" in msg
            assert "loosen the TTFT limit to 1,000 ms or more" in msg
            for cli_words in ("--capacity-rps", "capacity.use", "field:", "Traceback"):
                assert cli_words not in msg
            page.wait_for_function("() => !document.querySelector('#plan-table')", timeout=WAIT_MS)
            assert page.locator("#quarters-table").count() == 0
            # the plan's chart is off the page too (the fleet panel below keeps its own chart:
            # ready time and warm floor do not depend on the SLO)
            assert page.locator(".capplan-plan-chart").count() == 0
        finally:
            browser.close()


LOADS = 4


def test_every_load_shows_every_widget_and_each_chart_once(whatif_app):
    """Issue 28: the second panel showed "model not found" in 2 of 4 page loads (its own
    display reached the browser before its widgets did) and the replica-groups chart was drawn
    twice. Several loads, each by a fresh page (a fresh kernel): every widget renders, the plan's
    chart is on the page once, and the fleet panel's rows are there."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for _ in range(LOADS):
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                page.set_default_timeout(WAIT_MS)
                page.goto(whatif_app, wait_until="commit", timeout=WAIT_MS)
                page.wait_for_selector('tr[data-key="total_gpus"] td.value', timeout=WAIT_MS)
                page.wait_for_selector('tr[data-key="fleet-total_groups"]', timeout=WAIT_MS)
                page.wait_for_selector(".capplan-plan-chart .js-plotly-plot", timeout=WAIT_MS)
                text = page.inner_text("body")
                assert "model not found" not in text and "Error displaying widget" not in text
                assert page.locator(".js-plotly-plot").count() == 1  # no twin: no burst chart
                assert page.locator(".js-plotly-plot .waterfalllayer").count() == 1
                page.close()
        finally:
            browser.close()


def test_typing_1500_in_the_ttft_box_replans(whatif_app):
    """Typing 1500 in the TTFT box and pressing Enter re-plans at 1 500 ms: the C_SLO lower
    bound shown is the library's at that limit (it did nothing before: the slider's readout
    cannot be typed in)."""
    from playwright.sync_api import sync_playwright

    model = WhatIfModel.build(R.demo_study_path(), reps=REPS, seed=0)
    start = model.defaults()
    shown = whatif_state(model, start.with_(ttft_ms=1500.0)).table.set_index("key")["shown"]
    before = whatif_state(model, start).table.set_index("key")["shown"]["cslo_lower_bound"]
    want = shown["cslo_lower_bound"]
    assert want != before
    cell = "document.querySelector('tr[data-key=\"cslo_lower_bound\"] td.value')"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(WAIT_MS)
            page.goto(whatif_app, wait_until="commit", timeout=WAIT_MS)
            page.wait_for_selector('tr[data-key="cslo_lower_bound"] td.value', timeout=WAIT_MS)
            assert page.inner_text('tr[data-key="cslo_lower_bound"] td.value') == before
            box = page.locator(".capplan-typed-ttft input")
            box.fill("1500")
            box.press("Enter")
            page.wait_for_function(f"w => {cell}?.innerText === w", arg=want, timeout=WAIT_MS)
            assert "1,500" in page.locator(".widget-slider", has_text="TTFT limit").inner_text()
        finally:
            browser.close()


def test_index_shows_next_quarter_and_the_band(demo_report):  # noqa: F811
    """The index read in chromium: the answer names next quarter with its dates, the GPUs, the
    billed GPUs and the monthly cost, and the sensitivity band, as the plan export has them."""
    import json

    from playwright.sync_api import sync_playwright

    _skip_without_chromium()
    rec = json.loads((demo_report / "data" / "plan.json").read_text(encoding="utf-8"))
    q, sens = rec["quarters"][0], rec["sensitivity"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto((demo_report / "index.html").as_uri(), timeout=WAIT_MS)
            answer = page.inner_text("#answer-text")
            import datetime as dt

            start = dt.date.fromisoformat(q["start"])
            assert f"For {q['quarter']} ({start.day} {start:%b}" in answer
            assert f"{q['groups']} replica groups = {q['gpus']} GPUs" in answer
            assert f"{q['billed_gpus']} billed GPUs" in answer
            assert f"${q['cost_usd_per_month']:,.0f} per month" in answer
            row = page.locator(f'#quarters tr[data-quarter="{q["quarter"]}"]')
            assert row.locator('td[data-col="gpus"]').inner_text() == str(q["gpus"])
            band = page.inner_text("#sensitivity")
            assert f"from {sens['low_system']:.4g} to {sens['high_system']:.4g} req/s" in band
            assert page.is_visible("#honesty") and page.is_visible("#checks")
        finally:
            browser.close()
