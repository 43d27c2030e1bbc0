"""The manifest's ``workload`` after an import, one test per tool (docs/importers.md, "The
workload reaches the manifest"): every block is compared whole with values checked by hand
against the fixture files (the raw prompt/answer lengths, the tools' configs), so a field that
goes missing, or one the source does not state but is not listed under ``unknown``, fails.

Hand checks (numpy over the raw files, not through the importer):
- GuideLLM 0.8.1 ``poisson_v2``: 121 requests, ``prompt_tokens`` mean 16.89, sd 6.98, min 12,
  p50 14, p90/p99/max 32; the 110 request bodies all hold ``max_completion_tokens: 8`` and
  ``ignore_eos: true`` (11 errored requests keep no body); config ``data[0]`` prompt_tokens 32,
  output_tokens 8; strategies poisson 2, 4, 8. ``concurrent_v2``: 39 requests, mean 16.54,
  sd 6.7; streams 1 and 2.
- AIPerf 0.13.0 ``artifacts``: every ``input_sequence_length`` is 32; ``--isl 32 --osl 8``
  (stddev 0), ``endpoint.extra`` is ``{}`` (no ignore_eos), phases poisson at 3 and 6 rps.
- inference-perf 0.7.0: 41 of 48 requests have ``info.input_tokens`` (mean 2.56, sd 1.25,
  1…5, p50 2, p90 4); request bodies ``max_tokens`` mean 11.88, sd 2.07, 8…15, p90 14.3;
  config.yaml: normal input mean 30 / output mean 12, ``server.ignore_eos: true``, stages 4, 8.
- vLLM / SGLang / LLMPerf / GenAI-Perf (written fixtures): prompts 64 / 64 / 64 / 5 words,
  answers of the ok requests 8 / 8 / 16 / ``max_tokens`` 8.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from capplan import open_study
from capplan.cli import main
from capplan.importers import import_paths
from capplan.loadtools import ManifestWorkload

FIX = Path(__file__).parent / "fixtures"
TOK = "/tmp/imp7/tok"


def fixed(v, **more) -> dict:
    """The length summary of a constant length."""
    return {"mean": float(v), "sd": 0.0, "min": v, "p50": v, "p90": v, "p99": v, "max": v, **more}


def workload(tool: str, *paths) -> dict:
    return import_paths(tool, [str(p) for p in paths]).manifest["workload"]


def test_guidellm_v2_poisson_and_concurrent():
    assert workload("guidellm", FIX / "guidellm" / "poisson_v2.json.gz") == {
        "tool": "guidellm", "tool_version": "0.8.1", "arrival": "poisson", "endpoint": "chat",
        "streaming": True,
        "input_tokens": {"mean": 16.89, "sd": 6.98, "min": 12, "p50": 14, "p90": 32, "p99": 32,
                         "max": 32},
        "output_tokens": fixed(8, **{"from": "asked"}), "output_fixed": True,
        "asked": {"input_tokens": 32, "output_tokens": 8}, "asked_rps": [2, 4, 8],
        "tokenizer": TOK, "seed": 42}
    wl = workload("guidellm", FIX / "guidellm" / "concurrent_v2.json.gz")
    assert wl["arrival"] == "concurrency" and wl["asked_concurrency"] == [1, 2]
    assert "asked_rps" not in wl and "unknown" not in wl
    assert wl["input_tokens"]["mean"] == 16.54 and wl["input_tokens"]["sd"] == 6.7
    # the sweep profile: synchronous, throughput (max_concurrency 512), constant 5.5 and 11
    wl = workload("guidellm", FIX / "guidellm" / "sweep_v2.json.gz")
    assert wl["asked_rps"] == [5.5, 11] and wl["asked_concurrency"] == [1, 512]
    assert wl["arrival"] == "mixed" and wl["mixed"] == ["arrival"] and "unknown" not in wl


def test_guidellm_2025_names_what_it_does_not_say():
    """The 2025 field names keep no version, data config, stream flag or request body."""
    assert workload("guidellm", FIX / "guidellm" / "report_2025.json") == {
        "tool": "guidellm", "arrival": "poisson", "endpoint": "completions",
        "input_tokens": fixed(64), "output_tokens": fixed(8, **{"from": "received"}),
        "asked_rps": [2, 4], "seed": 42,
        "unknown": ["tool_version", "streaming", "asked.input_tokens", "asked.output_tokens",
                    "output_fixed"]}


def _issue_shaped_guidellm(tmp_path) -> Path:
    """The real 0.8.1 report rewritten to the reported sweep's workload: 200-token prompts,
    48-token answers, three repeats asked at 8.17 req/s."""
    obj = json.loads(gzip.open(FIX / "guidellm" / "poisson_v2.json.gz", "rt").read())
    obj["config"]["spec"]["data"][0].update(prompt_tokens=200, output_tokens=48)
    for bench in obj["benchmarks"]:
        bench["config"]["strategy"]["rate"] = 8.17
        for bucket in ("successful", "errored", "incomplete"):
            for r in bench["requests"].get(bucket) or []:
                r["prompt_tokens"] = 200
                if r.get("request_args"):
                    args = json.loads(r["request_args"])
                    args["body"]["max_completion_tokens"] = 48
                    r["request_args"] = json.dumps(args)
    p = tmp_path / "sweep" / "benchmarks.json"
    p.parent.mkdir()
    p.write_text(json.dumps(obj))
    return p


def test_guidellm_workload_reaches_study_yaml_and_design(tmp_path, capsys):
    """The reported case: after `capplan import auto` of a GuideLLM 0.8.1 sweep, study.yaml's
    workload holds the lengths, the arrival process, the tool and the asked rate, and what
    `capplan design` reads from it (loadtools.ManifestWorkload) reproduces 200/48 Poisson."""
    src = _issue_shaped_guidellm(tmp_path)
    out = tmp_path / "study"
    assert main(["import", "auto", str(src), "--out", str(out)]) == 0
    capsys.readouterr()
    wl = open_study(out).manifest.workload
    assert wl["tool"] == "guidellm" and wl["tool_version"] == "0.8.1"
    assert wl["arrival"] == "poisson" and wl["asked_rps"] == [8.17]
    assert wl["input_tokens"] == fixed(200)
    assert wl["output_tokens"] == fixed(48, **{"from": "asked"})
    assert wl["asked"] == {"input_tokens": 200, "output_tokens": 48}
    assert "unknown" not in wl
    w = ManifestWorkload.parse(wl)
    assert (w.arrival, w.endpoint, w.streaming, w.output_fixed) == ("poisson", "chat", True, True)
    assert (w.inp.kind, w.inp.value, w.out.kind, w.out.value) == ("fixed", 200, "fixed", 48)
    assert w.notes == ()


def test_aiperf_rate_and_concurrency_sweeps():
    assert workload("aiperf", FIX / "aiperf" / "artifacts") == {
        "tool": "aiperf", "tool_version": "0.13.0", "arrival": "poisson", "endpoint": "chat",
        "streaming": True, "input_tokens": fixed(32),
        "output_tokens": fixed(8, **{"from": "asked"}),
        "output_fixed": False,  # endpoint.extra is {}: no ignore_eos was sent
        "asked": {"input_tokens": 32, "output_tokens": 8}, "asked_rps": [3, 6],
        "tokenizer": TOK, "grace_s": 1.0, "seed": 42}
    wl = workload("aiperf", FIX / "aiperf" / "concurrency_sweep")
    assert wl["arrival"] == "concurrency" and wl["asked_concurrency"] == [1, 3]
    assert "asked_rps" not in wl and "unknown" not in wl


def test_aiperf_gamma_arrivals_keep_their_burstiness(tmp_path):
    """A gamma phase of smoothness 0.25 has gaps with CV 1/√0.25 = 2; design turns it back
    into the shape 0.25."""
    d = tmp_path / "gamma" / "rate_3.0"
    shutil.copytree(FIX / "aiperf" / "artifacts" / "rate_3.0", d)
    summ = json.loads((d / "profile_export_aiperf.json").read_text())
    summ["input_config"]["phases"][0].update(type="gamma", smoothness=0.25)
    (d / "profile_export_aiperf.json").write_text(json.dumps(summ))
    wl = workload("aiperf", d)
    assert wl["arrival"] == "gamma" and wl["arrival_cv"] == 2.0
    assert ManifestWorkload.parse(wl).gamma_shape == pytest.approx(0.25)


def test_inference_perf():
    assert workload("inference-perf", FIX / "inference_perf") == {
        "tool": "inference-perf", "arrival": "poisson", "endpoint": "completions",
        "streaming": True,
        "input_tokens": {"mean": 2.56, "sd": 1.25, "min": 1, "p50": 2, "p90": 4, "p99": 5,
                         "max": 5},
        "output_tokens": {"mean": 11.88, "sd": 2.07, "min": 8, "p50": 12, "p90": 14.3,
                          "p99": 15, "max": 15, "from": "asked"},
        "output_fixed": True, "asked": {"input_tokens": 30, "output_tokens": 12},
        "asked_rps": [4, 8], "tokenizer": TOK, "seed": 1795944659615,
        "unknown": ["tool_version"]}  # inference-perf writes no version into its reports


def test_vllm_open_closed_and_gamma(tmp_path):
    assert workload("vllm", FIX / "vllm" / "sweep") == {
        "tool": "vllm", "arrival": "poisson", "endpoint": "completions",
        "input_tokens": fixed(64), "output_tokens": fixed(8, **{"from": "received"}),
        "asked_rps": [2, 4], "tokenizer": "meta-llama/Llama-3.1-8B-Instruct",
        "unknown": ["tool_version", "streaming", "asked.input_tokens", "asked.output_tokens",
                    "output_fixed"]}
    wl = workload("vllm", FIX / "vllm" / "closed")
    assert wl["arrival"] == "concurrency" and wl["asked_concurrency"] == [4]
    assert wl["input_tokens"] == fixed(32)
    # burstiness 0.5: gamma gaps of shape 0.5, CV 1/√0.5
    obj = json.loads((FIX / "vllm" / "sweep" / "vllm-2qps-Llama-3.1-8B.json").read_text())
    obj.update(burstiness=0.5, random_input_len=64, random_output_len=8, ignore_eos=True)
    p = tmp_path / "bursty.json"
    p.write_text(json.dumps(obj))
    wl = workload("vllm", p)
    assert wl["arrival"] == "gamma" and wl["arrival_cv"] == pytest.approx(2 ** 0.5, abs=1e-6)
    assert wl["asked"] == {"input_tokens": 64, "output_tokens": 8} and wl["output_fixed"] is True
    assert wl["unknown"] == ["tool_version", "streaming"]


def test_sglang():
    assert workload("sglang", FIX / "sglang" / "sglang_bench.jsonl") == {
        "tool": "sglang", "arrival": "poisson",  # bench_serving at a finite rate: Poisson
        "endpoint": "unknown",  # backend sglang: its native /generate
        "input_tokens": fixed(64), "output_tokens": fixed(8, **{"from": "received"}),
        "asked_rps": [2, 4],
        "unknown": ["tool_version", "endpoint", "streaming", "asked.input_tokens",
                    "asked.output_tokens", "output_fixed"]}


def test_llmperf():
    assert workload("llmperf", FIX / "llmperf") == {
        "tool": "llmperf", "tool_version": "2023-08-31", "arrival": "concurrency",
        "endpoint": "unknown", "input_tokens": fixed(64),
        "output_tokens": fixed(16, **{"from": "received"}),
        "asked": {"input_tokens": 64, "output_tokens": 16}, "asked_concurrency": [2],
        "unknown": ["endpoint", "streaming", "output_fixed"]}


def test_genai_perf():
    assert workload("genai-perf", FIX / "genai_perf" / "profile_export.json") == {
        "tool": "genai-perf", "tool_version": "0.0.8",
        "arrival": "unknown",  # the export names the request rate, not its distribution
        "endpoint": "chat", "streaming": True, "input_tokens": fixed(5),
        "output_tokens": fixed(8, **{"from": "asked"}),
        "output_fixed": False,  # the payload, kept whole, has no ignore_eos
        "asked_rps": [4], "unknown": ["arrival", "asked.input_tokens"]}


def test_append_unions_the_asked_levels(tmp_path, capsys):
    """`--into` recomputes the block: the asked rates of both imports, unknowns recomputed."""
    into = FIX / "aiperf" / "into" / "sweep"
    out = tmp_path / "S"
    assert main(["import", "aiperf", str(into / "rate_4.0"), "--out", str(out)]) == 0
    assert main(["import", "aiperf", str(into / "rate_2.0"), str(into / "rate_6.0"),
                 "--into", str(out)]) == 0
    capsys.readouterr()
    wl = open_study(out).manifest.workload
    assert wl["asked_rps"] == [2, 4, 6] and "unknown" not in wl


def test_append_to_a_study_without_levels_takes_them_from_its_runs(tmp_path, capsys):
    """A study written before the workload kept the levels: its runs' nominal_rps count."""
    import yaml

    into = FIX / "aiperf" / "into" / "sweep"
    out = tmp_path / "S"
    assert main(["import", "aiperf", str(into / "rate_4.0"), "--out", str(out)]) == 0
    m = yaml.safe_load((out / "study.yaml").read_text())
    del m["workload"]["asked_rps"]
    (out / "study.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    assert main(["import", "aiperf", str(into / "rate_6.0"), "--into", str(out)]) == 0
    capsys.readouterr()
    assert open_study(out).manifest.workload["asked_rps"] == [4, 6]


def test_caller_stated_facts_leave_unknown():
    """What the caller states (import_paths(workload=...)) is no longer unknown."""
    res = import_paths("sglang", [str(FIX / "sglang" / "sglang_bench.jsonl")],
                       workload={"tool_version": "0.4.6", "endpoint": "completions",
                                 "streaming": True, "output_fixed": True,
                                 "asked": {"input_tokens": 64, "output_tokens": 8}})
    assert "unknown" not in res.manifest["workload"]
