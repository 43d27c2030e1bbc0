"""The replicate minimum and the confidence range are checked in one place (``slo.check_reps``,
``slo.check_confidence``), so every command refuses the same input in the same words."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("argv", [
    ["envelope", "data/sample", "--slo", "ttft_ms=2000", "--reps", "5"],
    ["twin", "fit", "data/sample", "--out", "{tmp}/t.yaml", "--reps", "5"],
    ["design", "data/sample", "--slo", "ttft_ms=2000", "--reps", "5"],
])
def test_every_command_refuses_too_few_replicates_in_the_same_words(argv, tmp_path, capsys):
    """One replicate minimum (``slo.MIN_REPS``) and one message, whichever command is asked."""
    from capplan.cli import main
    from capplan.slo import MIN_REPS

    root = Path(__file__).resolve().parents[1]
    argv = [a.replace("{tmp}", str(tmp_path)).replace("data/sample", str(root / "data" / "sample"))
            for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--reps must be ≥ {MIN_REPS}, got 5" in err and "Traceback" not in err
