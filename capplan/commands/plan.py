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
@click.option("--time", "time_", default=None, help="provenance time (ISO); default now (UTC)")
@engine_options
def cmd(study, spec_path, out_dir, slo, capacity_rps, use, reps, seed, confidence, gpus_per_replica, strict, time_,
        engine):
    """Size replica groups, GPUs, nodes and cost for a demand and write the finance export."""
    from ..export import export_plan
    from ..plan import load_plan_spec, make_plan

    spec = load_plan_spec(spec_path)
    spec = _apply_overrides(spec, slo=slo, use=use, reps=reps, seed=seed, confidence=confidence)
    if gpus_per_replica is not None:
        spec = spec.with_(gpus_per_replica=gpus_per_replica)
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
    plan = make_plan(spec, capacity=capacity_rps, study=st)
    params = {"study": study, "spec": spec_path,
              "slo": (str(spec.slo) if spec.slo else None) if spec.slo_classes is None else str(spec.slo_classes),
              "capacity_rps": capacity_rps, "use": spec.capacity.use, "reps": spec.capacity.reps,
              "seed": spec.capacity.seed, "confidence": spec.capacity.confidence,
              "gpus_per_replica": gpus_per_replica}
    path = export_plan(plan, out_dir, time=time_, study_hash=study_hash, parameters=params)
    click.echo(plan.to_text())
    click.echo(f"\nwrote {path}/plan.xlsx and CSV tables")
    if strict and not plan.ok:
        click.echo("plan checks failed (--strict): " + "; ".join(c.sentence for c in plan.checks if not c.ok),
                   err=True)
        return 1
    return 0


def _apply_overrides(spec, *, slo, use, reps, seed, confidence):
    import dataclasses

    from ..slo import SLO

    cap = {k: v for k, v in (("use", use), ("reps", reps), ("seed", seed), ("confidence", confidence))
           if v is not None}
    if cap:
        try:
            spec = dataclasses.replace(spec, capacity=dataclasses.replace(spec.capacity, **cap))
        except SpecError as exc:
            raise SpecError(exc.args[0], field=exc.field, fix=exc.fix, file=spec.source) from None
    if slo is not None:
        spec = dataclasses.replace(spec, slo=SLO.parse(slo))
    return spec
