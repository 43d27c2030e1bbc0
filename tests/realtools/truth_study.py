"""A small study of the queueing replica written from its independent simulation (queue_truth),
so the twin's fast tests can fit a server capplan did not generate without a load tool.

Each run: Poisson arrivals at one rate for ``duration_s`` from an idle replica, every request run
to completion (as AIPerf's grace period does at these rates), the events a streaming client sees
with exact stamps: scheduled = arrival, first and last token, and one gap per output token
(``itl_ns``). No admission stamps — a load tool does not see them. The replica's server was shown
to reproduce this simulation to < 0.1 ms (tests/test_queue_server.py), so this is the replica's
study without the client's jitter. Imports nothing from capplan.sim or capplan.twin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tests.realtools import queue_truth as qt
from tests.realtools.params import EngineParams


def uniform_prompts(lo: int, hi: int):
    """Prompt lengths uniform on [lo, hi] tokens (a callable for queue_truth)."""
    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(lo, hi + 1, size=n)

    return draw


def truth_events(run_id: str, rate_rps: float, duration_s: float, params: EngineParams, *, seed: int,
                 prompt_tokens=64, output_tokens: int = 32) -> pd.DataFrame:
    """``prompt_tokens``: one length or a callable ``(rng, n) -> lengths``."""
    rng = np.random.default_rng([seed, int(round(rate_rps * 1000))])
    arr = qt.poisson_arrivals(rate_rps, duration_s, rng)
    p_tok = np.asarray(prompt_tokens(rng, len(arr)) if callable(prompt_tokens) else
                       np.full(len(arr), int(prompt_tokens)), np.int64)
    tr = qt.simulate(arr, p_tok, output_tokens, params)
    ns = lambda s: np.rint(np.asarray(s) * 1e9).astype(np.int64)  # noqa: E731
    itl = [np.diff(ns(tr.token_times_s(i))).tolist() for i in range(len(arr))]
    return pd.DataFrame({
        "run_id": run_id, "request_id": [f"{run_id}-{i}" for i in range(len(arr))],
        "scheduled_ns": ns(arr), "sent_ns": ns(arr), "first_token_ns": ns(tr.first_token_s),
        "last_token_ns": ns(tr.last_token_s), "input_tokens": p_tok,
        "output_tokens": tr.output_tokens.astype(np.int64), "status": "ok", "itl_ns": itl})


def write_truth_study(dest, rates, *, duration_s: float = 60.0, params: EngineParams = EngineParams(),
                      seed: int = 0, prompt_tokens=64, output_tokens: int = 32,
                      system: dict | None = None) -> Path:
    """One run per rate (``r01`` …) as a capplan study at ``dest``; ``system`` is study.yaml's
    system block (e.g. an engine configuration to read)."""
    from capplan.io import manifest_dict, write_study

    frames, runs = [], []
    for k, rate in enumerate(rates, 1):
        rid = f"r{k:02d}"
        frames.append(truth_events(rid, float(rate), duration_s, params, seed=seed,
                                   prompt_tokens=prompt_tokens, output_tokens=output_tokens))
        runs.append({"run_id": rid, "offered_rps": float(rate), "duration_s": float(duration_s),
                     "warmup_s": 0.0})
    sysb = {"gpu": "cpu", "gpus_per_replica": 1, "tp": 1, "pp": 1, "replicas": 1,
            "engine": "tests.realtools.queue_server", **(system or {})}
    wl = {"arrival": "poisson", "endpoint": "chat", "streaming": True}
    return write_study(dest, manifest_dict("queue-replica", runs, system=sysb, workload=wl),
                       pd.concat(frames, ignore_index=True))
