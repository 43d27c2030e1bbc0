"""One SLO-good rule: the SQL predicate (capplan.metrics.good_predicate, what summarize and the
envelope count) and the array mask (capplan.sim.evaluate.good_mask, what every simulation counts) are
built from capplan.slo.good_terms, and must call exactly the same requests good — every limit,
both TTFT clocks, both ITL statistics, and the rows with missing stamps or a failed status."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capplan.metrics import Window, good_predicate, request_view
from capplan.slo import SLO, good_terms
from capplan.study import open_study
from capplan.twin.data import STATUS_CODE
from capplan.sim.evaluate import Outcome, good_mask, itl_stats
from tests.conftest import ev

MS = 1_000_000


def _rows() -> list[dict]:
    """Requests on either side of every limit below, and the awkward ones."""
    gaps = lambda *g: [int(x * MS) for x in g]  # noqa: E731
    return [
        # ttft 900 from scheduled, 500 from sent (a generator 400 ms late)
        ev(request_id="a_late_sender", scheduled_ms=0, sent_ms=400, ttft_ms=900, e2e_ms=3000, output_tokens=21,
           itl_ns=gaps(100, 100, 140)),
        ev(request_id="b_on_time", scheduled_ms=10, ttft_ms=500, e2e_ms=2500, output_tokens=21, itl_ns=gaps(100, 90)),
        ev(request_id="c_sent_unknown", scheduled_ms=20, ttft_ms=700, e2e_ms=2000, output_tokens=11,
           sent_ns=None, itl_ns=None),
        ev(request_id="d_one_token", scheduled_ms=30, ttft_ms=400, e2e_ms=400, output_tokens=1, itl_ns=[]),
        ev(request_id="e_slow_tokens", scheduled_ms=40, ttft_ms=300, e2e_ms=4300, output_tokens=21,
           itl_ns=gaps(200, 210, 50)),
        ev(request_id="f_error", scheduled_ms=50, ttft_ms=None, e2e_ms=None, output_tokens=0, status="error",
           itl_ns=None),
        ev(request_id="g_timeout_midstream", scheduled_ms=60, ttft_ms=200, e2e_ms=None, output_tokens=5,
           status="timeout", itl_ns=gaps(100)),
        ev(request_id="h_ok_no_last", scheduled_ms=70, ttft_ms=200, e2e_ms=None, output_tokens=5, itl_ns=gaps(100)),
        ev(request_id="i_ok_no_first", scheduled_ms=80, ttft_ms=None, e2e_ms=900, output_tokens=5, itl_ns=None),
        ev(request_id="j_rejected", scheduled_ms=90, ttft_ms=None, e2e_ms=None, output_tokens=0, status="rejected",
           itl_ns=None),
        ev(request_id="k_at_limit", scheduled_ms=100, sent_ms=150, ttft_ms=600, e2e_ms=2600, output_tokens=21,
           itl_ns=gaps(100, 120)),
    ]


SLOS = [
    "ttft_ms=600", "ttft_ms=600,ttft_from=sent", "ttft_ms=550,ttft_from=sent", "ttft_ms=800,ttft_from=sent",
    "tpot_ms=100", "tpot_ms=120", "itl_ms=130", "itl_ms=130,itl_stat=max", "itl_ms=205,itl_stat=max",
    "e2e_ms=2600", "e2e_ms=5000", "ttft_ms=2000,tpot_ms=100,itl_ms=150,e2e_ms=3000,ttft_from=sent",
    "ttft_ms=2000,tpot_ms=200,itl_ms=500,itl_stat=max,e2e_ms=10000",
]


def _outcome(df) -> tuple[Outcome, np.ndarray]:
    """The frame as the twin holds a run: int64 ns, −1 missing, status codes, ITL statistics."""
    ns = lambda c: df[c].fillna(-1).astype(np.int64).to_numpy()  # noqa: E731
    lens = df["itl_ns"].map(lambda g: 0 if g is None else len(g)).to_numpy()
    off = np.r_[0, np.cumsum(lens)]
    val = np.concatenate([np.asarray([] if g is None else g, dtype=np.int64) for g in df["itl_ns"]])
    has = df["itl_ns"].map(lambda g: g is not None).to_numpy()
    p99, mx = itl_stats(off, val, has)
    o = Outcome(ns("scheduled_ns"), ns("first_token_ns"), ns("last_token_ns"),
                df["output_tokens"].astype(np.int64).to_numpy(),
                df["status"].map(STATUS_CODE).astype(np.int8).to_numpy(), p99, mx)
    return o, ns("sent_ns")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from capplan.io import manifest_dict, write_study
    from tests.conftest import events_frame

    path = write_study(tmp_path_factory.mktemp("good") / "s",
                       manifest_dict("good", [{"run_id": "r1", "offered_rps": 1.0}]), events_frame(_rows()))
    return open_study(path)


@pytest.mark.parametrize("slo_text", SLOS)
def test_sql_and_array_masks_agree(study, slo_text):
    slo = SLO.parse(slo_text)
    view = request_view(study, Window.of(study, 0.0))
    pred, params = good_predicate(slo)
    df = study.sql(f"SELECT request_id, {pred} AS good, scheduled_ns, sent_ns, first_token_ns, last_token_ns, "
                     f"output_tokens, status, itl_ns FROM {view} ORDER BY request_id", params).df()
    df["itl_ns"] = [None if g is None or g is pd.NA else list(g) for g in df["itl_ns"]]
    o, sent = _outcome(df)
    sql = df["good"].fillna(False).astype(bool).to_numpy()
    arr = good_mask(o, slo, sent)
    assert dict(zip(df.request_id, arr)) == dict(zip(df.request_id, sql))


def test_the_rule_by_hand(study):
    """The cases the comparison above covers, decided by hand."""
    view = request_view(study, Window.of(study, 0.0))

    def good(text):
        pred, params = good_predicate(SLO.parse(text))
        d = study.sql(f"SELECT request_id FROM {view} WHERE {pred} ORDER BY request_id", params).df()
        return set(d.request_id)

    ok_with_first = {"a_late_sender", "b_on_time", "c_sent_unknown", "d_one_token", "e_slow_tokens", "h_ok_no_last",
                     "k_at_limit"}
    # TTFT from scheduled: a (900) and c (700) miss 600; k sits on the limit and passes
    assert good("ttft_ms=600") == ok_with_first - {"a_late_sender", "c_sent_unknown"}
    # from sent: a is 500, k is 550; c has no send stamp, so 700 from scheduled
    assert good("ttft_ms=600,ttft_from=sent") == ok_with_first - {"c_sent_unknown"}
    assert good("ttft_ms=550,ttft_from=sent") == ok_with_first - {"c_sent_unknown"}
    assert good("ttft_ms=540,ttft_from=sent") == ok_with_first - {"c_sent_unknown", "k_at_limit"}
    # E2E: h has no last token, so no E2E: it fails any E2E limit
    assert "h_ok_no_last" not in good("e2e_ms=100000")
    # TPOT (last − first) / (out − 1): a 2100 / 20 = 105, c 1300 / 10 = 130, e 4000 / 20 = 200 miss 100;
    # b and k are 100, on the limit; d (one token) and h (no last token) have none and pass
    assert good("tpot_ms=100") == ok_with_first - {"a_late_sender", "c_sent_unknown", "e_slow_tokens"}
    # ITL max: a 140, b 100, e 210, k 120; none for c (no list) and d (empty): they pass
    assert good("itl_ms=130,itl_stat=max") == ok_with_first - {"a_late_sender", "e_slow_tokens"}


def test_terms_name_the_view_columns():
    terms = good_terms(SLO.parse("ttft_ms=1,tpot_ms=2,itl_ms=3,itl_stat=max,e2e_ms=4,ttft_from=sent"))
    assert [(t.column, t.limit_ms, t.missing_passes) for t in terms] == [
        ("ttft_sent_ms", 1.0, False), ("tpot_ms", 2.0, True), ("itl_max_ms", 3.0, True), ("e2e_ms", 4.0, False)]
