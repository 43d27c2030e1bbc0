"""Log-bucket keys and quantile reading against hand-computed values.

With α = 1/3, γ = (1+α)/(1−α) = 2 exactly, so keys are ceil(log2 x) and every number below
can be checked by hand."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest

from capplan import sketch

A2 = 1.0 / 3.0  # γ = 2


def test_gamma_and_keys_by_hand():
    assert sketch.gamma_of(A2) == pytest.approx(2.0)
    assert sketch.gamma_of(0.005) == pytest.approx(1.005 / 0.995)
    # bucket k covers (2^(k-1), 2^k]
    assert sketch.keys([1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 0.5, 0.26], A2).tolist() == [0, 1, 1, 2, 2, 3, -1, -1]
    # zero and negatives share the bucket of MIN_VALUE = 1e-3: ceil(log2 1e-3) = ceil(-9.97) = -9
    assert sketch.keys([0.0, -5.0], A2).tolist() == [-9, -9]


def test_bucket_value_is_within_alpha():
    assert sketch.bucket_value(2, A2) == pytest.approx(8 / 3)  # 2·2²/(1+2)
    a = 0.005
    x = np.exp(np.linspace(-3, 12, 5001))
    rep = sketch.bucket_value(sketch.keys(x, a), a)
    assert np.max(np.abs(rep - x) / x) <= a + 1e-12


def test_histogram_and_quantiles_by_hand():
    k0, c = sketch.histogram([1.0, 2.0, 3.0, 4.0], A2)
    assert k0 == 0 and c.tolist() == [1, 1, 2]
    # p=0.5: rank 2 reaches the end of bucket 1 → 2^1 = 2
    # p=0.75: rank 3 is half-way (f = 0.5) into bucket 2 (2, 4] → 2^(1+0.5) = 2.828…
    # p=1: rank 4 ends bucket 2 → 4;  p=0.25: rank 1 ends bucket 0 → 1
    q = sketch.quantile_from_counts(c, k0, [0.25, 0.5, 0.75, 1.0], A2)
    assert q.tolist() == pytest.approx([1.0, 2.0, 2 ** 1.5, 4.0])
    assert sketch.quantile_from_counts(c, k0, 0.75, A2) == pytest.approx(2 ** 1.5)


def test_tail_histogram_with_below_count():
    # same data, histogram only holds buckets ≥ 2 and says 2 values lie below
    q = sketch.quantile_from_counts(np.array([2.0]), 2, [0.75, 1.0, 0.25], A2, below=2.0)
    assert q[0] == pytest.approx(2 ** 1.5) and q[1] == pytest.approx(4.0)
    assert math.isnan(q[2])  # rank falls below the held buckets


def test_batched_rows_equal_single_rows():
    rng = np.random.default_rng(0)
    h = rng.integers(0, 20, size=(7, 40)).astype(float)
    both = sketch.quantile_from_counts(h, -3, [0.5, 0.99], 0.01)
    for r in range(7):
        assert both[r] == pytest.approx(sketch.quantile_from_counts(h[r], -3, [0.5, 0.99], 0.01))


def test_interpolated_quantile_close_to_exact():
    x = np.random.default_rng(1).lognormal(6, 1, 200_000)
    k0, c = sketch.histogram(x)
    for p in (0.5, 0.9, 0.99, 0.999):
        exact = np.quantile(x, p, method="inverted_cdf")
        # the documented guarantee is relative error ≤ α (0.5 %); interpolation does better
        # except in the sparse extreme tail
        tol = 2e-3 if p < 0.999 else sketch.DEFAULT_ALPHA
        assert sketch.quantile_from_counts(c, k0, p) == pytest.approx(exact, rel=tol)


def test_sql_key_matches_numpy():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.lognormal(3, 2, 2000), [0.0, 1e-6, 1.0, 2000.0]])
    con = duckdb.connect()
    con.register("t", {"v": x})
    from capplan.reduce.sql import key_sql  # the reduction's SQL form of sketch.keys

    ln_g = math.log(sketch.gamma_of(0.005))
    k_min = int(sketch.keys(np.array([sketch.MIN_VALUE]), 0.005)[0])
    k_sql = con.execute(f"SELECT {key_sql('v', 'BIGINT')} FROM t", [k_min, ln_g]).fetchnumpy()
    col = next(iter(k_sql.values()))
    assert np.array_equal(np.asarray(col, dtype=np.int64), sketch.keys(x, 0.005))


def test_bad_alpha():
    with pytest.raises(ValueError):
        sketch.gamma_of(1.5)
