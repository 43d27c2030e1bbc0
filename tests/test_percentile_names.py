"""One spelling of a percentile column, built in one place (capplan.contract)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capplan import contract as C

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("p, name, label", [
    (0.5, "p50", "p50"), (0.9, "p90", "p90"), (0.95, "p95", "p95"), (0.99, "p99", "p99"),
    (0.995, "p99_5", "p99.5"), (0.999, "p99_9", "p99.9"), (0.9999, "p99_99", "p99.99"),
])
def test_names_and_labels(p, name, label):
    assert C.pct_name(p) == name and C.pct_label(p) == label
    assert C.pct_col("ttft", p) == f"ttft_{name}_ms"
    assert C.pct_col("ttft", p, unit="") == f"ttft_{name}"
    assert C.pct_col("gen_lag", p, unit="s") == f"gen_lag_{name}_s"


def test_column_names_are_plain_identifiers():
    for p in C.PERCENTILES:
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", C.pct_col("ttft", p))


def test_ci_columns():
    assert C.ci_cols(C.pct_col("tpot", 0.99, unit="")) == ("tpot_p99_ci_low", "tpot_p99_ci_high")


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, 99])
def test_a_percentile_is_a_probability(bad):
    with pytest.raises(ValueError, match="probability in \\(0, 1\\)"):
        C.pct_name(bad)


def test_summary_and_envelope_share_the_spelling(tmp_path):
    """The p99.9 column of `summarize` and of the envelope's run table is the same name."""
    from capplan.envelope import fit_envelope
    from capplan.metrics import summarize
    from capplan.study import open_study
    from capplan.sim import generate_study, preset

    cfg = preset("small").with_(rates=(1.0, 2.0), duration_s=20.0, warmup_s=0.0)
    path, _ = generate_study(cfg, tmp_path / "s", workers=1)
    study = open_study(path)
    col = C.pct_col("ttft", 0.999)
    assert col in summarize(study).to_frame().columns
    env = fit_envelope(study, "ttft_ms=2000,attainment=0.9", reps=20)
    assert col in env.runs.columns and "ttft_p99_ci_low" in env.runs.columns


#: modules not yet on contract.pct_col (none left)
NOT_YET: set[str] = set()


def test_no_module_spells_a_percentile_column_by_hand():
    """f-strings like f"{m}_p{q}_ms" or f"p{100 * p:g}" re-invent the name; use
    contract.pct_col / pct_name / pct_label."""
    pat = re.compile(r"""f["'][^"'\n]*(?:_p\{|\bp\{)""")
    bad = []
    for f in sorted((ROOT / "capplan").rglob("*.py")):
        rel = str(f.relative_to(ROOT))
        if rel == "capplan/contract.py" or rel in NOT_YET:
            continue
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if pat.search(line):
                bad.append(f"{rel}:{i}: {line.strip()}")
    assert not bad, "percentile names built by hand:\n" + "\n".join(bad)
