"""cost.study_facts: hand-computed good fractions per level, and a caller's warm-up kept."""

from __future__ import annotations

from capplan import open_study
from capplan.cost import study_facts
from capplan.metrics import Window, request_view

from conftest import ev


def _study(make_study):
    # one run, 10 requests 1 s apart; the first 3 (t < 3 s) are slow, the rest meet TTFT ≤ 500 ms
    rows = [ev("r1", f"q{i}", scheduled_ms=1000.0 * i, ttft_ms=900.0 if i < 3 else 100.0,
               e2e_ms=1200.0, output_tokens=5 + i) for i in range(10)]
    return open_study(make_study(rows, runs=[{"run_id": "r1", "offered_rps": 1.0,
                                              "duration_s": 10, "warmup_s": 0}]))


def test_good_counts_and_tokens_by_hand(make_study):
    facts = study_facts(_study(make_study), "ttft_ms=500")
    (lv,) = facts.levels
    assert (lv.offered_requests, lv.good_requests) == (10, 7)
    assert lv.good_output_tokens == sum(5 + i for i in range(3, 10))


def test_warmup_override_is_used_and_kept(make_study):
    study = _study(make_study)
    facts = study_facts(study, "ttft_ms=500", warmup_s={"r1": 2.5})
    (lv,) = facts.levels
    assert (lv.offered_requests, lv.good_requests) == (7, 7)  # t = 3..9 s
    # the caller's window names its own view; the manifest window's view is another one
    view = request_view(study, Window.of(study, {"r1": 2.5}))
    n = study.sql(f"SELECT count(*) FROM {view} WHERE in_window").fetchall()[0][0]
    assert n == 7
    base = request_view(study, Window.of(study))
    assert base != view
    assert study.sql(f"SELECT count(*) FROM {base} WHERE in_window").fetchall()[0][0] == 10
    assert study.sql(f"SELECT count(*) FROM {view} WHERE in_window").fetchall()[0][0] == 7
