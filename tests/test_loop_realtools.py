"""The loop closes with real load tools (issue 25): real AIPerf 0.13 and GuideLLM 0.8.1 from the
package index drive the project's own queueing server (tests/realtools: its capacity is known
from an independent simulation, not from capplan.sim); capplan imports, fits, designs, and
every command it prints runs exactly as printed, until the lower bound is honest.

Short in the suite (a small server, 20-s runs, ≤ 3 rounds); benchmarks/loop_realtools.py runs
many loops with different seeds. Marker ``realtools``: needs scripts/peer_tools.sh's venv
(the ``peer_tools`` fixture; CI fails rather than skips without it)."""

from __future__ import annotations

import pytest

from tests.realtools import queue_truth as qt
from tests.realtools.loop import loop
from tests.realtools.params import SMALL
from tests.realtools.queue_server import start_subprocess, stop_subprocess

pytestmark = [pytest.mark.realtools, pytest.mark.slow]

#: The small replica (8 slots, one prefill lane) made faster, with the SLO scaled alike, so
#: 15-s runs hold 100–360 requests (a run of 30 clean requests cannot show 95 % attainment: its
#: Clopper–Pearson bound is 0.90) and the crossing sits where runs from idle are at steady
#: state (with TTFT ≤ 1 s at full speed the runs near it are still settling and the honest
#: loop asks for 300-s runs). AIPerf drives it 4× faster (truth 17.5 req/s); GuideLLM 2× (truth
#: 8.7 req/s): above ≈ 16 req/s its sends lag the schedule by > 50 ms at p99 on a 2-core box,
#: and capplan rightly excludes such runs (the client, not the server, was the bottleneck).
CONFIGS = {
    "aiperf": (SMALL.with_(time_scale=0.25), "ttft_ms=75,tpot_ms=20,attainment=0.95",
               (8.0, 12.0, 16.0, 20.0, 24.0)),
    "guidellm": (SMALL.with_(time_scale=0.5), "ttft_ms=150,tpot_ms=40,attainment=0.95",
                 (5.0, 7.0, 9.0, 11.0, 13.0)),
}
DURATION_S = 15.0
#: load-test minutes the loop may use in all (coarse sweep and rounds): 1 GuideLLM loop of 4 in
#: the benchmark found its runs near the crossing still settling and was asked for three 300-s
#: runs (16 min in all); the AIPerf loops used 1.8–5 min
BUDGET_MINUTES = 20.0


def _server(params):
    """The replica; every prompt counts as 64 tokens whatever the client's tokenizer makes of
    it, so the truth below is the server's."""
    return start_subprocess(params, extra_args=("--fixed-prompt-tokens", "64"))


def _truth(params, slo_text):
    """The protocol truth: mean attainment of 15-s runs from idle, every request answered
    (AIPerf's 10-s grace; GuideLLM's runs bounded by request count), 300 runs per rate."""
    kv = dict(kv.split("=") for kv in slo_text.split(","))
    slo = qt.SLO(float(kv["ttft_ms"]), float(kv["tpot_ms"]), float(kv["attainment"]))
    _, runs = qt.true_cslo(slo, params=params, duration_s=DURATION_S, runs=300,
                           horizon_s=600.0, lo_rps=1.0, hi_rps=60.0, tol_rps=0.05)
    return runs


@pytest.mark.parametrize("tool", ["aiperf", "guidellm"])
def test_the_loop_reaches_an_honest_bound_with_a_real_client(tool, peer_tools, tmp_path):
    params, slo, coarse = CONFIGS[tool]
    url, proc = _server(params)
    tries = []
    try:
        # the loop reached "honest" within 3 rounds in 9 of 10 AIPerf loops of the benchmark
        # (docs/design.md): a loop that does not is one unlucky draw, not a bug, so a second,
        # independent loop (new seeds) gets one try before the test fails
        for seed in (1, 2):
            res = loop(tool, url=url, model="mock-llm",
                       tokenizer=str(peer_tools.parent / "tokenizer"), slo=slo,
                       coarse_rates=coarse, duration_s=DURATION_S, workdir=tmp_path / f"s{seed}",
                       peers_bin=str(peer_tools), seed=seed, grace_s=10.0, budget_minutes=3.0,
                       total_minutes=BUDGET_MINUTES,
                       max_rounds=3, reps=400)
            tries.append(res)
            if res.honest:
                break
    finally:
        stop_subprocess(proc)
    # every run sent was the tool's printed command line (run unchanged, exit 0: a failing
    # one stops the loop), imported into the study
    sent = [r for t in tries for r in t.runs if r.state == "imported"]
    assert sent and all(f" {tool} " in f" {r.command} " for r in sent)
    truth = _truth(params, slo)
    text = "\n".join(t.to_text() for t in tries) + f"\ntruth {truth.to_text()}"
    assert res.honest, text
    assert len(res.rounds) - 1 <= 3 and res.minutes <= BUDGET_MINUTES, text
    # one loop is one draw of a 95 % bound: it may land above the truth in 1 loop of 20 when
    # calibrated, so this test allows 5 % over the truth (a bound far above it — the 16 % of the
    # bug this loop found — still fails) and benchmarks/loop_realtools.py measures how often the
    # bound is at or below the truth over many loops (docs/design.md)
    assert res.final.lower_bound <= 1.05 * truth.rate_rps + 2 * truth.se_rps, text
