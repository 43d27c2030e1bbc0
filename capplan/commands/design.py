"""`capplan design STUDY --slo ... [--budget-minutes N]`: the next runs that most shrink the
distance between C_SLO and its honest lower bound per minute of load-test time, with the
bound expected after them, ready-to-run commands and a manifest stub; writes design.yaml."""

from __future__ import annotations

import click


@click.command("design")
@click.argument("study", type=click.Path())
@click.option("--slo", "slo_text", required=True,
              help="SLO, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99")
@click.option("--budget-minutes", type=float, default=60.0, show_default=True,
              help="load-test time the next runs may take")
@click.option("--out", "out", type=click.Path(dir_okay=False), default="design.yaml",
              show_default=True, help="where to write the design")
@click.option("--twin", "twin_path", type=click.Path(dir_okay=False), default=None,
              help="expected outcomes from this model (a twin file or a synth config) instead "
                   "of the current fit")
@click.option("--confidence", type=float, default=0.95, show_default=True)
@click.option("--reps", type=int, default=200, show_default=True,
              help="bootstrap replicates per trial fit (the expected numbers, labelled approximate when "
                   "fewer than the measured C_SLO's; \"now\" is always the measured C_SLO, as capplan "
                   "envelope prints it)")
@click.option("--sims", type=int, default=4, show_default=True,
              help="simulated outcomes per candidate run")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--url", default="http://127.0.0.1:8000", show_default=True,
              help="server URL in the printed commands")
@click.option("--model", "model_name", default="MODEL", show_default=True,
              help="model name in the printed commands")
@click.option("--tokenizer", default=None,
              help="tokenizer directory or hub name for AIPerf/GuideLLM (default: the study's "
                   "workload.tokenizer)")
@click.option("--runs-dir", default="runs", show_default=True,
              help="folder the printed commands write each run's output to (one sub-folder a run)")
@click.option("--seed-base", type=int, default=None,
              help="first load-tool seed (default: 1000 × (runs in the study + 1), so every round "
                   "sends new arrivals)")
def cmd(study, slo_text, budget_minutes, out, twin_path, confidence, reps, sims, seed, url,
        model_name, tokenizer, runs_dir, seed_base) -> int:
    """Propose the next runs of a sweep (rates, repeats, durations)."""
    import yaml

    from ..design import propose, write_design
    from ..twin import load_system
    from ..envelope import fit_envelope
    from ..errors import SpecError
    from ..slo import check_reps

    check_reps(reps)
    if sims < 1:
        raise SpecError(f"--sims must be at least 1, got {sims}", field="sims")
    model = load_system(twin_path) if twin_path else None
    # "now": the measured C_SLO with capplan envelope's replicates; the trial fits use --reps
    env = fit_envelope(study, slo_text, confidence=confidence, seed=seed)
    d = propose(env, budget_minutes=budget_minutes, sims=sims, reps=reps, seed=seed,
                model=model, study_path=study)
    click.echo(env.honesty.to_text())
    click.echo("")
    tc = d.commands(url=url, model=model_name, tokenizer=tokenizer, seed_base=seed_base,
                    out_dir=runs_dir, design_path=out) if d.runs else None
    text = d.to_text()
    if tc is not None:  # the commands with the caller's server, model and paths
        text = text.split("\n# aiperf")[0].rstrip() + "\n\n" + tc.to_text()
        text += ("\n\n# or, without a load tool: add the runs by hand (study.yaml runs:)\n"
                 + yaml.safe_dump(d.manifest_stub(), sort_keys=False).rstrip())
    click.echo(text)
    write_design(d, out, commands=tc)
    click.echo(f"\nwrote {out}")
    return 0
