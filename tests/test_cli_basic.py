"""`capplan validate` / `capplan summarize` end to end through capplan.cli.main."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from capplan.cli import main
from capplan.metrics import summarize
from capplan.study import open_study
from conftest import ev


@pytest.fixture
def sweep(make_study):
    rows = []
    for run, rate, ttft in (("r01", 2.0, 100.0), ("r02", 4.0, 3000.0)):
        for i in range(40):
            rows.append(ev(run, f"{run}-{i}", scheduled_ms=i * 1000 / rate, ttft_ms=ttft,
                           e2e_ms=ttft + 900, output_tokens=10))
    rows.append(ev("r02", "r02-x", scheduled_ms=10_000, ttft_ms=None, e2e_ms=None,
                   output_tokens=0, status="cancelled"))
    return make_study(rows, runs=[{"run_id": "r01", "offered_rps": 2.0, "warmup_s": 1},
                                  {"run_id": "r02", "offered_rps": 4.0, "warmup_s": 1}])


def test_summarize_prints_one_row_per_run(sweep, capsys):
    rc = main(["summarize", str(sweep), "--slo", "ttft_ms=2000,tpot_ms=100,attainment=0.99"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Study t: 2 runs" in out
    funnel = out.split("\n\n")[0].splitlines()
    assert funnel[2].split()[:2] == ["run_id", "offered_rps"]
    assert funnel[3].split()[:3] == ["r01", "2", "38"]  # 40 − 2 in the 1 s warm-up
    assert funnel[4].split()[:3] == ["r02", "4", "37"]  # 40 − 4, + the cancelled one
    assert "insufficient samples (N = 38, need 64)" in out
    slo_block = out[out.index("SLO: 0.99 of requests with TTFT ≤ 2000 ms, TPOT ≤ 100 ms"):]
    assert "r01" in slo_block and "yes" in slo_block and "NO" in slo_block


def test_summarize_out_csv_and_parquet_match_the_frame(sweep, tmp_path, capsys):
    expected = summarize(open_study(sweep), "ttft_ms=2000").to_frame()
    for name in ("s.csv", "s.parquet"):
        dest = tmp_path / "out" / name
        rc = main(["summarize", str(sweep), "--slo", "ttft_ms=2000", "--out", str(dest)])
        assert rc == 0
        assert f"wrote {dest}" in capsys.readouterr().out
        got = pd.read_csv(dest) if name.endswith(".csv") else pd.read_parquet(dest)
        assert list(got.columns) == list(expected.columns)
        assert list(got.run_id) == ["r01", "r02"]
        pd.testing.assert_series_equal(got["n_offered"], expected["n_offered"], check_dtype=False)
        pd.testing.assert_series_equal(got["attainment_offered"], expected["attainment_offered"],
                                       check_dtype=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s.csv", "s.parquet"]


def test_summarize_unknown_extension_writes_nothing(sweep, tmp_path, capsys):
    dest = tmp_path / "o" / "s.xlsx"
    rc = main(["summarize", str(sweep), "--out", str(dest)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "cannot write 's.xlsx': unknown extension '.xlsx'" in err
    assert "use a name ending in .csv or .parquet" in err
    assert not dest.exists() and not (tmp_path / "o").exists()


def test_summarize_bad_slo_and_missing_study(sweep, tmp_path, capsys):
    assert main(["summarize", str(sweep), "--slo", "ttft=2000"]) == 2
    assert "unknown SLO key(s): ttft" in capsys.readouterr().err
    assert main(["summarize", str(tmp_path / "none")]) == 2
    assert "study directory does not exist" in capsys.readouterr().err


def test_validate_ok(sweep, capsys):
    assert main(["validate", str(sweep)]) == 0
    assert capsys.readouterr().out.strip() == "OK: 2 runs, 81 events"


def test_module_entry_point(sweep):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "capplan", "validate", str(sweep / "study.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "OK: 2 runs" in p.stdout


def test_help_lists_every_command_without_importing_one():
    """`capplan --help` reads the command lines from ``cli.COMMANDS``: no command module, and
    none of pandas / DuckDB / pyarrow / numpy, is imported (start-up in the time of click)."""
    import subprocess
    import sys

    code = ("import sys; from capplan.cli import main; rc = main(['--help']); "
            "heavy = [m for m in sys.modules if m.startswith('capplan.commands.') or "
            "m.split('.')[0] in ('pandas', 'duckdb', 'pyarrow', 'numpy', 'plotly')]; "
            "print('HEAVY', heavy, rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120).stdout
    assert "HEAVY [] 0" in out
    from capplan.cli import COMMANDS, LazyGroup
    for name, (_, line) in COMMANDS.items():
        assert f"  {name} " in out and line in out
        # a loaded command shows the same line (``capplan CMD`` inside a group listing)
        cmd = LazyGroup._load(name)
        assert cmd is not None and cmd.get_short_help_str(limit=200) == line


def test_envelope_command_does_not_import_scipy_stats(sweep):
    """`capplan envelope` reads its quantiles from scipy.special: importing scipy.stats took
    0.35–0.6 s of the command's start (benchmarks/README.md, issue 29)."""
    import subprocess
    import sys

    code = ("import sys; from capplan.cli import main; "
            f"rc = main(['envelope', {str(sweep)!r}, '--slo', 'ttft_ms=2000,attainment=0.9', "
            "'--reps', '50']); print('STATS', 'scipy.stats' in sys.modules, rc)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "C_SLO" in p.stdout, p.stderr
    assert "STATS False" in p.stdout, p.stdout[-500:]


def test_the_reduction_path_leaves_pandas_and_scipy_to_the_preload():
    """What `capplan envelope` imports before it reduces a study (the command, the study, its
    checks, the reduction) loads neither pandas nor scipy: those 0.7 s of imports run on the
    ``Preload`` thread beside the reduction instead of before it (benchmarks/README.md,
    issue 29). A module-level ``import pandas`` on that path fails this."""
    import subprocess
    import sys

    code = ("import sys; import capplan.cli, capplan.commands.envelope, capplan.reduce, "
            "capplan.study, capplan.validate, capplan.slo; "
            "print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'scipy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_planning_a_reduction_leaves_pandas_to_the_preload():
    """Opening the study and planning its reduction (the manifest's warm-ups, the request
    view and its table of runs) import no pandas either: the command's main thread would
    otherwise wait for the ``Preload`` thread's import before it counts a request. (The
    fetch's Arrow-to-numpy conversion loads pandas inside pyarrow, by then in memory.)"""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; "
            "from capplan.commands.engine import Engine; from capplan.slo import SLO; "
            "from capplan import sketch; from capplan.reduce import engine as E; "
            "from capplan.reduce.plan import reduction_plan, resolve_window; "
            "st = Engine().open(Path('data/sample')); "
            "slo = SLO.parse('ttft_ms=2000,tpot_ms=100,attainment=0.99'); "
            "w, _, _ = resolve_window(st, 'manifest', 'ttft_ms'); "
            "plan = reduction_plan(st, slo, w, cells=None, alpha=sketch.DEFAULT_ALPHA, "
            "grid_step=E.GRID_STEP, grid_half=0); "
            "print('ROWS', st.sql(f'SELECT count(*) FROM {plan.view}').fetchall()[0][0]); "
            "print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'scipy'}))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=root)
    assert "HEAVY []" in out.stdout and "ROWS 0" not in out.stdout, out.stdout + out.stderr


def test_preload_hands_over_the_module_or_its_import_error():
    """``Preload`` (the envelope command imports the fit's modules on a thread while the
    study is reduced): ``.module`` is the imported module, and an import that failed raises
    its own error in the caller's thread, not a None."""
    from capplan.commands.engine import Preload

    assert Preload("json").module.dumps([1]) == "[1]"
    with pytest.raises(ModuleNotFoundError, match="capplan_no_such_module"):
        Preload("capplan_no_such_module").module


def test_the_command_tunes_malloc_only_when_the_user_does_not(monkeypatch):
    """The entry point's allocator tuning steps aside for a user's own MALLOC_* settings
    (and never fails off glibc), and for their own DUCKDB_JE_MALLOC_CONF."""
    import capplan.cli as cli

    import os

    for k in [k for k in os.environ if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"]:
        monkeypatch.delenv(k)
    called = []
    monkeypatch.setattr("ctypes.CDLL", lambda name: type("L", (), {
        "mallopt": staticmethod(lambda p, v: called.append((p, v)))})())
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    cli._keep_freed_memory()
    assert called == []
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    cli._keep_freed_memory()
    assert sorted(called) == [(-3, 32 << 20), (-2, 256 << 20), (-1, 1 << 30)]
    # DuckDB's jemalloc: its own variable, set for the DuckDB loaded later, never overridden
    monkeypatch.setenv("DUCKDB_JE_MALLOC_CONF", "")  # so that the undo restores this process's
    monkeypatch.delenv("DUCKDB_JE_MALLOC_CONF")      # own setting, whatever it was
    cli._keep_freed_memory()
    assert os.environ["DUCKDB_JE_MALLOC_CONF"] == "dirty_decay_ms:10000"
    monkeypatch.setenv("DUCKDB_JE_MALLOC_CONF", "narenas:1")
    cli._keep_freed_memory()
    assert os.environ["DUCKDB_JE_MALLOC_CONF"] == "narenas:1"
