"""capplan loadtest (capplan/loadtest.py): the probe stops a bad server before any load, the loop
against a synth model ends honest, Ctrl-C and --resume end in the study of an uninterrupted run,
the caps hold, and the tool's process group is stopped by its id."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from capplan.cli import main
from capplan.twin import load_system
from capplan.errors import SpecError
from capplan.loadtest import (Bound, InterruptedLoadtest, LiveChart, Round, RunRecord, Spec,
                              SynthTarget, load_record, rounds_figure_dict, run_in_group,
                              run_loadtest)

FIX = Path(__file__).parent / "fixtures"
MODEL = FIX / "synth_small_sweep.yaml"
SLO = "ttft_ms=2000,tpot_ms=100,attainment=0.99"
#: true C_SLO of the fixture's 300-s protocol (the fixture's header)
TRUTH_RPS = 2.589
#: the seed of the loop the tests run (target and spec); over seeds 1–10 with these settings the
#: loop ends honest in all ten and its bound is ≤ the truth in eight (5 and 9 above it)
SEED = 3


def _spec(**kw) -> Spec:
    base = dict(slo=SLO, coarse_rates=(1.0, 2.0, 3.0, 4.0), duration_s=300.0, budget_minutes=60.0,
                round_minutes=20.0, seed=SEED, reps=100, design_reps=40, sims=2)
    return Spec(**{**base, **kw})


# ------------------------------------------------------------------------------ the probe

class _Server:
    """A tiny OpenAI-compatible server: answers every POST with ``status`` and
    ``completion_tokens = max_tokens + delta``."""

    def __init__(self, status: int = 200, delta: int = 0):
        self.requests = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                data = json.dumps({"choices": [{"message": {"content": "x"}}],
                                   "usage": {"completion_tokens": body["max_tokens"] + delta}})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loadtest_cli(url, tmp_path, capsys):
    w = tmp_path / "workload.yaml"
    w.write_text("endpoint: chat\narrival: poisson\noutput_fixed: true\n"
                 "asked: {input_tokens: 64, output_tokens: 32}\n")
    out = tmp_path / "lt"
    rc = main(["loadtest", "--tool", "aiperf", "--url", url, "--model", "m", "--workload", str(w),
               "--slo", SLO, "--rates", "1,2", "--duration-s", "10", "--out", str(out)])
    return rc, capsys.readouterr().err, out


@pytest.mark.parametrize("case", ["wrong-length", "refused", "http-500"])
def test_a_bad_server_is_stopped_at_the_probe_before_any_load(case, tmp_path, capsys,
                                                              monkeypatch):
    # no load tool on PATH: had the probe let the test go on, the first run would fail otherwise
    monkeypatch.setenv("PATH", "/nonexistent")
    srv = None
    if case == "refused":
        url = f"http://127.0.0.1:{_free_port()}"
    else:
        srv = _Server(status=500 if case == "http-500" else 200,
                      delta=-5 if case == "wrong-length" else 0)
        url = srv.url
    try:
        rc, err, out = _loadtest_cli(url, tmp_path, capsys)
    finally:
        if srv is not None:
            srv.close()
    assert rc == 2, err
    assert "probe failed, no load was sent" in err and "Traceback" not in err
    want = {"wrong-length": "answered with 27 output tokens, 32 were asked",
            "refused": "cannot be reached", "http-500": "answered HTTP 500"}[case]
    assert want in err
    assert not out.exists()  # nothing planned, nothing sent
    if srv is not None:  # the probe's first request decided; no more came
        assert srv.requests == 1


def test_a_good_server_passes_the_probe(tmp_path):
    from capplan.loadtest import probe

    srv = _Server()
    try:
        p = probe(srv.url, model="m", workload={"asked": {"output_tokens": 32}}, requests=3)
    finally:
        srv.close()
    assert p.requests == 3 and p.output_tokens == 32 and srv.requests == 3


def test_the_url_must_be_http_and_the_workload_must_name_the_output_length(tmp_path, capsys):
    w = tmp_path / "w.yaml"
    w.write_text("endpoint: chat\n")
    rc = main(["loadtest", "--tool", "aiperf", "--url", "http://127.0.0.1:1", "--model", "m",
               "--workload", str(w), "--slo", SLO, "--rates", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "asked.output_tokens" in err


# ------------------------------------------------------------------------------ numbers

def test_gap_and_spec_checks():
    b = Bound(estimate=4.0, lower_bound=3.4, ci_low=3.2, ci_high=4.6, honesty="honest")
    assert b.gap_rel == pytest.approx(0.15)  # (4 − 3.4) / 4
    assert Bound(float("nan"), 1.0, 0.0, 2.0, "x").gap_rel != Bound(float("nan"), 1.0, 0, 2, "x").gap_rel
    with pytest.raises(SpecError, match="tolerance"):
        _spec(tolerance=1.5)
    with pytest.raises(SpecError, match="coarse sweep"):
        _spec(coarse_rates=())


def test_the_tool_process_group_is_stopped_by_its_id(tmp_path):
    """A tool that leaves a child behind (bash runs `sleep` in the background) is stopped as a
    group when its time is up: neither it nor the child survives."""
    pidfile = tmp_path / "child.pid"
    t0 = time.perf_counter()
    rc, _ = run_in_group(["bash", "-c", f"sleep 30 & echo $! > {pidfile}; sleep 30"],
                         cwd=str(tmp_path), env=dict(os.environ), timeout_s=1.0)
    assert rc == 124 and time.perf_counter() - t0 < 10
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running (a zombie left to a parent that has not reaped it yet is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# ------------------------------------------------------------------------------ the loop

@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """One uninterrupted load test against the synth model (≈ 10 s of CPU; 40 s of wall time
    on the shared box at load 18)."""
    out = tmp_path_factory.mktemp("lt") / "whole"
    events = []
    res = run_loadtest(SynthTarget(load_system(MODEL), seed=SEED), _spec(), out,
                       on_event=lambda k, line: events.append((k, line)))
    return res, out, events


def test_the_loop_against_a_synth_model_ends_honest(whole):
    res, out, events = whole
    assert res.stop == "honest", res.to_text()
    f = res.final
    assert f.honesty == "honest" and f.gap_rel <= 0.15
    # the bound is at or below the model's true C_SLO (a 95 % bound; this seed is checked)
    assert f.lower_bound <= TRUTH_RPS, res.to_text()
    assert res.minutes <= 60.0 + 1e-9 and len(res.rounds) >= 2
    # the record explains the study: each round, why each run, expected and obtained bound
    rec = load_record(out / "study" / "loadtest.json")
    assert rec == load_record(out / "loadtest.json")
    assert rec["stop"]["stop"] == "honest" and len(rec["rounds"]) == len(res.rounds)
    assert all(r["why"] for r in rec["runs"]) and all(r["state"] == "imported" for r in rec["runs"])
    assert rec["rounds"][0]["expected"] is None
    assert all(r["expected"]["lower_bound"] is not None for r in rec["rounds"][1:])
    assert all(r["obtained"]["honesty"] for r in rec["rounds"])
    # progress: a probe line, one line per run and per fit, then the stop
    kinds = [k for k, _ in events]
    assert kinds[0] == "probe" and kinds[-1] == "stop"
    assert kinds.count("fit") == len(res.rounds)
    assert any("min spent" in line and "left" in line for _, line in events)


@pytest.mark.slow  # ≈ one more loop each: 15–25 s alone, 50–75 s on the box at load 18
@pytest.mark.parametrize("at", ["fit", "run"])
def test_ctrl_c_then_resume_ends_in_the_uninterrupted_study(at, whole, tmp_path):
    """Interrupted after round 1's fit (between rounds) or after its first run (mid-round, the
    finished run imported and kept), then resumed: the same runs, seeds and final bound."""
    res0, _, _ = whole
    out = tmp_path / "lt"
    seen = {"n": 0}

    def hook(kind, line):
        if kind == at and line.startswith("round 1:") and "runs" in line:
            seen["n"] += 1
            raise KeyboardInterrupt

    with pytest.raises(InterruptedLoadtest) as ei:
        run_loadtest(SynthTarget(load_system(MODEL), seed=SEED), _spec(), out, on_event=hook)
    assert ei.value.exit_code == 130 and "--resume" in str(ei.value)
    rec = load_record(out / "loadtest.json")
    kept = [r for r in rec["runs"] if r["state"] == "imported"]
    assert kept and rec["stop"] is None
    res = run_loadtest(SynthTarget(load_system(MODEL), seed=SEED), _spec(), out, resume=True)
    key = lambda r: (r.round, r.index, r.rate_rps, r.duration_s, r.seed, r.state)  # noqa: E731
    assert [key(r) for r in res.runs] == [key(r) for r in res0.runs]
    assert res.final == res0.final and res.stop == res0.stop


def test_resume_with_other_settings_is_refused(whole, tmp_path):
    _, out, _ = whole
    with pytest.raises(SpecError, match="other settings"):
        run_loadtest(SynthTarget(load_system(MODEL), seed=SEED), _spec(budget_minutes=30.0), out,
                     resume=True)
    with pytest.raises(SpecError, match="holds a load test"):
        run_loadtest(SynthTarget(load_system(MODEL), seed=SEED), _spec(), out)


def test_the_rate_and_request_caps_hold(tmp_path):
    res = run_loadtest(SynthTarget(load_system(MODEL), seed=2),
                       _spec(max_rate_rps=2.5, max_requests=1500), tmp_path / "lt")
    assert all(r.rate_rps <= 2.5 for r in res.runs)
    assert res.requests <= 1500
    assert "above the cap" in res.to_text()
    assert res.stop in ("requests", "budget", "no-run", "honest"), res.to_text()
    if res.stop != "honest":
        assert res.missing


@pytest.mark.slow
def test_a_real_sigint_to_the_command_keeps_the_finished_runs(tmp_path):
    """SIGINT to `capplan loadtest` (a subprocess) mid-run: exit 130, the record kept."""
    out = tmp_path / "lt"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    p = subprocess.Popen([sys.executable, "-m", "capplan", "loadtest", "--synth", str(MODEL),
                          "--slo", SLO, "--rates", "1,2,3,4", "--duration-s", "300",
                          "--budget-minutes", "60", "--reps", "200", "--seed", "1",
                          "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True,
                         # a shell's background job starts with SIGINT ignored, and Python keeps
                         # it so: the command would then run to its end (a suite started with
                         # `cmd &` failed here); the test is about Ctrl-C, so restore it
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err = []
    for line in p.stderr:
        err.append(line)
        if line.startswith("[fit]"):
            p.send_signal(signal.SIGINT)
            break
    rest = p.communicate(timeout=120)[1]
    assert p.returncode == 130, "".join(err) + rest
    assert "interrupted" in rest and "--resume" in rest
    rec = load_record(out / "loadtest.json")
    assert sum(r["state"] == "imported" for r in rec["runs"]) >= 4


# ------------------------------------------------------------------------------ the chart


def test_rounds_figure_by_hand():
    """Minutes at each fit are the runs sent up to that round; the interval is drawn as error
    bars around the estimate; a hollow marker is a bound that is not honest; the stop line is
    the estimate less the tolerance."""
    runs = [RunRecord(0, i, r, 300.0, 0.0, i, f"r{i}", "coarse", state="imported")
            for i, r in enumerate((1.0, 2.0, 3.0))]
    runs += [RunRecord(1, 3, 2.5, 600.0, 0.0, 3, "r3", "design", state="imported"),
             RunRecord(2, 4, 2.6, 300.0, 0.0, 4, "r4", "design")]  # planned: not counted
    rounds = [Round(0, "coarse sweep", 15.0, None, Bound(2.8, 2.2, 2.4, 3.1, "unsupported", 3)),
              Round(1, "design", 10.0, None, Bound(2.6, 2.3, 2.35, 2.9, "honest", 4)),
              Round(2, "design", 5.0, None, None)]
    fig = rounds_figure_dict(rounds, runs, 0.15)
    est, lb, goal = fig["data"]
    assert est["x"] == [15.0, 25.0] and lb["x"] == [15.0, 25.0]
    assert est["y"] == [2.8, 2.6] and lb["y"] == [2.2, 2.3]
    assert est["error_y"]["array"] == pytest.approx([0.3, 0.3])
    assert est["error_y"]["arrayminus"] == pytest.approx([0.4, 0.25])
    assert lb["marker"]["symbol"] == ["circle-open", "circle"]
    assert goal["y"] == pytest.approx([2.8 * 0.85, 2.6 * 0.85])


def test_live_chart_is_redrawn_after_each_fit(tmp_path):
    """``LiveChart`` as ``on_event``: after each fit its widget holds one more point, read from
    the record the loop has just written; at the end it is the result's own figure."""
    out = tmp_path / "lt"
    chart = LiveChart(out, echo=False)
    seen = []

    def hook(kind, line):
        chart(kind, line)
        if kind == "fit":
            seen.append(list(chart.widget.data[0].y))

    res = run_loadtest(SynthTarget(load_system(MODEL), seed=SEED),
                       _spec(reps=60, design_reps=30, budget_minutes=40.0), out, on_event=hook)
    fitted = [r.obtained.estimate for r in res.rounds if r.obtained is not None]
    assert len(seen) == len(fitted) >= 2
    assert [len(s) for s in seen] == list(range(1, len(fitted) + 1))
    assert seen[-1] == fitted and chart.fits == len(fitted)
    final = res.figure()
    assert list(final.data[1].y) == list(chart.widget.data[1].y)
    assert list(final.data[0].x) == list(chart.widget.data[0].x)


def test_design_runs_are_capped_at_the_longest_run_allowed():
    """A sweep whose runs near the crossing read as settling makes the design ask for ≥ 300-s
    runs; ``max_duration_s`` (the load test's ``max_run_s``, default 4 × its run length) cuts
    them, their warm-up in proportion, and the notes say so. Without a cap nothing changes."""
    from capplan.design import _capped

    assert _capped(300.0, 30.0, None) == (300.0, 30.0, "")
    assert _capped(300.0, 30.0, 600.0) == (300.0, 30.0, "")
    dur, warm, note = _capped(300.0, 30.0, 60.0)
    assert (dur, warm) == (60.0, 6.0)
    assert "300 s long" in note and "capped at 60 s" in note
    assert _spec(duration_s=15.0).longest_run_s == 60.0
    assert _spec(duration_s=15.0, max_run_s=120.0).longest_run_s == 120.0
    with pytest.raises(SpecError, match="longest run"):
        _spec(duration_s=15.0, max_run_s=10.0)


def test_an_empty_design_on_an_unsupported_bound_sends_the_honesty_rules_runs(tmp_path, monkeypatch):
    """The design's trial fits (fewer replicates) can read a sweep as honest that the measured
    fit calls unsupported, and then propose nothing (GuideLLM seed 3 stopped there, "no-run",
    with the runs that fix the bound named but never sent). The loop then sends the honesty
    rule's runs to add, capped at the longest run, and says why."""
    from dataclasses import replace

    import capplan.design as D
    from capplan.envelope import fit_envelope

    # the coarse sweep alone (same seeds): its measured verdict names the runs to add
    coarse = run_loadtest(SynthTarget(load_system(MODEL), seed=SEED), _spec(max_rounds=0),
                          tmp_path / "coarse")
    h = fit_envelope(coarse.study, SLO, reps=100, seed=SEED).honesty
    assert h.status == "unsupported" and h.runs_to_add
    real = D.propose
    monkeypatch.setattr(D, "propose", lambda *a, **kw: replace(real(*a, **kw), runs=()))
    res = run_loadtest(SynthTarget(load_system(MODEL), seed=SEED), _spec(max_rounds=1), tmp_path / "lt")
    assert any("honesty rule's runs to add are sent instead" in n for n in res.rounds[1].notes)
    sent = {}
    for x in res.runs:
        if x.round == 1:
            sent[x.rate_rps] = sent.get(x.rate_rps, 0) + 1
            assert x.why and x.duration_s <= 1200.0
    assert sent == {r.rate_rps: r.repeats for r in h.runs_to_add}, res.to_text()
