"""`capplan whatif`: serve the what-if panel (notebooks/04-whatif.ipynb) as a Voila app.

The study and spec reach the notebook through environment variables (CAPPLAN_STUDY,
CAPPLAN_SPEC, CAPPLAN_SLO, CAPPLAN_REPS, CAPPLAN_SEED, CAPPLAN_CONFIDENCE) that its second
cell reads; the notebook is served from a temp copy whose kernelspec runs this interpreter.
Voila listens on 127.0.0.1 only.

For several people at once: the envelope is fitted here, once, and cached on disk
(CAPPLAN_CACHE_DIR), so each kernel loads it in about a second; ``--pool`` kernels are started
and run in advance (Voila's pre-heated pool), so the first visitors get a finished page; the
kernel of a closed or crashed tab is culled after ``--cull-after`` idle seconds (Voila's own
shutdown on page unload is refused by its XSRF check, so culling is what reclaims them), but
never in the first ``--cull-after`` seconds after it left the pool, while its visitor's page
connects (``capplan.whatif.kernels``); users see plain messages, never tracebacks.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from .. import report as R
from ..errors import SpecError
from ..notebook import READY_DIR_ENV

#: how long the pre-heated kernels may take to run the page before the URL is printed anyway
POOL_READY_TIMEOUT_S = 600.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for_pool(ready_dir: Path, pool: int, proc: subprocess.Popen, *,
                  timeout_s: float = POOL_READY_TIMEOUT_S, say=None) -> int:
    """Wait until ``pool`` pre-heated kernels have run the whole page (each leaves a mark in
    ``ready_dir``: ``notebook.app_ready``), so the first visitors get a finished page. Returns
    how many are ready: fewer only when ``timeout_s`` passed (said through ``say``)."""
    import time

    say = say or (lambda t: click.echo(t, err=True))
    deadline = time.monotonic() + timeout_s
    ready = 0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SpecError(f"Voila exited with code {proc.returncode} before the page was ready",
                            fix="see the lines above for its reason")
        ready = sum(1 for _ in ready_dir.glob("kernel-*"))
        if ready >= pool:
            return ready
        time.sleep(0.5)
    say(f"warning: only {ready} of {pool} pre-heated kernels had run the page after "
        f"{timeout_s:.0f} s (a busy machine?); the first visitors may wait for theirs")
    return ready


def wait_for_listening(port: int, proc: subprocess.Popen, *, timeout_s: float = 120.0) -> bool:
    """Wait until Voila accepts connections on 127.0.0.1:``port`` (no HTTP request: each would
    start a kernel), so the printed URL never meets a refused connection (``--pool 0``)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SpecError(f"Voila exited with code {proc.returncode} before it listened",
                            fix="see the lines above for its reason")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    click.echo(f"warning: Voila did not accept connections on port {port} within {timeout_s:.0f} s",
               err=True)
    return False


def voila_command(notebook: Path, port: int, token: str, *, pool: int = 4, cull_after_s: int = 30) -> list[str]:
    """Voila on 127.0.0.1: no tracebacks to users, a pre-heated kernel pool, idle kernels of
    closed tabs culled (connected ones are kept)."""
    from ..nbexec import VOILA_OPTIONS  # jupyter_client: imported when the app starts, not with the CLI

    cmd = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}",
           "--Voila.ip=127.0.0.1", f"--token={token}", "--VoilaConfiguration.show_tracebacks=False",
           f"--MappingKernelManager.cull_idle_timeout={int(cull_after_s)}",
           f"--MappingKernelManager.cull_interval={max(5, int(cull_after_s) // 3)}",
           "--MappingKernelManager.cull_connected=False",
           # culls closed tabs' kernels, never one just handed to a visitor (capplan.whatif.kernels)
           "--VoilaConfiguration.multi_kernel_manager_class=capplan.whatif.kernels.GraceKernelManager",
           # read kernel replies without lost wake-ups (capplan.nbexec)
           *VOILA_OPTIONS]
    if pool > 0:
        # refill the pool 20 s after a visitor takes a kernel, not 1 s: visitors arriving together
        # are served before new kernels compete with them for the CPU
        cmd += ["--preheat_kernel=True", f"--pool_size={int(pool)}", "--VoilaKernelManager.fill_delay=20"]
    return cmd


@click.command("whatif")
@click.argument("study", required=False, type=click.Path(path_type=str))
@click.option("--spec", type=click.Path(path_type=str), default=None,
              help="Plan spec YAML [default: the bundled templates/plan.yaml].")
@click.option("--port", type=int, default=8866, show_default=True,
              help="Port on 127.0.0.1 (0 or a busy port: pick a free one).")
@click.option("--slo", default=None,
              help="Starting SLO, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99 "
                   "[default: the spec's slo].")
@click.option("--reps", type=int, default=None,
              help="Bootstrap replicates of the one-off envelope fit [default: the spec's].")
@click.option("--seed", type=int, default=None, help="Bootstrap seed [default: the spec's].")
@click.option("--token", default=None, help="Access token [default: a random one, in the URL].")
@click.option("--pool", type=click.IntRange(0, 16), default=4, show_default=True,
              help="Kernels started and run in advance, so visitors get a finished page at once "
                   "(each holds the study in memory, ~0.4 GB).")
@click.option("--cull-after", "cull_after", type=click.IntRange(10, 86400), default=30, show_default=True,
              help="Seconds an unconnected kernel (a closed or crashed tab) may idle before it is shut down.")
@click.option("--scenarios", type=click.Path(path_type=str), default=None,
              help="Folder for saved scenarios [default: ./capplan-scenarios].")
def cmd(study, spec, port, slo, reps, seed, token, pool, cull_after, scenarios):
    """Serve the what-if panel for STUDY (default: the bundled demo study) on 127.0.0.1
    until Ctrl-C. Prints the URL to open."""
    if importlib.util.find_spec("voila") is None:
        raise SpecError("the what-if app needs Voila", fix='pip install -e ".[app]"')
    params, _ = R.resolve_params(study, spec, slo=slo, seed=seed, reps=reps)
    source = R.notebooks_dir() / R.WHATIF_NOTEBOOK
    if not source.is_file():
        raise SpecError("what-if notebook not found", file=str(source))
    kernel = R.ensure_kernel()
    if port == 0 or not _port_free(port):
        port = _free_port()
    token = token or secrets.token_hex(16)
    env = R.whatif_env(params.study)
    env.update({"CAPPLAN_SPEC": str(params.spec), "CAPPLAN_REPS": str(params.reps),
                "CAPPLAN_SEED": str(params.seed), "CAPPLAN_SLO": params.slo,
                "CAPPLAN_CONFIDENCE": str(params.confidence), "CAPPLAN_WHATIF_APP": "1",
                "CAPPLAN_SCENARIO_DIR": str(Path(scenarios or "capplan-scenarios").resolve())})
    for note in params.notes:
        click.echo(f"note: {note}", err=True)
    # fit once here and keep it on disk: every kernel (every visitor) then loads it in ~1 s
    from ..whatif import WhatIfModel, cache_dir

    env.setdefault("CAPPLAN_CACHE_DIR", str(cache_dir()))
    click.echo(f"preparing the study (cached in {env['CAPPLAN_CACHE_DIR']}) …", err=True)
    WhatIfModel.build(params.study, params.spec, params.slo, reps=params.reps, seed=params.seed,
                      confidence=params.confidence, cache=Path(env["CAPPLAN_CACHE_DIR"]))
    tmp = Path(tempfile.mkdtemp(prefix="capplan-whatif-"))
    ready_dir = tmp / "ready"
    ready_dir.mkdir()
    env[READY_DIR_ENV] = str(ready_dir)
    try:
        nb = json.loads(source.read_text(encoding="utf-8"))
        nb.setdefault("metadata", {})["kernelspec"] = {
            "name": kernel, "display_name": "Python (capplan)", "language": "python"}
        served = tmp / "whatif.ipynb"
        served.write_text(json.dumps(nb), encoding="utf-8")
        url = f"http://127.0.0.1:{port}/?token={token}"
        proc = subprocess.Popen(voila_command(served, port, token, pool=pool, cull_after_s=cull_after),
                                env=env, cwd=tmp)

        def _stop(signum, frame):  # SIGTERM: stop Voila and clean up like Ctrl-C
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _stop)
        try:
            if pool > 0:
                click.echo(f"running the page in {pool} pre-heated kernel(s) …", err=True)
                wait_for_pool(ready_dir, pool, proc)
            wait_for_listening(port, proc)
            # printed once the first visitors get a finished page at once
            click.echo(f"what-if panel for {params.study}: {url}  (Ctrl-C stops it)")
            sys.stdout.flush()
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
