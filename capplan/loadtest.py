"""The load test that drives itself: capplan runs the load tool until the planning number is honest.

``run_loadtest(target, spec, out_dir)`` is the planner's loop of docs/design.md as one function:

    a coarse bracketing sweep (the caller's rates)
    → import → fit → round: ``design.propose`` the next runs, run each one (a real tool's
      command line from ``capplan.loadtools``, or a simulated run of a synth model), import
      them into the study, refit
    → until the **stop rule** holds or the budget is spent.

**Stop rule.** Stop when the lower bound is honest (``capplan.honesty``) and its gap to the
estimate, (estimate − lower bound) / estimate, is at most ``spec.tolerance``. Otherwise stop when
the budget is spent — load-test minutes (the runs' durations, summed), total requests (rate ×
duration of each run, counted before it is sent), or rounds — or when the design proposes no run;
the result then says what is missing (the honesty rule's runs to add, or the gap left).

**Safety.** A target sends traffic only to its one URL (every printed command is checked for
other URLs); ``probe`` sends a few single requests before any load and stops on a server that
refuses, errors or answers with another output length than asked; no run above the rate cap
(``spec.max_rate_factor`` × the current estimate, and ``spec.max_rate_rps``) or past the
request cap is started; each tool process runs in its own process group and is stopped by its
id when the loop ends, however it ends.

**Record and resume.** ``out_dir/loadtest.json`` holds every round (why each run was chosen,
the bound the design expected, the bound obtained) and each run's state (planned, done,
imported); it is copied into the study (``study/loadtest.json``) after each fit, so the study
explains itself. A Ctrl-C (KeyboardInterrupt) stops the running tool, imports the runs that
finished and writes the record; ``resume=True`` continues from it: the runs still planned run
with the seeds already recorded, so a resumed load test ends in the same study as one that was
never stopped (same seeds, same designs).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from .errors import CapplanError, SpecError, StudyError
from .honesty import gap_rel, within_tolerance
from .present import fmt_num, fmt_pct

FORMAT = "capplan-loadtest/1"
RECORD = "loadtest.json"


class ProbeError(CapplanError):
    """The endpoint failed the probe: no load was sent (exit 2)."""

    def format(self) -> str:
        return f"ERROR: probe failed, no load was sent: {self}"


class InterruptedLoadtest(CapplanError):
    """Ctrl-C: the finished runs are kept; ``--resume`` continues (exit 130)."""

    exit_code = 130

    def format(self) -> str:
        return f"interrupted: {self}"


# ------------------------------------------------------------------------------ the spec

@dataclass(frozen=True)
class Spec:
    """What the load test is for and what it may spend."""

    slo: str
    coarse_rates: tuple[float, ...]
    duration_s: float
    budget_minutes: float = 30.0
    max_requests: int = 200_000
    #: the stop rule: honest, and (estimate − lower bound) / estimate at most this
    tolerance: float = 0.15
    #: each design round may spend at most this share of the budget (and what is left)
    round_minutes: float | None = None
    max_rounds: int = 6
    #: no run above max_rate_factor × the current estimate (nor above max_rate_rps, if given)
    max_rate_factor: float = 2.0
    max_rate_rps: float | None = None
    #: no run longer than this (default: 4 × duration_s): the design asks for longer runs when
    #: those near the crossing are still settling (≥ 300 s), which 15-s tool runs cannot afford
    max_run_s: float | None = None
    seed: int = 0
    reps: int = 400
    design_reps: int = 200
    sims: int = 4

    def __post_init__(self):
        checks = [(bool(self.coarse_rates) and all(r > 0 for r in self.coarse_rates),
                   "coarse_rates", "the coarse sweep needs at least one rate > 0"),
                  (self.duration_s > 0, "duration_s", "the run length must be > 0 s"),
                  (self.budget_minutes > 0, "budget_minutes", "the budget must be > 0 min"),
                  (self.max_requests > 0, "max_requests", "the request cap must be > 0"),
                  (0 < self.tolerance < 1, "tolerance", "the tolerance is a share in (0, 1)"),
                  (self.max_rate_factor > 1, "max_rate_factor", "the rate cap factor must be > 1"),
                  (self.max_rounds >= 0, "max_rounds", "max_rounds must be ≥ 0"),
                  (self.max_run_s is None or self.max_run_s >= self.duration_s, "max_run_s",
                   "the longest run allowed must be at least the coarse runs' length")]
        for ok, name, msg in checks:
            if not ok:
                raise SpecError(f"{msg} (got {getattr(self, name)!r})", field=name)

    @property
    def longest_run_s(self) -> float:
        return float(self.max_run_s) if self.max_run_s else 4.0 * self.duration_s

    def round_budget(self, left_minutes: float) -> float:
        per = self.round_minutes if self.round_minutes else self.budget_minutes / 3.0
        return max(0.0, min(per, left_minutes))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["coarse_rates"] = list(self.coarse_rates)
        return d


# ------------------------------------------------------------------------------ the record

@dataclass(frozen=True)
class RunRecord:
    """One run of the load test: what was asked, why, and how far it got."""

    round: int
    index: int           # position in the load test (0-based), the synth seed stream
    rate_rps: float
    duration_s: float
    warmup_s: float
    seed: int
    folder: str
    why: str
    command: str = ""
    state: str = "planned"  # planned | done | imported

    @property
    def minutes(self) -> float:
        return self.duration_s / 60.0

    @property
    def requests(self) -> float:
        """Requests the run offers (rate × duration): what the request cap counts."""
        return self.rate_rps * self.duration_s


@dataclass(frozen=True)
class Bound:
    """A fit as the record keeps it."""

    estimate: float
    lower_bound: float
    ci_low: float
    ci_high: float
    honesty: str
    runs: int = 0

    @property
    def gap_rel(self) -> float:
        return gap_rel(self.estimate, self.lower_bound)

    @classmethod
    def of(cls, env) -> "Bound":
        """A fitted envelope as the record keeps it."""
        c = env.cslo
        return cls(float(c.estimate), float(c.lower_bound), float(c.ci_low), float(c.ci_high),
                   env.honesty.status if env.honesty is not None else "without a verdict",
                   int(len(env.runs)))

    def meets(self, tolerance: float) -> bool:
        """The stop rule: honest, and (estimate − lower bound) / estimate at most ``tolerance``."""
        return within_tolerance(self.honesty, self.estimate, self.lower_bound, tolerance)

    def to_text(self) -> str:
        return (f"estimate {fmt_num(self.estimate)} req/s, lower bound {fmt_num(self.lower_bound)} "
                f"({self.honesty}, gap {fmt_pct(self.gap_rel)})")


@dataclass(frozen=True)
class Round:
    index: int
    why: str
    budget_minutes: float
    expected: Bound | None
    obtained: Bound | None = None
    notes: tuple[str, ...] = ()
    design: str = ""


@dataclass(frozen=True)
class LoadtestResult:
    """The load test's outcome: every round, every run, the stop and what is missing."""

    target: str
    study: str
    spec: Spec
    rounds: tuple[Round, ...]
    runs: tuple[RunRecord, ...]
    stop: str             # honest | budget | requests | rounds | no-run | no-usable-run
    stop_reason: str
    missing: str = ""
    wall_s: float = 0.0

    @property
    def final(self) -> Bound | None:
        done = [r.obtained for r in self.rounds if r.obtained is not None]
        return done[-1] if done else None

    @property
    def honest(self) -> bool:
        return self.final is not None and self.final.honesty == "honest"

    @property
    def minutes(self) -> float:
        return sum(r.minutes for r in self.runs if r.state != "planned")

    @property
    def requests(self) -> float:
        return sum(r.requests for r in self.runs if r.state != "planned")

    def to_dict(self) -> dict:
        return _record_dict(self.target, self.spec, self.rounds, self.runs,
                            stop={"stop": self.stop, "reason": self.stop_reason,
                                  "missing": self.missing}, study=self.study)

    def to_text(self) -> str:
        f = self.final
        lines = [f"capplan loadtest against {self.target}: {len(self.runs)} runs in "
                 f"{len(self.rounds)} rounds, {self.minutes:.1f} of {self.spec.budget_minutes:g} "
                 f"load-test min, {self.requests:,.0f} requests offered",
                 f"stop: {self.stop} — {self.stop_reason}"]
        if f is not None:
            lines.append(f"final: {f.to_text()}")
        if self.missing:
            lines.append(f"missing: {self.missing}")
        for r in self.rounds:
            exp = f"expected {r.expected.to_text()}; " if r.expected else ""
            got = f"obtained {r.obtained.to_text()}" if r.obtained else "not fitted"
            n = [x for x in self.runs if x.round == r.index]
            lines.append(f"round {r.index} ({r.why}; {len(n)} runs, "
                         f"{sum(x.minutes for x in n):.1f} min): {exp}{got}")
            lines += [f"  - {x.rate_rps:g} req/s, {x.duration_s:g} s, seed {x.seed}: {x.why}"
                      for x in n]
            lines += [f"  note: {t}" for t in r.notes]
        lines.append(f"study: {self.study}")
        return "\n".join(lines)

    def figure(self):
        """The estimate, its interval and the lower bound after each round, against the
        load-test minutes spent (what ``LiveChart`` draws while the test runs)."""
        import plotly.graph_objects as go

        return go.Figure(rounds_figure_dict(self.rounds, self.runs, self.spec.tolerance))


def _record_dict(target, spec, rounds, runs, stop=None, study="") -> dict:
    return {"format": FORMAT, "target": target, "study": study, "spec": spec.to_dict(),
            "rounds": [asdict(r) for r in rounds], "runs": [asdict(r) for r in runs],
            "stop": stop}


def _bound(d) -> Bound | None:
    return None if d is None else Bound(**d)


def load_record(path: str | os.PathLike) -> dict:
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read the load-test record: {exc}", file=str(p),
                        fix="start again without --resume, into a new --out") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise SpecError(f"not a capplan load-test record (format {FORMAT})", file=str(p))
    return d


def read_workload(path: str | os.PathLike) -> dict:
    """The workload a tool target sends (a YAML mapping, or a study.yaml's ``workload``); it
    must name the asked output length, which the probe checks the server answers with."""
    import yaml

    path = str(path)
    try:
        raw = yaml.safe_load(open(path, encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"cannot read the workload file: {exc.strerror}", file=path,
                        field="--workload") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"the workload file is not valid YAML: {exc}", file=path) from None
    if isinstance(raw, dict) and isinstance(raw.get("workload"), dict):
        raw = raw["workload"]  # a study.yaml: its workload mapping
    if not isinstance(raw, dict):
        raise SpecError("the workload file must be a mapping (a study manifest's workload)",
                        file=path, fix="docs/loadtest.md shows one")
    asked = raw.get("asked") if isinstance(raw.get("asked"), dict) else {}
    if not isinstance(asked.get("output_tokens"), int) or asked["output_tokens"] < 1:
        raise SpecError("the workload names no asked output length", file=path,
                        field="asked.output_tokens",
                        fix="asked: {input_tokens: 64, output_tokens: 32}")
    return raw


# ------------------------------------------------------------------------------ the probe

@dataclass(frozen=True)
class ProbeResult:
    requests: int
    output_tokens: int
    seconds: tuple[float, ...]

    def to_text(self) -> str:
        return (f"probe: {self.requests} requests answered with {self.output_tokens} output "
                f"tokens each (as asked), {max(self.seconds):.2f} s at most")


def probe(url: str, *, model: str, workload: dict, requests: int = 3,
          timeout_s: float = 30.0) -> ProbeResult:
    """A few single requests, one after the other, before any load: the endpoint answers
    (HTTP 200) with the asked output length (``usage.completion_tokens``). Raises ProbeError
    with the reason otherwise."""
    from .loadtools import ManifestWorkload

    wl = ManifestWorkload.parse(workload)  # the reading design's commands use: endpoint, ignore_eos
    if wl.asked_out is None:
        raise SpecError("the workload names no asked output length, so the probe cannot check it",
                        field="asked.output_tokens", fix="asked: {input_tokens: 64, output_tokens: 32}")
    out_tokens = wl.asked_out
    in_tokens = int(wl.inp.value or round(wl.inp.mean) or 16)  # the probe prompt's length only
    chat = wl.endpoint == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    prompt = " ".join(["hello"] * max(in_tokens, 1))
    body = {"model": model, "max_tokens": out_tokens, "stream": False}
    if wl.output_fixed:
        body["ignore_eos"] = True
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    data = json.dumps(body).encode()
    full = url.rstrip("/") + path
    took = []
    for i in range(requests):
        req = urllib.request.Request(full, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ProbeError(f"{full} answered HTTP {exc.code} ({exc.reason}) to probe "
                             f"request {i + 1}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ProbeError(f"{full} cannot be reached: {reason}") from None
        took.append(time.perf_counter() - t0)
        try:
            got = json.loads(raw)["usage"]["completion_tokens"]
        except (ValueError, KeyError, TypeError):
            raise ProbeError(f"{full} answered without usage.completion_tokens: the output "
                             "length cannot be checked") from None
        if int(got) != out_tokens:
            raise ProbeError(f"{full} answered with {got} output tokens, {out_tokens} were asked "
                             "(max_tokens, ignore_eos): runs would not measure the workload")
    return ProbeResult(requests, out_tokens, tuple(took))


# ------------------------------------------------------------------------------ targets

class ToolTarget:
    """A real load tool (aiperf, guidellm, vllm) against one URL: each run is the command line
    ``capplan.loadtools`` prints, run in its own process group; the runs are imported with
    ``capplan import auto ... --out/--into``."""

    def __init__(self, tool: str, *, url: str, model: str, workload: dict,
                 tokenizer: str | None = None, path_prefix: tuple[str, ...] = (),
                 run_timeout_s: float = 3600.0):
        if tool not in ("aiperf", "guidellm", "vllm"):
            raise SpecError(f"unknown tool {tool!r}", field="--tool", fix="aiperf, guidellm or vllm")
        if not re.match(r"^https?://[^/\s]+", url or ""):
            raise SpecError(f"not an http(s) URL: {url!r}", field="--url",
                            fix="e.g. --url http://127.0.0.1:8000")
        self.tool, self.url, self.model, self.workload = tool, url.rstrip("/"), model, dict(workload)
        self.tokenizer, self.path_prefix, self.run_timeout_s = tokenizer, path_prefix, run_timeout_s
        self.name = f"{tool} at {self.url}"

    def check(self) -> str:
        return probe(self.url, model=self.model, workload=self.workload).to_text()

    def plan(self, runs: list[dict], *, seed_base: int, out_dir: str, study: str) -> list[tuple]:
        """(rate, duration, warm-up, seed, folder, command) per run, repeats expanded."""
        from .loadtools import commands

        tc = commands(runs, self.workload, url=self.url, model=self.model,
                      tokenizer=self.tokenizer, seed_base=seed_base, out_dir=out_dir, study=study)
        p = tc[self.tool]
        if not p.ok:
            raise SpecError(f"{self.tool} cannot express the workload: {p.reason}",
                            field="--workload")
        if p.files:
            raise SpecError(f"{self.tool} needs config files; capplan loadtest runs only "
                            "command-line tools", field="--tool")
        out = []
        for r, line in zip(tc.runs, p.commands):
            others = {u.rstrip("/") for u in re.findall(r"https?://[^\s'\",}]+", line)} - {self.url}
            if others:  # traffic only to the URL given
                raise SpecError(f"a printed command names another URL ({sorted(others)})",
                                field="--url")
            out.append((r.rate_rps, r.duration_s, r.warmup_s, r.seed, r.folder, line))
        return out

    def execute(self, run: RunRecord, cwd: str) -> None:
        shutil.rmtree(Path(cwd) / run.folder, ignore_errors=True)  # a half-written run
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([*self.path_prefix, env.get("PATH", "")])
        rc, tail = run_in_group(["bash", "-c", run.command], cwd=cwd, env=env,
                                timeout_s=self.run_timeout_s)
        if rc != 0:
            raise StudyError(f"{self.tool} exited {rc} for the run at {run.rate_rps:g} req/s: "
                             f"{tail}", fix=f"the command was: {run.command}")

    def import_runs(self, runs: list[RunRecord], study: str, cwd: str) -> None:
        """``capplan import auto FOLDERS --out STUDY`` for the first runs, ``--into STUDY``
        after (what the printed import line does)."""
        from .importers import append_import, import_paths, write_import

        res = import_paths("auto", [str(Path(cwd) / r.folder) for r in runs])
        if (Path(study) / "study.yaml").is_file():
            append_import(res, study)
        else:
            write_import(res, study)


def run_in_group(argv: list[str], *, cwd: str, env: dict, timeout_s: float) -> tuple[int, str]:
    """Run ``argv`` in its own process group (session) and stop that group by its id when the
    call ends — normally, on a timeout or on Ctrl-C. Returns (exit code, output tail)."""
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return p.returncode, (out or "")[-2000:]
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:g} s"
    finally:
        stop_group(p)


def stop_group(p: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, to the process group of ``p`` (its id), if still running."""
    if p.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


class SynthTarget:
    """The same loop against a synth configuration or a twin (``capplan.twin.load_system``):
    each run is simulated (seed stream: the load-test seed and the run's index), so the loop can
    be tested and costed without a server."""

    def __init__(self, model, *, name: str = "", seed: int = 0):
        self.model, self.seed = model, int(seed)
        self.name = f"synth model {name or getattr(model, 'name', '')}".strip()
        self.workload: dict = {}

    def check(self) -> str:
        return "no probe: a simulated target sends no traffic"

    def plan(self, runs: list[dict], *, seed_base: int, out_dir: str, study: str) -> list[tuple]:
        out, i = [], 0
        for r in runs:
            for _ in range(int(r.get("repeats", 1))):
                rate = float(r["rate_rps"])
                out.append((rate, float(r["duration_s"]), float(r.get("warmup_s", 0.0)),
                            seed_base + i, f"{out_dir}/rate{rate:g}_s{seed_base + i}", ""))
                i += 1
        return out

    def _cfg(self, run: RunRecord):
        from .design import model_config

        return model_config(self.model, rates=(run.rate_rps,), duration_s=run.duration_s,
                            warmup_s=run.warmup_s, seed=self.seed)

    def execute(self, run: RunRecord, cwd: str) -> None:
        import pyarrow.parquet as pq

        from .sim.sweep import RunPlan, run_tables

        ev, _, _ = run_tables(self._cfg(run), RunPlan(run.index, _run_id(run), run.rate_rps, 0,
                                                      run.duration_s))
        d = Path(cwd) / run.folder
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(ev, d / "events.parquet")

    def import_runs(self, runs: list[RunRecord], study: str, cwd: str) -> None:
        """The study of every imported run so far plus ``runs``, rebuilt (the simulated runs
        are files of this load test, so the study is a pure function of the record)."""
        import pyarrow.parquet as pq

        from .io import write_study
        from .sim.sweep import RunPlan, manifest_for

        rec = load_record(Path(cwd) / RECORD)
        have = [RunRecord(**r) for r in rec["runs"] if r["state"] == "imported"]
        every = sorted(have + list(runs), key=lambda r: r.index)
        plans = tuple(RunPlan(r.index, _run_id(r), r.rate_rps, 0, r.duration_s) for r in every)
        m = manifest_for(self._cfg(every[0]), plans)
        for entry, r in zip(m["runs"], every):
            entry["warmup_s"] = float(r.warmup_s)
        events = {f"{_run_id(r)}.parquet": pq.read_table(Path(cwd) / r.folder / "events.parquet")
                  for r in every}
        write_study(study, m, events)


def _run_id(run: RunRecord) -> str:
    return f"r{run.index + 1:03d}"


# ------------------------------------------------------------------------------ the loop

@dataclass
class _State:
    """The record being written (mutable inside the loop only; the result is frozen)."""

    target: str
    spec: Spec
    rounds: list = field(default_factory=list)
    runs: list = field(default_factory=list)

    def save(self, out: Path, study: str, stop=None) -> None:
        from .io import write_text_atomic

        text = json.dumps(_record_dict(self.target, self.spec, self.rounds, self.runs, stop,
                                       study), indent=1)
        write_text_atomic(out / RECORD, text)
        if (Path(study) / "study.yaml").is_file():
            write_text_atomic(Path(study) / RECORD, text)


Say = Callable[[str, str], None]


def run_loadtest(target, spec: Spec, out_dir: str | os.PathLike, *, resume: bool = False,
                 on_event: Say | None = None) -> LoadtestResult:
    """Run the load test (module docstring) with ``target`` (``ToolTarget`` or
    ``SynthTarget``) into ``out_dir`` (its study is ``out_dir/study``). ``on_event(kind,
    line)`` gets one progress line per event (kinds: probe, round, run, fit, stop)."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    study = str(out / "study")
    say = on_event or (lambda kind, line: None)
    say("probe", target.check())  # before any load (and again on --resume)
    st = _start(target, spec, out, resume)
    try:
        return _loop(target, spec, st, out, study, say, t0)
    except KeyboardInterrupt:
        done = [r for r in st.runs if r.state == "done"]
        if done:
            _import(target, st, done, study, out)
        st.save(out, study)
        kept = sum(r.state == "imported" for r in st.runs)
        raise InterruptedLoadtest(f"{kept} finished runs kept in {study}; continue with --resume "
                                  f"(record: {out / RECORD})") from None


def _start(target, spec: Spec, out: Path, resume: bool) -> _State:
    rec_path = out / RECORD
    if resume:
        if not rec_path.is_file():
            raise SpecError("nothing to resume: no load-test record", file=str(rec_path),
                            fix="run without --resume first")
        d = load_record(rec_path)
        if d["spec"] != json.loads(json.dumps(spec.to_dict())):
            raise SpecError("--resume with other settings than the recorded load test",
                            file=str(rec_path),
                            fix="resume with the same options (the record's spec)")
        return _State(d["target"], spec, [_round(r) for r in d["rounds"]],
                      [RunRecord(**r) for r in d["runs"]])
    if rec_path.exists() or (out / "study").exists():
        raise SpecError("the output folder holds a load test already", file=str(out),
                        fix="--resume to continue it, or a new --out")
    out.mkdir(parents=True, exist_ok=True)
    st = _State(target.name, spec)
    rates = [r for r in spec.coarse_rates
             if spec.max_rate_rps is None or r <= spec.max_rate_rps]
    notes = ()
    if len(rates) < len(spec.coarse_rates):
        notes = (f"coarse rates above the cap {spec.max_rate_rps:g} req/s left out",)
    runs = [{"rate_rps": float(r), "repeats": 1, "duration_s": spec.duration_s, "warmup_s": 0.0}
            for r in rates]
    _plan_round(target, st, 0, runs, ["coarse bracketing sweep"] * len(runs), "coarse sweep",
                spec.duration_s * len(runs) / 60.0, None, notes, "", out)
    st.save(out, str(out / "study"))
    return st


def _round(d: dict) -> Round:
    return Round(d["index"], d["why"], d["budget_minutes"], _bound(d["expected"]),
                 _bound(d["obtained"]), tuple(d["notes"]), d.get("design", ""))


def _plan_round(target, st: _State, k: int, runs: list[dict], whys: list[str], why: str,
                budget: float, expected, notes, design: str, out: Path) -> None:
    from .loadtools import seed_base_for

    n_before = len(st.runs)
    base = seed_base_for(n_before) + 100_000 * st.spec.seed
    planned = target.plan(runs, seed_base=base, out_dir=f"runs/r{k}", study=str(out / "study"))
    expand = [w for r, w in zip(runs, whys) for _ in range(int(r.get("repeats", 1)))]
    for i, (rate, dur, warm, seed, folder, line) in enumerate(planned):
        st.runs.append(RunRecord(k, n_before + i, rate, dur, warm, seed, folder, expand[i],
                                 line))
    st.rounds.append(Round(k, why, round(budget, 3), expected, None, tuple(notes), design))


def _import(target, st: _State, done: list, study: str, out: Path) -> None:
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # an import is not cut in half
    try:
        target.import_runs(done, study, str(out))
        ids = {r.index for r in done}
        st.runs = [replace(r, state="imported") if r.index in ids else r for r in st.runs]
    finally:
        signal.signal(signal.SIGINT, old)


def _fit(study: str, spec: Spec):
    from .envelope import fit_envelope

    return fit_envelope(study, spec.slo, reps=spec.reps, seed=spec.seed)


def _progress(st: _State, spec: Spec, k: int, t0: float) -> str:
    done = sum(r.state != "planned" for r in st.runs)
    spent = sum(r.minutes for r in st.runs if r.state != "planned")
    last = [r.obtained for r in st.rounds if r.obtained is not None]
    fit = last[-1].to_text() if last else "no fit yet"
    return (f"round {k}: runs {done}/{len(st.runs)}, {spent:.1f} min spent, "
            f"{spec.budget_minutes - spent:.1f} left (wall {time.perf_counter() - t0:.0f} s); {fit}")


def _loop(target, spec: Spec, st: _State, out: Path, study: str, say: Say,
          t0: float) -> LoadtestResult:
    while True:
        k = st.rounds[-1].index
        for r in list(st.runs):
            if r.round != k or r.state != "planned":
                continue
            say("run", f"round {k}: run {r.index + 1} at {r.rate_rps:g} req/s for "
                       f"{r.duration_s:g} s ({r.why})")
            target.execute(r, str(out))
            st.runs = [replace(x, state="done") if x.index == r.index else x for x in st.runs]
            st.save(out, study)
            say("run", _progress(st, spec, k, t0))
        done = [r for r in st.runs if r.state == "done"]
        if done:
            _import(target, st, done, study, out)
        try:
            env = _fit(study, spec)
        except StudyError as exc:
            st.save(out, study)
            return _finish(st, spec, study, out, "no-usable-run",
                           f"no run of the study could be fitted: {exc}", "", say, t0)
        b = Bound.of(env)
        st.rounds[-1] = replace(st.rounds[-1], obtained=b)
        st.save(out, study)
        say("fit", _progress(st, spec, k, t0))
        stop = _stop(target, st, spec, env, b, k, out, study)
        if stop is not None:
            return _finish(st, spec, study, out, *stop, say, t0)
        say("round", f"round {k + 1}: {sum(r.round == k + 1 for r in st.runs)} runs planned "
                     f"({st.rounds[-1].why})")


def _spent(st: _State) -> tuple[float, float]:
    """(minutes, requests) of the runs sent so far."""
    sent = [r for r in st.runs if r.state != "planned"]
    return sum(r.minutes for r in sent), sum(r.requests for r in sent)


def _stop(target, st: _State, spec: Spec, env, b: Bound, k: int, out: Path, study: str):
    """None to go on (the next round is planned and recorded), else (stop, reason, missing)."""
    from .design import propose

    minutes, requests = _spent(st)
    if b.meets(spec.tolerance):
        return ("honest", f"the lower bound is honest and {fmt_pct(b.gap_rel)} below the estimate "
                          f"(tolerance {fmt_pct(spec.tolerance)})", "")
    missing = _missing(env, b, spec)
    if k >= spec.max_rounds:
        return ("rounds", f"{spec.max_rounds} design rounds done", missing)
    left = spec.budget_minutes - minutes
    if left <= 1e-9:
        return ("budget", f"{minutes:.1f} of {spec.budget_minutes:g} load-test minutes spent",
                missing)
    if requests >= spec.max_requests:
        return ("requests", f"{requests:,.0f} of {spec.max_requests:,} requests sent", missing)
    budget = spec.round_budget(left)
    kw = dict(sims=spec.sims, reps=spec.design_reps, seed=spec.seed + k, study_path=study,
              max_duration_s=spec.longest_run_s, enough_gap_rel=spec.tolerance)
    d = propose(env, budget_minutes=budget, **kw)
    if not d.runs and budget < left and any("shorter than one run" in n for n in d.notes):
        budget = left  # the round's share is shorter than one run: the rest of the budget
        d = propose(env, budget_minutes=budget, **kw)
    notes = list(d.notes)
    cap = spec.max_rate_factor * b.estimate if b.estimate == b.estimate else math.inf
    if spec.max_rate_rps is not None:
        cap = min(cap, spec.max_rate_rps)
    proposed = list(d.runs) or _honesty_runs(env, spec, notes)
    runs, whys = [], []
    mins, reqs = minutes, requests
    for r in proposed:
        if r.rate_rps > cap:
            notes.append(f"{r.rate_rps:g} req/s left out: above the rate cap {cap:.3g} req/s")
            continue
        n = r.repeats
        while n > 0 and (mins + n * r.duration_s / 60.0 > spec.budget_minutes + 1e-9
                         or reqs + n * r.rate_rps * r.duration_s > spec.max_requests):
            n -= 1
        if n < r.repeats:
            notes.append(f"{r.repeats - n} of {r.repeats} runs at {r.rate_rps:g} req/s left out: "
                         "past the minutes or request budget")
        if n:
            runs.append({"rate_rps": r.rate_rps, "repeats": n, "duration_s": r.duration_s,
                         "warmup_s": r.warmup_s})
            whys.append(r.why)
            mins += n * r.duration_s / 60.0
            reqs += n * r.rate_rps * r.duration_s
    dpath = out / "designs" / f"design_r{k + 1}.yaml"
    dpath.parent.mkdir(parents=True, exist_ok=True)
    from .design import write_design

    write_design(d, dpath)
    if not runs:
        if proposed:
            r0 = proposed[0]
            kind = "requests" if reqs + r0.rate_rps * r0.duration_s > spec.max_requests \
                else "budget"
        else:
            kind = "budget" if any("shorter than one run" in n for n in notes) else "no-run"
        return (kind, "no further run can be sent: "
                + ("; ".join(notes) if notes else "the design proposed no run"), missing)
    e = d.expected
    expected = Bound(_num(e.get("estimate")), _num(e.get("lower_bound")), _num(e.get("ci_low")),
                     _num(e.get("ci_high")), str(e.get("honesty", "")),
                     b.runs + sum(int(r["repeats"]) for r in runs))
    _plan_round(target, st, k + 1, runs, whys,
                "design: the runs that most narrow the gap per minute" if b.honesty == "honest"
                else "design: the runs that make the bound honest", budget, expected, notes,
                str(dpath.relative_to(out)), out)
    st.save(out, study)
    return None


def _honesty_runs(env, spec: Spec, notes: list) -> list:
    """When the design proposes no run but the measured bound is unsupported: the honesty rule's
    runs to add (capped at the longest run allowed). The design's trial fits use fewer
    replicates and can read the same sweep as honest — stopping there would leave the bound
    unsupported with the runs that fix it named but never sent."""
    from .design import ProposedRun

    h = env.honesty
    if h is None or h.status != "unsupported" or not h.runs_to_add:
        return []
    notes.append("the design proposed no run (its trial fits, with fewer replicates, read the "
                 "bound as honest); the honesty rule's runs to add are sent instead")
    return [ProposedRun(r.rate_rps, r.repeats, min(r.duration_s, spec.longest_run_s), 0.0, r.why)
            for r in h.runs_to_add]


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) else math.nan


def _missing(env, b: Bound, spec: Spec) -> str:
    h = env.honesty
    if h is not None and not h.honest:
        add = "; ".join(r.describe() for r in h.runs_to_add)
        return (f"the bound is {h.status}" + (f": {'; '.join(h.reasons)}" if h.reasons else "")
                + (f" — runs to add: {add}" if add else ""))
    return (f"the bound is honest but {fmt_pct(b.gap_rel)} below the estimate, more than the "
            f"tolerance {fmt_pct(spec.tolerance)}: more runs near the estimate narrow it "
            "(capplan design STUDY says which)")


def _finish(st: _State, spec: Spec, study: str, out: Path, stop: str, reason: str,
            missing: str, say: Say, t0: float) -> LoadtestResult:
    st.save(out, study, {"stop": stop, "reason": reason, "missing": missing})
    res = LoadtestResult(st.target, study, spec, tuple(st.rounds), tuple(st.runs), stop, reason,
                         missing, round(time.perf_counter() - t0, 1))
    say("stop", f"stop ({stop}): {reason}" + (f"; missing: {missing}" if missing else ""))
    return res


# ------------------------------------------------------------------------------ the chart

def rounds_figure_dict(rounds, runs, tolerance: float) -> dict:
    """A plotly figure (as a dict) of each fitted round: x = load-test minutes spent when it was
    fitted, the estimate with its interval, the lower bound (filled when honest), and the stop
    rule's line (the estimate less the tolerance) the bound must reach."""
    xs, est, lo, hi, lb, label, honest = [], [], [], [], [], [], []
    for r in rounds:
        if r.obtained is None:
            continue
        b = r.obtained
        xs.append(round(sum(x.minutes for x in runs
                            if x.round <= r.index and x.state != "planned"), 3))
        est.append(b.estimate)
        lo.append(b.estimate - b.ci_low if b.ci_low == b.ci_low else None)
        hi.append(b.ci_high - b.estimate if b.ci_high == b.ci_high else None)
        lb.append(b.lower_bound)
        honest.append(b.honesty == "honest")
        label.append(f"round {r.index}: {b.to_text()}")
    goal = [e * (1.0 - tolerance) for e in est]
    return {"data": [
        {"type": "scatter", "x": xs, "y": est, "name": "estimate (interval)",
         "mode": "lines+markers", "text": label, "hoverinfo": "text",
         "error_y": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo}},
        {"type": "scatter", "x": xs, "y": lb, "name": "lower bound (filled: honest)",
         "mode": "lines+markers", "text": label, "hoverinfo": "text",
         "marker": {"symbol": ["circle" if h else "circle-open" for h in honest], "size": 10}},
        {"type": "scatter", "x": xs, "y": goal, "name": f"stop line: estimate − {tolerance:.0%}",
         "mode": "lines", "line": {"dash": "dot"}, "hoverinfo": "skip"}],
        "layout": {"title": {"text": "capplan loadtest: C_SLO after each round"},
                   "xaxis": {"title": {"text": "load-test minutes spent"}},
                   "yaxis": {"title": {"text": "C_SLO (req/s)"}}, "height": 380}}


class LiveChart:
    """What a planner watches in a notebook while ``run_loadtest`` works: pass it as
    ``on_event``. It prints each progress line and, after each fit, redraws ``widget`` (a plotly
    ``FigureWidget``) from the record the loop has just written to ``out_dir``."""

    def __init__(self, out_dir: str | os.PathLike, *, tolerance: float = 0.15,
                 echo: bool = True):
        import plotly.graph_objects as go

        self.out = Path(out_dir)
        self.echo = echo
        self.tolerance = tolerance
        self.fits = 0
        self.widget = go.FigureWidget(rounds_figure_dict((), (), tolerance))

    def __call__(self, kind: str, line: str) -> None:
        if self.echo:
            print(f"[{kind}] {line}", flush=True)
        if kind not in ("fit", "stop") or not (self.out / RECORD).is_file():
            return
        d = load_record(self.out / RECORD)
        fig = rounds_figure_dict([_round(r) for r in d["rounds"]],
                                 [RunRecord(**r) for r in d["runs"]], self.tolerance)
        with self.widget.batch_update():
            for trace, new in zip(self.widget.data, fig["data"]):
                trace.update({k: v for k, v in new.items() if k != "type"})
        self.fits = len(self.widget.data[0].x)


__all__ = ["Spec", "RunRecord", "Bound", "Round", "LoadtestResult", "ToolTarget", "SynthTarget",
           "probe", "ProbeResult", "ProbeError", "InterruptedLoadtest", "run_loadtest",
           "run_in_group", "stop_group", "load_record", "LiveChart", "rounds_figure_dict",
           "read_workload"]
