"""capplan end to end on a real engine (issue 26): llama.cpp's llama-server (continuous batching,
16 sequence slots, one CPU thread) serving the tiny random model (tests/realtools/tiny_gguf.py),
driven by real AIPerf 0.13 with the commands capplan.loadtools prints, then every capplan
command a planner runs on the imported study.

These tests gate on mechanics, never on a capacity value: on a shared CPU this engine's capacity
moves with what else runs (docs/real-engine.md). Markers ``realengine`` (the ``llama_engine``
fixture: scripts/real_engine.sh's build; CI fails rather than skips without it), ``realtools``
(the peer-tools venv) and ``slow`` (≈ 3–4 min on a busy 2-core box)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.realtools import llama
from tests.realtools.loop import run_line, workload

pytestmark = [pytest.mark.realengine, pytest.mark.realtools, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SLO = "ttft_ms=500,tpot_ms=60,attainment=0.95"
RATES = (2.0, 5.0, 9.0)
DURATION_S = 10.0
PROMPT_TOKENS = 24          # AIPerf's tokenizer's tokens (≈ 100 characters: the server's tokens)
OUTPUT_TOKENS = 16


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


async def _stream_chat(url: str, max_tokens: int) -> tuple[int, dict | None, str]:
    """(content chunks, usage, finish_reason) of one streamed chat completion."""
    from urllib.parse import urlparse

    u = urlparse(url)
    body = json.dumps({"model": llama.MODEL, "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "Count the owls."}]}).encode()
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    chunks, usage, finish = 0, None, ""
    try:
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.netloc}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        while line := await reader.readline():
            line = line.strip()
            if line == b"data: [DONE]":
                break
            if not line.startswith(b"data: "):
                continue
            obj = json.loads(line[6:])
            for c in obj.get("choices") or []:
                chunks += bool((c.get("delta") or {}).get("content"))
                finish = c.get("finish_reason") or finish
            usage = obj.get("usage") or usage
    finally:
        writer.close()
    return chunks, usage, finish


def test_the_server_serves_exactly_max_tokens(llama_server):
    """Plain and streamed, chat and completions, one token per chunk: the tiny model never ends
    early, so every answer is exactly max_tokens long; the server runs the 16 slots asked for and
    exports its Prometheus metrics."""
    url = llama_server.url
    assert llama_server.ready_s < 60
    for n in (1, 7, 40):
        r = _post(url, "/v1/completions", {"model": llama.MODEL, "prompt": "Once upon a time",
                                           "max_tokens": n})
        assert r["usage"]["completion_tokens"] == n and r["choices"][0]["finish_reason"] == "length"
        c = _post(url, "/v1/chat/completions", {"model": llama.MODEL, "max_tokens": n,
                                                "messages": [{"role": "user", "content": "hi"}]})
        assert c["usage"]["completion_tokens"] == n
    results = asyncio.run(_gather_streams(url, [5, 33, 64] * 6))   # 18 at once: 2 wait for a slot
    for want, (chunks, usage, finish) in zip([5, 33, 64] * 6, results):
        assert chunks == want and usage["completion_tokens"] == want and finish == "length"
    with urllib.request.urlopen(url + "/props", timeout=10) as r:
        assert json.loads(r.read())["total_slots"] == 16
    m = llama.metrics(url)
    assert m["llamacpp:tokens_predicted_total"] >= 18 * 34 + 2 * 48


async def _gather_streams(url, sizes):
    return await asyncio.gather(*(_stream_chat(url, n) for n in sizes))


def _capplan(*args: str, cwd: Path, ok=(0,)) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "capplan", *args], cwd=cwd, capture_output=True,
                       text=True, timeout=900,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode in ok, f"capplan {' '.join(args)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def test_a_real_client_sweep_runs_through_every_capplan_command(llama_server, peer_tools, tmp_path):
    """AIPerf sweeps the real server with the commands capplan.loadtools prints; capplan imports
    every request and each planner's command runs and says something sensible."""
    from capplan.loadtools import commands, seed_base_for

    t0 = time.perf_counter()
    laps: dict[str, float] = {}

    def lap(name: str) -> None:
        laps[name] = time.perf_counter() - t0 - sum(laps.values())

    url = llama_server.url
    tok = str(peer_tools.parent / "tokenizer")
    study = tmp_path / "study"
    w = workload(prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, tokenizer=tok,
                 grace_s=10.0)
    runs = [{"rate_rps": r, "repeats": 1, "duration_s": DURATION_S, "warmup_s": 0.0}
            for r in RATES]
    tc = commands(runs, w, url=url, model=llama.MODEL, tokenizer=tok, seed_base=seed_base_for(0),
                  out_dir=str(tmp_path / "r0"), study=str(study))
    plan = tc["aiperf"]
    assert plan.ok, plan.reason
    for line in plan.commands:
        assert run_line(line, peers_bin=str(peer_tools), cwd=str(tmp_path)) == 0
    lap("sweep")

    # import: every request AIPerf recorded (and those it cancelled at the cut-off, which only
    # its log counts), each answered one with exactly its 16 tokens
    p = _capplan("import", "auto", *[r.folder for r in tc.runs], "--out", str(study), cwd=tmp_path)
    ev = pd.concat(pd.read_parquet(f) for f in sorted((study / "events").glob("*.parquet")))
    records = sum(sum(1 for _ in open(f)) for r in tc.runs
                  for f in Path(r.folder).rglob("profile_export.jsonl"))
    assert f"{len(ev)} requests" in p.stdout and len(ev) >= records > 0, p.stdout
    assert set(ev["run_id"]) and len(set(ev["run_id"])) == len(RATES)
    ok = ev[ev["status"] == "ok"]
    assert len(ok) >= 0.5 * len(ev)
    assert (ok["output_tokens"] == OUTPUT_TOKENS).all(), ok["output_tokens"].value_counts()
    assert (ok["input_tokens"] > PROMPT_TOKENS).all()      # the server's character tokens

    _capplan("validate", str(study), cwd=tmp_path)
    lap("import+validate")

    # envelope: a finite estimate inside the tested rates, or an honest "not reached"
    p = _capplan("envelope", str(study), "--slo", SLO, "--out", str(tmp_path / "env.json"),
                 cwd=tmp_path)
    env = json.loads((tmp_path / "env.json").read_text())
    c = env["cslo"]
    if c["status"] == "bracketed":
        assert math.isfinite(c["estimate"]) and min(RATES) <= c["estimate"] <= max(RATES)
        assert c["ci_low"] <= c["estimate"] <= c["ci_high"]
    else:
        assert c["status"] in ("≥ max tested", "< min tested"), c
        assert c["status"] in p.stdout
    assert "C_SLO estimate" in p.stdout
    lap("envelope")

    # design: the next runs, and AIPerf commands against this server — or the reason AIPerf
    # cannot send the imported workload (the server counts a prompt's characters, so the
    # imported prompt lengths vary as no AIPerf length flag can reproduce)
    _capplan("design", str(study), "--slo", SLO, "--budget-minutes", "5", "--url", url,
             "--model", llama.MODEL, "--tokenizer", tok, "--runs-dir", str(tmp_path / "r1"),
             "--out", str(tmp_path / "design.yaml"), cwd=tmp_path)
    d = yaml.safe_load((tmp_path / "design.yaml").read_text())
    assert d["next_runs"] and all(r["rate_rps"] > 0 and r["repeats"] >= 1 for r in d["next_runs"])
    ai = d["commands"]["aiperf"]
    assert (ai["commands"] and all(url in line for line in ai["commands"]) and ai["import"]) or \
        "prompt lengths" in (ai.get("reason") or ""), ai
    lap("design")

    # twin fit and check: a twin with a decode curve, and a verdict
    p = _capplan("twin", "fit", str(study), "--out", str(tmp_path / "twin.yaml"), cwd=tmp_path)
    twin = yaml.safe_load((tmp_path / "twin.yaml").read_text())
    steps = {int(k): v["value"] for k, v in twin["decode_step_ms"]["points"].items()}
    assert steps and all(math.isfinite(v) and v >= 0 for v in steps.values()), twin
    assert twin["fitted_from"]["requests"] == len(ev)
    lap("twin fit")
    p = _capplan("twin", "check", str(study), "--twin", str(tmp_path / "twin.yaml"), "--slo", SLO,
                 "--replays", "4", "--reps", "100", "--no-steady",
                 "--out", str(tmp_path / "check.json"), cwd=tmp_path)
    chk = json.loads((tmp_path / "check.json").read_text())
    assert chk["verdict"] in ("agrees", "disagrees") and "VERDICT" in p.stdout
    lap("twin check")

    # plan (the template spec, its GPUs per replica taken from the study): an honest bound is
    # planned with; one the sweep cannot support is refused with exit 2, saying why and what to
    # add; planning on the estimate (no lower-bound claim) then works when there is one
    raw = yaml.safe_load((ROOT / "templates" / "plan.yaml").read_text())
    raw["replica_group"].pop("gpus_per_replica", None)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    finite = c["status"] == "bracketed"
    p = _capplan("plan", str(study), "--spec", str(spec), "--slo", SLO, "--reps", "100",
                 "--out", str(tmp_path / "plan"), cwd=tmp_path, ok=(0, 2))
    if p.returncode == 2:
        assert "lower bound" in p.stderr and "fix:" in p.stderr, p.stderr
        p = _capplan("plan", str(study), "--spec", str(spec), "--slo", SLO, "--reps", "100",
                     "--use", "estimate", "--out", str(tmp_path / "plan"), cwd=tmp_path,
                     ok=(0,) if finite else (0, 2))
    if p.returncode == 0:
        assert list((tmp_path / "plan").glob("*.csv")) and "replica" in p.stdout.lower()
    lap("plan")

    # report: the offline HTML report of the real engine's study, planned on the estimate
    raw["capacity"]["use"] = "estimate"
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    p = _capplan("report", str(study), "--spec", str(spec), "--slo", SLO, "--reps", "100",
                 "--out", str(tmp_path / "report"), cwd=tmp_path, ok=(0,) if finite else (0, 2))
    assert p.returncode == 2 or (tmp_path / "report" / "index.html").exists()
    lap("report")
    print(f"\nreal-engine e2e: {', '.join(f'{k} {v:.0f} s' for k, v in laps.items())}; "
          f"whole test {time.perf_counter() - t0:.0f} s; {len(ev)} requests, "
          f"C_SLO {c['status']} {c['estimate']}, twin {chk['verdict']}")
