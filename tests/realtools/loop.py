"""The planner's loop with a real load tool, as docs/design.md tells a planner to run it:

    coarse sweep (the tool's commands from capplan.loadtools, run verbatim)
    → capplan import auto … --out STUDY
    → round: capplan envelope; if the bound is unsupported, capplan design … --out design.yaml,
      run every command it printed for the tool exactly as printed (bash -c; the peer-tools
      venv's bin first on PATH is the only change), then its printed `capplan import auto …
      --into STUDY` line; refit
    → until the bound is honest, or the rounds or the load-test budget run out.

Used by tests/test_loop_realtools.py (short: a small server, short runs) and by
benchmarks/loop_realtools.py (many loops with different seeds). Test support, not library.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from capplan.errors import StudyError



@dataclass(frozen=True)
class Round:
    """One round of the loop: the fit before it, and what design proposed and expected."""

    index: int
    runs_in_study: int
    minutes_so_far: float
    estimate: float
    ci_low: float
    ci_high: float
    lower_bound: float
    honesty: str
    proposed_runs: int = 0
    proposed_minutes: float = 0.0
    expected_lower_bound: float = math.nan
    expected_honesty: str = ""
    commands: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LoopResult:
    tool: str
    study: str
    rounds: tuple[Round, ...]
    honest: bool
    minutes: float                 # load-test minutes (sum of the runs' durations)
    wall_s: float
    executed: tuple[tuple[str, int], ...] = field(default=())  # (line, exit code), verbatim

    @property
    def final(self) -> Round:
        return self.rounds[-1]

    def to_dict(self) -> dict:
        return {"tool": self.tool, "study": self.study, "honest": self.honest,
                "minutes": self.minutes, "wall_s": self.wall_s,
                "rounds": [r.to_dict() for r in self.rounds],
                "executed": [list(e) for e in self.executed]}


class LoopError(RuntimeError):
    pass


def run_line(line: str, *, peers_bin: str, cwd: str, timeout_s: float = 600.0) -> int:
    """Run one printed command exactly as printed (``bash -c``); the only change to the
    environment is the peer-tools venv's bin directory (and the interpreter running capplan,
    for the printed ``capplan`` lines) first on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([peers_bin, str(Path(sys.executable).parent),
                                   env.get("PATH", "")])
    p = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, timeout=timeout_s,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise LoopError(f"exit {p.returncode}: {line}\n--- stdout\n{p.stdout[-3000:]}\n"
                        f"--- stderr\n{p.stderr[-3000:]}")
    return p.returncode


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


def _fit(study: str, slo: str, reps: int, seed: int):
    from capplan.envelope import fit_envelope

    return fit_envelope(study, slo, reps=reps, seed=seed)


def loop(tool: str, *, url: str, model: str, tokenizer: str, slo: str, coarse_rates,
         duration_s: float, workdir: str | os.PathLike, peers_bin: str, seed: int = 0,
         prompt_tokens: int = 64, output_tokens: int = 32, grace_s: float = 10.0,
         budget_minutes: float = 10.0, max_rounds: int = 3, reps: int = 400,
         sims: int = 4) -> LoopResult:
    """Run the loop (module docstring) with ``tool`` ("aiperf" or "guidellm") against ``url``.
    ``seed`` offsets every load-tool seed (so loops with different seeds send different
    arrivals) and seeds the fits; ``budget_minutes`` is each design round's budget."""
    from capplan.loadtools import commands, seed_base_for

    t0 = time.perf_counter()
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    study = str(work / "study")
    offset = 100_000 * int(seed)
    executed: list[tuple[str, int]] = []
    minutes = 0.0

    # the coarse sweep: one run per rate, commands from capplan.loadtools, run verbatim
    w = workload(prompt_tokens=prompt_tokens, output_tokens=output_tokens, tokenizer=tokenizer,
                 grace_s=grace_s)
    runs = [{"rate_rps": float(r), "repeats": 1, "duration_s": float(duration_s),
             "warmup_s": 0.0} for r in coarse_rates]
    tc = commands(runs, w, url=url, model=model, tokenizer=tokenizer,
                  seed_base=seed_base_for(0) + offset, out_dir=str(work / "r0"), study=study)
    plan = tc[tool]
    if not plan.ok:
        raise LoopError(f"{tool} cannot express the workload: {plan.reason}")
    for line in plan.commands:
        executed.append((line, run_line(line, peers_bin=peers_bin, cwd=str(work))))
    minutes += sum(r["duration_s"] for r in runs) / 60.0
    folders = [r.folder for r in tc.runs]
    _capplan("import", "auto", *folders, "--out", study, cwd=str(work))

    rounds: list[Round] = []
    for k in range(max_rounds + 1):
        try:
            env = _fit(study, slo, reps, seed)
        except StudyError as exc:  # every run left out (e.g. a client that could not keep up)
            rounds.append(Round(index=k, runs_in_study=-1, minutes_so_far=round(minutes, 3),
                                estimate=math.nan, ci_low=math.nan, ci_high=math.nan,
                                lower_bound=math.nan, honesty=f"no usable run: {exc.format()}"))
            break
        c, h = env.cslo, env.honesty
        n_runs = len(env.runs)
        base = dict(index=k, runs_in_study=n_runs, minutes_so_far=round(minutes, 3),
                    estimate=c.estimate, ci_low=c.ci_low, ci_high=c.ci_high,
                    lower_bound=c.lower_bound, honesty=h.status)
        if h.honest or k == max_rounds:
            rounds.append(Round(**base))
            break
        dpath = work / f"design_r{k + 1}.yaml"
        _capplan("design", study, "--slo", slo, "--budget-minutes", f"{budget_minutes:g}",
                 "--url", url, "--model", model, "--tokenizer", tokenizer,
                 "--runs-dir", str(work / f"r{k + 1}"), "--seed", str(seed), "--sims", str(sims),
                 "--seed-base", str(seed_base_for(n_runs) + offset), "--out", str(dpath),
                 cwd=str(work))
        d = yaml.safe_load(dpath.read_text(encoding="utf-8"))
        cmds = d.get("commands") or {}
        lines = list((cmds.get(tool) or {}).get("commands") or [])
        imp = (cmds.get(tool) or {}).get("import")
        if not lines or not imp:
            raise LoopError(f"design round {k + 1} printed no {tool} commands: "
                            f"{json.dumps(d.get('notes'))} {json.dumps(cmds.get(tool))}")
        for line in lines:
            executed.append((line, run_line(line, peers_bin=peers_bin, cwd=str(work))))
        executed.append((imp, run_line(imp, peers_bin=peers_bin, cwd=str(work))))
        minutes += float(d.get("minutes") or 0.0)
        exp = d.get("expected") or {}
        rounds.append(Round(**base, proposed_runs=len(lines),
                            proposed_minutes=float(d.get("minutes") or 0.0),
                            expected_lower_bound=float(exp.get("lower_bound") or math.nan),
                            expected_honesty=str(exp.get("honesty") or ""),
                            commands=tuple(lines) + (imp,)))
    return LoopResult(tool, study, tuple(rounds), rounds[-1].honesty == "honest",
                      round(minutes, 3), round(time.perf_counter() - t0, 1), tuple(executed))
