"""`capplan validate STUDY`: list every problem of a study directory (exit 2 on any error)."""

from __future__ import annotations

import click

from ..validate import validate_path


@click.command("validate")
@click.argument("study", type=click.Path(file_okay=True, dir_okay=True))
def cmd(study: str) -> int:
    """Check STUDY against the study contract v1 and list every problem found.

    Exit code 2 when there is any error; warnings alone are printed and exit 0."""
    problems, opened = validate_path(study)
    for p in problems.errors + problems.warnings:
        click.echo(p.format(), err=True)
    n_err, n_warn = len(problems.errors), len(problems.warnings)
    if n_err:
        click.echo(f"FAILED: {n_err} error(s), {n_warn} warning(s) in {study}", err=True)
        return 2
    n_events = opened.sql("SELECT count(*) FROM events").fetchone()[0]
    n_runs = len(opened.manifest.runs)
    tail = f" ({n_warn} warning(s) above)" if n_warn else ""
    click.echo(f"OK: {n_runs} runs, {n_events:,} events{tail}")
    return 0
