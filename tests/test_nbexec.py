"""The notebook runner never waits silently: a kernel reply whose zmq wake-up is lost is found
by the next one-second re-check (not after the 900-s cell timeout), a slow cell is reported by
name, and a kernel that never answers fails the run with the notebook and cell named."""

from __future__ import annotations

import asyncio
import time

import nbformat
import pytest

from capplan import nbexec
from capplan import report as R
from capplan.errors import CapplanError



def _notebook(tmp_path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, path)
    return path


def test_lost_wakeups_cost_a_slice_not_the_cell_timeout(tmp_path, monkeypatch):
    """Every wake-up lost (the poll only ever ends by its own timer): the notebook still runs in
    about a second per message wait, and each reply found late is counted."""

    async def deaf_poll(self, wait_s):
        await asyncio.sleep(wait_s)  # never woken by zmq: only the timer ends the wait
        return bool(await self.socket.poll(0))

    monkeypatch.setattr(nbexec.SteadyChannel, "_poll", deaf_poll)
    before = nbexec.rescued()
    t0 = time.monotonic()
    nb = R.execute_notebook(_notebook(tmp_path, "x = 6 * 7", "print(x)"), {}, cwd=tmp_path,
                            cell_timeout_s=120)
    took_s = time.monotonic() - t0
    assert nb.cells[1].outputs[0]["text"] == "42\n"
    assert took_s < 60  # the plain client would wait the 120-s cell timeout for each reply
    assert nbexec.rescued() > before  # the replies were found by the re-check, and counted


def test_a_late_cell_is_reported_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(nbexec, "LATE_S", 1.0)
    said: list[str] = []
    R.execute_notebook(_notebook(tmp_path, "import time\ntime.sleep(2.5)"), {}, cwd=tmp_path,
                       say=said.append)
    assert said and all("notebook probe.ipynb, cell 0 (import time) still running after" in s
                        for s in said)


def test_a_kernel_that_never_answers_fails_with_its_cell_named(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(CapplanError) as err:
        R.execute_notebook(_notebook(tmp_path, "y = 1", "import time\ntime.sleep(3600)", "z = 2"),
                           {}, cwd=tmp_path, cell_timeout_s=3)
    assert time.monotonic() - t0 < 90  # the stated limit plus kernel start-up on a busy box
    msg = str(err.value)
    assert "notebook probe.ipynb timed out at cell 1 (import time)" in msg
    assert err.value.cell_index == 1


def test_steady_client_is_what_papermill_and_voila_get():
    km = nbexec.SteadyKernelManager()
    kc = km.client()
    assert isinstance(kc, nbexec.SteadyKernelClient)
    assert kc.shell_channel_class is nbexec.SteadyChannel
    assert kc.iopub_channel_class is nbexec.SteadyChannel
    from capplan.commands.whatif import voila_command

    cmd = voila_command(R.notebooks_dir() / R.WHATIF_NOTEBOOK, 8866, "t")
    assert set(nbexec.VOILA_OPTIONS) <= set(cmd)
