"""One ``--out`` check (``io.check_out``): every command that replaces a folder whole refuses a
file or a folder of other files, in the same words, with exit 2 and nothing touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from capplan.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "data" / "sample")
SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"

COMMANDS = {
    "plan": ["plan", DEMO, "--spec", str(ROOT / "templates" / "plan.yaml"), "--out", "{out}"],
    "timeline": ["timeline", DEMO, "--slo", SLO, "--out", "{out}"],
    "cache": ["cache", DEMO, "--slo", SLO, "--out", "{out}"],
    "report": ["report", DEMO, "--out", "{out}"],
    "import": ["import", "auto", str(next((ROOT / "tests" / "fixtures" / "guidellm").glob("*.json"))), "--out", "{out}"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_folder_of_other_files_is_refused_in_the_same_words(name, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("do not lose me")
    argv = [a.replace("{out}", str(out)) for a in COMMANDS[name]]
    assert main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err
    assert "holds other files" in err and "refusing to replace it" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    if name in ("timeline", "cache", "import"):  # refused before the work, not after it
        assert "Run r01" not in cap.out and "C_SLO" not in cap.out
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no lock or build folder left


def test_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("keep")
    assert main(["cache", DEMO, "--slo", SLO, "--out", str(f)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and f.read_text() == "keep"
