"""Replay a measured study (written by ``capplan import``) through queue_truth on the runs' own
send times, and say how far the measured TTFT / TPOT are from the model, per run. This is how
a load-test tool's run against queue_server is checked: if the tool's numbers match the truth
on the same arrivals, the truth's C_SLO is the C_SLO that tool should have found.

    python -m tests.realtools.replay /tmp/qs/study --slots 32
"""

from __future__ import annotations

import argparse
import glob
import os

import numpy as np
import pandas as pd

from tests.realtools.params import EngineParams
from tests.realtools.queue_truth import simulate


def replay_study(study: str, params: EngineParams, *, at: str = "sent_ns") -> pd.DataFrame:
    """Per run: requests, median and p95 |measured - truth| of TTFT and TPOT in ms. The truth is
    replayed on ``at`` (sent_ns: what the server saw, minus the network; scheduled_ns: the
    intended arrivals) and TTFT is measured from the same stamp on both sides."""
    ev = pd.concat(pd.read_parquet(f) for f in sorted(glob.glob(os.path.join(study, "events", "*.parquet"))))
    out = []
    for run, g in ev.groupby("run_id"):
        g = g[g["status"] == "ok"].sort_values(at)
        t = g[at].to_numpy(float) / 1e9
        tr = simulate(t - t[0], g["input_tokens"].to_numpy(), g["output_tokens"].to_numpy(), params)
        ttft = (g["first_token_ns"].to_numpy(float) - g[at].to_numpy(float)) / 1e6
        n = g["output_tokens"].to_numpy(float)
        tpot = (g["last_token_ns"].to_numpy(float) - g["first_token_ns"].to_numpy(float)) / 1e6 / (n - 1)
        e1, e2 = np.abs(ttft - tr.ttft_ms), np.abs(tpot - tr.tpot_ms)
        out.append({"run_id": run, "requests": len(g), "ttft_ms_truth_p50": np.median(tr.ttft_ms),
                    "ttft_ms_measured_p50": np.median(ttft),
                    "ttft_abs_err_ms_p50": np.median(e1), "ttft_abs_err_ms_p95": np.quantile(e1, 0.95),
                    "tpot_abs_err_ms_p50": np.nanmedian(e2), "tpot_abs_err_ms_p95": np.nanquantile(e2, 0.95)})
    return pd.DataFrame(out)


def main(argv=None) -> None:
    d = EngineParams()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study")
    ap.add_argument("--at", default="sent_ns", choices=("sent_ns", "scheduled_ns"))
    for k, v in d.to_dict().items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v)
    a = ap.parse_args(argv)
    params = EngineParams(**{k: getattr(a, k) for k in d.to_dict()})
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(replay_study(a.study, params, at=a.at).round(2).to_string(index=False))


if __name__ == "__main__":
    main()
