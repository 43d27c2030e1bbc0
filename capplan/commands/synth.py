"""`capplan synth`: write a synthetic load-sweep study, or estimate true attainment (--truth)."""

from __future__ import annotations

import sys

import click

from ..errors import SpecError


def _config(preset_name, config_path, seed, no_itl):
    from ..sim.config import load_config, preset

    if bool(preset_name) == bool(config_path):
        raise SpecError("give exactly one of --preset NAME or --config FILE", field="--preset/--config",
                        fix="e.g. capplan synth --preset demo --out data/sample")
    cfg = preset(preset_name) if preset_name else load_config(config_path)
    if seed is not None:
        cfg = cfg.with_(seed=int(seed))
    if no_itl:
        cfg = cfg.with_(itl=False)
    return cfg


@click.command("synth")
@click.option("--preset", "preset_name", default=None, help="demo | bench | small")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="YAML synth config (docs/synth.md)")
@click.option("--out", default=None, type=click.Path(file_okay=False), help="study directory to write")
@click.option("--seed", type=int, default=None, help="override the config's seed")
@click.option("--workers", type=int, default=None, help="parallel processes (default: up to 2)")
@click.option("--no-itl", is_flag=True, help="omit per-token itl_ns lists (smaller files)")
@click.option("--no-progress", is_flag=True, help="no progress bar on stderr")
@click.option("--truth", is_flag=True, help="estimate the true attainment at --rate for --slo instead")
@click.option("--rate", "rates", type=float, multiple=True, help="offered rate(s) for --truth")
@click.option("--slo", default=None, help="SLO for --truth, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99")
@click.option("--replications", type=int, default=8, show_default=True, help="--truth: runs per rate")
@click.option("--duration-s", type=float, default=None, help="--truth: run length (default: the config's)")
@click.option("--capacity-between", "bracket", type=float, nargs=2, default=None,
              help="--truth: also bisect for the true capacity between LO and HI req/s")
@click.option("--design", "design_path", default=None, type=click.Path(dir_okay=False),
              help="run a sweep design (design.yaml from capplan design: the sweep so far and "
                   "the next runs) against --twin")
@click.option("--twin", "twin_path", default=None, type=click.Path(dir_okay=False),
              help="with --design: the model to run it on (a twin file, or a synth config)")
def cmd(preset_name, config_path, out, seed, workers, no_itl, no_progress, truth, rates, slo,
        replications, duration_s, bracket, design_path, twin_path):
    """Simulate a load sweep against LLM-serving replicas and write a study directory.

    \b
      capplan synth --preset demo --out data/sample
      capplan synth --config my.yaml --out DIR --seed 7
      capplan synth --truth --preset demo --rate 5 --rate 6 --slo ttft_ms=2000,tpot_ms=100
      capplan synth --truth --preset demo --slo ttft_ms=2000,tpot_ms=100 --capacity-between 1 12
      capplan synth --design design.yaml --twin twin.yaml --out preview
    """
    if design_path or twin_path:
        return _run_design(design_path, twin_path, out, seed, workers, no_progress)
    cfg = _config(preset_name, config_path, seed, no_itl)
    if truth:
        from ..slo import SLO
        from ..sim.truth import true_attainment

        if not rates and not bracket:
            raise SpecError("--truth needs --rate R (repeatable) or --capacity-between LO HI", field="--rate",
                            fix="e.g. --rate 5.5")
        if not slo:
            raise SpecError("--truth needs --slo", field="--slo", fix="e.g. --slo ttft_ms=2000,tpot_ms=100")
        if replications < 1:
            raise SpecError("--replications must be ≥ 1", field="--replications")
        s = SLO.parse(slo)
        click.echo(f"true attainment of '{s.describe()}' ({cfg.name}, {replications} runs per rate)")
        click.echo(f"{'offered_rps':>11} {'attainment':>10} {'ci95_low':>9} {'ci95_high':>9} {'requests':>9}  meets")
        for r in rates:
            t = true_attainment(cfg, r, s, replications=replications, duration_s=duration_s)
            click.echo(f"{r:>11g} {t.attainment:>10.4f} {t.ci_low:>9.4f} {t.ci_high:>9.4f} {t.n_requests:>9d}  "
                       f"{'yes' if t.attainment >= s.attainment else 'no'}")
        if bracket:
            from ..sim.truth import true_capacity

            c = true_capacity(cfg, s, bracket[0], bracket[1], replications=replications, duration_s=duration_s)
            click.echo(f"true capacity: {c.capacity_rps:.3f} req/s (passes at {c.bracket[0]:.3f}, "
                       f"fails at {c.bracket[1]:.3f}; {len(c.evaluations)} rates simulated)")
        return 0
    if not out:
        raise SpecError("--out DIR is required", field="--out", fix="e.g. --out data/sample")
    from ..sim.sweep import generate_study

    path, stats = generate_study(cfg, out, workers=workers, progress=not no_progress)
    n = sum(s["requests"] for s in stats)
    click.echo(f"wrote {path}: {len(stats)} runs, {n:,} requests", err=True)
    for s in stats:
        click.echo(f"  {s['run_id']}: level {s['level']:g}  requests {s['requests']:,}  ok {s['ok']:,}  "
                   f"timeout {s['timeout']:,}  rejected {s['rejected']:,}  error {s['error']:,}  "
                   f"cancelled {s['cancelled']:,}  preemptions {s['preemptions']:,}", err=True)
    sys.stderr.flush()
    return 0


def _run_design(design_path, twin_path, out, seed, workers, no_progress) -> int:
    """``--design D --twin T``: simulate the designed sweep (existing runs + next runs) on T."""
    from ..design import design_plans, design_warmup, load_design, model_config
    from ..twin import load_system
    from ..sim.sweep import generate_study

    if not (design_path and twin_path):
        raise SpecError("--design and --twin go together", field="--design/--twin",
                        fix="capplan synth --design design.yaml --twin twin.yaml --out DIR")
    if not out:
        raise SpecError("--out DIR is required", field="--out", fix="e.g. --out preview")
    d = load_design(design_path)
    plans = design_plans(d)
    if not plans:
        raise SpecError("the design has no runs", file=str(design_path))
    model = load_system(twin_path)
    cfg = model_config(model, rates=sorted({p.level for p in plans}),
                       duration_s=max(p.duration_s for p in plans),
                       warmup_s=design_warmup(d), seed=0 if seed is None else int(seed))
    path, stats = generate_study(cfg, out, workers=workers, progress=not no_progress, plans=plans)
    click.echo(f"wrote {path}: {len(stats)} runs of the design on {twin_path} "
               f"({sum(s['requests'] for s in stats):,} requests)", err=True)
    return 0
