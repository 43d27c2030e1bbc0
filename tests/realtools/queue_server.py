"""An OpenAI-compatible serving replica with real queueing (stdlib asyncio only), so capplan can
be proven against a server it did not write whose true capacity is known (queue_truth.py).

It models a continuous-batching engine (params.EngineParams):

* ``slots`` sequence slots, taken at prefill start and given back at the last token; requests
  wait FIFO for a slot;
* one prefill lane: ``prefill_base_ms + prefill_ms_per_token * prompt_tokens``; the first token
  is emitted at the end of the prefill, then the sequence decodes (``--prefill-lane chunked``:
  no lane, the prompts are computed inside the decode iterations, :class:`ChunkedEngine`);
* a decode lane beside it: iterations of ``decode_base_ms + decode_ms_per_seq * batch`` back to
  back, each emitting one token to every sequence of the batch it started with (a sequence whose
  prefill ended at or before the iteration's start is in it);
* exactly ``max_tokens`` / ``max_completion_tokens`` output tokens (ignore_eos; default 32);
  prompt tokens counted by a fixed rule (``--token-rule words|chars4``, params.count_prompt_tokens,
  or ``--fixed-prompt-tokens N``) and returned in ``usage``.

Timing does not drift with CPU jitter: the engine runs on an absolute virtual clock (each
iteration ends at previous end + step, the prefill lane at max(arrival, lane free, slot free) +
prefill) and only the token *writes* sleep until those monotonic deadlines; a late wake-up
delays one write, never the schedule. Admission uses the real arrival stamp (monotonic, taken
when the request body has been read). A client that disconnects mid-stream is dropped from the
batch at the next iteration (its slot freed there), like a real engine's abort.

    python -m tests.realtools.queue_server --port 18800 --slots 32 --log-jsonl /tmp/qs/log.jsonl

or in-process: ``url, stop = start_in_thread(EngineParams(slots=8))`` ... ``stop()``; or
``url, proc = start_subprocess(...)`` ... ``stop_subprocess(proc)``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from tests.realtools.http import answer_get
from tests.realtools.http import read_request as _read_request
from tests.realtools.http import send_json as _send_json
from tests.realtools.params import EngineParams, count_prompt_tokens

MODEL = "mock-llm"


@dataclass(eq=False)
class _Seq:
    """One request inside the engine; times are loop.time() seconds (monotonic)."""

    rid: str
    arrival: float
    prompt_tokens: int
    n_out: int
    remaining: int = 0                       # decode tokens still to emit
    prefill_start: float = 0.0
    prefill_end: float = 0.0
    last_token: float | None = None
    cancelled: bool = False
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: asyncio.Queue = field(default_factory=asyncio.Queue)   # virtual times of decode tokens


class Engine:
    """The two lanes. The prefill lane is a scheduler that decides each prefill's virtual start
    as soon as it can (so the decode lane always knows who joins an iteration before it starts);
    the decode lane sleeps to each iteration's absolute virtual end."""

    def __init__(self, params: EngineParams):
        self.p = params
        self.queue: asyncio.Queue[_Seq] = asyncio.Queue()
        self.pending: deque[_Seq] = deque()       # prefill decided, not yet in a decode batch
        self.pending_evt = asyncio.Event()
        self.releases: list[float] = []          # virtual slot-release times, in time order
        self.release_evt = asyncio.Event()
        self.admitted = 0
        self.lane_free = -1e18
        self.tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._prefill_lane()),
                      asyncio.ensure_future(self._decode_lane())]

    def submit(self, seq: _Seq) -> None:
        self.queue.put_nowait(seq)

    def _release(self, t: float) -> None:
        bisect.insort(self.releases, t)
        self.release_evt.set()

    async def _prefill_lane(self) -> None:
        # FIFO + one lane: the m-th admitted request gets the slot given back by the
        # (m - slots)-th release (0-based), so its start is max(arrival, lane free, that release).
        while True:
            s = await self.queue.get()
            start = max(s.arrival, self.lane_free)
            j = self.admitted - self.p.slots
            if j >= 0:
                while len(self.releases) <= j:
                    self.release_evt.clear()
                    await self.release_evt.wait()
                start = max(start, self.releases[j])
            s.prefill_start = start
            s.prefill_end = start + self.p.prefill_ms(s.prompt_tokens) / 1e3
            self.lane_free = s.prefill_end
            self.admitted += 1
            s.remaining = s.n_out - 1
            if s.remaining == 0:
                s.last_token = s.prefill_end
                self._release(s.prefill_end)
            else:
                self.pending.append(s)
                self.pending_evt.set()
            s.admitted.set()

    async def _decode_lane(self) -> None:
        loop = asyncio.get_running_loop()
        batch: list[_Seq] = []
        t = -1e18                                 # virtual start of the next iteration
        while True:
            if not batch:
                while not self.pending:
                    self.pending_evt.clear()
                    await self.pending_evt.wait()
                t = max(t, self.pending[0].prefill_end)
            while self.pending and self.pending[0].prefill_end <= t:
                batch.append(self.pending.popleft())
            if not batch:
                continue
            keep = []
            for s in batch:                       # aborted by the client: slot back now
                if s.cancelled:
                    s.last_token = t
                    self._release(t)
                else:
                    keep.append(s)
            batch = keep
            if not batch:
                continue
            end = t + self.p.decode_step_ms(len(batch)) / 1e3
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            keep = []
            for s in batch:
                s.remaining -= 1
                s.tokens.put_nowait(end)
                if s.remaining == 0:
                    s.last_token = end
                    self._release(end)
                else:
                    keep.append(s)
            batch = keep
            t = end


class ChunkedEngine:
    """``prefill_lane="chunked"``: no prefill lane. Iterations run back to back on the virtual
    clock while anything runs; at an iteration's start the waiting requests whose arrival stamp
    is not later take free slots (FIFO) and their prompts are computed inside it, which then
    lasts ``decode_step_ms(decoding + new) + chunk_ms(their prompt tokens)``; their first token
    comes at its end and they decode from the next one."""

    def __init__(self, params: EngineParams):
        self.p = params
        self.queue: asyncio.Queue[_Seq] = asyncio.Queue()
        self.tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self._run())]

    def submit(self, seq: _Seq) -> None:
        self.queue.put_nowait(seq)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        arrived: deque[_Seq] = deque()
        batch: list[_Seq] = []
        free = self.p.slots
        t = -1e18                                  # virtual start of the next iteration
        while True:
            while not self.queue.empty():
                arrived.append(self.queue.get_nowait())
            if not batch and not arrived:
                arrived.append(await self.queue.get())
                continue
            if not batch:
                t = max(t, arrived[0].arrival)     # idle until the first waiting arrival
            keep = []
            for s in batch:                        # aborted by the client: slot back now
                if s.cancelled:
                    s.last_token = t
                    free += 1
                else:
                    keep.append(s)
            batch = keep
            new = []
            while arrived and arrived[0].arrival <= t and free > 0:
                s = arrived.popleft()
                free -= 1
                new.append(s)
            if not batch and not new:
                continue
            dur_ms = self.p.decode_step_ms(len(batch) + len(new))
            if new:
                dur_ms += self.p.chunk_ms(sum(s.prompt_tokens for s in new))
            end = t + dur_ms / 1e3
            for s in new:
                s.prefill_start, s.prefill_end = t, end
                s.remaining = s.n_out - 1
                s.admitted.set()
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            keep = []
            for s in batch:
                s.remaining -= 1
                s.tokens.put_nowait(end)
                if s.remaining == 0:
                    s.last_token = end
                    free += 1
                else:
                    keep.append(s)
            for s in new:
                if s.remaining == 0:
                    s.last_token = end
                    free += 1
                else:
                    keep.append(s)
            batch = keep
            t = end


class Server:
    """HTTP front end (the request parsing of tests/fixtures/mock_server.py) over an Engine."""

    def __init__(self, params: EngineParams, *, model: str = MODEL, token_rule: str = "words",
                 fixed_prompt_tokens: int | None = None, log_jsonl: str | None = None):
        self.p = params
        self.model = model
        self.token_rule = token_rule
        self.fixed_prompt_tokens = fixed_prompt_tokens
        self.engine = Engine(params) if params.prefill_lane == "single" else ChunkedEngine(params)
        self.counter = itertools.count(1)
        self.log = open(log_jsonl, "a", buffering=1) if log_jsonl else None
        self.t0_mono = time.monotonic()
        self.t0_unix = time.time()

    def _prompt_tokens(self, req: dict, chat: bool) -> int:
        if self.fixed_prompt_tokens:
            return self.fixed_prompt_tokens
        if chat:
            parts = []
            for m in req.get("messages") or []:
                c = m.get("content", "")
                if isinstance(c, list):           # [{"type": "text", "text": ...}, ...]
                    c = " ".join(x.get("text", "") for x in c if isinstance(x, dict))
                parts.append(str(c))
            text = "\n".join(parts)
        else:
            pr = req.get("prompt", "")
            text = " ".join(map(str, pr)) if isinstance(pr, list) else str(pr)
        return count_prompt_tokens(text, self.token_rule)

    def _write_log(self, s: _Seq, status: str, first_written: float | None,
                   last_written: float | None) -> None:
        if not self.log:
            return
        rel = lambda x: None if x is None else round(x - self.t0_mono, 6)  # noqa: E731
        self.log.write(json.dumps({
            "rid": s.rid, "status": status, "prompt_tokens": s.prompt_tokens,
            "output_tokens": s.n_out, "arrival_s": rel(s.arrival),
            "arrival_unix_s": round(self.t0_unix + (s.arrival - self.t0_mono), 6),
            "prefill_start_s": rel(s.prefill_start), "prefill_end_s": rel(s.prefill_end),
            "first_token_s": rel(s.prefill_end), "last_token_s": rel(s.last_token),
            "first_written_s": rel(first_written), "last_written_s": rel(last_written)}) + "\n")

    async def handle(self, reader, writer) -> None:
        seq = None
        try:
            method, path, _h, body = await _read_request(reader)
            arrival = time.monotonic()
            if method == "GET":
                await answer_get(writer, path, self.model, "capplan-tests")
                return
            if path not in ("/v1/chat/completions", "/v1/completions"):
                _send_json(writer, "404 Not Found", {"error": {"message": f"no route {path}"}})
                await writer.drain()
                return
            req = json.loads(body or b"{}")
            chat = "chat" in path
            n_out = int(req.get("max_completion_tokens") or req.get("max_tokens")
                        or self.p.default_max_tokens)
            if n_out < 1:
                _send_json(writer, "400 Bad Request", {"error": {"message": "max_tokens must be >= 1"}})
                await writer.drain()
                return
            seq = _Seq(f"cmpl-{next(self.counter)}", arrival, self._prompt_tokens(req, chat), n_out)
            self.engine.submit(seq)
            await self._respond(writer, seq, req, chat)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def _respond(self, writer, s: _Seq, req: dict, chat: bool) -> None:
        loop = asyncio.get_running_loop()
        created = int(time.time())
        stream = bool(req.get("stream"))
        usage = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.n_out,
                 "total_tokens": s.prompt_tokens + s.n_out}
        obj = "chat.completion.chunk" if chat else "text_completion"
        await s.admitted.wait()
        delay = s.prefill_end - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        first_written = last_written = None
        try:
            if stream:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n")
            for i in range(s.n_out):
                if i:
                    await s.tokens.get()
                if stream:
                    last = i == s.n_out - 1
                    choice = ({"index": 0, "delta": ({"role": "assistant", "content": " tok"} if i == 0
                                                     else {"content": " tok"}),
                               "finish_reason": "length" if last else None} if chat else
                              {"index": 0, "text": " tok", "finish_reason": "length" if last else None})
                    chunk = {"id": s.rid, "object": obj, "created": created, "model": self.model,
                             "choices": [choice]}
                    writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    await writer.drain()
                last_written = time.monotonic()
                if i == 0:
                    first_written = last_written
            if stream:
                tail = b""
                so = req.get("stream_options") or {}
                # usage always sent (AIPerf and GuideLLM read it); as its own chunk, as vLLM
                # does with include_usage
                final = {"id": s.rid, "object": obj, "created": created, "model": self.model,
                         "choices": [], "usage": usage}
                if so.get("include_usage") is False:
                    final = None
                if final:
                    tail += b"data: " + json.dumps(final).encode() + b"\n\n"
                writer.write(tail + b"data: [DONE]\n\n")
                await writer.drain()
            else:
                text = " tok" * s.n_out
                choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": "length"} if chat else
                          {"index": 0, "text": text, "finish_reason": "length"})
                _send_json(writer, "200 OK", {
                    "id": s.rid, "object": "chat.completion" if chat else "text_completion",
                    "created": created, "model": self.model, "choices": [choice], "usage": usage})
                await writer.drain()
            self._write_log(s, "ok", first_written, last_written)
        except (ConnectionError, RuntimeError):
            s.cancelled = True
            self._write_log(s, "cancelled", first_written, last_written)
            raise ConnectionError("client went away")


async def serve(params: EngineParams, host: str = "127.0.0.1", port: int = 0, *,
                ready=None, stop_evt: asyncio.Event | None = None, **server_kw) -> None:
    """Serve until ``stop_evt`` is set (forever without one). ``ready(port)`` is called once the
    socket accepts connections."""
    srv = Server(params, **server_kw)
    srv.engine.start()
    server = await asyncio.start_server(srv.handle, host, port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    if ready:
        ready(bound)
    async with server:
        if stop_evt is None:
            await server.serve_forever()
        else:
            await stop_evt.wait()
    for t in srv.engine.tasks:
        t.cancel()
    if srv.log:
        srv.log.close()


def start_in_thread(params: EngineParams = EngineParams(), *, host: str = "127.0.0.1",
                    port: int = 0, **server_kw):
    """Run the server on its own event loop in a daemon thread; returns (url, stop). The thread
    shares the GIL with the caller: a busy caller adds jitter to token writes (not to the
    schedule); use start_subprocess for load tests."""
    box: dict = {}
    started = threading.Event()

    def run():
        loop = asyncio.new_event_loop()
        box["loop"] = loop
        box["stop"] = asyncio.Event()

        def ready(p):
            box["port"] = p
            started.set()

        try:
            loop.run_until_complete(serve(params, host, port, ready=ready, stop_evt=box["stop"],
                                          **server_kw))
        finally:
            loop.close()

    th = threading.Thread(target=run, daemon=True, name="queue-server")
    th.start()
    if not started.wait(10):
        raise RuntimeError("queue server did not start")

    def stop():
        box["loop"].call_soon_threadsafe(box["stop"].set)
        th.join(10)

    return f"http://{host}:{box['port']}", stop


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_subprocess(params: EngineParams = EngineParams(), *, host: str = "127.0.0.1",
                     port: int | None = None, log_jsonl: str | None = None,
                     extra_args: tuple = (), timeout_s: float = 15.0):
    """Start ``python -m tests.realtools.queue_server`` and wait for its "ready" line (printed
    once the port accepts connections); returns (url, Popen). Stop it with stop_subprocess."""
    port = port or _free_port(host)
    args = [sys.executable, "-m", "tests.realtools.queue_server", "--host", host, "--port", str(port)]
    for k, v in params.to_dict().items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    if log_jsonl:
        args += ["--log-jsonl", log_jsonl]
    args += list(extra_args)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("ready"):
            return f"http://{host}:{port}", proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"queue server did not become ready (exit {proc.poll()})")


def stop_subprocess(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout:
        proc.stdout.close()


def main(argv=None) -> None:
    d = EngineParams()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18800)
    ap.add_argument("--model", default=MODEL)
    for k, v in d.to_dict().items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v)
    ap.add_argument("--token-rule", choices=("words", "chars4"), default="words",
                    help="how prompt tokens are counted from the prompt text")
    ap.add_argument("--fixed-prompt-tokens", type=int, default=None,
                    help="count every prompt as this many tokens (a capacity test that must not "
                         "depend on the client's tokenizer)")
    ap.add_argument("--log-jsonl", help="append one line per finished request: arrival, prefill "
                                        "start/end, first and last token (server monotonic s)")
    a = ap.parse_args(argv)
    params = EngineParams(**{k: getattr(a, k) for k in d.to_dict()})

    def ready(port):
        print(f"ready http://{a.host}:{port} {params}", flush=True)

    try:
        asyncio.run(serve(params, a.host, a.port, ready=ready, model=a.model, token_rule=a.token_rule,
                          fixed_prompt_tokens=a.fixed_prompt_tokens, log_jsonl=a.log_jsonl))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
