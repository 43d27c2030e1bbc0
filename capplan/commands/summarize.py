"""`capplan summarize STUDY --slo …`: one row per run (funnel, rates, percentiles, SLO)."""

from __future__ import annotations

from pathlib import Path

import click
import duckdb

from ..errors import SpecError, StudyError
from ..present import MISSING
from ..io import atomic_path
from .engine import engine_options

OUT_FORMATS = (".csv", ".parquet")


def write_table(df, dest: str) -> Path:
    """Write a frame atomically as CSV or parquet, chosen by the file extension."""
    path = Path(dest)
    ext = path.suffix.lower()
    if ext not in OUT_FORMATS:
        raise SpecError(f"cannot write {path.name!r}: unknown extension {ext or '(none)'!r}",
                        field="--out", file=str(path),
                        fix="use a name ending in .csv or .parquet")
    with atomic_path(path) as tmp:
        if ext == ".csv":
            # CRLF rows: pandas then quotes a field holding a bare \r, so the row stays intact.
            df.to_csv(tmp, index=False, lineterminator="\r\n", encoding="utf-8")
        else:
            df.to_parquet(tmp, index=False)
    return path


@click.command("summarize")
@click.argument("study", type=click.Path())
@click.option("--slo", "slo_text", default=None,
              help="e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99 (adds attainment and goodput)")
@click.option("--slo-file", "slo_file", default=None, type=click.Path(),
              help="one SLO per slo_class (templates/slo.yaml): adds attainment per class per run")
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False),
              help="also write the table to FILE.csv or FILE.parquet (by extension)")
@click.option("--warmup-s", type=float, default=None,
              help="override every run's warm-up (seconds); default: the manifest's warmup_s")
@click.option("--check/--no-check", default=True, show_default=True,
              help="run the row-level validator first (errors stop with exit 2)")
@engine_options
def cmd(study: str, slo_text: str | None, slo_file: str | None, out: str | None, warmup_s: float | None,
        check: bool, engine) -> int:
    """Summarize every run of STUDY: funnel, measured vs nominal offered rate, throughput,
    TTFT/TPOT/ITL/E2E percentiles and, with --slo, attainment and goodput."""
    from ..metrics import summarize
    from ..slo import SLO

    if out is not None and Path(out).suffix.lower() not in OUT_FORMATS:
        write_table(None, out)  # raises the SpecError before any work
    if slo_file is not None and engine.spark:
        raise SpecError("--slo-file runs on DuckDB only", field="--engine",
                        fix="drop --engine spark, or summarize with --slo")
    slo = SLO.parse(slo_text) if slo_text else None
    st = engine.open(study, checked=check)
    try:
        result = summarize(st, slo, warmup_s=warmup_s)
    except duckdb.Error as exc:
        from ..errors import Problem
        from ..study import read_failure

        raise read_failure(exc) or StudyError(problems=[Problem(
            f"cannot read the events: {str(exc).splitlines()[0]}", file=str(st.root),
            fix="run `capplan validate` on the study")]) from None
    click.echo(f"Study {st.name}: {len(result.run_ids)} runs")
    click.echo(result.to_text())
    if slo_file is not None:
        _class_table(st, slo_file, warmup_s)
    if slo is None and slo_file is None:
        click.echo("\n(no SLO given, so no attainment or goodput: add e.g. "
                   "--slo ttft_ms=2000,tpot_ms=100,attainment=0.99)")
    if out is not None:
        path = write_table(result.to_frame(), out)
        click.echo(f"wrote {path}")
    return 0


def _class_table(st, slo_file: str, warmup_s: float | None) -> None:
    """`--slo-file`: attainment per class per run, each class under its own SLO."""
    from ..mix.classes import class_counts
    from ..slo import load_slo_file

    classes = load_slo_file(slo_file)
    df = class_counts(st, classes, warmup="manifest" if warmup_s is None else warmup_s)
    click.echo(f"\nattainment per SLO class ({classes.describe()}):")
    click.echo(df.to_string(index=False, na_rep=MISSING, float_format=lambda v: f"{v:.4g}"))
