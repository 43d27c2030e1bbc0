"""capplan.loadtools: load-tool commands that run verbatim and carry the study's workload.

The unit tests check the command text. ``test_aiperf_and_guidellm_lines_run_verbatim`` (marker
``realtools``) runs every AIPerf and GuideLLM line exactly as printed, through ``bash -c``,
against tests/fixtures/mock_server.py; the only change to the environment is the peer-tools
venv's bin directory put first on PATH (the ``peer_tools`` fixture, tests/conftest.py; make the
venv with scripts/peer_tools.sh). It takes about 90 s: each 4-s run costs ~20 s of tool
start-up on 2 cores.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from capplan.errors import SpecError
from capplan.loadtools import TOKENIZER_PLACEHOLDER, commands, lengths, seed_base_for

ROOT = Path(__file__).resolve().parents[1]

FIXED = {"tool": "aiperf", "tool_version": "0.13.0", "arrival": "poisson", "endpoint": "chat",
         "streaming": True,
         "input_tokens": {"mean": 64.0, "sd": 0.0, "min": 64, "p50": 64, "p90": 64, "p99": 64,
                          "max": 64},
         "output_tokens": {"mean": 32.0, "sd": 0.0, "min": 32, "p50": 32, "p90": 32, "p99": 32,
                           "max": 32, "from": "asked"},
         "output_fixed": True, "asked": {"input_tokens": 64, "output_tokens": 32}, "grace_s": 0}
RUNS = [{"rate_rps": 3.0, "repeats": 2, "duration_s": 4.0, "warmup_s": 0.0}]
URL = "http://127.0.0.1:8000"


def _cmds(workload=FIXED, runs=RUNS, **kw):
    kw.setdefault("tokenizer", "/tok")
    kw.setdefault("seed_base", 1000)
    return commands(runs, workload, url=URL, model="mock-llm", **kw)


def _opt(line: str, flag: str) -> str:
    """The value after ``flag`` in a command line (shell-split)."""
    args = shlex.split(line)
    return args[args.index(flag) + 1]


def _normal(mean, sd):
    return {"mean": mean, "sd": sd, "min": max(1, int(mean - 3.5 * sd)),
            "p50": mean, "p90": mean + 1.2816 * sd, "p99": mean + 2.3263 * sd,
            "max": int(mean + 3.5 * sd)}


# ------------------------------------------------------------------------------ unit

def test_commands_carry_lengths_ignore_eos_grace_tokenizer_and_server_counts():
    tc = _cmds()
    a = tc["aiperf"].commands
    assert len(a) == 2
    for line in a:
        assert _opt(line, "--isl") == "64" and _opt(line, "--isl-stddev") == "0"
        assert _opt(line, "--osl") == "32" and _opt(line, "--osl-stddev") == "0"
        assert _opt(line, "--extra-inputs") == "ignore_eos:true"
        assert _opt(line, "--benchmark-grace-period") == "0"
        assert _opt(line, "--tokenizer") == "/tok"
        assert _opt(line, "--arrival-pattern") == "poisson"
        assert _opt(line, "--request-rate") == "3" and _opt(line, "--benchmark-duration") == "4"
        assert _opt(line, "--ui") == "none"
        assert "--use-server-token-count" in shlex.split(line)
        assert "--streaming" in shlex.split(line)
    for line in tc["guidellm"].commands:
        assert line.startswith("GUIDELLM__MAX_WORKER_PROCESSES=1 guidellm run ")
        data = json.loads(_opt(line, "--data"))
        assert (data["prompt_tokens"], data["output_tokens"]) == (64, 32)
        assert json.loads(_opt(line, "--profile")) == {"kind": "poisson", "rate": [3.0]}
        assert json.loads(_opt(line, "--constraint"))["seconds"] == 4.0
        assert json.loads(_opt(line, "--tokenizer"))["model"] == "/tok"
        assert "--random-seed" not in line and "--disable-console-interactive" in line
    for line in tc["vllm"].commands:
        args = shlex.split(line)
        assert _opt(line, "--random-input-len") == "64" and _opt(line, "--random-output-len") == "32"
        assert _opt(line, "--random-range-ratio") == "0" and "--ignore-eos" in args
        assert _opt(line, "--burstiness") == "1" and _opt(line, "--num-prompts") == "12"
        assert _opt(line, "--tokenizer") == "/tok"


def test_seeds_differ_across_runs_and_rounds_and_name_the_output_folders(tmp_path):
    runs = [{"rate_rps": 3, "repeats": 2, "duration_s": 4}, {"rate_rps": 5.5, "repeats": 1,
                                                              "duration_s": 4}]
    first = _cmds(runs=runs, seed_base=seed_base_for(6), out_dir=str(tmp_path))
    second = _cmds(runs=runs, seed_base=seed_base_for(6 + len(first.runs)),
                   out_dir=str(tmp_path))
    s1 = [r.seed for r in first.runs]
    s2 = [r.seed for r in second.runs]
    assert s1 == [7000, 7001, 7002] and len(set(s2)) == 3 and not set(s1) & set(s2)
    for tc, seeds in ((first, s1), (second, s2)):
        assert [int(_opt(c, "--random-seed")) for c in tc["aiperf"].commands] == seeds
        assert [json.loads(_opt(c, "--seed"))["value"] for c in tc["guidellm"].commands] == seeds
        assert [int(_opt(c, "--seed")) for c in tc["vllm"].commands] == seeds
        folders = [r.folder for r in tc.runs]
        assert folders == [f"{tmp_path}/rate3_s{seeds[0]}", f"{tmp_path}/rate3_s{seeds[1]}",
                           f"{tmp_path}/rate5.5_s{seeds[2]}"]
        assert [_opt(c, "--artifact-dir") for c in tc["aiperf"].commands] == folders
        assert [json.loads(_opt(c, "--output"))["path"] for c in tc["guidellm"].commands] == \
            [f + "/benchmarks.json" for f in folders]
        assert tc["aiperf"].import_command == \
            "capplan import auto " + " ".join(folders) + " --into STUDY"


def test_tokenizer_from_the_workload_else_the_argument_else_a_placeholder_with_a_note():
    assert _opt(_cmds({**FIXED, "tokenizer": "/w/tok"})["aiperf"].commands[0],
                "--tokenizer") == "/w/tok"
    assert _opt(_cmds()["aiperf"].commands[0], "--tokenizer") == "/tok"
    tc = _cmds(tokenizer=None)
    assert _opt(tc["aiperf"].commands[0], "--tokenizer") == TOKENIZER_PLACEHOLDER
    assert json.loads(_opt(tc["guidellm"].commands[0], "--tokenizer"))["model"] == \
        TOKENIZER_PLACEHOLDER
    assert any(TOKENIZER_PLACEHOLDER in n for n in tc.notes)
    assert TOKENIZER_PLACEHOLDER in tc.to_text()


def test_normal_spread_goes_to_the_stddev_flags_and_vllm_gives_a_reason():
    w = {**FIXED, "input_tokens": _normal(300.0, 40.0), "asked": {"output_tokens": 32}}
    tc = _cmds(w)
    line = tc["aiperf"].commands[0]
    assert _opt(line, "--isl") == "300" and _opt(line, "--isl-stddev") == "40"
    data = json.loads(_opt(tc["guidellm"].commands[0], "--data"))
    assert data["prompt_tokens"] == 300 and data["prompt_tokens_stdev"] == 40
    assert (data["prompt_tokens_min"], data["prompt_tokens_max"]) == (160, 440)
    assert not tc["vllm"].ok and not tc["vllm"].commands and "uniform" in tc["vllm"].reason
    ip = yaml.safe_load(tc["inference-perf"].files[0][1])
    assert ip["data"]["input_distribution"]["std_dev"] == 40.0


def test_uniform_spread_goes_to_range_ratios():
    uni = {"mean": 100.0, "sd": 11.5, "min": 80, "max": 120, "p50": 100, "p99": 120}
    tc = _cmds({**FIXED, "input_tokens": uni, "output_tokens": {"mean": 32, "sd": 3.5,
                                                                "min": 26, "max": 38}})
    assert lengths(uni).kind == "uniform"
    assert _opt(tc["vllm"].commands[0], "--random-range-ratio") == "0.2"
    assert json.loads(_opt(tc["aiperf"].commands[0], "--random-range-ratio")) == \
        {"input": 0.2, "output": 0.188}
    data = json.loads(_opt(tc["guidellm"].commands[0], "--data"))
    assert "prompt_tokens_stdev" not in data and data["prompt_tokens_min"] == 80
    assert not tc["inference-perf"].ok


def test_a_workload_no_tool_can_express_gives_reasons_not_commands():
    skewed = {"mean": 300.0, "sd": 250.0, "min": 20, "p50": 180, "p90": 700, "p99": 1400,
              "max": 3000}
    tc = _cmds({**FIXED, "input_tokens": skewed})
    for tool in ("aiperf", "guidellm", "vllm", "inference-perf"):
        p = tc[tool]
        assert not p.ok and p.commands == () and p.import_command == ""
        assert "p99 1400" in p.reason
        assert f"cannot express this workload: {p.reason}" in tc.to_text()
    missing = _cmds({"arrival": "poisson"})
    assert not missing["aiperf"].ok and "no prompt lengths" in missing["aiperf"].reason
    d = tc.to_dict()["tools"]["aiperf"]
    assert d["ok"] is False and d["commands"] == [] and d["reason"]


def test_arrival_processes_each_tool_can_and_cannot_send():
    const = _cmds({**FIXED, "arrival": "constant"})
    assert _opt(const["aiperf"].commands[0], "--arrival-pattern") == "constant"
    assert json.loads(_opt(const["guidellm"].commands[0], "--profile"))["kind"] == "constant"
    assert not const["vllm"].ok and "constant" in const["vllm"].reason
    gamma = _cmds({**FIXED, "arrival": "gamma"})
    assert all(not gamma[t].ok for t in ("aiperf", "guidellm", "vllm", "inference-perf"))
    gamma = _cmds({**FIXED, "arrival": "gamma", "arrival_cv": 2.0})
    assert _opt(gamma["aiperf"].commands[0], "--arrival-smoothness") == "0.25"
    assert _opt(gamma["vllm"].commands[0], "--burstiness") == "0.25"
    assert not gamma["guidellm"].ok
    closed = _cmds({**FIXED, "arrival": "concurrency"})
    assert _opt(closed["aiperf"].commands[0], "--concurrency") == "3"
    assert closed.runs[0].name == "conc3_s1000"
    assert not closed["vllm"].ok and not closed["inference-perf"].ok
    unknown = _cmds({**FIXED, "arrival": "unknown"})
    assert _opt(unknown["aiperf"].commands[0], "--arrival-pattern") == "poisson"
    assert any("Poisson" in n for n in unknown.notes)


def test_answers_that_stopped_at_eos_are_not_forced():
    w = {**FIXED, "output_fixed": False,
         "output_tokens": {"mean": 21.0, "sd": 9.0, "min": 3, "max": 32, "from": "measured"}}
    tc = _cmds(w)
    line = tc["aiperf"].commands[0]
    assert "ignore_eos" not in line and _opt(line, "--osl") == "32"
    backend = json.loads(_opt(tc["guidellm"].commands[0], "--backend"))
    assert backend["extras"] == {"body": {"ignore_eos": False}}
    assert not tc["vllm"].ok and "ignore_eos" in tc["vllm"].reason
    assert yaml.safe_load(tc["inference-perf"].files[0][1])["server"]["ignore_eos"] is False
    assert not _cmds({**w, "asked": {}})["aiperf"].ok


def test_grace_and_timeout_come_from_the_study():
    tc = _cmds({**FIXED, "grace_s": 5, "client": {"timeout_s": 30}})
    assert _opt(tc["aiperf"].commands[0], "--benchmark-grace-period") == "5"
    assert _opt(tc["aiperf"].commands[0], "--request-timeout-seconds") == "30"
    # GuideLLM has no grace period: a study that let requests finish gets runs bounded by
    # their request count (every request answered), one that cut them off gets max_duration
    stop = json.loads(_opt(tc["guidellm"].commands[0], "--constraint"))
    assert stop == {"kind": "max_requests", "count": 12}  # 3 req/s × 4 s
    assert any("max_requests" in n for n in tc["guidellm"].notes)
    cut = json.loads(_opt(_cmds(FIXED)["guidellm"].commands[0], "--constraint"))
    assert cut == {"kind": "max_duration", "seconds": 4.0}
    ip = yaml.safe_load(tc["inference-perf"].files[0][1])
    assert ip["load"]["stage_teardown_grace_seconds"] == 5
    assert ip["load"]["request_timeout"] == 30


def test_inference_perf_config_and_synth_design_path(tmp_path):
    tc = _cmds(out_dir=str(tmp_path), design_path="out/my design.yaml")
    p = tc["inference-perf"]
    assert len(p.files) == len(p.commands) == 2
    path, text = p.files[1]
    cfg = yaml.safe_load(text)
    assert cfg["load"]["base_seed"] == 1001 and cfg["load"]["type"] == "poisson"
    assert cfg["load"]["stages"] == [{"rate": 3, "duration": 4}]
    assert cfg["storage"]["local_storage"]["path"] == f"{tmp_path}/rate3_s1001"
    assert p.commands[1] == f"inference-perf -c {path}"
    assert tc["capplan synth"].commands == (
        "capplan synth --design 'out/my design.yaml' --twin twin.yaml --out preview",)
    assert not _cmds()["capplan synth"].ok


def test_every_line_is_valid_shell_and_bad_input_is_refused():
    tc = _cmds(out_dir="/tmp/o u t")
    for plan in tc.plans:
        for line in plan.commands:
            shlex.split(line)
    assert _opt(tc["aiperf"].commands[0], "--artifact-dir") == "/tmp/o u t/rate3_s1000"
    with pytest.raises(SpecError):
        _cmds(runs=[{"rate_rps": 0, "repeats": 1, "duration_s": 4}])
    with pytest.raises(SpecError):
        _cmds(runs=[{"rate_rps": 1, "repeats": 0, "duration_s": 4}])
    with pytest.raises(SpecError):
        _cmds(seed_base=-1)
    assert set(_cmds().to_dict()["tools"]) == {"aiperf", "guidellm", "vllm", "inference-perf",
                                               "capplan synth"}


# ------------------------------------------------------------------------------ real tools

@pytest.fixture(scope="session")
def peer_tokenizer(peer_tools, tmp_path_factory):
    """The tiny tokenizer: <venv>/tokenizer (scripts/peer_tools.sh), else built once here."""
    tok = peer_tools.parent / "tokenizer"
    if (tok / "tokenizer.json").is_file():
        return tok
    tok = tmp_path_factory.mktemp("tokenizer")
    subprocess.run([str(peer_tools / "python"), str(ROOT / "scripts" / "make_tokenizer.py"),
                    str(tok)], check=True, capture_output=True, timeout=300)
    return tok


@pytest.fixture
def mock_server(peer_tools, peer_tokenizer):
    """tests/fixtures/mock_server.py on a free port, counting prompt tokens with the tokenizer
    (run with the venv's python, which has ``tokenizers``)."""
    proc = subprocess.Popen([str(peer_tools / "python"), str(ROOT / "tests" / "fixtures" /
                                                             "mock_server.py"),
                             "--port", "0", "--tokenizer", str(peer_tokenizer)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("mock server on "), line
        yield line.rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.realtools
def test_aiperf_and_guidellm_lines_run_verbatim(peer_tools, peer_tokenizer, mock_server,
                                                tmp_path):
    env = dict(os.environ, PATH=f"{peer_tools}{os.pathsep}{os.environ.get('PATH', '')}")
    timings = {}
    for tool in ("aiperf", "guidellm"):
        out = tmp_path / tool
        tc = commands(RUNS, FIXED, url=mock_server, model="mock-llm",
                      tokenizer=str(peer_tokenizer), seed_base=seed_base_for(0),
                      out_dir=str(out))
        plan = tc[tool]
        assert plan.ok and len(plan.commands) == 2
        starts = []
        for line, run in zip(plan.commands, tc.runs):
            t0 = time.monotonic()
            res = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=300)
            timings.setdefault(tool, []).append(round(time.monotonic() - t0, 1))
            assert res.returncode == 0, (line, res.stdout[-3000:], res.stderr[-3000:])
            folder = Path(run.folder)
            assert folder.is_dir() and folder.name == run.name
            assert any(folder.rglob("profile_export.jsonl" if tool == "aiperf"
                                    else "benchmarks.json"))
            study = tmp_path / f"study_{run.name}_{tool}"
            imp = subprocess.run([sys.executable, "-m", "capplan", "import", "auto",
                                  str(folder), "--out", str(study)], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
            assert imp.returncode == 0, imp.stdout + imp.stderr
            ev = pd.concat(pd.read_parquet(p) for p in sorted((study / "events").glob("*.parquet")))
            ok = ev[ev["status"] == "ok"]
            assert len(ok) >= 3
            # server token counts (mock server: the tokenizer's count of the prompt text);
            # measured: every prompt reads exactly the asked 64 tokens, every answer 32
            assert set(ok["input_tokens"].astype(int)) == {64}, ok["input_tokens"].tolist()
            assert set(ok["output_tokens"].astype(int)) == {32}
            starts.append(ev["scheduled_ns"].sort_values().diff().dropna().round(-6).tolist())
        # fresh seeds: the two runs' arrival gaps differ
        assert starts[0][:5] != starts[1][:5]
        assert plan.import_command.endswith(" --into STUDY")
    print("wall seconds per 4-s run:", timings)
