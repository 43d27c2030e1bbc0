"""`capplan mix STUDY --slo … --target prod.parquet`: C_SLO at production's mix — the study's
per-cell attainment reweighted to the target's shares inside the bootstrap, beside the tested
mix's C_SLO, with the effective sample size; from a timestamped trace the peak hour's mix too
(docs/mix.md). With ``--twin twin.yaml`` the target mix also runs through the calibrated twin:
the load effect reweighting cannot see, both answers and their disagreement."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import SpecError


@click.command("mix")
@click.argument("study", type=click.Path())
@click.option("--slo", "slo_text", required=True, help="SLO, e.g. ttft_ms=1000,attainment=0.9")
@click.option("--target", "target_path", required=True, type=click.Path(),
              help="production trace (parquet/CSV/JSON lines with input/output tokens, optional tenant, "
                   "slo_class, timestamps) or a bucket table (input_min, input_max, …, share)")
@click.option("--input-edges", default="1024,4096", show_default=True,
              help="input-token bucket edges (for a trace; a table brings its own)")
@click.option("--output-edges", default="", help="output-token bucket edges (none by default)")
@click.option("--by", default="", help="also split cells by tenant and/or slo_class, e.g. --by tenant,slo_class")
@click.option("--period", type=click.Choice(["day", "peak_hour", "both"]), default="both", show_default=True,
              help="the trace's whole mix, its busiest clock hour's, or both (needs timestamps)")
@click.option("--drop-untested", is_flag=True,
              help="drop target cells without enough tested requests (the rest is rescaled; said aloud) "
                   "instead of refusing")
@click.option("--min-cell-requests", type=int, default=None,
              help="tested requests a target cell needs over the usable runs (default 50)")
@click.option("--confidence", type=float, default=0.95, show_default=True)
@click.option("--reps", type=int, default=1000, show_default=True, help="bootstrap replicates")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--scheme", type=click.Choice(["circular", "stationary"]), default="circular", show_default=True)
@click.option("--warmup", default="manifest", show_default=True, help="manifest (else MSER-5), mser, none, or seconds")
@click.option("--twin", "twin_path", default=None, type=click.Path(),
              help="twin.yaml (capplan twin fit): also run the target mix through the twin (the load effect)")
@click.option("--twin-runs", type=int, default=None,
              help="twin runs pooled per rate (default: enough for 20,000 requests, 4–64)")
@click.option("--twin-draws", type=int, default=10, show_default=True,
              help="parameter draws behind the twin's interval (0: Monte-Carlo error only)")
@click.option("--out", default=None, type=click.Path(), help="write the result(s) as JSON")
def cmd(study, slo_text, target_path, input_edges, output_edges, by, period, drop_untested, min_cell_requests,
        confidence, reps, seed, scheme, warmup, twin_path, twin_runs, twin_draws, out) -> int:
    """C_SLO at a production mix (reweighting the tested per-cell attainment)."""
    from ..mix import Buckets, parse_edges
    from ..mix.reweight import MIN_CELL_REQUESTS, fit_periods
    from ..slo import SLO
    from ..study import open_study

    slo = SLO.parse(slo_text)
    twin = None
    if twin_path:
        from ..twin import load_twin

        twin = load_twin(twin_path)  # a bad twin file fails before any fit
    dims = {d.strip() for d in by.split(",") if d.strip()}
    bad = dims - {"tenant", "slo_class"}
    if bad:
        raise SpecError(f"--by takes tenant and/or slo_class, got {', '.join(sorted(bad))}", field="--by",
                        fix="e.g. --by tenant,slo_class")
    buckets = Buckets(input_edges=parse_edges(input_edges, "--input-edges"),
                      output_edges=parse_edges(output_edges, "--output-edges"),
                      tenant="tenant" in dims, slo_class="slo_class" in dims)
    try:
        w = float(warmup)
    except ValueError:
        w = warmup
    min_cell = MIN_CELL_REQUESTS if min_cell_requests is None else min_cell_requests
    # the day's and the peak hour's mix on one reduction (the report's mix page fits them alike)
    results, notes = fit_periods(study, slo, target_path, buckets,
                                 periods=("day", "peak_hour") if period == "both" else (period,),
                                 confidence=confidence, reps=reps, seed=seed, scheme=scheme, warmup=w,
                                 min_cell_requests=min_cell, drop_untested=drop_untested)
    for note in notes:
        click.echo(f"note: {note}")
    twins = {}
    if twin is not None:
        from ..mix.loadeffect import twin_periods

        twins = twin_periods(twin, open_study(study), slo, results, seed=seed, runs=twin_runs, draws=twin_draws,
                             min_cell_requests=min_cell, drop_untested=drop_untested)
    for p, m in results.items():
        click.echo(m.to_text())
        click.echo("")
        if p in twins:
            if twins[p].warning:
                click.echo(twins[p].warning, err=True)
            click.echo(twins[p].to_text())
            click.echo("")
    if out:
        from ..present import json_text

        doc = {p: {**m.to_dict(), **({"twin": twins[p].to_dict()} if p in twins else {})}
               for p, m in results.items()}
        json_text(doc, Path(out))
        click.echo(f"wrote {out}")
    return 0
