"""`capplan timeline STUDY [--run R] [--window 1s] [--slo ...] [--out DIR]`: per window the
offered, admitted, good, rejected and timed-out requests, goodput, attainment, requests
waiting, TTFT p99 where the sample allows and the replicas ready; per system event the time
to SLO breach, breach duration, good requests lost, time to recover, queue peak, area and
drain time, and for scale decisions the decision delay, ready time and overshoot GPU-hours —
the text of ``Timeline.to_text()``; ``--out`` writes the tables, the text and one offline
figure per run (docs/timeline.md)."""

from __future__ import annotations

import click

from .. import spec as S


@click.command("timeline")
@click.argument("study", type=click.Path())
@click.option("--run", "run", default=None, help="one run (default: every run)")
@click.option("--window", "window", default="1s", show_default=True,
              help="window width: seconds or text like 500ms, 10s, 1min")
@click.option("--slo", "slo_text", default=None,
              help="SLO, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99 (default: study.yaml slo)")
@click.option("--recover-windows", type=int, default=5, show_default=True,
              help="windows in a row at or above the attainment target that count as recovered")
@click.option("--pre-s", type=float, default=60.0, show_default=True,
              help="seconds before an event that set its baseline (goodput, queue)")
@click.option("--capacity-rps", type=float, default=None,
              help="req/s one replica serves within the SLO (replicas needed, overshoot)")
@click.option("--silence-s", type=float, default=10.0, show_default=True,
              help="a replica silent this long while the run goes on is marked (derived event)")
@click.option("--step-span", "step_span", default="30s", show_default=True,
              help="load steps: arrivals this long before and after a window boundary are compared")
@click.option("--step-z", type=float, default=5.0, show_default=True,
              help="load steps: the standard deviations (× the counts' dispersion) a step needs")
@click.option("--step-change", type=float, default=0.25, show_default=True,
              help="load steps: the least relative change in the offered rate that counts")
@click.option("--no-derive", is_flag=True, default=False,
              help="only the recorded events, none derived from the requests")
@click.option("--check/--no-check", default=True, show_default=True,
              help="run the row-level validator first (errors stop with exit 2)")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="write windows.csv, incidents.csv, events.csv, summary.csv, timeline.txt and "
                   "timeline-<run>.html to this folder")
def cmd(study, run, window, slo_text, recover_windows, pre_s, capacity_rps, silence_s, step_span,
        step_z, step_change, no_derive, check, out) -> int:
    """What each system event (failure, rollout, scale decision) did to the SLO of STUDY,
    window by window; a step in the offered rate (derived from the arrivals) is an incident too."""
    from ..study import connect, open_study
    from ..timeline import StepRule, analyse_timeline
    from ..validate import open_checked

    if out:
        from ..io import check_out

        check_out(out, "timeline.txt", "timeline export")  # before the work: a bad --out fails fast
    try:
        window = float(window)  # bare seconds
    except ValueError:
        pass
    width = S.duration_s(window, "--window", above=0.0, example="1s")
    try:
        step_span = float(step_span)
    except ValueError:
        pass
    span = S.duration_s(step_span, "--step-span", above=0.0, example="30s")
    st = (open_checked if check else open_study)(study, con=connect())
    tl = analyse_timeline(st, slo_text, run=run, window_s=width, recover_windows=recover_windows,
                          pre_s=pre_s, capacity_rps=capacity_rps, derive=not no_derive,
                          silence_s=silence_s,
                          step=StepRule(span_s=span, z_min=step_z, min_change=step_change))
    click.echo(tl.to_text())
    if out:
        names = tl.write(out)
        click.echo(f"\nwrote {out}: " + ", ".join(names))
    return 0
