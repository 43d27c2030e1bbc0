"""Synth configuration: one YAML mapping (or a named preset) → a frozen :class:`SynthConfig`.

Every key is checked; an unknown or out-of-range value raises SpecError naming the field and
the fix. docs/synth.md documents each parameter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import SpecError
from .engine import ReplicaParams
from .lengths import LengthDist
from .service import DEFAULT_SERVICE_MODEL, ServiceModel, fit_service_model

TOP_KEYS = ("name", "description", "seed", "system", "replica", "client", "workload", "power", "output", "sweep")


@dataclass(frozen=True)
class ArrivalSpec:
    process: str = "poisson"  # constant | poisson | gamma | replay
    cv: float = 1.0
    path: str | None = None
    format: str = "auto"
    start_row: int | str = 0  # or "random": a row drawn per run from the run's own stream


@dataclass(frozen=True)
class Tenant:
    name: str
    share: float
    slo_class: str | None = None
    lengths: LengthDist | None = None


@dataclass(frozen=True)
class PowerSpec:
    idle_w: float = 100.0
    busy_w: float = 650.0


@dataclass(frozen=True)
class SynthConfig:
    name: str = "synthetic"
    description: str = ""
    seed: int = 0
    system: dict = field(default_factory=dict, hash=False)
    replicas: int = 1
    replica: ReplicaParams = ReplicaParams()
    timeout_s: float = 60.0
    drain_s: float | None = None  # None: = timeout_s
    think_s: float = 0.0
    backoff_s: float = 1.0
    ramp_s: float = 0.0
    arrival: ArrivalSpec = ArrivalSpec()
    lengths: LengthDist = LengthDist()
    tenants: tuple[Tenant, ...] = ()
    power: PowerSpec | None = None
    itl: bool = True
    load_model: str = "open"
    rates: tuple[float, ...] = ()
    concurrency: tuple[int, ...] = ()
    duration_s: float | None = 300.0
    requests_per_run: int | None = None
    warmup_s: float = 0.0
    repeats: int = 1
    #: runs at particular levels (level → runs), e.g. repeats near capacity; others: ``repeats``
    repeats_at: tuple[tuple[float, int], ...] = ()
    raw: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def drain(self) -> float:
        return self.timeout_s if self.drain_s is None else self.drain_s

    def run_duration_s(self, level: float) -> float:
        if self.requests_per_run is not None and self.load_model == "open":
            return self.requests_per_run / float(level)
        return float(self.duration_s)

    def repeats_for(self, level: float) -> int:
        """Runs at ``level``: ``repeats_at`` where it names the level, else ``repeats``."""
        for lv, k in self.repeats_at:
            if abs(float(lv) - float(level)) < 1e-9:
                return int(k)
        return int(self.repeats)

    def with_(self, **kw) -> "SynthConfig":
        from dataclasses import replace

        return replace(self, **kw)


def _mapping(d, fld: str, keys: tuple[str, ...]) -> dict:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise SpecError(f"{fld} must be a mapping", field=fld, fix="see docs/synth.md for its keys")
    unknown = sorted(set(d) - set(keys))
    if unknown:
        raise SpecError(f"unknown key(s) in {fld}: {', '.join(map(str, unknown))}", field=fld,
                        fix="known keys: " + ", ".join(keys))
    return d


def _num(d: dict, key: str, fld: str, default, kind=float, *, lo=None, lo_open=False, allow_none=False):
    v = d.get(key, default)
    if v is None and allow_none:
        return None
    try:
        if kind is int and isinstance(v, float) and not v.is_integer():
            raise ValueError
        x = kind(v)
    except (TypeError, ValueError):
        raise SpecError(f"{fld}.{key} must be a{'n integer' if kind is int else ' number'}, got {v!r}",
                        field=f"{fld}.{key}") from None
    if lo is not None and (x <= lo if lo_open else x < lo):
        raise SpecError(f"{fld}.{key} must be {'>' if lo_open else '≥'} {lo}, got {x}", field=f"{fld}.{key}")
    return x


def _service(v, base_dir: Path | None) -> ServiceModel:
    if v in (None, "default"):
        return DEFAULT_SERVICE_MODEL
    if isinstance(v, dict) and "csv" in v:
        d = _mapping(v, "replica.service_model", ("csv", "model", "hardware", "tp"))
        p = Path(str(d["csv"])).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        return fit_service_model(p, str(d.get("model", "llama2-70b")), str(d.get("hardware", "h100-80gb")),
                                 int(d.get("tp", 4)))
    if isinstance(v, dict):
        return ServiceModel.from_dict(v)
    raise SpecError(f"replica.service_model: cannot read {v!r}", field="replica.service_model",
                    fix="default, {csv: profile.csv, model: ..., hardware: ..., tp: 4} or "
                        "{decode_step_ms: {1: 29.4, 64: 52}, prefill_ms_per_token: 0.11}")


def parse_config(raw: dict, *, base_dir: str | os.PathLike | None = None) -> SynthConfig:
    """Check and convert a config mapping. Relative paths resolve against ``base_dir``."""
    base = Path(base_dir) if base_dir is not None else None
    d = _mapping(raw, "config", TOP_KEYS)
    system = dict(_mapping(d.get("system"), "system",
                           ("gpu", "gpus_per_replica", "tp", "pp", "replicas", "engine", "model")))
    replicas = _num(system, "replicas", "system", 1, int, lo=1)
    tp = _num(system, "tp", "system", 1, int, lo=1)
    pp = _num(system, "pp", "system", 1, int, lo=1)
    gpr = _num(system, "gpus_per_replica", "system", tp * pp, int, lo=1)
    system = {"gpu": str(system.get("gpu", "H100-80GB")), "gpus_per_replica": gpr, "tp": tp, "pp": pp,
              "replicas": replicas, "engine": str(system.get("engine", "capplan-synth")),
              "model": str(system.get("model", "llama2-70b"))}

    rp = _mapping(d.get("replica"), "replica", ("max_batch", "token_budget", "kv_blocks", "block_size",
                                                 "kv_watermark", "max_model_len", "queue_limit",
                                                 "service_model"))
    dflt = ReplicaParams()
    replica = ReplicaParams(
        max_batch=_num(rp, "max_batch", "replica", dflt.max_batch, int, lo=1),
        token_budget=_num(rp, "token_budget", "replica", dflt.token_budget, int, lo=1),
        kv_blocks=_num(rp, "kv_blocks", "replica", dflt.kv_blocks, int, lo=1),
        block_size=_num(rp, "block_size", "replica", dflt.block_size, int, lo=1),
        kv_watermark=_num(rp, "kv_watermark", "replica", dflt.kv_watermark, float, lo=0.0),
        max_model_len=_num(rp, "max_model_len", "replica", dflt.max_model_len, int, lo=2),
        queue_limit=_num(rp, "queue_limit", "replica", dflt.queue_limit, int, lo=0, allow_none=True),
        service=_service(rp.get("service_model"), base),
    )

    cl = _mapping(d.get("client"), "client", ("timeout_s", "drain_s", "think_s", "backoff_s", "ramp_s"))
    timeout_s = _num(cl, "timeout_s", "client", 60.0, lo=0.0, lo_open=True)
    drain_s = _num(cl, "drain_s", "client", None, lo=0.0, allow_none=True)

    wl = _mapping(d.get("workload"), "workload", ("arrival", "lengths", "tenants"))
    ar = _mapping(wl.get("arrival", {"process": "poisson"}), "workload.arrival",
                  ("process", "cv", "path", "format", "start_row"))
    process = str(ar.get("process", "poisson"))
    if process not in ("constant", "poisson", "gamma", "replay"):
        raise SpecError(f"unknown arrival process {process!r}", field="workload.arrival.process",
                        fix="constant, poisson, gamma (with cv) or replay (with path)")
    path = ar.get("path")
    if process == "replay":
        if not path:
            raise SpecError("replay arrivals need a trace path", field="workload.arrival.path",
                            fix="e.g. arrival: {process: replay, path: ../shared/data/traces/"
                                "AzureLLMInferenceTrace2023_conv.csv}")
        pth = Path(str(path)).expanduser()
        if not pth.is_absolute() and base is not None:
            pth = base / pth
        path = str(pth)
    fmt = str(ar.get("format", "auto"))
    if fmt not in ("auto", "azure", "mooncake"):
        raise SpecError(f"unknown trace format {fmt!r}", field="workload.arrival.format", fix="auto, azure or mooncake")
    start_row = ar.get("start_row", 0)
    if start_row != "random":  # "random": each run replays its own stretch of the trace
        start_row = _num(ar, "start_row", "workload.arrival", 0, int, lo=0)
    arrival = ArrivalSpec(process, _num(ar, "cv", "workload.arrival", 1.0, lo=0.0, lo_open=True),
                          path, fmt, start_row)
    lengths = LengthDist.from_dict(wl.get("lengths", {}) or {})
    tenants = []
    traw = wl.get("tenants") or []
    if not isinstance(traw, list):
        raise SpecError("workload.tenants must be a list", field="workload.tenants",
                        fix="e.g. tenants: [{name: acme, share: 0.7}, {name: globex, share: 0.3}]")
    for i, t in enumerate(traw):
        t = _mapping(t, f"workload.tenants[{i}]", ("name", "share", "slo_class", "lengths"))
        if not t.get("name"):
            raise SpecError(f"workload.tenants[{i}] needs a name", field=f"workload.tenants[{i}].name")
        tl = t.get("lengths")
        tenants.append(Tenant(str(t["name"]), _num(t, "share", f"workload.tenants[{i}]", 1.0, lo=0.0, lo_open=True),
                              None if t.get("slo_class") is None else str(t["slo_class"]),
                              LengthDist.from_dict(tl, f"workload.tenants[{i}].lengths") if tl else None))
    if len({t.name for t in tenants}) != len(tenants):
        raise SpecError("tenant names must be unique", field="workload.tenants")

    pw = d.get("power", None)
    power = None
    if pw not in (None, False):
        pw = _mapping(pw if isinstance(pw, dict) else {}, "power", ("idle_w", "busy_w"))
        power = PowerSpec(_num(pw, "idle_w", "power", 100.0, lo=0.0), _num(pw, "busy_w", "power", 650.0, lo=0.0))
        if power.busy_w < power.idle_w:
            raise SpecError("power.busy_w must be ≥ power.idle_w", field="power.busy_w")
    out = _mapping(d.get("output"), "output", ("itl",))
    itl = bool(out.get("itl", True))

    sw = _mapping(d.get("sweep"), "sweep", ("load_model", "rates", "concurrency", "duration_s",
                                             "requests_per_run", "warmup_s", "repeats"))
    load_model = str(sw.get("load_model", "open"))
    if load_model not in ("open", "closed"):
        raise SpecError(f"sweep.load_model must be open or closed, got {load_model!r}", field="sweep.load_model")
    rates: tuple[float, ...] = ()
    conc: tuple[int, ...] = ()
    if load_model == "open":
        rr = sw.get("rates")
        if not isinstance(rr, list) or not rr:
            raise SpecError("an open-loop sweep needs a list of offered rates", field="sweep.rates",
                            fix="e.g. rates: [1, 2, 4, 6, 8]")
        rates = tuple(_num({f"rates[{i}]": r}, f"rates[{i}]", "sweep", None, lo=0.0, lo_open=True)
                      for i, r in enumerate(rr))
    else:
        cc = sw.get("concurrency")
        if not isinstance(cc, list) or not cc:
            raise SpecError("a closed-loop sweep needs a list of concurrencies", field="sweep.concurrency",
                            fix="e.g. concurrency: [1, 4, 16, 64]")
        conc = tuple(_num({f"concurrency[{i}]": c}, f"concurrency[{i}]", "sweep", None, int, lo=1)
                     for i, c in enumerate(cc))
    rpr = _num(sw, "requests_per_run", "sweep", None, int, lo=1, allow_none=True)
    duration_s = _num(sw, "duration_s", "sweep", None if rpr else 300.0, lo=0.0, lo_open=True, allow_none=True)
    if rpr is not None and load_model != "open":
        raise SpecError("requests_per_run works only for open-loop sweeps", field="sweep.requests_per_run",
                        fix="give duration_s for closed-loop sweeps")
    if rpr is not None and duration_s is not None:
        raise SpecError("give either sweep.duration_s or sweep.requests_per_run, not both", field="sweep")
    warmup_s = _num(sw, "warmup_s", "sweep", 0.0, lo=0.0)
    if duration_s is not None and warmup_s >= duration_s:
        raise SpecError(f"sweep.warmup_s ({warmup_s:g}) must be shorter than duration_s ({duration_s:g})",
                        field="sweep.warmup_s")
    if rpr is not None and rates and warmup_s >= rpr / max(rates):
        raise SpecError(f"sweep.warmup_s ({warmup_s:g}) must be shorter than the shortest run "
                        f"({rpr / max(rates):g} s = requests_per_run / highest rate)", field="sweep.warmup_s")
    repeats, repeats_at = _repeats(sw.get("repeats", 1), rates or conc)
    cfg = SynthConfig(
        name=str(d.get("name", "synthetic")), description=str(d.get("description", "") or ""), seed=_num(d, "seed", "config", 0, int, lo=0), system=system,
        replicas=replicas, replica=replica, timeout_s=timeout_s, drain_s=drain_s,
        think_s=_num(cl, "think_s", "client", 0.0, lo=0.0), backoff_s=_num(cl, "backoff_s", "client", 1.0, lo=0.0),
        ramp_s=_num(cl, "ramp_s", "client", 0.0, lo=0.0), arrival=arrival, lengths=lengths,
        tenants=tuple(tenants), power=power, itl=itl, load_model=load_model, rates=rates, concurrency=conc,
        duration_s=duration_s, requests_per_run=rpr, warmup_s=warmup_s,
        repeats=repeats, repeats_at=repeats_at, raw=dict(raw),
    )
    longest = max([cfg.lengths.max_total] + [t.lengths.max_total for t in cfg.tenants if t.lengths])
    if arrival.process != "replay" and longest > replica.max_model_len:
        raise SpecError(f"the length distribution allows {longest} tokens per request, above "
                        f"replica.max_model_len {replica.max_model_len}", field="workload.lengths",
                        fix="lower the input/output max caps or raise replica.max_model_len "
                            "(replayed rows longer than max_model_len become status 'error')")
    return cfg


def _repeats(v, levels) -> tuple[int, tuple[tuple[float, int], ...]]:
    """``sweep.repeats``: runs per level (an integer), or a mapping level → runs for the
    levels named (the others get one run), e.g. ``{5.5: 3, 6.0: 3}``: repeats near capacity."""
    if not isinstance(v, dict):
        return _num({"repeats": v}, "repeats", "sweep", 1, int, lo=1), ()
    out = []
    for lv, k in v.items():
        lvf = _num({"level": lv}, "level", "sweep.repeats", None, lo=0.0, lo_open=True)
        if not any(abs(lvf - float(x)) < 1e-9 for x in levels):
            raise SpecError(f"sweep.repeats names level {lv:g}, which is not in the sweep",
                            field="sweep.repeats", fix="use levels from sweep.rates (or concurrency)")
        out.append((lvf, _num({str(lv): k}, str(lv), "sweep.repeats", None, int, lo=1)))
    return 1, tuple(sorted(out))


def load_config(path: str | os.PathLike) -> SynthConfig:
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecError("synth config not found", file=str(p), fix="give a YAML file; see docs/synth.md")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"synth config is not valid YAML: {exc}", file=str(p)) from None
    if not isinstance(raw, dict):
        raise SpecError("synth config must be a YAML mapping", file=str(p), fix="see docs/synth.md")
    try:
        return parse_config(raw, base_dir=p.parent)
    except SpecError as exc:
        if exc.file is None:
            raise SpecError(exc.args[0], field=exc.field, fix=exc.fix, file=str(p)) from None
        raise


# ---- presets -------------------------------------------------------------------------------

_SYSTEM = {"gpu": "H100-80GB", "gpus_per_replica": 4, "tp": 4, "pp": 1, "replicas": 2,
           "engine": "capplan-synth (vLLM-like continuous batching, chunked prefill)",
           "model": "llama2-70b"}

PRESETS: dict[str, dict] = {
    # The bundled demo study (data/sample): 2 replicas of Llama2-70B on 4×H100 each.
    "demo": {
        "name": "demo-llama2-70b-h100-tp4",
        "description": (
            "Bundled demo study: an open-loop Poisson sweep of 13 offered rates (1 to 12 req/s) against "
            "2 replicas of Llama2-70B on 4×H100 (TP4) each, simulated by capplan synth. Two tenants: "
            "acme (70 %, interactive, shorter prompts) and globex (30 %, batch, longer prompts and "
            "answers). Each run lasts 600 s with a 30-s warm-up; clients time out after 60 s; each "
            "replica queues at most 256 requests. Suggested SLO: ttft_ms=2000,tpot_ms=100,attainment=0.99 "
            "— rates up to 5.5 req/s pass, 6 req/s and above fail, so the 99 % crossing lies inside "
            "the tested range; the simulated true capacity of this protocol is about 5.63 req/s "
            "(capplan synth --truth, 40 runs per rate). Throughput saturates near 7 req/s, and 10 to "
            "12 req/s is clear overload with timeouts and rejections. GPU power samples (a simple "
            "utilisation model) are in resources/."),
        "seed": 20261129,
        "system": _SYSTEM,
        "replica": {"max_batch": 128, "token_budget": 1024, "kv_blocks": 28000, "block_size": 16,
                    "kv_watermark": 0.01, "max_model_len": 16384, "queue_limit": 256,
                    "service_model": "default"},
        "client": {"timeout_s": 60.0},
        "workload": {
            "arrival": {"process": "poisson"},
            "lengths": {"kind": "lognormal", "input": {"median": 700, "sigma": 0.8, "min": 16, "max": 6144},
                        "output": {"median": 150, "sigma": 0.6, "min": 4, "max": 1024}, "rho": 0.3},
            "tenants": [{"name": "acme", "share": 0.7, "slo_class": "interactive"},
                        {"name": "globex", "share": 0.3, "slo_class": "batch",
                         "lengths": {"kind": "lognormal",
                                     "input": {"median": 1500, "sigma": 0.7, "min": 64, "max": 8192},
                                     "output": {"median": 250, "sigma": 0.5, "min": 8, "max": 1024},
                                     "rho": 0.4}}],
        },
        "power": {"idle_w": 100.0, "busy_w": 650.0},
        "output": {"itl": True},
        "sweep": {"load_model": "open", "rates": [1.0, 2.0, 3.0, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5, 7.0, 8.0, 10.0, 12.0],
                  "duration_s": 600.0, "warmup_s": 30.0},
    },
    # Benchmark size: 12 rates × 1 M requests, fixed 512/200 lengths, no ITL lists (disk/memory).
    "bench": {
        "name": "bench-12x1M",
        "seed": 1,
        "system": {**_SYSTEM, "replicas": 4},
        "replica": {"max_batch": 128, "token_budget": 1024, "kv_blocks": 28000, "queue_limit": 256},
        "client": {"timeout_s": 60.0},
        "workload": {"arrival": {"process": "poisson"}, "lengths": {"kind": "fixed", "input": 512, "output": 200}},
        "power": None,
        "output": {"itl": False},
        "sweep": {"load_model": "open", "rates": [4, 8, 12, 16, 18, 20, 22, 24, 26, 28, 32, 40],
                  "requests_per_run": 1_000_000, "warmup_s": 0.0},
    },
    # Small and fast: for tests and a quick look.
    "small": {
        "name": "small",
        "seed": 3,
        "system": {**_SYSTEM, "replicas": 1},
        "replica": {"max_batch": 64, "token_budget": 1024, "kv_blocks": 6000, "queue_limit": 128},
        "client": {"timeout_s": 30.0},
        "workload": {"arrival": {"process": "poisson"},
                     "lengths": {"kind": "lognormal", "input": {"median": 500, "sigma": 0.7, "min": 16, "max": 4096},
                                 "output": {"median": 100, "sigma": 0.6, "min": 2, "max": 512}, "rho": 0.3},
                     "tenants": [{"name": "acme", "share": 0.6}, {"name": "globex", "share": 0.4}]},
        "power": {"idle_w": 100.0, "busy_w": 650.0},
        "sweep": {"load_model": "open", "rates": [1.0, 3.0, 5.0, 8.0], "duration_s": 60.0, "warmup_s": 10.0},
    },
}


def preset(name: str) -> SynthConfig:
    if name not in PRESETS:
        raise SpecError(f"unknown preset {name!r}", field="--preset", fix="one of " + ", ".join(PRESETS))
    return parse_config(PRESETS[name])
