"""`capplan telemetry record`: sample GPU power/energy/utilisation/memory/clocks via NVML.
`capplan telemetry engine`: import the serving engine's recorded /metrics scrapes into a study."""

from __future__ import annotations

import subprocess

import click


@click.group("telemetry")
def cmd():
    """GPU telemetry (resources/) and the engine's own /metrics (engine_metrics/) of a study."""


@cmd.command("record", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--interval", type=float, default=0.1, show_default=True, help="seconds between samples")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
              help="parquet file to write (a .gpu.yaml sidecar goes next to it)")
@click.option("--duration", type=float, default=None, help="stop after this many seconds")
@click.option("--run-id", default=None, help="run_id to stamp on every sample")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record_cmd(interval, out, duration, run_id, command):
    """Record for --duration seconds, or while COMMAND runs (after --), or until Ctrl-C.

    Example: capplan telemetry record --interval 0.1 --out resources/power.parquet -- vllm bench serve ...
    """
    from ..telemetry import TelemetryError, record, write_recording

    if out and not str(out).endswith(".parquet"):
        raise TelemetryError(f"--out must name a .parquet file, got {out}", fix="e.g. --out resources.parquet")
    proc: dict = {}

    def start():
        if command:
            try:
                proc["p"] = subprocess.Popen(list(command))
            except OSError as exc:
                raise TelemetryError(f"cannot start the command {command[0]!r}: {exc.strerror or exc}",
                                     fix="check the command after --") from None

    def should_stop():
        p = proc.get("p")
        if p is not None and p.poll() is not None:
            return f"command exited with code {p.returncode}"
        return None

    rec = record(interval_s=interval, duration_s=duration, should_stop=should_stop if command else None,
                 run_id=run_id, command=tuple(command), on_start=start)
    rc = 0
    p = proc.get("p")
    if p is not None:
        if p.poll() is None:  # duration reached or Ctrl-C while the command still runs: let it finish
            click.echo("recording stopped; waiting for the command to finish (Ctrl-C again to stop it)", err=True)
            try:
                p.wait()
            except KeyboardInterrupt:
                p.terminate()
                p.wait()
        rc = p.returncode
        import dataclasses

        rec = dataclasses.replace(rec, returncode=rc)
    path, side = write_recording(rec, out)
    click.echo(rec.summary())
    click.echo(f"wrote {path} and {side}")
    if rc:
        click.echo(f"the command exited with code {rc}", err=True)
    return rc


@cmd.command("engine")
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--into", "into", required=True, type=click.Path(file_okay=False),
              help="the study whose runs the scrapes were taken during")
@click.option("--run-start", "run_start", multiple=True, metavar="RUN=EPOCH_S",
              help="a run's wall-clock start (epoch seconds of its first scheduled request), "
                   "for runs whose study.yaml has no epoch_start_ns; repeatable")
@click.option("--name", default=None,
              help="file name under engine_metrics/ (default: the first file's stem); the same "
                   "name again replaces it")
def engine_cmd(files, into, run_start, name):
    """Import recorded Prometheus /metrics scrapes of the serving engine (vLLM, llama.cpp) into
    STUDY/engine_metrics/: each scrape goes to the run whose time span holds it.

    FILES: '# scrape at <epoch s>' blocks of /metrics text, JSON lines {"t", "text"}, or
    AIPerf's server_metrics_export.jsonl (docs/engine-metrics.md).

    Example: capplan telemetry engine scrapes.prom --into studies/llama
    """
    from pathlib import Path

    from .. import engine_metrics as E
    from ..errors import SpecError
    from ..study import open_study

    starts = {}
    for item in run_start:
        rid, sep, val = item.partition("=")
        try:
            starts[rid.strip()] = E.epoch_seconds_ns(val.strip())
        except ValueError:
            sep = ""
        if not sep or not rid.strip():
            raise SpecError(f"--run-start {item!r}: expected RUN=<epoch seconds>",
                            field="--run-start", fix="e.g. --run-start r01=1796167537.605")
    read = [E.read_scrapes(f) for f in files]
    study = open_study(into)
    placed = E.place(read, E.run_spans(study, starts))
    n = sum(len(f.scrapes) for f in read)
    if not placed.table.num_rows:
        raise SpecError(f"none of the {n} scrapes falls inside a run of {study.name} "
                        "(each run spans its epoch_start_ns to its last request stamp)",
                        field="FILES", file=str(files[0]),
                        fix="check the study and the recording are of the same sweep, or give "
                            "--run-start RUN=<epoch s> where study.yaml's epoch_start_ns is wrong")
    path = E.write(study.root, placed, name or Path(files[0]).name.split(".")[0])
    click.echo(f"{n} scrapes read from {len(read)} file(s) ({', '.join(f.format for f in read)}); "
               + ", ".join(f"{rid}: {k}" for rid, k in placed.scrapes_by_run.items()))
    if placed.outside:
        click.echo(f"{placed.outside} scrape(s) fall in no run's span (between or outside the "
                   "runs) and were left out")
    if placed.skipped_samples:
        click.echo(f"{placed.skipped_samples:,} histogram, summary or NaN samples left out "
                   "(counters and gauges are kept)")
    found = {key: next((m for m in names if m in set(placed.table["metric"].to_pylist())), None)
             for key, names in E.SIGNALS.items()}
    click.echo("signals: " + ", ".join(f"{k} {'from ' + v if v else 'not recorded'}"
                                      for k, v in found.items()))
    click.echo(f"wrote {path}")
    return 0
