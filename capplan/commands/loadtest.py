"""`capplan loadtest`: run the load tool until the planning number is honest (docs/loadtest.md).
A thin shell over ``capplan.loadtest.run_loadtest``: progress lines on stderr, the result on
stdout. Exit 0: honest within the tolerance; 1: stopped otherwise (the budget, the rounds, no
run left to propose; the result says what is missing); 2: bad input or a failed probe (no load
sent); 130: Ctrl-C or SIGTERM (finished runs kept, --resume continues)."""

from __future__ import annotations

import signal

import click


def _as_ctrl_c(signum, frame):
    raise KeyboardInterrupt


def _rates(text: str | None) -> tuple[float, ...]:
    from ..errors import SpecError

    if not text:
        return ()
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(f"--rates must be numbers separated by commas, got {text!r}",
                        field="--rates", fix="e.g. --rates 4,8,12,16") from None


@click.command("loadtest")
@click.option("--tool", type=click.Choice(["aiperf", "guidellm", "vllm"]), default=None,
              help="the load tool to drive (on PATH)")
@click.option("--url", default=None, help="the server: the only address traffic goes to")
@click.option("--model", "model_name", default=None, help="the served model's name")
@click.option("--tokenizer", default=None, help="tokenizer directory or hub name for the tool")
@click.option("--workload", "workload_path", type=click.Path(dir_okay=False), default=None,
              help="workload.yaml: a study manifest's workload mapping (lengths, arrival)")
@click.option("--synth", "--twin", "synth_path", type=click.Path(dir_okay=False), default=None,
              help="instead of a server: a synth config or twin file to simulate the runs on")
@click.option("--slo", "slo_text", required=True,
              help="SLO, e.g. ttft_ms=2000,tpot_ms=100,attainment=0.95")
@click.option("--rates", "rates_text", default=None,
              help="coarse sweep rates in req/s, e.g. 4,8,12,16 (synth: the config's rates)")
@click.option("--duration-s", type=float, default=None,
              help="coarse run length in s (default 60; synth: the config's)")
@click.option("--budget-minutes", type=float, default=30.0, show_default=True,
              help="load-test minutes (runs' durations summed) the whole test may use")
@click.option("--max-requests", type=int, default=200_000, show_default=True,
              help="total requests (rate × duration) the whole test may send")
@click.option("--tolerance", type=float, default=0.15, show_default=True,
              help="stop once honest and (estimate − bound)/estimate is at most this")
@click.option("--round-minutes", type=float, default=None,
              help="budget of one design round (default: a third of --budget-minutes)")
@click.option("--max-rounds", type=int, default=6, show_default=True)
@click.option("--max-rate-factor", type=float, default=2.0, show_default=True,
              help="no run above this × the current estimate")
@click.option("--max-rate", type=float, default=None, help="no run above this rate (req/s)")
@click.option("--max-run-s", type=float, default=None,
              help="no run longer than this, seconds (default: 4 × --duration-s); the design asks "
                   "for longer runs when those near the crossing are still settling")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--reps", type=int, default=400, show_default=True,
              help="bootstrap replicates of each fit")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="load-test folder: study/, runs/, designs/, loadtest.json")
@click.option("--resume", is_flag=True, help="continue the load test recorded in --out")
def cmd(tool, url, model_name, tokenizer, workload_path, synth_path, slo_text, rates_text,
        duration_s, budget_minutes, max_requests, tolerance, round_minutes, max_rounds,
        max_rate_factor, max_rate, max_run_s, seed, reps, out, resume) -> int:
    """Run the load tool until the planning number is honest, within a budget.

    \b
      capplan loadtest --tool aiperf --url http://127.0.0.1:8000 --model m --tokenizer TOK \\
          --workload workload.yaml --slo ttft_ms=75,tpot_ms=20,attainment=0.95 \\
          --rates 8,12,16,20,24 --duration-s 15 --budget-minutes 20 --out lt
      capplan loadtest --synth model.yaml --slo ttft_ms=2000,tpot_ms=100,attainment=0.99 --out lt
    """
    from ..errors import SpecError
    from ..loadtest import Spec, SynthTarget, ToolTarget, read_workload, run_loadtest

    if bool(synth_path) == bool(tool):
        raise SpecError("give exactly one of --tool (a server) and --synth (a model)",
                        field="--tool/--synth",
                        fix="--tool aiperf --url URL --model NAME --workload W, or --synth CONFIG")
    if synth_path:
        from ..twin import load_system

        model = load_system(synth_path)
        target = SynthTarget(model, name=synth_path, seed=seed)
        cfg = getattr(model, "rates", None)
        rates = _rates(rates_text) or tuple(float(r) for r in (cfg or ()))
        dur = duration_s or float(getattr(model, "duration_s", None) or 60.0)
    else:
        missing = [n for n, v in (("--url", url), ("--model", model_name),
                                  ("--workload", workload_path), ("--rates", rates_text)) if not v]
        if missing:
            raise SpecError(f"--tool needs {', '.join(missing)}", field=missing[0],
                            fix="capplan loadtest --tool aiperf --url URL --model NAME "
                                "--workload workload.yaml --rates 4,8,12 ...")
        target = ToolTarget(tool, url=url, model=model_name, workload=read_workload(workload_path),
                            tokenizer=tokenizer)
        rates = _rates(rates_text)
        dur = duration_s or 60.0
    if not rates:
        raise SpecError("no coarse rates", field="--rates", fix="e.g. --rates 4,8,12,16")
    spec = Spec(slo=slo_text, coarse_rates=rates, duration_s=dur, budget_minutes=budget_minutes,
                max_requests=max_requests, tolerance=tolerance, round_minutes=round_minutes,
                max_rounds=max_rounds, max_rate_factor=max_rate_factor, max_rate_rps=max_rate,
                max_run_s=max_run_s,
                seed=seed, reps=reps)
    # SIGTERM stops the load test like Ctrl-C (the tool's process group stopped, finished runs
    # kept): Python's default for SIGTERM exits without running any ``finally``
    old = signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        res = run_loadtest(target, spec, out, resume=resume,
                           on_event=lambda kind, line: click.echo(f"[{kind}] {line}", err=True))
    finally:
        signal.signal(signal.SIGTERM, old)
    click.echo(res.to_text())
    return 0 if res.stop == "honest" else 1
