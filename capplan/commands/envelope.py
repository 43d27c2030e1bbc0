"""`capplan envelope STUDY --slo ttft_ms=2000,attainment=0.99`: C_SLO with its confidence
interval, lower bound, status and per-run diagnostics; ``--out`` writes them as JSON
(atomically). A summary table (CSV/parquet of rate, requests, good requests) instead of a
study directory fits under an explicit iid assumption."""

from __future__ import annotations

import math
from pathlib import Path

import click

from ..errors import SpecError


def _fmt(v: float, nd: int = 4) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}g}"


@click.command("envelope")
@click.argument("study", type=click.Path())
@click.option("--slo", "slo_text", required=True,
              help="SLO, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99")
@click.option("--confidence", type=float, default=0.95, show_default=True,
              help="confidence of the interval and of the one-sided lower bound")
@click.option("--reps", type=int, default=1000, show_default=True, help="bootstrap replicates")
@click.option("--seed", type=int, default=0, show_default=True, help="bootstrap seed")
@click.option("--scheme", type=click.Choice(["circular", "stationary"]), default="circular",
              show_default=True, help="block bootstrap scheme")
@click.option("--block-len", type=float, default=None,
              help="block length in requests (default: Politis–White per run)")
@click.option("--warmup", default="manifest", show_default=True,
              help="manifest (else MSER-5), mser, none, or seconds")
@click.option("--method", type=click.Choice(["run-effect", "within-run"]), default="run-effect",
              show_default=True,
              help="interval: with the between-run variation (default) or the within-run "
                   "bootstrap alone (optimistic near saturation; docs/envelope.md)")
@click.option("--out", "out", type=click.Path(), default=None, help="write the result as JSON")
def cmd(study, slo_text, confidence, reps, seed, scheme, block_len, warmup, method, out) -> int:
    """Fit the SLO capacity envelope of a load sweep."""
    from ..envelope import fit_envelope, fit_summary_table
    from ..slo import SLO

    slo = SLO.parse(slo_text)
    if not (0.5 < confidence < 1.0):
        raise SpecError(f"--confidence must be between 0.5 and 1, got {confidence}",
                        field="confidence", fix="e.g. --confidence 0.95")
    if reps < 10:
        raise SpecError(f"--reps must be at least 10, got {reps}", field="reps")
    try:
        w = float(warmup)
    except ValueError:
        w = warmup
    p = Path(study)
    if p.is_file() and p.suffix in (".csv", ".parquet"):
        env = fit_summary_table(p, slo, confidence=confidence, reps=reps, seed=seed)
    else:
        env = fit_envelope(p, slo, confidence=confidence, reps=reps, seed=seed, scheme=scheme,
                           block_len=block_len, warmup=w, method=method)
    c = env.cslo
    unit = c.unit
    if env.honesty is not None:
        click.echo(env.honesty.to_text())
        click.echo("")
    click.echo(f"SLO: {slo.describe()}")
    kind = "closed loop (capacity = goodput at the highest passing concurrency)" \
        if c.closed_loop else "open loop"
    click.echo(f"sweep: {len(env.runs)} runs, {kind}" + ("; iid assumption" if env.iid_assumption else ""))
    click.echo(f"C_SLO estimate:   {_fmt(c.estimate)} {unit}   status: {c.status}")
    click.echo(f"{c.confidence:.0%} CI:           [{_fmt(c.ci_low)}, {_fmt(c.ci_high)}] {unit}")
    click.echo(f"lower bound ({c.confidence:.0%}, one-sided): {_fmt(c.lower_bound)} {unit}")
    if c.closed_loop:
        click.echo(f"at concurrency:   {_fmt(c.load_at_capacity)}")
    if env.run_effect is not None:
        click.echo(env.run_effect.sentence())
    if c.suggested_rates:
        click.echo("suggested rates to add: " + ", ".join(f"{v:g}" for v in c.suggested_rates))
    click.echo("")
    cols = ["run_id", "x", "n", "attainment", "att_ci_low", "att_ci_high", "fitted",
            "design_effect", "n_eff", "usable"]
    cols = [k for k in cols if k in env.runs.columns]
    click.echo(env.runs[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if len(env.diagnostics):
        click.echo("\ndiagnostics:")
        dcols = [k for k in ("run_id", "warmup_s", "warmup_source", "measured_rps",
                             "gen_lag_p99_ms", "littles_ratio", "overloaded", "too_short",
                             "usable") if k in env.diagnostics.columns]
        click.echo(env.diagnostics[dcols].to_string(index=False,
                                                    float_format=lambda v: f"{v:.4g}"))
    for note in env.notes:
        click.echo(f"note: {note}")
    if out:
        env.to_json(out)
        click.echo(f"\nwrote {out}")
    return 0
