"""`capplan twin`: fit a twin to a study, check it against the measured runs, run scenarios on it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import SpecError
from ..slo import CSLO_REPS, check_reps


def _say(msg: str) -> None:
    click.echo(msg, err=True)


@click.group("twin")
def cmd():
    """A calibrated twin of the measured system (docs/twin.md).

    \b
      capplan twin fit STUDY --out twin.yaml
      capplan twin check STUDY --twin twin.yaml --slo ttft_ms=2000,tpot_ms=100,attainment=0.99 --out check.json
      capplan twin check STUDY --holdout 6 --slo ttft_ms=2000,tpot_ms=100
      capplan twin run --twin twin.yaml --scenario scenario.yaml --out STUDY2
    """


def _refuse_non_twin(path: Path) -> None:
    """twin.yaml is replaced as a whole: never overwrite some other file after a typo."""
    if path.exists():
        if path.is_dir():
            raise SpecError("--out is a folder", file=str(path), field="--out", fix="give a file name, e.g. twin.yaml")
        head = path.read_text(encoding="utf-8", errors="replace")[:2000]
        if "capplan-twin/" not in head:
            raise SpecError("--out exists and is not a twin file; refusing to replace it", file=str(path),
                            field="--out", fix="choose a new file name (an earlier twin file is replaced)")


@cmd.command("fit")
@click.argument("study", type=click.Path())
@click.option("--out", default="twin.yaml", show_default=True, type=click.Path(dir_okay=False),
              help="twin file to write")
@click.option("--runs", default=None, help="comma-separated run ids to fit on (default: all)")
@click.option("--below", "below", type=float, default=None, help="fit only on runs offered below this rate (req/s)")
@click.option("--reps", type=int, default=200, show_default=True, help="bootstrap replicates for the intervals")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--name", default=None, help="the twin's name (default: 'twin of <study>')")
def fit_cmd(study, out, runs, below, reps, seed, name):
    """Estimate a twin from STUDY's events and write twin.yaml."""
    from ..twin import fit_twin, write_twin

    check_reps(reps)
    out_p = Path(out)
    _refuse_non_twin(out_p)
    tw = fit_twin(study, runs=tuple(r.strip() for r in runs.split(",")) if runs else None, below_rps=below,
                  reps=reps, seed=seed, name=name)
    write_twin(tw, out_p)
    click.echo(tw.to_text())
    _say(f"wrote {out_p}")
    return 0


@cmd.command("check")
@click.argument("study", type=click.Path())
@click.option("--twin", "twin_path", default=None, type=click.Path(dir_okay=False), help="twin.yaml to check")
@click.option("--slo", required=True, help="e.g. ttft_ms=2000,tpot_ms=100,attainment=0.99")
@click.option("--replays", type=int, default=20, show_default=True, help="replays of each run")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="write check.json here")
@click.option("--holdout", type=float, default=None,
              help="fit on the runs below this rate (req/s) and predict the runs at or above it")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--reps", type=int, default=CSLO_REPS, show_default=True,
              help="bootstrap replicates of the measured C_SLO (the default is capplan envelope's; fewer are "
                   "printed as an approximation)")
@click.option("--steady-draws", type=int, default=10, show_default=True,
              help="parameter draws for the steady-state C_SLO interval")
@click.option("--no-steady", is_flag=True, help="skip the steady-state C_SLO (faster)")
@click.option("--workers", type=int, default=None, help="processes for the steady-state C_SLO (default: up to 2)")
def check_cmd(study, twin_path, slo, replays, out, holdout, seed, reps, steady_draws, no_steady, workers):
    """Replay STUDY's runs through the twin and compare with what was measured."""
    from ..slo import SLO
    from ..twin import check_holdout, check_twin, load_twin, record_check, write_twin

    s = SLO.parse(slo)
    if replays < 2:
        raise SpecError(f"--replays must be ≥ 2, got {replays}", field="--replays")
    if holdout is not None:
        if twin_path:
            raise SpecError("--holdout fits its own twin from the runs below the rate; drop --twin",
                            field="--holdout/--twin")
        tw, chk = check_holdout(study, s, holdout, replays=replays, seed=seed, reps=reps, steady=not no_steady,
                                steady_draws=steady_draws, workers=workers)
    else:
        if not twin_path:
            raise SpecError("give --twin twin.yaml (or --holdout RATE)", field="--twin",
                            fix="fit one first: capplan twin fit STUDY --out twin.yaml")
        tw = load_twin(twin_path)
        if tw.warning:
            _say(tw.warning)
        chk = check_twin(tw, study, s, replays=replays, seed=seed, reps=reps, steady=not no_steady,
                         steady_draws=steady_draws, workers=workers)
    click.echo(chk.to_text())
    if out:
        chk.to_json(out)
        _say(f"wrote {out}")
    if twin_path:
        rec = {"verdict": chk.verdict, "where": "; ".join(chk.where) or "every run and metric within the twin's "
               "prediction", "study": chk.study, "slo": str(s), "replays": replays, "file": out}
        record_check(twin_path, rec)
        _say(f"recorded the verdict in {twin_path}")
    elif holdout is not None and out:
        write_twin(tw, Path(out).with_suffix(".twin.yaml"))
    return 0


@cmd.command("run")
@click.option("--twin", "twin_path", required=True, type=click.Path(dir_okay=False), help="twin.yaml")
@click.option("--scenario", "scenario_path", required=True, type=click.Path(dir_okay=False), help="scenario.yaml")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="study directory to write")
@click.option("--workers", type=int, default=None, help="parallel processes (default: up to 2)")
@click.option("--no-progress", is_flag=True, help="no progress bar on stderr")
def run_cmd(twin_path, scenario_path, out, workers, no_progress):
    """Run a scenario on the twin and write an ordinary study."""
    from ..twin import load_scenario, load_twin, run_scenario

    tw = load_twin(twin_path)
    sc = load_scenario(scenario_path)
    if tw.warning:
        _say(tw.warning)
    path, stats, ctx = run_scenario(tw, sc, out, twin_path=str(twin_path), workers=workers,
                                    progress=not no_progress)
    n = sum(s["requests"] for s in stats)
    _say(f"wrote {path}: {len(stats)} runs, {n:,} requests — scenario {sc.name}: {sc.describe()}")
    for note in ctx.notes:
        _say(f"note: {note}")
    for s in stats:
        _say(f"  {s['run_id']}: {s['level']:g} req/s  requests {s['requests']:,}  ok {s['ok']:,}  timeout "
             f"{s['timeout']:,}  rejected {s['rejected']:,}  error {s['error']:,}  cancelled {s['cancelled']:,}"
             + (f"  retries {s['retries_sent']:,} (×{s['retry_amplification']:.4f} attempts per request)"
                if s.get("retries_sent") else ""))
    sys.stderr.flush()
    return 0
