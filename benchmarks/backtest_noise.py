"""The forecast back-test's error against a known noise level (the calibration of
tests/test_forecast_backtest.py::test_backtest_error_matches_the_known_noise).

Series: 42 months, truth 100 + t + 15·sin(2πt/12) req/s, plus N(0, σ²) noise per month; the
back-test fits the plan's Holt–Winters at 6 quarter ends (2023Q4 … 2025Q1) and forecasts the
next quarter's peak. The best possible forecast of a quarter's peak is E[max of its 3 months'
truth + noise]; its expected MAPE follows from the truth and σ alone (Monte Carlo). For each noise
seed the script prints the back-tested MAPE, the ideal forecast's MAPE on the same realisation,
the expected ideal MAPE, u and the under-forecast of the planned peak; then the ratio back-test /
expected ideal over all seeds (pooled and sorted).

    OPENBLAS_NUM_THREADS=1 python benchmarks/backtest_noise.py --sigma 4 --seeds 40

(single-threaded BLAS: scipy's L-BFGS-B, which fits the model, runs ~5× faster on a busy box.)
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from capplan.plan.forecast import backtest, history_series


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigma", type=float, default=4.0)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--months", type=int, default=42)
    a = ap.parse_args()
    months = pd.date_range("2022-01-01", periods=a.months, freq="MS", tz="UTC")
    t = np.arange(len(months))
    truth = 100 + 1.0 * t + 15 * np.sin(2 * np.pi * t / 12)
    q = months.tz_localize(None).to_period("Q")
    rng = np.random.default_rng(123)
    out = []
    print("seed  mape  ideal_same  ideal_expected  u  under_forecast  origins")
    for seed in range(a.seeds):
        y = truth + np.random.default_rng(seed).normal(0, a.sigma, len(t))
        bt = backtest(history_series(months, y), horizon_quarters=1, reps=1000, seed=0)
        same, expected = [], []
        for label, actual in zip(bt.rows.quarter, bt.rows.actual_peak_rps):
            m = truth[q == pd.Period(label, "Q")]
            peaks = (m + rng.normal(0, a.sigma, (200_000, len(m)))).max(axis=1)
            same.append(abs(actual - peaks.mean()) / actual)
            expected.append(np.mean(np.abs(peaks - peaks.mean()) / peaks))
        out.append((bt.mape, np.mean(same), np.mean(expected), bt.u, bt.under_forecast))
        print(seed, " ".join(f"{v:.4f}" for v in out[-1]), len(bt.origins), flush=True)
    r = np.array(out)
    ratio = r[:, 0] / r[:, 2]
    print(f"pooled back-test MAPE / expected ideal MAPE: {r[:, 0].mean() / r[:, 2].mean():.3f}")
    print("sorted ratios:", " ".join(f"{v:.2f}" for v in np.sort(ratio)))
    print(f"u > 0 in {(r[:, 3] > 0).sum()} of {len(r)} series, largest {r[:, 3].max():.4f}")


if __name__ == "__main__":
    main()
