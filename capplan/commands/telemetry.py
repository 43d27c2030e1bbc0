"""`capplan telemetry record`: sample GPU power/energy/utilisation/memory/clocks via NVML."""

from __future__ import annotations

import subprocess

import click


@click.group("telemetry")
def cmd():
    """GPU telemetry for the study's resources/ folder."""


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
