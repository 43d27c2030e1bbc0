"""`capplan report`: render the HTML report and plan export of a study (the main job)."""

from __future__ import annotations

import click

from .. import report as R


@click.command("report")
@click.argument("study", required=False, type=click.Path(path_type=str))
@click.option("--spec", type=click.Path(path_type=str), default=None,
              help="Plan spec YAML [default: the bundled templates/plan.yaml].")
@click.option("--out", type=click.Path(path_type=str), default=None,
              help="Report directory [default: reports/<study-name> under the current directory].")
@click.option("--slo", default=R.DEFAULT_SLO, show_default=True,
              help="SLO limits and attainment target.")
@click.option("--seed", type=int, default=R.DEFAULT_SEED, show_default=True,
              help="Bootstrap seed (same inputs and seed give the same numbers).")
@click.option("--reps", type=int, default=R.DEFAULT_REPS, show_default=True,
              help="Bootstrap replicates.")
@click.option("--confidence", type=float, default=R.DEFAULT_CONFIDENCE, show_default=True,
              help="Confidence level of the C_SLO interval.")
@click.option("--notebooks", "notebooks", type=click.Path(path_type=str), default=None,
              help="Folder with your own 01-explore/02-envelope/03-plan notebooks "
                   "[default: the bundled ones].")
def cmd(study, spec, out, slo, seed, reps, confidence, notebooks):
    """Run the explore, envelope and plan notebooks on STUDY (default: the bundled demo
    study) and write an offline HTML report with index.html and the plan as CSV/XLSX.

    Progress goes to stderr; the index path is printed on stdout. A failing notebook is
    reported with the cell that failed (exit 1); a bad study or spec exits 2."""
    result = R.render_report(study, spec=spec, out=out, slo=slo, seed=seed, reps=reps,
                             confidence=confidence, notebooks=notebooks)
    click.echo(f"report: {result.index}")
    return 0
