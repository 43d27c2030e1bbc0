"""The spec kit (capplan.spec): YAML with line marks, value checks, "did you mean", and the
three documents that use it (plan spec, study manifest, synth config) pointing at the line."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
import math

import numpy as np
import pytest
import yaml

from capplan import spec as S
from capplan.cli import main
from capplan.errors import ProblemList, SpecError
from capplan.io import manifest_dict


def raises(fn, *args, **kw) -> SpecError:
    with pytest.raises(SpecError) as ei:
        fn(*args, **kw)
    return ei.value


# ----------------------------------------------------------------------------- reading YAML

DOC = """\
name: x
demand:
  peak_rps: -5
  uncertainty: 0.1
runs:
  - {run_id: a, offered_rps: 2}
  - run_id: b
    offered_rps: zz
"""


def test_marks_name_every_field_by_line_and_column():
    doc = S.parse_yaml(DOC, what="plan spec", file="p.yaml")
    assert doc.data["demand"]["peak_rps"] == -5
    m = doc.marks
    assert (m["name"].line, m["name"].column) == (1, 1)
    assert (m["demand.peak_rps"].line, m["demand.peak_rps"].column) == (3, 3)
    assert m["runs[0]"].line == 6 and m["runs[0].offered_rps"] == S.Mark(6, 17)
    assert m["runs[1].offered_rps"] == S.Mark(8, 5)


def test_mark_falls_back_to_the_nearest_written_parent():
    doc = S.parse_yaml(DOC)
    assert doc.mark("demand.history") == doc.marks["demand"]  # missing key: its section
    assert doc.mark("runs[1].warmup_s") == doc.marks["runs[1]"]
    assert doc.mark("budget") is None  # nothing written above a missing top-level key


def test_located_adds_file_and_line_to_every_spec_error():
    doc = S.parse_yaml(DOC, what="plan spec", file="p.yaml")
    with pytest.raises(SpecError) as ei, doc.located():
        S.number(doc.data["runs"][1]["offered_rps"], "runs[1].offered_rps", above=0)
    e = ei.value
    assert (e.file, e.line, e.col, e.field) == ("p.yaml", 8, 5, "runs[1].offered_rps")
    text = e.format()
    assert "file:    p.yaml, line 8, column 5" in text
    assert "runs[1].offered_rps must be a number, got text 'zz'" in text


def test_yaml_syntax_error_has_line_and_column():
    e = raises(S.parse_yaml, "a: 1\nb: [1, 2\nc: 3\n", what="gates file", file="g.yaml")
    assert e.message.startswith("gates file is not valid YAML at line ")
    assert e.line is not None and e.line >= 2 and e.col is not None
    assert f"line {e.line}" in e.message and "g.yaml, line" in e.format()
    assert "check indentation and quoting" in e.fix and e.code == "bad_yaml"


def test_libyaml_and_the_python_loader_give_one_document_and_one_message(monkeypatch):
    """parse_yaml reads with libyaml's loader (faster on every command's start) and the same
    Document comes out as from PyYAML's pure-Python one — data and every field's mark, merge
    keys, anchors, non-ASCII text included; a refused document is parsed again by the Python
    loader, whose message names the character it found."""
    text = open(Path(__file__).resolve().parents[1] / "data" / "sample" / "study.yaml",
                encoding="utf-8").read()
    text += "note: café — naïve\nbase: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n  z: [1, 2.5, null]\n"
    fast = S.parse_yaml(text)
    monkeypatch.delattr(yaml, "CSafeLoader")
    slow = S.parse_yaml(text)
    assert fast.data == slow.data and fast.marks == slow.marks and len(fast.marks) > 100
    monkeypatch.undo()
    e = raises(S.parse_yaml, "a:\n\tb: 1\n", what="plan spec")
    assert "found character '\\t' that cannot start any token" in e.message


def test_a_key_written_twice_is_refused_with_both_lines():
    e = raises(S.parse_yaml, "prices:\n  pue: 1.2\nname: a\nprices:\n  pue: 1.5\n",
               what="plan spec", file="p.yaml")
    assert "key prices is written twice (lines 1 and 4)" in e.message
    assert (e.field, e.line) == ("prices", 4)


def test_merge_keys_keep_explicit_values_and_their_marks():
    doc = S.parse_yaml("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n")
    assert doc.data["d"] == {"x": 1, "y": 3}
    assert doc.marks["d.y"].line == 4 and doc.marks["d.x"].line == 1


def test_empty_document_and_scalar_document():
    assert S.parse_yaml("").data is None and S.parse_yaml("# only a comment\n").data is None
    e = raises(S.mapping, S.parse_yaml("").data, "", what="plan spec", optional=False)
    assert e.message == "plan spec is empty"
    e = raises(S.mapping, S.parse_yaml("- a\n- b\n").data, "", what="plan spec")
    assert "plan spec must be a mapping of keys, got a list ['a', 'b']" in e.message


def test_load_yaml_file_errors(tmp_path):
    e = raises(S.load_yaml, tmp_path / "nope.yaml", what="plan spec", fix="start from x")
    assert e.message == "plan spec file not found" and e.fix == "start from x"
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\nx: 1\n".encode("latin-1"))
    e = raises(S.load_yaml, bad, what="plan spec")
    assert "not UTF-8" in e.message and e.line == 1
    bom = tmp_path / "bom.yaml"
    bom.write_bytes("\ufeffname: a\n".encode("utf-8"))
    assert S.load_yaml(bom).data == {"name": "a"}


def test_document_accepts_path_mapping_or_document(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("k: 1\n")
    d = S.document(p, what="thing")
    assert d.data == {"k": 1} and d.file == str(p) and d.marks["k"].line == 1
    assert S.document(d) is d
    m = S.document({"k": 2})
    assert m.data == {"k": 2} and m.file is None and m.mark("k") is None
    assert "must be a file path or a mapping" in raises(S.document, 5, what="thing").message


# ----------------------------------------------------------------------------- value checks


def test_number_ranges_and_kinds():
    assert S.number(3, "a") == 3.0 and isinstance(S.number(3, "a"), float)
    assert S.number(4.0, "a", integer=True) == 4 and isinstance(S.number(4.0, "a", integer=True), int)
    assert S.number(np.int64(7), "a", integer=True) == 7 and S.number(np.float64(0.5), "a") == 0.5
    assert S.number(None, "a", optional=True) is None
    assert S.number("4.5", "a", text_ok=True) == 4.5
    cases = [
        (dict(value=-1, minimum=0), "a must be ≥ 0, got -1"),
        (dict(value=0, above=0), "a must be > 0, got 0"),
        (dict(value=2, maximum=1), "a must be ≤ 1, got 2"),
        (dict(value=1, below=1), "a must be < 1, got 1"),
        (dict(value=1.5, integer=True), "a must be a whole number, got 1.5"),
        (dict(value=True), "a must be a number, got true"),
        (dict(value="4.5"), "a must be a number, got text '4.5'"),
        (dict(value="x", text_ok=True), "a must be a number, got text 'x'"),
        (dict(value=math.nan), "a must be finite, got nan"),
        (dict(value=None, example="380"), "a is missing"),
    ]
    for kw, msg in cases:
        e = raises(S.number, field="a", **kw)
        assert e.message == msg and e.field == "a" and e.fix
    assert raises(S.number, None, "demand.peak_rps", example="380").fix == "add peak_rps: 380"
    assert raises(S.number, -1, "x.y", above=0, example="2").fix == "use a value > 0 (e.g. y: 2)"


def test_choice_suggests_the_closest_spelling():
    assert S.choice("zone", "failure.policy", ("node", "zone")) == "zone"
    assert S.choice(None, "p", ("a", "b"), optional=True, default="a") == "a"
    e = raises(S.choice, "Zonne", "failure.policy", ("node", "zone", "none"))
    assert e.message == "unknown failure.policy 'Zonne' (did you mean 'zone'?)"
    assert e.fix == "use one of: node, zone, none"
    e = raises(S.choice, "rack", "failure.policy", ("node", "zone", "n_plus_k"))
    assert e.message == "unknown failure.policy 'rack'"
    assert "did you mean" not in raises(S.choice, 5, "p", ("a",)).message


def test_mapping_refuses_unknown_keys_with_did_you_mean():
    known = ("peak_rps", "history", "uncertainty")
    assert S.mapping({"peak_rps": 1}, "demand", known=known) == {"peak_rps": 1}
    assert S.mapping(None, "demand") == {}
    e = raises(S.mapping, {"peek_rps": 1, "zzz": 2}, "demand", known=known)
    assert e.message == "unknown key(s) in demand: peek_rps (did you mean peak_rps?), zzz"
    assert e.field == "demand.peek_rps" and e.fix == "known keys in demand: peak_rps, history, uncertainty"
    e = raises(S.mapping, {"budgt": 1}, "", known=("budget",), what="plan spec")
    assert e.field == "budgt" and "unknown key(s) in plan spec: budgt (did you mean budget?)" in e.message
    e = raises(S.mapping, [1, 2], "rollout")
    assert e.message == "rollout must be a mapping of keys, got a list [1, 2]"
    assert raises(S.mapping, None, "prices", optional=False).message == "prices is missing"


def test_sequence_text_flag_date():
    assert S.sequence(None, "r") == [] and S.sequence((1, 2), "r") == [1, 2]
    assert raises(S.sequence, [], "sweep.rates", nonempty=True, example="[1, 2]").message == "sweep.rates is empty"
    assert "must be a list, got 3" in raises(S.sequence, 3, "r").message
    assert S.text("a", "name") == "a" and S.text(None, "name") is None
    assert raises(S.text, "  ", "name", optional=False).message == "name must be text, got text '  '"
    assert raises(S.text, 5, "name").message == "name must be text, got 5"
    assert S.flag(False, "itl") is False and S.flag(None, "itl", default=True) is True
    assert raises(S.flag, "yes", "output.itl").message == "output.itl must be true or false, got text 'yes'"
    assert S.date(dt.date(2026, 1, 31), "d") == dt.date(2026, 1, 31)
    assert S.date("2026-02-01", "d") == dt.date(2026, 2, 1)
    assert S.date(dt.datetime(2026, 1, 2, 3, 4), "d") == dt.date(2026, 1, 2)
    assert S.parse_yaml("d: 2026-03-01\n").data["d"] == dt.date(2026, 3, 1)
    assert "must be a date like 2026-01-31" in raises(S.date, "31/01/2026", "d").message


@pytest.mark.parametrize("text, seconds", [
    (90, 90.0), (1.5, 1.5), ("90s", 90.0), ("500ms", 0.5), ("5 min", 300.0), ("1h30m", 5400.0),
    ("2 days", 172800.0), (" 1h 0.5m ", 3630.0), ("0.25h", 900.0), (".5s", 0.5),
])
def test_duration_reads_numbers_and_units(text, seconds):
    assert S.duration_s(text, "t") == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["5 parsecs", "s", "10", "1h-5m", "", "5 m s"])
def test_duration_refuses_what_it_cannot_read(bad):
    e = raises(S.duration_s, bad, "warmup")
    assert "cannot read" in e.message and "90s" in e.fix


def test_duration_ranges_apply_after_units():
    assert raises(S.duration_s, "-5s", "t").message.startswith("t: cannot read")
    assert raises(S.duration_s, 0, "t", above=0).message == "t must be > 0, got 0"
    assert S.duration_s(None, "t", optional=True) is None


def test_did_you_mean():
    assert S.did_you_mean("warmup", ("warmup_s", "duration_s")) == "warmup_s"
    assert S.did_you_mean("OFFERED_RPS", ("offered_rps",)) == "offered_rps"
    assert S.did_you_mean("zzz", ("warmup_s",)) is None


def test_checks_collect_located_problems_instead_of_raising():
    doc = S.parse_yaml(DOC, file="s.yaml")
    problems = ProblemList()
    check = S.Checks(problems, doc, code="manifest_field")
    assert check(S.number, doc.data["demand"]["peak_rps"], "demand.peak_rps", above=0) is None
    assert check(S.number, 0.1, "demand.uncertainty", minimum=0) == 0.1
    check.error("runs[1]", "closed-loop runs need 'concurrency'", fix="add concurrency: 16")
    check.warn("runs[0].arrival", "odd arrival")
    assert check.failed and len(problems.errors) == 2 and len(problems.warnings) == 1
    p = problems.errors[0]
    assert (p.file, p.line, p.field, p.code) == ("s.yaml", 3, "demand.peak_rps", "manifest_field")
    assert "file:    s.yaml, line 3, column 3" in p.format() and "field:   demand.peak_rps" in p.format()
    assert problems.errors[1].line == 7 and problems.warnings[0].line == 6


def test_spec_error_format_and_located():
    e = SpecError("x must be > 0, got -1", field="x", fix="use 1", example="x: 1")
    assert e.format() == "ERROR: x must be > 0, got -1\n  field:   x\n  example: x: 1\n  fix:     use 1"
    located = e.located("a.yaml", 3, 2)
    assert "file:    a.yaml, line 3, column 2" in located.format()
    assert located.located("b.yaml", 9, 9).line == 3  # a known position is kept
    assert e.problem(code="c").code == "c" and e.problem().field == "x"


# ----------------------------------------------------------------------------- the documents


def test_plan_spec_file_error_points_at_the_line(tmp_path, capsys):
    spec = tmp_path / "plan.yaml"
    spec.write_text("name: t\ndemand:\n  peak_rps: 100\n  uncertainty: -0.5\n"
                    "prices:\n  usd_per_gpu_hour: 2\n  pue: 1.2\n", encoding="utf-8")
    rc = main(["plan", "--spec", str(spec), "--capacity-rps", "10", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"file:    {spec}, line 4, column 3" in err and "field:   demand.uncertainty" in err
    spec.write_text("name: t\ndemand: {peak_rps: 100, horizon_quartrs: 2}\nprices: {usd_per_gpu_hour: 2}\n")
    rc = main(["plan", "--spec", str(spec), "--capacity-rps", "10", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "did you mean horizon_quarters?" in err and f"{spec}, line 2" in err


def test_synth_config_file_error_points_at_the_line(tmp_path):
    from capplan.sim.config import PRESETS, load_config

    raw = dict(PRESETS["small"])
    raw["client"] = {"timeout_s": "30s", "drain_s": "1 min"}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(p)
    assert cfg.timeout_s == 30.0 and cfg.drain_s == 60.0
    raw["replica"] = {**raw["replica"], "max_bach": 4}
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    e = raises(load_config, p)
    assert e.field == "replica.max_bach" and "did you mean max_batch?" in e.message
    line = p.read_text().splitlines()[e.line - 1]
    assert line.strip().startswith("max_bach:") and e.file == str(p)


def test_manifest_problem_names_field_and_line(tmp_path, capsys):
    from capplan.study import parse_manifest

    m = manifest_dict("x", [{"run_id": "r1", "offered_rps": 2.0, "warmup": 30},
                            {"run_id": "r2", "offered_rps": -1, "arrival": "poison"}])
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(m, sort_keys=False))
    problems = ProblemList()
    parse_manifest(p, problems)
    (err,) = problems.errors
    assert err.field == "runs[1].offered_rps" and "must be > 0, got -1" in err.message
    assert p.read_text().splitlines()[err.line - 1].strip().startswith("offered_rps: -1")
    warn = {w.field: w.message for w in problems.warnings}
    assert "did you mean 'warmup_s'?" in warn["runs[0].warmup"]
    assert "did you mean 'poisson'?" in warn["runs[1].arrival"]
