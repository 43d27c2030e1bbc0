"""The kernel manager behind `capplan whatif`: culls the kernels of closed tabs, never a kernel
whose visitor's page has not connected yet.

Voila keeps pre-heated kernels out of the culler's reach only while they wait in its pool. A
kernel handed to a visitor is then, to jupyter_server's culler, unconnected (the page is still
loading, or Voila is still running the notebook's last cells for it) and idle since its last
message — so the next cull pass shut it down under the visitor. Measured with `--pool 1` on a
busy box: the third of three visits 70 s apart, and a visit while the pooled kernel was still
loading the study, got a page stuck on "Loading widget..." or "An exception occurred at the
server". Here a kernel that has never had a page connected is kept for ``GRACE_S`` after it
left the pool; once a page has connected the usual rule applies (idle and unconnected for the
timeout: a closed or crashed tab).
"""

from __future__ import annotations

import time

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

#: how long a kernel handed to a visitor may wait for its page to connect before it counts as
#: abandoned (a browser that crashed while the page loaded)
GRACE_S = 300.0


class GraceKernelManager(AsyncMappingKernelManager):
    """``AsyncMappingKernelManager`` whose culler leaves a kernel alone until a page has
    connected to it, for up to ``GRACE_S`` from the first cull pass that sees it (Voila's pool
    answers for pooled kernels before this class is asked, so that is when it left the pool)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._first_seen: dict[str, float] = {}
        self._connected: set[str] = set()

    def notify_connect(self, kernel_id):
        self._connected.add(kernel_id)
        return super().notify_connect(kernel_id)

    async def cull_kernel_if_idle(self, kernel_id):
        now = time.monotonic()
        first = self._first_seen.setdefault(kernel_id, now)
        kernel = self._kernels.get(kernel_id)
        if (kernel_id not in self._connected and now - first <= max(GRACE_S, self.cull_idle_timeout)
                and getattr(kernel, "execution_state", None) != "dead"):
            return  # its visitor's page has not connected yet
        return await super().cull_kernel_if_idle(kernel_id)

    async def shutdown_kernel(self, kernel_id, *args, **kwargs):
        self._first_seen.pop(kernel_id, None)
        self._connected.discard(kernel_id)
        return await super().shutdown_kernel(kernel_id, *args, **kwargs)
