"""reproduce.md without a render: the rerun goes to a new folder (any ``--out`` replaced, the
provenance time added), from the folder the command ran in, and the outputs check names both
folders. The end-to-end run of reproduce.md on the demo report is in test_report_pages.py."""

from __future__ import annotations

import re
from pathlib import Path

from capplan.provenance import rerun_command, reproduce_md, write_bundle

TIME = "2026-01-01T00:00:00+00:00"
ENV = {"capplan": "0.1", "python": "3.11", "platform": "Linux", "git": {}, "cwd": "/home/u"}


def test_rerun_command_replaces_out_and_adds_time():
    assert rerun_command(["capplan", "report", "s", "--out", "old", "--seed", "0"], "/n", TIME) == [
        "capplan", "report", "s", "--seed", "0", "--time", TIME, "--out", "/n"]
    assert rerun_command(["capplan", "report", "--out=old", "--time", "T0"], "/n", TIME) == [
        "capplan", "report", "--time", "T0", "--out", "/n"]
    assert rerun_command(["capplan", "report", "--time=T0"], "/n", TIME) == [
        "capplan", "report", "--time=T0", "--out", "/n"]


def _blocks(text: str) -> list[str]:
    return re.findall(r"```\n\s*(.+?)\n\s*```", text)


def test_reproduce_md_steps_name_a_new_folder_and_both_checks():
    text = reproduce_md(study=Path("/s"), study_hash="h", spec=Path("/p.yaml"),
                        command=["capplan", "report", "s", "--out", "rep"], time=TIME, env=ENV,
                        report_dir=Path("/home/u/rep"))
    assert _blocks(text) == [
        "cd /home/u/rep && sha256sum -c provenance/inputs.sha256",
        f"cd /home/u && capplan report s --time {TIME} --out /home/u/rep-reproduced",
        "cd /home/u/rep-reproduced && sha256sum -c /home/u/rep/provenance/outputs.sha256"]
    assert "provenance/run.sha256" in text


def test_write_bundle_splits_reproducible_files_from_the_run_s(tmp_path):
    out = tmp_path / "rep"
    for rel in ("index.html", "02-envelope.html", "notebooks/02-envelope.ipynb", "data/plan.json",
                "report.json"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(rel, encoding="utf-8")
    spec = tmp_path / "plan.yaml"
    spec.write_text("x: 1\n", encoding="utf-8")
    write_bundle(out, inputs=[spec], command=["capplan", "report"], study=tmp_path, study_hash="h",
                 spec=spec, time=TIME, pages=("02-envelope.html",))

    def listed(name):
        return [line.split("  ", 1)[1] for line in
                (out / "provenance" / name).read_text(encoding="utf-8").splitlines()]

    assert listed("outputs.sha256") == ["data/plan.json", "index.html", "provenance/inputs.sha256"]
    assert listed("run.sha256") == ["02-envelope.html", "notebooks/02-envelope.ipynb",
                                    "provenance/environment.json", "report.json", "reproduce.md"]
