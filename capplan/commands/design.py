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
              help="bootstrap replicates per trial fit")
@click.option("--sims", type=int, default=4, show_default=True,
              help="simulated outcomes per candidate run")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--url", default="http://127.0.0.1:8000", show_default=True,
              help="server URL in the printed commands")
@click.option("--model", "model_name", default="MODEL", show_default=True,
              help="model name in the printed commands")
def cmd(study, slo_text, budget_minutes, out, twin_path, confidence, reps, sims, seed, url,
        model_name) -> int:
    """Propose the next runs of a sweep (rates, repeats, durations)."""
    import yaml

    from ..design import load_model, propose, write_design
    from ..envelope import fit_envelope
    from ..errors import SpecError

    if reps < 10:
        raise SpecError(f"--reps must be at least 10, got {reps}", field="reps")
    if sims < 1:
        raise SpecError(f"--sims must be at least 1, got {sims}", field="sims")
    model = load_model(twin_path) if twin_path else None
    env = fit_envelope(study, slo_text, confidence=confidence, reps=reps, seed=seed)
    d = propose(env, budget_minutes=budget_minutes, sims=sims, reps=reps, seed=seed,
                model=model)
    click.echo(env.honesty.to_text())
    click.echo("")
    text = d.to_text()
    if d.runs:  # the commands with the caller's server and model
        head = text.split("\n# guidellm")[0]
        lines = [head]
        for tool, cmds in d.commands(url=url, model=model_name).items():
            lines += [f"# {tool}", *cmds]
        lines += ["", "# manifest stub (add to study.yaml runs:)",
                  yaml.safe_dump(d.manifest_stub(), sort_keys=False).rstrip()]
        text = "\n".join(lines)
    click.echo(text)
    write_design(d, out)
    click.echo(f"\nwrote {out}")
    return 0
