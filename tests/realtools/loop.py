"""The planner's loop with a real load tool — now ``capplan.loadtest`` (one road): a coarse
sweep, then rounds of ``design`` whose runs are the tool's printed command lines (run in their
own process group; the peer-tools venv's bin first on PATH is the only change), imported with
``import auto ... --into`` and refitted, until the bound is honest or the rounds or the budget
run out.

This module keeps the call the suite (tests/test_loop_realtools.py) and
benchmarks/loop_realtools.py make: ``loop(tool, ...)`` builds the workload, the target and the
``Spec`` and returns ``capplan.loadtest.LoadtestResult``. Test support, not library.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from capplan.errors import CapplanError
from capplan.loadtest import LoadtestResult, Spec, ToolTarget, run_in_group, run_loadtest


class LoopError(RuntimeError):
    pass


def run_line(line: str, *, peers_bin: str, cwd: str, timeout_s: float = 600.0) -> int:
    """Run one printed command exactly as printed (``bash -c``, in its own process group as
    ``capplan loadtest`` runs it); the only change to the environment is the peer-tools venv's
    bin directory (and the interpreter running capplan, for printed ``capplan`` lines) first
    on PATH. Used by the real-engine test and benchmarks/twin_realtools.py."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([peers_bin, str(Path(sys.executable).parent), env.get("PATH", "")])
    rc, tail = run_in_group(["bash", "-c", line], cwd=cwd, env=env, timeout_s=timeout_s)
    if rc != 0:
        raise LoopError(f"exit {rc}: {line}\n--- output\n{tail}")
    return rc


def _capplan(*args: str, cwd: str) -> subprocess.CompletedProcess:
    """`capplan ARGS` as a user types it (the console script beside this interpreter)."""
    exe = Path(sys.executable).parent / "capplan"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "capplan"]
    p = subprocess.run(cmd + list(args), cwd=cwd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise LoopError(f"capplan {' '.join(args)} exited {p.returncode}\n{p.stdout[-3000:]}\n"
                        f"{p.stderr[-3000:]}")
    return p


def workload(*, prompt_tokens: int, output_tokens: int, tokenizer: str, grace_s: float,
             arrival: str = "poisson") -> dict:
    """The study's workload (the manifest ``workload`` schema) for the coarse sweep."""
    fixed = lambda v: {"mean": float(v), "sd": 0.0, "min": v, "p50": v, "p90": v, "p99": v,  # noqa: E731
                       "max": v}
    return {"arrival": arrival, "endpoint": "chat", "streaming": True,
            "input_tokens": fixed(prompt_tokens),
            "output_tokens": dict(fixed(output_tokens), **{"from": "asked"}),
            "output_fixed": True,
            "asked": {"input_tokens": prompt_tokens, "output_tokens": output_tokens},
            "tokenizer": tokenizer, "grace_s": grace_s}


def loop(tool: str, *, url: str, model: str, tokenizer: str, slo: str, coarse_rates,
         duration_s: float, workdir: str | os.PathLike, peers_bin: str, seed: int = 0,
         prompt_tokens: int = 64, output_tokens: int = 32, grace_s: float = 10.0,
         budget_minutes: float = 10.0, max_rounds: int = 3, reps: int = 400, sims: int = 4,
         total_minutes: float = 60.0, tolerance: float = 0.99) -> LoadtestResult:
    """``capplan.loadtest.run_loadtest`` with ``tool`` against ``url``: ``budget_minutes`` is
    each design round's budget, ``total_minutes`` the whole test's; the default ``tolerance``
    stops at the first honest bound (the loop of issue 25). ``seed`` offsets every load-tool
    seed and seeds the fits."""
    w = workload(prompt_tokens=prompt_tokens, output_tokens=output_tokens, tokenizer=tokenizer,
                 grace_s=grace_s)
    target = ToolTarget(tool, url=url, model=model, workload=w, tokenizer=tokenizer,
                        path_prefix=(peers_bin,))
    spec = Spec(slo=slo, coarse_rates=tuple(float(r) for r in coarse_rates),
                duration_s=float(duration_s), budget_minutes=total_minutes,
                round_minutes=budget_minutes, max_rounds=max_rounds, tolerance=tolerance,
                seed=int(seed), reps=reps, sims=sims)
    try:
        return run_loadtest(target, spec, workdir)
    except CapplanError as exc:
        raise LoopError(exc.format()) from None


def as_dict(res: LoadtestResult) -> dict:
    """The loop's summary as benchmarks/loop_realtools.py tabulates it: honest, load-test
    minutes, wall seconds, and per round the fit obtained (estimate, interval, bound)."""
    from dataclasses import asdict

    return {"honest": res.honest, "minutes": round(res.minutes, 3), "wall_s": res.wall_s,
            "stop": res.stop, "rounds": [dict(asdict(r.obtained), index=r.index)
                                         for r in res.rounds if r.obtained is not None]}
