"""The coverage benchmark against the real simulator, in miniature (benchmarks/coverage_synth.py
runs it at full size: docs/envelope.md "Coverage")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("coverage_synth",
                                                  ROOT / "benchmarks" / "coverage_synth.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["coverage_synth"] = mod  # its dataclasses resolve their module
    spec.loader.exec_module(mod)
    return mod


def test_small_design_rows(bench):
    """Four sweeps of the small design (truth from the fixture's header): the default bound
    holds on each, the old method's row is there, and the table prints."""
    methods = ("run-effect", "within-run")
    results = [bench.one_sweep(("small", k, 5000, 200, 0, methods)) for k in range(4)]
    tr = {"capacity": 2.589, "se": 0.01, "kind": "this protocol"}
    s = bench.summarize(results, tr)
    new, old = s["run-effect"], s["within-run"]
    assert new["coverage_lower_bound"] == 1.0
    assert new["mean_shortfall"] < 0.25
    for r in results:
        c = r["run-effect"]
        assert c["ci_low"] <= c["estimate"] <= c["ci_high"]
    assert old["share_honest"] == 0.0  # the within-run bound is labelled optimistic
    text = bench.table({"small": s})
    assert "within-run (old)" in text and "| small | run-effect | 4 |" in text
    assert bench.TWIN not in s


def test_twin_row(bench, monkeypatch):
    """The twin method fits a twin to the sweep's own events and holds τ at or above the twin's:
    its row is measured only where the design asks for it, and is summarised beside the
    others."""
    from dataclasses import replace

    monkeypatch.setitem(bench.DESIGNS, "small_twin",
                        replace(bench.DESIGNS["small"], name="small_twin", twin=True))
    r = bench.one_sweep(("small_twin", 0, 5000, 100, 0, bench.METHODS))
    c = r[bench.TWIN]
    assert c["ci_low"] <= c["estimate"] <= c["ci_high"]
    # the twin holds τ at or above the sweep's own estimate
    assert c["tau"] is not None and c["tau"] >= r["run-effect"]["tau"]
    s = bench.summarize([r], {"capacity": 2.589, "se": 0.01, "kind": "this protocol"})
    assert "| small_twin | run-effect+twin | 1 |" in bench.table({"small_twin": s})


def test_designs_are_well_formed(bench):
    for name, d in bench.DESIGNS.items():
        cfg = d.config(1)
        plans = d.plans(cfg)
        assert plans and len({p.run_id for p in plans}) == len(plans)
        if name.endswith("_rep"):
            assert max(p.repeat for p in plans) == 2
    mins = sum(p.duration_s for p in bench.DESIGNS["demo"].plans(bench.DESIGNS["demo"].config(1)))
    d = bench.DESIGNS["designed"]
    coarse = sum(p.duration_s for p in d.plans(d.config(1)))
    assert coarse + d.rounds * d.round_minutes * 60 <= mins  # ≤ the demo's load-test time
