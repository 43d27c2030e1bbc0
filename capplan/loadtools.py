"""Load-tool commands that run verbatim and reproduce a study's workload.

``commands(runs, workload, url=..., model=..., seed_base=...)`` turns the next runs of a sweep
(``capplan design``: rate, repeats, duration, warm-up) and the study manifest's ``workload``
mapping into, per tool, one command line per run (repeats expanded), or a plain-words reason
why the tool cannot express that workload. Pure: no I/O, frozen results.

Supported tool versions (flags checked against each tool's ``--help`` / source / docs):

* **AIPerf 0.13** (``aiperf profile``; run against a mock server in tests/test_loadtools.py);
* **GuideLLM 0.8.1** (``guidellm run``; run in the same test; every line is prefixed with
  ``GUIDELLM__MAX_WORKER_PROCESSES=1``: each GuideLLM worker process seeds its own Poisson
  clock with the same seed, so several workers replay copies of one arrival path);
* **vLLM 0.11** ``vllm bench serve`` (flags from the v0.11.2 CLI reference; not run here:
  it needs torch and a GPU model);
* **inference-perf 0.7** (config keys of the config file inference-perf 0.7.0 writes back,
  tests/fixtures/inference_perf/config.yaml; not run here: it needs Python ≥ 3.12).

What each command carries: the study's prompt and answer lengths (fixed, or a normal or
uniform spread where the tool can draw one; see ``Lengths``), the study's arrival process
(Poisson, constant, gamma with a recorded CV), ``ignore_eos`` when answers were forced to the
asked length, the tokenizer (``workload.tokenizer``, else the ``tokenizer`` argument, else the
placeholder ``TOKENIZER_DIR`` and a note), server token counts, the study's cut-off grace
(``workload.grace_s``, 0 when absent), a fresh seed per run, quiet console flags and an output
folder named after the run (``{out_dir}/rate{R}_s{SEED}``), then the ``capplan import auto
FOLDER... --into STUDY`` step.

**Seed rule.** Run ``i`` (0-based, repeats expanded, in the order given) gets seed
``seed_base + i``. Use ``seed_base_for(runs_in_study)`` = 1000 × (runs already in the study
+ 1): after a round's runs are imported the study has more runs, so the next round's seeds
start above every seed used before (for rounds of < 1000 runs) and no later run replays an
earlier run's arrivals or prompts. Import a round before designing the next one, else the
base repeats.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import yaml

from .errors import SpecError

VERSIONS = {"aiperf": "AIPerf 0.13", "guidellm": "GuideLLM 0.8.1",
            "vllm": "vLLM 0.11 bench serve", "inference-perf": "inference-perf 0.7",
            "capplan synth": "capplan"}
TOOLS = tuple(VERSIONS)
TOKENIZER_PLACEHOLDER = "TOKENIZER_DIR"
Z99 = 2.3263  # standard normal 0.99 quantile


def seed_base_for(runs_in_study: int) -> int:
    """The seed base of the next round: 1000 × (runs already in the study + 1)."""
    if runs_in_study < 0:
        raise SpecError(f"runs_in_study must be ≥ 0, got {runs_in_study}")
    return 1000 * (int(runs_in_study) + 1)


# ------------------------------------------------------------------------------ results

@dataclass(frozen=True)
class PlannedRun:
    """One run to make (a repeat of a proposed run)."""

    index: int
    rate_rps: float          # requests/s (the concurrency for a closed-loop study)
    duration_s: float
    warmup_s: float
    repeat: int
    seed: int
    name: str                # rate3_s1000: the output folder's name, and the run's
    folder: str

    def to_dict(self) -> dict:
        return {"index": self.index, "rate_rps": self.rate_rps, "duration_s": self.duration_s,
                "warmup_s": self.warmup_s, "repeat": self.repeat, "seed": self.seed,
                "name": self.name, "folder": self.folder}


@dataclass(frozen=True)
class ToolPlan:
    """One tool's commands (one per run), or the reason it cannot express the workload."""

    tool: str
    version: str
    commands: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()   # (path, text) to write first (inference-perf)
    import_command: str = ""
    notes: tuple[str, ...] = ()
    reason: str = ""                          # non-empty: no commands

    @property
    def ok(self) -> bool:
        return not self.reason

    def to_dict(self) -> dict:
        return {"tool": self.tool, "version": self.version, "ok": self.ok,
                "reason": self.reason or None, "commands": list(self.commands),
                "files": {p: t for p, t in self.files}, "import": self.import_command or None,
                "notes": list(self.notes)}

    def to_text(self) -> str:
        lines = [f"# {self.tool} ({self.version})"]
        if not self.ok:
            lines.append(f"# cannot express this workload: {self.reason}")
        for (path, text), cmd in zip(self.files, self.commands) if self.files else ():
            lines += [f"mkdir -p {shlex.quote(_dirname(path))} && "
                      f"cat > {shlex.quote(path)} <<'EOF'", text.rstrip("\n"), "EOF", cmd]
        if not self.files:
            lines += list(self.commands)
        if self.import_command:
            lines += ["# then", self.import_command]
        lines += [f"# note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class ToolCommands:
    """Commands per tool for a set of runs; ``[tool]`` gives a ``ToolPlan``."""

    runs: tuple[PlannedRun, ...]
    plans: tuple[ToolPlan, ...]
    seed_base: int
    notes: tuple[str, ...] = ()
    workload: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, tool: str) -> ToolPlan:
        for p in self.plans:
            if p.tool == tool:
                return p
        raise KeyError(tool)

    @property
    def tools(self) -> tuple[str, ...]:
        return tuple(p.tool for p in self.plans)

    def to_dict(self) -> dict:
        return {"seed_base": self.seed_base, "runs": [r.to_dict() for r in self.runs],
                "notes": list(self.notes), "tools": {p.tool: p.to_dict() for p in self.plans}}

    def to_text(self) -> str:
        out = [p.to_text() for p in self.plans]
        if self.notes:
            out.append("\n".join(f"# note: {n}" for n in self.notes))
        return "\n\n".join(out)


# ------------------------------------------------------------------------------ workload

@dataclass(frozen=True)
class Lengths:
    """A length distribution as the tools can draw it.

    ``kind``: ``fixed`` (every request ``value`` tokens), ``normal`` (mean, sd, clipped to
    [lo, hi] where recorded), ``uniform`` (integers in [lo, hi]), ``other`` (a shape no tool
    draws: skewed or heavy-tailed; ``why`` says how), ``missing`` (not recorded)."""

    kind: str
    value: int = 0
    mean: float = 0.0
    sd: float = 0.0
    lo: int | None = None
    hi: int | None = None
    why: str = ""

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.value}"
        if self.kind == "normal":
            rng = f", {self.lo}–{self.hi}" if self.lo is not None and self.hi is not None else ""
            return f"normal mean {self.mean:g}, SD {self.sd:.3g}{rng}"
        if self.kind == "uniform":
            return f"uniform {self.lo}–{self.hi}"
        return self.why or self.kind


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def lengths(stats: Mapping | None, asked: Any = None, what: str = "prompt") -> Lengths:
    """The ``Lengths`` of a workload's ``input_tokens``/``output_tokens`` statistics.

    Fixed when the SD is under max(0.5, 2 % of the mean) (the asked length when recorded: a
    re-tokenized prompt may read a token or two off); uniform when min/max are recorded, the
    mean is within 10 % of the range of the mid-point and the SD within 15 % of range/√12;
    normal when the recorded median and p99 sit where a normal puts them (|p50 − mean| ≤
    0.25 SD + 1, |p99 − (mean + 2.33 SD)| ≤ 0.5 SD + 1), or when no quantiles are recorded;
    otherwise ``other``."""
    a = _num(asked)
    st = dict(stats or {})
    mean = _num(st.get("mean"))
    if mean is None:
        if a is not None and a > 0:
            return Lengths("fixed", value=int(round(a)), mean=a)
        return Lengths("missing", why=f"the study records no {what} lengths")
    sd = _num(st.get("sd")) or 0.0
    lo, hi = _num(st.get("min")), _num(st.get("max"))
    lo_i = None if lo is None else max(1, int(math.floor(lo)))
    hi_i = None if hi is None else int(math.ceil(hi))
    if sd <= max(0.5, 0.02 * mean) or (lo is not None and hi is not None and hi - lo <= 1):
        v = int(round(a)) if a is not None and a > 0 and abs(a - mean) <= max(2.0, 0.05 * mean) \
            else int(round(mean))
        return Lengths("fixed", value=max(v, 1), mean=mean)
    if lo is not None and hi is not None and hi > lo:
        width = hi - lo
        if abs(mean - 0.5 * (lo + hi)) <= 0.1 * width and \
                abs(sd - width / math.sqrt(12)) <= 0.15 * width / math.sqrt(12):
            return Lengths("uniform", mean=mean, sd=sd, lo=lo_i, hi=hi_i)
    p50, p99 = _num(st.get("p50")), _num(st.get("p99"))
    normal = True
    if p50 is not None and abs(p50 - mean) > 0.25 * sd + 1:
        normal = False
    if p99 is not None and abs(p99 - (mean + Z99 * sd)) > 0.5 * sd + 1:
        normal = False
    if normal:
        return Lengths("normal", mean=mean, sd=sd, lo=lo_i, hi=hi_i)
    q = ", ".join(f"{k} {v:g}" for k, v in (("p50", p50), ("p99", p99)) if v is not None)
    return Lengths("other", mean=mean, sd=sd, lo=lo_i, hi=hi_i,
                   why=f"{what} lengths are neither fixed, normal nor uniform (mean {mean:g}, "
                       f"SD {sd:.3g}, {q}; a normal with that mean and SD has p50 {mean:g} "
                       f"and p99 {mean + Z99 * sd:.0f})")


@dataclass(frozen=True)
class ManifestWorkload:
    """The study's workload, read from the manifest mapping (every key optional)."""

    arrival: str
    arrival_cv: float | None
    endpoint: str
    streaming: bool
    inp: Lengths
    out: Lengths
    output_fixed: bool
    asked_out: int | None
    tokenizer: str | None
    grace_s: float
    timeout_s: float | None
    notes: tuple[str, ...]

    @classmethod
    def parse(cls, w: Mapping | None, tokenizer: str | None = None) -> "ManifestWorkload":
        w = dict(w or {})
        notes = []
        arrival = str(w.get("arrival") or "unknown").lower()
        if arrival not in ("poisson", "constant", "gamma", "concurrency"):
            notes.append(f"the study's arrival process is {arrival!r}: Poisson arrivals are used")
            arrival = "poisson"
        endpoint = str(w.get("endpoint") or "unknown").lower()
        if endpoint not in ("chat", "completions"):
            notes.append(f"the study's endpoint is {endpoint!r}: chat completions are used")
            endpoint = "chat"
        streaming = w.get("streaming")
        streaming = True if streaming is None else bool(streaming)
        asked = dict(w.get("asked") or {})
        ots = dict(w.get("output_tokens") or {})
        fixed = w.get("output_fixed")
        if fixed is None:
            fixed = True
            notes.append("the study does not record whether answers were forced to the asked "
                         "length: they are (ignore_eos)")
        fixed = bool(fixed)
        asked_out = _num(asked.get("output_tokens"))
        out = lengths(ots, asked_out, "answer")
        if not fixed:
            # answers stopped at EOS: the asked maximum is what a tool can send
            out = (Lengths("fixed", value=int(round(asked_out)), mean=asked_out)
                   if asked_out else Lengths("missing", why="the study's answers stopped at EOS "
                                             "and the asked maximum (asked.output_tokens) is "
                                             "not recorded"))
        tok = w.get("tokenizer") or tokenizer
        grace = _num(w.get("grace_s"))
        client = w.get("client") if isinstance(w.get("client"), Mapping) else {}
        return cls(arrival=arrival, arrival_cv=_num(w.get("arrival_cv")), endpoint=endpoint,
                   streaming=streaming, inp=lengths(w.get("input_tokens"),
                                                    asked.get("input_tokens"), "prompt"),
                   out=out, output_fixed=fixed, asked_out=None if asked_out is None
                   else int(round(asked_out)), tokenizer=str(tok) if tok else None,
                   grace_s=0.0 if grace is None or grace < 0 else grace,
                   timeout_s=_num(w.get("timeout_s") or client.get("timeout_s")),
                   notes=tuple(notes))

    @property
    def gamma_shape(self) -> float | None:
        cv = self.arrival_cv
        return None if not cv or cv <= 0 else 1.0 / (cv * cv)


# ------------------------------------------------------------------------------ helpers

def _q(s) -> str:
    return shlex.quote(str(s))


def _j(obj) -> str:
    return _q(json.dumps(obj, separators=(",", ":")))


def _g(v: float) -> str:
    return f"{float(v):g}"


def _dirname(p: str) -> str:
    return p.rsplit("/", 1)[0] if "/" in p else "."


def _join(d: str, name: str) -> str:
    d = str(d or ".")
    return name if d in (".", "./") else d.rstrip("/") + "/" + name


def _field(r, key, default=None):
    if isinstance(r, Mapping):
        return r.get(key, default)
    return getattr(r, key, default)


def expand_runs(runs: Iterable, seed_base: int, out_dir: str = ".",
                closed: bool = False) -> tuple[PlannedRun, ...]:
    """The runs, repeats expanded, with seeds ``seed_base + i`` and folder names."""
    out = []
    for j, r in enumerate(runs):
        rate = _num(_field(r, "rate_rps"))
        dur = _num(_field(r, "duration_s"))
        reps = _field(r, "repeats", 1)
        warm = _num(_field(r, "warmup_s", 0.0)) or 0.0
        if rate is None or rate <= 0:
            raise SpecError(f"run {j}: rate_rps must be a positive number, got "
                            f"{_field(r, 'rate_rps')!r}", field="rate_rps")
        if dur is None or dur <= 0:
            raise SpecError(f"run {j}: duration_s must be a positive number, got "
                            f"{_field(r, 'duration_s')!r}", field="duration_s")
        if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
            raise SpecError(f"run {j}: repeats must be a whole number ≥ 1, got {reps!r}",
                            field="repeats")
        for k in range(reps):
            i = len(out)
            seed = int(seed_base) + i
            name = f"{'conc' if closed else 'rate'}{_g(rate)}_s{seed}"
            out.append(PlannedRun(i, rate, dur, warm, k, seed, name, _join(out_dir, name)))
    return tuple(out)


def _import_cmd(runs: tuple[PlannedRun, ...], study: str) -> str:
    return "capplan import auto " + " ".join(_q(r.folder) for r in runs) + f" --into {_q(study)}"


def _arrival_reason(tool: str, w: ManifestWorkload) -> str:
    """Why ``tool`` cannot reproduce the study's arrivals ('' when it can)."""
    can = {"aiperf": ("poisson", "constant", "gamma", "concurrency"),
           "guidellm": ("poisson", "constant", "concurrency"),
           "vllm": ("poisson", "gamma"),
           "inference-perf": ("poisson", "constant")}[tool]
    if w.arrival not in can:
        what = {"constant": "constant-rate arrivals", "gamma": "gamma (bursty) arrivals",
                "concurrency": "a closed loop (fixed concurrency) for a set duration"}[w.arrival]
        return f"{VERSIONS[tool]} cannot send {what}, the study's arrival process"
    if w.arrival == "gamma" and w.gamma_shape is None:
        return ("the study's arrivals are gamma but their burstiness is not recorded "
                "(workload.arrival_cv), so no shape can be given")
    return ""


def _length_reason(tool: str, w: ManifestWorkload) -> str:
    for L in (w.inp, w.out):
        if L.kind == "missing":
            return L.why + ("; the tool would fall back to its default lengths" if
                            tool != "capplan synth" else "")
        if L.kind == "other":
            return L.why
    kinds = {w.inp.kind, w.out.kind}
    if tool == "aiperf" and "normal" in kinds and "uniform" in kinds:
        return ("AIPerf draws either normal lengths (--isl-stddev/--osl-stddev) or uniform ones "
                "(--random-range-ratio), not one of each")
    if tool == "vllm":
        if "normal" in kinds:
            return ("vLLM's random dataset draws uniform lengths in [L(1−r), L(1+r)]; the study's "
                    + ("prompt" if w.inp.kind == "normal" else "answer")
                    + " lengths are normal (" + (w.inp if w.inp.kind == "normal" else w.out)
                    .describe() + ")")
        if kinds == {"fixed", "uniform"}:
            return ("vLLM's --random-range-ratio spreads prompt and answer lengths alike; the "
                    "study's prompt lengths are " + w.inp.describe() + " and its answer "
                    "lengths " + w.out.describe())
        if kinds == {"uniform"}:
            ri, ro = _ratio(w.inp), _ratio(w.out)
            if abs(ri - ro) > 0.05:
                return (f"vLLM's --random-range-ratio spreads prompt and answer lengths alike; "
                        f"the study's spreads are ±{ri:.0%} and ±{ro:.0%}")
    if tool == "inference-perf" and "uniform" in kinds:
        return ("the inference-perf 0.7 config here draws normal lengths (min/max/mean/std_dev); "
                "the study's lengths are uniform")
    return ""


def _ratio(L: Lengths) -> float:
    if L.kind != "uniform" or not L.mean:
        return 0.0
    return round(max(L.mean - L.lo, L.hi - L.mean) / L.mean, 3)


# ------------------------------------------------------------------------------ tools

def _aiperf(runs, w: ManifestWorkload, url, model, tok) -> ToolPlan:
    notes = ["the grace period is the study's (workload.grace_s); AIPerf cancels requests "
             "still in flight at the cut-off and leaves them out of every export (only "
             "logs/aiperf.log counts them; capplan import reports the count)"]
    cmds = []
    for r in runs:
        c = ["aiperf profile", "--model", _q(model), "--url", _q(url),
             "--endpoint-type", w.endpoint]
        if w.streaming:
            c.append("--streaming")
        c += ["--tokenizer", _q(tok)]
        c += _aiperf_lengths(w)
        if w.output_fixed:
            c += ["--extra-inputs", "ignore_eos:true"]
        c.append("--use-server-token-count")
        if w.arrival == "concurrency":
            c += ["--concurrency", str(int(round(r.rate_rps)))]
        else:
            c += ["--request-rate", _g(r.rate_rps), "--arrival-pattern", w.arrival]
            if w.arrival == "gamma":
                c += ["--arrival-smoothness", f"{w.gamma_shape:.4g}"]
            # one distinct prompt per request (AIPerf reuses 100 by default: prefix-cache hits)
            c += ["--num-dataset-entries",
                  str(max(100, int(math.ceil(r.rate_rps * r.duration_s * 1.25)) + 10))]
        c += ["--benchmark-duration", _g(r.duration_s), "--benchmark-grace-period",
              _g(w.grace_s)]
        if w.timeout_s:
            c += ["--request-timeout-seconds", _g(w.timeout_s)]
        c += ["--random-seed", str(r.seed), "--export-level", "records",
              "--artifact-dir", _q(r.folder), "--ui", "none"]
        cmds.append(" ".join(c))
    if w.arrival == "concurrency":
        notes.append("closed loop: AIPerf reuses its default 100 distinct prompts")
    return ToolPlan("aiperf", VERSIONS["aiperf"], tuple(cmds), notes=tuple(notes))


def _aiperf_lengths(w: ManifestWorkload) -> list[str]:
    out = []
    if "uniform" in (w.inp.kind, w.out.kind):
        out += ["--isl", str(_center(w.inp)), "--osl", str(_center(w.out)),
                "--random-range-ratio", _j({"input": _ratio(w.inp), "output": _ratio(w.out)})]
        return out
    for L, flag in ((w.inp, "isl"), (w.out, "osl")):
        if L.kind == "fixed":
            out += [f"--{flag}", str(L.value), f"--{flag}-stddev", "0"]
        else:
            out += [f"--{flag}", str(int(round(L.mean))), f"--{flag}-stddev", f"{L.sd:.3g}"]
    return out


def _center(L: Lengths) -> int:
    return L.value if L.kind == "fixed" else int(round(L.mean))


def _synthetic(L: Lengths, key: str) -> dict:
    if L.kind == "fixed":
        return {key: L.value}
    d = {key: int(round(L.mean))}
    if L.kind == "normal":
        d[f"{key}_stdev"] = max(1, int(round(L.sd)))
    if L.lo is not None:
        d[f"{key}_min"] = L.lo
    if L.hi is not None:
        d[f"{key}_max"] = L.hi
    return d


def _guidellm(runs, w: ManifestWorkload, url, model, tok) -> ToolPlan:
    drain = w.grace_s > 0 and w.arrival != "concurrency"
    notes = [("the study let requests in flight at its end finish (grace "
              f"{w.grace_s:g} s): GuideLLM has no grace period, so each run is bounded by its "
              "request count (max_requests = rate × duration), which waits for every request "
              "instead of cancelling those in flight at max_duration")
             if drain else
             "GuideLLM stops at max_duration and cancels requests still in flight (they are "
             "recorded as incomplete, which capplan counts as cancelled): the study's cut-off "
             "with no grace period",
             "GuideLLM reads prompt and answer token counts from the server's usage (it asks "
             "for stream usage) and falls back to its tokenizer"]
    if w.output_fixed:
        notes.append("GuideLLM sends ignore_eos with the synthetic answer length itself")
    backend = {"kind": "openai_http", "target": url, "model": model,
               "request_format": "/v1/chat/completions" if w.endpoint == "chat"
               else "/v1/completions", "stream": bool(w.streaming)}
    if w.timeout_s:
        backend["timeout"] = w.timeout_s
    if not w.output_fixed:
        backend["extras"] = {"body": {"ignore_eos": False}}
    data = {"kind": "synthetic_text", **_synthetic(w.inp, "prompt_tokens"),
            **_synthetic(w.out, "output_tokens")}
    cmds = []
    for r in runs:
        if w.arrival == "concurrency":
            prof = {"kind": "concurrent", "streams": [int(round(r.rate_rps))]}
        else:
            prof = {"kind": w.arrival, "rate": [r.rate_rps]}
        stop = ({"kind": "max_requests", "count": max(1, int(round(r.rate_rps * r.duration_s)))}
                if drain else {"kind": "max_duration", "seconds": r.duration_s})
        c = ["GUIDELLM__MAX_WORKER_PROCESSES=1 guidellm run", "--backend", _j(backend),
             "--profile", _j(prof), "--constraint", _j(stop),
             "--data", _j(data), "--tokenizer", _j({"kind": "hf_auto", "model": tok}),
             "--seed", _j({"kind": "static", "value": r.seed}),
             "--output", _j({"kind": "json", "path": _join(r.folder, "benchmarks.json")}),
             "--disable-console-interactive"]
        cmds.append(" ".join(c))
    return ToolPlan("guidellm", VERSIONS["guidellm"], tuple(cmds), notes=tuple(notes))


def _vllm(runs, w: ManifestWorkload, url, model, tok) -> ToolPlan:
    if not w.streaming:
        return ToolPlan("vllm", VERSIONS["vllm"], reason="vLLM bench serve always streams; the "
                        "study's requests did not")
    if not w.output_fixed:
        return ToolPlan("vllm", VERSIONS["vllm"], reason="the study's answers stopped at EOS, "
                        "but vLLM bench serve (0.11.1 and later) sets ignore_eos itself whenever "
                        "--random-output-len is given")
    notes = ["vLLM bench serve stops after --num-prompts (rate × duration), not after a "
             "duration, and waits for every answer: no cut-off, so the run lasts a little "
             "longer than duration_s",
             "vLLM counts prompt tokens with its tokenizer and answer tokens from the stream"]
    ratio = _ratio(w.inp) if w.inp.kind == "uniform" else 0.0
    cmds = []
    for r in runs:
        c = ["vllm bench serve",
             "--backend", "openai-chat" if w.endpoint == "chat" else "openai",
             "--endpoint", "/v1/chat/completions" if w.endpoint == "chat" else "/v1/completions",
             "--base-url", _q(url), "--model", _q(model), "--tokenizer", _q(tok),
             "--dataset-name", "random", "--random-input-len", str(_center(w.inp)),
             "--random-output-len", str(_center(w.out)), "--random-range-ratio", _g(ratio),
             "--ignore-eos", "--request-rate", _g(r.rate_rps), "--burstiness",
             _g(1.0 if w.arrival == "poisson" else round(w.gamma_shape, 4)),
             "--num-prompts", str(max(1, int(round(r.rate_rps * r.duration_s)))),
             "--seed", str(r.seed), "--save-result", "--save-detailed",
             "--result-dir", _q(r.folder), "--result-filename", _q(r.name + ".json"),
             "--disable-tqdm"]
        cmds.append(" ".join(c))
    return ToolPlan("vllm", VERSIONS["vllm"], tuple(cmds), notes=tuple(notes))


def _int_if(v: float):
    return int(v) if float(v).is_integer() else float(v)


def _ip_dist(L: Lengths, n: int) -> dict:
    if L.kind == "fixed":
        return {"min": L.value, "max": L.value, "mean": L.value, "std_dev": 0,
                "total_count": n}
    lo = L.lo if L.lo is not None else max(1, int(L.mean - 4 * L.sd))
    hi = L.hi if L.hi is not None else int(math.ceil(L.mean + 4 * L.sd))
    return {"min": lo, "max": hi, "mean": round(L.mean, 3), "std_dev": round(L.sd, 3),
            "total_count": n}


def _inference_perf(runs, w: ManifestWorkload, url, model, tok) -> ToolPlan:
    notes = ["inference-perf ends a stage after its duration and gives requests in flight "
             "load.stage_teardown_grace_seconds (the study's grace) before cancelling them",
             "write each config, then run the command; the config is not run in capplan's "
             "tests (inference-perf needs Python ≥ 3.12)"]
    files, cmds = [], []
    for r in runs:
        n = max(100, int(math.ceil(r.rate_rps * r.duration_s * 1.25)) + 10)
        cfg = {
            "api": {"type": "chat" if w.endpoint == "chat" else "completion",
                    "streaming": bool(w.streaming)},
            "server": {"type": "vllm", "model_name": model, "base_url": url,
                       "ignore_eos": bool(w.output_fixed)},
            "tokenizer": {"pretrained_model_name_or_path": tok},
            "data": {"type": "random", "input_distribution": _ip_dist(w.inp, n),
                     "output_distribution": _ip_dist(w.out, n)},
            "load": {"type": w.arrival, "stages": [{"rate": _int_if(r.rate_rps),
                                                    "duration": _int_if(r.duration_s)}],
                     "num_workers": 1, "base_seed": r.seed,
                     "stage_teardown_grace_seconds": _int_if(w.grace_s),
                     **({"request_timeout": w.timeout_s} if w.timeout_s else {})},
            "report": {"request_lifecycle": {"summary": True, "per_stage": True,
                                             "per_request": True}},
            "storage": {"local_storage": {"path": r.folder}},
        }
        path = _join(r.folder, "inference-perf.yml")
        files.append((path, yaml.safe_dump(cfg, sort_keys=False)))
        cmds.append(f"inference-perf -c {_q(path)}")
    return ToolPlan("inference-perf", VERSIONS["inference-perf"], tuple(cmds),
                    files=tuple(files), notes=tuple(notes))


def _synth(design_path: str | None) -> ToolPlan:
    if not design_path:
        return ToolPlan("capplan synth", VERSIONS["capplan synth"],
                        reason="no design file was written (capplan design --out PATH writes "
                               "one), so there is nothing for capplan synth --design to read")
    return ToolPlan("capplan synth", VERSIONS["capplan synth"],
                    (f"capplan synth --design {_q(design_path)} --twin twin.yaml --out preview",),
                    notes=("twin.yaml: a twin from capplan twin fit, or a synth configuration",))


# ------------------------------------------------------------------------------ entry

def commands(runs: Iterable, workload: Mapping | None, *, url: str, model: str,
             tokenizer: str | None = None, seed_base: int, out_dir: str = ".",
             design_path: str | None = None, study: str = "STUDY") -> ToolCommands:
    """Commands per tool for ``runs`` (objects or mappings with ``rate_rps``, ``repeats``,
    ``duration_s``, ``warmup_s``) reproducing ``workload`` (the study manifest's ``workload``
    mapping; every key optional). See the module docstring for the flags, the seed rule and
    what cannot be expressed. ``study`` is the study the runs are imported into."""
    if isinstance(seed_base, bool) or not isinstance(seed_base, int) or seed_base < 0:
        raise SpecError(f"seed_base must be a whole number ≥ 0, got {seed_base!r}",
                        field="seed_base", fix="seed_base_for(runs already in the study)")
    w = ManifestWorkload.parse(workload, tokenizer)
    expanded = expand_runs(runs, seed_base, out_dir, closed=w.arrival == "concurrency")
    notes = list(w.notes)
    tok = w.tokenizer or TOKENIZER_PLACEHOLDER
    if not w.tokenizer:
        notes.append(f"no tokenizer is known (workload.tokenizer, or --tokenizer): replace "
                     f"{TOKENIZER_PLACEHOLDER} by the served model's tokenizer directory or hub "
                     "name; without one AIPerf and GuideLLM try to download the model's")
    if any(r.warmup_s > 0 for r in expanded):
        notes.append("each run's first warmup_s seconds are warm-up: the tools' own warm-up "
                     "phases are not used (AIPerf drops warm-up requests from its export); "
                     "capplan excludes the warm-up when it reads the runs (warmup_s)")
    notes.append(f"seeds {expanded[0].seed}…{expanded[-1].seed} (seed_base {seed_base} + run "
                 "index): give the next round seed_base_for(runs in the study)"
                 if expanded else "no runs")
    builders = {"aiperf": _aiperf, "guidellm": _guidellm, "vllm": _vllm,
                "inference-perf": _inference_perf}
    plans = []
    for tool, build in builders.items():
        reason = _arrival_reason(tool, w) or _length_reason(tool, w)
        if reason:
            plans.append(ToolPlan(tool, VERSIONS[tool], reason=reason))
            continue
        p = build(expanded, w, url, model, tok)
        if p.ok and expanded:
            p = ToolPlan(p.tool, p.version, p.commands, p.files, _import_cmd(expanded, study),
                         p.notes, p.reason)
        plans.append(p)
    plans.append(_synth(design_path))
    return ToolCommands(expanded, tuple(plans), int(seed_base), tuple(notes),
                        dict(workload or {}))


__all__ = ["commands", "seed_base_for", "expand_runs", "lengths", "Lengths", "ManifestWorkload", "PlannedRun",
           "ToolPlan", "ToolCommands", "VERSIONS", "TOKENIZER_PLACEHOLDER"]
