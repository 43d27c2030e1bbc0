"""The what-if app's culler (capplan.whatif.kernels): a kernel handed to a visitor is never
culled before its page connects (for up to GRACE_S); after a page has connected, the usual
rule applies (a closed or crashed tab is culled)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("jupyter_server")

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager  # noqa: E402

from capplan.whatif import kernels as K  # noqa: E402


class FakeKernel:
    execution_state = "idle"


def manager(monkeypatch, clock):
    culled = []

    async def base_cull(self, kernel_id):  # jupyter_server's rule: idle and unconnected
        if self._kernel_connections.get(kernel_id, 0) == 0:
            culled.append(kernel_id)

    monkeypatch.setattr(AsyncMappingKernelManager, "cull_kernel_if_idle", base_cull)
    monkeypatch.setattr(AsyncMappingKernelManager, "notify_connect",
                        lambda self, k: self._kernel_connections.__setitem__(k, self._kernel_connections.get(k, 0) + 1))
    monkeypatch.setattr(K.time, "monotonic", lambda: clock[0])
    m = K.GraceKernelManager(cull_idle_timeout=30)
    m._kernels["k"] = FakeKernel()
    m._kernel_connections["k"] = 0
    return m, culled


def test_a_kernel_whose_page_has_not_connected_is_kept(monkeypatch):
    clock = [1000.0]
    m, culled = manager(monkeypatch, clock)
    for t in (0, 10, 60, K.GRACE_S - 1):  # out of the pool, its page still loading
        clock[0] = 1000.0 + t
        asyncio.run(m.cull_kernel_if_idle("k"))
    assert culled == []
    clock[0] = 1000.0 + K.GRACE_S + 1  # abandoned before it connected (a crashed browser)
    asyncio.run(m.cull_kernel_if_idle("k"))
    assert culled == ["k"]


def test_a_closed_tab_is_culled_by_the_usual_rule(monkeypatch):
    clock = [1000.0]
    m, culled = manager(monkeypatch, clock)
    asyncio.run(m.cull_kernel_if_idle("k"))
    m.notify_connect("k")
    asyncio.run(m.cull_kernel_if_idle("k"))
    assert culled == []  # connected: kept
    m._kernel_connections["k"] = 0  # the tab closed
    clock[0] += 31
    asyncio.run(m.cull_kernel_if_idle("k"))
    assert culled == ["k"]


def test_a_dead_kernel_is_not_kept(monkeypatch):
    clock = [1000.0]
    m, culled = manager(monkeypatch, clock)
    m._kernels["k"].execution_state = "dead"
    asyncio.run(m.cull_kernel_if_idle("k"))
    assert culled == ["k"]


def test_the_app_uses_this_manager():
    from pathlib import Path

    from capplan.commands.whatif import voila_command

    cmd = voila_command(Path("w.ipynb"), 8866, "t", pool=2, cull_after_s=30)
    assert ("--VoilaConfiguration.multi_kernel_manager_class="
            "capplan.whatif.kernels.GraceKernelManager") in cmd
    assert "--MappingKernelManager.cull_idle_timeout=30" in cmd


class _Proc:
    def __init__(self, code=None):
        self.returncode = code

    def poll(self):
        return self.returncode


def test_the_url_waits_for_the_pool(tmp_path):
    """`capplan whatif` prints its URL once the pre-heated kernels have run the page (each
    leaves a mark through notebook.app_ready), says so when they are late, and stops if Voila
    died."""
    import os

    import pytest

    from capplan import notebook
    from capplan.commands.whatif import wait_for_pool
    from capplan.errors import SpecError

    said = []
    assert wait_for_pool(tmp_path, 2, _Proc(), timeout_s=0.6, say=said.append) == 0
    assert said and "only 0 of 2 pre-heated kernels" in said[0]
    os.environ[notebook.READY_DIR_ENV] = str(tmp_path)
    try:
        notebook.app_ready()  # this process plays one kernel
    finally:
        del os.environ[notebook.READY_DIR_ENV]
    (tmp_path / "kernel-1").touch()  # and another
    assert wait_for_pool(tmp_path, 2, _Proc(), timeout_s=5, say=said.append) == 2 and len(said) == 1
    with pytest.raises(SpecError, match="Voila exited with code 1"):
        wait_for_pool(tmp_path / "none", 1, _Proc(1), timeout_s=5)


def test_the_url_waits_for_a_listening_server():
    import socket

    import pytest

    from capplan.commands.whatif import wait_for_listening
    from capplan.errors import SpecError

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        assert wait_for_listening(srv.getsockname()[1], _Proc(), timeout_s=5)
    with pytest.raises(SpecError, match="Voila exited with code 3 before it listened"):
        wait_for_listening(1, _Proc(3), timeout_s=5)
