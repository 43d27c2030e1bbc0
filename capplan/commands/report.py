"""`capplan report`: render the HTML report and plan export of a study (the main job)."""

from __future__ import annotations

import click

from .. import report as R
from .engine import Engine, engine_option, spark_master_option


@click.command("report")
@click.argument("study", required=False, type=click.Path(path_type=str))
@click.option("--spec", type=click.Path(path_type=str), default=None,
              help="Plan spec YAML [default: the bundled templates/plan.yaml].")
@click.option("--out", type=click.Path(path_type=str), default=None,
              help="Report directory [default: reports/<study-name> under the current directory].")
@click.option("--slo", default=None,
              help="SLO, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99 [default: the spec's slo].")
@click.option("--seed", type=int, default=None,
              help="Bootstrap seed; same inputs and seed give the same numbers "
                   "[default: the spec's capacity.seed].")
@click.option("--reps", type=int, default=None,
              help="Bootstrap replicates [default: the spec's capacity.reps].")
@click.option("--confidence", type=float, default=None,
              help="Confidence of the C_SLO interval [default: the spec's capacity.confidence].")
@click.option("--time", "time_", default=None,
              help="Provenance time of the plan export, ISO [default: now, UTC]; fix it to get "
                   "byte-identical exports.")
@click.option("--baseline", type=click.Path(path_type=str), default=None,
              help="Baseline study: adds the comparison page (05-compare; STUDY is the "
                   "candidate) and its CSV/XLSX export under data/compare.")
@click.option("--gates", type=click.Path(path_type=str), default=None,
              help="Gates YAML of the comparison (with --baseline) "
                   "[default: the templates/gates.yaml defaults].")
@click.option("--twin", type=click.Path(path_type=str), default=None,
              help="twin.yaml (capplan twin fit): adds the twin page (06-twin) with its check "
                   "against STUDY, and data/twin/check.json.")
@click.option("--sweeps", type=click.Path(path_type=str), default=None,
              help="sweeps file (capplan-sweeps/1, with --twin): prefix-cache settings, prefill:decode "
                   "splits and admission / scheduling policies simulated on the serving-policies page "
                   "(09-scenarios).")
@click.option("--notebooks", "notebooks", type=click.Path(path_type=str), default=None,
              help="Folder with your own 01-explore/02-envelope/03-plan (and 05-compare) "
                   "notebooks [default: the bundled ones].")
@click.option("--jobs", type=click.IntRange(1, 8), default=None,
              help="Notebooks executed at once, one kernel each [default: all of them].")
@click.option("--accept-optimistic", is_flag=True,
              help="Plan with the study's C_SLO lower bound even where the sweep cannot "
                   "support it honestly (the plan says so); without it such a plan is refused.")
@engine_option("; in the report, the envelope and plan pages reduce on it, the other pages "
               "read the local study with DuckDB")
@spark_master_option()
def cmd(study, spec, out, slo, seed, reps, confidence, time_, baseline, gates, twin, notebooks, jobs,
        accept_optimistic, sweeps=None, engine="duckdb", spark_master=None):
    """Run the explore, envelope and plan notebooks on STUDY (default: the bundled demo
    study) and write an offline HTML report with index.html and the plan as CSV/XLSX.
    With --baseline, the comparison notebook runs too (baseline vs STUDY); its gate verdict
    is shown in the report and does not change the exit code.

    Progress goes to stderr; the index path is printed on stdout. A failing notebook is
    reported with the cell that failed (exit 1); a bad study, baseline or spec, or studies
    that cannot be compared, exit 2 with nothing written.

    With --engine spark the envelope and plan pages reduce the events on Spark (same
    numbers as DuckDB with the same seed); STUDY must be on this machine's disk."""
    engine = Engine(engine, spark_master)  # --spark-master without --engine spark: exit 2
    result = R.render_report(study, spec=spec, out=out, slo=slo, seed=seed, reps=reps,
                             confidence=confidence, time=time_, notebooks=notebooks,
                             jobs=jobs, baseline=baseline, gates=gates, twin=twin,
                             command=(click.get_current_context().find_root().obj or {}).get("argv"),
                             accept_optimistic=accept_optimistic, sweeps=sweeps,
                             engine=engine.name, spark_master=engine.spark_master)
    click.echo(f"report: {result.index}")
    return 0
