"""`capplan plan [STUDY] --spec plan.yaml --out DIR`: print a capacity plan and export it."""

from __future__ import annotations

import click

from ..errors import SpecError
from .engine import engine_options


@click.command("plan")
@click.argument("study", required=False, type=click.Path())
@click.option("--spec", "spec_path", required=True, type=click.Path(), help="plan spec (see templates/plan.yaml)")
@click.option("--out", "out_dir", required=True, type=click.Path(), help="directory for plan.xlsx and CSVs")
@click.option("--slo", default=None, help="SLO, e.g. ttft_ms=2000,attainment=0.99 (overrides the spec)")
@click.option("--capacity-rps", type=float, default=None,
              help="capacity in req/s per replica group (instead of fitting the study)")
@click.option("--use", type=click.Choice(["lower_bound", "estimate"]), default=None,
              help="which C_SLO of the study to plan with (default: the spec's, lower_bound)")
@click.option("--reps", type=int, default=None, help="bootstrap replicates for the C_SLO fit")
@click.option("--seed", type=int, default=None, help="bootstrap seed")
@click.option("--confidence", type=float, default=None, help="confidence of the C_SLO bound")
@click.option("--gpus-per-replica", type=int, default=None,
              help="GPUs per replica group (TP × PP) when neither the spec nor a study gives it")
@click.option("--strict", is_flag=True, help="exit 1 when a plan check fails (files are still written)")
@click.option("--accept-optimistic", is_flag=True, default=None,
              help="plan with the study's lower bound even where the sweep cannot support it "
                   "honestly (the plan says so); without it such a plan is refused")
@click.option("--time", "time_", default=None,
              help="provenance time (ISO; default now, UTC); without start: in the spec the plan starts "
                   "with the calendar quarter after it")
@click.option("--twin", "twin", default=None, type=click.Path(),
              help="simulate the failure, rollout and cold-start checks at the planned size on this "
                   "twin (or synth config); writes plan-simulated.csv (docs/timeline.md)")
@click.option("--quarter", type=int, default=1, show_default=True,
              help="with --twin: the quarter whose peak the checks are simulated at (1 = the first)")
@click.option("--slo-minutes-budget", type=float, default=None,
              help="with --twin: each check must cause at most this many SLO-minutes; also finds "
                   "the smallest warm floor and fleet within it")
@click.option("--day", "day", is_flag=True, default=False,
              help="with --twin: also simulate a day under the autoscaler (a working day's shape)")
@click.option("--day-trace", "day_trace", default=None, type=click.Path(dir_okay=False),
              help="with --day: the day's shape from this trace (Azure CSV or Mooncake JSONL)")
@engine_options
def cmd(study, spec_path, out_dir, slo, capacity_rps, use, reps, seed, confidence, gpus_per_replica, strict,
        accept_optimistic, time_, twin=None, quarter=1, slo_minutes_budget=None, day=False, day_trace=None,
        engine=None):
    """Size replica groups, GPUs, nodes and cost for a demand and write the finance export."""
    from ..export import export_plan
    from ..plan import make_plan
    from ..plan.inputs import resolve_inputs

    # the given options, else the spec's (capplan.plan.inputs); no built-in SLO: a plan without
    # one is refused by make_plan, naming the spec's slo
    inputs = resolve_inputs(spec_path, slo=slo, use=use, reps=reps, seed=seed, confidence=confidence,
                            accept_optimistic=accept_optimistic, gpus_per_replica=gpus_per_replica,
                            builtin_slo=False)
    for note in inputs.notes:
        click.echo(f"note: {note}", err=True)
    spec = inputs.spec
    if study is None and capacity_rps is None and spec.capacity.source == "study":
        raise SpecError("no study and no capacity number", field="capacity",
                        fix="pass a study directory, or --capacity-rps N, or set capacity.rps_per_group in the spec")
    st = None
    study_hash = None
    if study is not None:
        st = engine.open(study)
        study_hash = st.content_hash()
    if slo is not None:  # --slo plans with that one SLO, not the spec's SLO classes
        import dataclasses

        spec = dataclasses.replace(spec, slo_classes=None)
    if time_:
        from ..export import created_time

        created_time(time_)  # a bad --time fails before the fit
    plan = make_plan(spec, capacity=capacity_rps, study=st, as_of=time_)
    if twin is not None and not 1 <= quarter <= len(plan.quarters):  # before anything is written
        raise SpecError(f"--quarter {quarter} is not in the plan (it has {len(plan.quarters)})",
                        field="--quarter", fix=f"use 1 … {len(plan.quarters)}")
    params = {"study": study, "spec": spec_path,
              "slo": (str(spec.slo) if spec.slo else None) if spec.slo_classes is None else str(spec.slo_classes),
              "capacity_rps": capacity_rps, "use": spec.capacity.use, "reps": spec.capacity.reps,
              "seed": spec.capacity.seed, "confidence": spec.capacity.confidence,
              "accept_optimistic": spec.capacity.accept_optimistic,
              "gpus_per_replica": gpus_per_replica}
    path = export_plan(plan, out_dir, time=time_, study_hash=study_hash, parameters=params)
    click.echo(plan.to_text())
    click.echo(f"\nwrote {path}/plan.xlsx and CSV tables")
    if twin is not None:
        _simulate(plan, twin, quarter, slo_minutes_budget, out_dir, day=day or bool(day_trace),
                  trace=day_trace)
    if strict and not plan.ok:
        click.echo("plan checks failed (--strict): " + "; ".join(c.sentence for c in plan.checks if not c.ok),
                   err=True)
        return 1
    return 0


def _simulate(plan, twin: str, quarter: int, budget: float | None, out_dir: str, *, day: bool = False,
              trace: str | None = None) -> None:
    """The plan's checks simulated on the twin (capplan.plan.dynamics), printed and written."""
    from pathlib import Path

    from ..io import write_csv
    from ..plan.dynamics import simulate_plan, smallest_fleet, smallest_warm_floor
    from ..twin import load_system

    import dataclasses
    import tempfile

    from ..plan.dynamics import SimSettings, day_scenario

    system = load_system(twin)
    dyn = simulate_plan(plan, system, quarter=quarter - 1, budget_slo_minutes=budget)
    if day:
        with tempfile.TemporaryDirectory(prefix="capplan-day-") as d:
            check = day_scenario(plan, system, quarter=quarter - 1, trace=trace,
                                 settings=SimSettings(window_s=60.0), budget=budget, tmp=Path(d))
        dyn = dataclasses.replace(dyn, checks=dyn.checks + (check,))
    click.echo("\n" + dyn.to_text())
    write_csv(dyn.to_frame(), Path(out_dir) / "plan-simulated.csv")
    if budget is not None:
        for search in (smallest_warm_floor(plan, system, budget, quarter=quarter - 1),
                       smallest_fleet(plan, system, budget, quarter=quarter - 1)):
            click.echo("\n" + search.to_text())
    click.echo(f"\nwrote {out_dir}/plan-simulated.csv")
