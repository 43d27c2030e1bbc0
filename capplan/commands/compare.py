"""`capplan compare BASELINE CANDIDATE --slo …`: release gates, bucket regressions, fairness.

Exit codes: 0 every gate passes, 1 a gate fails (or a bucket regressed), 2 bad input
(including studies whose offered workload or SLO differ)."""

from __future__ import annotations

import click


@click.command("compare")
@click.argument("baseline", type=click.Path())
@click.argument("candidate", type=click.Path())
@click.option("--slo", "slo_text", required=True,
              help="e.g. ttft_ms=2000,attainment=0.99 (one SLO judges both studies)")
@click.option("--gates", "gates_path", default=None, type=click.Path(dir_okay=False),
              help="gates YAML (default: the built-in defaults = templates/gates.yaml)")
@click.option("--out", "out", default=None, type=click.Path(),
              help="write compare.xlsx and CSVs into this directory")
@click.option("--reps", default=1000, show_default=True, type=int,
              help="bootstrap replicates")
@click.option("--seed", default=0, show_default=True, type=int, help="bootstrap seed")
@click.option("--confidence", default=None, type=float,
              help="overall confidence (default: the gates file's, 0.95)")
@click.option("--allow-cache-mismatch", is_flag=True, default=False,
              help="compare runs labelled with different prefix-cache conditions (refused by default)")
def cmd(baseline: str, candidate: str, slo_text: str, gates_path: str | None, out: str | None,
        reps: int, seed: int, confidence: float | None, allow_cache_mismatch: bool = False) -> int:
    """Compare CANDIDATE against BASELINE on the same offered trace and SLO."""
    from ..compare import compare, load_gates
    from ..export import check_compare_out, export_comparison
    from ..slo import SLO

    slo = SLO.parse(slo_text)
    gates = load_gates(gates_path) if gates_path else load_gates(None)
    if out is not None:
        check_compare_out(out)  # fail before any work
    result = compare(baseline, candidate, slo, gates=gates, confidence=confidence, reps=reps,
                     seed=seed, allow_cache_mismatch=allow_cache_mismatch)
    click.echo(result.to_text())
    if out is not None:
        from ..study import open_study

        hashes = (open_study(baseline).content_hash(), open_study(candidate).content_hash())
        path = export_comparison(result, out, hashes=hashes)
        click.echo(f"wrote {path}")
    return result.verdict.exit_code
