"""Target mixes from production traces and bucket tables (docs/mix.md, "Target mix")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capplan.errors import SpecError
from capplan.mix import Buckets, load_target, load_target_periods, target_from_table, target_from_trace
from capplan.mix.core import kish_ess, reweight_run

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def _trace(tmp_path, rows, name="trace.parquet"):
    df = pd.DataFrame(rows)
    p = tmp_path / name
    (df.to_parquet(p) if name.endswith(".parquet") else df.to_csv(p, index=False))
    return p


def test_day_and_peak_hour_mix_by_hand(tmp_path):
    # hour 0: 2 short + 1 long; hour 1 (the peak): 1 short + 3 long; input edge 1000
    t0 = pd.Timestamp("2026-03-02T09:00:00Z")
    rows = [(0, 100), (600, 200), (1200, 3000), (3700, 150), (3800, 5000), (3900, 4000), (4000, 2000)]
    p = _trace(tmp_path, [{"timestamp": t0 + pd.Timedelta(seconds=s), "input_tokens": i, "output_tokens": 10}
                          for s, i in rows])
    b = Buckets(input_edges=(1000,))
    mixes, notes = load_target_periods(p, b)
    assert list(mixes) == ["day", "peak_hour"] and notes == ()
    day = mixes["day"].frame.set_index("input_bucket")["share"]
    assert day[0] == pytest.approx(3 / 7) and day[1] == pytest.approx(4 / 7)
    peak = mixes["peak_hour"]
    assert peak.period == "peak hour 2026-03-02 10:00–11:00 UTC"
    assert peak.frame.set_index("input_bucket")["share"].to_dict() == {0: 0.25, 1: 0.75}
    assert peak.n_requests == 4
    assert list(peak.frame["label"]) == ["input <1000", "input ≥1000"]


def test_csv_epoch_milliseconds_and_tenant_cells(tmp_path):
    rows = [{"ts": 1_700_000_000_000 + k * 1000, "prompt_tokens": 500 + k, "completion_tokens": 300,
             "tenant": "a" if k < 3 else None} for k in range(4)]
    p = _trace(tmp_path, rows, "t.csv")
    m = target_from_trace(p, Buckets(input_edges=(2000,), output_edges=(256,), tenant=True),
                          time_column="ts", period="peak_hour")
    f = m.frame
    assert list(f["tenant"]) == ["(none)", "a"] and list(f["requests"]) == [1, 3]
    assert set(f["output_bucket"]) == {1}


def test_azure_trace_columns_are_recognised():
    p = TRACES / "AzureLLMInferenceTrace2023_conv.csv"
    if not p.is_file():
        pytest.skip("public traces not present (../shared/data/traces)")
    m = target_from_trace(p, Buckets(input_edges=(1024, 4096)))
    df = pd.read_csv(p)
    want = np.bincount(np.searchsorted([1024, 4096], df["ContextTokens"], side="right"), minlength=3)
    assert list(m.frame["requests"]) == list(want)


def test_missing_columns_and_files_are_refused(tmp_path):
    p = _trace(tmp_path, [{"foo": 1}])
    with pytest.raises(SpecError, match="no input-token column"):
        target_from_trace(p)
    with pytest.raises(SpecError, match="not found"):
        target_from_trace(tmp_path / "nope.parquet")
    q = _trace(tmp_path, [{"input_tokens": 5}], "q.parquet")
    with pytest.raises(SpecError) as e:
        target_from_trace(q, period="peak_hour")
    assert e.value.field == "time_column"
    # the periods of a trace without timestamps: the day's, the peak hour said to be missing;
    # the peak hour alone is an error (capplan mix --period peak_hour)
    mixes, notes = load_target_periods(q)
    assert list(mixes) == ["day"] and notes == ("the target has no timestamps: the day's mix only",)
    with pytest.raises(SpecError) as e:
        load_target_periods(q, periods=("peak_hour",))
    assert e.value.field == "time_column"


def test_bucket_table(tmp_path):
    p = tmp_path / "mix.csv"
    p.write_text("input_min,input_max,output_min,output_max,share\n"
                 "0,1024,0,256,0.3\n0,1024,256,,0.2\n1024,,0,256,0.1\n1024,,256,,0.4\n")
    m = load_target(p)
    assert m.period == "table" and m.buckets.input_edges == (1024.0,) and m.buckets.output_edges == (256.0,)
    assert m.shares() == {(0, 0): 0.3, (0, 1): 0.2, (1, 0): 0.1, (1, 1): 0.4}
    bad = tmp_path / "bad.csv"
    bad.write_text("input_min,input_max,share\n0,1024,0.5\n0,4096,0.5\n")
    with pytest.raises(SpecError, match="spans several buckets"):
        target_from_table(bad)
    neg = tmp_path / "neg.csv"
    neg.write_text("input_min,input_max,share\n0,1024,-1\n")
    with pytest.raises(SpecError, match="row 1"):
        target_from_table(neg)


class _Fixed:
    """A 'resample' that returns fixed per-replicate unit weights (reps × units)."""

    def __init__(self, C):
        self.C = np.asarray(C, float)

    def sums(self, v):
        return self.C @ np.asarray(v, float)


def test_reweight_run_by_hand():
    # 2 units × 2 cells. cell 0: n (10, 10), good (9, 10); cell 1: n (2, 3), good (1, 1)
    n = np.array([[10, 2], [10, 3]], float)
    g = np.array([[9, 1], [10, 1]], float)
    w = np.array([0.5, 0.5])
    R = _Fixed([[1, 1], [2, 0], [0, 2]])
    out = reweight_run(R, n, g, w, rng=np.random.default_rng(0))
    assert out.point == pytest.approx(0.5 * 19 / 20 + 0.5 * 2 / 5)
    # replicate 2 draws unit 0 twice: cell 0 18/20, cell 1 2/4
    assert out.replicates[1] == pytest.approx(0.5 * 0.9 + 0.5 * 0.5)
    assert out.replicates[2] == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 6)
    assert out.ess == pytest.approx(1 / (0.25 / 20 + 0.25 / 5)) == kish_ess(w, [20, 5])
    # target = tested mix (20:5) ⇒ ESS = n
    assert kish_ess([0.8, 0.2], [20, 5]) == pytest.approx(25)
