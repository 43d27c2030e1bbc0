"""Running notebooks without lost replies: the kernel client behind ``capplan report``, the
notebook tests and the what-if app (Voila), and the watch that keeps a slow cell from being silent.

Why. jupyter_client's asyncio channels wait for a kernel's message by awaiting pyzmq's
``zmq.asyncio`` poll, which is woken by zmq's *edge-triggered* socket descriptor. On a busy box
that wake-up is sometimes missed: the kernel has sent its reply, the reply sits in the client's
socket, and the runner sleeps until the poll's own timer fires — the cell timeout (900 s) for a
cell's reply, never for the output stream — then carries on as if nothing had happened.
Reproduced on the 2-core box under four CPU-bound processes: two notebooks run in threads (as
``capplan report --jobs 2`` does) both sat idle beside idle kernels within two runs; with every
wait cut into one-second slices, a reply was found already waiting at the end of 9 of 43
slices that the plain wake-up should have ended (docs/report.md, "Lost wake-ups").

So every wait of :class:`SteadyChannel` is a series of polls of at most ``SLICE_S``; each slice
ends with pyzmq's level-triggered check (a zero-wait ``zmq_poll``), which finds a reply that is
already there. A missed wake-up then costs at most one slice; each one is counted
(:func:`rescued`) and logged on the ``capplan.nbexec`` logger.

:class:`CellWatch` is the second guard, for any other cause: a cell still running ``LATE_S``
after it started prints a line naming the notebook and the cell (and again every ``LATE_S``), and
a cell that times out fails the run with that name.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type

#: longest single wait on a kernel socket: what a missed wake-up can cost
SLICE_S = 1.0
#: a cell still running this long after it started is reported (and again every LATE_S)
LATE_S = 60.0

log = logging.getLogger("capplan.nbexec")
_lock = threading.Lock()
_rescued = 0


def rescued() -> int:
    """How many kernel messages this process found waiting at the end of a slice (wake-ups
    that zmq's edge-triggered descriptor did not deliver)."""
    return _rescued


def _count_rescue(waited_s: float) -> None:
    global _rescued
    with _lock:
        _rescued += 1
        n = _rescued
    log.info("a kernel message was waiting when its %.1f-s poll ended (a missed zmq wake-up; "
             "%d so far in this process)", waited_s, n)


class SteadyChannel(AsyncZMQSocketChannel):
    """A kernel channel whose waits are cut into ``SLICE_S`` polls (see the module docstring)."""

    slice_s: float = SLICE_S

    async def _poll(self, wait_s: float) -> bool:
        """One bounded wait; True when a message is ready."""
        assert self.socket is not None
        return bool(await self.socket.poll(int(wait_s * 1000)))

    async def get_msg(self, timeout: float | None = None) -> dict:  # type: ignore[override]
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            left = self.slice_s if deadline is None else max(0.0, deadline - time.monotonic())
            wait_s = min(self.slice_s, left)
            t0 = time.monotonic()
            if await self._poll(wait_s):
                if wait_s > 0 and time.monotonic() - t0 >= wait_s - 0.005:
                    _count_rescue(wait_s)
                return await self._recv()
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty


class SteadyKernelClient(AsyncKernelClient):
    """jupyter_client's asyncio kernel client with :class:`SteadyChannel` for every channel
    a notebook runner waits on."""

    shell_channel_class = Type(SteadyChannel)  # type: ignore[assignment]
    iopub_channel_class = Type(SteadyChannel)  # type: ignore[assignment]
    stdin_channel_class = Type(SteadyChannel)  # type: ignore[assignment]
    control_channel_class = Type(SteadyChannel)  # type: ignore[assignment]


class SteadyKernelManager(AsyncKernelManager):
    """The kernel manager papermill gets (``kernel_manager_class``): hands out
    :class:`SteadyKernelClient`."""

    client_class = DottedObjectName("capplan.nbexec.SteadyKernelClient", config=True)
    client_factory = Type(SteadyKernelClient, klass=AsyncKernelClient, config=True)
    #: where the kernel's connection file goes (None: jupyter_client's default, a temp file)
    connection_dir: str | None = None

    def write_connection_file(self, **kwargs) -> None:
        if self.connection_dir and not self.connection_file:
            self.connection_file = os.path.join(self.connection_dir, f"kernel-{uuid.uuid4()}.json")
        super().write_connection_file(**kwargs)


def kernel_manager_in(folder) -> type[SteadyKernelManager]:
    """A :class:`SteadyKernelManager` whose kernels write their connection files (ports and
    key) into ``folder``, not the temp folder: a run killed before it shut its kernels down
    leaves them there, and they go when that folder goes (the report's build folder)."""
    return type("SteadyKernelManagerIn", (SteadyKernelManager,), {"connection_dir": str(folder)})


#: Voila's options for the same client (its kernel managers come from jupyter_server; the
#: setting reaches them through traitlets' class hierarchy)
VOILA_OPTIONS = ("--KernelManager.client_class=capplan.nbexec.SteadyKernelClient",
                 "--KernelManager.client_factory=capplan.nbexec.SteadyKernelClient")


def _first_line(source: str) -> str:
    for line in (source or "").splitlines():
        if line.strip():
            return line.strip()[:80]
    return ""


@dataclass
class CellWatch:
    """nbclient's cell hooks for one notebook run: says when
    a cell is late, and remembers the running cell so a timeout can name it."""

    notebook: str
    late_s: float | None = None  # None: the module's LATE_S
    say: object = None  # callable(str); default: a line on stderr
    cell_index: int | None = None
    cell_source: str = ""
    started: float = 0.0
    _handle: object = field(default=None, repr=False)

    def _say(self, text: str) -> None:
        (self.say or (lambda t: print(t, file=sys.stderr, flush=True)))(text)

    def where(self) -> str:
        if self.cell_index is None:
            return "before its first cell"
        src = _first_line(self.cell_source)
        return f"cell {self.cell_index}" + (f" ({src})" if src else "")

    def on_cell_start(self, cell, cell_index, **_):
        self.on_cell_done()
        self.cell_index, self.cell_source, self.started = cell_index, cell.get("source", ""), time.monotonic()
        if cell.get("cell_type") == "code" and self.cell_source.strip():  # others are skipped
            self._arm()

    def _arm(self) -> None:
        try:
            late_s = LATE_S if self.late_s is None else self.late_s
            self._handle = asyncio.get_running_loop().call_later(late_s, self._late)
        except RuntimeError:  # no running loop (a synchronous runner): no watch
            self._handle = None

    def _late(self) -> None:
        self._say(f"capplan: notebook {self.notebook}, {self.where()} still running after "
                  f"{time.monotonic() - self.started:.0f} s")
        self._arm()

    def on_cell_done(self, **_):
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def hooks(self) -> dict:
        """The keyword arguments for nbclient / papermill (nbclient's ``on_cell_complete`` fires
        when the request is sent; ``on_cell_executed`` when the reply is in)."""
        return {"on_cell_start": self.on_cell_start, "on_cell_executed": self.on_cell_done,
                "on_cell_error": self.on_cell_done}
