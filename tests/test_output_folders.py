"""Output folders under kills and two writers (issue 33): a second writer to the same
``--out`` waits for the first, or refuses in one line (exit 1); a run killed mid-build leaves
its build folder, which the next run removes and says so (one whose process may still run is
named with the command that removes it, never deleted); the swap is an atomic exchange, so the
output is never missing, and where two renames are used instead a kill between them is
repaired by the next run; a killed report leaves its kernels' connection files only in its
build folder. The kills are real SIGKILLs of a subprocess held at a chosen moment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from capplan import io as cio
from capplan import report as R
from capplan.study import open_study

ROOT = Path(__file__).resolve().parents[1]
GUIDELLM = str(ROOT / "tests" / "fixtures" / "guidellm")
#: the longest wait for a subprocess (each wait ends as soon as it can: a busy box only slows it)
WAIT_S = 180.0

#: Runs ``capplan ARGV…`` with one fault hook (FAULT): ``hold`` stops right after the build
#: folder is made (lock held) until the file GO exists; ``between`` stops between the two
#: renames of a swap without exchange; ``after_exchange`` stops right after the exchange.
#: Each writes the file MARK when it stops.
DRIVER = r'''
import os, sys, time
from pathlib import Path
import capplan.io as cio

fault, mark, go = os.environ["FAULT"], Path(os.environ["MARK"]), os.environ.get("GO")

def stop():
    mark.write_text(str(os.getpid()))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 600 and not (go and os.path.exists(go)):
        time.sleep(0.05)

if fault == "hold":
    real_follow = cio.follow_umask
    def follow(path):
        real_follow(path)
        if ".build-" in os.path.basename(path):
            stop()
    cio.follow_umask = follow
elif fault == "between":
    cio.exchange = lambda a, b: False
    real_replace = os.replace
    class _os:
        def __getattr__(self, name):
            return getattr(os, name)
        @staticmethod
        def replace(src, dst):
            if ".build-" in os.path.basename(src):
                stop()
            return real_replace(src, dst)
    cio.os = _os()
elif fault == "after_exchange":
    real_exchange = cio.exchange
    def exchange(a, b):
        done = real_exchange(a, b)
        stop()
        return done
    cio.exchange = exchange

from capplan.cli import main
sys.exit(main(sys.argv[1:]))
'''


def _start(tmp_path: Path, argv: list[str], fault: str = "none", *, go: Path | None = None,
           env: dict | None = None, log: Path | None = None) -> tuple[subprocess.Popen, Path]:
    """Start the driver; its stderr goes to ``log`` when given (read while it runs)."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER, encoding="utf-8")
    mark = tmp_path / f"mark-{fault}-{time.monotonic_ns()}"
    e = dict(os.environ, FAULT=fault, MARK=str(mark), PYTHONPATH=str(ROOT), **(env or {}))
    if go is not None:
        e["GO"] = str(go)
    proc = subprocess.Popen([sys.executable, str(driver), *argv], env=e, cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True,
                            stderr=open(log, "w") if log else subprocess.PIPE)
    return proc, mark


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = WAIT_S) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the writer ended (rc {proc.returncode}) before its hook: "
                                 f"{proc.stderr.read()}")
        assert time.monotonic() - t0 < timeout_s, "the writer never reached its hook"
        time.sleep(0.05)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def _hidden(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


def _import_argv(out: Path) -> list[str]:
    return ["import", "guidellm", GUIDELLM, "--out", str(out)]


def _run(tmp_path: Path, argv: list[str], **kw) -> subprocess.CompletedProcess:
    proc, _ = _start(tmp_path, argv, **kw)
    try:
        so, se = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, so, se)


def _dead_pid() -> int:
    """The pid of a process that has ended (reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ------------------------------------------------------------------------------ the pieces

def test_exchange_swaps_two_folders_in_one_step_here(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "new").write_text("n")
    (b / "old").write_text("o")
    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    assert cio.exchange(a, b) is True  # this filesystem (and libc) can: the swap is atomic here
    assert [p.name for p in b.iterdir()] == ["new"] and [p.name for p in a.iterdir()] == ["old"]


def test_stale_leftovers_removed_live_ones_named(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "index.html").write_text("kept")
    dead, live = _dead_pid(), os.getppid()
    stale_build = tmp_path / f".rep.build-{dead}-abcd1234"
    stale_old = tmp_path / f".rep.old-{dead}"
    live_build = tmp_path / f".rep.build-{live}-efgh5678"
    legacy = tmp_path / ".rep.x1y2z3w4"
    other = tmp_path / f".rep.v2.build-{dead}-abcd1234"  # another output's (rep.v2): not ours
    for p in (stale_build, stale_old, live_build, legacy, other):
        p.mkdir()
        (p / "f").write_text("x")
    said: list[str] = []
    cio.clean_leftovers(out, say=said.append)
    assert not stale_build.exists() and not stale_old.exists()
    assert live_build.exists() and legacy.exists() and other.exists()
    text = "\n".join(said)
    assert f"removed 2 leftover folder(s) of ended runs beside {out}" in text
    assert f"rm -rf {live_build}" in text and f"pid {live} is still running" in text
    assert f"rm -rf {legacy}" in text and "did not record its pid" in text
    assert (out / "index.html").read_text() == "kept"


def test_missing_output_restored_from_the_previous_copy(tmp_path):
    out = tmp_path / "rep"
    old = tmp_path / f".rep.old-{_dead_pid()}"
    old.mkdir()
    (old / "index.html").write_text("previous")
    said: list[str] = []
    cio.clean_leftovers(out, say=said.append)
    assert (out / "index.html").read_text() == "previous" and not old.exists()
    assert said and f"{out} was missing" in said[0] and "restored the previous output" in said[0]


def test_lock_file_is_removed_after_a_run(tmp_path):
    with cio.atomic_dir(tmp_path / "o", say=lambda _t: None) as tmp:
        assert cio.lock_path(tmp_path / "o").read_text() == str(os.getpid())
        (tmp / "f").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


# ------------------------------------------------------------------ real kills and two writers

def test_killed_import_leaves_its_build_folder_and_the_next_run_removes_it(tmp_path):
    out = tmp_path / "imp"
    proc, mark = _start(tmp_path, _import_argv(out), "hold")
    _wait_for(mark, proc)
    _kill(proc)
    left = _hidden(tmp_path, "imp")
    assert any(n.startswith(f".imp.build-{proc.pid}-") for n in left), left
    rerun = _run(tmp_path, _import_argv(out))
    assert rerun.returncode == 0, rerun.stderr
    assert f"removed 1 leftover folder(s) of ended runs beside {out}: .imp.build-{proc.pid}-" in rerun.stderr
    assert _hidden(tmp_path, "imp") == []  # no build folder and no lock file left
    assert len(open_study(out).runs_frame()) == 11


def test_second_writer_refuses_in_one_line_and_the_output_survives(tmp_path):
    out = tmp_path / "imp"
    assert _run(tmp_path, _import_argv(out)).returncode == 0
    before = (out / "study.yaml").read_text()
    go = tmp_path / "go"
    first, mark = _start(tmp_path, _import_argv(out), "hold", go=go)
    try:
        _wait_for(mark, first)
        second = _run(tmp_path, _import_argv(out), env={"CAPPLAN_LOCK_WAIT_S": "0.5"})
        assert second.returncode == 1
        lines = [ln for ln in second.stderr.splitlines() if ln.startswith(("ERROR", "Traceback"))]
        assert lines == [f"ERROR: another capplan (pid {first.pid}) is still writing {out} after 0.5 s"
                         " — wait for it to finish (or end it) and run again, or choose another "
                         "--out (CAPPLAN_LOCK_WAIT_S sets how long to wait)"], second.stderr
        assert f"another capplan (pid {first.pid}) is writing {out}; waiting" in second.stderr
        assert (out / "study.yaml").read_text() == before  # untouched while the first builds
    finally:
        go.write_text("")
        first.communicate(timeout=WAIT_S)
    assert first.returncode == 0
    assert len(open_study(out).runs_frame()) == 11 and _hidden(tmp_path, "imp") == []


def test_second_writer_waits_for_the_first_then_writes(tmp_path):
    out = tmp_path / "imp"
    go = tmp_path / "go"
    first, mark = _start(tmp_path, _import_argv(out), "hold", go=go)
    try:
        _wait_for(mark, first)
        log = tmp_path / "second.log"
        second, _ = _start(tmp_path, _import_argv(out), env={"CAPPLAN_LOCK_WAIT_S": "600"},
                           log=log)
        t0 = time.monotonic()  # until the second says it waits on the lock
        while "waiting for it to finish" not in log.read_text():
            assert second.poll() is None and time.monotonic() - t0 < WAIT_S, log.read_text()
            time.sleep(0.1)
    finally:
        go.write_text("")
    first.communicate(timeout=WAIT_S)
    second.communicate(timeout=WAIT_S)
    se = log.read_text()
    assert first.returncode == 0 and second.returncode == 0, se
    assert f"another capplan (pid {first.pid}) is writing {out}; waiting for it to finish" in se
    assert f"{out} is free; writing it now" in se
    assert "Traceback" not in se
    assert len(open_study(out).runs_frame()) == 11 and _hidden(tmp_path, "imp") == []


@pytest.mark.parametrize("command", ["report", "plan", "import"])
def test_each_writer_refuses_a_held_folder_in_one_line(tmp_path, command):
    """report, plan and import all write through the locked swap: with the lock held (here by
    the test itself), each refuses in one line, exit 1, and leaves the folder as it was —
    report before any kernel starts."""
    out = tmp_path / "out"
    argv = {"report": ["report", str(R.demo_study_path()), "--out", str(out), "--reps", "10"],
            "plan": ["plan", "--spec", str(ROOT / "templates" / "plan.yaml"), "--capacity-rps", "5",
                     "--out", str(out)],
            "import": _import_argv(out)}[command]
    with cio.output_lock(out, say=lambda _t: None):
        done = _run(tmp_path, argv, env={"CAPPLAN_LOCK_WAIT_S": "0"})
    assert done.returncode == 1, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith(("ERROR", "Traceback"))]
    assert errors == [f"ERROR: another capplan (pid {os.getpid()}) is still writing {out} after 0 s"
                      " — wait for it to finish (or end it) and run again, or choose another "
                      "--out (CAPPLAN_LOCK_WAIT_S sets how long to wait)"], done.stderr
    assert "running" not in done.stderr  # no notebook started
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("out", ".out"))) == []


def test_kill_between_the_two_renames_is_repaired_by_the_next_run(tmp_path):
    """Where the platform has no exchange (forced here), the swap is two renames; a kill
    between them leaves no output folder, only the previous copy, which the next run restores
    before it writes."""
    out = tmp_path / "imp"
    assert _run(tmp_path, _import_argv(out)).returncode == 0
    proc, mark = _start(tmp_path, _import_argv(out), "between")
    _wait_for(mark, proc)
    _kill(proc)
    assert not out.exists() and (tmp_path / f".imp.old-{proc.pid}").is_dir()
    rerun = _run(tmp_path, _import_argv(out))
    assert rerun.returncode == 0, rerun.stderr
    assert (f"{out} was missing (a run, pid {proc.pid}, was killed while swapping it); restored "
            f"the previous output from .imp.old-{proc.pid}") in rerun.stderr
    assert f"removed 1 leftover folder(s) of ended runs beside {out}: .imp.build-{proc.pid}-" in rerun.stderr
    assert len(open_study(out).runs_frame()) == 11 and _hidden(tmp_path, "imp") == []


def test_kill_right_after_the_exchange_leaves_the_new_output(tmp_path):
    out = tmp_path / "imp"
    assert _run(tmp_path, _import_argv(out)).returncode == 0
    (out / "marker-of-the-old-one").write_text("old")
    proc, mark = _start(tmp_path, _import_argv(out), "after_exchange")
    _wait_for(mark, proc)
    _kill(proc)
    assert len(open_study(out).runs_frame()) == 11 and not (out / "marker-of-the-old-one").exists()
    (prev,) = [tmp_path / n for n in _hidden(tmp_path, "imp") if ".build-" in n]
    assert (prev / "marker-of-the-old-one").exists()  # the previous output, swapped out
    rerun = _run(tmp_path, _import_argv(out))
    assert rerun.returncode == 0 and f"removed 1 leftover folder(s)" in rerun.stderr
    assert _hidden(tmp_path, "imp") == []


def _sleeping_notebooks(folder: Path, marks: Path) -> Path:
    """A --notebooks folder whose first report notebook writes its kernel's pid under
    ``marks`` and sleeps; the others just run one trivial cell."""
    folder.mkdir()
    for i, (name, _) in enumerate(R.REPORT_NOTEBOOKS):
        nb = nbformat.read(str(R.notebooks_dir() / name), as_version=4)
        params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        body = "x = 1"
        if i == 0:
            body = (f"import os, time, pathlib\npathlib.Path({str(marks)!r}, str(os.getpid()))"
                    ".write_text('')\ntime.sleep(120)")
        nb.cells = [params, nbformat.v4.new_code_cell(body)]
        nbformat.write(nb, str(folder / name))
    return folder


def test_killed_report_leaves_kernel_files_only_in_its_build_folder(tmp_path):
    marks, tmpdir = tmp_path / "marks", tmp_path / "tmpdir"
    marks.mkdir()
    tmpdir.mkdir()
    nbs = _sleeping_notebooks(tmp_path / "nbs", marks)
    out = tmp_path / "rep"
    argv = ["report", str(R.demo_study_path()), "--out", str(out), "--notebooks", str(nbs),
            "--reps", "10", "--jobs", "1"]
    proc, _ = _start(tmp_path, argv, env={"TMPDIR": str(tmpdir)})
    kernels: list[int] = []
    try:
        t0 = time.monotonic()
        while not kernels:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() - t0 < WAIT_S, "the kernel never ran its cell"
            time.sleep(0.1)
            kernels = [int(p.name) for p in marks.iterdir()]
        (build,) = [tmp_path / n for n in _hidden(tmp_path, "rep")
                    if n.startswith(f".rep.build-{proc.pid}-")]
        conn = list((build / R.KERNEL_FILES_DIR).glob("kernel-*.json"))
        assert len(conn) == 1 and "shell_port" in json.loads(conn[0].read_text())
        _kill(proc)
        assert list(tmpdir.iterdir()) == []  # nothing in the temp folder
        t0 = time.monotonic()  # the kernel sees its parent gone (ipykernel polls each second)
        while any(_running(k) for k in kernels) and time.monotonic() - t0 < 60:
            time.sleep(0.2)
        assert not any(_running(k) for k in kernels)
    finally:
        for k in kernels:
            if _running(k):
                os.kill(k, signal.SIGKILL)
    # the next run to the same folder removes the build folder, kernel files and all (any
    # capplan writer does it; an import is the quickest, a report would take ~20 s more here)
    rerun = _run(tmp_path, _import_argv(out), env={"TMPDIR": str(tmpdir)})
    assert rerun.returncode == 0, rerun.stderr
    assert f"removed 1 leftover folder(s) of ended runs beside {out}: .rep.build-{proc.pid}-" in rerun.stderr
    assert _hidden(tmp_path, "rep") == []
    assert list(tmpdir.iterdir()) == []


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by its new parent) has ended
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
