"""`capplan envelope STUDY --slo ttft_ms=2000,attainment=0.99`: C_SLO with its confidence
interval, lower bound, status and per-run diagnostics — the text of ``Envelope.to_text()``, so
a notebook prints the same; ``--out`` writes them as JSON (atomically). A summary table
(CSV/parquet of rate, requests, good requests) instead of a study directory fits under an
explicit iid assumption."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import SpecError
from ..present import MISSING
from .engine import Preload, engine_options


@click.command("envelope")
@click.argument("study", type=click.Path())
@click.option("--slo", "slo_text", default=None,
              help="SLO, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99")
@click.option("--slo-file", "slo_file", default=None, type=click.Path(),
              help="one SLO per slo_class (see templates/slo.yaml): C_SLO where every class meets its "
                   "target, the binding class named")
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
@click.option("--twin", "twin_path", type=click.Path(dir_okay=False), default=None,
              help="hold the run-to-run variation near the crossing at or above what this "
                   "twin (or synth config) shows when it runs the study's protocol there; it "
                   "can raise the sweep's own estimate, never lower it (docs/envelope.md)")
@click.option("--out", "out", type=click.Path(), default=None, help="write the result as JSON")
@engine_options
def cmd(study, slo_text, slo_file, confidence, reps, seed, scheme, block_len, warmup, method,
        twin_path, out, engine) -> int:
    """Fit the SLO capacity envelope of a load sweep."""
    from ..reduce import reduce_study
    from ..slo import SLO, check_confidence, check_reps

    if (slo_text is None) == (slo_file is None):
        raise SpecError("give the SLO with --slo, or one SLO per class with --slo-file (not both)",
                        field="--slo", fix="e.g. --slo ttft_ms=2000,attainment=0.99, or --slo-file slo.yaml")
    if slo_file is not None:
        if engine.spark:
            raise SpecError("--slo-file runs on DuckDB only", field="--engine",
                            fix="drop --engine spark, or fit one SLO at a time with --slo")
        return _classes(study, slo_file, confidence, reps, seed, scheme, block_len, warmup, out, method)
    slo = SLO.parse(slo_text)
    fit = Preload("capplan.envelope")  # the fit's imports, while the study is reduced
    check_confidence(confidence)
    check_reps(reps)
    try:
        w = float(warmup)
    except ValueError:
        w = warmup
    if not engine.is_study(study):
        env = fit.module.fit_summary_table(Path(study), slo, confidence=confidence, reps=reps, seed=seed)
    else:
        st = engine.open(study)
        # grid_half=0: the command fits this one SLO, so no grid of other limits (what a
        # refit or the surface reads) is counted: 0.3 of the reduction's 5 CPU s on 12 runs
        # of 10^6 requests (benchmarks/README.md, issue 29); the numbers are the same
        stats = reduce_study(st, slo, warmup=w, progress=engine.progress, grid_half=0)
        fit_kw = dict(confidence=confidence, reps=reps, scheme=scheme, block_len=block_len, warmup=w,
                      method=method)
        if twin_path and method == "run-effect":
            fit.module  # its imports done first: the two threads never wait on each other
            from ..design import fit_envelope_with_twin

            env = fit_envelope_with_twin(st, slo, twin_path, seed=seed, stats=stats, **fit_kw)
        else:
            env = fit.module.fit_envelope(st, slo, seed=seed, stats=stats, **fit_kw)
    click.echo(env.to_text())
    if out:
        env.to_json(out)
        click.echo(f"\nwrote {out}")
    return 0


def _classes(study, slo_file, confidence, reps, seed, scheme, block_len, warmup, out,
             method="run-effect") -> int:
    """`--slo-file`: the joint C_SLO over SLO classes (capplan.mix.classes)."""
    from ..mix.classes import fit_classes

    try:
        w = float(warmup)
    except ValueError:
        w = warmup
    fit = fit_classes(study, slo_file, confidence=confidence, reps=reps, seed=seed, scheme=scheme, method=method,
                      block_len=block_len, warmup=w)
    click.echo(fit.to_text())
    click.echo("")
    pr = fit.per_run()
    cols = [c for c in ("run_id", "slo_class", "x", "n", "attainment", "att_ci_low", "att_ci_high", "target",
                        "usable") if c in pr.columns]
    click.echo(pr[cols].to_string(index=False, na_rep=MISSING, float_format=lambda v: f"{v:.4g}"))
    if out:
        fit.to_json(out)
        click.echo(f"\nwrote {out}")
    return 0
