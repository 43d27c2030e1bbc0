"""`capplan cache STUDY --slo …`: the measured prefix-cache effect — hit rates per run and per
prompt-length bucket, computed vs logical prefill tokens/s, attainment and TTFT of hits vs
misses, and (``--window``) the hit rate over time (docs/scenarios.md)."""

from __future__ import annotations

import click

from ..present import MISSING


@click.command("cache")
@click.argument("study", type=click.Path())
@click.option("--slo", "slo_text", required=True, help="SLO, e.g. ttft_ms=2000,attainment=0.99")
@click.option("--input-edges", default="512,2048,8192", show_default=True,
              help="prompt-length bucket edges (tokens) of the per-bucket hit rates")
@click.option("--warmup", default="manifest", show_default=True, help="manifest (else MSER-5), mser, none, or seconds")
@click.option("--window", "window_s", default=None, type=float,
              help="also print the hit rate, attainment and TTFT p99 per window of this many seconds")
@click.option("--out", default=None, type=click.Path(), help="write runs.csv, buckets.csv, split.csv (and "
              "timeline.csv) into this folder")
def cmd(study, slo_text, input_edges, warmup, window_s, out) -> int:
    """The measured prefix-cache effect of a study."""
    from ..cache import cache_effect, cache_timeline
    from ..io import atomic_dir, check_out, write_csv
    from ..mix import parse_edges
    from ..slo import SLO

    slo = SLO.parse(slo_text)
    if out is not None:
        check_out(out, "runs.csv", "cache export")  # before the work: a bad --out fails fast
    try:
        w = float(warmup)
    except ValueError:
        w = warmup
    eff = cache_effect(study, slo, warmup=w, input_edges=parse_edges(input_edges, "--input-edges"))
    click.echo(eff.to_text())
    tl = None
    if window_s is not None:
        tl = cache_timeline(study, slo, window_s=window_s)
        click.echo("\nPer window:\n" + tl.to_string(index=False, na_rep=MISSING, float_format=lambda v: f"{v:.4g}"))
    if out is not None:
        with atomic_dir(out) as tmp:
            for name, frame in (("runs", eff.runs), ("buckets", eff.buckets), ("split", eff.split),
                                ("timeline", tl)):
                if frame is not None:
                    write_csv(frame, tmp / f"{name}.csv")
        click.echo(f"wrote {out}")
    return 0
